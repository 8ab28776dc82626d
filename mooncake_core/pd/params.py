"""The ``kv_transfer_params`` our P2P connector puts in the prefill's answer (pure, no vLLM import).

Why typed: the proxy copies this dict from the prefill's JSON answer into the decode request
verbatim, so whatever arrives at the decode instance is untrusted input. Parsing it once into
a dataclass with clear errors (which key, what was expected) keeps garbage from turning into
a wrong memory address later.

Key names follow vLLM's NixlConnector where they mean the same thing (``do_remote_prefill``,
``do_remote_decode``, ``remote_engine_id``, ``remote_block_ids``, ``remote_host``,
``remote_port``, ``remote_request_id``) so proxies written for vLLM work unchanged; the
Mooncake-specific ones are prefixed ``mooncake_``. ``mooncake_transfer_id`` is ours because
vLLM's request ids differ between the P and D instances (random suffixes).
"""

from __future__ import annotations

import hashlib
import math
import uuid
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: Version of this dict's format; a decode refuses params from a prefill speaking another one.
PARAMS_VERSION = 1


class ParamsError(ValueError):
    """``kv_transfer_params`` are malformed; the message names the key and what was expected."""


def new_transfer_id(engine_id: str, request_id: str) -> str:
    """A transfer id unique across instances and restarts (engine id alone is not: it may be fixed
    by the user; request ids are reused by clients)."""
    return f"{engine_id}:{request_id}:{uuid.uuid4().hex[:12]}"


def _get(d: dict[str, Any], key: str, typ: type | tuple[type, ...], what: str) -> Any:
    if key not in d or d[key] is None:
        raise ParamsError(f"kv_transfer_params: missing {key!r} ({what})")
    v = d[key]
    if isinstance(v, bool) and typ is int or not isinstance(v, typ):
        raise ParamsError(f"kv_transfer_params: {key!r} must be {what}, got {type(v).__name__} {v!r:.80}")
    return v


def _non_negative(d: dict[str, Any], key: str, what: str) -> int:
    v: int = _get(d, key, int, what)
    if v < 0:
        raise ParamsError(f"kv_transfer_params: {key!r} must be >= 0 ({what}), got {v}")
    return v


def _unix_time(d: dict[str, Any], key: str) -> float:
    v = _get(d, key, (int, float), "a unix time")
    try:
        t = float(v)
    except OverflowError:
        t = math.inf
    if not math.isfinite(t):  # NaN would compare false with every clock reading: a lease never ending
        raise ParamsError(f"kv_transfer_params: {key!r} must be a finite unix time, got {v!r:.40}")
    return t


@dataclass(frozen=True)
class RemotePrefill:
    """What a decode instance needs to pull a request's KV blocks from a prefill instance."""

    transfer_id: str
    segment: str  # Transfer Engine segment name of the prefill worker ("host:rpc_port")
    engine_id: str
    request_id: str
    block_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0  # tokens whose KV the prefill computed (the prompt)
    block_size: int = 0
    block_bytes: int = 0  # bytes of one block in one registered KV slab (layout check)
    num_slabs: int = 0  # registered KV slabs (layers x K/V split) -- layout check
    lease_expiry_unix: float = 0.0  # prefill frees the blocks at this time even without a confirmation
    # tensor parallelism: every prefill rank's segment, in rank order (``segments[0] == segment``);
    # block_bytes / num_slabs are per rank, kv_heads the KV heads per rank (0: unknown);
    # heads_outer: the prefill's blocks are [kv_heads, ...], so a decode with more TP ranks can
    # read one head slice of them (False when not said: an older prefill)
    segments: tuple[str, ...] = ()
    kv_heads: int = 0
    heads_outer: bool = False
    # digest of the ``num_tokens`` token ids whose KV the blocks hold (``tokens_digest``); "" from
    # an older prefill. A peer-prefix load (``peer_prefix.py``) checks it against its own prompt.
    tokens_digest: str = ""
    # hybrid models (vLLM's hybrid KV cache manager): every KV cache group's block ids, in group
    # order (``block_ids`` is then the full-attention group's), and the prefill's group layout
    # (``kv_groups.GroupLayout.tag``) the decode's must equal; () / "" for one group
    group_block_ids: tuple[tuple[int, ...], ...] = ()
    kv_layout: str = ""

    def __post_init__(self) -> None:
        if not self.segments:  # one rank
            object.__setattr__(self, "segments", (self.segment,))

    @property
    def tp_size(self) -> int:
        return len(self.segments)

    @property
    def host(self) -> str:
        return self.segment.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.segment.rsplit(":", 1)[1])

    def to_params(self) -> dict[str, Any]:
        """The dict returned from ``request_finished`` (the proxy forwards it to decode)."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_request_id": self.request_id,
            "remote_block_ids": list(self.block_ids),
            "remote_host": self.host,
            "remote_port": self.port,
            "remote_num_tokens": self.num_tokens,
            "mooncake_version": PARAMS_VERSION,
            "mooncake_transfer_id": self.transfer_id,
            "mooncake_segment": self.segment,
            "mooncake_block_size": self.block_size,
            "mooncake_block_bytes": self.block_bytes,
            "mooncake_num_slabs": self.num_slabs,
            "mooncake_lease_expiry": self.lease_expiry_unix,
            "mooncake_tp_size": self.tp_size,
            "mooncake_segments": list(self.segments),
            "mooncake_kv_heads": self.kv_heads,
            "mooncake_heads_outer": self.heads_outer,
            "mooncake_tokens_digest": self.tokens_digest,
            **({"mooncake_group_block_ids": [list(g) for g in self.group_block_ids],
                "mooncake_kv_layout": self.kv_layout} if self.group_block_ids else {}),
        }

    @classmethod
    def from_params(cls, d: Any) -> "RemotePrefill":
        """Parse the params a decode request carries; raises ``ParamsError`` naming the bad key."""
        if not isinstance(d, dict):
            raise ParamsError(f"kv_transfer_params must be a JSON object, got {type(d).__name__}")
        ver = d.get("mooncake_version")
        if ver != PARAMS_VERSION:
            raise ParamsError(f"kv_transfer_params: 'mooncake_version' is {ver!r}, this decode speaks "
                              f"{PARAMS_VERSION} (were they produced by MooncakeCoreConnector on the prefill?)")
        seg = _segment(d)
        blocks = _get(d, "remote_block_ids", list, "a list of block ids")
        if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in blocks):
            raise ParamsError("kv_transfer_params: 'remote_block_ids' must be non-negative integers")
        n = _get(d, "remote_num_tokens", int, "a token count")
        bs = _get(d, "mooncake_block_size", int, "the prefill's block size in tokens")
        if bs <= 0 or n < 0 or (blocks and n > len(blocks) * bs):
            raise ParamsError(f"kv_transfer_params: {n} tokens do not fit {len(blocks)} blocks of {bs}")
        return cls(
            transfer_id=_transfer_id(d),
            segment=seg,
            engine_id=str(d.get("remote_engine_id") or ""),
            request_id=str(d.get("remote_request_id") or ""),
            block_ids=list(blocks),
            num_tokens=n,
            block_size=bs,
            block_bytes=_non_negative(d, "mooncake_block_bytes", "bytes per block per slab"),
            num_slabs=_non_negative(d, "mooncake_num_slabs", "number of KV slabs"),
            lease_expiry_unix=_unix_time(d, "mooncake_lease_expiry"),
            segments=_tp_segments(d, seg),
            kv_heads=_non_negative(d, "mooncake_kv_heads", "KV heads per prefill rank")
            if d.get("mooncake_kv_heads") is not None else 0,
            heads_outer=_get(d, "mooncake_heads_outer", bool, "true or false: the prefill's blocks are head-outer")
            if d.get("mooncake_heads_outer") is not None else False,
            tokens_digest=_digest(d),
            group_block_ids=_group_block_ids(d),
            kv_layout=_kv_layout(d),
        )


#: Most KV cache groups accepted in params (a hybrid model has a few: one per layer kind).
MAX_GROUPS = 64
#: Longest ``mooncake_kv_layout`` accepted (ours: the groups' tags and a 16-character digest).
MAX_LAYOUT = 1024


def _group_block_ids(d: dict[str, Any]) -> tuple[tuple[int, ...], ...]:
    v = d.get("mooncake_group_block_ids")
    if v is None:
        return ()
    if not isinstance(v, list) or not 0 < len(v) <= MAX_GROUPS or not all(isinstance(g, list) for g in v):
        raise ParamsError(f"kv_transfer_params: 'mooncake_group_block_ids' must be a list of 1..{MAX_GROUPS} lists "
                          f"of block ids (one per KV cache group), got {v!r:.80}")
    if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for g in v for b in g):
        raise ParamsError("kv_transfer_params: 'mooncake_group_block_ids' must hold non-negative integers")
    if d.get("mooncake_kv_layout") is None:
        raise ParamsError("kv_transfer_params: 'mooncake_group_block_ids' without 'mooncake_kv_layout' (the "
                          "prefill's KV cache group layout)")
    return tuple(tuple(g) for g in v)


def _kv_layout(d: dict[str, Any]) -> str:
    v = d.get("mooncake_kv_layout")
    if v is None:
        return ""
    if not isinstance(v, str) or len(v) > MAX_LAYOUT or not v.isprintable() or not v.isascii():
        raise ParamsError(f"kv_transfer_params: 'mooncake_kv_layout' must be at most {MAX_LAYOUT} printable ASCII "
                          f"characters, got {v!r:.80}")
    if v and d.get("mooncake_group_block_ids") is None:
        raise ParamsError("kv_transfer_params: 'mooncake_kv_layout' without 'mooncake_group_block_ids'")
    return v


#: Hex characters of ``tokens_digest`` (a 128-bit BLAKE2b).
DIGEST_CHARS = 32


def tokens_digest(token_ids: Sequence[int]) -> str:
    """A digest of token ids (int32, in order). Why: KV blocks are only valid for the exact
    tokens that produced them; a reader holding the writer's digest can check its own prompt
    before reading instead of trusting whoever routed the request."""
    return hashlib.blake2b(array("i", token_ids).tobytes(), digest_size=DIGEST_CHARS // 2).hexdigest()


def _digest(d: dict[str, Any]) -> str:
    v = d.get("mooncake_tokens_digest")
    if v is None or v == "":
        return ""
    if not isinstance(v, str) or len(v) != DIGEST_CHARS or any(c not in "0123456789abcdef" for c in v):
        raise ParamsError(f"kv_transfer_params: 'mooncake_tokens_digest' must be {DIGEST_CHARS} lowercase hex "
                          f"characters, got {v!r:.80}")
    return v


def wants_remote_prefill(d: Any) -> bool:
    """True when a decode request asks to pull its prompt KV (vLLM's ``do_remote_prefill``)."""
    return isinstance(d, dict) and bool(d.get("do_remote_prefill"))


def wants_remote_decode(d: Any) -> bool:
    """True when a prefill request must keep its KV for a decode instance (``do_remote_decode``)."""
    return isinstance(d, dict) and bool(d.get("do_remote_decode"))


# ------------------------------------------------------------------ concurrent hand-off
# The proxy sends the prefill and the decode request at once (``mooncake_proxy --handoff
# mooncake-core``). It picks the transfer id and knows the prefill's segment (learned from an
# earlier answer of that prefill); block ids and lease come later, from the prefill worker to
# the decode worker, in a Transfer Engine notification (``ready``) sent when the prefill ends.

#: Longest transfer id accepted from a request (ours are engine id + request id + 12 characters).
MAX_TRANSFER_ID = 1024


@dataclass(frozen=True)
class PendingPrefill:
    """A decode request whose prefill is still running: who to ask, and under which transfer id."""

    transfer_id: str
    segment: str


def _segment(d: dict[str, Any]) -> str:
    seg: str = _get(d, "mooncake_segment", str, "the prefill's segment 'host:port'")
    host, sep, port = seg.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ParamsError(f"kv_transfer_params: 'mooncake_segment' must be 'host:port', got {seg!r}")
    return seg


#: Most tensor-parallel ranks accepted in params (a bound on what a request can make a decode do).
MAX_TP = 64


def _tp_segments(d: dict[str, Any], seg: str) -> tuple[str, ...]:
    """The prefill's per-rank segments (absent: one rank, ``seg``)."""
    segs = d.get("mooncake_segments")
    tp = d.get("mooncake_tp_size")
    if segs is None and tp is None:
        return (seg,)
    segs = _get(d, "mooncake_segments", list, "a list of the prefill ranks' segments")
    tp = _get(d, "mooncake_tp_size", int, "the prefill's tensor parallel size")
    if not 1 <= tp <= MAX_TP or len(segs) != tp:
        raise ParamsError(f"kv_transfer_params: 'mooncake_segments' must list 'mooncake_tp_size' = {tp} "
                          f"(1..{MAX_TP}) segments, got {len(segs)}")
    out = tuple(_segment({"mooncake_segment": s}) for s in segs)
    if out[0] != seg:
        raise ParamsError(f"kv_transfer_params: 'mooncake_segments'[0] {out[0]!r} is not 'mooncake_segment' {seg!r}")
    if len(set(out)) != len(out):
        raise ParamsError("kv_transfer_params: 'mooncake_segments' repeats a segment")
    return out


def _transfer_id(d: dict[str, Any]) -> str:
    tid: str = _get(d, "mooncake_transfer_id", str, "the transfer id")
    if not 0 < len(tid) <= MAX_TRANSFER_ID:
        raise ParamsError(f"kv_transfer_params: 'mooncake_transfer_id' must be 1..{MAX_TRANSFER_ID} characters, "
                          f"got {len(tid)}")
    return tid


def is_pending(d: Any) -> bool:
    """True when decode params are the concurrent hand-off's (no block ids yet)."""
    return isinstance(d, dict) and d.get("mooncake_pending") is True


def parse_pending(d: Any) -> PendingPrefill:
    """Parse a concurrent hand-off's decode params; raises ``ParamsError`` naming the bad key."""
    if not isinstance(d, dict):
        raise ParamsError(f"kv_transfer_params must be a JSON object, got {type(d).__name__}")
    ver = d.get("mooncake_version")
    if ver != PARAMS_VERSION:
        raise ParamsError(f"kv_transfer_params: 'mooncake_version' is {ver!r}, this decode speaks {PARAMS_VERSION}")
    return PendingPrefill(transfer_id=_transfer_id(d), segment=_segment(d))


def chosen_transfer_id(d: Any) -> str | None:
    """The transfer id a concurrent hand-off gave the prefill request (None: pick a fresh one)."""
    if not isinstance(d, dict) or d.get("mooncake_transfer_id") is None:
        return None
    return _transfer_id(d)


def concurrent_prefill_params(transfer_id: str) -> dict[str, Any]:
    """The prefill's ``kv_transfer_params`` of a concurrent hand-off."""
    return {"do_remote_decode": True, "do_remote_prefill": False, "mooncake_transfer_id": transfer_id}


def concurrent_decode_params(transfer_id: str, segment: str) -> dict[str, Any]:
    """The decode's ``kv_transfer_params`` of a concurrent hand-off."""
    return {"do_remote_prefill": True, "do_remote_decode": False, "mooncake_pending": True,
            "mooncake_version": PARAMS_VERSION, "mooncake_transfer_id": transfer_id, "mooncake_segment": segment}

