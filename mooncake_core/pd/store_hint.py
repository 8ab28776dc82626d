"""The store prefix hint: a ``kv_transfer_params`` field our proxy sets (pure, no vLLM import).

Why: the proxy's Conductor knows (from the store master's key events) that the Mooncake Store
holds a prefix the chosen prefill instance lacks. It says so in the prefill request::

    "kv_transfer_params": {..., "mooncake_store_prefix": {"num_blocks": 12, "block_size": 16}}

``num_blocks``: leading full blocks of the prompt the store held when the proxy decided;
``block_size``: the block size the proxy computed them with (a mismatch voids the hint).
Our store connector (``MooncakeCoreStoreConnector``) then loads that prefix before computing.
With ``store_lookup: "always"`` (default) it looks the store up for every request anyway and the
hint changes nothing; with ``store_lookup: "hint"`` it asks the master only for hinted requests
(no master round trip on the scheduler's path otherwise) and only for the hinted blocks. The
hint is advisory: the connector still checks what exists (a stale hint -- the store dropped
the blocks meanwhile -- just means the engine computes them), and a malformed hint is ignored.
vLLM's own connectors ignore the unknown key.
"""

from __future__ import annotations

from typing import Any

HINT_KEY = "mooncake_store_prefix"
#: ``store_lookup`` values of ``kv_connector_extra_config``
LOOKUP_MODES = ("always", "hint")


def make_hint(num_blocks: int, block_size: int) -> dict[str, int]:
    """The hint's value for ``kv_transfer_params[HINT_KEY]``."""
    if num_blocks < 0 or block_size <= 0:
        raise ValueError(f"store hint: num_blocks must be >= 0 and block_size > 0, got {num_blocks}, {block_size}")
    return {"num_blocks": int(num_blocks), "block_size": int(block_size)}


def hinted_blocks(params: Any, block_size: int) -> int | None:
    """Blocks the request's hint names (None: no usable hint -- absent, malformed, or computed
    with another block size)."""
    if not isinstance(params, dict):
        return None
    h = params.get(HINT_KEY)
    if not isinstance(h, dict):
        return None
    n, bs = h.get("num_blocks"), h.get("block_size")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or bs != block_size:
        return None
    return n
