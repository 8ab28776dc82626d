"""The peer prefix hint: load a prompt's leading blocks from another instance (pure, no vLLM import).

Why: the proxy's Conductor may find that the prefix a request needs sits in the KV cache of
another prefill instance (the peer) rather than in the chosen one or the store. Recomputing it
costs a prefill; reading it costs a transfer. The proxy then asks the peer to *export* the
prefix -- an ordinary hand-off request (``max_tokens: 1``, ``do_remote_decode: true``, prompt
= the prefix's token ids) that the peer mostly answers from its own prefix cache -- and passes
the peer's answer to the chosen instance inside its request::

    "kv_transfer_params": {"do_remote_decode": true, ...,
                           "mooncake_peer_prefix": {<the peer's kv_transfer_params, verbatim>}}

Our ``MooncakeCoreConnector`` on the chosen instance reads those blocks like a decode reads a
prefill's, then computes the rest of the prompt; the peer frees its blocks on the reader's
confirmation (or its lease). The hint is advisory and checked, never trusted: the peer's
``mooncake_tokens_digest`` must equal the digest of this request's own first ``num_tokens``
prompt tokens (else the blocks hold another text's KV and the engine computes instead), block
size and layout must match, and the lease must not be about to end. vLLM's own connectors
ignore the unknown key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mooncake_core.pd.params import ParamsError, RemotePrefill, tokens_digest

PEER_KEY = "mooncake_peer_prefix"


def has_peer_prefix(params: Any) -> bool:
    """True when request params carry a peer prefix hint (valid or not)."""
    return isinstance(params, dict) and params.get(PEER_KEY) is not None


def export_request(model: str, prefix_token_ids: Sequence[int]) -> dict[str, Any]:
    """The ``/v1/completions`` body that makes a peer hold ``prefix_token_ids``'s KV for a reader."""
    if not prefix_token_ids:
        raise ValueError("peer prefix export: the prefix is empty")
    return {"model": model, "prompt": list(prefix_token_ids), "max_tokens": 1, "temperature": 0, "stream": False,
            "kv_transfer_params": {"do_remote_decode": True}}


def export_prefix(token_ids: Sequence[int], blocks: int, block_size: int) -> list[int]:
    """The leading ``blocks`` full blocks of a prompt the peer should export, at most all but the
    prompt's last token (the reading instance must compute at least one token itself)."""
    if block_size <= 0:
        raise ValueError(f"peer prefix export: block_size must be > 0, got {block_size}")
    n = max(0, min(blocks, (len(token_ids) - 1) // block_size))
    return list(token_ids[:n * block_size])


def parse_peer_prefix(params: Any, prompt_token_ids: Sequence[int] | None, block_size: int) -> RemotePrefill:
    """The peer's blocks a request may read; raises ``ParamsError`` saying why it may not."""
    if not isinstance(params, dict):
        raise ParamsError(f"kv_transfer_params must be a JSON object, got {type(params).__name__}")
    rp = RemotePrefill.from_params(params.get(PEER_KEY))
    if rp.block_size != block_size:
        raise ParamsError(f"{PEER_KEY}: the peer's block size {rp.block_size} != this instance's {block_size}")
    if not rp.tokens_digest:
        raise ParamsError(f"{PEER_KEY}: the peer's params have no 'mooncake_tokens_digest' (an older connector)")
    prompt = prompt_token_ids or ()
    if rp.num_tokens <= 0 or rp.num_tokens > len(prompt):
        raise ParamsError(f"{PEER_KEY}: the peer holds {rp.num_tokens} tokens, this prompt has {len(prompt)}")
    if tokens_digest(prompt[:rp.num_tokens]) != rp.tokens_digest:
        raise ParamsError(f"{PEER_KEY}: the peer's {rp.num_tokens} tokens are not this prompt's first "
                          f"{rp.num_tokens} (digest differs)")
    return rp
