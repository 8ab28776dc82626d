"""Fuzz the vLLM connector's ``kv_transfer_params`` parser (mooncake_core/pd/params.py).

The proxy copies these params from the prefill's answer into the decode request verbatim, so
they are untrusted input at the decode instance. Property: any JSON value either parses into a
``RemotePrefill`` whose fields have the promised types and ranges, or raises ``ParamsError``
naming a key -- never another exception, which inside vLLM would fail the request with an
internal error or, worse, reach the transfer with a bad address.
"""

from __future__ import annotations


from hypothesis import given, settings, strategies as st

from fuzz.conftest import EXAMPLES
from mooncake_lab.fuzz.vllm_params import KEYS, check_params, valid_params

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=10), kids, max_size=5),
    max_leaves=20)


@settings(max_examples=EXAMPLES * 3, deadline=None)
@given(json_values)
def test_any_json_value(d) -> None:
    check_params(d)


hostile = (st.integers(min_value=-(2**70), max_value=2**70) | st.integers() | st.floats()
           | st.sampled_from([float("nan"), float("inf"), -1, 0, 10**400, True, "1", "127.0.0.1:0", ":80",
                              "h:65536", [], [-1], [True], [2**64]]) | json_values)


@settings(max_examples=EXAMPLES * 5, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), hostile, max_size=4), st.sets(st.sampled_from(KEYS), max_size=2))
def test_valid_params_with_hostile_fields(over, dropped) -> None:
    d = valid_params()
    d.update(over)
    for k in dropped:
        d.pop(k, None)
    check_params(d)
