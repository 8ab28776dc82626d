"""Mooncake trace files (JSONL): one request per line.

Fields: ``timestamp`` (ms from start), ``input_length`` and ``output_length`` (tokens),
``hash_ids`` (one id per 512-token block of the prompt; equal ids = identical prefix blocks,
ids chain their prefix like :class:`BlockHasher` keys). Decoded with msgspec into typed
records; a malformed line fails with its file and line number.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

__all__ = ["TraceRecord", "load_trace", "TRACE_BLOCK_SIZE"]

#: Tokens per ``hash_ids`` entry in the published traces.
TRACE_BLOCK_SIZE = 512


class TraceRecord(msgspec.Struct, frozen=True):
    timestamp: float
    input_length: int
    output_length: int
    hash_ids: list[int] = []


_decoder = msgspec.json.Decoder(TraceRecord)


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceRecord]:
    """Read up to ``limit`` records (all when None), checking order and lengths."""
    path = Path(path)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    out: list[TraceRecord] = []
    try:
        f = path.open("rb")
    except FileNotFoundError:
        raise FileNotFoundError(f"trace file not found: {path}") from None
    with f:
        prev = float("-inf")
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                rec = _decoder.decode(line)
            except msgspec.ValidationError as e:
                raise ValueError(f"{path}:{lineno}: bad trace record: {e}") from None
            except msgspec.DecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON: {e}") from None
            if rec.input_length < 0 or rec.output_length < 0:
                raise ValueError(f"{path}:{lineno}: input_length/output_length must be >= 0")
            if rec.timestamp < prev:
                raise ValueError(f"{path}:{lineno}: timestamps must be non-decreasing "
                                 f"({rec.timestamp} after {prev})")
            prev = rec.timestamp
            out.append(rec)
    return out
