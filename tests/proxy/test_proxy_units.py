"""Pure logic: hand-off payload builders, registry, flag parsing (no sockets)."""

from __future__ import annotations

import pytest

from mooncake_proxy.cli import build_parser, config_from_args
from mooncake_proxy.handoff import InstanceAddr, make_handoff
from mooncake_proxy.prompt import BadRequest, extract_prompt, max_output_tokens
from mooncake_proxy.registry import Registry, normalize_url

P = InstanceAddr("http://10.0.0.1:8100", "10.0.0.1", 8100, 7777)


def test_handoff_payloads_do_not_mutate_client_body() -> None:
    body = {"prompt": "x", "max_tokens": 50, "stream": True, "stream_options": {"include_usage": True}}
    snapshot = dict(body)
    for name in ("vllm", "mooncake", "sglang", "mooncake-core"):
        h = make_handoff(name)
        ctx = h.new_context("r1")
        h.prefill_payload(body, "/v1/completions", P, ctx)
        h.decode_payload(body, "/v1/completions", P, ctx, {"kv_transfer_params": {"a": 1}})
        assert body == snapshot


def test_vllm_decode_without_params_keeps_body() -> None:
    h = make_handoff("vllm")
    assert "kv_transfer_params" not in h.decode_payload({"prompt": "x"}, "/v1/completions", P, {}, {})


def test_mooncake_default_bootstrap_port() -> None:
    h = make_handoff("mooncake")
    ctx = h.new_context("r")
    p = InstanceAddr("http://h:1", "h", 1, None)
    kv = h.decode_payload({}, "/v1/completions", p, ctx, None)["kv_transfer_params"]
    assert kv["bootstrap_server_port"] == 8998 and kv["remote_bootstrap_addr"] == "http://h:8998"
    assert "remote_engine_id" not in kv and h.prefill_headers(ctx) == {}
    assert h.new_context("r2")["transfer_id"] == "xfer-r2" != ctx["transfer_id"]
    ctx.update(dp_rank=3, remote_engine_id="e")
    assert h.prefill_headers(ctx) == {"X-data-parallel-rank": "3"}
    v6 = InstanceAddr("http://[::1]:1", "::1", 1, 9)
    assert h.decode_payload({}, "/v1/completions", v6, ctx, None)["kv_transfer_params"]["remote_bootstrap_addr"] \
        == "http://[::1]:9"


def test_mooncake_core_goes_concurrent_once_it_knows_the_prefill_segment() -> None:
    h = make_handoff("mooncake-core")
    body = {"prompt": [1, 2, 3], "max_tokens": 9, "stream": True}
    ctx = h.new_context("r")
    assert not h.is_concurrent(P)  # first request: sequential, exactly like the vllm hand-off
    assert h.prefill_payload(body, "/v1/completions", P, ctx)["kv_transfer_params"] == {
        "do_remote_decode": True, "do_remote_prefill": False}
    answer = {"kv_transfer_params": {"mooncake_segment": "10.0.0.1:15000", "remote_block_ids": [1]}}
    assert h.decode_payload(body, "/v1/completions", P, ctx, answer)["kv_transfer_params"] is \
        answer["kv_transfer_params"]
    h.on_prefill_answer(P, {"choices": []})  # an answer without params teaches nothing
    assert not h.is_concurrent(P)
    h.on_prefill_answer(P, answer)
    assert h.is_concurrent(P)
    other = InstanceAddr("http://10.0.0.2:8100", "10.0.0.2", 8100, None)
    assert not h.is_concurrent(other)
    ctx = h.new_context("r2")
    pre = h.prefill_payload(body, "/v1/completions", P, ctx)
    dec = h.decode_payload(body, "/v1/completions", P, ctx, None)
    assert pre["max_tokens"] == 1 and pre["stream"] is False and dec["stream"] is True
    tid = pre["kv_transfer_params"]["mooncake_transfer_id"]
    assert tid == dec["kv_transfer_params"]["mooncake_transfer_id"] != h.new_context("r3")["transfer_id"]
    assert dec["kv_transfer_params"]["mooncake_segment"] == "10.0.0.1:15000"
    assert dec["kv_transfer_params"]["mooncake_pending"] is True


def test_unknown_handoff() -> None:
    with pytest.raises(ValueError, match="vllm"):
        make_handoff("nixl2")


def test_registry_and_urls() -> None:
    assert normalize_url("127.0.0.1:8000/") == "http://127.0.0.1:8000"
    for bad in ("", "http://", "ftp://x:1", "http://h", "http://h:99999"):
        with pytest.raises(ValueError):
            normalize_url(bad)
    r = Registry()
    i = r.add("prefill", "h:1", 9000)
    assert i.instance_id == "prefill@http://h:1" and i.addr.bootstrap_port == 9000
    with pytest.raises(ValueError, match="already"):
        r.add("prefill", "http://h:1")
    r.add("decode", "http://h:1")  # same URL, other role: distinct instance
    with pytest.raises(KeyError, match="nope"):
        r.remove("nope")


def test_prompt_extraction() -> None:
    assert extract_prompt({"prompt": "abc"}, "/v1/completions") == "abc"
    assert extract_prompt({"prompt": [1, 2, 3]}, "/v1/completions") == [1, 2, 3]
    assert extract_prompt({"prompt": ["a", "b"]}, "/v1/completions") == "a"
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert "hi" in extract_prompt(chat, "/v1/chat/completions")
    with pytest.raises(BadRequest, match="prompt"):
        extract_prompt({"prompt": 5}, "/v1/completions")
    with pytest.raises(BadRequest, match="messages"):
        extract_prompt({"messages": []}, "/v1/chat/completions")
    assert max_output_tokens({"max_tokens": 7}) == 7
    assert max_output_tokens({"max_completion_tokens": 3, "max_tokens": 7}) == 3
    with pytest.raises(BadRequest, match="max_tokens"):
        max_output_tokens({"max_tokens": -1})


def test_chat_prompts_hash_through_the_chat_tokenizer() -> None:
    """With a chat tokenizer, chat bodies are hashed from its token ids (content parts joined as
    vLLM renders string-content templates); completions still use the plain tokenizer."""
    from mooncake_proxy.prompt import PromptHasher, chat_messages
    from mooncake_proxy.scheduling import BlockHasher

    seen: list = []

    def chat(msgs, body):
        seen.append((msgs, body.get("add_generation_prompt", True)))
        return [len(m["content"]) for m in msgs] * 4

    ph = PromptHasher(BlockHasher(block_size=2), lambda t: [1] * len(t), chat)
    body = {"messages": [{"role": "system", "content": "ab"},
                         {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "yz"}]}]}
    info = ph.info(body, "/v1/chat/completions")
    assert seen[0][0][1]["content"] == "x\nyz" and info.prompt_tokens == 8
    assert info.block_hashes == BlockHasher(block_size=2).hash_tokens([2, 4] * 4)
    assert ph.info({"prompt": "abcd"}, "/v1/completions").prompt_tokens == 4
    with pytest.raises(BadRequest, match="messages"):
        chat_messages([{"role": "user"}, "nope"])


def test_flags_vllm_style_and_sglang_style() -> None:
    a = build_parser().parse_args(["--prefiller-hosts", "a", "b", "--prefiller-ports", "8100",
                                   "--decoder-hosts", "c", "--decoder-ports", "8200",
                                   "--prefill", "http://d:8300", "9001", "http://f:8500",
                                   "--decode", "http://e:8400", "--decode", "http://g:1", "http://h:2",
                                   "--handoff", "sglang"])
    cfg = config_from_args(a)
    assert cfg.prefill_urls == ["http://a:8100", "http://b:8100", "http://d:8300", "http://f:8500"]
    assert cfg.prefill_bootstrap_ports == [None, None, 9001, None]
    assert cfg.decode_urls == ["http://c:8200", "http://e:8400", "http://g:1", "http://h:2"]
    a = build_parser().parse_args(["--prefill", "9000"])
    with pytest.raises(SystemExit, match="must follow a URL"):
        config_from_args(a)
    a = build_parser().parse_args(["--prefiller-hosts", "a", "b", "--prefiller-ports", "1", "2", "3"])
    with pytest.raises(SystemExit, match="2 entries"):
        config_from_args(a)
    a = build_parser().parse_args(["--ttft-slo", "0"])
    with pytest.raises(SystemExit, match="ttft-slo"):
        config_from_args(a)
