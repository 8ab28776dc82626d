"""Fuzz the vLLM connector's ``kv_transfer_params`` parser (mooncake_core/pd/params.py).

The proxy copies these params from the prefill's answer into the decode request verbatim, so
they are untrusted input at the decode instance. Property: any JSON value either parses into a
``RemotePrefill`` whose fields have the promised types and ranges, or raises ``ParamsError``
naming a key -- never another exception, which inside vLLM would fail the request with an
internal error or, worse, reach the transfer with a bad address.
"""

from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

from fuzz.conftest import EXAMPLES
from mooncake_core.pd.params import ParamsError, RemotePrefill, new_transfer_id

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=10), kids, max_size=5),
    max_leaves=20)


def _valid() -> dict:
    return RemotePrefill(transfer_id=new_transfer_id("e", "r"), segment="127.0.0.1:5000", engine_id="e",
                         request_id="r", block_ids=[3, 4], num_tokens=40, block_size=32, block_bytes=4096,
                         num_slabs=8, lease_expiry_unix=1e9).to_params()


KEYS = list(_valid())


def _check(d: object) -> None:
    try:
        rp = RemotePrefill.from_params(d)
    except ParamsError as e:
        assert "kv_transfer_params" in str(e)
        return
    assert isinstance(rp.segment, str) and 0 < rp.port < 65536
    assert all(isinstance(b, int) and b >= 0 for b in rp.block_ids)
    assert rp.block_size > 0 and rp.num_tokens >= 0 and rp.block_bytes >= 0 and rp.num_slabs >= 0
    assert rp.lease_expiry_unix == rp.lease_expiry_unix  # not NaN
    json.dumps(rp.to_params())  # what we return to vLLM is JSON


@settings(max_examples=EXAMPLES * 3, deadline=None)
@given(json_values)
def test_any_json_value(d) -> None:
    _check(d)


hostile = (st.integers(min_value=-(2**70), max_value=2**70) | st.integers() | st.floats()
           | st.sampled_from([float("nan"), float("inf"), -1, 0, 10**400, True, "1", "127.0.0.1:0", ":80",
                              "h:65536", [], [-1], [True], [2**64]]) | json_values)


@settings(max_examples=EXAMPLES * 5, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), hostile, max_size=4), st.sets(st.sampled_from(KEYS), max_size=2))
def test_valid_params_with_hostile_fields(over, dropped) -> None:
    d = _valid()
    d.update(over)
    for k in dropped:
        d.pop(k, None)
    _check(d)
