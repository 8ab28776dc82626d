"""A holder SIGKILLed: the puts right after it all succeed, placed on the live ones.

Its segment stays mounted at the master until its client_ttl, and random placement (the
default) keeps giving it its share of new puts; the writer's write there fails because the
peer is gone, and the writer puts those keys once more with ``avoid_segments`` naming it
(``WritePath._retry_elsewhere``). Single puts and a batch; the dead peer refuses the
connection (the engine marks it unreachable, not a refused request)."""

from __future__ import annotations

import logging
import signal

import pytest

from mooncake_lab.store_procs import payload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MiB = 1 << 20


def test_puts_after_a_holder_dies_all_succeed(master_factory, worker_factory, client_factory, caplog) -> None:
    m = master_factory(client_ttl=60)  # the dead holder's segment stays mounted throughout
    holders = [worker_factory(m, 16 * MiB) for _ in range(3)]
    c = client_factory(m)  # no segment of its own: every replica is a remote write
    assert c.put("warm", payload(1, 1000)) == 0  # the writer has met the master and placed once
    dead = holders[0]
    dead.proc.send_signal(signal.SIGKILL)
    dead.proc.wait()
    caplog.set_level(logging.INFO, logger="mooncake.store.client")
    want = {f"k{i}": payload(100 + i, 64 << 10) for i in range(40)}
    keys = list(want)
    for k in keys[:20]:
        assert c.put(k, want[k]) == 0, f"put {k} after a holder died"
    assert c.put_batch(keys[20:], [want[k] for k in keys[20:]]) == 0
    wrong = [k for k in keys if c.get(k) != want[k]]
    assert wrong == [], f"{len(wrong)} of 40 objects read back wrong or missing: {wrong[:5]}"
    # the dead segment was given puts (and they were placed again), not skipped by chance
    assert any("placing them elsewhere" in r.getMessage() and dead.hostname in r.getMessage()
               for r in caplog.records)
