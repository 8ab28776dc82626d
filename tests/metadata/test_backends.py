"""Every backend against a real server: HTTP (in-process and the console script as a
subprocess), real etcd, real Redis. Same contract, same checks."""

from __future__ import annotations

import random
import string
import threading
import uuid
from typing import Iterator

import pytest

from mooncake_core.metadata import MetadataBackend, open_metadata
from .helpers import random_descriptor

pytestmark = pytest.mark.integration

KINDS = ["http", "http_proc", "etcd", "redis"]


@pytest.fixture(params=KINDS)
def backend(request, python_exe) -> Iterator[MetadataBackend]:
    kind = request.param
    if kind == "http":
        srv = request.getfixturevalue("http_server")
        conn = srv.url
    elif kind == "http_proc":
        conn = request.getfixturevalue("http_server_proc").url
    elif kind == "etcd":
        conn = "etcd://" + request.getfixturevalue("etcd_endpoint")
    else:
        conn = "redis://" + request.getfixturevalue("redis_endpoint")
    b = open_metadata(conn, timeout=5.0)
    assert b is not None
    yield b
    b.close()


def unique_segment() -> str:
    return f"127.0.0.1:{random.randint(1024, 65535)}-{uuid.uuid4().hex[:8]}"


def test_set_get_remove_roundtrip(backend: MetadataBackend) -> None:
    seg = unique_segment()
    ram_key, rpc_key = f"mooncake/ram/{seg}", f"mooncake/rpc_meta/{seg}"
    ram = random_descriptor(seg)
    rpc = {"ip_or_host_name": "127.0.0.1", "rpc_port": random.randint(1024, 65535)}
    backend.set(ram_key, ram)
    backend.set(rpc_key, rpc)
    assert backend.get(ram_key) == ram
    assert backend.get(rpc_key) == rpc
    # overwrite replaces
    ram2 = random_descriptor(seg)
    backend.set(ram_key, ram2)
    assert backend.get(ram_key) == ram2
    backend.remove(ram_key)
    assert backend.get(ram_key) is None
    assert backend.get(rpc_key) == rpc
    backend.remove(rpc_key)
    assert backend.get(rpc_key) is None


def test_missing_key_is_none_and_remove_is_idempotent(backend: MetadataBackend) -> None:
    key = f"mooncake/ram/{unique_segment()}"
    assert backend.get(key) is None
    backend.remove(key)  # no error
    assert backend.get(key) is None


def test_list_prefix(backend: MetadataBackend) -> None:
    base = f"mooncake/test-{uuid.uuid4().hex}"
    keys = [f"{base}/ram/{i}" for i in range(5)] + [f"{base}/rpc_meta/{i}" for i in range(3)]
    for k in keys:
        backend.set(k, {"k": k})
    assert backend.list(f"{base}/ram/") == sorted(keys[:5])
    assert backend.list(f"{base}/rpc_meta/") == sorted(keys[5:])
    assert backend.list(f"{base}/") == sorted(keys)
    assert backend.list(f"{base}/nothing/") == []
    assert set(keys) <= set(backend.list(""))
    for k in keys:
        backend.remove(k)
    assert backend.list(f"{base}/") == []


def test_keys_with_special_characters(backend: MetadataBackend) -> None:
    """Keys travel verbatim: URL-special and glob-special characters must not be mangled."""
    base = f"mooncake/special-{uuid.uuid4().hex}"
    odd = [f"{base}/a b&c=d?e#f", f"{base}/[x]*?", f"{base}/üñí/ç", f"{base}/%41%"]
    for i, k in enumerate(odd):
        backend.set(k, {"i": i})
    for i, k in enumerate(odd):
        assert backend.get(k) == {"i": i}, k
    assert backend.list(f"{base}/[x]") == [f"{base}/[x]*?"]
    assert backend.list(f"{base}/%") == [f"{base}/%41%"]
    assert backend.list(f"{base}/") == sorted(odd)
    for k in odd:
        backend.remove(k)
    assert backend.list(f"{base}/") == []


def test_large_value(backend: MetadataBackend) -> None:
    """1 MiB descriptors fit every backend (etcd's default request limit is 1.5 MiB)."""
    key = f"mooncake/ram/{unique_segment()}"
    blob = "".join(random.choices(string.ascii_letters + string.digits, k=1 << 20))
    value = {"buffers": [{"name": "cpu:0", "addr": 1 << 40, "length": 1 << 30}], "blob": blob}
    backend.set(key, value)
    assert backend.get(key) == value
    backend.remove(key)


def test_concurrent_threads(backend: MetadataBackend) -> None:
    """8 threads share one backend object; every thread sees exactly its own writes."""
    base = f"mooncake/conc-{uuid.uuid4().hex}"
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            rng = random.Random(t)
            for i in range(25):
                key = f"{base}/{t}/{i}"
                value = {"t": t, "i": i, "r": rng.random(), "s": rng.randbytes(16).hex()}
                backend.set(key, value)
                got = backend.get(key)
                assert got == value, (key, got, value)
            assert len(backend.list(f"{base}/{t}/")) == 25
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads), "worker threads hung"
    assert not errors, errors[0]
    assert len(backend.list(f"{base}/")) == 200
    for k in backend.list(f"{base}/"):
        backend.remove(k)


def test_bad_values_and_keys_rejected(backend: MetadataBackend) -> None:
    with pytest.raises(TypeError, match="mooncake/ram/x.*dict"):
        backend.set("mooncake/ram/x", [1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        backend.set("mooncake/ram/x", {"bad": object()})
    with pytest.raises(ValueError, match="non-blank"):
        backend.get("  ")
    with pytest.raises(ValueError, match="non-blank"):
        backend.set("", {"a": 1})


def test_value_written_by_one_client_read_by_another(backend: MetadataBackend) -> None:
    """Two independent clients (as two engines would be) see each other's descriptors."""
    other = open_metadata(_conn_of(backend), timeout=5.0)
    try:
        key = f"mooncake/ram/{unique_segment()}"
        value = random_descriptor(key)
        backend.set(key, value)
        assert other.get(key) == value
        other.remove(key)
        assert backend.get(key) is None
    finally:
        other.close()


def _conn_of(b: MetadataBackend) -> str:
    if b.backend_name == "http":
        return b.endpoint
    if b.backend_name == "etcd":
        return "etcd://" + b.endpoint
    host_port, _, db = b.endpoint.partition("/")
    return f"redis://{host_port}/{db}"
