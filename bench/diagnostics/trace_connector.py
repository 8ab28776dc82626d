"""``TracingMooncakeConnector``: the production connector plus wall-clock trace events (bench only).

Loaded by ``bench/diagnostics/trace_vllm_pd.py`` through ``kv_connector_module_path``; each process appends
JSON lines ``{"t": unix_s, "ev": name, "rid": request_id, "pid": pid}`` to the file named by
``kv_connector_extra_config["trace_file"]``, so one request can be followed through the prefill
and decode engines (scheduler and worker process alike) on one clock. The production connector
has no tracing switch; this subclass only observes the calls vLLM makes.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorTransferResults

from mooncake_connectors.vllm.p2p_connector import MooncakeConnectorMetadata, MooncakeCoreConnector


class TracingMooncakeConnector(MooncakeCoreConnector):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        path = vllm_config.kv_transfer_config.get_from_extra_config("trace_file", None)
        self._trace = open(path, "a", buffering=1) if path else None
        self._seen: set[str] = set()
        self._role = "sched" if self._sched is not None else "worker"
        if self._worker is not None:
            self._wrap_worker(self._worker)

    def _wrap_worker(self, w: Any) -> None:
        """Stamp the hand-off's worker internals too: the prefill sending ``ready`` (and the
        decode's answer to that round trip), the decode receiving it, and its read."""
        sender, puller = w.sender, w.puller
        send_ready, on_ready = sender.send_ready, puller.on_ready

        def _send_ready(pair: Any, inline: bool = True) -> None:
            rid = pair[1].request_id if pair is not None else ""
            tid = pair[1].transfer_id if pair is not None else ""
            self._ev("ready_send", rid, tid=tid)
            send_ready(pair, inline)
            self._ev("ready_sent", rid, tid=tid)

        def _on_ready(tid: str, ready: Any) -> None:
            entry = puller.waiting.get(tid)
            rid = entry[0].request_id if entry is not None else ""
            self._ev("ready_recv", rid, tid=tid)
            on_ready(tid, ready)
            self._ev("read_done", rid, tid=tid)

        srv = w.te._server  # the rpc server thread's hand-off of a received notification
        put = srv._on_notify

        def _put(name: str, msg: str) -> None:
            self._ev("notify_in", "", tid=name, kind=msg.split(" ", 1)[0][:12])
            put(name, msg)

        srv._on_notify = _put

        sender.send_ready, puller.on_ready = _send_ready, _on_ready

    def _ev(self, ev: str, rid: str = "", **kw: Any) -> None:
        if self._trace is not None:
            self._trace.write(json.dumps({"t": time.time(), "ev": f"{self._role}.{ev}", "rid": rid,
                                          "pid": os.getpid(), **kw}) + "\n")

    # scheduler side
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        if request.request_id not in self._seen:
            self._seen.add(request.request_id)
            self._ev("seen", request.request_id)
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._ev("alloc", request.request_id, ext=num_external_tokens)
        super().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            self._ev("scheduled", rid, n=n)
        return super().build_connector_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._ev("finished", request.request_id)
        return super().request_finished(request, block_ids)

    def update_connector_output(self, connector_output: Any) -> None:
        for rid in connector_output.finished_recving or ():
            self._ev("recv_seen", rid)
        for rid in connector_output.finished_sending or ():
            self._ev("send_seen", rid)
        super().update_connector_output(connector_output)

    # worker side
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, MooncakeConnectorMetadata)
        for r in meta.reqs_to_recv:
            self._ev("load_start", r.request_id)
        for rid in meta.reqs_to_send:
            self._ev("hold", rid)
        super().start_load_kv(forward_context, **kwargs)
        for r in meta.reqs_to_recv:
            self._ev("load_submitted", r.request_id)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        res = super().get_transfer_results(finished_req_ids)
        for rid in res.finished_recving:
            self._ev("recv_done", rid)
        for rid in res.finished_sending:
            self._ev("send_done", rid)
        return res
