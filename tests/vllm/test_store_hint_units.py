"""The store prefix hint's format (pure: mooncake_core/pd/store_hint.py) and the proxy's use of it."""

from __future__ import annotations

import pytest

from mooncake_core.pd.store_hint import HINT_KEY, hinted_blocks, make_hint
from mooncake_proxy.scheduling import Decision
from mooncake_proxy.server import with_store_hint


def test_hint_round_trip_and_rejects():
    assert hinted_blocks({HINT_KEY: make_hint(5, 16)}, 16) == 5
    assert hinted_blocks({HINT_KEY: make_hint(5, 16)}, 32) is None  # computed with another block size
    for bad in (None, [], {}, {HINT_KEY: 3}, {HINT_KEY: {"num_blocks": -1, "block_size": 16}},
                {HINT_KEY: {"num_blocks": True, "block_size": 16}}, {HINT_KEY: {"num_blocks": "4", "block_size": 16}}):
        assert hinted_blocks(bad, 16) is None
    with pytest.raises(ValueError, match="num_blocks"):
        make_hint(-1, 16)


def test_proxy_adds_the_hint_only_to_kv_transfer_params():
    d = Decision("p", "d", 1.0, 0.1, cached_blocks=7, remote_source="store", remote_blocks=5)
    body = {"prompt": [1], "kv_transfer_params": {"do_remote_decode": True}}
    out = with_store_hint(body, d, 16)
    assert out["kv_transfer_params"] == {"do_remote_decode": True, HINT_KEY: {"num_blocks": 7, "block_size": 16}}
    assert HINT_KEY not in body["kv_transfer_params"]  # the client's body is not modified
    sg = {"text": "x", "bootstrap_room": 1}
    assert with_store_hint(sg, d, 16) is sg
