"""The address a store client advertises, across two network namespaces: a master on a
non-loopback address (the root namespace's bridge), a client in its own namespace. With
MOONCAKE_LOCAL_HOSTNAME unset the client advertises the source address of its route to the master
(reachable), not the host name's (127.0.1.1 on Debian) or "localhost"; with a loopback one set it
warns, naming MOONCAKE_LOCAL_HOSTNAME, within a second -- not as a transfer timeout much later.
Needs root (network namespaces); skipped with the reason otherwise."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from mooncake_core.utils.net import free_port, wait_for_port
from mooncake_core.utils.proc import stop_process


from mooncake_lab.chaos import netlab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CLIENT = r"""
import json, logging, time
warnings = []
class Keep(logging.Handler):
    def emit(self, r):
        if r.levelno >= logging.WARNING:
            warnings.append((time.monotonic(), r.getMessage()))
logging.getLogger("mooncake").addHandler(Keep())
from mooncake_core.store import MooncakeDistributedStore
s = MooncakeDistributedStore()
t0 = time.monotonic()
rc = s.setup()
seg = s._core.segment_name if rc == 0 else None
s.close()
print(json.dumps({"rc": rc, "segment": seg, "warnings": [[round(t - t0, 3), m] for t, m in warnings]}))
"""


def _client(lab: netlab.NetLab, python_exe: str, master: str, meta: str, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MOONCAKE_", "MC_"))}
    base.update({"MOONCAKE_MASTER": master, "MOONCAKE_TE_META_DATA_SERVER": meta,
                 "MOONCAKE_GLOBAL_SEGMENT_SIZE": "4MB", "MOONCAKE_LOCAL_BUFFER_SIZE": "4MB", **env})
    out = subprocess.run([*lab.exec_prefix(0), python_exe, "-c", CLIENT], env=base, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_default_address_is_the_route_to_the_master_and_loopback_warns(python_exe, tmp_path) -> None:
    caps = netlab.probe()
    if not caps.netns:
        pytest.skip(f"network namespaces unavailable here: {next(iter(caps.reasons.values()))}")
    with netlab.NetLab(1, caps) as lab:
        port, http, metrics = free_port(lab.host_ip), free_port(lab.host_ip), free_port(lab.host_ip)
        log = open(tmp_path / "master.log", "w")
        master = subprocess.Popen([python_exe, "-m", "mooncake_core.store.master_main", f"--port={port}",
                                   f"--rpc_address={lab.host_ip}", f"--metrics_port={metrics}",
                                   f"--metrics_address={lab.host_ip}",
                                   "--enable_http_metadata_server=true", f"--http_metadata_server_host={lab.host_ip}",
                                   f"--http_metadata_server_port={http}"],
                                  stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_port(lab.host_ip, port, 30, master)
            wait_for_port(lab.host_ip, http, 30, master)
            addr, meta = f"{lab.host_ip}:{port}", f"http://{lab.host_ip}:{http}/metadata"
            # 1. nothing set: the route's source address, reachable from the master's network
            r = _client(lab, python_exe, addr, meta)
            assert r["rc"] == 0, r
            assert r["segment"].rsplit(":", 1)[0] == lab.ips[0], r
            assert not [m for _, m in r["warnings"] if "MOONCAKE_LOCAL_HOSTNAME" in m], r["warnings"]
            # 2. a loopback address set: mounted (as the original does) but said at once, naming the fix
            r = _client(lab, python_exe, addr, meta, MOONCAKE_LOCAL_HOSTNAME="localhost")
            assert r["rc"] == 0 and r["segment"].startswith("localhost:"), r
            hits = [(t, m) for t, m in r["warnings"] if "MOONCAKE_LOCAL_HOSTNAME" in m]
            assert hits, f"no warning naming MOONCAKE_LOCAL_HOSTNAME: {r['warnings']}"
            t, msg = hits[0]
            assert t < 1.0, f"warned only after {t} s"
            assert lab.host_ip in msg and lab.ips[0] in msg, msg  # the peer, and the address that would work
        finally:
            stop_process(master)
            log.close()
