"""The store client with GPU buffers on a real GPU (the vLLM store connector with
``kv_buffer_device: "cuda"``): replicas in another process's segment (staged by the engine) and
in the client's own segment (device copies). Skipped without a GPU, naming it."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from mooncake_core.transfer.cuda.runtime import available

pytestmark = [pytest.mark.gpu, pytest.mark.integration,
              pytest.mark.skipif(not available(), reason="needs a CUDA GPU (cuda-python sees none here); "
                                 "run tests/gpu on a GPU machine (docs/gpu.md)")]


@pytest.mark.parametrize("own_segment", [False, True])
def test_store_puts_and_gets_gpu_buffers(tmp_path, own_segment: bool) -> None:
    torch = pytest.importorskip("torch")
    from mooncake_lab.store_procs import Master, Worker, make_client

    n = 16 << 20
    src = torch.from_numpy(np.random.default_rng(5).integers(0, 256, n, dtype=np.uint8)).cuda()
    dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
    m = Master(sys.executable, str(tmp_path)).start()
    w = Worker(sys.executable, m, 64 << 20) if not own_segment else None
    c = make_client(m, (64 << 20) if own_segment else 0)
    try:
        for t in (src, dst):
            assert c.register_buffer(t.data_ptr(), n) == 0
        assert c.put_from("whole", src.data_ptr(), n) == 0
        assert c.get_into("whole", dst.data_ptr(), n) == n
        assert torch.equal(dst, src)
        bs = 256 << 10
        keys = [f"blk{i}" for i in range(16)]
        ptrs = [[src.data_ptr() + (2 * i) * bs, src.data_ptr() + (2 * i + 1) * bs] for i in range(16)]
        assert c.batch_put_from_multi_buffers(keys, ptrs, [[bs, bs]] * 16) == [0] * 16
        dst.zero_()
        back = [[dst.data_ptr() + (31 - 2 * i) * bs, dst.data_ptr() + (30 - 2 * i) * bs] for i in range(16)]
        assert c.batch_get_into_multi_buffers(keys, back, [[bs, bs]] * 16) == [2 * bs] * 16
        for i in range(16):
            assert torch.equal(dst[(31 - 2 * i) * bs:(32 - 2 * i) * bs], src[(2 * i) * bs:(2 * i + 1) * bs])
    finally:
        c.close()
        if w is not None:
            w.close()
        m.stop()
