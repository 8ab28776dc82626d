"""Runs in a python that has nixl, torch and a CUDA GPU: NIXL ``VRAM`` through ``MooncakeCore``.

Two agents in this process: A's GPU buffer is written into B's GPU buffer in scattered pieces
(with a notification), then read back into A's host buffer (VRAM -> DRAM). Prints one JSON
line of what the buffers hold (sha256), which tests/gpu/test_nixl_vram.py asserts on.
"""

from __future__ import annotations

import hashlib
import json
import time

import numpy as np
import torch
from nixl._api import nixl_agent, nixl_agent_config

BACKEND = "MooncakeCore"
SIZE = 8 << 20
PIECES = [(i * (SIZE // 64) + 512 * (i % 7), 64 << 10) for i in range(64)]  # (offset, length), disjoint


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()


def gather(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t[o:o + n] for o, n in PIECES])


def wait(a: nixl_agent, h) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = a.check_xfer_state(h)
        if st != "PROC":
            return st
        time.sleep(0.001)
    return "TIMEOUT"


def main() -> None:
    a = nixl_agent("A", nixl_agent_config(backends=[BACKEND]))
    b = nixl_agent("B", nixl_agent_config(backends=[BACKEND]))
    gen = torch.Generator().manual_seed(9)
    src = torch.randint(0, 256, (SIZE,), dtype=torch.uint8, generator=gen).cuda()
    dst = torch.zeros(SIZE, dtype=torch.uint8, device="cuda")
    back = torch.zeros(SIZE, dtype=torch.uint8)
    dev = torch.cuda.current_device()
    a.register_memory([(src.data_ptr(), SIZE, dev, "")], "VRAM")
    a.register_memory([(back.data_ptr(), SIZE, 0, "")], "DRAM")
    b.register_memory([(dst.data_ptr(), SIZE, dev, "")], "VRAM")
    a.add_remote_agent(b.get_agent_metadata())

    def descs(base: int, mem: str, device: int):
        return a.get_xfer_descs([(base + o, n, device) for o, n in PIECES], mem)

    h = a.initialize_xfer("WRITE", descs(src.data_ptr(), "VRAM", dev), descs(dst.data_ptr(), "VRAM", dev), "B",
                          b"vram written")
    a.transfer(h)
    write = wait(a, h)
    notifs: dict[str, list[str]] = {}
    deadline = time.monotonic() + 30
    while not notifs and time.monotonic() < deadline:
        notifs = {k: [m.decode() for m in v] for k, v in b.get_new_notifs().items()}
    torch.cuda.synchronize()
    h2 = a.initialize_xfer("READ", descs(back.data_ptr(), "DRAM", 0), descs(dst.data_ptr(), "VRAM", dev), "B")
    a.transfer(h2)
    read = wait(a, h2)
    untouched = torch.ones(SIZE, dtype=torch.bool, device="cuda")
    for o, n in PIECES:
        untouched[o:o + n] = False
    print(json.dumps({"mems": a.get_backend_mem_types(BACKEND), "write": write, "read": read, "notifs": notifs,
                      "sent": sha(gather(src)), "received": sha(gather(dst)), "read_back": sha(gather(back)),
                      "dst_rest_zero": bool((dst[untouched] == 0).all().item()),
                      "back_rest_zero": bool(np.all(back.numpy()[untouched.cpu().numpy()] == 0))}), flush=True)


if __name__ == "__main__":
    main()
