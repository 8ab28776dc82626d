"""Fixtures for the fuzz tests: real server processes, and how many inputs to feed them.

``MOONCAKE_FUZZ_EXAMPLES`` (default 300) sets the hypothesis examples per surface; the bench
(``bench/robustness/bench_fuzz.py``) runs the same drivers for a million inputs each.
"""

from __future__ import annotations

import os
import random
from typing import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mooncake_core.utils.proc import close_piped
from mooncake_lab.fuzz.targets import TeTarget, start_te_target

EXAMPLES = int(os.environ.get("MOONCAKE_FUZZ_EXAMPLES", "300"))

FUZZ_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                HealthCheck.filter_too_much, HealthCheck.data_too_large])


def fuzz(one: Callable[[random.Random], object], check: Callable[[int], None] | None = None,
         every: int = 50) -> int:
    """Feed ``one`` hypothesis-drawn Randoms (FUZZ_SETTINGS examples); ``check(n)`` after every
    ``every`` inputs and once at the end. Returns the number of inputs fed."""
    seen = [0]

    @FUZZ_SETTINGS
    @given(st.randoms(use_true_random=False))
    def run(rng: random.Random) -> None:
        one(rng)
        seen[0] += 1
        if check is not None and seen[0] % every == 0:
            check(seen[0])

    run()
    if check is not None:
        check(seen[0])
    return seen[0]


@pytest.fixture
def te_target(python_exe) -> Iterator[TeTarget]:
    t = start_te_target(python_exe)
    yield t
    close_piped(t.proc)
