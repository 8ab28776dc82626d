"""Integration: a write given up on across a partition must never land later.

Found by bench/robustness/chaos.py (partitions longer than MC_TRANSFER_TIMEOUT): the writer timed out,
revoked its put, the master handed the range to the next put -- and when the partition
healed, the writer's kernel delivered the bytes it still had queued for the old connection
(a plain close() keeps retransmitting them), overwriting the new object: readers got
foreign bytes. The connection of a failed exchange is now reset (SO_LINGER 0), which drops
them. Clients run in network namespaces (needs root; skipped with the reason otherwise)."""

from __future__ import annotations

import subprocess
import time
from types import SimpleNamespace

import pytest

from mooncake_core.utils.net import free_port, wait_for_port
from mooncake_core.utils.proc import stop_process
from mooncake_lab.store_procs import Worker, payload, sha

from mooncake_lab.chaos import netlab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MiB = 1 << 20


def test_write_given_up_across_a_partition_never_lands_later(python_exe, tmp_path) -> None:
    caps = netlab.probe()
    if not caps.netns:
        pytest.skip(f"network namespaces unavailable here: {next(iter(caps.reasons.values()))}")
    with netlab.NetLab(3, caps) as lab:
        port, http = free_port(lab.host_ip), free_port(lab.host_ip)
        log = open(tmp_path / "master.log", "w")
        master = subprocess.Popen([python_exe, "-m", "mooncake_core.store.master_main", f"--port={port}",
                                   f"--rpc_address={lab.host_ip}", f"--metrics_port={free_port(lab.host_ip)}",
                                   "--enable_http_metadata_server=true", f"--http_metadata_server_host={lab.host_ip}",
                                   f"--http_metadata_server_port={http}", "--client_ttl=60"],
                                  stdout=log, stderr=subprocess.STDOUT)
        workers: list[Worker] = []
        try:
            wait_for_port(lab.host_ip, port, 30, master)
            wait_for_port(lab.host_ip, http, 30, master)
            m = SimpleNamespace(addr=f"{lab.host_ip}:{port}", meta=f"http://{lab.host_ip}:{http}/metadata")

            def peer(i: int, segment: int) -> Worker:
                w = Worker(python_exe, m, segment, prefix=lab.exec_prefix(i),
                           env={"MC_FORCE_TCP": "1", "MC_TRANSFER_TIMEOUT": "2",
                                "MC_TEST_LOCAL_HOSTNAME": lab.ips[i]})
                workers.append(w)
                return w

            writer, holder, other = peer(0, 0), peer(1, 4 * MiB), peer(2, 0)
            # a pooled connection writer -> holder, so the stuck write queues on it
            assert writer.cmd(op="put", key="warm", seed=1, size=64 << 10)["rc"] == 0
            assert writer.cmd(op="get", key="warm")["sha"] == sha(payload(1, 64 << 10))
            size = 3 * MiB  # the only place for it in the 4 MiB segment: the range the lost put had
            lab.partition(0, 1)
            t0 = time.monotonic()
            rc = writer.cmd(op="put", key="lost", seed=2, size=size, preferred=holder.hostname)["rc"]
            assert rc < 0 and time.monotonic() - t0 < 15, f"the put across the partition returned {rc}"
            # the range comes back once the holder has heartbeated twice (the master parks the
            # ranges of failed puts); then the next put gets it
            deadline = time.monotonic() + 15
            while (rc := other.cmd(op="put", key="kept", seed=3, size=size)["rc"]) != 0:
                assert rc == -200 and time.monotonic() < deadline, rc
                time.sleep(0.3)
            assert other.cmd(op="get", key="kept")["sha"] == sha(payload(3, size))
            lab.heal_partition(0, 1)
            time.sleep(8)  # several retransmission timeouts: a kept-alive old stream would have landed
            assert other.cmd(op="get", key="kept")["sha"] == sha(payload(3, size)), \
                "the given-up write landed after its range was reused: foreign bytes under 'kept'"
        finally:
            for w in workers:
                w.close()
            stop_process(master)
            log.close()
