"""The server's table and its snapshots (pure logic + local files, no sockets)."""

from __future__ import annotations

import os
import random

import pytest

from mooncake_core.metadata import persist
from mooncake_core.metadata.kvstore import KVStore, PutResult


def test_put_get_delete_and_generation() -> None:
    s = KVStore()
    g0 = s.generation
    assert s.put("a", b"1") is PutResult.STORED and s.get("a") == b"1"
    assert s.generation == g0 + 1
    s.put("a", b"1")  # same value: nothing changed, nothing to persist
    assert s.generation == g0 + 1
    s.put("a", b"22")
    assert s.total_bytes == 2 and s.generation == g0 + 2
    assert s.delete("a") and not s.delete("a")
    assert s.total_bytes == 0 and len(s) == 0


def test_budgets() -> None:
    s = KVStore(max_keys=2, max_total_bytes=10)
    assert s.put("a", b"12345") is PutResult.STORED
    assert s.put("b", b"12345") is PutResult.STORED
    assert s.put("c", b"1") is PutResult.KEY_BUDGET
    assert s.put("a", b"123456") is PutResult.BYTE_BUDGET
    assert s.get("a") == b"12345"  # refused put leaves the old value
    assert s.put("a", b"1") is PutResult.STORED and s.total_bytes == 6


def test_prefix_listing_sorted() -> None:
    s = KVStore()
    for k in ["m/r/2", "m/r/1", "m/p/1", "x"]:
        s.put(k, b"{}")
    assert s.keys("m/r/") == ["m/r/1", "m/r/2"]
    assert s.keys("") == ["m/p/1", "m/r/1", "m/r/2", "x"]


def test_snapshot_roundtrip_with_binary_values(tmp_path) -> None:
    data = {f"mooncake/ram/{i}": os.urandom(random.randint(1, 300)) for i in range(50)}
    data["text"] = '{"ü": 1}'.encode()
    path = str(tmp_path / "sub" / "meta.json")
    persist.save(path, data)
    assert persist.load(path) == data
    assert not [f for f in os.listdir(tmp_path / "sub") if f.endswith(".tmp")]


def test_missing_file_is_empty(tmp_path) -> None:
    assert persist.load(str(tmp_path / "none.json")) == {}


@pytest.mark.parametrize("content,why", [
    (b"{not json", "not valid JSON"),
    (b'{"format": "other"}', "not a mooncake-http-metadata snapshot"),
    (b'{"format": "mooncake-http-metadata", "version": 99, "keys": {}}', "version 99"),
    (b'{"format": "mooncake-http-metadata", "version": 1, "keys": {"k": 5}}', "malformed entry for key 'k'"),
])
def test_corrupt_file_is_a_clear_error(tmp_path, content: bytes, why: str) -> None:
    path = tmp_path / "meta.json"
    path.write_bytes(content)
    with pytest.raises(persist.PersistError) as ei:
        persist.load(str(path))
    assert str(path) in str(ei.value) and why in str(ei.value)


def test_failed_save_keeps_old_file(tmp_path, monkeypatch) -> None:
    path = str(tmp_path / "meta.json")
    persist.save(path, {"a": b"old"})

    def boom(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", boom)  # the atomic-write helper persist.save uses
    with pytest.raises(OSError):
        persist.save(path, {"a": b"new"})
    monkeypatch.undo()
    assert persist.load(path) == {"a": b"old"}
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_etcd_prefix_range_end() -> None:
    from mooncake_core.metadata.etcd_backend import prefix_range_end
    assert prefix_range_end(b"mooncake/ram/") == b"mooncake/ram0"
    assert prefix_range_end(b"a\xff\xff") == b"b"
    assert prefix_range_end(b"\xff") == b"\0"  # all keys from the start key on


def test_redis_glob_escape() -> None:
    from mooncake_core.metadata.redis_backend import escape_glob
    assert escape_glob("mooncake/ram/") == "mooncake/ram/"
    assert escape_glob("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\"
