"""Atomic snapshots of the HTTP metadata server's table (``--persist-path``).

Mooncake's HTTP server forgets every segment descriptor on restart, after which new peers get
404 (Mooncake issue #2246). With a persist path the server writes the whole table after each
change and reloads it at start. Writes are atomic (temp file in the same directory, fsync,
``os.replace``, directory fsync), so a crash leaves either the old or the new snapshot, never
a torn file. The format is versioned JSON; values that are not UTF-8 are stored as base64.
"""

from __future__ import annotations

import base64
import json

from mooncake_core.utils.fileio import atomic_write

FORMAT = "mooncake-http-metadata"
VERSION = 1


class PersistError(RuntimeError):
    """The snapshot file exists but cannot be used (the message names the file)."""


def encode_snapshot(data: dict[str, bytes]) -> bytes:
    entries = {}
    for k, v in data.items():
        try:
            entries[k] = {"text": v.decode("utf-8")}
        except UnicodeDecodeError:
            entries[k] = {"b64": base64.b64encode(v).decode()}
    return json.dumps({"format": FORMAT, "version": VERSION, "keys": entries},
                      separators=(",", ":"), sort_keys=True).encode()


def decode_snapshot(raw: bytes, path: str = "<memory>") -> dict[str, bytes]:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise PersistError(f"persist file {path}: not valid JSON ({e}); move it away or fix it") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PersistError(f"persist file {path}: not a {FORMAT} snapshot")
    if doc.get("version") != VERSION:
        raise PersistError(f"persist file {path}: snapshot version {doc.get('version')!r}, "
                           f"this server reads version {VERSION}")
    out: dict[str, bytes] = {}
    for k, entry in doc.get("keys", {}).items():
        if isinstance(entry, dict) and "text" in entry:
            out[k] = entry["text"].encode("utf-8")
        elif isinstance(entry, dict) and "b64" in entry:
            out[k] = base64.b64decode(entry["b64"])
        else:
            raise PersistError(f"persist file {path}: malformed entry for key {k!r}")
    return out


def load(path: str) -> dict[str, bytes]:
    """The stored table, or {} when the file does not exist yet."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise PersistError(f"persist file {path}: cannot read ({e.strerror})") from None
    return decode_snapshot(raw, path)


def save(path: str, data: dict[str, bytes]) -> None:
    """Atomically (and durably: fsync file and directory) replace ``path`` with a snapshot of ``data``."""
    atomic_write(path, encode_snapshot(data), durable=True, prefix=".mc-meta-", suffix=".tmp")
