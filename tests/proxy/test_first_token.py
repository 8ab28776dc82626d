"""``--prefill-first-token``'s pure part (mooncake_proxy/first_token.py): which requests may take the path,
what the decode is sent, the first chunk's bytes and the usage rewrite of the decode's stream.
The path itself on real vLLM: tests/vllm/test_vllm_p2p_e2e.py::test_prefill_first_token_through_proxy."""

from __future__ import annotations

import json

import pytest

from mooncake_proxy import first_token as ft

ROUTE = "/v1/completions"
BASE = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 8, "stream": True}


def answer(**choice) -> dict:
    c = {"index": 0, "text": " hi", "token_ids": [42], "prompt_token_ids": [5, 6, 7], "finish_reason": "length",
         "stop_reason": None, **choice}
    return {"id": "cmpl-r1", "object": "text_completion", "created": 1700000000, "model": "tiny", "choices": [c]}


def events(raw: bytes) -> list:
    out = []
    for ev in raw.decode().split("\n\n"):
        if ev:
            assert ev.startswith("data: "), ev
            out.append(ev[6:] if ev[6:] == "[DONE]" else json.loads(ev[6:]))
    return out


def test_plain_streamed_completion_is_eligible():
    assert ft.ineligible(BASE, ROUTE) is None
    assert ft.ineligible({**BASE, "prompt": "some text"}, ROUTE) is None
    assert ft.ineligible({**BASE, "prompt": [[5, 6]]}, ROUTE) is None
    assert ft.ineligible({**BASE, "temperature": 0.8, "seed": 3, "top_p": 0.9, "min_tokens": 2}, ROUTE) is None


@pytest.mark.parametrize("change, word", [
    ({"stream": False}, "not streamed"),
    ({"n": 2}, "n=2"),
    ({"best_of": 3}, "best_of=3"),
    ({"logprobs": 1}, "logprobs"),
    ({"prompt_logprobs": 2}, "prompt_logprobs"),
    ({"return_token_ids": True}, "return_token_ids"),
    ({"echo": True}, "echo"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": -0.2}, "frequency_penalty"),
    ({"stop": ["\n"]}, "stop strings"),
    ({"prompt": ["a", "b"]}, "several prompts"),
    ({"prompt": 5}, "neither"),
    ({"max_tokens": 0}, "max_tokens=0"),
])
def test_requests_the_seam_would_change_take_the_normal_path(change, word):
    why = ft.ineligible({**BASE, **change}, ROUTE)
    assert why is not None and word in why


def test_chat_route_is_not_taken():
    assert "only /v1/completions" in ft.ineligible(BASE, "/v1/chat/completions")


def test_prefill_asks_for_token_ids_and_one_token_requests_hand_nothing_off():
    payload = {**BASE, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
    assert ft.prefill_body(payload, BASE)["kv_transfer_params"] == {"do_remote_decode": True}
    assert ft.prefill_body(payload, BASE)["return_token_ids"] is True
    one = ft.prefill_body(payload, {**BASE, "max_tokens": 1})
    assert "kv_transfer_params" not in one and one["return_token_ids"] is True


def test_parse_needs_token_ids_else_falls_back():
    t = ft.parse_first_token(answer())
    assert t is not None and t.token_ids == (42,) and t.prompt_token_ids == (5, 6, 7) and t.text == " hi"
    assert ft.parse_first_token(answer(token_ids=None)) is None  # engine without return_token_ids
    assert ft.parse_first_token(answer(prompt_token_ids=[])) is None
    assert ft.parse_first_token(answer(token_ids=[1, 2])) is None  # not a one-token prefill
    assert ft.parse_first_token({"choices": []}) is None
    assert ft.parse_first_token({}) is None


def test_decode_gets_the_prompt_plus_the_first_token_and_one_token_less():
    t = ft.parse_first_token(answer())
    d = ft.decode_body({**BASE, "min_tokens": 3}, t)
    assert d["prompt"] == [5, 6, 7, 42] and d["max_tokens"] == 7 and d["min_tokens"] == 2
    assert d["stream"] is True and BASE["prompt"] == [5, 6, 7]  # the client's body is not changed
    no_max = ft.decode_body({k: v for k, v in BASE.items() if k != "max_tokens"}, t)
    assert "max_tokens" not in no_max  # vLLM's default (the model's room left) already counts the token


def test_needs_decode():
    t = ft.parse_first_token(answer())
    assert ft.needs_decode(BASE, t)
    assert not ft.needs_decode({**BASE, "max_tokens": 1}, t)
    assert not ft.needs_decode(BASE, ft.parse_first_token(answer(finish_reason="stop", stop_reason=None)))


def test_first_chunk_then_decode_continues():
    t = ft.parse_first_token(answer())
    [c] = events(ft.first_chunks({**BASE, "stream_options": {"include_usage": True}}, t, final=False))
    assert c["id"] == "cmpl-r1" and c["object"] == "text_completion" and c["model"] == "tiny"
    assert c["choices"] == [{"index": 0, "text": " hi", "logprobs": None, "finish_reason": None, "stop_reason": None}]
    assert "usage" not in c


def test_first_chunk_alone_ends_the_stream_with_usage():
    t = ft.parse_first_token(answer(finish_reason="stop"))
    evs = events(ft.first_chunks({**BASE, "stream_options": {"include_usage": True}}, t, final=True))
    assert evs[0]["choices"][0]["finish_reason"] == "stop"
    assert evs[1]["choices"] == [] and evs[1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 1,
                                                            "total_tokens": 4}
    assert evs[2] == "[DONE]"
    evs = events(ft.first_chunks(BASE, t, final=True))
    assert len(evs) == 2 and evs[1] == "[DONE]"  # no usage chunk unless asked
    evs = events(ft.first_chunks({**BASE, "stream_options": {"include_usage": True,
                                                              "continuous_usage_stats": True}}, t, final=False))
    assert evs[0]["usage"]["completion_tokens"] == 1


def _decode_stream() -> bytes:
    chunks = [{"id": "cmpl-r1", "choices": [{"index": 0, "text": f" t{i}"}],
               "usage": {"prompt_tokens": 4, "completion_tokens": i, "total_tokens": 4 + i}} for i in (1, 2)]
    chunks.append({"id": "cmpl-r1", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2,
                                                              "total_tokens": 6}})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("piece", [1, 7, 64, 10_000])
def test_usage_shift_counts_the_first_token_as_output_whatever_the_split(piece):
    raw = _decode_stream()
    shift = ft.UsageShift(ft.parse_first_token(answer()))
    out = b"".join(shift(raw[i:i + piece]) for i in range(0, len(raw), piece)) + shift(b"")
    evs = events(out)
    assert [e["usage"] for e in evs[:-1]] == [
        {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
        {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}]
    assert [e["choices"][0]["text"] for e in evs[:2]] == [" t1", " t2"] and evs[-1] == "[DONE]"


def test_usage_shift_passes_events_without_usage_verbatim_and_flushes_a_tail():
    shift = ft.UsageShift(ft.parse_first_token(answer()))
    ev = b'data: {"id":"x","choices":[{"index":0,"text":"a"}],"usage":null}\n\n'
    assert shift(ev) == ev
    assert shift(b'data: {"id":"x"') == b""
    assert shift(b"") == b'data: {"id":"x"'  # an unterminated last event is written as it came


def test_cli_flag_needs_the_sequential_vllm_handoff():
    from mooncake_proxy.cli import build_parser, config_from_args

    def cfg(*extra: str):
        return config_from_args(build_parser().parse_args(["--prefill", "http://p:1", "--decode", "http://d:2", *extra]))

    assert cfg().prefill_first_token is False
    assert cfg("--prefill-first-token").prefill_first_token is True
    with pytest.raises(SystemExit, match="--prefill-first-token needs --handoff vllm .*mooncake-core"):
        cfg("--prefill-first-token", "--handoff", "mooncake-core")
