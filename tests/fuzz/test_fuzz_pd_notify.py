"""Fuzz the P2P workers' notification decoder (mooncake_core/pd/notify.py).

A notification comes from another instance, so its text is untrusted input at the worker that
drains it. Property: any text either decodes into a ``Want``, ``Ready`` or ``Confirmation`` whose
fields have the promised types and ranges (and encodes back to a text that decodes to the same
message), or raises ``NotifyError`` -- never another exception, which would escape the worker's
poll and fail the engine step.
"""

from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

from fuzz.conftest import EXAMPLES
from fuzz.test_fuzz_vllm_params import hostile
from mooncake_core.pd.notify import CONFIRMATIONS, MAX_SEGMENT, Confirmation, NotifyError, Ready, Want, decode, encode
from mooncake_core.pd.params import MAX_TP
from mooncake_lab.fuzz.vllm_params import KEYS, valid_params


def _check(text: str) -> None:
    try:
        msg = decode(text)
    except NotifyError as e:
        assert str(e)
        assert e.kind in (None, "want", "ready", *CONFIRMATIONS)
        return
    if isinstance(msg, Want):
        assert 0 < len(msg.segment) <= MAX_SEGMENT and not any(c.isspace() for c in msg.segment)
    elif isinstance(msg, Ready):
        assert msg.remote.block_size > 0 and 0 < msg.remote.port < 65536
    else:
        assert isinstance(msg, Confirmation) and msg.kind in CONFIRMATIONS
        assert 0 <= msg.sender < msg.readers <= MAX_TP
    assert decode(encode(msg)) == msg


heads = st.sampled_from(["want", "ready", *CONFIRMATIONS, "", "Done", "readyx", "want\t"])


@settings(max_examples=EXAMPLES * 3, deadline=None)
@given(heads, st.sampled_from(["", " ", "  "]), st.text(max_size=40))
def test_any_text(head: str, sep: str, tail: str) -> None:
    _check(head + sep + tail)


@settings(max_examples=EXAMPLES * 3, deadline=None)
@given(st.sampled_from(CONFIRMATIONS), st.integers(-3, 70), st.integers(-3, 1100), st.sampled_from(["/", "-", "//"]))
def test_confirmations_of_any_counts(kind: str, sender: int, readers: int, slash: str) -> None:
    _check(f"{kind} {sender}{slash}{readers}")


@settings(max_examples=EXAMPLES * 3, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), hostile, max_size=4), st.sets(st.sampled_from(KEYS), max_size=2))
def test_ready_with_hostile_fields(over: dict, dropped: set) -> None:
    d = valid_params()
    d.update(over)
    for k in dropped:
        d.pop(k, None)
    try:
        payload = json.dumps(d)
    except ValueError:  # a value JSON cannot hold
        return
    _check("ready " + payload)


def test_round_trips_and_errors_name_the_problem() -> None:
    ready = decode("ready " + json.dumps(valid_params()))
    assert isinstance(ready, Ready) and decode(encode(ready)) == ready
    assert decode("want 10.0.0.2:17000") == Want("10.0.0.2:17000")
    assert encode(Confirmation("failed", 1, 2)) == "failed 1/2"
    for text, needle in (("ready {", "not JSON"), ("ready []", "JSON object"), ("want ", "decode segment"),
                         ("done 3/2", "rank 3 of 2"), ("hello", "not a P2P notification"),
                         ("ready " + json.dumps({**valid_params(), "mooncake_segment": "nohost"}), "mooncake_segment")):
        try:
            decode(text)
        except NotifyError as e:
            assert needle in str(e), (text, e)
        else:
            raise AssertionError(f"{text!r} decoded")
