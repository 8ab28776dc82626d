"""Tensor parallelism end to end on real vLLM (CPU) servers with MooncakeCoreConnector.

Three servers run the tiny random Llama (2 KV heads, so TP 2 puts one head on each rank):
a prefill with ``tensor_parallel_size=2``, a decode with TP 2 and a TP 1 instance that is both
(``kv_both``: decode for the TP 2 prefill, prefill for the TP 2 decode). Each TP rank is its own
worker process (multiprocessing executor, gloo) with its own Transfer Engine segment; rank r's
threads run on core r. Through our ``mooncake_proxy`` we check that

* TP 2 -> TP 2: each decode rank reads its own head slice from the prefill rank holding it, and
  the greedy output equals the decode's own non-disaggregated TP 2 computation;
* TP 2 -> TP 1 (heterogeneous): the single decode rank reads both prefill ranks' slices into
  the two halves of each block, and the output equals its own TP 1 computation -- a misplaced
  slice (heads swapped, one rank's bytes missing) changes it;
* TP 1 -> TP 2 (decode TP > prefill TP): each decode rank reads only its head's half of every
  block of the single prefill rank, and that rank frees its blocks once both decode ranks
  confirmed (``done 0/2``, ``done 1/2``);
* the concurrent hand-off (every decode rank asks the prefill's rank 0) works under TP too;
* the prefill frees its blocks once every rank has been confirmed, and noise written over the
  received blocks changes the output (the decode really uses the transferred slices).

The start-up of three servers on 2 cores takes a couple of minutes; every wait has a timeout.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from checkout_shim import shim_pythonpath
from vllm_harness import (VllmServer, completion, free_port, http_text, metric, own_tokens, p2p_config, prompt_ids,
                          start_all, start_proxy, stop_proxy, tp_args, wait_until)

HERE = str(Path(__file__).resolve().parent)  # corrupting_connector.py, loaded by the decodes
#: Opt-in: the five TP worker processes (plus three engine cores) load a 2-core box to a load
#: average of ~40 by themselves, and there the prefill's TP 2 engine stalled (its /health
#: answered 503; a concurrent request timed out at 300 s) in 2 of 3 runs with nothing else
#: running -- too unsteady to gate the 2-core CI on. The TP rank plans, slicing and params are
#: unit-tested in CI (test_vllm_tp_units.py); run this on a machine with >= 4 cores.
#: Known open defect (issue 19), seen in 6 of 9 failures at load 50-67: a decode rank's first
#: contact with a prefill TP rank (segment lookup, handshake, attach probe) hangs until the
#: prefill's lease expires, so the prefill side of a TP worker may be starving its TE server
#: thread; capacity alone does not explain it.
RUN_TP_E2E = os.environ.get("MOONCAKE_TP_E2E", "") not in ("", "0")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900),
              pytest.mark.skipif(not RUN_TP_E2E, reason="TP end to end is opt-in (MOONCAKE_TP_E2E=1): on 2 cores its TP "
                                 "workers stall (capacity, plus the open first-contact hang until the "
                                 "prefill's lease expires, issue 19); see the module docstring")]

#: The prefill's lease and the concurrent decode's wait for ``ready``: generous. Five TP worker
#: processes share 2 cores here; with other work on the box a TP 2 step took seconds and a
#: prefill answer a minute to reach the decode. This file tests no expiry
#: (tests/vllm/test_vllm_p2p_e2e.py does).
LEASE_S = 120.0
PREFILL_WAIT_S = 300.0
#: Three servers (five TP worker processes) starting at once: ~1-2 min on a quiet 2-core box,
#: much more when other work shares it.
STARTUP_S = 600.0
BLOCK = 32
MAX_TOKENS = 12
EXT_HITS = "vllm:external_prefix_cache_hits_total"
USAGE = "vllm:kv_cache_usage_perc"


def own(d: VllmServer, prompt: list[int]) -> list[int]:
    return own_tokens(d, prompt, MAX_TOKENS)


def via(url: str, prompt: list[int]) -> list[int]:
    return completion(url, prompt, MAX_TOKENS, timeout=300)["choices"][0]["token_ids"]


def pulled(log: str) -> list[tuple[str, int, int]]:
    """(transfer id, blocks, bytes) of every 'kv pulled' line (one per decode rank and transfer)."""
    return [(t, int(b), int(n)) for t, b, n in
            re.findall(r"kv pulled request=\S+ transfer=(\S+) blocks=(\d+) bytes=(\d+)", log)]


@pytest.fixture(scope="module")
def tp_servers(vllm_py, tiny_model, tmp_path_factory):
    cfg = json.loads((tiny_model / "config.json").read_text())
    assert cfg["num_key_value_heads"] >= 2, "TP 2 needs a model with >= 2 KV heads (scripts/make_tiny_model.py)"
    logs = tmp_path_factory.mktemp("vllm-tp-logs")
    args2, env2 = tp_args(2)
    # both decodes run the production connector subclassed with the negative control
    dec_env = {"PYTHONPATH": os.pathsep.join([shim_pythonpath(), HERE])}
    dec_cfg = dict(p2p_config("kv_consumer", prefill_wait_s=PREFILL_WAIT_S), kv_load_failure_policy="recompute",
                   kv_connector="CorruptingMooncakeConnector", kv_connector_module_path="corrupting_connector")
    p = VllmServer(vllm_py, tiny_model, free_port(), 0, logs / "prefill-tp2.log",
                   p2p_config("kv_producer", kv_lease_s=LEASE_S), env=env2, args=args2)
    d2 = VllmServer(vllm_py, tiny_model, free_port(), 0, logs / "decode-tp2.log", dec_cfg,
                    env=dict(env2, **dec_env), args=args2)
    both_cfg = dict(dec_cfg, kv_role="kv_both",  # decode for the TP 2 prefill, prefill for the TP 2 decode
                    kv_connector_extra_config=dict(dec_cfg["kv_connector_extra_config"], kv_lease_s=LEASE_S))
    d1 = VllmServer(vllm_py, tiny_model, free_port(), 1, logs / "both-tp1.log", both_cfg, env=dec_env)
    t0 = time.monotonic()
    start_all([p, d2, d1], timeout=STARTUP_S)
    print(f"TP2 prefill + TP2 decode + TP1 decode/prefill healthy in {time.monotonic() - t0:.1f} s")
    # Warm-up, one server at a time: vLLM CPU compiles graphs for new shapes on the first requests
    # (the ranks and servers serialize on inductor's cache lock); a TP 2 decode's first hand-off
    # stalled > 2 min that way -- past the prefill's lease -- with servers warming side by side.
    for i, s in enumerate((p, d2, d1)):
        t1 = time.monotonic()
        completion(s.url, prompt_ids(900 + i), MAX_TOKENS, timeout=STARTUP_S)
        print(f"warm-up of {s.log_path.name}: {time.monotonic() - t1:.1f} s")
    try:
        yield p, d2, d1, logs
    finally:
        for s in (p, d2, d1):
            s.stop()


def check_through_proxy(p: VllmServer, d: VllmServer, logs, handoff: str, seeds: list[int],
                        ranks: int) -> list[str]:
    """Send ``seeds``' prompts through a proxy; each must be handed off (external hits = prompt) and
    equal the decode's own computation. Returns the transfer ids the decode pulled."""
    proc, url = start_proxy(p, d, handoff, logs / f"proxy-{handoff}-{p.port}-{d.port}.log")
    try:
        before = {t for t, _b, _n in pulled(d.log_text())}
        for seed in seeds:
            prompt = prompt_ids(seed)
            hits0 = metric(http_text(d.url + "/metrics"), EXT_HITS)
            got = via(url, prompt)
            assert metric(http_text(d.url + "/metrics"), EXT_HITS) - hits0 == len(prompt), \
                "the proxy path did not hand the KV off to the decode"
            assert got == own(d, prompt), "greedy output from transferred TP KV differs from a local run"
    finally:
        stop_proxy(proc)
    lines = [x for x in pulled(d.log_text()) if x[0] not in before]
    tids = sorted({t for t, _b, _n in lines})
    assert len(tids) == len(seeds)
    for t in tids:  # every decode rank pulled the transfer, exactly the prompt's blocks
        assert len([x for x in lines if x[0] == t]) == ranks, f"transfer {t}: expected {ranks} 'kv pulled' lines"
    return tids


def direct(p: VllmServer, d: VllmServer, seed: int, ranks: int, prefill_tp: int = 2) -> dict:
    """Prefill then decode one prompt (no proxy); checks the output and what each decode rank moved."""
    prompt = prompt_ids(seed)
    params = completion(p.url, prompt, 1, {"do_remote_decode": True})["kv_transfer_params"]
    assert params["mooncake_tp_size"] == prefill_tp and len(set(params["mooncake_segments"])) == prefill_tp, params
    assert params["mooncake_segments"][0] == params["mooncake_segment"]
    assert params["mooncake_kv_heads"] == 2 // prefill_tp and params["mooncake_heads_outer"] is True
    got = completion(d.url, prompt, MAX_TOKENS, params, timeout=300)["choices"][0]["token_ids"]
    assert got == own(d, prompt), "greedy output from transferred TP KV differs from a local run"
    nblocks = -(-len(prompt) // BLOCK)
    lines = [x for x in pulled(d.log_text()) if x[0] == params["mooncake_transfer_id"]]
    assert len(lines) == ranks, f"expected one 'kv pulled' line per decode rank ({ranks}), got {lines}"
    # each decode rank moves its own heads of every block of every slab: the prefill's KV (all its
    # ranks' blocks) divided by the decode's ranks -- a TP 1 decode both prefill ranks' shares, a TP 2
    # decode of a TP 1 prefill half of each block
    total = nblocks * params["mooncake_block_bytes"] * params["mooncake_num_slabs"] * prefill_tp
    for _t, blocks, nbytes in lines:
        assert (blocks, nbytes) == (nblocks, total // ranks)
    # every prefill rank was confirmed (by every decode rank reading it): vLLM frees the blocks long
    # before the lease
    wait_until(lambda: metric(http_text(p.url + "/metrics"), USAGE) == 0.0, LEASE_S / 2,
               "prefill KV usage back to 0 after the decode ranks confirmed to every prefill rank")
    return params


def test_tp2_prefill_to_tp2_decode(tp_servers):
    """Each decode rank reads its own head slice from the prefill rank holding it."""
    p, d2, _d1, logs = tp_servers
    direct(p, d2, 1, ranks=2)
    check_through_proxy(p, d2, logs, "vllm", [2, 3], ranks=2)


def test_tp2_prefill_to_tp1_decode(tp_servers):
    """Heterogeneous TP: one decode rank assembles each block from both prefill ranks' head slices."""
    p, _d2, d1, logs = tp_servers
    direct(p, d1, 4, ranks=1)
    check_through_proxy(p, d1, logs, "vllm", [5], ranks=1)


def test_tp1_prefill_to_tp2_decode(tp_servers):
    """Decode TP > prefill TP: each decode rank reads its head slice of the one prefill rank's blocks;
    the prefill frees them once both decode ranks confirmed."""
    _p, d2, d1, logs = tp_servers
    direct(d1, d2, 10, ranks=2, prefill_tp=1)
    check_through_proxy(d1, d2, logs, "vllm", [11], ranks=2)
    assert "does not fit this decode" not in d2.log_text(), "the decode refused the TP 1 prefill's layout"


SIDES = {"tp2": (0, 1), "tp1": (0, 2), "tp1to2": (2, 1)}  # (prefill, decode) in tp_servers


@pytest.mark.parametrize("which", list(SIDES))
def test_negative_control_noise_over_the_slices_changes_the_output(tp_servers, which):
    p, d = (tp_servers[i] for i in SIDES[which])
    prompt = prompt_ids({"tp2": 6, "tp1": 7, "tp1to2": 12}[which])
    want = own(d, prompt)
    params = completion(p.url, prompt, 1, {"do_remote_decode": True})["kv_transfer_params"]
    params["mooncake_test_corrupt"] = True  # honoured by the decodes' CorruptingMooncakeConnector
    assert completion(d.url, prompt, MAX_TOKENS, params, timeout=300)["choices"][0]["token_ids"] != want, \
        "noise over the received KV did not change the output: the decode ignores the transferred slices"


@pytest.mark.parametrize("which", list(SIDES))
def test_concurrent_handoff_under_tp(tp_servers, which):
    """``--handoff mooncake-core``: the first request goes sequentially (the proxy learns the
    prefill's rank 0 segment), the next concurrently: every decode rank asks rank 0 for ``ready``."""
    p, d = (tp_servers[i] for i in SIDES[which])
    logs = tp_servers[3]
    seeds = {"tp2": [8, 9], "tp1": [18, 19], "tp1to2": [28, 29]}[which]
    tids = check_through_proxy(p, d, logs, "mooncake-core", seeds, ranks=1 if which == "tp1" else 2)
    assert any(t.startswith("mc-") for t in tids), f"no transfer went through the concurrent hand-off: {tids}"
