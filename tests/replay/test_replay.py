"""Trace replay: prompts follow hash_ids, requests leave at scaled timestamps, metrics reported."""

from __future__ import annotations

import asyncio
import json
import pathlib
import sys

import pytest

from mooncake_proxy.fake_engine import Behaviour, FakeEngine, start_fake
from mooncake_proxy.trace_prompts import PromptBuilder, TraceRequest, parse_trace_lines

HERE = pathlib.Path(__file__).parent
TRACE = HERE / "conversation_head60.jsonl"


def common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def common_ids(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def check_prefix_structure(reqs: list[TraceRequest], prompts: list[str], builder: PromptBuilder) -> int:
    """Shared leading ids ⇒ identical text for those blocks, and the text diverges right after."""
    checked = 0
    for i in range(len(reqs)):
        for j in range(i + 1, len(reqs)):
            a, b = reqs[i], reqs[j]
            k = common_ids(a.hash_ids, b.hash_ids)
            full_a = min(k, builder.scaled_input_tokens(a) // builder.block_tokens)
            full_b = min(k, builder.scaled_input_tokens(b) // builder.block_tokens)
            shared_text = "".join(builder.block_text(h) for h in a.hash_ids[:min(full_a, full_b)])
            assert prompts[i].startswith(shared_text) and prompts[j].startswith(shared_text)
            cp = common_prefix_len(prompts[i], prompts[j])
            if k < len(a.hash_ids) and k < len(b.hash_ids) and full_a == full_b == k:
                # next blocks have different ids -> texts differ within the next block's marker
                assert cp < len(shared_text) + 12, (i, j, k)
            checked += 1
    return checked


def test_prompt_builder_unit() -> None:
    b = PromptBuilder(block_tokens=16, seed=1)
    r1 = TraceRequest(0, 1300, 5, (7, 8, 9))   # 1300 trace tokens -> 41 scaled: 2 blocks + 9 words
    r2 = TraceRequest(0, 1536, 5, (7, 8, 10))  # 3 full blocks
    r3 = TraceRequest(0, 1536, 5, (11, 8, 9))
    p1, p2, p3 = (b.prompt(r) for r in (r1, r2, r3))
    two = b.block_text(7) + b.block_text(8)
    assert p1.startswith(two) and p2.startswith(two)
    assert len(p1.split()) == 41 and len(p2.split()) == 48
    assert p1[len(two):] == " ".join(b.block_text(9).split()[:9]) + " "
    assert not p3.startswith(b.block_text(7))
    assert b.block_text(8) != b.block_text(9)
    assert PromptBuilder(16, seed=1).block_text(8) == b.block_text(8)  # deterministic
    with pytest.raises(ValueError, match="line 2|:2:"):
        list(parse_trace_lines(['{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[1]}',
                                '{"timestamp": 1}'], "t.jsonl"))


def test_prefix_structure_on_trace_slice() -> None:
    reqs = list(parse_trace_lines(TRACE.read_text().splitlines()))
    b = PromptBuilder(block_tokens=8)
    prompts = [b.prompt(r) for r in reqs]
    assert check_prefix_structure(reqs, prompts, b) == len(reqs) * (len(reqs) - 1) // 2
    # word count follows the scaled input length (≈ 1 word per token)
    for r, p in zip(reqs, prompts):
        assert abs(len(p.split()) - b.scaled_input_tokens(r)) <= 1


@pytest.mark.integration
async def test_replay_against_fake_engine(python_exe) -> None:
    eng = FakeEngine("engine", Behaviour(chunks=5))
    runner, port = await start_fake(eng)
    limit, speed = 30, 10.0
    try:
        proc = await asyncio.create_subprocess_exec(
            python_exe, "-m", "mooncake_proxy.replay", "--trace", str(TRACE), "--url",
            f"http://127.0.0.1:{port}", "--speed", str(speed), "--limit", str(limit), "--block-tokens", "8",
            "--max-tokens-cap", "6", "--model", "tiny", "--json", "--no-progress",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await runner.cleanup()
    assert proc.returncode == 0, err.decode()
    s = json.loads(out)
    assert s["requests"] == limit and s["completed"] == limit and s["failed"] == 0
    assert s["output_tokens"] == 5 * limit
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert 0 < s[key]["p50"] <= s[key]["p99"] < 5
    reqs = list(parse_trace_lines(TRACE.read_text().splitlines()))[:limit]
    recs = sorted(eng.records, key=lambda r: r.t)
    assert len(recs) == limit
    by_prompt = {r.body["prompt"]: r for r in recs}
    b = PromptBuilder(block_tokens=8)
    prompts = [b.prompt(r) for r in reqs]
    assert set(by_prompt) == set(prompts)  # exactly the prompts the trace describes
    check_prefix_structure(reqs, [by_prompt[p].body["prompt"] for p in prompts], b)
    for r, p in zip(reqs, prompts):
        body = by_prompt[p].body
        assert body["max_tokens"] == min(6, r.output_length) and body["model"] == "tiny" and body["stream"]
    # arrival times follow the trace's timestamps scaled by --speed
    t0 = by_prompt[prompts[0]].t
    for r, p in zip(reqs, prompts):
        want = (r.timestamp_ms - reqs[0].timestamp_ms) / 1000 / speed
        assert abs((by_prompt[p].t - t0) - want) < 0.5, (want, by_prompt[p].t - t0)


def test_replay_help_and_bad_trace(tmp_path) -> None:
    import subprocess

    out = subprocess.run([sys.executable, "-m", "mooncake_proxy.replay", "--help"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0
    for f in ("--trace", "--url", "--speed", "--limit", "--model", "--concurrency-cap", "--json",
              "--block-tokens", "--max-tokens-cap"):
        assert f in out.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": "x"}\n')
    out = subprocess.run([sys.executable, "-m", "mooncake_proxy.replay", "--trace", str(bad), "--url",
                          "http://127.0.0.1:1"], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "bad.jsonl:1" in out.stderr
    # a good trace and nothing at --url: said at once, not 60 connector errors
    trace = pathlib.Path(__file__).with_name("conversation_head60.jsonl")
    out = subprocess.run([sys.executable, "-m", "mooncake_proxy.replay", "--trace", str(trace), "--url",
                          "http://127.0.0.1:1"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--url: nothing answers at http://127.0.0.1:1" in out.stderr, out.stderr
    assert "start mooncake_proxy" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.integration
async def test_replay_concurrency_cap_and_errors_in_process() -> None:
    from mooncake_proxy.replay import ReplayConfig, replay

    eng = FakeEngine("engine", Behaviour(chunks=3, chunk_delay=0.05))
    runner, port = await start_fake(eng)
    try:
        reqs = [TraceRequest(0, 600, 4, (i, i + 100)) for i in range(8)]  # all due at once
        s = await replay(reqs, ReplayConfig(url=f"http://127.0.0.1:{port}", block_tokens=8,
                                            concurrency_cap=2, endpoint="chat"), progress=False)
        assert s["completed"] == 8 and s["failed"] == 0
        spans = sorted((r.t, r.t_end) for r in eng.records)
        peak = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
        assert peak <= 2
        assert s["send_lag_s"]["max"] > 0.1  # later requests waited for a slot, and it shows
        assert all(r.path == "/v1/chat/completions" and r.body["messages"][0]["role"] == "user"
                   for r in eng.records)
        eng.behaviour.fail_status = 503
        s = await replay(reqs[:3], ReplayConfig(url=f"http://127.0.0.1:{port}", block_tokens=8),
                         progress=False)
        assert s["completed"] == 0 and s["errors"] == {"HTTP 503": 3}
    finally:
        await runner.cleanup()


def test_slo_attainment_counts_admitted_and_all() -> None:
    from mooncake_proxy.replay import Result, slo_attainment, slo_met

    def res(i: int, status: int = 200, ttft: float | None = 0.5, gaps: tuple[float, ...] = (0.1,) * 5) -> Result:
        r = Result(i, status == 200 and ttft is not None, status, ttft=ttft)
        if ttft is not None:
            r.chunk_times = [ttft]
            for g in gaps:
                r.chunk_times.append(r.chunk_times[-1] + g)
        return r

    fast, slow_first = res(0), res(1, ttft=3.0)
    one_slow_gap = res(2, gaps=(0.1,) * 9 + (0.9,))  # p90 of 10 gaps: 0.18 s
    slow_gaps = res(3, gaps=(0.1, 0.5, 0.5, 0.5, 0.5))
    assert one_slow_gap.tbt_p90 == pytest.approx(0.18)
    assert slo_met(fast, 1.0, 0.2) and slo_met(one_slow_gap, 1.0, 0.2)
    assert not slo_met(slow_first, 1.0, 0.2) and not slo_met(slow_gaps, 1.0, 0.2)
    assert slo_met(res(4, gaps=()), 1.0, 1e-9)  # a one-token answer has no TBT
    assert slo_met(slow_first, None, None) and not slo_met(res(5, 502, None), None, None)
    results = [fast, slow_first, one_slow_gap, slow_gaps, res(6, 429, None), res(7, 429, None),
               res(8, 502, None)]
    a = slo_attainment(results, 1.0, 0.2)
    assert (a["admitted"], a["met"]) == (5, 2)  # the 502 was admitted and missed
    assert a["missed"] == {"ttft": 1, "tbt": 1, "both": 0, "failed": 1}
    assert a["attainment_admitted"] == pytest.approx(2 / 5) and a["attainment_all"] == pytest.approx(2 / 7)
    assert slo_attainment([], 1.0, None)["attainment_admitted"] is None


@pytest.mark.integration
async def test_replay_reports_429s_and_attainment_through_the_proxy(python_exe, tmp_path) -> None:
    # a proxy whose TTFT SLO no request meets: every request is a 429, none admitted
    from mooncake_proxy.server import ProxyConfig, start_server

    p, d = FakeEngine("p", Behaviour()), FakeEngine("d", Behaviour(chunks=4, chunk_delay=0.02))
    (rp, pport), (rd, dport) = await start_fake(p), await start_fake(d)
    cfg = ProxyConfig(prefill_urls=[f"http://127.0.0.1:{pport}"], decode_urls=[f"http://127.0.0.1:{dport}"],
                      policy="conductor", health_interval=0)
    server, runner, port = await start_server(cfg, "127.0.0.1", 0)
    try:
        async def run(ttft_slo: float) -> dict:
            server.scheduler.slo = type(server.scheduler.slo)(ttft_s=ttft_slo)
            proc = await asyncio.create_subprocess_exec(
                python_exe, "-m", "mooncake_proxy.replay", "--trace", str(TRACE), "--url", f"http://127.0.0.1:{port}",
                "--speed", "50", "--limit", "6", "--block-tokens", "8", "--max-tokens-cap", "4", "--json",
                "--no-progress", "--ttft-slo", "5", "--tbt-slo", "1",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode in (0, 1), err.decode()
            return json.loads(out)

        s = await run(1e-6)
        assert s["rejected_429"] == 6 and s["completed"] == 0
        assert s["slo"]["admitted"] == 0 and s["slo"]["attainment_all"] == 0.0
        s = await run(100.0)
        assert s["rejected_429"] == 0 and s["completed"] == 6
        assert s["slo"]["met"] == 6 and s["slo"]["attainment_admitted"] == 1.0
    finally:
        for r in (runner, rp, rd):
            await r.cleanup()


def test_runs_pool_into_one_attainment_with_a_wilson_interval() -> None:
    from mooncake_proxy.replay import pooled_attainment, wilson_interval

    # textbook values: 8 of 10 -> (0.490, 0.943); 0 of 10 -> (0, 0.278); 10 of 10 -> (0.722, 1)
    assert wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="k=11, n=10"):
        wilson_interval(11, 10)
    runs = [{"requests": 40, "rejected_429": 27, "admitted": 13, "met": 13, "attainment_admitted": 1.0},
            {"requests": 40, "rejected_429": 25, "admitted": 15, "met": 9, "attainment_admitted": 0.6},
            {"requests": 40, "rejected_429": 40, "admitted": 0, "met": 0, "attainment_admitted": None}]
    p = pooled_attainment(runs)
    assert (p["runs"], p["sent"], p["rejected_429"], p["admitted"], p["met"], p["runs_at_90"]) == (3, 120, 92, 28, 22, 1)
    assert p["attainment_admitted"] == pytest.approx(22 / 28)
    assert p["ci95"] == pytest.approx(wilson_interval(22, 28))
