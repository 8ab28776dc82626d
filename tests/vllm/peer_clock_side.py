"""Our vLLM connector's ``PeerClocks`` (decode side) on a real Transfer Engine, facing a prefill
host that accepts connections and never answers (a box too busy to run its rpc thread): how long
``submit`` holds the caller -- the engine's step -- and what became of the read. One JSON line of
facts; test_vllm_peer_clock.py checks them. Run in the vLLM venv with MC_TRANSFER_TIMEOUT set."""

from __future__ import annotations

import json
import socket
import time

from mooncake_connectors.vllm.p2p_messages import RecvReq
from mooncake_connectors.vllm.p2p_notifier import Notifier
from mooncake_connectors.vllm.peer_clock import PeerClocks
from mooncake_core.engine import TransferEngine
from mooncake_core.pd.params import RemotePrefill, new_transfer_id


def main() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel completes connections; nothing ever reads or answers them
    seg = f"127.0.0.1:{silent.getsockname()[1]}"
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, te.last_error
    started: list[str] = []
    failed: list[str] = []
    clocks = PeerClocks(30.0, te.get_local_segment_name(), Notifier(te, 0, 1),
                        lambda r: started.append(r.request_id), lambda r, why: failed.append(why))
    clocks.offsets.sample(seg, 0.0, time.monotonic() - 60.0, 0.0, 0.0, time.monotonic() - 60.0)  # a minute old
    rp = RemotePrefill(transfer_id=new_transfer_id("eng", "req-1"), segment=seg, engine_id="eng",
                       request_id="req-1", block_ids=[1], num_tokens=32, block_size=32, block_bytes=4096,
                       num_slabs=1, lease_expiry_unix=time.time() + 60)
    t0 = time.monotonic()
    clocks.submit(RecvReq("req-1", rp, [3], 0))
    held = time.monotonic() - t0
    print(json.dumps({"held_s": held, "started": started, "failed": failed}), flush=True)
    te.close()


if __name__ == "__main__":
    main()
