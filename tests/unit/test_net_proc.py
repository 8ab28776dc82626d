"""wait_for_port and close_piped: the helpers every process-starting test and CLI relies on."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from mooncake_core.utils.net import free_port, wait_for_port
from mooncake_core.utils.proc import close_piped, quiet_ctrl_c, stop_process, thread_report


def test_wait_for_port_returns_once_listening() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        t0 = time.monotonic()
        wait_for_port("127.0.0.1", s.getsockname()[1], 5)
        assert time.monotonic() - t0 < 2


def test_wait_for_port_waits_for_late_listener() -> None:
    port = free_port()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def late() -> None:
        time.sleep(0.3)
        srv.bind(("127.0.0.1", port))
        srv.listen(1)

    th = threading.Thread(target=late)
    th.start()
    try:
        t0 = time.monotonic()
        wait_for_port("127.0.0.1", port, 10)
        assert time.monotonic() - t0 >= 0.25
    finally:
        th.join()
        srv.close()


def test_wait_for_port_timeout_names_address() -> None:
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=f"127.0.0.1:{port}"):
        wait_for_port("127.0.0.1", port, 0.3)
    assert time.monotonic() - t0 < 3


def test_wait_for_port_reports_early_exit_code() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    proc.wait(10)
    with pytest.raises(RuntimeError, match="code 3"):
        wait_for_port("127.0.0.1", free_port(), 30, proc)


def test_close_piped_polite_and_forced() -> None:
    polite = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline(); sys.exit(5)"],
                              stdin=subprocess.PIPE, text=True)
    assert close_piped(polite, timeout=10) == 5
    deaf = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            stdin=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    rc = close_piped(deaf, timeout=0.5)
    assert rc is not None and rc < 0  # killed by a signal
    assert time.monotonic() - t0 < 5


def test_stop_process_terminates_then_kills() -> None:
    soft = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert stop_process(soft, timeout=10) == -15  # SIGTERM ended it
    stubborn = subprocess.Popen([sys.executable, "-c",
                                 "import signal, sys, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                 "print('ready', flush=True)\n"
                                 "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline().strip() == "ready"  # SIGTERM handler is installed
    t0 = time.monotonic()
    assert stop_process(stubborn, timeout=0.5) == -9
    assert time.monotonic() - t0 < 5
    stubborn.stdout.close()
    assert stop_process(stubborn) == -9, "an exited child: just its return code"


def test_thread_report_shows_a_signal_blocked_and_pending() -> None:
    """A child that blocks SIGINT keeps it pending: the report names each thread and shows bit 1
    (SIGINT = 2) in the process-wide pending set and in the blocked mask; a gone pid gives ''."""
    code = ("import signal, sys, threading, time; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}); "
            "threading.Thread(target=time.sleep, args=(30,), name='napper', daemon=True).start(); "
            "print('ready', flush=True); time.sleep(30)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        p.send_signal(2)
        time.sleep(0.2)
        report = thread_report(p.pid)
        head, *threads = report.splitlines()
        assert int(head.rsplit("ShdPnd=", 1)[1], 16) & 0x2, report
        assert len(threads) == 2, report
        assert all(int(t.split("SigBlk=")[1].split()[0], 16) & 0x2 for t in threads), report
        assert all("state=S" in t for t in threads), report
        assert p.poll() is None  # the signal was never delivered
    finally:
        stop_process(p, 5)
    assert thread_report(p.pid) == ""


def test_readline_timeout_kills_wedged_child():
    import subprocess
    import sys
    import time

    import pytest

    from mooncake_core.utils.proc import readline_timeout

    p = subprocess.Popen([sys.executable, "-c", "import sys,time; print('hello', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE, text=True)
    assert readline_timeout(p, 10, what="sleeper") == "hello\n"
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="sleeper"):
        readline_timeout(p, 0.5, what="sleeper")
    assert time.monotonic() - t0 < 5
    assert p.wait(5) != 0  # killed


def test_spawn_until_matches_and_bounds_the_wait():
    import sys

    import pytest

    from mooncake_core.utils.proc import spawn_until, stop_process

    p, m = spawn_until([sys.executable, "-u", "-c", "import time; print('srv listening on :4242'); time.sleep(30)"],
                       r"listening on :(\d+)", 10, what="srv")
    assert m.group(1) == "4242"
    stop_process(p)
    with pytest.raises(RuntimeError, match="did not start"):
        spawn_until([sys.executable, "-c", "import time; time.sleep(30)"], "never", 0.5, what="silent")
    with pytest.raises(RuntimeError, match="exited with code 3"):
        spawn_until([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], "never", 10, what="dies")


def test_quiet_ctrl_c_is_one_line_and_130(capsys) -> None:
    @quiet_ctrl_c("mytool")
    def main(n: int) -> int:
        if n:
            raise KeyboardInterrupt
        return 0

    assert main(0) == 0
    assert main(1) == 130
    assert capsys.readouterr().err == "\nmytool: interrupted\n"


def test_endpoint_host_of_every_address_form() -> None:
    from mooncake_core.utils.net import endpoint_host

    assert endpoint_host("10.0.0.5:50051") == "10.0.0.5"
    assert endpoint_host("etcd://e1:2379;e2:2379") == "e1"
    assert endpoint_host("http://meta:8080/metadata") == "meta"
    assert endpoint_host("redis://user:pw@r:6379/0") == "r"
    assert endpoint_host("[fd00::1]:50051") == "fd00::1"
    assert endpoint_host("P2PHANDSHAKE") is None and endpoint_host("") is None and endpoint_host(None) is None


def test_loopback_detection_and_warning() -> None:
    from mooncake_core.utils.net import is_loopback, local_ip, loopback_warning

    assert is_loopback("localhost") and is_loopback("127.0.1.1") and is_loopback("::1") and is_loopback("[::1]")
    assert not is_loopback("10.1.2.3") and not is_loopback("no-such-host.invalid") and not is_loopback("")
    # loopback advertised to a remote peer: the warning names the variable to set and the peer
    w = loopback_warning("127.0.1.1:15000", "etcd://10.9.8.7:2379", what="store client")
    assert w is not None and "MOONCAKE_LOCAL_HOSTNAME" in w and "10.9.8.7" in w and "127.0.1.1:15000" in w
    # nothing to say: a local peer, a routable address, no peer at all
    assert loopback_warning("localhost:1", "127.0.0.1:50051", what="x") is None
    assert loopback_warning("10.0.0.2:1", "10.9.8.7:50051", what="x") is None
    assert loopback_warning("localhost:1", "P2PHANDSHAKE", what="x") is None
    # toward a local master the route is loopback, and that is right
    assert is_loopback(local_ip(toward="127.0.0.1"))
