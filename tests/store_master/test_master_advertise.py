"""The address mooncake_master advertises: never loopback for a wider bind without a warning
that says which flag to set."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from mooncake_core.store.master_main import loopback_advertise_warning
from mooncake_core.utils.net import free_port


@pytest.mark.parametrize("bind,advertised,warns", [
    ("0.0.0.0", "127.0.0.1:50051", True),
    ("0.0.0.0", "127.0.1.1:50051", True),    # Debian's /etc/hosts entry for the hostname
    ("::", "[::1]:50051", True),
    ("", "localhost:50051", True),
    ("0.0.0.0", "10.0.0.5:50051", False),
    ("127.0.0.1", "127.0.0.1:50051", False),  # bound to loopback: loopback is right
    ("10.0.0.5", "10.0.0.5:50051", False),
    ("0.0.0.0", "node7:50051", False),        # a name: resolved by the clients
])
def test_loopback_advertise_warning(bind: str, advertised: str, warns: bool) -> None:
    w = loopback_advertise_warning(bind, advertised)
    assert (w is not None) == warns
    if w:
        assert advertised in w and "--rpc_address" in w and "MOONCAKE_LOCAL_HOSTNAME" in w


@pytest.mark.integration
def test_master_on_all_interfaces_never_advertises_loopback_silently(tmp_path) -> None:
    """The master's own log: an advertised 127.x comes with the warning (whether it is 127.x
    depends on how this host's name resolves; either way the log must not mislead)."""
    port, mport = free_port(), free_port()
    log = tmp_path / "master.log"
    with open(log, "wb") as out:
        p = subprocess.Popen([sys.executable, "-m", "mooncake_core.store.master_main", f"--port={port}",
                              "--rpc_address=0.0.0.0", f"--metrics_port={mport}", "--metrics_address=127.0.0.1"],
                             stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "mooncake_master ready" not in log.read_text() and time.monotonic() < deadline:
            assert p.poll() is None, log.read_text()
            time.sleep(0.1)
    finally:
        p.terminate()
        p.wait(10)
    text = log.read_text()
    assert "mooncake_master ready" in text, text
    [listening] = [ln for ln in text.splitlines() if "master RPC listening" in ln]
    advertised = listening.split("advertised=")[1].split()[0]
    if advertised.startswith("127.") or advertised.startswith("[::1]"):
        assert any("WARNING" in ln and "--rpc_address" in ln and advertised in ln for ln in text.splitlines()), text
