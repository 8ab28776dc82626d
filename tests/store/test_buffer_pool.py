"""``BufferPool``: registered memory leased for zero-copy store calls (the original's
``mooncake.buffer_pool`` interface), against a real master."""

from __future__ import annotations

import threading
import time

import pytest

from mooncake_core.store import BufferPool, RegisteredBufferPool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MiB = 1 << 20


def test_buffer_pool_leases_registered_memory_overflows_and_blocks(master_factory, client_factory) -> None:
    m = master_factory(default_kv_lease_ttl=500)
    c = client_factory(m, segment=16 * MiB, local_buffer_size=4 * MiB)
    assert RegisteredBufferPool is BufferPool
    pool = BufferPool(c, min_size_class=4096, alignment=4096)
    assert pool.max_bytes == 8 * MiB  # twice the local buffer by default, as the original

    with pool.acquire(1234) as lease:  # zero-copy through the leased memory
        assert lease.size == 1234 and len(lease.buffer) == 1234 and lease.ptr % 4096 == 0
        lease.buffer[:] = bytes(range(256)) * 4 + b"z" * 210
        assert c.put_from("bp", lease.ptr, 1234) == 0
    with pool.acquire(2048) as back:
        assert c.get_into("bp", back.ptr, 2048) == 1234
        assert bytes(back.buffer[:1234]) == bytes(range(256)) * 4 + b"z" * 210

    whole = pool.acquire(4 * MiB)  # the whole arena ...
    over = pool.acquire(1024, block=False)  # ... so this one gets its own registered buffer
    over.buffer[:3] = b"abc"
    assert c.put_from("bp2", over.ptr, 3) == 0 and c.get("bp2") == b"abc"
    with pytest.raises(RuntimeError, match="exceeds pool capacity"):
        pool.acquire(9 * MiB)
    rest = pool.acquire(4 * MiB - 1024, block=False)  # max_bytes reached now
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.acquire(1, block=False)
    with pytest.raises(RuntimeError, match="timed out"):
        pool.acquire(1, timeout=0.05)
    threading.Timer(0.2, rest.release).start()
    t0 = time.monotonic()
    pool.acquire(1).release()  # blocks until the release
    assert time.monotonic() - t0 >= 0.15
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    view = whole.buffer[:8]  # a live view pins the lease: releasing it now would free memory in use
    with pytest.raises(RuntimeError, match="exported views"):
        whole.release()
    del view
    whole.release()
    over.release()
    with pytest.raises(RuntimeError, match="closed"):
        over.buffer  # noqa: B018
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.acquire(1)


def test_buffer_pool_needs_a_local_buffer(master_factory, client_factory) -> None:
    m = master_factory(default_kv_lease_ttl=500)
    c = client_factory(m, segment=16 * MiB, local_buffer_size=0)
    with pytest.raises(RuntimeError, match="local buffer"):
        BufferPool(c)
