"""Fixtures: the shipped Mooncake traces (``../shared/traces`` next to the repo, or
``$MOONCAKE_TRACES``). A missing trace fails loudly rather than skipping the checks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_CANDIDATES = [Path(os.environ["MOONCAKE_TRACES"])] if os.environ.get("MOONCAKE_TRACES") else []
_CANDIDATES += [Path(__file__).resolve().parents[3] / "shared" / "traces", Path("/work/shared/traces")]


def _trace(name: str) -> Path:
    for d in _CANDIDATES:
        if (d / name).exists():
            return d / name
    pytest.fail(f"trace {name} not found in {[str(d) for d in _CANDIDATES]} (set MOONCAKE_TRACES)")


@pytest.fixture(scope="session")
def conversation_trace() -> Path:
    return _trace("conversation_trace.jsonl")


@pytest.fixture(scope="session")
def synthetic_trace() -> Path:
    return _trace("synthetic_trace.jsonl")
