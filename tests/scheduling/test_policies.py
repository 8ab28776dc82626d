"""Scheduling policies on handmade cluster states (pure: no sockets, no clock)."""

from __future__ import annotations

import copy

import pytest

from mooncake_proxy.scheduling import SchedulerSettings
from mooncake_proxy.scheduling import (POLICIES, ClusterState, CostModel, Decision, HandoffQueue, InstanceInfo,
                                       PrefillPlan, Rejection, RequestInfo, SloConfig, TtftErrorQuantile,
                                       make_scheduler)

BS = 4  # tokens per block in these tests
# 1 ms per prefill token, no attention term; decode step 10 ms + 1 ms/request; transfer 1 ms/block.
COST = CostModel(c0=0.0, c1=0.001, c2=0.0, d0=0.01, d1=0.001, d2=0.0, transfer_latency_s=0.0,
                 bytes_per_token=1.0, bandwidth_bytes_per_s=4000.0, block_size=BS, name="test")
BLOCKS = list(range(1, 11))  # a 40-token prompt = 10 full blocks


def req(rid: str = "r", tokens: int = 40, blocks=None, out: int = 10) -> RequestInfo:
    return RequestInfo(rid, tokens, list(BLOCKS if blocks is None else blocks), max_output_tokens=out)


def cluster(n_prefill: int = 3, n_decode: int = 2, store: int | None = None) -> ClusterState:
    cl = ClusterState(block_size=BS, store_capacity_blocks=store)
    for i in range(n_prefill):
        cl.add_instance(InstanceInfo(f"p{i}", "prefill"))
    for i in range(n_decode):
        cl.add_instance(InstanceInfo(f"d{i}", "decode"))
    return cl


def busy(cl: ClusterState, inst: str, seconds: float, now: float = 0.0) -> None:
    """Queue a request of ``seconds`` of prefill work (1 ms/token) on ``inst``."""
    n = round(seconds / COST.c1)
    cl.on_prefill_start(inst, RequestInfo(f"busy-{inst}-{n}", n, [1000 + n]), now, cached_blocks=0)


def test_conductor_prefers_instance_with_prefix_hits() -> None:
    cl = cluster()
    cl.record_blocks("p1", BLOCKS[:8])
    d = make_scheduler("conductor", cl, COST).schedule(req(), now=0.0)
    assert isinstance(d, Decision)
    assert d.prefill_id == "p1" and d.cached_blocks == 8 and d.remote_source is None and d.remote_blocks == 0
    assert d.est_ttft_s == pytest.approx(0.008)  # 8 uncached tokens
    # Slightly busy holder still wins: 5 ms queue + 8 ms < fetch 8 ms + 8 ms elsewhere.
    busy(cl, "p1", 0.005)
    d = make_scheduler("conductor", cl, COST).schedule(req(), now=0.0)
    assert d.prefill_id == "p1" and d.est_ttft_s == pytest.approx(0.013) and d.est_queue_s == pytest.approx(0.005)


def test_conductor_bypasses_busy_holder_and_fetches_prefix() -> None:
    cl = cluster()
    cl.record_blocks("p1", BLOCKS[:8])
    busy(cl, "p1", 1.0)
    d = make_scheduler("conductor", cl, COST).schedule(req(), now=0.0)
    assert d.prefill_id in ("p0", "p2")
    assert d.remote_source == "p1" and d.remote_blocks == 8 and d.cached_blocks == 8
    assert d.est_ttft_s == pytest.approx(COST.transfer_time(8) + COST.prefill_time(8, 32))
    assert d.est_ttft_s == pytest.approx(0.016)
    # The local cache-aware policy cannot fetch: it recomputes all 40 tokens on an idle node.
    c = make_scheduler("cache_aware", cl, COST).schedule(req(), now=0.0)
    assert c.prefill_id in ("p0", "p2") and c.remote_source is None and c.cached_blocks == 0
    assert c.est_ttft_s == pytest.approx(0.040)


def test_without_peer_fetch_the_conductor_plans_only_store_loads() -> None:
    # The live proxy (peer_fetch False): the engines load prefixes from the store, never from a
    # peer, so a busy holder's copy is no fetch source -- and with the store holding the same
    # blocks the plan names the store (the hint the connector acts on), not the peer.
    cl = cluster(store=0)
    cl.peer_fetch = False
    cl.record_blocks("p1", BLOCKS[:8])
    busy(cl, "p1", 1.0)
    d = make_scheduler("conductor", cl, COST).schedule(req(), now=0.0)
    assert isinstance(d, Decision) and d.prefill_id in ("p0", "p2")
    assert d.remote_source is None and d.cached_blocks == 0 and d.est_ttft_s == pytest.approx(0.040)
    cl.store_record(BLOCKS[:8])
    d = make_scheduler("conductor", cl, COST).schedule(req(), now=0.0)
    assert isinstance(d, Decision) and d.remote_source == "store" and d.remote_blocks == 8
    cl.peer_fetch = True  # the simulator's engines: the peer ties with the store and is named
    d = make_scheduler("conductor", cl, COST).schedule(req(), now=0.0)
    assert isinstance(d, Decision) and d.remote_source == "p1"


def test_live_peer_fetch_waits_for_the_holders_export() -> None:
    # --peer-prefix: the holder answers an export request once the step it runs now ends (vLLM
    # batches the small export into its next step), and only then is the chosen prefill sent the
    # request. Behind a 1 s prefill that is slower than recomputing 40 tokens elsewhere (40 ms).
    cl = cluster()
    cl.peer_export_waits = True
    cl.record_blocks("p1", BLOCKS[:8])
    busy(cl, "p1", 1.0)
    d = make_scheduler("conductor", cl, COST).schedule(req(), now=0.0)
    assert isinstance(d, Decision) and d.prefill_id in ("p0", "p2")
    assert d.remote_source is None and d.est_ttft_s == pytest.approx(0.040)
    # A 10 ms head with 1 s queued behind it: the export (10 ms + its 4 ms last block) comes long
    # before the holder could run the request, and beats the recompute: 14 + 8 fetch + 8 ms.
    cl = cluster()
    cl.peer_export_waits = True
    cl.record_blocks("p1", BLOCKS[:8])
    busy(cl, "p1", 0.01)
    busy(cl, "p1", 1.0)
    d = make_scheduler("conductor", cl, COST).schedule(req(), now=0.0)
    assert isinstance(d, Decision) and d.prefill_id in ("p0", "p2") and d.remote_source == "p1"
    assert d.est_ttft_s == pytest.approx(0.010 + COST.prefill_time(BS, 7 * BS) + 0.008 + 0.008)


def test_conductor_partial_local_plus_remote_and_head_progress() -> None:
    cl = cluster(n_prefill=2)
    cl.record_blocks("p0", BLOCKS[:3])
    cl.record_blocks("p1", BLOCKS[:9])
    busy(cl, "p1", 1.0, now=0.0)
    # At now=0.999 only 1 ms of p1's head request remains: 1 ms + 4 ms beats p0 fetching
    # 6 blocks (6 ms) + 4 ms.
    d = make_scheduler("conductor", cl, COST).schedule(req(), now=0.999)
    assert d.prefill_id == "p1" and d.est_ttft_s == pytest.approx(0.005)
    # At now=0.5 p1 is busy for 0.5 s more: p0 keeps its 3 blocks and fetches 6 more.
    d = make_scheduler("conductor", cl, COST).schedule(req(), now=0.5)
    assert d.prefill_id == "p0" and d.remote_source == "p1" and d.remote_blocks == 6 and d.cached_blocks == 9
    assert d.est_ttft_s == pytest.approx(COST.transfer_time(6) + COST.prefill_time(4, 36))


def test_conductor_recomputes_when_transfer_is_slower() -> None:
    slow_net = CostModel(**{**COST.to_dict()["prefill"], **COST.to_dict()["decode"]}, transfer_latency_s=0.0,
                         bytes_per_token=1.0, bandwidth_bytes_per_s=100.0, block_size=BS)  # 40 ms/block
    cl = cluster()
    cl.record_blocks("p1", BLOCKS[:8])
    busy(cl, "p1", 1.0)
    d = make_scheduler("conductor", cl, slow_net).schedule(req(), now=0.0)
    assert d.prefill_id != "p1" and d.remote_source is None and d.cached_blocks == 0


def test_conductor_fetches_from_store() -> None:
    cl = cluster(store=0)
    cl.store_record(BLOCKS[:10])
    d = make_scheduler("conductor", cl, COST).schedule(req(), now=0.0)
    assert d.remote_source == "store" and d.remote_blocks == 10 and d.cached_blocks == 10
    # 40 tokens all cached -> 1 token recomputed (engines need the last token's logits).
    assert d.est_ttft_s == pytest.approx(COST.transfer_time(10) + COST.prefill_time(1, 40))


def test_cache_aware_uses_local_hits_unless_queue_too_long() -> None:
    cl = cluster()
    cl.record_blocks("p2", BLOCKS[:10])
    s = make_scheduler("cache_aware", cl, COST)
    d = s.schedule(req(), now=0.0)
    assert d.prefill_id == "p2" and d.cached_blocks == 10 and d.remote_blocks == 0
    busy(cl, "p2", 0.5)
    assert s.schedule(req(), now=0.0).prefill_id in ("p0", "p1")


def test_load_balance_ignores_prefix_and_picks_least_queue() -> None:
    cl = cluster()
    cl.record_blocks("p0", BLOCKS)
    busy(cl, "p0", 0.05)
    busy(cl, "p1", 0.02)
    busy(cl, "p2", 0.03)
    d = make_scheduler("load_balance", cl, COST).schedule(req(), now=0.0)
    assert d.prefill_id == "p1" and d.cached_blocks == 0 and d.est_queue_s == pytest.approx(0.02)
    # Same queue everywhere: it still uses the chosen instance's local hits in its estimate.
    cl2 = cluster(n_prefill=1)
    cl2.record_blocks("p0", BLOCKS[:5])
    d = make_scheduler("load_balance", cl2, COST).schedule(req(), now=0.0)
    assert d.cached_blocks == 5 and d.est_ttft_s == pytest.approx(0.020)


def test_round_robin_and_random() -> None:
    cl = cluster()
    rr = make_scheduler("round_robin", cl, COST)
    picks = [rr.schedule(req(str(i)), 0.0) for i in range(6)]
    assert [p.prefill_id for p in picks] == ["p0", "p1", "p2", "p0", "p1", "p2"]
    assert [p.decode_id for p in picks] == ["d0", "d1", "d0", "d1", "d0", "d1"]
    r1 = make_scheduler("random", cl, COST, seed=3)
    r2 = make_scheduler("random", cl, COST, seed=3)
    a = [(d.prefill_id, d.decode_id) for d in (r1.schedule(req(str(i)), 0.0) for i in range(300))]
    b = [(d.prefill_id, d.decode_id) for d in (r2.schedule(req(str(i)), 0.0) for i in range(300))]
    assert a == b
    assert {p for p, _ in a} == {"p0", "p1", "p2"} and {d for _, d in a} == {"d0", "d1"}
    assert max(sum(1 for p, _ in a if p == x) for x in ("p0", "p1", "p2")) < 150  # not stuck on one


def test_decode_chosen_by_predicted_tbt() -> None:
    cl = cluster()
    for i in range(5):
        cl.on_decode_start("d0", req(f"x{i}"), 0.0)
    cl.on_decode_start("d1", req("y"), 0.0)
    for pol in ("load_balance", "cache_aware", "conductor"):
        d = make_scheduler(pol, cl, COST).schedule(req(), now=0.0)
        assert d.decode_id == "d1", pol
        assert d.est_tbt_s == pytest.approx(COST.decode_step_time(2, 0))


def test_ttft_slo_rejection() -> None:
    cl = cluster()
    for p in ("p0", "p1", "p2"):
        busy(cl, p, 2.0)
    s = make_scheduler("conductor", cl, COST, SloConfig(ttft_s=1.0, retry_after_s=3.0))
    r = s.schedule(req(), now=0.0)
    assert isinstance(r, Rejection)
    assert "TTFT" in r.reason and r.retry_after_s == 3.0
    assert r.est_ttft_s == pytest.approx(2.04)
    # Once the queue has drained enough, the same request is admitted.
    assert isinstance(s.schedule(req(), now=1.5), Decision)


def test_ttft_slo_adds_the_decode_first_token_delay() -> None:
    cl = cluster(n_decode=1)
    s = make_scheduler("conductor", cl, COST, SloConfig(ttft_s=1.0))
    assert isinstance(s.schedule(req(), now=0.0), Decision)  # 40 ms of prefill
    cl.decode_load("d0").first_token_s = 0.99  # measured by the live proxy (--calibrate)
    r = s.schedule(req(), now=0.0)
    assert isinstance(r, Rejection) and r.est_ttft_s == pytest.approx(1.03)
    assert "then 0.990s to decode 'd0'" in r.reason


def test_ttft_slo_counts_the_hand_off_queue_without_any_feedback() -> None:
    # The decode's hand-off stage takes 0.3 s per request (learned from one request). Requests
    # admitted and still in prefill or waiting for their first token are ahead of a new one, so
    # the TTFT check rejects once (queued + 1) x 0.3 s passes the SLO -- before any of them answered.
    cl = cluster(n_prefill=1, n_decode=1)
    hq = cl.decode_load("d0").handoff = HandoffQueue()
    hq.handed_off("warm", 0.0)
    assert hq.first_token("warm", 0.3) == pytest.approx(0.3)
    s = make_scheduler("conductor", cl, COST, SloConfig(ttft_s=1.0))
    admitted = []
    for i in range(6):
        d = s.schedule(req(f"r{i}", blocks=[100 + i]), now=1.0)
        if isinstance(d, Rejection):
            assert "to decode 'd0'" in d.reason and d.est_ttft_s == pytest.approx(1.2)
            break
        cl.on_scheduled(d, req(f"r{i}", blocks=[100 + i]), 1.0)
        admitted.append(d)
    assert len(admitted) == 3  # first tokens predicted at 0.3, 0.6, 0.9 s; the 4th at 1.2 s
    # a stalled pull: the oldest handed-off request is 2 s past its service time -> all wait
    cl2 = cluster(n_prefill=1, n_decode=1)
    hq2 = cl2.decode_load("d0").handoff = HandoffQueue()
    hq2.handed_off("warm", 0.0)
    hq2.first_token("warm", 0.1)
    hq2.handed_off("stuck", 1.0)
    s2 = make_scheduler("conductor", cl2, COST, SloConfig(ttft_s=1.0))
    assert isinstance(s2.schedule(req(), now=1.5), Decision)
    r = s2.schedule(req(), now=3.1)
    assert isinstance(r, Rejection) and r.est_ttft_s == pytest.approx(2.0 + 0.2)


def test_ttft_check_adds_the_pairs_error_margin_and_tries_the_other_prefill() -> None:
    # The policy's first choice is p0 (it holds the prefix), but its requests kept arriving ~1 s
    # after the prediction (say the decode shares its core): with the margin p0 breaks a 1 s SLO,
    # so the request goes to p1, which has to recompute the prefix but meets it.
    cl = cluster(n_prefill=2, n_decode=1)
    cl.record_blocks("p0", BLOCKS)
    errs = cl.ttft_errors = TtftErrorQuantile()
    s = make_scheduler("cache_aware", cl, COST, SloConfig(ttft_s=1.0))
    d = s.schedule(req(), now=0.0)
    assert isinstance(d, Decision) and d.prefill_id == "p0"
    assert d.est_first_token_s == pytest.approx(0.001)  # fed back against the observed TTFT
    for _ in range(3):
        errs.observe("p0", "d0", 0.001, 1.05, now=0.0)
    d = s.schedule(req(), now=1.0)
    assert isinstance(d, Decision) and d.prefill_id == "p1" and d.cached_blocks == 0
    assert d.est_first_token_s == pytest.approx(0.04)
    # both pairs late: a 429 that names the margin and says the others were tried
    for _ in range(3):
        errs.observe("p1", "d0", 0.04, 1.5, now=1.0)
    r = s.schedule(req(), now=1.0)
    assert isinstance(r, Rejection) and "margin 1.049s from its recent errors" in r.reason
    assert "none of the other 1 prefill instance(s) does better" in r.reason
    assert r.est_ttft_s == pytest.approx(1.05)
    # without the error model (the simulator) the margin is 0 and nothing changes
    cl.ttft_errors = None
    assert isinstance(s.schedule(req(), now=1.0), Decision)


def test_conductor_ranks_pairs_by_their_known_error_and_falls_back_on_the_faded_one() -> None:
    # The live bench: p1 shares the decode's core and its requests came ~1 s late. Long after,
    # the check's faded margin no longer holds that against p1, and ranking by queue + prefill alone
    # would send it every other request (a tie with an idle p0). Ranked by the unfaded margin it
    # gets a request only when p0 would be later; the faded margin still admits it as a fallback.
    cl = cluster(n_prefill=2, n_decode=1)
    errs = cl.ttft_errors = TtftErrorQuantile()
    for _ in range(2):
        errs.observe("p1", "d0", 0.04, 1.04, now=0.0)
    assert errs.margin("p1", "d0", 100.0) < 0.01 and errs.margin("p1", "d0", 100.0, fade=False) == pytest.approx(1.0)
    slo = SloConfig(ttft_s=2.0)
    conductor = make_scheduler("conductor", cl, COST, slo)
    picks = [conductor.schedule(req(f"r{i}"), now=100.0) for i in range(6)]
    assert all(isinstance(d, Decision) and d.prefill_id == "p0" for d in picks)
    lb = make_scheduler("load_balance", cl, COST, slo)  # ranks by queue only: ties rotate onto p1
    assert any(getattr(lb.schedule(req(f"l{i}"), now=100.0), "prefill_id", None) == "p1" for i in range(6))
    busy(cl, "p0", 0.5, now=100.0)  # p0 0.54 s vs p1 0.04 + 1.0: still p0
    conductor.queue_time("p0", 100.0)
    d = conductor.schedule(req("q"), now=100.0)
    assert isinstance(d, Decision) and d.prefill_id == "p0"
    busy(cl, "p0", 1.0, now=100.0)  # p0 1.54 s: now p1's known second is the better bet
    d = conductor.schedule(req("q2"), now=100.0)
    assert isinstance(d, Decision) and d.prefill_id == "p1" and d.est_first_token_s == pytest.approx(0.04)
    # a pair known to cost 3 s ranks last, but with p0 past a 1 s SLO the check falls back to it
    for _ in range(2):
        errs.observe("p1", "d0", 0.04, 3.04, now=0.0)
    strict = make_scheduler("conductor", cl, COST, SloConfig(ttft_s=1.0))
    d = strict.schedule(req("q3"), now=100.0)
    assert isinstance(d, Decision) and d.prefill_id == "p1"
    r = strict.schedule(req("q4"), now=20.0)  # before the fade: p1's 3 s margin holds, a 429
    assert isinstance(r, Rejection)


def test_ttft_check_sees_a_prefill_running_past_its_estimate() -> None:
    # queue_time counts a head that overran its estimate as done, so a stalled prefill engine looks
    # idle; the TTFT check expects it to need as long again as it is late, and routes around it.
    cl = cluster(n_prefill=2, n_decode=1)
    busy(cl, "p0", 0.5, now=0.0)
    s = make_scheduler("load_balance", cl, COST, SloConfig(ttft_s=1.0))
    s.queue_time("p0", 0.0)  # attaches the 0.5 s estimate
    assert s.prefill_lateness("p0", 0.4) == 0.0 and s.prefill_lateness("p0", 3.0) == pytest.approx(2.5)
    assert s.prefill_lateness("p1", 3.0) == 0.0
    d = s.schedule(req(), now=3.0)  # load_balance's first choice (rotating tie) either way: p1 meets it
    assert isinstance(d, Decision) and d.prefill_id == "p1"
    busy(cl, "p1", 0.5, now=0.0)
    s.queue_time("p1", 0.0)
    r = s.schedule(req(), now=3.0)  # 2.5 s late, and the new request's 0.04 s at 6x (prefill_slowdown)
    assert isinstance(r, Rejection) and r.est_ttft_s == pytest.approx(2.5 + 6 * 0.04)


def test_ttft_check_scales_the_queue_behind_a_late_head_by_its_slowdown() -> None:
    # A burst on a contended instance: its head, estimated 0.3 s, has run 0.9 s and three requests
    # wait behind it. Nothing has answered, so no calibration sample exists yet; but the head is
    # a censored sample: the instance runs at least 3x its estimates, so the 0.902 s queued behind
    # it will take ~2.7 s. Adding the head's lateness alone (0.6 s) would admit under a 2 s SLO.
    cl = cluster(n_prefill=1, n_decode=1)
    for t, secs in ((0.0, 0.3), (0.1, 0.301), (0.2, 0.299), (0.3, 0.302)):
        busy(cl, "p0", secs, now=t)
    s = make_scheduler("load_balance", cl, COST, SloConfig(ttft_s=2.0))
    s.queue_time("p0", 0.0)
    assert s.prefill_slowdown("p0", 0.25) == 1.0 and s.prefill_slowdown("p0", 0.9) == pytest.approx(3.0)
    d = s.schedule(req("early"), now=0.25)  # not late yet: 0.05 + 0.902 + 0.04 s
    assert isinstance(d, Decision) and d.est_first_token_s == pytest.approx(0.05 + 0.902 + 0.04)
    r = s.schedule(req("late"), now=0.9)
    assert isinstance(r, Rejection) and r.est_ttft_s == pytest.approx(0.6 + 3 * (0.902 + 0.04))
    assert "at 3.0x its estimate" in r.reason


def test_tbt_slo_rejection() -> None:
    cl = cluster(n_decode=1)
    for i in range(4):
        cl.on_decode_start("d0", req(f"x{i}"), 0.0)
    # 5 requests -> 15 ms per step.
    r = make_scheduler("load_balance", cl, COST, SloConfig(tbt_s=0.0145)).schedule(req(), now=0.0)
    assert isinstance(r, Rejection) and "TBT" in r.reason and "d0" in r.reason
    assert r.est_tbt_s == pytest.approx(0.015)
    assert isinstance(make_scheduler("load_balance", cl, COST, SloConfig(tbt_s=0.0155)).schedule(req(), 0.0), Decision)


def test_prediction_admits_when_running_decodes_will_have_finished() -> None:
    cl = cluster(n_decode=1)
    cl.on_decode_start("d0", req("a", out=10), 0.0)
    cl.on_decode_start("d0", req("b", out=10), 0.0)
    # Now: 3 requests -> 13 ms > 12.5 ms. But a and b end at ~10 x 12 ms = 0.12 s, before
    # this request's prefill ends (0.1 + 0.04 s): the projected batch is just this request.
    plain = make_scheduler("conductor", cl, COST, SloConfig(tbt_s=0.0125))
    predictive = make_scheduler("conductor", cl, COST, SloConfig(tbt_s=0.0125, prediction_horizon_s=10.0))
    assert isinstance(plain.schedule(req(), now=0.1), Rejection)
    d = predictive.schedule(req(), now=0.1)
    assert isinstance(d, Decision) and d.est_tbt_s == pytest.approx(0.011)
    # With a horizon shorter than the prefill, the projection stops early and still sees a, b.
    short = make_scheduler("conductor", cl, COST, SloConfig(tbt_s=0.0125, prediction_horizon_s=0.01))
    assert isinstance(short.schedule(req(), now=0.1), Rejection)


def test_prediction_rejects_when_prefills_in_flight_head_to_decode() -> None:
    cl = cluster(n_decode=1)
    for i in range(3):
        cl.on_prefill_start("p0", req(f"in{i}"), 0.0, decode_id="d0")
    plain = make_scheduler("conductor", cl, COST, SloConfig(tbt_s=0.0125))
    predictive = make_scheduler("conductor", cl, COST, SloConfig(tbt_s=0.0125, prediction_horizon_s=10.0))
    assert isinstance(plain.schedule(req(), now=0.0), Decision)  # decode looks idle right now
    r = predictive.schedule(req(), now=0.0)
    assert isinstance(r, Rejection) and "TBT" in r.reason and r.est_tbt_s == pytest.approx(0.014)


def test_no_healthy_instance_rejections() -> None:
    cl = cluster()
    for p in ("p0", "p1", "p2"):
        cl.set_healthy(p, False)
    for pol in POLICIES:
        r = make_scheduler(pol, cl, COST).schedule(req(), 0.0)
        assert isinstance(r, Rejection) and "no healthy prefill" in r.reason and "3 registered" in r.reason
    cl.set_healthy("p1", True)
    assert make_scheduler("conductor", cl, COST).schedule(req(), 0.0).prefill_id == "p1"
    cl2 = cluster(n_decode=0)
    r = make_scheduler("conductor", cl2, COST).schedule(req(), 0.0)
    assert isinstance(r, Rejection) and "no decode instance registered" in r.reason
    cl3 = cluster()
    cl3.set_healthy("d0", False)
    cl3.set_healthy("d1", False)
    r = make_scheduler("random", cl3, COST).schedule(req(), 0.0)
    assert "no healthy decode" in r.reason


def test_decode_kv_capacity() -> None:
    cl = ClusterState(block_size=BS)
    cl.add_instance(InstanceInfo("p0", "prefill"))
    cl.add_instance(InstanceInfo("d0", "decode", cache_capacity_blocks=15))  # 60 tokens of KV
    s = make_scheduler("conductor", cl, COST)
    first = s.schedule(req("a"), 0.0)
    assert isinstance(first, Decision)
    cl.on_decode_start("d0", req("a"), 0.0)  # holds 40 + 10/2 tokens
    r = s.schedule(req("b"), 0.0)
    assert isinstance(r, Rejection) and "KV room" in r.reason


def test_unknown_policy_lists_choices() -> None:
    with pytest.raises(ValueError) as e:
        make_scheduler("fastest", cluster())
    assert all(p in str(e.value) for p in POLICIES) and "fastest" in str(e.value)
    with pytest.raises(ValueError, match="no options"):
        make_scheduler("random", cluster(), replicate_hot=True)


@pytest.mark.parametrize("policy", POLICIES)
def test_schedule_does_not_mutate_cluster(policy: str) -> None:
    cl = cluster(store=0)
    cl.record_blocks("p1", BLOCKS[:6])
    busy(cl, "p0", 0.3)
    cl.on_decode_start("d0", req("x"), 0.0)
    before = (copy.deepcopy(cl._prefill), copy.deepcopy(cl._decode), {k: list(v) for k, v in cl._caches.items()})
    s = make_scheduler(policy, cl, COST)
    for i in range(5):
        assert isinstance(s.schedule(req(str(i)), now=0.1 * i), Decision)
    after = (cl._prefill, cl._decode, {k: list(v) for k, v in cl._caches.items()})
    # Duration estimates are memoised on the entries (est_s / est_sum), not load the caller
    # owns: normalise them away, everything else must be unchanged.
    for loads in (before[0], after[0]):
        for load in loads.values():
            for e in load.entries.values():
                e.est_s = -1.0
            load.est_sum, load.n_unknown = 0.0, len(load.entries)
    assert before == after


def test_on_scheduled_records_and_queues() -> None:
    cl = cluster()
    s = make_scheduler("conductor", cl, COST)
    r1 = req("r1")
    d1 = s.schedule(r1, 0.0)
    cl.on_scheduled(d1, r1, 0.0)
    p = d1.prefill_id
    assert cl.prefix_hit_blocks(p, BLOCKS) == 10
    assert list(cl.decode_load(d1.decode_id).incoming) == ["r1"]
    # r1's blocks are still being computed: nobody else can fetch them yet, so an idle
    # instance recomputes (40 ms) rather than waiting 40 ms + 1 ms behind r1.
    assert cl.best_remote_prefix(BLOCKS, exclude="zz") == (None, 0)
    d2 = s.schedule(req("r2"), 0.0)
    assert d2.prefill_id != p and d2.remote_source is None and d2.est_ttft_s == pytest.approx(0.040)
    # When the other instances are busy, queueing behind r1 on its instance reuses its blocks.
    for other in ("p0", "p1", "p2"):
        if other != p:
            busy(cl, other, 1.0)
    d3 = s.schedule(req("r3"), 0.0)
    assert d3.prefill_id == p and d3.cached_blocks == 10 and d3.est_queue_s == pytest.approx(0.040)
    assert d3.est_ttft_s == pytest.approx(0.040 + COST.prefill_time(1, 40))
    # Once r1's prefill is done its blocks become fetchable by other instances.
    cl.on_prefill_done(p, r1, 0.040)
    assert cl.best_remote_prefix(BLOCKS) == (p, 10)


def test_hot_prefix_replication_to_store() -> None:
    cl = cluster(store=0)
    s = make_scheduler("conductor", cl, COST, replicate_hot=True, hot_threshold=2)
    decisions = []
    for i in range(3):
        r = req(f"h{i}")
        d = s.schedule(r, float(i))
        cl.on_scheduled(d, r, float(i))
        decisions.append(d)
    assert decisions[0].replicate_blocks == 0  # nothing cached yet
    assert decisions[1].replicate_blocks == 0  # first hit
    assert decisions[2].replicate_blocks == 10  # second hit: hot
    assert cl.store_hit_blocks(BLOCKS) == 10
    # Without the flag nothing is replicated.
    cl2 = cluster(store=0)
    s2 = make_scheduler("conductor", cl2, COST)
    for i in range(3):
        r = req(f"h{i}")
        d = s2.schedule(r, float(i))
        cl2.on_scheduled(d, r, float(i))
        assert d.replicate_blocks == 0


def test_ttft_check_gives_a_request_that_would_queue_the_queued_class_margin() -> None:
    # Requests admitted behind others came 0.6 s late (the engine's batched step); idle ones on time.
    # With p0 busy, a new request fits the SLO there on the bare prediction but not with the queued
    # class's margin: the check sends it to the idle p1 rather than behind p0's head.
    cl = cluster(n_prefill=2, n_decode=1)
    errs = cl.ttft_errors = TtftErrorQuantile()
    for p in ("p0", "p1"):
        errs.observe(p, "d0", 0.3, 0.9, now=0.0, queued=True)
    s = make_scheduler("load_balance", cl, COST, SloConfig(ttft_s=0.5))
    busy(cl, "p0", 0.1, now=0.0)
    busy(cl, "p1", 0.1, now=0.0)
    r = s.schedule(req("both"), now=0.0)  # both queued: 0.14 s + 0.6 s margin > 0.5 s on either
    assert isinstance(r, Rejection) and "margin 0.600s" in r.reason
    cl.on_prefill_done("p1", RequestInfo("busy-p1-100", 100, [1100]), 0.0)
    d = s.schedule(req("idle"), now=0.0)
    assert isinstance(d, Decision) and d.prefill_id == "p1" and not d.waits_behind
    assert not s.waits_behind(PrefillPlan("p1", 0.1, 0.0, 0))  # the decision above is not running yet
    busy(cl, "p1", 0.1, now=0.0)
    assert s.waits_behind(PrefillPlan("p1", 0.1, 0.0, 0))  # a head past its estimate (queue 0) included
    errs.queued_class = False  # --no-ttft-margin-queued: the pairs' own margins (0) admit it behind p0
    d = s.schedule(req("off"), now=0.0)
    assert isinstance(d, Decision) and d.waits_behind


def test_a_queue_margin_holds_a_queued_request_to_its_predicted_wait_again() -> None:
    # Nothing learned yet (no margins), p0 busy for 0.3 s: behind it the request is predicted at
    # 0.34 s, within a 0.5 s SLO. With --ttft-queue-margin 1 its wait counts twice (0.64 s): the
    # check sends it to the idle p1 instead, and with both busy it answers 429.
    cl = cluster(n_prefill=2, n_decode=1)
    cl.ttft_errors = TtftErrorQuantile()
    busy(cl, "p0", 0.3, now=0.0)
    s = make_scheduler("load_balance", cl, COST, SloConfig(ttft_s=0.5))
    s.queue_time("p0", 0.0)
    plan = s.local_plan("p0", req("x"), 0.0)
    assert plan.est_queue_s == pytest.approx(0.3) and s._first_token(plan, "d0", 0.0)[1] == 0.0
    m = make_scheduler("load_balance", cl, COST, SloConfig(ttft_s=0.5), settings=SchedulerSettings(queue_margin=1.0))
    assert m._first_token(plan, "d0", 0.0)[1] == pytest.approx(0.3)
    assert m._first_token(m.local_plan("p1", req("y"), 0.0), "d0", 0.0)[1] == 0.0  # not queued: no margin
    picks = [m.schedule(req(f"r{i}"), now=0.0) for i in range(2)]
    assert all(isinstance(d, Decision) and d.prefill_id == "p1" for d in picks)  # never behind p0's head
    busy(cl, "p1", 0.3, now=0.0)
    r = m.schedule(req("z"), now=0.0)
    assert isinstance(r, Rejection) and "margin 0.300s" in r.reason
    assert isinstance(s.schedule(req("z2"), now=0.0), Decision)  # no queue margin
