"""What a new user's first store script sees: a clean exit prints nothing, a master that is not
running is named at once ("connection refused"), a master that accepts and stays silent is
"no reply". Each script runs as its own process, so the test sees exactly its output."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time

import pytest

from mooncake_core.utils.net import free_port

pytestmark = pytest.mark.integration


def run_script(body: str, *, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    import os

    code = textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


SETUP = """
    import time
    from mooncake_core.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    t0 = time.monotonic()
    rc = s.setup("127.0.0.1", {meta!r}, {seg}, 16 << 20, "tcp", "", {master!r})
    print("rc", rc, "took", round(time.monotonic() - t0, 3))
"""


def test_a_script_that_never_calls_close_exits_silently(master_factory) -> None:
    """setup, put, get, and the end of the script without close(): nothing on stderr, exit 0."""
    m = master_factory()
    script = SETUP.format(meta=m.meta, seg=32 << 20, master=m.addr) + """
    assert s.put("k", b"v" * 1000) == 0
    assert s.get("k") == b"v" * 1000
    print("ok")
    """
    r = run_script(script)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "ok"
    assert r.stderr == "", f"a clean exit printed:\n{r.stderr}"


def test_master_not_running_fails_at_once_naming_the_address() -> None:
    port = free_port()  # nothing listens there
    r = run_script(SETUP.format(meta="P2PHANDSHAKE", seg=16 << 20, master=f"127.0.0.1:{port}"))
    assert r.returncode == 0, r.stderr
    rc, took = r.stdout.split()[1], float(r.stdout.split()[3])
    assert rc == "-900"
    assert took < 1.0, f"a refused connection took {took}s to report"
    err = r.stderr
    assert "connection refused" in err and f"127.0.0.1:{port}" in err, err
    assert "mooncake_master" in err and "master_server_address" in err, err  # how to fix it
    assert "no reply" not in err, err


def test_master_that_accepts_and_stays_silent_is_no_reply() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes the handshakes; nobody ever answers
        port = silent.getsockname()[1]
        t0 = time.monotonic()
        r = run_script(SETUP.format(meta="P2PHANDSHAKE", seg=16 << 20, master=f"127.0.0.1:{port}"),
                       env={"MC_STORE_RPC_TIMEOUT": "1"})
        wall = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[1] == "-900"
    assert "no reply within 1.0s" in r.stderr and f"127.0.0.1:{port}" in r.stderr, r.stderr
    assert "connection refused" not in r.stderr
    assert wall < 10, f"setup against a silent master took {wall:.1f}s in all (rpc timeout 1 s)"


def test_a_script_whose_master_is_gone_exits_promptly_and_silently(master_factory) -> None:
    """The master stopped first (the user's Ctrl-C went to it, say): the script's exit closes
    the store, and a refused unmount is not retried for an RPC timeout."""
    m = master_factory(http=False)
    script = SETUP.format(meta="P2PHANDSHAKE", seg=16 << 20, master=m.addr) + """
    import sys
    assert s.put("k", b"v") == 0
    print("ready", flush=True)
    sys.stdin.readline()
    """
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while (line := p.stdout.readline()) and not line.startswith("ready"):
            pass
        assert line.startswith("ready"), p.stderr.read()
        m.stop()
        t0 = time.monotonic()
        out, err = p.communicate("\n", timeout=30)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and err == "", err
    assert took < 2.5, f"exit took {took:.1f}s with the master gone (an RPC timeout is 5 s)"


def test_a_master_host_that_does_not_resolve_is_named() -> None:
    from mooncake_core.errors import MooncakeError
    from mooncake_core.store.master_client import MasterClient

    with MasterClient("no-such-host.invalid:50051", timeout=5.0) as c:  # RFC 2606: never resolves
        t0 = time.monotonic()
        with pytest.raises(MooncakeError, match="cannot resolve its host name"):
            c.ping(refused_is_final=True)
    assert time.monotonic() - t0 < 5.0, "waited out the RPC deadline for a name that cannot resolve"
