"""The connector worker's idle wait (mooncake_connectors/vllm/idle.py) and the engine inbox it sleeps on
(no sockets): the wait happens only on a step without work, ends as soon as a notification or a
finished batch comes in, and never misses one that came in between two polls."""

from __future__ import annotations

import threading
import time

import pytest

from mooncake_connectors.vllm.idle import IDLE_WAIT_MS, idle_wait_s
from mooncake_core.transfer.notify import NotifyInbox, TransferNotify


@pytest.mark.parametrize("step_idle,results,pending,ms,want", [
    (True, False, True, 50.0, 0.05),    # nothing scheduled, nothing to report, a lease held: sleep
    (False, False, True, 50.0, 0.0),    # tokens scheduled: the model runs, never sleep
    (True, True, True, 50.0, 0.0),      # something to report now (a read done, a send confirmed)
    (True, False, False, 50.0, 0.0),    # nothing outstanding: nothing to wait for
    (True, False, True, 0.0, 0.0),      # idle_wait_ms 0: vLLM's own busy polling
])
def test_idle_wait_only_on_a_step_without_work(step_idle, results, pending, ms, want):
    assert idle_wait_s(step_idle, results, pending, ms) == pytest.approx(want)
    assert IDLE_WAIT_MS > 0


def test_inbox_wait_ends_at_a_notification_not_at_the_timeout():
    box = NotifyInbox()
    since = box.events()
    t = threading.Timer(0.05, box.put, ("tid", "done 0/1"))
    t.start()
    t0 = time.monotonic()
    assert box.wait(since, 5.0)
    assert time.monotonic() - t0 < 2.0
    assert box.drain() == [TransferNotify("tid", "done 0/1")]


def test_inbox_wait_ends_at_a_poke_and_times_out_without_one():
    box = NotifyInbox()
    since = box.events()
    t0 = time.monotonic()
    assert not box.wait(since, 0.05)
    assert time.monotonic() - t0 >= 0.04
    threading.Timer(0.02, box.poke).start()
    assert box.wait(since, 5.0)
    assert box.drain() == []  # a poke carries no notification


def test_inbox_wait_sees_what_came_in_after_the_count_was_taken():
    """The worker takes the count, then drains; a notification landing between the two (or before
    the next wait) must end the next wait at once -- else it would sit out the whole timeout."""
    box = NotifyInbox()
    since = box.events()
    box.put("tid", "want 127.0.0.1:1")  # arrives after the count, before the wait
    t0 = time.monotonic()
    assert box.wait(since, 5.0)
    assert time.monotonic() - t0 < 1.0
    box.drain()
    since = box.events()
    assert not box.wait(since, 0.01)  # drained and nothing new: sleeps the (short) timeout
