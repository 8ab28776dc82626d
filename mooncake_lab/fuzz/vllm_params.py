"""The property the vLLM connector's ``kv_transfer_params`` parser must keep, shared by
tests/fuzz/test_fuzz_vllm_params.py and the million-input run (bench/robustness/bench_fuzz.py).

Any JSON value either parses into a ``RemotePrefill`` whose fields have the promised types and
ranges, or raises ``ParamsError`` naming the key -- never another exception.
"""

from __future__ import annotations

import json

from mooncake_core.pd.params import ParamsError, RemotePrefill, new_transfer_id


def valid_params() -> dict:
    return RemotePrefill(transfer_id=new_transfer_id("e", "r"), segment="127.0.0.1:5000", engine_id="e",
                         request_id="r", block_ids=[3, 4], num_tokens=40, block_size=32, block_bytes=4096,
                         num_slabs=8, lease_expiry_unix=1e9, group_block_ids=((5,), (3, 4)),
                         kv_layout="state,full/32#1r2s#0123456789abcdef").to_params()


KEYS = list(valid_params())


def check_params(d: object) -> None:
    try:
        rp = RemotePrefill.from_params(d)
    except ParamsError as e:
        assert "kv_transfer_params" in str(e)
        return
    assert isinstance(rp.segment, str) and 0 < rp.port < 65536
    assert all(isinstance(b, int) and b >= 0 for b in rp.block_ids)
    assert all(isinstance(b, int) and b >= 0 for g in rp.group_block_ids for b in g)
    assert isinstance(rp.kv_layout, str) and bool(rp.kv_layout) <= bool(rp.group_block_ids)
    assert rp.block_size > 0 and rp.num_tokens >= 0 and rp.block_bytes >= 0 and rp.num_slabs >= 0
    assert rp.lease_expiry_unix == rp.lease_expiry_unix  # not NaN
    json.dumps(rp.to_params())  # what we return to vLLM is JSON
