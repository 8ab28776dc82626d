"""When each request queued on a prefill instance is answered, if the engine batches its queue (pure).

vLLM (v1) and SGLang do not compute a prefill instance's queue one request at a time: each forward
step takes the waiting requests first come first served, up to a budget of tokens (vLLM's
``--max-num-batched-tokens``: 2048 on CPU, 8192 or more on GPUs), chunking a prompt that does not
fit, and a request is answered at the end of the step that computes its last token. So a request
whose last step has room left shares that step with the requests behind it, and is answered when
they are: on the live bench, 4-6 requests queued on one prefill came back together, the first of
them 2-5x later than a one-at-a-time (FIFO) queue estimate said.

That matters twice for the TTFT check. A request's own answer comes when the queue up to it is done,
as FIFO says (its own last step ends the queue). But admitting it can delay the requests already
queued -- every one whose last step it joins -- past *their* SLO, which a check of the new request
alone never sees. :func:`finish_offsets` gives each queued request's answer time under the budget;
the scheduler compares them with and without the new request (``Scheduler.queue_harm``; :func:`delays_by`
is that comparison as one call).

The step model: the queue's tokens in order, cut into steps of ``budget`` tokens starting at the head's
start; each step takes the time of its tokens (each request's estimate spread evenly over its tokens);
a request is answered at the end of the step holding its last token. ``budget`` 0: one request per step
(FIFO). The head's start is where the steps are aligned, which is exact when the instance was idle
before it and an approximation when the head joined a running step.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

__all__ = ["finish_offsets", "delays_by"]


def finish_offsets(tokens: Sequence[int], times: Sequence[float], budget: int) -> list[float]:
    """Seconds from the head's start until each queued request is answered, for requests of
    ``tokens`` tokens to compute taking ``times`` seconds each (alone), in queue order, on an engine
    whose forward steps take at most ``budget`` tokens (0: one request at a time)."""
    if len(tokens) != len(times):
        raise ValueError(f"finish_offsets: {len(tokens)} token counts but {len(times)} times")
    if budget < 0:
        raise ValueError(f"finish_offsets: budget must be >= 0 tokens, got {budget!r}")
    cum_tok: list[int] = []
    cum_t: list[float] = []
    c, t = 0, 0.0
    for n, s in zip(tokens, times):
        c += max(1, int(n))  # an engine computes at least one token per request (the last, for logits)
        t += max(0.0, float(s))
        cum_tok.append(c)
        cum_t.append(t)
    if budget == 0:
        return cum_t
    total = c
    out = []
    for k, ck in enumerate(cum_tok):
        end = min(total, -(-ck // budget) * budget)  # the end of the step holding k's last token
        out.append(cum_t[k] if end == ck else _time_at(end, cum_tok, cum_t, tokens, times))
    return out


def _time_at(pos: int, cum_tok: list[int], cum_t: list[float], tokens: Sequence[int],
             times: Sequence[float]) -> float:
    """Time at which the queue's first ``pos`` tokens are computed (linear within a request)."""
    j = bisect.bisect_left(cum_tok, pos)  # the request holding token ``pos``
    before_tok = cum_tok[j - 1] if j else 0
    before_t = cum_t[j - 1] if j else 0.0
    n = max(1, int(tokens[j]))
    return before_t + max(0.0, float(times[j])) * (pos - before_tok) / n


def delays_by(tokens: Sequence[int], times: Sequence[float], budget: int, new_tokens: int,
              new_time: float) -> list[float]:
    """How much later each queued request is answered once a request of ``new_tokens`` tokens
    (``new_time`` s alone) joins the end of the queue: > 0 only for those whose last step it shares
    (all 0 with ``budget`` 0)."""
    before = finish_offsets(tokens, times, budget)
    after = finish_offsets([*tokens, new_tokens], [*times, new_time], budget)
    return [a - b for a, b in zip(after, before)]
