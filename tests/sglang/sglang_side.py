"""Build one PD side out of SGLang's real classes, as SGLang's scheduler does, minus the model.

Shared by the SGLang-venv scripts of tests/sglang (peer_pd.py, peer_worker.py) and
bench/frameworks/bench_sglang_handoff.py: load the plugins (our entry point runs), publish the server args
as the scheduler role, create SGLang's shared ``MooncakeTransferEngine`` (or not, for NIXL),
allocate random KV buffers and SGLang's real ``MetadataBuffers``, fill ``KVArgs`` and construct
the backend's KV manager -- on prefill after starting the backend's bootstrap server.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from dataclasses import dataclass
from typing import Any


@dataclass
class Side:
    role: str
    backend: Any  # sglang TransferBackend
    server_args: Any
    mgr: Any
    kv: list  # torch uint8 tensors, one per (layer, K|V)
    meta: Any  # sglang MetadataBuffers
    bootstrap_server: Any
    KVPoll: Any
    sender_cls: Any
    receiver_cls: Any

    def aux_tensors(self) -> list:
        return aux_tensors(self.meta)


def aux_tensors(meta) -> list:
    """The metadata (aux) tensors in ``MetadataBuffers.get_buf_infos`` order, as byte views."""
    import torch

    bufs = [meta.output_ids, meta.cached_tokens, meta.output_token_logprobs_val, meta.output_token_logprobs_idx,
            meta.output_top_logprobs_val, meta.output_top_logprobs_idx, meta.output_topk_p,
            meta.output_topk_index, meta.output_hidden_states, meta.bootstrap_room]
    return [b.contiguous().view(-1).view(torch.uint8) for b in bufs]


def wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def wait_bootstrap(server, port: int, timeout: float) -> None:
    """Wait until SGLang's bootstrap server answers /health (it only logs a failed bind)."""
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.thread.is_alive():
            break
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"SGLang bootstrap server did not come up on 127.0.0.1:{port} (port in use?)")


def build_side(role: str, bootstrap_port: int, *, layers: int, pages: int, page_bytes: int,
               page_tokens: int = 16, seed: int = 1, backend_name: str = "mooncake",
               http_port: int = 30000) -> Side:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("SGLANG_HOST_IP", "127.0.0.1")
    import numpy as np
    import torch

    from sglang.srt.plugins import load_plugins

    load_plugins()  # what every SGLang process does first: runs our entry point

    from sglang.srt import runtime_context as rc
    from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll
    from sglang.srt.disaggregation.utils import (
        DisaggregationMode,
        KVClassType,
        MetadataBuffers,
        TransferBackend,
        get_kv_class,
    )
    from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import (
        maybe_init_shared_mooncake_transfer_engine,
    )
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(model_path="dummy", device="cpu", host="127.0.0.1", port=http_port,
                    disaggregation_mode=role, disaggregation_transfer_backend=backend_name,
                    disaggregation_bootstrap_port=bootstrap_port)
    if backend_name == "mooncake_tcp":
        # the part of SGLang's server-args pipeline that owns this name (the rest needs a model):
        # it sets MC_FORCE_TCP=1 and resolves the backend to "mooncake"
        from sglang.srt.arg_groups.pd_disaggregation_hook import handle_pd_disaggregation

        handle_pd_disaggregation(sa)
    rc.publish(sa, role="scheduler", ranks=rc.SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    rc.get_parallel().override_permanently(pp_group=None)
    # resolved name: SGLang rewrites "mooncake_tcp" to "mooncake" + MC_FORCE_TCP=1
    backend = TransferBackend(rc.get_disagg().disaggregation_transfer_backend)
    server = None
    if role == "prefill":
        # first, before the engine and ZMQ bind ephemeral ports that could take this one
        server = get_kv_class(backend, KVClassType.BOOTSTRAP_SERVER)(host="127.0.0.1", port=bootstrap_port)
        wait_bootstrap(server, bootstrap_port, 30)
    maybe_init_shared_mooncake_transfer_engine(gpu_id=0)  # no-op unless the backend is mooncake

    rng = np.random.default_rng(seed)
    n_bufs = 2 * layers
    kv = [torch.from_numpy(rng.integers(0, 256, pages * page_bytes, dtype=np.uint8)) for _ in range(n_bufs)]
    meta = MetadataBuffers(size=8, hidden_size=64, hidden_states_dtype=torch.float32, max_sampling_mask_tokens=16)
    for t in aux_tensors(meta):  # random, never zeros: a copied row must be visible
        t.copy_(torch.from_numpy(rng.integers(0, 256, t.numel(), dtype=np.uint8)))
    aux_ptrs, aux_lens, aux_items = meta.get_buf_infos()
    assert len(aux_ptrs) == len(aux_tensors(meta)), "SGLang's MetadataBuffers layout changed"

    kv_args = KVArgs()
    kv_args.engine_rank = 0
    kv_args.pp_rank = 0
    kv_args.system_dp_rank = 0
    kv_args.rust_http_port = None
    kv_args.kv_cache_dtype_str = "bfloat16"
    kv_args.kv_layout = None
    kv_args.prefill_start_layer = 0
    kv_args.prefill_end_layer = layers
    kv_args.kv_data_ptrs = [t.data_ptr() for t in kv]
    kv_args.kv_data_lens = [t.numel() for t in kv]
    kv_args.kv_item_lens = [page_bytes] * n_bufs
    kv_args.kv_data_mem_kinds = ["DRAM"] * n_bufs  # read by the NIXL backend (default VRAM); host memory here
    kv_args.num_draft_entries = 0
    kv_args.kv_layer_ids = []
    kv_args.kv_head_num = 8
    kv_args.total_kv_head_num = 8
    kv_args.page_size = page_tokens
    kv_args.aux_data_ptrs, kv_args.aux_data_lens, kv_args.aux_item_lens = aux_ptrs, aux_lens, aux_items
    kv_args.ib_device = None
    kv_args.gpu_id = 0
    kv_args.state_types = []
    kv_args.state_data_ptrs = []
    kv_args.state_data_lens = []
    kv_args.state_item_lens = []
    kv_args.state_dim_per_tensor = []
    kv_args.state_slice_outer_counts = []
    kv_args.state_layer_ids = []
    kv_args.is_hybrid_mla_backend = False
    kv_args.state_conv_shard_groups = []
    kv_args.swa_kv_cache_layout = None
    kv_args.mla_compression_ratios = None

    mode = DisaggregationMode.PREFILL if role == "prefill" else DisaggregationMode.DECODE
    mgr = get_kv_class(backend, KVClassType.MANAGER)(kv_args, mode, sa, False)
    return Side(role=role, backend=backend, server_args=sa, mgr=mgr, kv=kv, meta=meta, bootstrap_server=server,
                KVPoll=KVPoll, sender_cls=get_kv_class(backend, KVClassType.SENDER),
                receiver_cls=get_kv_class(backend, KVClassType.RECEIVER))


def wait_states(pollers: list, want: int, failed: int, deadline: float, what: str) -> list:
    """Poll SGLang senders/receivers until each reports ``want`` or ``failed``."""
    states: list = [None] * len(pollers)
    while time.monotonic() < deadline:
        for i, p in enumerate(pollers):
            if states[i] is None:
                s = p.poll()
                if s == want or s == failed:
                    states[i] = s
        if all(s is not None for s in states):
            return states
        time.sleep(0.005)  # SGLang's scheduler polls once per loop; spinning faster steals the 2 cores
    raise TimeoutError(f"timed out waiting for {what}")


def failure_text(obj) -> str:
    """The reason SGLang gives for a failed sender/receiver (its KVTransferError)."""
    try:
        obj.failure_exception()
    except Exception as e:  # noqa: BLE001 - SGLang raises KVTransferError; report whatever it is
        return f"{type(e).__name__}: {e}"
    return "failure_exception() did not raise"
