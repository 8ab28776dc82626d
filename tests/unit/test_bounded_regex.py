"""utils/bounded_regex: search semantics, clear errors, and a hard time budget."""

from __future__ import annotations

import time

import pytest

from mooncake_core.utils.bounded_regex import Matcher, PatternError, matching


def test_search_semantics_like_re() -> None:
    keys = ["model/a/1", "model/b/2", "other", "xmodel/"]
    assert matching(keys, "^model/", 1.0) == ["model/a/1", "model/b/2"]
    assert matching(keys, "model", 1.0) == ["model/a/1", "model/b/2", "xmodel/"]
    assert matching(keys, r"(?<=/)\d$", 1.0) == ["model/a/1", "model/b/2"]  # lookbehind kept (re syntax)


@pytest.mark.parametrize("bad", ["[", "(?P<x", 7, None])
def test_bad_pattern_names_it(bad) -> None:
    with pytest.raises(PatternError, match="remove_by_regex"):
        matching(["a"], bad, 1.0, what="remove_by_regex: pattern")


def test_backtracking_pattern_stops_at_the_budget() -> None:
    t = time.monotonic()
    with pytest.raises(PatternError, match="longer than 200 ms"):
        matching(["a" * 40 + "!"], "(a|aa)+$", 0.2)
    assert time.monotonic() - t < 10.0  # unbounded, this pattern runs for hours


def test_budget_is_shared_by_all_calls() -> None:
    now = [0.0]
    m = Matcher("k", 1.0, clock=lambda: now[0])
    assert m("k1")
    now[0] = 0.99
    assert not m("x")
    now[0] = 1.0
    with pytest.raises(PatternError, match="stopped at key 3"):
        m("k2")
