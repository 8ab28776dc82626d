"""The peer prefix hint's checks (pure: mooncake_core/pd/peer_prefix.py, params.tokens_digest)."""

from __future__ import annotations

import time

import pytest

from mooncake_core.pd.params import ParamsError, RemotePrefill, tokens_digest
from mooncake_core.pd.peer_prefix import PEER_KEY, export_request, has_peer_prefix, parse_peer_prefix

BS = 16


def _export(tokens: list[int], **kw) -> dict:
    rp = RemotePrefill(transfer_id="peer:r1:abc", segment="127.0.0.1:7001", engine_id="peer", request_id="r1",
                       block_ids=list(range(len(tokens) // BS)), num_tokens=len(tokens), block_size=BS,
                       block_bytes=4096, num_slabs=4, lease_expiry_unix=time.time() + 30,
                       tokens_digest=tokens_digest(tokens))
    return {**rp.to_params(), **kw}


def test_digest_is_of_the_exact_token_sequence():
    a = tokens_digest([1, 2, 3])
    assert len(a) == 32 and a == tokens_digest((1, 2, 3))
    assert a != tokens_digest([1, 2, 4]) and a != tokens_digest([1, 2]) and a != tokens_digest([3, 2, 1])


def test_a_matching_hint_parses_and_round_trips_the_digest():
    prompt = list(range(3, 3 + 3 * BS + 5))
    params = {"do_remote_decode": True, PEER_KEY: _export(prompt[:2 * BS])}
    assert has_peer_prefix(params) and not has_peer_prefix({"do_remote_decode": True}) and not has_peer_prefix(None)
    rp = parse_peer_prefix(params, prompt, BS)
    assert rp.num_tokens == 2 * BS and rp.tokens_digest == tokens_digest(prompt[:2 * BS])


@pytest.mark.parametrize("why,params,match", [
    ("another prompt's blocks", lambda p: _export([9] * 2 * BS), "digest differs"),
    ("another block size", lambda p: {**_export(p[:2 * BS]), "mooncake_block_size": 32}, "block size 32"),
    ("an older peer", lambda p: {**_export(p[:2 * BS]), "mooncake_tokens_digest": ""}, "no 'mooncake_tokens_digest'"),
    ("a bad digest", lambda p: {**_export(p[:2 * BS]), "mooncake_tokens_digest": "XYZ"}, "32 lowercase hex"),
    ("longer than the prompt", lambda p: _export(p[:3 * BS] + [5] * BS), "this prompt has"),
    ("not an object", lambda p: "blocks please", "JSON object"),
])
def test_unusable_hints_say_why(why, params, match):
    prompt = list(range(3, 3 + 3 * BS + 5))
    with pytest.raises(ParamsError, match=match):
        parse_peer_prefix({PEER_KEY: params(prompt)}, prompt, BS)


def test_export_request_is_a_one_token_hand_off_of_the_prefix():
    body = export_request("m", (5, 6, 7))
    assert body["prompt"] == [5, 6, 7] and body["max_tokens"] == 1
    assert body["kv_transfer_params"] == {"do_remote_decode": True}
    with pytest.raises(ValueError, match="empty"):
        export_request("m", [])
