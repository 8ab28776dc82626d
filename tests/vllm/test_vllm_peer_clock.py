"""The decode's measurement of a prefill host's clock (``peer_clock.PeerClocks``) never holds up
the engine's step when that host is slow: a stale offset is measured again in the background
while the read starts at once on the offset known (peer_clock_side.py runs in the vLLM venv).

Why: a refresh sent from the step's thread waited for the prefill's answer; on a busy box (five
vLLM worker processes on 2 cores) a prefill answered after seconds, and every request of the
decode instance waited with it -- in CI once past the prefill's lease, so the hand-off failed."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from mooncake_lab.checkout_shim import shim_pythonpath

pytestmark = pytest.mark.integration

SIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_clock_side.py")
TIMEOUT_S = 4.0  # MC_TRANSFER_TIMEOUT of the side: what an inline query to the silent host would cost


def test_a_stale_clock_offset_is_refreshed_without_holding_up_the_read(vllm_py) -> None:
    env = dict(os.environ, PYTHONPATH=shim_pythonpath(), PYTHONWARNINGS="ignore", MC_TRANSFER_TIMEOUT=str(TIMEOUT_S))
    r = subprocess.run([vllm_py, SIDE], capture_output=True, text=True, timeout=240, env=env, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    f = json.loads(r.stdout.strip().splitlines()[-1])
    assert f["started"] == ["req-1"] and f["failed"] == [], f
    assert f["held_s"] < 1.0, f"submit held the step {f['held_s']:.1f} s waiting for a silent prefill's clock"
