"""LMCache 0.5.6 on our Mooncake Store, end to end: real LMCache engines in two processes, a
real ``mooncake_master``.

A writer process stores KV chunks through LMCache; a reader process (another process, same
master) looks them up and retrieves them, byte for byte -- with LMCache's built-in
``mooncakestore://`` adapter (unchanged; its ``import mooncake.store`` is our store through
``mooncake_core.compat``) in both of its modes, and with our native connector in both modes.
Also: an unrelated prompt misses, the adapters read each other's objects (switching keeps the
cache), LMCache's Mooncake lookup client sees exactly the stored chunks, and nothing is written
twice (master counters).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_lab.lmcache_harness import LmcPeer, peer_env
from mooncake_lab.store_procs import Master

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: engine name -> (backend, save_chunk_meta); each stores its own token range
MODES = {"builtin_meta": ("builtin", True), "builtin_zc": ("builtin", False),
         "native_meta": ("native", True), "native_zc": ("native", False)}
N = 1000  # 3 full 256-token chunks + a partial one of 232 tokens (save_unfull_chunk)


def first_token(mode: str) -> int:
    return 100_000 * (1 + list(MODES).index(mode))


def seed(mode: str) -> int:
    return 11 + list(MODES).index(mode)


def master_counter(m: Master, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}/metrics", timeout=10).read().decode()
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.split("{")[0].split(" ")[0] == name)


@pytest.fixture(scope="module")
def cluster(lmc_py, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """A master, a writer process (every engine contributes 16 MiB) that stored one range per
    mode, and a reader process with the same engines (no memory of its own)."""
    import sys

    logs = tmp_path_factory.mktemp("lmcache-store")
    m = Master(sys.executable, str(logs)).start()
    peers: list[LmcPeer] = []
    try:
        for role in ("writer", "reader"):  # start both, then wait: LMCache's import is slow
            peers.append(LmcPeer(lmc_py, logs / f"{role}.log", "--master", m.addr, "--meta", m.meta,
                                 env=peer_env(), ready_timeout=None))
        w, r = peers
        w.wait_ready(), r.wait_ready()
        for name, (backend, meta) in MODES.items():  # both processes open their engines at once
            w.send("open", name=name, backend=backend, chunk_meta=meta, segment=16 << 20)
            r.send("open", name=name, backend=backend, chunk_meta=meta)
        for name in MODES:
            assert w.recv()["remote"] == [True] and r.recv()["remote"] == [True], name
        for name in MODES:
            assert w.cmd("store", name=name, first=first_token(name), n=N, kv_seed=seed(name))["drained"]
        yield {"master": m, "writer": w, "reader": r}
    finally:
        for p in peers:
            p.close()
        m.stop()


@pytest.mark.parametrize("mode", list(MODES))
def test_reader_retrieves_what_the_writer_stored(cluster, mode) -> None:
    r = cluster["reader"]
    assert r.cmd("lookup", name=mode, first=first_token(mode), n=N)["hit"] == N
    got = r.cmd("retrieve", name=mode, first=first_token(mode), n=N, kv_seed=seed(mode))
    assert got["got"] == N and got["exact"], f"{mode}: {got}\n{r.log_tail()}"
    # a prefix of the stored prompt hits its full chunks; an unrelated prompt misses
    assert r.cmd("lookup", name=mode, first=first_token(mode), n=600)["hit"] == 512
    assert r.cmd("lookup", name=mode, first=7_000_000, n=N)["hit"] == 0
    assert r.cmd("retrieve", name=mode, first=7_000_000, n=N, kv_seed=1)["got"] == 0


@pytest.mark.parametrize("reader, writer", [("native_meta", "builtin_meta"), ("builtin_meta", "native_meta"),
                                            ("native_zc", "builtin_zc"), ("builtin_zc", "native_zc")])
def test_switching_adapters_keeps_the_cache(cluster, reader, writer) -> None:
    got = cluster["reader"].cmd("retrieve", name=reader, first=first_token(writer), n=N, kv_seed=seed(writer))
    assert got["got"] == N and got["exact"], got


def test_mixed_modes_never_read_foreign_bytes(cluster) -> None:
    """An object written with a metadata header read by an engine expecting raw KV (and the
    reverse) must be a miss or exact -- never garbage KV."""
    r = cluster["reader"]
    for reader, writer in (("native_zc", "native_meta"), ("native_meta", "native_zc")):
        got = r.cmd("retrieve", name=reader, first=first_token(writer), n=N, kv_seed=seed(writer))
        assert got["got"] < N or got["exact"], (reader, writer, got)
        assert got["got"] == 0 or got["exact"], (reader, writer, got)


def test_lookup_client_sees_exactly_the_stored_chunks(cluster) -> None:
    """LMCache's scheduler-side MooncakeLookupClient (segment-less store, ``batch_is_exist``)."""
    m = cluster["master"]
    ranges = [[first_token(x), N] for x in MODES] + [[first_token("native_zc"), 600], [7_000_000, N]]
    got = cluster["reader"].cmd("lookup_client", master=m.addr, ranges=ranges)["hits"]
    assert got == [N] * len(MODES) + [512, 0]


def test_nothing_is_written_twice(cluster) -> None:
    """Storing a stored prompt again moves no bytes, and the double backend LMCache builds for
    remote_url + our plugin writes each chunk once (and is reported in the log)."""
    m, w = cluster["master"], cluster["writer"]
    puts0 = master_counter(m, "mooncake_master_puts_total")
    assert puts0 == 4 * len(MODES)
    for name in ("native_zc", "builtin_meta"):
        assert w.cmd("store", name=name, first=first_token(name), n=N, kv_seed=seed(name))["drained"]
    assert master_counter(m, "mooncake_master_puts_total") == puts0
    info = w.cmd("open", name="both", backend="both", chunk_meta=False, segment=16 << 20)
    assert info["remote"] == [True, True], info
    assert "remote_url='mooncakestore://127.0.0.1:1/' is set as well" in w.log_text()
    assert w.cmd("store", name="both", first=900_000, n=N, kv_seed=3)["drained"]
    assert master_counter(m, "mooncake_master_puts_total") == puts0 + 4
    got = cluster["reader"].cmd("retrieve", name="native_zc", first=900_000, n=N, kv_seed=3)
    assert got["got"] == N and got["exact"]


def test_native_ping_and_numa_binding(cluster) -> None:
    """``ping`` is the store's health check; LMCache's NUMA path calls our bind_to_numa_node."""
    w = cluster["writer"]
    assert w.cmd("ping", name="native_zc")["ping"] == [0]
    info = w.cmd("open", name="numa", backend="builtin", chunk_meta=False, segment=0,
                 overrides={"numa_mode": "manual"}, extra={"gpu_to_numa_mapping": {"0": 0}})
    assert info["remote"] == [True]
    log = w.log_text()
    assert "NUMA node 0 binding done" in log and "unable to import bind_to_numa_node" not in log


def test_vllm_plugin_gives_lmcache_our_store(lmc_py) -> None:
    """In a vLLM process our general plugin installs the alias, so the LMCache adapter's
    ``from mooncake.store import MooncakeDistributedStore, bind_to_numa_node`` is ours."""
    import subprocess

    code = ("from vllm.plugins import load_general_plugins; load_general_plugins()\n"
            "from mooncake.store import MooncakeDistributedStore, ReplicateConfig, bind_to_numa_node\n"
            "from mooncake.engine import TransferEngine\n"
            "import lmcache.v1.distributed.transfer_channel.factory as f\n"
            "import lmcache.v1.distributed.transfer_channel\n"
            "print(MooncakeDistributedStore.__module__, TransferEngine.__module__,\n"
            "      'mooncake_te' in f._TRANSFER_CHANNEL_FACTORY_REGISTRY)\n")
    out = subprocess.run([lmc_py, "-c", code], capture_output=True, text=True, timeout=180, env=peer_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-3:] == ["mooncake_core.store.client", "mooncake_core.engine", "True"], out.stdout


def test_builtin_adapter_as_a_dummy_of_mooncake_client_outlives_a_sigkill(lmc_py, tmp_path) -> None:
    """LMCache's ``mooncakestore://`` adapter, unchanged, attached as a dummy client of the
    node's ``mooncake_client`` (extra_config ``mooncake_client_server_address``, forwarded by
    the adapter to ``setup(dict)``): its chunks live in the service's pool, so an LMCache
    process that is SIGKILLed loses none of them and the next one reads them byte for byte."""
    import sys

    from mooncake_core.utils.net import free_port
    from mooncake_core.utils.proc import stop_process
    from mooncake_lab.store_procs import start_mooncake_client

    m = Master(sys.executable, str(tmp_path)).start()
    port, http_port = free_port(), free_port()
    service = start_mooncake_client(sys.executable, m.addr, m.meta, port, str(tmp_path / "client.log"),
                                    http_port=http_port)
    dummy = {"mooncake_client_server_address": f"127.0.0.1:{port}"}
    peers: list[LmcPeer] = []
    try:
        for role in ("writer", "reader"):  # start both (LMCache's import is the slow part)
            peers.append(LmcPeer(lmc_py, tmp_path / f"{role}.log", "--master", m.addr, "--meta", m.meta,
                                 env=peer_env(), ready_timeout=None))
        w, r = peers
        w.wait_ready(), r.wait_ready()
        assert w.cmd("open", name="svc", backend="builtin", extra=dummy)["remote"] == [True]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()
        assert "mooncake_client_dummies 1" in metrics, "the LMCache process did not attach as a dummy"
        assert w.cmd("store", name="svc", first=500_000, n=N, kv_seed=5)["drained"]
        w.proc.kill()  # SIGKILL: no close, no goodbye
        w.proc.wait(10)
        assert r.cmd("open", name="svc", backend="builtin", extra=dummy)["remote"] == [True]
        assert r.cmd("lookup", name="svc", first=500_000, n=N)["hit"] == N
        got = r.cmd("retrieve", name="svc", first=500_000, n=N, kv_seed=5)
        assert got["got"] == N and got["exact"], f"{got}\n{r.log_tail()}"
    finally:
        for p in peers:
            p.close()
        stop_process(service)
        m.stop()
