"""The proxy's configuration: everything ``ProxyServer`` is built from (``cli.py`` fills it from flags).

Why apart: the CLI, the server, the tests and embedders build it; none of them needs the server's
imports (aiohttp, the scheduler) to do so, and every field is documented in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ProxyConfig:
    """Everything the server needs; ``cli.py`` fills it from flags."""

    prefill_urls: list[str] = field(default_factory=list)
    decode_urls: list[str] = field(default_factory=list)
    prefill_bootstrap_ports: list[int | None] = field(default_factory=list)
    policy: str = "load_balance"
    handoff: str = "vllm"
    #: --prefill-first-token: stream the prefill's first token at once (first_token.py)
    prefill_first_token: bool = False
    ttft_slo: float | None = None
    tbt_slo: float | None = None
    prediction_horizon: float | None = None
    #: --rejection: where SLO-breaking requests get their 429 (scheduling/admission.py)
    rejection: str = "early"
    #: --calibrate: scale the cost model by observed / predicted latencies (scheduling/calibration.py)
    calibrate: bool = False
    #: --prefill-batch-tokens: the engines batch their queue in steps of this many tokens (0: one at a time)
    prefill_batch_tokens: int = 0
    #: --ttft-margin-quantile: the quantile of a pair's recent TTFT errors the check adds (ttft_error.py)
    ttft_margin_quantile: float = 0.9
    ttft_margin_queued: bool = True  # --[no-]ttft-margin-queued: requests admitted behind others as a class
    ttft_queue_margin: float = 1.0  # --ttft-queue-margin: a queued request's margin >= this x its predicted wait
    #: --recent-busy-tau: an idle prefill counts for its recent busy share (contention.RecentBusy); 0: off
    recent_busy_tau: float = 0.0
    #: --prefill-contention: with --calibrate, how prefills slowing each other is learned (contention.py):
    #: "count" = one slope per busy neighbour, "pairs" = a coefficient per (prefill, other prefill or decode),
    #: "groups" = processor sharing within the declared --hardware-group's (pairs for the other instances)
    prefill_contention: str = "pairs"
    #: --hardware-group: groups of instance URLs that share hardware (with prefill_contention "groups":
    #: processor sharing within each, contention.HardwareGroups)
    hardware_groups: list[list[str]] = field(default_factory=list)
    retry_after: float = 1.0
    health_interval: float = 5.0
    health_timeout: float = 2.0
    health_timeouts_to_down: int = 3
    #: --upstream-keepalive: below the engines' idle timeout (uvicorn: 5 s), see cli.py
    upstream_keepalive: float = 4.0
    request_timeout: float = 300.0
    connect_timeout: float = 5.0
    profile: str | None = None
    block_size: int = 512
    cache_blocks: int = 0
    decode_kv_blocks: int = 0
    tokenizer: str | None = None
    kv_events_config: str | None = None
    admin_key: str | None = None
    seed: int = 0
    #: largest request body accepted (413 above, naming the limit)
    max_request_bytes: int = 64 * 1024 * 1024
    #: serve HTTPS with this PEM certificate and key (both or neither)
    tls_cert: str | None = None
    tls_key: str | None = None
    store_master: str | None = None
    store_view: str = "events"
    #: --store-view zmq: the master's KV-event PUB (and replay) endpoints
    store_kv_events: str | None = None
    store_kv_events_replay: str = ""
    store_model_tag: str | None = None
    #: --peer-prefix: the Conductor may plan a prefix load from another prefill instance
    peer_prefix: bool = False
    peer_prefix_timeout: float = 2.0
