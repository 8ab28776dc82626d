"""Turn an OpenAI request body into what the scheduler needs: prompt size and block hashes.

Without a tokenizer the proxy hashes the prompt's UTF-8 bytes (``BlockHasher.hash_text``,
≈4 bytes/token); with ``--tokenizer`` it hashes real token ids so the prefix index matches the
engine's blocks. Token-id prompts (``prompt: [1, 2, 3]``) are hashed as tokens either way.

The token ids must be the ones the engine computes, or the keys never match its KV events or
store keys: completions are tokenized with the special tokens (BOS), as vLLM's and SGLang's
``/v1/completions`` do; chat messages go through the tokenizer's chat template (rendered to
text, then tokenized without special tokens -- vLLM's ``/v1/chat/completions`` defaults),
honouring the request's ``add_generation_prompt``, ``continue_final_message`` and
``chat_template_kwargs``. A tokenizer without a chat template hashes the flattened messages.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence


class BadRequest(ValueError):
    """The client's body is not a valid completion request (message says which field)."""


@dataclass
class PromptInfo:
    prompt_tokens: int
    block_hashes: list[int]
    max_output_tokens: int
    #: the engine's token ids when known (a tokenizer or a token-id prompt): a peer prefix export
    #: sends the prefix as token ids (server.py)
    token_ids: Sequence[int] | None = None


def _chat_text(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects")
    parts: list[str] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object, got {type(m).__name__}")
        parts.append(str(m.get("role", "")))
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for c in content:
                if isinstance(c, dict) and isinstance(c.get("text"), str):
                    parts.append(c["text"])
    return "\n".join(parts)


_MAX_TOKEN_ID = 2**31 - 1  # vocabularies are far smaller; bigger ids are garbage, not prompts


def _is_token_ids(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= _MAX_TOKEN_ID for t in v)


def extract_prompt(body: dict[str, Any], route: str) -> str | list[int]:
    """The prompt as text or token ids; BadRequest names the missing/invalid field."""
    if route.endswith("/chat/completions"):
        return _chat_text(body.get("messages"))
    if route == "/generate":  # SGLang native API
        if isinstance(body.get("text"), str):
            return body["text"]
        if _is_token_ids(body.get("input_ids")):
            return list(body["input_ids"])
        raise BadRequest("'/generate' needs 'text' (string) or 'input_ids' (list of token ids, "
                         f"integers in 0..{_MAX_TOKEN_ID})")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if _is_token_ids(prompt):
            return prompt
        first = prompt[0]  # batch: route by the first prompt
        if isinstance(first, str):
            return first
        if first and _is_token_ids(first):
            return first
    raise BadRequest("'prompt' must be a string, a list of strings, or a list of token ids "
                     f"(integers in 0..{_MAX_TOKEN_ID})")


def max_output_tokens(body: dict[str, Any], default: int = 128) -> int:
    for key in ("max_completion_tokens", "max_tokens", "max_new_tokens"):
        v = body.get(key)
        if v is None and key == "max_new_tokens":
            v = (body.get("sampling_params") or {}).get("max_new_tokens") if isinstance(
                body.get("sampling_params"), dict) else None
        if v is not None:
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise BadRequest(f"'{key}' must be a non-negative integer, got {v!r}")
            return v
    return default


#: Renders a chat request's messages to the engine's prompt token ids (see :func:`load_chat_tokenizer`).
ChatTokenize = Callable[[list[dict[str, Any]], dict[str, Any]], Sequence[int]]


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """Messages as a chat template expects them: content parts of type text joined by newlines
    (vLLM's rendering for string-content templates); BadRequest on a malformed list."""
    _chat_text(messages)  # validates
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "\n".join(c["text"] for c in content if isinstance(c, dict) and isinstance(c.get("text"), str))
        out.append({**m, "content": content if content is not None else ""})
    return out


class PromptHasher:
    """Computes block hashes with the scheduler's BlockHasher, optionally through a tokenizer
    (and its chat template for ``/v1/chat/completions``)."""

    def __init__(self, hasher: Any, tokenize: Callable[[str], Sequence[int]] | None = None,
                 chat_tokenize: ChatTokenize | None = None) -> None:
        self.hasher = hasher
        self.tokenize = tokenize
        self.chat_tokenize = chat_tokenize
        self.block_size = int(getattr(hasher, "block_size", 512))

    def info(self, body: dict[str, Any], route: str) -> PromptInfo:
        if self.chat_tokenize is not None and route.endswith("/chat/completions"):
            ids = self.chat_tokenize(chat_messages(body.get("messages")), body)
            return PromptInfo(len(ids), list(self.hasher.hash_tokens(ids)), max_output_tokens(body), ids)
        prompt = extract_prompt(body, route)
        tokens: Sequence[int] | None = None
        if isinstance(prompt, list):
            tokens = prompt
            hashes = self.hasher.hash_tokens(tokens)
            n = len(tokens)
        elif self.tokenize is not None:
            tokens = self.tokenize(prompt)
            hashes = self.hasher.hash_tokens(tokens)
            n = len(tokens)
        else:
            hashes = self.hasher.hash_text(prompt)
            n = max(1, len(prompt.encode("utf-8")) // 4)
        return PromptInfo(n, list(hashes), max_output_tokens(body), tokens)


@functools.lru_cache(maxsize=4)
def _hf_tokenizer(name: str) -> Any:
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found]
    except ImportError:
        raise SystemExit(f"--tokenizer {name}: the 'transformers' package is not installed "
                         "(pip install transformers), or omit --tokenizer to hash prompt text") from None
    return AutoTokenizer.from_pretrained(name)


def load_tokenizer(name: str, add_special_tokens: bool = True) -> Callable[[str], Sequence[int]]:
    """A HuggingFace tokenizer's encode function; clear error when transformers is missing.

    ``add_special_tokens=True`` (the default) tokenizes as vLLM's ``/v1/completions`` does (BOS
    included), which the block hashes need to equal the engine's KV event and store keys."""
    tok = _hf_tokenizer(name)
    return lambda text: tok.encode(text, add_special_tokens=add_special_tokens)


def load_chat_tokenizer(name: str) -> ChatTokenize | None:
    """The chat prompt's token ids as vLLM's ``/v1/chat/completions`` computes them: the chat
    template rendered to text (``add_generation_prompt`` defaults to true), then tokenized
    without special tokens (the template carries them). None when the tokenizer has no chat
    template (the proxy then hashes the flattened messages)."""
    tok = _hf_tokenizer(name)
    if not getattr(tok, "chat_template", None):
        return None

    def chat_tokenize(messages: list[dict[str, Any]], body: dict[str, Any]) -> Sequence[int]:
        cont = bool(body.get("continue_final_message", False))
        kwargs = body.get("chat_template_kwargs")
        try:
            text = tok.apply_chat_template(
                messages, tokenize=False, continue_final_message=cont,
                add_generation_prompt=bool(body.get("add_generation_prompt", True)) and not cont,
                **(kwargs if isinstance(kwargs, dict) else {}))
        except Exception as e:  # a template error is the client's input, not a proxy crash
            raise BadRequest(f"'messages' could not be rendered with the chat template of {name}: {e}") from None
        ids: Sequence[int] = tok.encode(text, add_special_tokens=bool(body.get("add_special_tokens", False)))
        return ids

    return chat_tokenize
