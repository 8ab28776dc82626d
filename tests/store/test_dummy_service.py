"""The store as a standing service: master + ``mooncake_client`` + dummy engine processes.

A dummy's objects belong to the pool (SIGKILL it, the next one reads everything); the service
going away gives a clear error fast, and dummies re-attach when it is back; bad input (nothing
listening, a value larger than the staging memory, memory the service cannot see) gets a clear
error and never wrong bytes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time

import pytest

from mooncake_core.utils.net import free_port
from mooncake_lab.store_procs import start_mooncake_client

pytestmark = pytest.mark.integration

_DUMMY = textwrap.dedent("""
    import ctypes, hashlib, json, os, sys, time
    from mooncake_core.store.client import MooncakeDistributedStore
    store = MooncakeDistributedStore()
    out = {"setup": store.setup_dummy(256 << 20, 16 << 20, sys.argv[1])}
    def payload(i, n):
        return hashlib.sha256(str(i).encode()).digest() * (n // 32)
    op = sys.argv[2]
    if op == "fill":
        # bytes puts (4 KiB and 4 MiB) and zero-copy puts from pool memory, then wait to be killed
        buf = store.alloc_from_mem_pool(4 << 20)
        assert store.register_buffer(buf, 4 << 20) == 0
        rcs = []
        for i in range(8):
            rcs.append(store.put(f"small{i}", payload(i, 4096)))
            rcs.append(store.put(f"big{i}", payload(i, 4 << 20)))
            data = payload(100 + i, 1 << 20)
            ctypes.memmove(buf, data, len(data))
            rcs.append(store.put_from(f"from{i}", buf, len(data)))
        out["rcs"] = rcs
        print(json.dumps(out), flush=True)
        time.sleep(600)
    elif op == "check":
        buf = store.alloc_from_mem_pool(4 << 20)
        bad = 0
        for i in range(8):
            bad += store.get(f"small{i}") != payload(i, 4096)
            bad += store.get(f"big{i}") != payload(i, 4 << 20)
            n = store.get_into(f"from{i}", buf, 4 << 20)
            bad += n != 1 << 20 or ctypes.string_at(buf, n) != payload(100 + i, 1 << 20)
        out["bad"] = bad
        # the pool-management calls go through the service too (a task's answer is typed)
        tid, rc = store.create_copy_task("small0", [store.get_hostname()])
        resp = None
        for _ in range(100):
            resp, _rc = store.query_task(tid)
            if resp is None or int(resp.status) >= 2:
                break
            time.sleep(0.1)
        out["task"] = [rc, type(resp).__name__, int(resp.status) if resp is not None else None]
        out["unknown_task"] = list(store.query_task((7, 7)))
        print(json.dumps(out), flush=True)
""")


def _client(python_exe: str, master, port: int, log_path: str) -> subprocess.Popen:
    return start_mooncake_client(python_exe, master.addr, master.meta, port, log_path)


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _dummy(python_exe: str, port: int, op: str) -> subprocess.Popen:
    return subprocess.Popen([python_exe, "-c", _DUMMY, f"127.0.0.1:{port}", op], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=_root()))


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_a_sigkilled_dummys_objects_stay_in_the_pool(master_factory, python_exe, tmp_path) -> None:
    m = master_factory()
    port = free_port()
    svc = _client(python_exe, m, port, str(tmp_path / "client.log"))
    try:
        a = _dummy(python_exe, port, "fill")
        line = a.stdout.readline()
        assert line, a.stderr.read()
        got = json.loads(line)
        assert got["setup"] == 0 and got["rcs"] == [0] * 24
        a.send_signal(signal.SIGKILL)
        a.wait()
        b = _dummy(python_exe, port, "check")
        out, err = b.communicate(timeout=120)
        assert json.loads(out.splitlines()[-1]) == {"setup": 0, "bad": 0, "task": [0, "QueryTaskResponse", 3],
                                                    "unknown_task": [None, -1400]}, err[-2000:]
    finally:
        _stop(svc)


def test_service_loss_is_a_clear_error_and_dummies_reattach(master_factory, python_exe, tmp_path, caplog) -> None:
    """In this process: the dummy's calls answer -900 / b'' at once while the service is down,
    and the same store object works again (its pool buffer included) once it is back."""
    import ctypes

    from mooncake_core.store.client import MooncakeDistributedStore

    m = master_factory()
    port = free_port()
    log_path = str(tmp_path / "client.log")
    svc = _client(python_exe, m, port, log_path)
    store = MooncakeDistributedStore()
    try:
        assert store.setup_dummy(64 << 20, 8 << 20, f"127.0.0.1:{port}") == 0
        buf = store.alloc_from_mem_pool(1 << 20)
        assert buf and store.register_buffer(buf, 1 << 20) == 0
        ctypes.memmove(buf, b"x" * (1 << 20), 1 << 20)
        assert store.put_from("before", buf, 1 << 20) == 0
        svc.send_signal(signal.SIGKILL)
        svc.wait()
        t0 = time.monotonic()
        assert store.put("during", b"v" * 100) == -900
        assert store.get("before") == b""
        assert store.batch_is_exist(["a", "b"]) == [-900, -900]
        assert store.health_check() == 2
        assert time.monotonic() - t0 < 5
        assert any("mooncake_client at 127.0.0.1:%d" % port in r.getMessage() for r in caplog.records)
        svc = _client(python_exe, m, port, log_path)
        deadline = time.monotonic() + 30
        while store.health_check() != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert store.health_check() == 0
        # the pool buffer was passed again: zero-copy calls on it work on the new service
        ctypes.memmove(buf, b"y" * (1 << 20), 1 << 20)
        assert store.put_from("after", buf, 1 << 20) == 0
        ctypes.memset(buf, 0, 1 << 20)
        assert store.get_into("after", buf, 1 << 20) == 1 << 20
        assert ctypes.string_at(buf, 1 << 20) == b"y" * (1 << 20)
        # the old service's segment went with it: "before" is gone, not wrong
        assert store.get("before") in (b"", b"x" * (1 << 20))
    finally:
        store.close()
        _stop(svc)


def test_bad_input_gets_clear_errors(master_factory, python_exe, tmp_path, caplog) -> None:
    from mooncake_core.store.client import MooncakeDistributedStore

    nothing = MooncakeDistributedStore()
    t0 = time.monotonic()
    assert nothing.setup_dummy(1 << 20, 1 << 20, f"127.0.0.1:{free_port()}") == -1
    assert time.monotonic() - t0 < 5
    assert any("not reachable" in r.getMessage() for r in caplog.records)
    assert nothing.setup_dummy(1 << 20, 1 << 20, "no-port") == -1
    assert nothing.put("k", b"v") == -600  # not set up

    m = master_factory()
    port = free_port()
    svc = _client(python_exe, m, port, str(tmp_path / "client.log"))
    store = MooncakeDistributedStore()
    try:
        assert store.setup_dummy(2 << 20, 1 << 20, f"127.0.0.1:{port}") == 0
        # a value larger than the staging memory still goes (inline), byte-exact
        big = os.urandom(3 << 20)
        assert store.put("big", big) == 0
        assert store.get("big") == big
        # the pool is bounded by mem_pool_size
        assert store.alloc_from_mem_pool(4 << 20) == 0
        buf = store.alloc_from_mem_pool(1 << 20)
        assert buf
        # memory the service does not map: refused, nothing stored
        private = (ctypes_buf := bytearray(4096))
        import ctypes

        addr = ctypes.addressof((ctypes.c_char * 4096).from_buffer(private))
        assert store.register_buffer(addr, 4096) == -600
        assert store.put_from("private", addr, 4096) == -600
        assert store.is_exist("private") == 0
        # a range running past the pool buffer: refused before any byte moves
        assert store.get_into("big", buf + 4096, 1 << 20) == -600
        assert store.batch_get_into(["big"], [buf], [3 << 20]) == [-600]
        del ctypes_buf
        # wrong argument types raise as on a full client
        with pytest.raises(TypeError):
            store.put_from("k", "not an address", 4)  # type: ignore[arg-type]
    finally:
        store.close()
        _stop(svc)
