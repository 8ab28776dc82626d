"""kv_load_failure_policy=fail on a real vLLM decode: an unreachable prefill gives the client an
error within the timeout (never a hang), and the decode keeps serving with no leaked blocks."""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path
from typing import Iterator

import pytest

from mooncake_lab.vllm_harness import HTTPStatusError, VllmServer, completion, free_port, http_text, metric, p2p_config, start_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def decode_fail(vllm_py: str, tiny_model: Path, tmp_path_factory) -> Iterator[VllmServer]:
    d = VllmServer(vllm_py, tiny_model, free_port(), 1, tmp_path_factory.mktemp("vllm-fail") / "decode.log",
                   dict(p2p_config("kv_consumer"), kv_load_failure_policy="fail"))
    start_all([d])
    try:
        yield d
    finally:
        d.stop()


def dead_segment() -> str:
    """host:port where nothing listens (bound then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_unreachable_prefill_fails_the_request_and_decode_keeps_serving(decode_fail):
    d = decode_fail
    rng = random.Random(21)
    prompt = [rng.randrange(3, 300) for _ in range(100)]
    seg = dead_segment()
    params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "gone",
              "remote_request_id": "r", "remote_block_ids": [1, 2, 3, 4], "remote_host": "127.0.0.1",
              "remote_port": int(seg.rsplit(":", 1)[1]), "remote_num_tokens": 100, "mooncake_version": 1,
              "mooncake_transfer_id": "t-dead", "mooncake_segment": seg, "mooncake_block_size": 32,
              "mooncake_block_bytes": 16384, "mooncake_num_slabs": 2, "mooncake_lease_expiry": time.time() + 60}
    t0 = time.monotonic()
    with pytest.raises(HTTPStatusError) as ei:
        completion(d.url, prompt, 8, params, timeout=120)
    assert ei.value.status >= 400
    assert time.monotonic() - t0 < 60
    assert "failed" in d.log_text() and seg in d.log_text()  # the log names the unreachable peer
    # still serving, and the failed request's blocks were released
    assert len(completion(d.url, prompt[:50], 4)["choices"][0]["token_ids"]) == 4
    deadline = time.monotonic() + 30
    while metric(http_text(d.url + "/metrics"), "vllm:kv_cache_usage_perc") != 0.0:
        assert time.monotonic() < deadline, "decode leaked KV blocks after a failed load"
        time.sleep(0.25)
