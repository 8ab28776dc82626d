"""The prefill's own first token, streamed to the client at once (``--prefill-first-token``).

Why: in the sequential vLLM hand-off the prefill instance computes the first output token
anyway (it runs with ``max_tokens=1``), yet the client waits for the *decode's* first token --
the prefill's answer travelling back, a second request travelling in, the KV pull, a decode step
and a forward of the last prompt token (BENCHMARKS, "Where the remaining TTFT ... go"). With this
mode the proxy writes the prefill's token to the client as the first SSE chunk the moment the
prefill answers, and sends the decode the prompt **with that token appended** (as token ids) and
one token less to generate. The decode loads the prompt's KV from the prefill (its connector
counts only the tokens the prefill computed, ``remote_num_tokens``) and computes the one new
token's KV itself, so every later token is conditioned on exactly the token the client saw,
under greedy and sampled decoding alike.

Scope (vLLM's OpenAI server, ``return_token_ids`` since vLLM 0.10.2): streamed
``/v1/completions`` with one prompt and one choice. Requests whose meaning would change at the
seam take the normal path, with the reason logged -- see :func:`ineligible`.

This module is pure (no sockets): payloads in, payloads and SSE bytes out; ``server.py`` and
``relay.py`` do the I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = ["FirstToken", "UsageShift", "decode_body", "first_chunks", "ineligible", "needs_decode",
           "parse_first_token", "prefill_body"]

ROUTE = "/v1/completions"

_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()


def ineligible(body: dict[str, Any], route: str) -> str | None:
    """Why this request cannot take the first-token path (None when it can).

    Each exclusion names a field whose semantics the seam would change: the decode sees the first
    token as part of its prompt, not of its output.
    """
    if route != ROUTE:
        return f"route {route} (only {ROUTE} is supported)"
    if body.get("stream") is not True:
        return "not streamed (no first token to send early)"
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            return "several prompts in one request"
    elif not isinstance(prompt, (str, list)):
        return "prompt is neither a string nor a list"
    for key in ("n", "best_of"):
        v = body.get(key)
        if v is not None and v != 1:
            return f"{key}={v} (one choice only)"
    for key in ("logprobs", "prompt_logprobs", "return_token_ids"):
        if body.get(key) not in (None, False):
            return f"{key} is set (per-token output the seam would split)"
    if body.get("echo"):
        return "echo is set"
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            return f"{key} is set (it counts output tokens; the decode would not count the first)"
    if body.get("stop"):
        return "stop strings are set (one spanning the first and second token would be missed)"
    if body.get("max_tokens") == 0:
        return "max_tokens=0"
    return None


def prefill_body(payload: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The hand-off's prefill payload, asking vLLM for the prompt's and the output's token ids.

    A request for one token is answered by the prefill alone, so it asks for no hand-off: with
    ``do_remote_decode`` the prefill would hold the KV for a decode that never comes until the
    connector's lease frees it.
    """
    out = {**payload, "return_token_ids": True}
    if body.get("max_tokens") == 1:
        out.pop("kv_transfer_params", None)
    return out


@dataclass(frozen=True, slots=True)
class FirstToken:
    """What the prefill's answer says about the first output token."""

    id: str
    created: int
    model: str
    text: str
    token_ids: tuple[int, ...]
    prompt_token_ids: tuple[int, ...]
    finish_reason: str | None
    stop_reason: int | str | None


def parse_first_token(answer: dict[str, Any]) -> FirstToken | None:
    """The first token from a prefill's ``/v1/completions`` JSON answer, or None when the answer
    lacks what the seam needs (an engine without ``return_token_ids``): the caller then falls back
    to the normal hand-off, having sent the client nothing yet."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    c = choices[0]
    tids, pids, text = c.get("token_ids"), c.get("prompt_token_ids"), c.get("text")
    if not (isinstance(tids, list) and len(tids) == 1 and isinstance(pids, list) and pids
            and isinstance(text, str) and all(isinstance(t, int) for t in tids)
            and all(isinstance(t, int) for t in pids)):
        return None
    created = answer.get("created")
    return FirstToken(id=str(answer.get("id") or "cmpl-proxy"),
                      created=created if isinstance(created, int) else int(time.time()),
                      model=str(answer.get("model") or ""), text=text, token_ids=tuple(tids),
                      prompt_token_ids=tuple(pids), finish_reason=c.get("finish_reason"),
                      stop_reason=c.get("stop_reason"))


def needs_decode(body: dict[str, Any], ft: FirstToken) -> bool:
    """False when the first token already ends the request: the client asked for one token, or the
    prefill stopped on EOS / a stop token id (``finish_reason == "stop"``)."""
    if ft.finish_reason == "stop":
        return False
    return body.get("max_tokens") != 1


def decode_body(body: dict[str, Any], ft: FirstToken) -> dict[str, Any]:
    """The client's request for the decode: prompt = the prompt's token ids + the first token,
    one token less to generate (``max_tokens`` / ``min_tokens``)."""
    out = dict(body)
    out["prompt"] = [*ft.prompt_token_ids, *ft.token_ids]
    mt = body.get("max_tokens")
    if isinstance(mt, int) and mt > 1:
        out["max_tokens"] = mt - 1
    mn = body.get("min_tokens")
    if isinstance(mn, int) and mn > 0:
        out["min_tokens"] = mn - 1
    return out


def _usage(ft: FirstToken) -> dict[str, int]:
    n = len(ft.prompt_token_ids)
    return {"prompt_tokens": n, "completion_tokens": len(ft.token_ids), "total_tokens": n + len(ft.token_ids)}


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + _enc.encode(obj) + b"\n\n"


def first_chunks(body: dict[str, Any], ft: FirstToken, final: bool) -> bytes:
    """The SSE bytes the client gets for the first token, in vLLM's chunk shape.

    ``final``: the first token ends the request -- the chunk carries the finish reason, then the
    usage chunk if ``stream_options.include_usage`` asked for it, then ``[DONE]``.
    """
    opts = body.get("stream_options") or {}
    continuous = bool(opts.get("continuous_usage_stats")) if isinstance(opts, dict) else False
    include = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    choice = {"index": 0, "text": ft.text, "logprobs": None,
              "finish_reason": ft.finish_reason if final else None,
              "stop_reason": ft.stop_reason if final else None}
    head = {"id": ft.id, "object": "text_completion", "created": ft.created, "model": ft.model}
    chunk: dict[str, Any] = {**head, "choices": [choice]}
    if continuous and include:
        chunk["usage"] = _usage(ft)
    out = _event(chunk)
    if final:
        if include:
            out += _event({**head, "choices": [], "usage": _usage(ft)})
        out += b"data: [DONE]\n\n"
    return out


class UsageShift:
    """Rewrites the decode's SSE stream so its ``usage`` counts the first token as output, not as
    prompt (``prompt_tokens - n``, ``completion_tokens + n``). (Both engines got the proxy's
    ``X-Request-Id``, so vLLM's chunk ids already agree.)

    Fed the raw bytes as they arrive; complete events without usage pass through untouched (a
    substring test, no JSON parse per token), the tail of an unfinished event waits for the rest.
    """

    def __init__(self, ft: FirstToken) -> None:
        self._n = len(ft.token_ids)
        self._buf = b""

    def feed(self, data: bytes) -> bytes:
        buf = self._buf + data
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self._buf = buf
            return b""
        done, self._buf = buf[:cut + 2], buf[cut + 2:]
        if b'"usage":{' not in done and b'"usage": {' not in done:
            return done
        return b"".join(self._fix(ev) + b"\n\n" for ev in done.split(b"\n\n") if ev)

    def __call__(self, data: bytes) -> bytes:
        """The relay's ``rewrite``: a piece of the stream, or ``b""`` at its end (flush)."""
        return self.feed(data) if data else self.flush()

    def flush(self) -> bytes:
        """What is left at the end of the stream (an event without its blank line)."""
        rest, self._buf = self._buf, b""
        return self._fix(rest) if rest.strip() else rest

    def _fix(self, ev: bytes) -> bytes:
        if not ev.startswith(b"data: {") or b'"usage"' not in ev:
            return ev
        try:
            obj = _dec.decode(ev[6:])
        except msgspec.DecodeError:
            return ev
        u = obj.get("usage") if isinstance(obj, dict) else None
        if not isinstance(u, dict):
            return ev
        if isinstance(u.get("prompt_tokens"), int):
            u["prompt_tokens"] -= self._n
        if isinstance(u.get("completion_tokens"), int):
            u["completion_tokens"] += self._n
        return b"data: " + _enc.encode(obj)
