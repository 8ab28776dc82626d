"""The lab: process harness shared by the tests (tests/) and the benchmarks (bench/).

Real peers, masters, store workers, framework servers in their venvs, the chaos cluster and the
fuzz surfaces, started and stopped the same way whether a test asserts on them or a bench times
them. It lives in the checkout only: it is not part of the wheel (pyproject lists only the
``mooncake_*`` runtime packages), because it starts processes from this source tree
(``tests/``, ``scripts/``) and the framework venvs, which an installed wheel does not have.

Importable from the repository root: ``python3 -m pytest`` and ``python3 -m bench.<role>.<bench>``
put it on ``sys.path`` (pytest's ``pythonpath`` setting does too); subprocesses in other venvs get
it through :func:`mooncake_lab.checkout_shim.shim_pythonpath` or :data:`REPO` on ``PYTHONPATH``.
Stdlib-only at this level: the chaos workers import it under the original Mooncake's venv.
"""

from __future__ import annotations

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def repo_pythonpath(rest: str | None = None) -> str:
    """``PYTHONPATH`` with the checkout first, so a subprocess imports ``mooncake_lab`` from it."""
    rest = os.environ.get("PYTHONPATH") if rest is None else rest
    return os.pathsep.join([REPO] + [p for p in [rest] if p])
