"""Initiator for tests/plugins/test_third_party_plugin.py, run by the plugin venv's python.

Opens a TransferEngine on the plugin's ``dirkv://`` metadata backend, writes a random block
into the peer's buffer and reads the peer's original bytes back, then prints one JSON line:
the transport chosen for the peer, the sha256 of what was read, what was written, and the
transports the plugin manager lists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import numpy as np

from mooncake_core.engine import TransferEngine
from mooncake_core.plugins import transport_classes


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--metadata", required=True)
    p.add_argument("--hostname", required=True)
    p.add_argument("--segment", required=True)
    p.add_argument("--addr", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    a = p.parse_args()
    eng = TransferEngine()
    if eng.initialize(a.hostname, a.metadata, "tcp", "") != 0:
        print(json.dumps({"error": eng.last_error}), flush=True)
        return 1
    half = a.size // 2
    src = np.random.default_rng(7).integers(0, 256, half, dtype=np.uint8)
    dst = np.zeros(half, dtype=np.uint8)
    assert eng.register_memory(src.ctypes.data, src.nbytes) == 0
    assert eng.register_memory(dst.ctypes.data, dst.nbytes) == 0
    rc_read = eng.transfer_sync_read(a.segment, dst.ctypes.data, a.addr, half)
    rc_write = eng.transfer_sync_write(a.segment, src.ctypes.data, a.addr + half, half)
    print(json.dumps({"transport": eng.transport_for(a.segment), "rc": [rc_read, rc_write],
                      "read_sha": hashlib.sha256(dst.tobytes()).hexdigest(),
                      "written_sha": hashlib.sha256(src.tobytes()).hexdigest(),
                      "transports": [c.name for c in transport_classes()]}), flush=True)
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
