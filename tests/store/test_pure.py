"""Pure helpers of the store client: ReplicateConfig, tensor format, SSD-tier files, API
argument checking before any network use (milliseconds, no sockets)."""

from __future__ import annotations

import ctypes
import json
import os

import numpy as np
import pytest

from mooncake_core.errors import MooncakeError
from mooncake_core.store import MooncakeDistributedStore, ReplicateConfig, SoftPinAction
from mooncake_core.store import tensor as T
from mooncake_core.store.offload import OffloadFiles, mem_view, offload_relpath

RNG = np.random.default_rng(1234)


def test_replicate_config_defaults_and_msg() -> None:
    c = ReplicateConfig()
    assert (c.replica_num, c.soft_pin_action, c.soft_pin_ttl_ms, c.with_hard_pin, c.preferred_segment,
            c.preferred_segments) == (1, SoftPinAction.PRESERVE, None, False, "", [])
    c.replica_num = 2
    c.soft_pin_action = SoftPinAction.ENABLE
    c.soft_pin_ttl_ms = 5000
    c.preferred_segment = "h:1"
    c.preferred_segments = ["h:2"]
    m = c.to_msg()
    assert (m.replica_num, m.soft_pin, m.soft_pin_ttl_ms, m.preferred_segments) == (2, True, 5000, ["h:1", "h:2"])
    with pytest.raises(AttributeError):
        c.replicas = 3  # type: ignore[attr-defined]
    c.replica_num = 0
    with pytest.raises(ValueError, match="replica_num"):
        c.validate()
    c.replica_num = "2"  # type: ignore[assignment]
    with pytest.raises(TypeError, match="replica_num"):
        c.validate()
    d = ReplicateConfig()
    d.soft_pin_ttl_ms = 10
    d.validate()  # a valid object; a put with it is answered -600 (refusal), as upstream
    assert "valid only with SoftPinAction.ENABLE" in (d.refusal() or "")
    d.with_soft_pin = True
    assert d.refusal() is None
    assert d.soft_pin_action == SoftPinAction.ENABLE


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "uint8", "bool"])
def test_tensor_roundtrip(dtype) -> None:
    torch = pytest.importorskip("torch")
    t = (torch.randn(3, 5, 7) * 100).to(getattr(torch, dtype))
    header, payload, keep = T.tensor_payload(t)
    blob = bytearray(header) + bytearray(payload)
    out = T.tensor_from_buffer(blob)
    assert out.dtype == t.dtype and tuple(out.shape) == (3, 5, 7)
    assert torch.equal(out, t)


def test_tensor_noncontiguous_scalar_empty_and_bad() -> None:
    torch = pytest.importorskip("torch")
    t = torch.randn(6, 4).t()  # non-contiguous
    h, p, k = T.tensor_payload(t)
    assert torch.equal(T.tensor_from_buffer(bytearray(h) + bytearray(p)), t)
    s = torch.tensor(3.5)
    h, p, k = T.tensor_payload(s)
    assert T.tensor_from_buffer(bytearray(h) + bytearray(p)).item() == 3.5
    e = torch.empty(0, 3)
    h, p, k = T.tensor_payload(e)
    assert tuple(T.tensor_from_buffer(bytearray(h)).shape) == (0, 3)
    with pytest.raises(T.TensorFormatError, match="magic"):
        T.tensor_from_buffer(bytearray(b"XXXX" + bytes(40)))
    h, p, k = T.tensor_payload(torch.randn(4))
    with pytest.raises(T.TensorFormatError, match="payload"):
        T.tensor_from_buffer(bytearray(h) + bytearray(p)[:-1])
    with pytest.raises(TypeError, match="torch.Tensor"):
        T.tensor_payload([1, 2, 3])


def test_offload_files_roundtrip(tmp_path) -> None:
    files = OffloadFiles(str(tmp_path))
    src = RNG.integers(0, 256, 100_000, dtype=np.uint8)
    rel = offload_relpath("key/../with odd chars ✓")
    assert ".." not in rel and rel.count("/") == 1
    assert files.write_from(rel, int(src.ctypes.data), src.nbytes) == src.nbytes
    dst = np.empty_like(src)
    files.read_into(rel, mem_view(int(dst.ctypes.data), dst.nbytes), dst.nbytes)
    assert np.array_equal(src, dst)
    with pytest.raises(MooncakeError) as ei:
        files.read_into(rel, mem_view(int(dst.ctypes.data), dst.nbytes), dst.nbytes - 1)
    assert ei.value.code == -704
    with pytest.raises(MooncakeError):
        files.abspath("../../etc/passwd")
    assert files.delete(rel) and not files.delete(rel)
    with pytest.raises(MooncakeError) as ei:
        files.read_into(rel, mem_view(int(dst.ctypes.data), dst.nbytes), dst.nbytes)
    assert ei.value.code == -704
    assert not [f for f in os.listdir(os.path.join(str(tmp_path), rel.split("/")[0])) if f.startswith(".tmp")]


def test_mem_view_aliases_memory() -> None:
    buf = (ctypes.c_char * 16)()
    mv = mem_view(ctypes.addressof(buf), 16)
    mv[3] = 77
    assert buf.raw[3] == 77


def test_api_argument_errors_before_setup() -> None:
    s = MooncakeDistributedStore()
    with pytest.raises(TypeError, match="key must be str"):
        s.put(123, b"x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bytes-like"):
        s.put("k", 12345)
    with pytest.raises(TypeError, match="ReplicateConfig"):
        s.put("k", b"x", {"replica_num": 2})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        s.put("k", b"x", replicas=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="buffer_ptr"):
        s.get_into("k", "0x1234", 10)  # type: ignore[arg-type]
    assert s.batch_get_into(["a", "b"], [1], [1]) == [-600, -600]  # upstream: a code per key, not an exception
    assert s.batch_put_from(["a", "b"], [1, 2, 3], [1, 1, 1]) == [-600, -600]
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        s.put_batch(["a", "b"], [b"x"])
    with pytest.raises(TypeError, match="keys must be a list"):
        s.get_batch("abc")  # type: ignore[arg-type]
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "50%", 0, "tcp", "", "127.0.0.1:1") == -600  # logged, as upstream
    with pytest.raises(TypeError):
        s.setup("127.0.0.1", "P2PHANDSHAKE", global_segment=1)  # type: ignore[call-arg]
    # not set up: runtime calls return codes, never raise or hang
    assert s.get("k") == b""
    assert s.put("k", b"x") == -600
    assert s.is_exist("k") == -1
    # ... and falsy: LMCache's adapter does `if store.is_exist(k)`, an error must read as a miss
    assert not s.is_exist("k") and not s.batch_is_exist(["k", "j"])[1]
    assert s.batch_is_exist(["k"]) == [-1] and json.dumps(s.batch_is_exist(["k"])) == "[-1]"
    assert s.get_size("k") == -600
    assert s.remove("k") == -600
    assert s.close() == 0


def test_owned_index_drops_overlapped_entries() -> None:
    from mooncake_core.store.owned import OwnedIndex
    from mooncake_core.store.protocol import ReplicaDesc

    idx = OwnedIndex()
    def r(addr: int, size: int) -> ReplicaDesc:
        return ReplicaDesc("seg", addr, size)

    idx.add("a", r(1000, 100), 277)
    idx.add("b", r(1100, 100), 717)  # adjacent, no overlap
    idx.add("c", r(2000, 50), 163)
    assert len(idx) == 3
    idx.add("d", r(1050, 100), 662)  # overlaps a and b: both were evicted meanwhile
    assert [e.key for e in idx.newest_first()] == ["d", "c"]
    idx.add("c", r(3000, 10), 558)  # re-put of a key moves it
    assert [(e.key, e.replica.addr) for e in idx.newest_first()] == [("c", 3000), ("d", 1050)]
    idx.add("e", r(2000, 10), 254)  # the old range of c is free again: no stale entry there
    assert len(idx) == 3
    idx.discard(["d", "missing"])
    idx.discard_entries(idx.entries(lambda k: k == "e"))
    assert [e.key for e in idx.newest_first()] == ["c"]
    # removal notices from the master: only entries not newer than the removal go
    idx.add("v", r(7000, 10), 51, version=100)
    idx.discard_removed([("v", 99)])
    assert "v" in {e.key for e in idx.newest_first()}
    idx.discard_removed([("v", 100), ("nope", 5)])
    assert "v" not in {e.key for e in idx.newest_first()}
    idx.add("w", r(7100, 10), 690, version=50)
    idx.add("z", r(7200, 10), 551, version=500)
    idx.discard_removed([], all_before=60)
    assert {"w", "z"} & {e.key for e in idx.newest_first()} == {"z"}
    # bounded: many objects cycling through the same small range keep one entry
    for i in range(1000):
        idx.add(f"k{i}", r(5000 + (i % 3) * 10, 25), 7)
    assert len(idx) <= 4
    idx.clear()
    assert len(idx) == 0


def test_spans_map_object_bytes_onto_parts() -> None:
    from mooncake_core.store.memory import spans as _spans

    assert _spans([(100, 10)], 5000, 10) == [(100, 5000, 10)]
    # object of 25 bytes over parts 10 + 10 + 10: the last part is used for 5 bytes only
    assert _spans([(100, 10), (300, 10), (500, 10)], 0, 25) == [(100, 0, 10), (300, 10, 10), (500, 20, 5)]
    assert _spans([(100, 0), (200, 4)], 7, 4) == [(200, 7, 4)]  # empty parts are skipped
    assert _spans([(100, 4)], 0, 0) == []


def test_owned_index_matches_eager_overlap_rule() -> None:
    """The index drops overlapped entries lazily (amortised sweeps); what it reports must equal
    dropping them at once on every add, through adds, key moves, discards and sweeps."""
    import random

    from mooncake_core.store import owned as owned_mod
    from mooncake_core.store.owned import OwnedIndex
    from mooncake_core.store.protocol import ReplicaDesc

    rng = random.Random(18)
    old_first = owned_mod._FIRST_SWEEP
    owned_mod._FIRST_SWEEP = 16  # sweep often
    try:
        idx = OwnedIndex()
        model: dict[str, tuple[int, int, int]] = {}  # key -> (addr, size, seq)
        seq = 0
        for step in range(2500):
            if rng.random() < 0.15 and model:
                k = rng.choice(sorted(model))
                idx.discard([k])
                del model[k]
            else:
                k = f"k{rng.randrange(300)}"
                addr, size = rng.randrange(0, 20000, 64), rng.choice([1, 64, 100, 640, 3000])
                idx.add(k, ReplicaDesc("seg", addr, size), 1)
                seq += 1
                model.pop(k, None)
                for other, (a, n, _) in list(model.items()):
                    if a < addr + size and addr < a + n:
                        del model[other]
                model[k] = (addr, size, seq)
            if step % 97 == 0:
                got = [(e.key, e.replica.addr) for e in idx.newest_first()]
                want = [(k, a) for k, (a, _, _) in sorted(model.items(), key=lambda kv: -kv[1][2])]
                assert got == want, f"step {step}"
    finally:
        owned_mod._FIRST_SWEEP = old_first


def test_bytes_addr_is_the_payload_address() -> None:
    import ctypes

    from mooncake_core.store.memory import bytes_addr

    class B(bytes):
        pass

    for b in (b"", b"a", b"xyz" * 333, bytes(1 << 16), B(b"subclass")):
        assert bytes_addr(b) == (ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value or 0)
        assert ctypes.string_at(bytes_addr(b), len(b)) == b


def test_batch_fingerprints_match_single_ones_and_see_changes() -> None:
    """The put path fingerprints a batch at once (a strided view when the objects are laid end
    to end, a gather otherwise); a re-report checks one object at a time: all must agree, and a
    changed byte must change the fingerprint (every byte of objects up to 504 bytes)."""
    import os

    import numpy as np

    from mooncake_core.store.memory import bytes_addr, fingerprint, fingerprints

    buf = bytearray(os.urandom(1 << 20))
    frozen = bytes(buf)
    for n in (100, 600):  # laid end to end: a 2-D take below 512 objects, strided slices from 512
        offs, sizes = np.arange(0, n * 1024, 1024), np.full(n, 1024)
        laid = fingerprints(buf, offs, sizes)
        assert (fingerprints(buf, offs[::-1].copy(), sizes)[::-1] == laid).all(), n  # the general gather
        assert (fingerprints(buf, offs[1:] + 5, sizes[1:]) == fingerprints(buf, offs[1:][::-1] + 5,
                                                                          sizes[1:])[::-1]).all(), n
    assert int(laid[7]) == fingerprint(bytes_addr(frozen) + 7 * 1024, 1024)
    for size in (1, 7, 8, 9, 100, 504, 5000):
        one = fingerprints(buf, np.array([3]), np.array([size]))[0]
        assert int(one) == fingerprint(bytes_addr(frozen) + 3, size), size
        for j in (range(size) if size <= 504 else (0, 1, size - 2, size - 1)):  # big ones: sampled bytes
            changed = bytearray(buf)
            changed[3 + j] ^= 0x40
            assert fingerprints(changed, np.array([3]), np.array([size]))[0] != one, (size, j)
    assert fingerprints(buf, np.array([5]), np.array([0]))[0] == 0
    # a single put fingerprints its object without numpy: the same values
    from mooncake_core.store.memory import fingerprint_in

    for size in (8, 9, 100, 504, 512, 513, 1024, 1000, 4096, 5000, 65536):
        for off in (0, 3, 1001):
            assert fingerprint_in(buf, off, size) == int(fingerprints(buf, np.array([off]), np.array([size]))[0])


def test_a_smaller_value_written_over_the_start_of_an_object_changes_its_fingerprint() -> None:
    """The chaos CI run's foreign read: a 500-byte value of the same writer (the same first 8
    bytes) written at the start of a 60 KB object's range left the object's sampled words as
    they were but one, which it shared, so the owner re-reported the old key over the new bytes.
    The head is sampled densely now: any change in the first 32 bytes is seen."""
    import os

    import numpy as np

    from mooncake_core.store.memory import bytes_addr, fingerprint, fingerprint_in, fingerprints

    old = b"MCv1\x00\x01\x00\x02" + os.urandom(60000 - 8)
    buf = bytearray(old)
    before = fingerprint(bytes_addr(old), len(old))
    buf[8:500] = os.urandom(492)  # the newer, smaller value: same first word, new header after it
    for j in range(8, 32):
        changed = bytearray(old)
        changed[j] ^= 0x01
        assert fingerprint_in(changed, 0, len(old)) != before, j
    assert fingerprint_in(buf, 0, len(old)) != before
    assert int(fingerprints(buf, np.array([0]), np.array([len(old)]))[0]) != before


def test_part_offsets_lay_pieces_end_to_end_per_key() -> None:
    from mooncake_core.store.batch_arrays import part_offsets

    # key 0: pieces of 3, 0, 5 bytes; key 1: none; key 2: one of 4; key 3: 2 and 1
    key, off = part_offsets(np.array([3, 0, 1, 2]), np.array([3, 0, 5, 4, 2, 1]))
    assert key.tolist() == [0, 0, 0, 2, 3, 3]
    assert off.tolist() == [0, 3, 3, 0, 0, 2]
    key, off = part_offsets(np.array([0, 0]), np.zeros(0, np.int64))
    assert key.tolist() == [] and off.tolist() == []


def test_reservation_slot_hands_a_fitting_young_reservation_to_one_put() -> None:
    from mooncake_core.store.protocol import ReplicaDesc, ReplicateConfigMsg
    from mooncake_core.store.reservations import RESERVATION_MAX_AGE_S, Reservation, ReservationSlot

    msg, other = ReplicateConfigMsg(), ReplicateConfigMsg()
    slot = ReservationSlot()
    assert slot.take(1024, msg, 7, 100.0) == (None, True)
    assert slot.take(1024, msg, 7, 100.0) == (None, False), "busy: another put owns the slot"
    r = Reservation([ReplicaDesc("s", 4096, 1024)], 1024, msg, 100.0, 7)
    slot.give(r)
    assert slot.take(1024, msg, 7, 100.1) == (r, True)
    slot.give(r)
    for size, m, epoch, now in ((2048, msg, 7, 100.1), (1024, other, 7, 100.1), (1024, msg, 8, 100.1),
                                (1024, msg, 7, 100.0 + RESERVATION_MAX_AGE_S)):
        assert slot.take(size, m, epoch, now) == (None, True), (size, epoch, now)
        assert slot.current is None, "a reservation that does not fit is dropped"
        slot.give(r)
    assert slot.take(1024, msg, 0, 100.2) == (r, True), "epoch 0: a client without a mount trusts the age"
