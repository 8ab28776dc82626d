"""The verdicts of mooncake_doctor's checks and its exit code (pure logic)."""

from __future__ import annotations

import json

import pytest

from mooncake_core.cli.doctor_checks import FAIL, OK, SKIP, WARN, Check, clock_check, exit_code, memlock_check, \
    render_json, render_text


def test_exit_code_fails_only_on_a_failed_check() -> None:
    ok, warn, skip = Check("a", OK, "x"), Check("b", WARN, "y", "do z"), Check("c", SKIP, "n/a")
    assert exit_code([ok, warn, skip]) == 0
    failed = Check("d", FAIL, "broken", "repair it")
    assert exit_code([ok, failed]) == 1
    text = render_text([ok, failed])
    assert "[FAIL] 2. d: broken" in text and "fix: repair it" in text and "1 check(s) failed: d" in text
    assert json.loads(render_json([ok, failed]))["ok"] is False


def test_a_failure_must_name_its_fix() -> None:
    with pytest.raises(ValueError, match="fix"):
        Check("x", FAIL, "broken")
    with pytest.raises(ValueError, match="status"):
        Check("x", "bad", "y")


def test_clock_and_memlock_verdicts() -> None:
    assert clock_check(0.01, 0.002).status == OK
    assert clock_check(2.0, 0.002).status == WARN
    assert clock_check(-10.0, 0.002).status == FAIL
    assert clock_check(0.6, 0.4).status == OK  # within the round trip's uncertainty
    assert clock_check(None, 0.0).status == SKIP
    assert memlock_check(-1, -1, "rdma").status == OK
    assert memlock_check(8 << 20, 8 << 20, "tcp").status == WARN
    c = memlock_check(8 << 20, 8 << 20, "rdma")
    assert c.status == FAIL and "ulimit -l" in c.fix
