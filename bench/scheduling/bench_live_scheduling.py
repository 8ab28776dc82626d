#!/usr/bin/env python3
"""The paper's scheduling comparison on live engines: 2 (``--prefills``) prefill + 1 decode vLLM (CPU) instances,
our proxy, one conversation-trace window replayed once per policy.

    python3 -m bench.scheduling.bench_live_scheduling                        # conductor cache_aware load_balance random
    python3 -m bench.scheduling.bench_live_scheduling --requests 24 --policies conductor load_balance   # quicker

Setup (all real processes): a ``mooncake_master`` (store + HTTP metadata); three vLLM servers
running ``MultiConnector`` [``MooncakeCoreConnector`` (P2P hand-off), ``MooncakeCoreStoreConnector``
(saves every prompt's blocks, loads prefixes the store holds)], prefills ``kv_producer`` on core 0
and 1, the decode ``kv_consumer`` on core 1 (``--decode-own-core``: the decode alone on the last core,
every prefill on the others); a random-weight Llama big enough that prefill dominates a
request on this CPU (default hidden 768, 12 heads x 64, 6 layers, fp32: ~0.5 s per 500-token
prefill on an idle core); our proxy in the vLLM venv with the engines' tokenizer, their KV events
(``--kv-events-config``), the store's key events (``--store-master``) and a cost profile fitted
from the prefill's measured times (``fit_profile``: 8 salted prefills of 64..768 tokens) and the
decode's measured steps (batches of 1..8 streams; ``--default-decode-profile`` keeps the default's).

Workload: ``mooncake_replay`` of a window of the conversation trace. A plain time window of the
trace reuses few blocks (its conversations return minutes later), so the window is the requests
(first ``--span`` of the trace, at most ``--max-blocks`` 512-token blocks) of the ``--groups``
most frequent conversations (keyed by ``hash_ids[1]``, the block after the shared system prompt),
the first ``--requests`` of them, time-scaled so the window lasts ``--duration`` s; prompts follow
``hash_ids`` (``--block-tokens`` words per trace block), outputs are capped at ``--max-tokens``.

``--store-lookup hint`` is the paper's comparison: the prefills load a prefix from the store only
when the proxy's hint says so, and only the conductor (which sees the store) hints, so the baselines
reuse their own instance's cache alone; with ``always`` (default) every policy gets the store's
prefixes from the connector, and the policies differ only in *where* the reused KV comes from.

Per policy (the engines' prefix caches and the store are emptied, the proxy restarted): TTFT
mean/p90, TPOT p90 (TBT), requests completed, and the prefill instances' own prefix-cache
counters: tokens hit locally, loaded by a connector (store), recomputed. Ratios are against
load_balance in the same run. Heavy: ~3 x 2.5 GB RAM, minutes per policy on 2 cores.

Overload (``--overload 2``): then the same window at 2x the first half's arrival rate (its replay
speed x 2: the same requests in half the time) through ``--overload-policy``, once per
``--rejection-modes`` on the same engines: ``none`` (no SLO flags), ``decode`` (the paper's
baseline: ``--rejection decode``, TTFT checked on arrival, TBT after the prefill), ``early``
(current-load early rejection), ``predictive`` (``--rejection early+decode --prediction-horizon``:
the paper's prediction-based early rejection with the decode-stage backstop), ``predictive_pairs``
(the same with ``--no-ttft-margin-queued``: each pair's own TTFT margin only), ``predictive_recent``
(with ``--recent-busy-tau 2``), ``predictive_no_qm`` (with ``--ttft-queue-margin 0``), ``predictive_qm2``
(with ``--ttft-queue-margin 2``). Every SLO mode
runs the proxy with ``--calibrate`` (the idle-fitted profile is corrected online by the observed
latencies). A request meets the SLO when its TTFT <= the TTFT SLO and its own TBT p90 (over its
chunk gaps) <= the TBT SLO; attainment is reported among the admitted requests (not 429) and among
all. The SLOs default to what the first half's run of the same policy gave 90 % of its requests
(``--slo-percentile``): its TTFT p90 and the p90 of its requests' TBT p90 -- the latency the
engines delivered at the admitted load; ``--slo-from-unloaded K_TTFT K_TBT`` takes K x the
latency of requests sent one at a time instead; ``--ttft-slo``/``--tbt-slo`` override. The
table says why the admitted requests that missed did: TTFT, TBT (their own p90), both, no answer.
A mode given more than once (``--rejection-modes predictive predictive predictive``) also gets a
pooled row: its runs' admitted and met requests together, with a Wilson 95 % interval -- one run
admits 11-16 requests here, so one miss moves it by 6-9 points.

``--warmup N``: each overload mode's fresh proxy first serves N requests one at a time (the
window's first N, each with prompts of its own seed), not counted -- a calibrated proxy otherwise admits its
first requests before it has seen any pair's hand-off (the cold-start misses of the runs).
With ``--warmup-at-rate`` those N requests are replayed at the first half's (1x) rate instead, so
the proxy's factors start from the contention of the admitted load rather than from an idle box.

``--freeze-prefill I AT DUR``: in every overload mode, ``AT`` s into the replay, prefill ``I``'s
whole vLLM process group is stopped (SIGSTOP) for ``DUR`` s and continued -- the multi-second
engine freeze seen on this box (issue 19), made to happen at the same moment in each mode, so the
modes (and the proxy's per-instance calibration, which should route around the frozen instance
instead of rejecting everything) are compared on the same event.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from mooncake_lab import no_spin
from mooncake_lab.checkout_shim import shim_pythonpath
from mooncake_lab.master_proc import MasterProc
from mooncake_lab.vllm_harness import (VllmServer, free_port, http_json, http_text, metric, p2p_config,
                          reset_prefix_cache, vllm_python)

from mooncake_core.store.master_client import MasterClient
from mooncake_core.utils.net import listen_port
from mooncake_proxy.replay import (ReplayConfig, Result, pooled_attainment, replay,
                                   slo_attainment)
from mooncake_proxy.scheduling import CostModel
from mooncake_proxy.trace_prompts import TraceRequest, parse_trace_lines

POLICIES = ["conductor", "cache_aware", "load_balance", "random"]
#: variants (--policies only): name -> (the proxy's --policy, the flags it adds)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    # the conductor may read a prefix from a busy peer prefill (docs/kvcache-scheduling.md)
    "conductor_peer": ("conductor", ["--peer-prefix"]),
}
#: the paper's prediction-based early rejection with the decode-stage backstop; the variants below add a flag
_PREDICTIVE = ["--rejection", "early+decode", "--prediction-horizon", "{horizon}"]
#: overload-phase rejection modes -> the proxy flags they add (SLO flags and --calibrate come on top)
REJECTION_MODES: dict[str, list[str]] = {
    "none": [], "decode": ["--rejection", "decode"], "early": ["--rejection", "early"],
    "predictive": _PREDICTIVE,
    # the same without the queued class of TTFT errors (each pair's own margin only; before 2026-12-05)
    "predictive_pairs": [*_PREDICTIVE, "--no-ttft-margin-queued"],
    # the same with each prefill idle now counted for its busy share over about the last 2 s
    "predictive_recent": [*_PREDICTIVE, "--recent-busy-tau", "2"],
    # the same without the floor on a queued request's margin (--ttft-queue-margin 0; the default before
    # 2026-12-05's runs q7-q12, where the mode with the floor was called predictive_qm)
    "predictive_no_qm": [*_PREDICTIVE, "--ttft-queue-margin", "0"],
    # the same with twice the floor: a queued request's margin >= 2x its predicted wait (runs u1-u3)
    "predictive_qm2": [*_PREDICTIVE, "--ttft-queue-margin", "2"]}
BLOCK = 32  # the engines' --block-size (the harness's)


def default_trace() -> Path:
    for d in (REPO.parent / "shared" / "traces", Path("/work/shared/traces")):
        if (d / "conversation_trace.jsonl").exists():
            return d / "conversation_trace.jsonl"
    return Path("conversation_trace.jsonl")


def select_window(reqs: list[TraceRequest], span: int, max_blocks: int, groups: int, n: int) -> list[TraceRequest]:
    """The first ``n`` requests of the ``groups`` most frequent conversations in ``reqs[:span]``."""
    pool = [r for r in reqs[:span] if 1 < len(r.hash_ids) <= max_blocks]
    count = collections.Counter(r.hash_ids[1] for r in pool)
    top = {h for h, _ in count.most_common(groups)}
    return [r for r in pool if r.hash_ids[1] in top][:n]


def scale_time(reqs: list[TraceRequest], duration: float) -> float:
    """Replay speed that makes the window last ``duration`` seconds."""
    span_s = (reqs[-1].timestamp_ms - reqs[0].timestamp_ms) / 1000.0
    return max(span_s / duration, 1e-3) if span_s > 0 else 1.0


def ideal_hit_ratio(reqs: list[TraceRequest]) -> float:
    seen: set[int] = set()
    hit = tot = 0
    for r in reqs:
        for h in r.hash_ids:
            tot += 1
            hit += h in seen
            seen.add(h)
    return hit / tot if tot else 0.0


def make_model(py: str, out: Path, hidden: int, heads: int, layers: int) -> Path:
    if not (out / "config.json").exists():
        subprocess.run([py, str(REPO / "scripts" / "make_tiny_model.py"), str(out), "--hidden", str(hidden),
                        "--heads", str(heads), "--layers", str(layers)], check=True, capture_output=True, timeout=600)
    return out


def multi_config(role: str, store_extra: dict[str, Any], store: bool = True) -> dict[str, Any]:
    # the decode's store child only loads (kv_consumer): the prefill saved the blocks it hands off, and
    # the decode's copies cost its shared core a store put per request (824 blocks in run k6)
    store_child = {"kv_connector": "MooncakeCoreStoreConnector",
                   "kv_role": "kv_consumer" if role == "kv_consumer" else "kv_both", "kv_connector_extra_config": store_extra}
    cfg: dict[str, Any] = ({"kv_connector": "MultiConnector", "kv_role": role,
                            "kv_connector_extra_config": {"connectors": [p2p_config(role), store_child]}}
                           if store else p2p_config(role))
    if role == "kv_consumer":
        cfg["kv_load_failure_policy"] = "recompute"
    return cfg


def wait_all(servers: list[VllmServer], timeout: float) -> None:
    for s in servers:
        s.wait_healthy(timeout)


def fit_prefill_profile(urls: list[str], out: Path, kv_bytes_per_token: int,
                        decode_url: str | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """Time salted prefills (no cache reuse) of a few sizes; fit the cost model. With one URL, on
    that prefill alone (idle); with several (``--fit-concurrent``), each size on all of them at once,
    every timing a sample -- the speed the instances have when they share the cores, as under load.
    With ``decode_url``, the decode's steps too (:func:`decode_step_samples`: batches of 1..8
    streams), so that the TBT checks see how the step grows with the batch on this CPU -- the
    default profile's decode (an A800's: nearly flat in the batch) cannot, and one calibration
    factor on it then under-predicts every batch larger than the one it was learned at.
    Block size and KV bytes per token are the engines'; the transfer bandwidth is set to ~1 GB/s
    (loopback TCP, not measured here)."""
    samples: list[dict[str, Any]] = []

    def one(url: str, n: int) -> None:
        prompt = [3 + (i * 7919) % 290 for i in range(n)]  # ids inside the tiny vocabulary
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0, "cache_salt": uuid.uuid4().hex}
        t0 = time.perf_counter()
        http_json(url + "/v1/completions", body, timeout=300)
        samples.append({"kind": "prefill", "new_tokens": n, "cached_tokens": 0, "seconds": time.perf_counter() - t0})

    for n in (64, 256, 512, 768, 64, 256, 512, 768):
        threads = [threading.Thread(target=one, args=(u, n)) for u in urls]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if decode_url is not None:
        samples += decode_step_samples(decode_url)
    model = dataclasses.replace(CostModel.fit(samples), name="live-fitted", block_size=BLOCK,
                                bytes_per_token=kv_bytes_per_token, bandwidth_bytes_per_s=1e9)
    model.save(str(out))
    return out, samples


def decode_step_samples(url: str, prompt_tokens: int = 256, tokens: int = 24,
                        batches: tuple[int, ...] = (1, 2, 4, 8, 1, 2, 4, 8)) -> list[dict[str, Any]]:
    """The decode instance's step time by batch: ``b`` streams of ``tokens`` tokens (salted prompts
    of ``prompt_tokens``, EOS ignored) sent at once; a sample is the median over the streams of each
    stream's mean gap between its tokens after the first (the steps they shared)."""
    import aiohttp

    async def stream(session: aiohttp.ClientSession) -> float | None:
        prompt = [3 + (i * 104729) % 290 for i in range(prompt_tokens)]
        body = {"model": "tiny", "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
                "ignore_eos": True, "cache_salt": uuid.uuid4().hex}
        times: list[float] = []
        async with session.post(url + "/v1/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.content:
                if line.startswith(b"data:") and b"[DONE]" not in line:
                    times.append(time.perf_counter())
        return (times[-1] - times[1]) / (len(times) - 2) if len(times) > 3 else None

    async def batch(b: int) -> dict[str, Any] | None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            gaps = [g for g in await asyncio.gather(*(stream(session) for _ in range(b))) if g is not None]
        if not gaps:
            return None
        return {"kind": "decode", "batch_size": b, "kv_tokens": b * (prompt_tokens + tokens // 2),
                "seconds": statistics.median(gaps)}

    out = [asyncio.run(batch(b)) for b in batches]
    return [s for s in out if s is not None]


class Proxy:
    def __init__(self, py: str, policy: str, prefills: list[VllmServer], decode: VllmServer, model: Path,
                 events: dict[str, str], master: str, profile: Path, log: Path, timeout: float,
                 extra: list[str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [py, "-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", str(self.port), "--policy", policy,
               "--block-size", str(BLOCK), "--tokenizer", str(model), "--health-interval", "2",
               "--kv-events-config", json.dumps(events), "--profile", str(profile), "--decode", decode.url]
        if master:  # "" with --no-store: no store tier
            cmd += ["--store-master", master, "--store-model-tag", f"{model}|torch.float32"]
        for p in prefills:
            cmd += ["--prefill", p.url]
        cmd += extra or []
        self._log = open(log, "wb")
        env = {**os.environ, "PYTHONPATH": shim_pythonpath()}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout  # loads transformers: minutes on a busy box
        while True:
            try:
                if http_json(self.url + "/health", timeout=5).get("can_serve", True):
                    return
            except Exception:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"proxy ({policy}) did not come up; see {log}")
            time.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def prefix_counters(servers: list[VllmServer]) -> dict[str, float]:
    out = {"queries": 0.0, "local": 0.0, "external": 0.0}
    for s in servers:
        text = http_text(s.url + "/metrics")
        out["queries"] += metric(text, "vllm:prefix_cache_queries_total")
        out["local"] += metric(text, "vllm:prefix_cache_hits_total")
        out["external"] += metric(text, "vllm:external_prefix_cache_hits_total")
    return out


def run_policy(policy: str, py: str, prefills: list[VllmServer], decode: VllmServer, model: Path,
               events: dict[str, str], master: str, profile: Path, logs: Path, reqs: list[TraceRequest],
               speed: float, a: argparse.Namespace, extra: list[str] | None = None,
               label: str | None = None, concurrency_cap: int | None = None,
               log_name: str | None = None, freeze: tuple[VllmServer, float, float] | None = None,
               warmup: int = 0, seed_offset: int = 0,
               warmup_speed: float | None = None) -> tuple[dict[str, Any], list[Result]]:
    for s in (*prefills, decode):
        reset_prefix_cache(s, timeout=120)
    with MasterClient(master) as c:
        c.remove_by_regex("^mc-vllm-kv/", True)
    label = label or policy
    proxy = Proxy(py, policy, prefills, decode, model, events, "" if a.no_store else master, profile,
                  logs / f"proxy_{log_name or label}.log",
                  a.startup_timeout, extra)
    try:
        if warmup and warmup_speed is not None:
            # a proxy that has been serving the admitted load: the window's first N requests at the
            # 1x rate, prompts of their own seed (no prefix shared with the counted replay), uncounted
            # (more than the window: it is replayed again, each pass with prompts of another seed)
            for k, start in enumerate(range(0, warmup, len(reqs))):
                wcfg = ReplayConfig(url=proxy.url, speed=warmup_speed, model="tiny", block_tokens=a.block_tokens,
                                    max_tokens_cap=a.max_tokens, timeout=a.request_timeout,
                                    seed=a.seed + 7919 + 104729 * k)
                asyncio.run(replay(reqs[:min(len(reqs), warmup - start)], wcfg, progress=False))
        for k in range(warmup) if warmup_speed is None else ():
            # a long-running proxy has learned its pairs: send these one at a time first, each with
            # prompts of its own seed (no prefix shared with the window or with each other, so the
            # policy's ties spread them over the prefills), and count nothing of them
            wcfg = ReplayConfig(url=proxy.url, speed=1e6, model="tiny", block_tokens=a.block_tokens,
                                max_tokens_cap=a.max_tokens, timeout=a.request_timeout, seed=a.seed + 7919 + k)
            asyncio.run(replay(reqs[k:k + 1], wcfg, progress=False))
        counted = proxy_counts(http_text(proxy.url + "/metrics"), prefills)
        before = prefix_counters(prefills)
        results: list[Result] = []
        cfg = ReplayConfig(url=proxy.url, speed=speed, model="tiny", block_tokens=a.block_tokens,
                           max_tokens_cap=a.max_tokens, timeout=a.request_timeout, seed=a.seed + seed_offset,
                           concurrency_cap=concurrency_cap)
        stop = threading.Event()
        thaw = freeze_later(*freeze, stop) if freeze is not None else None
        try:
            s = asyncio.run(replay(reqs, cfg, progress=not a.no_progress, results_out=results))
        finally:
            stop.set()
            if thaw is not None:
                thaw.join(timeout=freeze[2] + 5 if freeze is not None else 5)
        time.sleep(1.0)  # the last prefill's counters
        after = prefix_counters(prefills)
        proxy_metrics = http_text(proxy.url + "/metrics")
        total = proxy_counts(proxy_metrics, prefills)
        inst_factor: dict[str, float] = {}
        interference: dict[str, float] = {}
        pairs: dict[str, float] = {}
        share_exponent: list[float] = []
        for line in proxy_metrics.splitlines():
            if line.startswith("mooncake_proxy_hardware_share_exponent{"):  # each declared group's exponent
                share_exponent.append(float(line.rsplit(" ", 1)[1]))
            if line.startswith("mooncake_proxy_prefill_interference{"):  # "p0<p2": p2's coefficient on p0 (d: the decode)
                ends = [line.split(f'{k}="', 1)[1].split('"', 1)[0].split("@", 1)[1] for k in ("prefill", "other")]
                names = {p.url: f"p{i}" for i, p in enumerate(prefills)} | {decode.url: "d"}
                if all(u in names for u in ends) and float(line.rsplit(" ", 1)[1]) > 0:
                    pairs[f"{names[ends[0]]}<{names[ends[1]]}"] = float(line.rsplit(" ", 1)[1])
            if line.startswith("mooncake_proxy_decode_interference{"):  # prefill -> its coefficient on the decode
                url = line.split('prefill="', 1)[1].split('"', 1)[0].split("@", 1)[1]
                if url in (urls := [p.url for p in prefills]):
                    interference[f"p{urls.index(url)}"] = float(line.rsplit(" ", 1)[1])
            if line.startswith("mooncake_proxy_instance_cost_factor{") and 'side="prefill"' in line:
                url = line.split('instance="', 1)[1].split('"', 1)[0].split("@", 1)[1]
                if url in (urls := [p.url for p in prefills]):  # each prefill's own factor (--calibrate)
                    inst_factor[f"p{urls.index(url)}"] = float(line.rsplit(" ", 1)[1])
    finally:
        proxy.stop()
    decisions = {k: v - counted.get(k, 0.0) for k, v in total.items() if k.startswith("p")}
    q = after["queries"] - before["queries"]
    loc, ext = after["local"] - before["local"], after["external"] - before["external"]
    row = {"policy": policy, "completed": s["completed"], "requests": s["requests"], "errors": s["errors"],
           "ttft_mean": (s["ttft_s"] or {}).get("mean"), "ttft_p90": (s["ttft_s"] or {}).get("p90"),
           "tbt_p90": (s["tpot_s"] or {}).get("p90"), "prompt_tokens": q,
           "hit_local": loc / q if q else 0.0, "hit_store": ext / q if q else 0.0,
           "recomputed": (q - loc - ext) / q if q else 0.0, "wall_s": s["wall_s"],
           "prefill_split": dict(decisions), "label": label,
           "rejected_on_arrival": total["slo"] - counted["slo"],
           "rejected_after_prefill": total["slo_decode"] - counted["slo_decode"], "warmup": warmup,
           "cost_factor": {side: metric(proxy_metrics, f'mooncake_proxy_cost_factor{{side="{side}"}}')
                           for side in ("prefill", "decode")},
           "contention_slope": {side: metric(proxy_metrics, f'mooncake_proxy_contention_slope{{side="{side}"}}')
                                for side in ("prefill", "decode")},
           "prefill_factor": dict(sorted(inst_factor.items())),
           "decode_interference": dict(sorted(interference.items())),
           "prefill_interference": dict(sorted(pairs.items())), "hardware_share_exponent": share_exponent,
           # --peer-prefix: the peers' prefix exports by outcome (exported, failed, skipped)
           "peer_exports": {o: metric(proxy_metrics, f'mooncake_proxy_peer_prefix_exports_total{{outcome="{o}"}}')
                            for o in ("exported", "failed", "skipped")}}
    return row, results


def proxy_counts(text: str, prefills: list[VllmServer]) -> dict[str, float]:
    """The proxy's counters a run is judged on: decisions per prefill ("p0", "p1") and the SLO
    rejections ("slo" on arrival, "slo_decode" after the prefill) -- read before and after the
    replay, so that warm-up requests are not counted."""
    out: dict[str, float] = collections.Counter()
    urls = [p.url for p in prefills]
    for line in text.splitlines():
        if line.startswith("mooncake_proxy_scheduler_decisions_total{") and 'prefill="' in line:
            pid = line.split('prefill="', 1)[1].split('"', 1)[0]
            out[f"p{urls.index(pid.split('@', 1)[1])}"] += float(line.rsplit(" ", 1)[1])
    for reason in ("slo", "slo_decode"):
        out[reason] = metric(text, f'mooncake_proxy_rejections_total{{reason="{reason}"}}')
    return out


def freeze_later(server: VllmServer, at: float, dur: float, stop: threading.Event) -> threading.Thread:
    """Stop ``server``'s process group ``at`` s from now for ``dur`` s (``--freeze-prefill``); it is
    continued after ``dur`` or as soon as ``stop`` is set, whichever comes first -- never left stopped."""
    def run() -> None:
        if stop.wait(at) or server.proc is None:
            return
        os.killpg(server.proc.pid, signal.SIGSTOP)
        print(f"  froze {server.url} for {dur:g} s", flush=True)
        try:
            stop.wait(dur)
        finally:
            os.killpg(server.proc.pid, signal.SIGCONT)

    t = threading.Thread(target=run, name="freeze-prefill", daemon=True)
    t.start()
    return t


def first_half_slos(results: list[Result], pct: float) -> tuple[float, float]:
    """(TTFT SLO, TBT SLO): the ``pct`` percentile of the run's TTFTs and of its requests' TBT p90s."""
    import numpy as np

    ttft = [r.ttft for r in results if r.ok and r.ttft is not None]
    tbt = [t for r in results if r.ok and (t := r.tbt_p90) is not None]
    if not ttft or not tbt:
        raise RuntimeError("the first half completed no request to derive SLOs from; give --ttft-slo/--tbt-slo")
    return float(np.percentile(ttft, pct)), float(np.percentile(tbt, pct))


def unloaded_latency(py: str, prefills: list[VllmServer], decode: VllmServer, model: Path, events: dict[str, str],
                     master: str, profile: Path, logs: Path, reqs: list[TraceRequest], policy: str,
                     a: argparse.Namespace) -> tuple[float, float]:
    """(TTFT p50, p50 of the requests' TBT p90) of the window's first ``a.unloaded_requests``
    requests sent one at a time (nothing else in flight) through ``policy`` without SLO flags."""
    import numpy as np

    sub = reqs[: a.unloaded_requests]
    row, res = run_policy(policy, py, prefills, decode, model, events, master, profile, logs, sub, 1e6, a,
                          label="unloaded", concurrency_cap=1)
    ttft = [r.ttft for r in res if r.ok and r.ttft is not None]
    tbt = [t for r in res if r.ok and (t := r.tbt_p90) is not None]
    if not ttft or not tbt:
        raise RuntimeError(f"the unloaded requests completed none with a TBT ({row['errors']}); see {logs}")
    return float(np.percentile(ttft, 50)), float(np.percentile(tbt, 50))


def overload_row(row: dict[str, Any], results: list[Result], ttft_slo: float, tbt_slo: float) -> dict[str, Any]:
    """The run's row plus 429s and SLO attainment (replay.slo_attainment)."""
    slo = slo_attainment(results, ttft_slo, tbt_slo)
    return {**row, "rejected_429": sum(1 for r in results if r.status == 429), **slo}


def pooled_by_mode(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each overload mode run more than once: its runs pooled (replay.pooled_attainment)."""
    by_mode: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        by_mode[r["label"]].append(r)
    return {mode: pooled_attainment(runs) for mode, runs in by_mode.items() if len(runs) > 1}


def fmt_overload(rows: list[dict[str, Any]], factor: float) -> str:
    head = (f"{'mode':<12}{'sent':>5}{'429':>5}{'arr/dec':>9}{'done':>6}{'met':>5}{'attain adm':>11}"
            f"{'attain all':>11}{'TTFT mean':>10}{'p90':>7}{'TBT p90':>9}{'factor p/d (p0 p1)':>20}"
            f"{'missed T/B/both/fail':>22}{'load':>12}")
    lines = [f"overload: x{factor:g} the first half's arrival rate", head]

    def num(v: Any, fmt: str, scale: float = 1.0) -> str:
        return "-" if v is None else format(v * scale, fmt)

    for r in rows:
        f = r.get("cost_factor") or {}
        fac = f"{f.get('prefill', 0):.1f}/{f.get('decode', 0):.1f}" if any(f.values()) else "-"
        if r.get("prefill_factor"):  # and each prefill's own: shared p/d (p0 p1)
            fac += " (" + " ".join(f"{v:.1f}" for v in r["prefill_factor"].values()) + ")"
        sl = r.get("contention_slope") or {}
        if any(sl.values()):  # the learned log slowdown per busy neighbouring prefill
            fac += f" s{sl.get('prefill', 0):.2f}"
        if r.get("hardware_share_exponent"):  # --prefill-contention groups: each group's exponent
            fac += " g(" + " ".join(f"{v:.1f}" for v in r["hardware_share_exponent"]) + ")"
        if r.get("decode_interference"):  # each prefill's log slowdown of the decode's steps
            fac += " i(" + " ".join(f"{k}:{v:.1f}" for k, v in r["decode_interference"].items()) + ")"
        if r.get("prefill_interference"):  # which prefill slows which: "p0<p2" = p2's coefficient on p0
            fac += " pp(" + " ".join(f"{k}:{v:.1f}" for k, v in r["prefill_interference"].items()) + ")"
        split = f"{int(r['rejected_on_arrival'])}/{int(r['rejected_after_prefill'])}"
        lines.append(f"{r['label']:<12}{r['requests']:>5}{r['rejected_429']:>5}{split:>9}{r['completed']:>6}"
                     f"{r['met']:>5}{num(r['attainment_admitted'], '.0%'):>11}{num(r['attainment_all'], '.0%'):>11}"
                     f"{num(r['ttft_mean'], '.2f'):>10}{num(r['ttft_p90'], '.2f'):>7}"
                     f"{num(r['tbt_p90'], '.0f', 1000):>9} {fac:>19}{'/'.join(str(v) for v in r['missed'].values()):>22}"
                     f"{str(r.get('load_avg_start', '-')) + '->' + str(r.get('load_avg_end', '-')):>12}")
    for mode, p in pooled_by_mode(rows).items():
        lo, hi = p["ci95"]
        lines.append(f"pooled {mode}: {p['runs']} runs, {p['rejected_429']} x 429 of {p['sent']}, "
                     f"{p['met']}/{p['admitted']} admitted met the SLOs = {num(p['attainment_admitted'], '.0%')} "
                     f"(95 % CI {lo:.0%}-{hi:.0%}, Wilson); {p['runs_at_90']} of {p['runs']} runs >= 90 %")
    slo = rows[0]
    return "\n".join(lines) + (f"\n(SLO: TTFT <= {slo['ttft_slo_s']:.2f} s and the request's TBT p90 <= "
                               f"{1000 * slo['tbt_slo_s']:.0f} ms; attainment among the admitted (not 429) and "
                               "all requests; 429s on arrival / after the prefill; TTFT s, TBT ms; "
                               "factor: the proxy's --calibrate factors at the end, shared prefill/decode and each "
                               "prefill's own, s: the prefills' contention slope, i(): each prefill's interference "
                               "with the decode, pp(): a<b is prefill b's interference with prefill a, g(): each "
                               "--hardware-group's learned exponent)")


def fmt_table(rows: list[dict[str, Any]]) -> str:
    base = next((r["ttft_mean"] for r in rows if r["policy"] == "load_balance" and r["ttft_mean"]), None)
    lines = [f"{'policy':<13}{'done':>6}{'TTFT mean':>11}{'p90':>9}{'TBT p90':>9}{'local':>8}{'store':>8}"
             f"{'recomp':>8}{'vs LB':>8}  prefill split"]
    for r in rows:
        def f(v: Any, scale: float = 1.0, pct: bool = False) -> str:
            return "-" if v is None else (f"{100 * v:.0f}%" if pct else f"{v * scale:.2f}")
        ratio = f"{r['ttft_mean'] / base:.2f}x" if base and r["ttft_mean"] else "-"
        lines.append(f"{r['policy']:<13}{r['completed']:>3}/{r['requests']:<2}{f(r['ttft_mean']):>11}"
                     f"{f(r['ttft_p90']):>9}{f(r['tbt_p90'], 1000):>9}{f(r['hit_local'], pct=True):>8}"
                     f"{f(r['hit_store'], pct=True):>8}{f(r['recomputed'], pct=True):>8}{ratio:>8}  "
                     f"{r['prefill_split']}")
    return "\n".join(lines) + "\n(TTFT s, TBT ms; hit shares are of the prefills' prompt tokens, vLLM's counters)"


def write_plot(path: Path, results: dict[str, list[Result]], reqs: list[TraceRequest], speed: float,
               profile: Path, tokens_per_trace_token: float, max_tokens: int, n_prefills: int = 2) -> None:
    """Live TTFT CDF per policy next to the simulator's on the same window: ``n_prefills`` P + 1 D, the fitted
    profile, input lengths and block size scaled to the live prompts' token counts."""
    from mooncake_proxy.sim import SimConfig, simulate
    from mooncake_proxy.sim.plot import ttft_cdf_panel
    from mooncake_proxy.sim.trace import TraceRecord
    from mooncake_proxy.svgplot import Panel, cdf_points, render_svg

    series = {}
    for p, res in results.items():
        t = [r.ttft for r in res if r.ok and r.ttft]
        if t:
            series[f"{p} (mean {sum(t) / len(t):.2f}s)"] = cdf_points(t)
    live = Panel(f"live ({n_prefills}P1D vLLM CPU)", series, "TTFT (s, log scale)", "fraction of requests", log_x=True)
    k = tokens_per_trace_token
    recs = [TraceRecord(timestamp=r.timestamp_ms, input_length=max(1, round(r.input_length * k)),
                        output_length=min(r.output_length, max_tokens), hash_ids=list(r.hash_ids)) for r in reqs]
    cost = CostModel.from_file(str(profile))
    cfg = {"prefill": n_prefills, "decode": 1, "speed": speed, "block_size": max(1, round(512 * k))}
    # a variant is simulated as its base policy (the simulator's conductor fetches from peers anyway)
    sim = {p: simulate(recs, SimConfig(policy=VARIANTS.get(p, (p, []))[0], **cfg), cost)  # type: ignore[arg-type]
           for p in results}
    path.write_text(render_svg([live, ttft_cdf_panel(sim, "simulated (same window, fitted profile)")]))


def core_groups(servers: list[VllmServer]) -> list[list[str]]:
    """The URLs of the instances this bench pins to one core, per core with two or more (their workers
    share it; the proxy's --hardware-group)."""
    by_core: dict[int, list[str]] = {}
    for s in servers:
        by_core.setdefault(s.cpu % max(1, os.cpu_count() or 1), []).append(s.url)
    return [urls for _, urls in sorted(by_core.items()) if len(urls) > 1]


def run_overload(a: argparse.Namespace, py: str, prefills: list[VllmServer], decode: VllmServer, model: Path,
                 events: dict[str, str], master: str, profile: Path, logs: Path, reqs: list[TraceRequest],
                 speed: float, first: dict[str, list[Result]]) -> list[dict[str, Any]]:
    """The overload phase (module doc): one replay per rejection mode at ``a.overload`` x the rate."""
    ttft_slo, tbt_slo = a.ttft_slo, a.tbt_slo
    if a.slo_from_unloaded:  # measured (and printed) even when both SLOs are given
        kt, kb = a.slo_from_unloaded
        t50, b50 = unloaded_latency(py, prefills, decode, model, events, master, profile, logs, reqs,
                                    a.overload_policy, a)
        print(f"unloaded ({a.unloaded_requests} requests one at a time, load avg {os.getloadavg()[0]:.1f}): "
              f"TTFT p50 {t50:.3f} s, TBT p90 p50 {1000 * b50:.0f} ms -> SLOs x{kt:g} / x{kb:g}", flush=True)
        ttft_slo, tbt_slo = ttft_slo or kt * t50, tbt_slo or kb * b50
    if ttft_slo is None or tbt_slo is None:
        t, b = first_half_slos(first[a.overload_policy], a.slo_percentile)
        ttft_slo, tbt_slo = ttft_slo or t, tbt_slo or b
    print(f"overload x{a.overload:g} ({a.overload_policy}): SLOs TTFT {ttft_slo:.2f} s, TBT p90 "
          f"{1000 * tbt_slo:.0f} ms", flush=True)
    out = []
    for k, mode in enumerate(a.rejection_modes):
        extra: list[str] = []
        if mode != "none":
            # DEBUG: the proxy logs each admitted request's predicted TTFT and its first token (proxy_<k>_<mode>.log)
            extra += ["--ttft-slo", f"{ttft_slo:.4f}", "--tbt-slo", f"{tbt_slo:.4f}", "--calibrate", "--log-level", "DEBUG",
                      "--prefill-batch-tokens", str(a.max_num_batched_tokens if a.batched_estimate else 0),
                      "--recent-busy-tau", str(a.recent_busy_tau), "--prefill-contention", a.prefill_contention,
                      "--ttft-margin-quantile", str(a.ttft_margin_quantile)]
            if a.prefill_contention == "groups":
                for group in core_groups([*prefills, decode]):
                    extra += ["--hardware-group", *group]
        # the mode's own flags last: where one repeats a flag above, the mode's value wins (argparse)
        extra += [x.format(horizon=a.prediction_horizon) for x in REJECTION_MODES[mode]]
        load = os.getloadavg()[0]
        freeze = None
        if a.freeze_prefill:
            i, at, dur = a.freeze_prefill
            freeze = (prefills[int(i)], at, dur)
        row, res = run_policy(a.overload_policy, py, prefills, decode, model, events, master, profile, logs, reqs,
                              speed * a.overload, a, extra, label=mode, log_name=f"{k}_{mode}", freeze=freeze,
                              warmup=a.warmup, warmup_speed=speed if a.warmup_at_rate else None)
        row = overload_row(row, res, ttft_slo, tbt_slo)
        row["per_request"] = [{"i": r.index, "status": r.status, "ttft": r.ttft, "tbt_p90": r.tbt_p90,
                               "send_lag": r.send_lag} for r in res]  # --json: which requests missed, when
        row["load_avg_start"] = round(load, 1)
        row["load_avg_end"] = round(os.getloadavg()[0], 1)
        out.append(row)
        print(f"overload {mode}: {row['requests']} sent, {row['rejected_429']} x 429, {row['met']}/{row['admitted']}"
              f" admitted met the SLO; load avg {load:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--trace", type=Path, default=default_trace(), help="conversation trace JSONL")
    ap.add_argument("--policies", nargs="*", default=POLICIES, choices=POLICIES + list(VARIANTS),
                    help="policies, run in this order (none: only the overload phase, with --ttft-slo/--tbt-slo); "
                         "conductor_peer: conductor with --peer-prefix (prefixes read from a peer prefill)")
    ap.add_argument("--span", type=int, default=3000, help="trace requests the window's conversations are picked from")
    ap.add_argument("--max-blocks", type=int, default=12, help="skip requests longer than this many 512-token blocks")
    ap.add_argument("--groups", type=int, default=16, help="most frequent conversations kept")
    ap.add_argument("--requests", type=int, default=40, help="requests replayed per policy")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds the window's arrivals are scaled to")
    ap.add_argument("--block-tokens", type=int, default=16, help="prompt words per 512-token trace block")
    ap.add_argument("--max-tokens", type=int, default=8, help="cap of the output tokens (trace output_length)")
    ap.add_argument("--hidden", type=int, default=768, help="model hidden size")
    ap.add_argument("--heads", type=int, default=12, help="attention heads (head size hidden/heads: 64)")
    ap.add_argument("--layers", type=int, default=6, help="decoder layers")
    ap.add_argument("--warm-window", action="store_true",
                    help="before the policies, replay the window once (prompts of another seed, round_robin, not "
                         "counted): the first replay after start-up is slower than later ones, which otherwise "
                         "penalises whichever policy runs first")
    ap.add_argument("--default-decode-profile", action="store_true",
                    help="keep the default profile's decode coefficients (an A800's, nearly flat in the batch) "
                         "instead of timing the decode's steps at batches 1..8 (what runs before 2026-12-03 did)")
    ap.add_argument("--fit-concurrent", action="store_true",
                    help="fit the proxy's prefill profile with every prefill timed at once (the speed they have "
                         "when sharing the cores, as under load) instead of one idle prefill")
    ap.add_argument("--prefills", type=int, default=2,
                    help="prefill instances (prefill i on core i mod the core count; the decode on core 1, with "
                         "prefill 1): more than 2 lets locality differ between policies as in the paper's 10+ "
                         "instances, at the cost of sharing cores")
    ap.add_argument("--decode-own-core", action="store_true",
                    help="pin the decode alone on the last core and the prefills on the others (prefill i on core "
                         "i mod (cores - 1); on 2 cores all prefills share core 0). Why: as in the paper's setup, "
                         "where prefill and decode instances are separate nodes, the decode's steps and hand-offs "
                         "are then not slowed by prefills computing beside it; the prefills still share cores. The "
                         "store master, the proxies and the bench's client run on the decode's core too, and each "
                         "instance's API server and engine core on its worker's core")
    ap.add_argument("--store-lookup", choices=("always", "hint"), default="always",
                    help="the prefills' store connector: 'always' looks the store up for every request (every "
                         "policy then reuses what any instance saved); 'hint' only for requests the proxy hints "
                         "(mooncake_store_prefix: only the conductor, which sees the store, sends them) -- the "
                         "paper's setup, where the baselines reuse only their instance's own cache; the decode, "
                         "which gets its KV from the prefill, then makes no store lookups either")
    ap.add_argument("--no-idle-spin", action="store_true",
                    help="bench-only: start the vLLM servers with mooncake_lab/vllm_no_spin on PYTHONPATH, which cuts vLLM "
                         "CPU's 1 s busy spin after each message to 2 ms (bench_vllm_pd.py has the same switch). "
                         "Why: the decode shares a core with prefill 1, whose spin after each answer delays the "
                         "decode's first token by ~1 s; on dedicated cores (a real deployment) that cost is absent")
    ap.add_argument("--no-store", action="store_true",
                    help="engines with the P2P connector only (no store child) and a proxy without the store tier: "
                         "a reused prefix is local, read from a peer (conductor_peer) or recomputed")
    ap.add_argument("--kv-cache-bytes", type=int, default=128 << 20, help="KV cache per vLLM instance (bytes)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048,
                    help="the vLLM servers' --max-num-batched-tokens (2048 is vLLM CPU's default); with "
                         "--batched-estimate also the overload phase's proxies' --prefill-batch-tokens")
    ap.add_argument("--ttft-margin-quantile", type=float, default=0.9,
                    help="the overload phase's proxies' --ttft-margin-quantile (0.9: the proxy's default)")
    ap.add_argument("--recent-busy-tau", type=float, default=0.0,
                    help="the overload phase's proxies' --recent-busy-tau (0: off, only the prefills busy now count "
                         "in the contention the checks expect)")
    ap.add_argument("--prefill-contention", choices=("count", "pairs", "groups"), default="pairs",
                    help="the overload phase's proxies' --prefill-contention: pairs (default: a coefficient per pair "
                         "of instances; here prefills 0 and 2 share a core, 1 and 3 the other with the decode), "
                         "count (one slope per busy neighbouring prefill) or groups (the proxies get a "
                         "--hardware-group per core this bench pins two or more instances to: processor sharing, "
                         "one exponent per group learned)")
    ap.add_argument("--batched-estimate", action="store_true",
                    help="the overload phase's proxies get --prefill-batch-tokens (= --max-num-batched-tokens): the "
                         "prefills batch their queue, and the TTFT check keeps the requests already queued within "
                         "the SLO. Off by default: on this box it sent requests the check would have queued behind "
                         "others to other prefills, and the prefills slowed each other more than it saved "
                         "(docs/benchmarks-log.md, issue 16, runs k10-k16)")
    ap.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for the vLLM servers (and each proxy)")
    ap.add_argument("--request-timeout", type=float, default=600.0, help="per-request timeout of the replay (s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompt text")
    ap.add_argument("--logs", type=Path, default=None, help="directory for server logs (default: a temp dir)")
    ap.add_argument("--plot", type=Path, default=None, metavar="FILE.svg",
                    help="write the TTFT CDF per policy, live and simulated side by side (SVG, no matplotlib needed)")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    g = ap.add_argument_group("overload phase (429s and SLO attainment, after the policies)")
    g.add_argument("--overload", type=float, default=0.0, metavar="FACTOR",
                   help="then replay the window at FACTOR x the first half's arrival rate (its speed x FACTOR) "
                        "once per --rejection-modes; 0 = no overload phase")
    g.add_argument("--overload-policy", choices=POLICIES, default="conductor", help="policy of the overload phase")
    g.add_argument("--rejection-modes", nargs="+", default=["none", "decode", "predictive"],
                   choices=list(REJECTION_MODES),
                   help="none: no SLO flags; decode: --rejection decode (the paper's baseline: TTFT on "
                        "arrival, TBT after the prefill); early: current-load early rejection; predictive: "
                        "--rejection early+decode --prediction-horizon H (prediction-based early rejection "
                        "with the decode-stage backstop); predictive_pairs: predictive with "
                        "--no-ttft-margin-queued (each pair's own TTFT margin only); predictive_recent: predictive "
                        "with --recent-busy-tau 2; predictive_no_qm: predictive with --ttft-queue-margin 0; "
                        "predictive_qm2: predictive with --ttft-queue-margin 2; every SLO mode adds --calibrate")
    g.add_argument("--ttft-slo", type=float, default=None,
                   help="TTFT SLO (s); a request meets the SLO when TTFT <= this and its TBT p90 <= --tbt-slo "
                        "(default: the --slo-percentile of the first half's TTFTs under --overload-policy)")
    g.add_argument("--tbt-slo", type=float, default=None,
                   help="TBT SLO (s) on a request's own TBT p90 (default: the --slo-percentile of the first "
                        "half's per-request TBT p90s)")
    g.add_argument("--slo-from-unloaded", type=float, nargs=2, default=None, metavar=("K_TTFT", "K_TBT"),
                   help="derive the SLOs from the unloaded latency instead: K_TTFT x the TTFT p50 and K_TBT x the "
                        "p50 of the per-request TBT p90 of --unloaded-requests requests sent one at a time "
                        "(measured at the start of the overload phase and printed; --ttft-slo/--tbt-slo still override)")
    g.add_argument("--unloaded-requests", type=int, default=8, help="requests of the unloaded measurement")
    g.add_argument("--slo-percentile", type=float, default=90.0,
                   help="percentile of the first half's latencies that sets the default SLOs")
    g.add_argument("--prediction-horizon", type=float, default=10.0,
                   help="the predictive mode's --prediction-horizon (s)")
    g.add_argument("--warmup", type=int, default=0, metavar="N",
                   help="before each overload replay, send N of the window's requests (each with prompts of its "
                        "own seed, so no shared prefix) one at a time through the fresh proxy, not counted: what a "
                        "long-running proxy has already learned about its instances (--calibrate); 0 = cold start")
    g.add_argument("--warmup-at-rate", action="store_true",
                   help="send the --warmup requests as a replay at the first half's (1x) rate instead of one at "
                        "a time: the proxy's factors then start from the contention of the admitted load (N may "
                        "then exceed --requests: the window is replayed again, each pass with prompts of a new seed)")
    g.add_argument("--freeze-prefill", type=float, nargs=3, default=None, metavar=("I", "AT", "DUR"),
                   help="in every overload mode, stop prefill I's vLLM processes (SIGSTOP) AT s into the "
                        "replay for DUR s: a reproducible engine freeze (module doc)")
    a = ap.parse_args(argv)
    if a.prefills < 1:
        ap.error(f"--prefills must be >= 1, got {a.prefills}")
    if a.freeze_prefill and not (a.freeze_prefill[0] in range(a.prefills) and a.freeze_prefill[1] >= 0
                                 and a.freeze_prefill[2] > 0):
        ap.error(f"--freeze-prefill I AT DUR needs I in 0..{a.prefills - 1}, AT >= 0 and DUR > 0")
    if a.warmup < 0 or (a.warmup > a.requests and not a.warmup_at_rate):
        ap.error(f"--warmup must be in 0..--requests ({a.requests}) (more only with --warmup-at-rate), got {a.warmup}")
    if a.warmup_at_rate and not a.warmup:
        ap.error("--warmup-at-rate needs --warmup N")
    if not a.policies and not a.overload:
        ap.error("nothing to run: give --policies or --overload")
    if a.overload < 0:
        ap.error(f"--overload must be >= 0, got {a.overload}")
    if a.overload and (a.ttft_slo is None or a.tbt_slo is None) and not a.slo_from_unloaded \
            and a.overload_policy not in a.policies:
        ap.error(f"--overload derives the SLOs from the first half's {a.overload_policy} run: add it to "
                 "--policies, give --ttft-slo and --tbt-slo, or --slo-from-unloaded")
    py = vllm_python()
    if py is None:
        print("bench_live_scheduling: the vLLM venv is missing (scripts/install_vllm.sh, or set VLLM_VENV)", file=sys.stderr)
        return 2
    with open(a.trace) as f:
        reqs = select_window(list(parse_trace_lines(f, str(a.trace))), a.span, a.max_blocks, a.groups, a.requests)
    if len(reqs) < 2:
        print(f"bench_live_scheduling: only {len(reqs)} requests selected from {a.trace}", file=sys.stderr)
        return 2
    speed = scale_time(reqs, a.duration)
    logs = a.logs or Path(tempfile.mkdtemp(prefix="bench-live-sched-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"window: {len(reqs)} requests, ideal prefix reuse {100 * ideal_hit_ratio(reqs):.0f}% of blocks, "
          f"speed x{speed:.1f} (over {a.duration:.0f} s); load average {os.getloadavg()[0]:.1f}; logs {logs}", flush=True)
    model = make_model(py, logs / "model", a.hidden, a.heads, a.layers)
    # below the ephemeral range (listen_port): the engines bind these a minute after they are picked, and
    # an ephemeral port could meanwhile go to another engine's ZMQ socket (two runs failed so, 2026-12-03)
    mport, hport, mmetrics, http_d = (listen_port() for _ in range(4))  # distinct: never repeats a port
    ev_ports = [listen_port() for _ in range(a.prefills)]
    http_ports = [listen_port() for _ in range(a.prefills)]
    ncpu = os.cpu_count() or 1
    # core of prefill i and of the decode (see --prefills, --decode-own-core)
    if a.decode_own_core and ncpu > 1:
        p_core, d_core = (lambda i: i % (ncpu - 1)), ncpu - 1
        # the store master, the proxies and this client (children inherit it) beside the decode, off
        # the prefills' cores: in a deployment they run on hosts of their own
        os.sched_setaffinity(0, {d_core})
    else:
        p_core, d_core = (lambda i: i % ncpu), 1 % ncpu
    master = MasterProc([f"--port={mport}", "--rpc_address=127.0.0.1", f"--metrics_port={mmetrics}",
                         "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
                         f"--http_metadata_server_port={hport}"], mport, mmetrics, str(logs / "master.log"))
    store_extra = {"master_server_address": master.addr, "metadata_server": f"http://127.0.0.1:{hport}/metadata",
                   "global_segment_size": "256MB", "local_buffer_size": "64MB", "local_hostname": "127.0.0.1"}
    common = ["--kv-cache-memory-bytes", a.kv_cache_bytes, "--max-model-len", 2048, "--enable-prompt-tokens-details",
              "--max-num-batched-tokens", a.max_num_batched_tokens]
    prefill_store = {**store_extra, "store_lookup": a.store_lookup}
    vllm_env = {"VLLM_SERVER_DEV_MODE": "1"}
    if a.no_idle_spin:
        vllm_env["PYTHONPATH"] = no_spin.pythonpath(shim_pythonpath())
    # --decode-own-core: each whole instance (API server, engine core, worker) on its core, not the bench's
    prefills = [VllmServer(py, model, http_ports[i], p_core(i), logs / f"prefill{i}.log",
                           multi_config("kv_producer", prefill_store, not a.no_store),
                           env=vllm_env, pin_all=a.decode_own_core,
                           args=[*common, "--kv-events-config", json.dumps(
                               {"enable_kv_cache_events": True, "publisher": "zmq",
                                "endpoint": f"tcp://*:{ev_ports[i]}"})]) for i in range(a.prefills)]
    # the decode gets its KV from the prefill (P2P); with --store-lookup hint it makes no store lookups
    # either (no request to it carries a hint): one master RPC per request less in its scheduler loop
    decode = VllmServer(py, model, http_d, d_core, logs / "decode.log",
                        multi_config("kv_consumer", {**store_extra, "store_lookup": a.store_lookup}, not a.no_store),
                        env=vllm_env, pin_all=a.decode_own_core, args=common)
    servers = [*prefills, decode]
    rows: list[dict[str, Any]] = []
    results: dict[str, list[Result]] = {}
    over_rows: list[dict[str, Any]] = []
    try:
        master.wait_ready()
        t0 = time.monotonic()
        for s in servers:
            s.start()
        wait_all(servers, a.startup_timeout)
        print(f"{len(servers)} vLLM servers healthy in {time.monotonic() - t0:.0f} s", flush=True)
        if a.no_idle_spin:
            no_spin.check_applied(servers, f"; see {logs}")
        kv_bytes = 2 * a.hidden * a.layers * 4  # K and V, fp32, every layer (heads = kv heads)
        fit_urls = [p.url for p in prefills] if a.fit_concurrent else [prefills[0].url]
        profile, samples = fit_prefill_profile(fit_urls, logs / "profile.json", kv_bytes,
                                               None if a.default_decode_profile else decode.url)
        pre = [s for s in samples if s["kind"] == "prefill"]
        print(f"prefill profile ({len(fit_urls)} at once): " + ", ".join(
            f"{s['new_tokens']} tok {s['seconds']:.2f}s" for s in pre[4 * len(fit_urls)::len(fit_urls)]), flush=True)
        if not a.default_decode_profile:
            print("decode steps: " + ", ".join(f"batch {s['batch_size']} {1000 * s['seconds']:.0f}ms"
                                               for s in samples if s["kind"] == "decode"), flush=True)
        events = {p.url: f"tcp://127.0.0.1:{port}" for p, port in zip(prefills, ev_ports)}
        if a.warm_window and a.policies:
            # the first replay after start-up ran slower than the same policy later (first touch of
            # the KV cache, first calls per shape): replay the window once, prompts of another seed,
            # through round_robin so every prefill serves a share of it, and keep nothing of it
            t1 = time.monotonic()
            run_policy("round_robin", py, prefills, decode, model, events, master.addr, profile, logs, reqs, speed, a,
                       label="warm-window", seed_offset=104729)
            print(f"warm-up replay of the window (not counted) in {time.monotonic() - t1:.0f} s", flush=True)
        for k, pol in enumerate(a.policies):  # a policy may be listed twice (alternated runs): one log each
            load = os.getloadavg()[0]
            # DEBUG: each decision (prefill, estimate) in proxy_p<k>_<policy>.log, for a slow run's diagnosis
            base, flags = VARIANTS.get(pol, (pol, []))
            row, res = run_policy(base, py, prefills, decode, model, events, master.addr, profile, logs, reqs, speed, a,
                                  extra=["--log-level", "DEBUG", *flags], log_name=f"p{k}_{pol}")
            row["policy"] = pol
            row["load_avg_start"] = round(load, 1)
            row["per_request"] = [{"i": r.index, "status": r.status, "ttft": r.ttft, "tbt_p90": r.tbt_p90}
                                  for r in res]
            rows.append(row)
            results.setdefault(pol, []).extend(res)  # a policy run twice: SLOs and plot from both runs
            peer = "".join(f", peer exports {o} {n:.0f}" for o, n in row["peer_exports"].items() if n)
            print(f"{pol}: {row['completed']}/{row['requests']} done, TTFT mean {row['ttft_mean']}{peer}, "
                  f"load avg {load:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
        if a.overload:
            over_rows = run_overload(a, py, prefills, decode, model, events, master.addr, profile, logs, reqs,
                                     speed, results)
    finally:
        for s in servers:
            s.stop()
        master.kill()
    print(fmt_table(rows))
    if over_rows:
        print(fmt_overload(over_rows, a.overload))
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "overload": over_rows, "overload_pooled": pooled_by_mode(over_rows),
                                      "speed": speed, "window": len(reqs)}, indent=1))
    if a.plot and rows:
        live_tokens = statistics.mean(r["prompt_tokens"] for r in rows) / max(1, sum(q.input_length for q in reqs))
        write_plot(a.plot, results, reqs, speed, profile, live_tokens, a.max_tokens, a.prefills)
        print(f"wrote {a.plot}")
    return 0 if (rows or over_rows) and all(r["completed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
