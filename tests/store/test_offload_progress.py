"""A long SSD-tier offload sweep reports its progress through the structured logger: objects
written / queued, objects/s, ETA, bytes -- at a bounded rate -- and a final line with the totals
(a real master with the SSD tier, the test process as the segment owner that writes the files)."""

from __future__ import annotations

import logging
import os
import time

import pytest

from mooncake_core.store import maintenance

from mooncake_lab.store_procs import payload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MiB = 1 << 20


def test_offload_sweep_logs_progress_and_totals(master_factory, client_factory, tmp_path, caplog,
                                                monkeypatch) -> None:
    monkeypatch.setattr(maintenance, "PROGRESS_S", 0.2)  # lines every 0.2 s instead of 2 s
    caplog.set_level(logging.INFO, logger="mooncake.store.client")
    root = tmp_path / "ssd"
    root.mkdir()
    m = master_factory(enable_offload=True, root_fs_dir=str(root), default_kv_lease_ttl=300)
    c = client_factory(m, 4 * MiB)  # the owner: evicting its objects makes it write their files
    for i in range(10):
        deadline = time.monotonic() + 20
        while (rc := c.put(f"o{i}", payload(i, MiB - 8192))) == -200 and time.monotonic() < deadline:
            time.sleep(0.1)  # memory is freed once the owner has written the file
        assert rc == 0, f"put o{i} -> {rc}\n{m.log_tail()}"

    def sweeps() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "progress", None) == "SSD offload sweep"]

    deadline = time.monotonic() + 15
    while not any(", in " in r.getMessage() for r in sweeps()):
        assert time.monotonic() < deadline, f"no final sweep line; got {[r.getMessage() for r in sweeps()]}"
        time.sleep(0.2)
    recs = sweeps()
    files = sum(len(fs) for _d, _s, fs in os.walk(root))
    final = [r for r in recs if ", in " in r.getMessage()][-1]
    assert final.done >= files > 0 and final.failed == 0  # type: ignore[attr-defined]
    assert final.bytes == final.done * (MiB - 8192)  # type: ignore[attr-defined]
    assert "objects" in final.getMessage() and "/s" in final.getMessage()
    # bounded: never more than one line per interval (plus the final one)
    ts = [r.created for r in recs if r is not final]
    assert all(b - a >= 0.19 for a, b in zip(ts, ts[1:])), ts
