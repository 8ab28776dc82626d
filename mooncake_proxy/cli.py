"""``mooncake_proxy``: command line of the PD proxy.

Flags follow vLLM's toy/disagg proxies and Mooncake's proxy (``--prefiller-hosts ...``), and also
accept SGLang/vLLM-Mooncake style ``--prefill URL [BOOTSTRAP_PORT]`` / ``--decode URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from mooncake_core import auth
from mooncake_core.utils.log import get_logger, setup_logging

log = get_logger("mooncake_proxy.cli")



def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mooncake_proxy",
        description="OpenAI-compatible prefill/decode (PD) disaggregation proxy with Mooncake's "
                    "Conductor scheduler. Sends each request to a prefill instance, hands the KV "
                    "cache off to a decode instance and streams the decode answer back. "
                    "On its port: /metrics (Prometheus) and /dashboard, a live page of the "
                    "instances, requests/s, TTFT/TBT percentiles and rejections (add ?token=T when "
                    "the services use an auth token).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("listening")
    g.add_argument("--host", default="0.0.0.0", help="address to listen on")
    g.add_argument("--port", type=int, default=8000,
                   help="port to listen on (0 = pick a free one); also serves /metrics and /dashboard")
    g = p.add_argument_group("instances (vLLM/Mooncake proxy style)")
    g.add_argument("--prefiller-hosts", "--prefiller-host", nargs="+", default=[],
                   help="host of each prefill instance (pairs with --prefiller-ports)")
    g.add_argument("--prefiller-ports", "--prefiller-port", nargs="+", type=int, default=[],
                   help="HTTP port of each prefill instance; one port is reused for all hosts")
    g.add_argument("--decoder-hosts", "--decoder-host", nargs="+", default=[],
                   help="host of each decode instance (pairs with --decoder-ports)")
    g.add_argument("--decoder-ports", "--decoder-port", nargs="+", type=int, default=[],
                   help="HTTP port of each decode instance; one port is reused for all hosts")
    g = p.add_argument_group("instances (SGLang router / vLLM MooncakeConnector proxy style)")
    g.add_argument("--prefill", nargs="+", action="append", default=[], metavar="URL [BOOTSTRAP_PORT]",
                   help="prefill instance URL(s), each optionally followed by its bootstrap port "
                        "(a number or 'none'); the flag may be repeated")
    g.add_argument("--decode", nargs="+", action="append", default=[], metavar="URL",
                   help="decode instance URL(s); the flag may be repeated")
    g.add_argument("--prefill-bootstrap-ports", nargs="+", default=[],
                   help="bootstrap port per prefill instance, in the order given (mooncake/sglang "
                        "hand-offs; 'none' = default 8998)")
    g = p.add_argument_group("scheduling")
    from mooncake_proxy.plugins import handoff_names, policy_names  # built-ins + plugins (docs/plugins.md)

    g.add_argument("--policy", choices=policy_names(), default="load_balance",
                   help="scheduler: random, round_robin, load_balance (least queued work), "
                        "cache_aware (local prefix hits), conductor (global prefix + load + "
                        "transfer cost, the paper's)")
    g.add_argument("--ttft-slo", type=float, default=None,
                   help="time-to-first-token SLO in seconds; requests predicted to miss it are "
                        "rejected early with 429 + Retry-After (default: no limit)")
    g.add_argument("--tbt-slo", type=float, default=None,
                   help="time-between-tokens SLO in seconds for the decode side (default: no limit)")
    g.add_argument("--prediction-horizon", type=float, default=None,
                   help="seconds of decode load to project forward for the paper's prediction-based "
                        "early rejection (default: off, current load only)")
    g.add_argument("--prefill-batch-tokens", type=int, default=0,
                   help="the prefill engines' token budget per forward step (vLLM's --max-num-batched-tokens: "
                        "2048 on CPU; SGLang's --chunked-prefill-size): engines batch their queue first come "
                        "first served in steps of this many tokens and answer a request at the end of the step "
                        "holding its last token, so a request admitted behind others delays those whose last "
                        "step it shares. With --ttft-slo the check then also refuses (or sends elsewhere) a "
                        "request that would push one already queued past the SLO. 0 (default): the engines "
                        "are taken to compute one request at a time, as the simulator does")
    g.add_argument("--ttft-margin-quantile", type=float, default=0.9,
                   help="with --calibrate and --ttft-slo: the quantile of each (prefill, decode) pair's recent TTFT "
                        "errors (observed - predicted) the check adds to its prediction (default 0.9). It is the "
                        "share of admitted requests the check aims to keep within the SLO where the errors are "
                        "the model's; above the attainment you need, it holds that attainment from run to run, at "
                        "the cost of more 429s (0 < Q <= 1; scheduling/ttft_error.py)")
    g.add_argument("--ttft-margin-queued", action=argparse.BooleanOptionalAction, default=True,
                   help="with --calibrate and --ttft-slo: also learn the TTFT errors of requests admitted behind "
                        "others on their prefill as one class, pooled over all pairs, and give a request that "
                        "would queue at least that class's margin (default on). Engines answer a queued request "
                        "at the end of a batched step the model does not see, so these come late while unqueued "
                        "ones come early, and one pair's quantile mixes the two (scheduling/ttft_error.py)")
    g.add_argument("--ttft-queue-margin", type=float, default=1.0, metavar="K",
                   help="with --calibrate and --ttft-slo: hold a request that would wait behind others on its "
                        "prefill to a margin of at least K x its predicted wait (default 1; 0: only the learned "
                        "margins). In a burst on shared cores queued requests take several times their estimate "
                        "before any of them answers, which no margin learned from outcomes sees in time; the "
                        "conductor then sends them to a prefill with nothing queued (BENCHMARKS.md, runs q7-q12)")
    g.add_argument("--recent-busy-tau", type=float, default=0.0,
                   help="with --calibrate and --prediction-horizon: count a prefill that is idle now for its busy "
                        "share over about the last SECONDS (an exponential moving average with this time constant) "
                        "in the contention the TTFT and TBT checks expect (a stream lasts its tokens' steps; a "
                        "prefill busy most of the recent past will likely compute during them). 0 (default): "
                        "only the prefills busy or queued now count")
    g.add_argument("--prefill-contention", choices=("count", "pairs", "groups"), default="pairs",
                   help="with --calibrate: how the proxy learns that instances slow a prefill where they share "
                        "hardware (CPU cores, a GPU split by MIG/MPS) and counts it in the TTFT check. pairs "
                        "(default): a coefficient per (prefill, other prefill or decode), learned from the share of "
                        "each prefill's time the others were busy, so only those that share its hardware count; a "
                        "request that would slow one queued on such a neighbour past --ttft-slo goes elsewhere or "
                        "gets a 429 (gauge mooncake_proxy_prefill_interference). count: one log-slowdown per busy "
                        "neighbouring prefill, learned from every sample alike (fewer samples needed; gauge "
                        "mooncake_proxy_contention_slope). groups: the instances of each --hardware-group split their "
                        "hardware by processor sharing: a prefill beside k busy mates runs (1 + k) ** e times its "
                        "time alone (a streaming decode mate counts as busy), e = 1 (ideal sharing) until --calibrate "
                        "learns it per group from the samples (gauge mooncake_proxy_hardware_share_exponent); a "
                        "queue's head is only as far along as that sharing let it; instances in no group learn "
                        "their pairs as with pairs. Needs no warm-up to know which instances share, but with four "
                        "vLLM CPU prefills on one core it kept fewer admitted requests in the SLO than pairs "
                        "(BENCHMARKS.md, issue 16, runs g1-g5)")
    g.add_argument("--hardware-group", nargs="+", action="append", default=[], metavar="URL",
                   help="instances (their --prefill/--decode URLs) that share one piece of hardware: pinned to "
                        "one CPU core, or one GPU split by MIG/MPS; repeat per group (needs --prefill-contention "
                        "groups; an instance in at most one group)")
    from mooncake_proxy.scheduling import REJECTION_MODES

    g.add_argument("--rejection", choices=REJECTION_MODES, default="early",
                   help="where SLO-breaking requests get their 429: early = on arrival (TTFT and TBT "
                        "predicted by the scheduler; with --prediction-horizon the paper's prediction-based "
                        "early rejection); decode = the paper's baseline (Table 3): TTFT checked on arrival, "
                        "TBT only once the prefill is done, against the decode instance's load then (the "
                        "prefill is wasted); early+decode = both")
    g.add_argument("--calibrate", action="store_true",
                   help="correct the cost model online: scale its prefill and decode times by the "
                        "observed / predicted latency (moving mean of the log ratio, factor in 0.1..100, "
                        "gauge mooncake_proxy_cost_factor), kept per instance too and used for that "
                        "instance's estimates (a frozen engine slows only its own; an instance with fewer "
                        "than 3 samples leans on the side's prior, the lower of the shared factor and the best "
                        "confirmed instance's; gauge mooncake_proxy_instance_cost_factor), "
                        "and model each decode instance's hand-off (KV "
                        "pull, queue, first step) as a queue in the TTFT SLO check: measured service time "
                        "x the requests handed off or in prefill ahead, plus how late the oldest one is "
                        "(moving mean of the delay: gauge mooncake_proxy_decode_first_token_seconds), the "
                        "service time kept per source prefill; and add to each (prefill, decode) pair's TTFT "
                        "prediction the 0.9 quantile of its recent errors (observed - predicted), trying the "
                        "other prefills before a 429 (the conductor also ranks them by it, unfaded); "
                        "estimates fade back after 10 s without a sample (an instance's factor to the prior); "
                        "and learn how much slower a prefill runs per busy neighbouring prefill (instances "
                        "sharing cores; gauge mooncake_proxy_contention_slope) and which prefills slow each "
                        "decode's steps (gauge mooncake_proxy_decode_interference), both ~0 on dedicated "
                        "hardware: factors are learned without them, the TTFT check scales a request by the "
                        "other prefills' queues it will run beside, the TBT checks scale a decode step by the "
                        "interfering prefills busy now, and a prefill that would slow the running decodes "
                        "past --tbt-slo goes elsewhere or gets a 429; the decode learns from each stream's "
                        "p90 token gap; "
                        "for engines slower than their profile, e.g. "
                        "sharing cores -- without it SLO estimates made from an idle profile admit everything")
    g.add_argument("--retry-after", type=float, default=1.0,
                   help="Retry-After seconds suggested on 429 when the scheduler gives none")
    g.add_argument("--profile", default=None,
                   help="cost model JSON (prefill time / decode step time fitted from measurements); "
                        "default: the shipped profile")
    g.add_argument("--block-size", type=int, default=512,
                   help="tokens per prefix-cache block used by the scheduler's prefix index")
    g.add_argument("--cache-blocks", type=int, default=0,
                   help="assumed KV cache capacity per prefill instance in blocks (0 = unlimited); "
                        "the prefix index evicts LRU beyond it")
    g.add_argument("--decode-kv-blocks", type=int, default=0,
                   help="KV capacity per decode instance in blocks, used to refuse requests that "
                        "would not fit (0 = unlimited)")
    g.add_argument("--tokenizer", default=None,
                   help="HuggingFace tokenizer name/path to hash real token ids (needs "
                        "'transformers'); default: hash prompt text, ~4 bytes per token")
    g.add_argument("--kv-events-config", default=None,
                   help="JSON file or inline JSON mapping instance URLs to vLLM KV event ZMQ publisher "
                        "endpoints, e.g. '{\"http://p1:8100\": \"tcp://p1:5557\"}'; the proxy subscribes "
                        "and keeps its prefix index in sync with the engines' evictions")
    g.add_argument("--store-master", default=None,
                   help="Mooncake Store master (host:port): the scheduler's store tier follows what the "
                        "store really holds, and prefills lacking a prefix the store holds get the "
                        "'mooncake_store_prefix' hint in kv_transfer_params (default: no store tier)")
    g.add_argument("--store-view", choices=("events", "query", "zmq"), default="events",
                   help="events: follow the master's key events (stale by ~20 ms, no per-request RPC); "
                        "query: batch_is_exist per request with a 0.5 s cache (bench/scheduling/bench_store_view.py); "
                        "zmq: subscribe to the master's vLLM-format KV events (mooncake_master "
                        "--enable_kv_events; needs --store-kv-events)")
    g.add_argument("--store-kv-events", default=None,
                   help="with --store-view zmq: the master's KV-event PUB endpoint (its "
                        "--kv_events_bind_endpoint as reachable from here, e.g. tcp://master:5557)")
    g.add_argument("--store-kv-events-replay", default="",
                   help="with --store-view zmq: the master's --kv_events_replay_endpoint, asked for "
                        "batches the proxy missed (default: none)")
    g.add_argument("--store-model-tag", default=None,
                   help="the engines' '<model>|<dtype>' as their store connector seeds its keys with "
                        "(vLLM model_config.model and dtype, e.g. 'Qwen/Qwen3-0.6B|torch.bfloat16'); "
                        "with --block-size = the engines' block size and --tokenizer (or token-id prompts)")
    g.add_argument("--peer-prefix", action="store_true",
                   help="let the conductor plan a prefix load from another prefill instance that holds it: "
                        "the proxy has that instance export the prefix (a 1-token do_remote_decode request of "
                        "the prefix's token ids) and gives its kv_transfer_params to the chosen prefill as "
                        "'mooncake_peer_prefix', which MooncakeCoreConnector reads before computing. Needs "
                        "--tokenizer (or token-id prompts), --block-size = the engines', a vllm/mooncake-core "
                        "hand-off and MooncakeCoreConnector with kv_role kv_both on the prefills")
    g.add_argument("--peer-prefix-timeout", type=float, default=2.0,
                   help="seconds the proxy waits for a peer's prefix export before the prefill computes the "
                        "prefix itself")
    g.add_argument("--seed", type=int, default=0, help="seed of the random policy")
    g = p.add_argument_group("hand-off and robustness")
    g.add_argument("--handoff", choices=handoff_names(), default="vllm",
                   help="vllm: prefill first (max_tokens=1, kv_transfer_params), then decode with what "
                        "prefill returned; mooncake: both at once with a shared transfer_id and the "
                        "prefill bootstrap address; sglang: both at once with bootstrap_host/port/room")
    g.add_argument("--prefill-first-token", action="store_true",
                   help="with --handoff vllm: stream the prefill's own first token to the client as "
                        "soon as the prefill answers, and send the decode the prompt's token ids plus "
                        "that token (one token less to generate), so TTFT no longer waits for the "
                        "decode. Applies to streamed /v1/completions with one prompt and one choice "
                        "and without logprobs, echo, stop strings or presence/frequency penalties; "
                        "other requests take the normal hand-off (docs/proxy.md)")
    g.add_argument("--health-interval", type=float, default=5.0,
                   help="seconds between /health probes of a healthy instance (0 = no periodic "
                        "probes); new and failing instances are probed at once and then with a fast "
                        "back-off (50 ms doubling to 1 s) until they answer")
    g.add_argument("--health-timeout", type=float, default=2.0, help="timeout of one /health probe (s)")
    g.add_argument("--health-timeouts-to-down", type=int, default=3, metavar="N",
                   help="consecutive timed-out /health probes that take a healthy instance out of "
                        "rotation (a busy engine answers late; a refused connection or an error "
                        "answer takes it out at once)")
    g.add_argument("--upstream-keepalive", type=float, default=4.0,
                   help="seconds an idle connection to an instance is kept for reuse; keep it below the "
                        "engines' own idle timeout (uvicorn's, under vLLM and SGLang, is 5 s), or a request "
                        "may be written into a connection the engine is just closing (a 502 'connection "
                        "reset'); 0 = a new connection per request")
    g.add_argument("--request-timeout", type=float, default=300.0,
                   help="seconds to wait for a prefill answer, or between two decode chunks, before "
                        "answering 504")
    g.add_argument("--connect-timeout", type=float, default=5.0, help="TCP connect timeout to an instance (s)")
    g.add_argument("--admin-key", default=None,
                   help="/admin/instances requires 'Authorization: Bearer KEY' or 'X-Admin-Key: KEY' "
                        "(default: $MOONCAKE_AUTH_TOKEN / $MOONCAKE_AUTH_TOKEN_FILE; unset = admin API open, "
                        "with a warning when listening beyond loopback)")
    g.add_argument("--max-request-bytes", type=int, default=64 * 1024 * 1024,
                   help="largest request body accepted; larger ones get HTTP 413 naming the limit")
    g.add_argument("--tls-cert", default=None, metavar="PEM",
                   help="serve HTTPS with this certificate (with --tls-key) (default: plain HTTP)")
    g.add_argument("--tls-key", default=None, metavar="PEM", help="private key of --tls-cert")
    g.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (default: $MC_LOG_LEVEL or INFO)")
    return p


def _pair_hosts_ports(hosts: list[str], ports: list[int], what: str) -> list[str]:
    if not hosts and not ports:
        return []
    if not hosts:
        raise SystemExit(f"--{what}-ports given without --{what}-hosts")
    if not ports:
        raise SystemExit(f"--{what}-hosts given without --{what}-ports")
    if len(ports) == 1:
        ports = ports * len(hosts)
    if len(ports) != len(hosts):
        raise SystemExit(f"--{what}-hosts has {len(hosts)} entries but --{what}-ports has {len(ports)} "
                         "(give one port per host, or a single port for all)")
    return [f"http://{h}:{p}" for h, p in zip(hosts, ports)]


def _port_or_none(v: str, flag: str) -> int | None:
    if v.lower() == "none":
        return None
    try:
        return int(v)
    except ValueError:
        raise SystemExit(f"{flag}: {v!r} is not a port number or 'none'") from None


def config_from_args(a: argparse.Namespace):
    from .config import ProxyConfig

    prefill = _pair_hosts_ports(a.prefiller_hosts, a.prefiller_ports, "prefiller")
    decode = _pair_hosts_ports(a.decoder_hosts, a.decoder_ports, "decoder")
    bports: list[int | None] = [None] * len(prefill)
    for group in a.prefill:
        for idx, item in enumerate(group):
            if item.isdigit() or item.lower() == "none":
                if idx == 0 or group[idx - 1].isdigit() or group[idx - 1].lower() == "none":
                    raise SystemExit(f"--prefill: bootstrap port {item!r} must follow a URL")
                bports[-1] = _port_or_none(item, "--prefill")
            else:
                prefill.append(item)
                bports.append(None)
    for i, v in enumerate(a.prefill_bootstrap_ports):
        if i >= len(bports):
            raise SystemExit(f"--prefill-bootstrap-ports has more entries ({len(a.prefill_bootstrap_ports)}) "
                             f"than prefill instances ({len(bports)})")
        bports[i] = _port_or_none(v, "--prefill-bootstrap-ports")
    decode += [url for group in a.decode for url in group]
    if not prefill or not decode:
        log.warning("starting without %s; add instances with POST /admin/instances",
                    "prefill instances" if not prefill else "decode instances")
    if a.rejection != "early" and a.tbt_slo is None:
        raise SystemExit(f"--rejection {a.rejection} checks --tbt-slo at the decode stage: give --tbt-slo")
    for flag, v in (("--ttft-slo", a.ttft_slo), ("--tbt-slo", a.tbt_slo),
                    ("--prediction-horizon", a.prediction_horizon),
                    ("--request-timeout", a.request_timeout), ("--health-timeout", a.health_timeout)):
        if v is not None and v <= 0:
            raise SystemExit(f"{flag} must be > 0, got {v}")
    if a.health_timeouts_to_down < 1:
        raise SystemExit(f"--health-timeouts-to-down must be >= 1, got {a.health_timeouts_to_down}")
    if a.upstream_keepalive < 0:
        raise SystemExit(f"--upstream-keepalive must be >= 0, got {a.upstream_keepalive}")
    if a.max_request_bytes <= 0:
        raise SystemExit(f"--max-request-bytes must be > 0, got {a.max_request_bytes}")
    if bool(a.tls_cert) != bool(a.tls_key):
        raise SystemExit("--tls-cert and --tls-key go together (give both)")
    if a.block_size <= 0:
        raise SystemExit(f"--block-size must be > 0, got {a.block_size}")
    if a.recent_busy_tau < 0:
        raise SystemExit(f"--recent-busy-tau must be >= 0 seconds (0 = off), got {a.recent_busy_tau}")
    if not a.ttft_queue_margin >= 0:
        raise SystemExit(f"--ttft-queue-margin must be >= 0 (0 = off), got {a.ttft_queue_margin}")
    if not 0 < a.ttft_margin_quantile <= 1:
        raise SystemExit(f"--ttft-margin-quantile must be in (0, 1], got {a.ttft_margin_quantile}")
    if a.prefill_batch_tokens < 0:
        raise SystemExit(f"--prefill-batch-tokens must be >= 0 (0 = one request at a time), got "
                         f"{a.prefill_batch_tokens}")
    for flag, n in (("--cache-blocks", a.cache_blocks), ("--decode-kv-blocks", a.decode_kv_blocks)):
        if n < 0:
            raise SystemExit(f"{flag} must be >= 0 (0 = unlimited), got {n}")
    if a.peer_prefix and a.handoff == "sglang":
        raise SystemExit("--peer-prefix needs a vLLM hand-off (--handoff vllm or mooncake-core): the peer's "
                         "export and the prefill's hint travel in kv_transfer_params, which SGLang has not")
    if a.peer_prefix_timeout <= 0:
        raise SystemExit(f"--peer-prefix-timeout must be > 0 seconds, got {a.peer_prefix_timeout}")
    if a.prefill_first_token and a.handoff != "vllm":
        raise SystemExit(f"--prefill-first-token needs --handoff vllm (got --handoff {a.handoff}): the "
                         "decode's prompt carries the prefill's first token, so the decode can only be "
                         "sent after the prefill answered")
    return ProxyConfig(
        prefill_urls=prefill, decode_urls=decode, prefill_bootstrap_ports=bports, policy=a.policy,
        handoff=a.handoff, prefill_first_token=a.prefill_first_token, ttft_slo=a.ttft_slo, tbt_slo=a.tbt_slo,
        prediction_horizon=a.prediction_horizon, rejection=a.rejection, calibrate=a.calibrate,
        prefill_batch_tokens=a.prefill_batch_tokens, recent_busy_tau=a.recent_busy_tau,
        ttft_margin_quantile=a.ttft_margin_quantile, ttft_margin_queued=a.ttft_margin_queued,
        ttft_queue_margin=a.ttft_queue_margin,
        prefill_contention=a.prefill_contention, hardware_groups=a.hardware_group, retry_after=a.retry_after,
        health_interval=a.health_interval, health_timeout=a.health_timeout,
        health_timeouts_to_down=a.health_timeouts_to_down,
        upstream_keepalive=a.upstream_keepalive, request_timeout=a.request_timeout,
        connect_timeout=a.connect_timeout, profile=a.profile,
        block_size=a.block_size, cache_blocks=a.cache_blocks,
        decode_kv_blocks=a.decode_kv_blocks, tokenizer=a.tokenizer,
        kv_events_config=a.kv_events_config, admin_key=a.admin_key or auth.resolve_token(), seed=a.seed,
        max_request_bytes=a.max_request_bytes, tls_cert=a.tls_cert, tls_key=a.tls_key,
        store_master=a.store_master, store_view=a.store_view, store_model_tag=a.store_model_tag,
        store_kv_events=a.store_kv_events, store_kv_events_replay=a.store_kv_events_replay,
        peer_prefix=a.peer_prefix, peer_prefix_timeout=a.peer_prefix_timeout)


async def _serve(server, host: str, port: int) -> None:
    from .server import start_server

    server, runner, bound = await start_server(server, host, port)
    cfg = server.cfg
    # One parseable line so scripts/tests can find the port when --port 0 was used.
    scheme = "https" if cfg.tls_cert else "http"
    print(f"mooncake_proxy listening on {scheme}://{host}:{bound} policy={cfg.policy} handoff={cfg.handoff} "
          f"prefill={len(cfg.prefill_urls)} decode={len(cfg.decode_urls)}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except NotImplementedError:
            pass
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    setup_logging(a.log_level)
    try:
        cfg = config_from_args(a)
    except ValueError as e:
        raise SystemExit(f"mooncake_proxy: {e}") from None
    from .server import ProxyServer, install_uvloop

    try:
        server = ProxyServer(cfg)  # validates policy, profile, tokenizer, KV events config
    except (ValueError, OSError) as e:
        print(f"mooncake_proxy: {e}", file=sys.stderr)
        return 2
    install_uvloop()
    try:
        asyncio.run(_serve(server, a.host, a.port))
    except ValueError as e:  # --tls-cert/--tls-key that cannot be loaded
        print(f"mooncake_proxy: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"mooncake_proxy: cannot listen on {a.host}:{a.port}: {e.strerror or e} "
              "(is another process using it? choose another --port, or 0 for any)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
