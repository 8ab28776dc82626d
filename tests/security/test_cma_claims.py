"""A forged descriptor in the metadata service naming a *real* local engine (its pid, start
time and rpc port) with regions that engine never registered: our engine must not
cross-memory-attach into them. The claimed regions are checked with the target process itself
(GET_DESC on the socket that process listens on) before any process_vm_writev/readv.

The victim is mooncake_lab/fuzz/te_target.py: its registered buffer sits between unregistered guard
bytes of a fixed pattern, so a write outside the registration shows up as a changed guard.
"""

from __future__ import annotations

import numpy as np
import pytest

from mooncake_lab.fuzz.targets import start_te_target
from mooncake_lab.fuzz.te_target import GUARD
from mooncake_core.engine import TransferEngine
from mooncake_core.metadata import HttpMetadataServer
from mooncake_core.metadata.conn_string import parse_http
from mooncake_core.metadata.http_backend import HttpMetadataBackend
from mooncake_core.transfer.descriptor import SegmentDescriptor, host_identity, process_start_time, ram_key
from mooncake_core.transfer.memory import Region
from mooncake_core.utils.proc import close_piped

pytestmark = pytest.mark.integration


@pytest.fixture
def forged(python_exe):
    """(engine, local buffer, victim) with 'forged' published: the victim's identity, but a
    region that also covers its unregistered guards."""
    victim = start_te_target(python_exe)
    srv = HttpMetadataServer(port=0).start()
    boot, pidns = host_identity()
    desc = SegmentDescriptor(name="forged", host="127.0.0.1", port=victim.rpc_port,
                             buffers=[Region(victim.base - GUARD, victim.size + 2 * GUARD, "cpu:0", "cpu:0")],
                             boot_id=boot, pidns=pidns, pid=victim.proc.pid,
                             start_time=process_start_time(victim.proc.pid))
    meta = HttpMetadataBackend(parse_http(srv.url))
    meta.set(ram_key("forged"), desc.to_json())
    eng = TransferEngine()
    assert eng.initialize("127.0.0.1", srv.url, "tcp", "") == 0, eng.last_error
    buf = np.full(8192, 0xEE, dtype=np.uint8)
    assert eng.register_memory(buf.ctypes.data, buf.nbytes) == 0
    yield eng, buf, victim
    eng.close()
    meta.close()
    srv.stop()
    close_piped(victim.proc)


def test_forged_regions_of_a_real_engine_are_not_attached_to(forged) -> None:
    eng, buf, victim = forged
    before = victim.check()
    assert before["guards_ok"]
    for remote in (victim.base - GUARD, victim.base + victim.size, victim.base - 100):  # guard bytes
        rc = eng.transfer_sync_write("forged", buf.ctypes.data, remote, 4096)
        assert rc < 0, f"write of 4096 bytes at {remote:#x} (unregistered) was accepted"
        assert "not in any region process" in eng.last_error, eng.last_error
        assert eng.transport_for("forged") == "cma"  # the path under test, not a tcp fallback
        rc = eng.transfer_sync_read("forged", buf.ctypes.data, remote, 4096)
        assert rc < 0 and "not in any region process" in eng.last_error, eng.last_error
        assert (buf == 0xEE).all(), "a refused read filled the local buffer"
    after = victim.check()
    assert after["guards_ok"], "our engine wrote into memory the victim never registered"
    assert after["sha"] == before["sha"]
    # inside what the victim did register, the same descriptor works: the check is not a blanket refusal
    assert eng.transfer_sync_write("forged", buf.ctypes.data, victim.base, 4096) == 0, eng.last_error
    assert victim.check()["guards_ok"] and victim.check()["sha"] != before["sha"]
