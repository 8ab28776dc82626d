"""The store client with buffers registered as GPU memory (the vLLM store connector's KV blocks
with ``kv_buffer_device: "cuda"``), on CPU: a copier of ``device_memory`` that says which host
buffers are "on the device" and copies them for real. Replicas in another process's segment go
through the engine's staging; replicas in the client's own segment through the device copier.
tests/gpu/test_cuda_store.py runs the same on a real GPU."""

from __future__ import annotations

import numpy as np
import pytest

from mooncake_core.transfer import device_memory

pytestmark = pytest.mark.integration


class LabelledCopier(device_memory.HostCopier):
    """Host memory, but the listed buffers are reported as device 0 (what the CUDA copier says of
    a GPU pointer), so ``register_buffer`` registers them as ``cuda:0``."""

    def __init__(self, buffers: list[np.ndarray]) -> None:
        super().__init__("cuda")
        self.spans = [(b.ctypes.data, b.nbytes) for b in buffers]

    def device_of(self, addr: int) -> int | None:
        return 0 if any(a <= addr < a + n for a, n in self.spans) else None


@pytest.mark.parametrize("own_segment", [False, True])
def test_store_puts_and_gets_buffers_registered_as_gpu_memory(master_factory, worker_factory, client_factory,
                                                             own_segment: bool) -> None:
    n = 4 << 20
    src = np.random.default_rng(3).integers(0, 256, n, dtype=np.uint8)
    dst = np.zeros(n, dtype=np.uint8)
    copier = LabelledCopier([src, dst])
    device_memory.install_copier("cuda", copier)
    try:
        m = master_factory()
        if not own_segment:
            worker_factory(m, 32 << 20)  # the only segment: every replica in another process
        c = client_factory(m, segment=(32 << 20) if own_segment else 0)
        for b in (src, dst):
            assert c.register_buffer(b.ctypes.data, b.nbytes) == 0
        assert device_memory.find(src.ctypes.data, n) is not None and device_memory.find(dst.ctypes.data, n)
        assert c.put_from("whole", src.ctypes.data, n) == 0
        assert c.get_into("whole", dst.ctypes.data, n) == n and np.array_equal(dst, src)
        # the vLLM store connector's calls: several blocks per key, scattered in the buffers
        bs = 64 << 10
        keys = [f"blk{i}" for i in range(8)]
        ptrs = [[src.ctypes.data + (2 * i) * bs, src.ctypes.data + (2 * i + 1) * bs] for i in range(8)]
        assert c.batch_put_from_multi_buffers(keys, ptrs, [[bs, bs]] * 8) == [0] * 8
        dst[:] = 0
        back = [[dst.ctypes.data + (15 - 2 * i) * bs, dst.ctypes.data + (14 - 2 * i) * bs] for i in range(8)]
        assert c.batch_get_into_multi_buffers(keys, back, [[bs, bs]] * 8) == [2 * bs] * 8
        for i in range(8):
            assert np.array_equal(dst[(15 - 2 * i) * bs:(16 - 2 * i) * bs], src[(2 * i) * bs:(2 * i + 1) * bs])
        assert copier.copies > 0  # the device path was taken, not a plain memmove of a "GPU" pointer
    finally:
        device_memory.uninstall_copier("cuda")
