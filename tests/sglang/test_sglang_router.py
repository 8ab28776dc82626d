"""PD routers in front of in-test SGLang workers whose KV hand-off runs SGLang's Mooncake backend
on our engine: sglang-router's PD mode (``--pd-disaggregation``) and our proxy's SGLang hand-off
(``mooncake_proxy --handoff sglang``), both speaking SGLang's bootstrap protocol (bootstrap
host/port/room injected into ``/generate``). Every routed request's pages arrive byte-exact."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from .conftest import HERE, Peer, listen_port, sglang_env

pytestmark = pytest.mark.integration
WORKER = os.path.join(HERE, "peer_worker.py")
N_REQUESTS = 6


def _wait_http(url: str, timeout: float, peer) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert peer.proc.poll() is None, peer.tail()
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not healthy within {timeout}s\n{peer.tail()}")


@pytest.fixture(scope="module")
def workers(sglang_python, tmp_path_factory):
    """One prefill and one decode worker, shared by both routers (they start in ~10 s each)."""
    env = sglang_env()
    p_http, p_boot, d_http = listen_port(), listen_port(), listen_port()
    logs = tmp_path_factory.mktemp("workers")
    prefill = Peer([sglang_python, WORKER, "--role", "prefill", "--http-port", str(p_http),
                    "--bootstrap-port", str(p_boot)], env, str(logs / "prefill-worker.log"))
    decode = Peer([sglang_python, WORKER, "--role", "decode", "--http-port", str(d_http), "--seed", "9"],
                  env, str(logs / "decode-worker.log"))
    try:
        prefill.wait_event("ready", 150)
        decode.wait_event("ready", 150)
        yield p_http, p_boot, d_http
    finally:
        prefill.close()
        decode.close()


@pytest.mark.parametrize("router_kind", ["sglang-router", "mooncake_proxy"])
def test_router_pd_mode_routes_to_our_bootstrap(router_kind, workers, sglang_python, python_exe, peers):
    env = sglang_env()
    p_http, p_boot, d_http = workers
    r_port, r_prom = listen_port(), listen_port()
    if router_kind == "sglang-router":
        cmd = [sglang_python, "-m", "sglang_router.launch_router", "--pd-disaggregation",
               "--prefill", f"http://127.0.0.1:{p_http}", str(p_boot), "--decode", f"http://127.0.0.1:{d_http}",
               "--host", "127.0.0.1", "--port", str(r_port), "--prometheus-port", str(r_prom)]
    else:
        cmd = [python_exe, "-m", "mooncake_proxy.cli", "--handoff", "sglang",
               "--prefill", f"http://127.0.0.1:{p_http}", str(p_boot), "--decode", f"http://127.0.0.1:{d_http}",
               "--host", "127.0.0.1", "--port", str(r_port)]
    router = peers(cmd, env, router_kind)
    base = f"http://127.0.0.1:{r_port}"
    _wait_http(f"{base}/health", 90, router)

    def one(i: int) -> dict:
        r = httpx.post(f"{base}/generate", timeout=60,
                       json={"text": f"request {i}", "sampling_params": {"max_new_tokens": 1}})
        assert r.status_code == 200, r.text
        return r.json()

    with ThreadPoolExecutor(3) as pool:
        outs = list(pool.map(one, range(N_REQUESTS)))
    rooms = set()
    for out in outs:
        meta = out["meta_info"]
        room = meta["bootstrap_room"]  # chosen by the router, carried to both workers
        rooms.add(room)
        sent = httpx.get(f"http://127.0.0.1:{p_http}/kv_digest", params={"room": room}, timeout=10).json()
        assert sent["kv_sha256"] is not None, f"prefill never saw room {room}"
        assert meta["kv_sha256"] == sent["kv_sha256"], f"room {room}: decode received different bytes"
        assert out["text"] == f"kv:{sent['kv_sha256']}"
    assert len(rooms) == N_REQUESTS
    assert len({o["meta_info"]["kv_sha256"] for o in outs}) == N_REQUESTS  # distinct random pages
