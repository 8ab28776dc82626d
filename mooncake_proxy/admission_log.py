"""What the proxy logs (DEBUG ``admitted``) for each request it admits: the first token its TTFT
check predicted and what that prediction was made of.

Why a module of its own: the SLO bench (``bench/scheduling/bench_live_scheduling.py --overload``) pairs each of
these lines with the request's ``first token`` line to find where the admitted requests that missed
lost their time (queue, prefill, hand-off, margin); the fields are that contract, kept apart from
the request path in server.py.
"""

from __future__ import annotations

from .scheduling import ClusterState, Decision, RequestInfo

__all__ = ["admitted_fields"]


def admitted_fields(cluster: ClusterState, decision: Decision, req: RequestInfo, prefill_id: str,
                    decode_id: str, now: float) -> dict[str, object]:
    """The ``admitted`` line's fields (besides the request id): the chosen pair, the prefill and
    first-token estimates, the margin the check added (the queued class's when the request waits
    behind others, ttft_error.py), the queue, and the decode's hand-off backlog."""
    dl = cluster.decode_load(decode_id)
    return {
        "prefill": prefill_id, "est_prefill_s": round(decision.est_ttft_s, 3),
        "est_ttft_s": round(cluster.first_token_in(decode_id, now, decision.est_ttft_s, prefill_id), 3),
        "margin_s": round(cluster.ttft_margin(prefill_id, decode_id, now, queued=decision.waits_behind), 3),
        "first_token_s": round(decision.est_first_token_s, 3), "queue_s": round(decision.est_queue_s, 3),
        "behind": decision.waits_behind, "prompt_tokens": req.prompt_tokens,
        "cached_blocks": decision.cached_blocks,
        "handoff_pending": dl.handoff.pending if dl.handoff is not None else None,
        "in_prefill_to_decode": len(dl.incoming)}
