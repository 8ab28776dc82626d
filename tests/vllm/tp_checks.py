"""Checks of the TP end-to-end test (test_vllm_tp_e2e.py): one prompt handed off directly or
through our ``mooncake_proxy``, its output compared with the decode's own computation and what
each decode rank moved checked from its ``kv pulled`` log lines."""

from __future__ import annotations

import json
import re
import time

from mooncake_lab.vllm_harness import (VllmServer, completion, http_text, metric, own_tokens, prompt_ids, start_proxy, stop_proxy,
                          wait_until)

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


def wait_pulled(d: VllmServer, keep, count: int, timeout: float = 15.0) -> list[tuple[str, int, int]]:
    """The 'kv pulled' lines ``keep`` selects from ``d``'s log, after waiting (at most ``timeout``)
    for ``count`` of them: each decode rank's worker logs its line when its read is done, which
    may reach the log file a moment after the completion returned."""
    deadline = time.monotonic() + timeout
    while True:
        lines = keep(pulled(d.log_text()))
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def connector_trouble(*servers: VllmServer, last: int = 15) -> str:
    """The connectors' warnings, errors and retries in the servers' logs (the last ``last`` of
    each): what a failed CI run must show, since its log files are gone with the machine."""
    out = []
    for srv in servers:
        lines = [x for x in srv.log_text().splitlines() if "MooncakeCoreConnector" in x
                 and (" WARNING " in x or " ERROR " in x or "asking again" in x)]
        out.append(f"--- {srv.url}: {len(lines)} connector warnings/errors/retries" +
                   "".join(f"\n{x[:300]}" for x in lines[-last:]))
    return "\n".join(out)


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
            try:
                got = via(url, prompt)
            except Exception as e:
                raise AssertionError(f"seed {seed} through --handoff {handoff}: {e}\n"
                                     f"{connector_trouble(p, d)}") from e
            assert metric(http_text(d.url + "/metrics"), EXT_HITS) - hits0 == len(prompt), \
                "the proxy path did not hand the KV off to the decode"
            assert got == own(d, prompt), "greedy output from transferred TP KV differs from a local run"
    finally:
        stop_proxy(proc)
    lines = wait_pulled(d, lambda got: [x for x in got if x[0] not in before], len(seeds) * ranks)
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
    lines = wait_pulled(d, lambda got: [x for x in got if x[0] == params["mooncake_transfer_id"]], ranks)
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


def tp_logs(tiny_model, tmp_path_factory, name: str):
    """A log folder for a TP module's servers, once the tiny model is checked to split: TP 2 puts
    one KV head on each rank, so it needs >= 2 (scripts/make_tiny_model.py)."""
    cfg = json.loads((tiny_model / "config.json").read_text())
    assert cfg["num_key_value_heads"] >= 2, "TP 2 needs a model with >= 2 KV heads (scripts/make_tiny_model.py)"
    return tmp_path_factory.mktemp(name)
