"""Fuzz the Transfer Engine's rpc port (the tcp wire): data, vectored and control ops.

A real target process registers 256 KiB between two unregistered guard areas; the fuzzer feeds
it garbage and well-framed requests with hostile addresses, lengths, block lists and payloads,
and checks every answer against a shadow copy of the registered bytes (surfaces.TeWireFuzzer).
Afterwards the target must still serve a real engine's read of all its memory, hold exactly the
bytes the fuzzer wrote, and have both guards intact.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from fuzz.conftest import fuzz
from mooncake_lab.fuzz.surfaces import TeWireFuzzer, check_shadow_matches
from mooncake_core.engine import TransferEngine

pytestmark = pytest.mark.integration


def _real_read_all(target, shadow: bytes) -> None:
    eng = TransferEngine()
    assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, eng.last_error
    try:
        buf = np.zeros(target.size, dtype=np.uint8)
        assert eng.register_memory(buf.ctypes.data, buf.nbytes) == 0
        rc = eng.transfer_sync_read(target.segment, buf.ctypes.data, target.base, target.size)
        assert rc == 0, eng.last_error
        check_shadow_matches(buf, shadow, "real engine read after fuzzing")
    finally:
        eng.close()


def test_te_wire_survives_fuzzing_and_never_touches_unregistered_memory(te_target) -> None:
    fz = TeWireFuzzer("127.0.0.1", te_target.rpc_port, te_target.base, te_target.size, te_target.initial())
    try:
        fuzz(fz.one)
    finally:
        fz.close()
    assert te_target.proc.poll() is None, "the target process died"
    state = te_target.check()
    assert state["guards_ok"], "bytes outside registered memory were changed"
    assert state["sha"] == hashlib.sha256(fz.shadow).hexdigest(), "registered bytes differ from the model"
    _real_read_all(te_target, bytes(fz.shadow))
    assert set(fz.kinds) >= {"data", "vec", "ctl"}
