"""MasterBackoff (mooncake_connectors/vllm/store_backoff.py): skip an unreachable master, retry with doubling waits."""

from __future__ import annotations

import pytest

from mooncake_connectors.vllm.store_backoff import MasterBackoff


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_backoff_doubles_caps_and_resets():
    c = Clock()
    b = MasterBackoff(1.0, 4.0, clock=c)
    assert b.allow() and b.healthy
    assert b.failed() == 1.0
    assert not b.allow() and not b.healthy
    c.t += 0.99
    assert not b.allow()
    c.t += 0.02
    assert b.allow()  # one retry once the back-off has passed
    assert [b.failed(), b.failed(), b.failed()] == [2.0, 4.0, 4.0]
    c.t += 3.9
    assert not b.allow()
    c.t += 0.2
    assert b.allow()
    assert b.ok() is True and b.healthy and b.allow()
    assert b.ok() is False  # already healthy: no "back" event
    assert b.failed() == 1.0  # a new outage starts from min_s again


def test_backoff_rejects_bad_bounds():
    with pytest.raises(ValueError, match="min_s"):
        MasterBackoff(0, 1)
    with pytest.raises(ValueError, match="min_s"):
        MasterBackoff(2, 1)
