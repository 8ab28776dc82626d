"""When a connector worker may sleep inside an engine step instead of returning at once (pure logic).

Why: vLLM 0.32 keeps stepping an engine that holds KV for a decode (requests whose blocks the
connector delays freeing) or waits for remote KV, and every such step has nothing to compute:
it exists only to poll the connector's ``get_finished``. With tensor parallelism each step is
a round trip engine core -> every TP worker -> engine core over vLLM's shared-memory queues,
whose readers spin (``sched_yield``) while messages keep coming. On a 2-core box the three
spinning processes of one TP 2 instance starved every other process of CPU: a decode rank
could not even run its first contact with the prefill -- nor could ``cat /proc/<pid>/stat`` --
until the prefill's lease ran out and its engine went idle (issue 19; every failed TP e2e
case). So on a step the scheduler saw nothing to run, a worker with transfers outstanding
and nothing to report waits -- woken by the Transfer Engine when a notification arrives or a
batch finishes, so a confirmation or ``ready`` is acted on as soon as it lands -- for at most
``idle_wait_s``: the step rate drops from thousands per second to a few dozen, and a request
arriving meanwhile waits at most that long for its first step.
"""

from __future__ import annotations

#: Default ``idle_wait_ms`` (``kv_connector_extra_config``): the longest a worker sleeps in a
#: step without work; 0 never sleeps (the busy polling vLLM does by itself).
IDLE_WAIT_MS = 50.0


def idle_wait_s(step_idle: bool, has_results: bool, has_pending: bool, wait_ms: float) -> float:
    """Seconds to wait for a Transfer Engine event before polling: only on a step without
    scheduled tokens (``step_idle``), with nothing to report yet (``has_results`` False) but
    transfers outstanding (``has_pending``: held KV, a ``ready`` awaited, reads running)."""
    if not step_idle or has_results or not has_pending or wait_ms <= 0:
        return 0.0
    return wait_ms / 1e3
