"""The probe schedule and state transitions, without sockets (health_state.py is pure)."""

from __future__ import annotations

import pytest

from mooncake_proxy.health_state import HealthState, InstanceHealth, ProbePolicy, next_due


def test_starts_unknown_and_due_at_once() -> None:
    h = InstanceHealth()
    assert h.state is HealthState.UNKNOWN and not h.up and h.next_probe_at == 0.0
    assert "not answered" in h.describe()


def test_back_off_doubles_until_the_cap_then_interval_once_up() -> None:
    pol = ProbePolicy(interval=5.0, first_delay=0.05, retry_cap=1.0)
    h = InstanceHealth()
    now, delays = 100.0, []
    for _ in range(7):
        h.on_probe(False, "connect refused", now, pol)
        delays.append(round(h.next_probe_at - now, 3))
    assert delays == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert h.state is HealthState.DOWN and h.failures == 7 and "connect refused" in h.describe()
    assert h.on_probe(True, "", now, pol) is True
    assert h.up and h.failures == 0 and h.last_error == "" and h.next_probe_at == now + 5.0
    assert h.on_probe(True, "", now + 5, pol) is False  # no change, next probe one interval later
    assert h.next_probe_at == now + 10.0


def test_cap_never_exceeds_a_short_interval_and_zero_interval_stops_probing_up() -> None:
    assert ProbePolicy(interval=0.2).retry_delay(10) == 0.2
    off = ProbePolicy(interval=0)
    h = InstanceHealth()
    h.on_probe(False, "x", 0.0, off)
    assert h.next_probe_at == 0.05  # still retried quickly while down
    h.on_probe(True, "", 1.0, off)
    assert h.next_probe_at == float("inf")


def test_state_change_reported_once_and_since_stamped() -> None:
    pol = ProbePolicy()
    h = InstanceHealth()
    assert h.on_probe(False, "503", 1.0, pol) is True and h.since == 1.0
    assert h.on_probe(False, "503", 2.0, pol) is False and h.since == 1.0
    assert h.on_probe(True, "", 3.0, pol) is True and h.since == 3.0


def test_next_due_and_bad_policy() -> None:
    a, b = InstanceHealth(next_probe_at=3.0), InstanceHealth(next_probe_at=1.5)
    assert next_due([a, b]) == 1.5 and next_due([]) == float("inf")
    with pytest.raises(ValueError, match="interval"):
        ProbePolicy(interval=-1)


def test_late_answers_keep_an_up_instance_until_the_threshold() -> None:
    pol = ProbePolicy(interval=5.0, first_delay=0.05, retry_cap=1.0, timeouts_to_down=3)
    h = InstanceHealth()
    h.on_probe(True, "", 0.0, pol)
    assert h.on_probe(False, "/health timed out", 5.0, pol, timed_out=True) is False
    assert h.up and h.late == 1 and h.next_probe_at == 5.05 and "1 late" in h.describe()
    assert h.on_probe(False, "/health timed out", 5.05, pol, timed_out=True) is False
    assert h.up and h.late == 2 and h.next_probe_at == pytest.approx(5.15)
    # the third in a row takes it out, with the probe's reason
    assert h.on_probe(False, "/health timed out", 5.15, pol, timed_out=True) is True
    assert h.state is HealthState.DOWN and h.late == 0 and "timed out" in h.describe()


def test_an_answer_resets_the_late_count_and_a_refusal_counts_at_once() -> None:
    pol = ProbePolicy(timeouts_to_down=2)
    h = InstanceHealth()
    h.on_probe(True, "", 0.0, pol)
    h.on_probe(False, "late", 1.0, pol, timed_out=True)
    h.on_probe(True, "", 1.1, pol)
    assert h.up and h.late == 0
    h.on_probe(False, "late", 2.0, pol, timed_out=True)
    assert h.up  # one late answer again, not two in a row
    assert h.on_probe(False, "connection refused", 2.1, pol) is True and h.state is HealthState.DOWN


def test_a_timeout_before_the_first_answer_or_with_threshold_one_counts_at_once() -> None:
    h = InstanceHealth()
    assert h.on_probe(False, "late", 0.0, ProbePolicy(), timed_out=True) is True
    assert h.state is HealthState.DOWN
    strict = ProbePolicy(timeouts_to_down=1)
    h2 = InstanceHealth()
    h2.on_probe(True, "", 0.0, strict)
    assert h2.on_probe(False, "late", 1.0, strict, timed_out=True) is True and not h2.up
    with pytest.raises(ValueError, match="timeouts_to_down"):
        ProbePolicy(timeouts_to_down=0)
