"""Turn an OpenAI request body into what the scheduler needs: prompt size and block hashes.

Without a tokenizer the proxy hashes the prompt's UTF-8 bytes (``BlockHasher.hash_text``,
≈4 bytes/token); with ``--tokenizer`` it hashes real token ids so the prefix index matches the
engine's blocks. Token-id prompts (``prompt: [1, 2, 3]``) are hashed as tokens either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence


class BadRequest(ValueError):
    """The client's body is not a valid completion request (message says which field)."""


@dataclass
class PromptInfo:
    prompt_tokens: int
    block_hashes: list[int]
    max_output_tokens: int


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


class PromptHasher:
    """Computes block hashes with the scheduler's BlockHasher, optionally through a tokenizer."""

    def __init__(self, hasher: Any, tokenize: Callable[[str], Sequence[int]] | None = None) -> None:
        self.hasher = hasher
        self.tokenize = tokenize
        self.block_size = int(getattr(hasher, "block_size", 512))

    def info(self, body: dict[str, Any], route: str) -> PromptInfo:
        prompt = extract_prompt(body, route)
        if isinstance(prompt, list):
            tokens: Sequence[int] = prompt
            hashes = self.hasher.hash_tokens(tokens)
            n = len(tokens)
        elif self.tokenize is not None:
            tokens = self.tokenize(prompt)
            hashes = self.hasher.hash_tokens(tokens)
            n = len(tokens)
        else:
            hashes = self.hasher.hash_text(prompt)
            n = max(1, len(prompt.encode("utf-8")) // 4)
        return PromptInfo(n, list(hashes), max_output_tokens(body))


def load_tokenizer(name: str) -> Callable[[str], Sequence[int]]:
    """A HuggingFace tokenizer's encode function; clear error when transformers is missing."""
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found]
    except ImportError:
        raise SystemExit(f"--tokenizer {name}: the 'transformers' package is not installed "
                         "(pip install transformers), or omit --tokenizer to hash prompt text") from None
    tok = AutoTokenizer.from_pretrained(name)
    return lambda text: tok.encode(text, add_special_tokens=False)
