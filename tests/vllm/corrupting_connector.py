"""The negative control of the vLLM P2P tests, as a connector subclass loaded by vLLM.

``CorruptingMooncakeConnector`` is the production ``MooncakeCoreConnector`` plus one thing:
after a request whose ``kv_transfer_params`` carry ``"mooncake_test_corrupt": true`` has
received its KV blocks, it overwrites them with noise -- so a test can prove the decode
output really depends on the transferred KV. The decode server of the test loads it with
``--kv-transfer-config '{"kv_connector": "CorruptingMooncakeConnector",
"kv_connector_module_path": "corrupting_connector", ...}'`` (this directory on PYTHONPATH);
the production connector has no test switch.

With ``MOONCAKE_TEST_CLOCK_SKEW_FILE`` set, its wall clock (the one leases are stated and checked
on) is shifted by the number of seconds in that file, read again at most every 0.2 s: a host whose
clock is off, without touching the machine's.

It also loses, once, the ``ready`` notification of a concurrent hand-off whose transfer id
starts with ``DROP_READY`` (env ``MOONCAKE_TEST_DROP_READY_PREFIX``; the prefill worker sends nothing the first time that transfer is
ready): a decode must ask again and still get its KV. The prefill server of the test loads it
for this.

Scheduler side: the marker is read from the request and sent to the worker with the step's
connector metadata. Worker side: the marked requests' local block ids are remembered when the
load starts and corrupted when the transfer reports them received (before the scheduler
learns they are ready, so the decode computes on the noise).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorTransferResults

from mooncake_connectors.vllm.p2p_connector import MooncakeConnectorMetadata, MooncakeCoreConnector

MARKER = "mooncake_test_corrupt"
#: Transfer ids starting with this lose their first ``ready`` (prefill worker side); set by the
#: test fixture (vllm_harness.DROP_READY), unset: nothing is dropped.
DROP_READY = os.environ.get("MOONCAKE_TEST_DROP_READY_PREFIX", "")
#: a file holding this instance's clock skew in seconds (unset: the real clock)
SKEW_FILE = os.environ.get("MOONCAKE_TEST_CLOCK_SKEW_FILE", "")


class SkewedClock:
    """time.time() plus the skew in SKEW_FILE (re-read at most every 0.2 s)."""

    def __init__(self, path: str) -> None:
        self.path, self.skew, self.read_at = path, 0.0, -1.0

    def __call__(self) -> float:
        mono = time.monotonic()
        if mono - self.read_at > 0.2:
            try:
                with open(self.path) as f:
                    self.skew = float(f.read().strip() or 0)
            except (OSError, ValueError):
                self.skew = 0.0
            self.read_at = mono
        return time.time() + self.skew


class CorruptingMooncakeConnector(MooncakeCoreConnector):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._marked: set[str] = set()          # scheduler: requests that asked for noise
        self._pending: dict[str, list[int]] = {}  # worker: request -> local blocks to overwrite
        self._views: list[torch.Tensor] = []     # worker: one (num_blocks, -1) view per KV slab
        self._dropped: set[str] = set()          # worker: transfers whose first ready was lost
        self._lose_first_ready()
        if SKEW_FILE:  # both sides of this instance state and check leases on the skewed clock
            if self._sched is not None:
                self._sched.clock = SkewedClock(SKEW_FILE)
            if self._worker is not None:
                self._worker.set_clock(SkewedClock(SKEW_FILE))

    # ---------------------------------------------------------------- scheduler side
    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        if (request.kv_transfer_params or {}).get(MARKER) is True:
            self._marked.add(request.request_id)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = super().build_connector_meta(scheduler_output)
        assert isinstance(meta, MooncakeConnectorMetadata)
        ids = {r.request_id for r in meta.reqs_to_recv} & self._marked
        self._marked -= ids
        setattr(meta, "test_corrupt", sorted(ids))  # rides along with the step's metadata to the worker
        return meta

    # ---------------------------------------------------------------- worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        super().register_kv_caches(kv_caches)
        for t in kv_caches.values():  # same block split as the connector's slabs: blocks are packed
            nb = getattr(self._kv_cache_config, "num_blocks", None) or t.shape[0]
            parts = [t] if t.shape[0] == nb else [t[i] for i in range(t.shape[0])]
            self._views.extend(v.reshape(nb, -1) for v in parts)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        marked = set(getattr(meta, "test_corrupt", ()))
        for r in getattr(meta, "reqs_to_recv", ()):
            if r.request_id in marked:
                self._pending[r.request_id] = list(r.local_block_ids)
        super().start_load_kv(forward_context, **kwargs)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        res = super().get_transfer_results(finished_req_ids)
        for rid in res.finished_recving:
            blocks = self._pending.pop(rid, None)
            if blocks:
                idx = torch.tensor(blocks, dtype=torch.long)
                for v in self._views:
                    v[idx] = (torch.randn(len(blocks), v.shape[1], dtype=torch.float32) * 3).to(v.dtype)
        return res

    def _lose_first_ready(self) -> None:
        """Worker side: wrap the worker's ``ready`` sender so the first one of a DROP_READY transfer is lost."""
        worker = self._worker
        if worker is None or not DROP_READY:
            return
        sender = worker.sender
        send = sender.send_ready

        def send_or_lose(pair: tuple[str, Any] | None, inline: bool = True) -> None:
            tid = pair[1].transfer_id if pair is not None else ""
            if tid.startswith(DROP_READY) and tid not in self._dropped:
                self._dropped.add(tid)
                print(f"test connector: dropped the ready of transfer {tid}", flush=True)
                return
            send(pair, inline)

        sender.send_ready = send_or_lose  # type: ignore[method-assign]
