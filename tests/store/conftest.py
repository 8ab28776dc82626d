"""Fixtures for store client tests (see helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_lab.store_procs import Master, Worker, make_client


@pytest.fixture
def master_factory(python_exe, tmp_path) -> Iterator[Any]:
    started: list[Master] = []

    def start(**flags: Any) -> Master:
        m = Master(python_exe, str(tmp_path), **flags).start()
        started.append(m)
        return m

    yield start
    for m in started:
        m.stop()


@pytest.fixture
def worker_factory(python_exe) -> Iterator[Any]:
    started: list[Worker] = []

    def start(master: Master, segment: int = 32 << 20, offload_dir: str = "") -> Worker:
        w = Worker(python_exe, master, segment, offload_dir)
        started.append(w)
        return w

    yield start
    for w in started:
        w.close()


@pytest.fixture
def client_factory() -> Iterator[Any]:
    made: list[Any] = []

    def make(master: Master, segment: int = 0, **extra: Any):
        c = make_client(master, segment, **extra)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()



@pytest.fixture
def cluster(master_factory, worker_factory, client_factory):
    """(master, worker with a 16 MiB segment, pool-only client, client with its own 16 MiB
    segment): every data path -- own-segment copy, transfer engine, cross-process reads."""
    m = master_factory(default_kv_lease_ttl=1500)
    w = worker_factory(m, 16 << 20)
    c = client_factory(m)
    d = client_factory(m, segment=16 << 20)
    return m, w, c, d
