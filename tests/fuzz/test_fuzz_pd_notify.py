"""Fuzz the P2P workers' notification decoder (mooncake_core/pd/notify.py).

A notification comes from another instance, so its text is untrusted input at the worker that
drains it. Property: any text either decodes into a ``Want``, ``Ready``, ``Confirmation``,
``ClockQuery`` or ``ClockAnswer`` whose fields have the promised types and ranges (and encodes back to a text that decodes to the same
message), or raises ``NotifyError`` -- never another exception, which would escape the worker's
poll and fail the engine step.
"""

from __future__ import annotations

import json
import math

from hypothesis import given, settings, strategies as st

from fuzz.conftest import EXAMPLES
from fuzz.test_fuzz_vllm_params import hostile
from mooncake_core.pd.notify import (CONFIRMATIONS, MAX_SEGMENT, ClockAnswer, ClockQuery, Confirmation, NotifyError,
                                     Ready, Want, decode, encode)
from mooncake_core.pd.params import MAX_TP
from mooncake_lab.fuzz.vllm_params import KEYS, valid_params


def _check(text: str) -> None:
    try:
        msg = decode(text)
    except NotifyError as e:
        assert str(e)
        assert e.kind in (None, "want", "ready", "clock?", "clock=", *CONFIRMATIONS)
        return
    if isinstance(msg, (Want, ClockQuery, ClockAnswer)):
        assert 0 < len(msg.segment) <= MAX_SEGMENT and not any(c.isspace() for c in msg.segment)
        if isinstance(msg, ClockAnswer):
            assert isinstance(msg.wall, float) and math.isfinite(msg.wall) and msg.wall > 0
    elif isinstance(msg, Ready):
        assert msg.remote.block_size > 0 and 0 < msg.remote.port < 65536
    else:
        assert isinstance(msg, Confirmation) and msg.kind in CONFIRMATIONS
        assert 0 <= msg.sender < msg.readers <= MAX_TP
    assert decode(encode(msg)) == msg


heads = st.sampled_from(["want", "ready", *CONFIRMATIONS, "clock?", "clock=", "", "Done", "readyx", "want\t",
                         "clock"])


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


@settings(max_examples=EXAMPLES * 3, deadline=None)
@given(st.text(max_size=12), st.sampled_from([" ", "  ", "", "\t"]),
       st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=40)))
def test_clock_answers_of_any_time(segment: str, sep: str, wall: str) -> None:
    _check(f"clock= {segment}{sep}{wall}")


def test_round_trips_and_errors_name_the_problem() -> None:
    ready = decode("ready " + json.dumps(valid_params()))
    assert isinstance(ready, Ready) and decode(encode(ready)) == ready
    assert decode("want 10.0.0.2:17000") == Want("10.0.0.2:17000")
    assert encode(Confirmation("failed", 1, 2)) == "failed 1/2"
    assert decode("clock? 10.0.0.2:17000") == ClockQuery("10.0.0.2:17000")
    answer = ClockAnswer("10.0.0.1:17001", 1765000000.125)
    assert decode(encode(answer)) == answer and encode(answer) == "clock= 10.0.0.1:17001 1765000000.125"
    for text, needle in (("ready {", "not JSON"), ("ready []", "JSON object"), ("want ", "decode segment"),
                         ("done 3/2", "rank 3 of 2"), ("hello", "not a P2P notification"),
                         ("clock? ", "decode segment"), ("clock= p:1", "<seconds>"), ("clock= p:1 inf", "finite"),
                         ("clock= p:1 -5", "positive"), ("clock= p:1 soon", "<seconds>"),
                         ("ready " + json.dumps({**valid_params(), "mooncake_segment": "nohost"}), "mooncake_segment")):
        try:
            decode(text)
        except NotifyError as e:
            assert needle in str(e), (text, e)
        else:
            raise AssertionError(f"{text!r} decoded")
