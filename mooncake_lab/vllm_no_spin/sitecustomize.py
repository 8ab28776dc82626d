"""Bench-only (``bench_vllm_pd.py --no-idle-spin``): vLLM processes started with this directory on
``PYTHONPATH`` stop spinning on their shared-memory queues after a message.

Why: vLLM 0.32's ``shm_broadcast.SpinCondition`` keeps each reader spinning on ``sched_yield`` for
``busy_loop_s`` (hard-coded 1 s) after every message. On a 2-core box two co-located instances
then take CPU from each other for the second after every request (docs/benchmarks-log.md, issue 19), a
cost of co-location, not of the hand-off. With this module the readers poll with a short timeout
instead (``BENCH_VLLM_SPIN_S``, default 0.002 s of spinning), for *every* mode of the bench alike,
so a run with and without it separates the two. Never used by the product.

It also lowers ``SHM_READER_RECHECK_INTERVAL_MS`` (5000 in vLLM 0.32) to ``BENCH_VLLM_RECHECK_MS``
(default 20). Why: an idle reader waits for the writer's ZMQ ping, and that ping is best-effort
(PUB with ``SNDHWM=1`` drops it silently, vllm-project/vllm#45224); a lost ping leaves the reader
asleep until the recheck -- 5 s. With a 2 ms spin readers go idle between nearly every message,
so they meet that race far more often than with vLLM's 1 s spin. A reader now rechecks the
shared-memory flag every 20 ms when no ping comes: a lost ping costs at most 20 ms. (The live
scheduling bench's 5-6 s prefill stalls did not all go with it: docs/benchmarks-log.md, issue 16.)
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_TARGET = "vllm.distributed.device_communicators.shm_broadcast"
_SPIN_S = float(os.environ.get("BENCH_VLLM_SPIN_S", "0.002"))
_RECHECK_MS = int(os.environ.get("BENCH_VLLM_RECHECK_MS", "20"))


def _patch(mod) -> None:
    cls = mod.SpinCondition
    orig = cls.__init__

    def __init__(self, is_reader, context, notify_address, busy_loop_s=1):  # noqa: ANN001
        orig(self, is_reader, context, notify_address, busy_loop_s=min(busy_loop_s, _SPIN_S))

    cls.__init__ = __init__
    recheck = ""
    if hasattr(mod, "SHM_READER_RECHECK_INTERVAL_MS"):  # read at each wait (ReadTimeoutWithWarnings)
        mod.SHM_READER_RECHECK_INTERVAL_MS = min(mod.SHM_READER_RECHECK_INTERVAL_MS, _RECHECK_MS)
        recheck = f", idle readers recheck every {mod.SHM_READER_RECHECK_INTERVAL_MS} ms"
    print(f"[bench no-idle-spin] pid {os.getpid()}: vLLM SpinCondition busy_loop_s <= {_SPIN_S}{recheck}",
          file=sys.stderr, flush=True)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # noqa: ANN001
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module) -> None:  # noqa: ANN001
            run(module)
            _patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _Finder())
