"""Structured logging shared by every service and library module.

``get_logger(name)`` returns a stdlib logger. Services call ``setup_logging()`` once;
with ``MC_LOG_JSON=1`` each record is one JSON object per line (ts, level, logger, msg and
any ``extra={...}`` fields), otherwise ``key=value`` text. Level from ``MC_LOG_LEVEL``
(default INFO). Libraries never configure handlers themselves.
"""

from __future__ import annotations

import json
import logging
import sys
import time

_STD_ATTRS = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in record.__dict__.items():
            if k not in _STD_ATTRS and not k.startswith("_"):
                out[k] = v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class _KvFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
        extras = " ".join(
            f"{k}={v}" for k, v in record.__dict__.items()
            if k not in _STD_ATTRS and not k.startswith("_")
        )
        line = f"{ts} {record.levelname:<5} {record.name}: {record.getMessage()}"
        if extras:
            line += " | " + extras
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _ServiceHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler setup_logging installs, told apart from others so a second call replaces it."""


def setup_logging(level: str | None = None, json_format: bool | None = None) -> None:
    """Configure the root logger once for a service process (idempotent)."""
    from mooncake_core import envs

    level = (level or envs.MC_LOG_LEVEL).upper()
    if json_format is None:
        json_format = envs.MC_LOG_JSON
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, _ServiceHandler):
            root.removeHandler(h)
    handler = _ServiceHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if json_format else _KvFormatter())
    root.addHandler(handler)
    root.setLevel(level)


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
