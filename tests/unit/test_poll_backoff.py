"""The busy-poll back-off policy (``mooncake_core.utils.poll_backoff``): when a wait polls,
how misses back it off, and how back-to-back traffic ends a back-off early (issue 18)."""

from __future__ import annotations

import pytest

from mooncake_core.utils.poll_backoff import MAX_MISSES, RECOVER_AFTER, RECOVER_FACTOR, PollBackoff

SPIN = 100e-6


def polls_in(b: PollBackoff, waits: int, skipped_wait: float | None = None) -> list[bool]:
    """Which of the next ``waits`` waits poll; each poll misses, each skipped wait is reported
    as ending after ``skipped_wait`` seconds (None: not reported)."""
    out = []
    for _ in range(waits):
        p = b.should_poll()
        out.append(p)
        if p:
            b.record(False)
        elif skipped_wait is not None:
            b.skipped(skipped_wait)
    return out


def backed_off_fully(b: PollBackoff) -> PollBackoff:
    """Drive ``b`` to its longest back-off: MAX_MISSES misses in a row, slow waits between."""
    misses = 0
    while misses < MAX_MISSES:
        if b.should_poll():
            b.record(False)
            misses += 1
        else:
            b.skipped(1.0)
    assert b.backed_off == (1 << MAX_MISSES) - 1
    return b


def test_misses_back_off_exponentially_and_a_hit_resets() -> None:
    b = PollBackoff(SPIN)
    # each miss skips 1, 3, 7, ... waits: polls at waits 0, 2, 6, 14, 30, 62, then every 64th
    got = polls_in(b, 200)
    assert [i for i, p in enumerate(got) if p] == [0, 2, 6, 14, 30, 62, 126, 190]
    while not b.should_poll():
        pass
    b.record(True)
    assert all(b.should_poll() for _ in range(5))  # a hit: every wait polls again


def test_spin_zero_never_polls() -> None:
    b = PollBackoff(0.0, recover_s=1.0)
    assert not any(polls_in(b, 10, skipped_wait=0.0))


def test_back_to_back_waits_end_a_back_off() -> None:
    """At the longest back-off (63 of 64 waits block), RECOVER_AFTER skipped waits in a row
    that ended within the recovery window make the next wait poll."""
    b = backed_off_fully(PollBackoff.recovering(SPIN))
    assert b.recover_s == pytest.approx(SPIN * RECOVER_FACTOR)
    for _ in range(RECOVER_AFTER - 1):
        assert not b.should_poll()
        b.skipped(SPIN * 1.5)  # a blocking wait: the wake-up on top of a gap within the spin
    assert not b.should_poll()
    b.skipped(SPIN * 1.5)
    assert b.backed_off == 0 and b.should_poll()
    b.record(True)
    assert b.should_poll()


def test_a_slow_wait_restarts_the_count() -> None:
    b = backed_off_fully(PollBackoff.recovering(SPIN))
    pattern = [SPIN, SPIN, 1e-3] * 10  # never RECOVER_AFTER near ones in a row
    for w in pattern:
        assert not b.should_poll()
        b.skipped(w)
    assert b.backed_off == (1 << MAX_MISSES) - 1 - len(pattern)


def test_a_poll_in_between_restarts_the_count() -> None:
    b = PollBackoff.recovering(SPIN)
    assert b.should_poll()
    b.record(False)  # skip 1
    assert not b.should_poll()
    b.skipped(SPIN)  # one near wait ...
    assert b.should_poll()
    b.record(False)  # ... then a poll (miss, skip 3): the streak starts again
    for _ in range(RECOVER_AFTER - 1):
        assert not b.should_poll()
        b.skipped(SPIN)
    assert b.backed_off == 3 - (RECOVER_AFTER - 1)


def test_without_a_recovery_window_only_a_hit_ends_a_back_off() -> None:
    b = backed_off_fully(PollBackoff(SPIN))
    assert not any(polls_in(b, 63, skipped_wait=0.0))
    assert b.should_poll()


def test_polls_stay_bounded_when_gaps_sit_just_above_the_poll_window() -> None:
    """Waits that look near but whose polls still miss (the peer answers just after the spin):
    at most one poll in RECOVER_AFTER + 1 waits -- the CPU bound of the recovery."""
    b = PollBackoff.recovering(SPIN)
    got = polls_in(b, 1000, skipped_wait=SPIN * 1.5)
    assert sum(got) <= 1000 // (RECOVER_AFTER + 1) + MAX_MISSES
    assert sum(got) >= 1000 // (RECOVER_AFTER + 1) - 1  # and it keeps trying


def test_an_idle_peer_keeps_the_longest_back_off() -> None:
    """Slow peers (every gap past the window) see the plain back-off: one poll in 64."""
    b = PollBackoff.recovering(SPIN)
    got = polls_in(b, 64 * 20, skipped_wait=SPIN * RECOVER_FACTOR * 1.01)
    assert sum(got) <= MAX_MISSES + 20


@pytest.mark.parametrize("args", [(-1.0,), (SPIN, -1.0), (SPIN, SPIN, 0)])
def test_bad_settings_are_refused(args: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="PollBackoff"):
        PollBackoff(*args)  # type: ignore[arg-type]
