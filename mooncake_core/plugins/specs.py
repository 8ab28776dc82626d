"""What plugins hand back from their hooks (plain frozen dataclasses, no behaviour)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from mooncake_core.metadata.base import MetadataBackend
    from mooncake_core.metadata.conn_string import MetadataSpec


@dataclass(frozen=True)
class MetadataBackendPlugin:
    """One metadata backend, chosen by the scheme of a connection string.

    ``parse(conn, env)`` turns the whole connection string (``scheme://...``) into a spec
    object with at least ``kind`` and ``endpoint_text`` (ValueError naming the string on bad
    input; ``env`` is ``os.environ`` unless a caller passes its own); ``open(spec, timeout)``
    returns the :class:`~mooncake_core.metadata.base.MetadataBackend`. ``open`` is called only
    when the backend is used, so a backend whose client library is an optional extra can be
    registered without it (and say which extra to install when opened).
    """

    schemes: tuple[str, ...]
    parse: Callable[[str, Mapping[str, str]], "MetadataSpec"]
    open: Callable[[Any, float], "MetadataBackend"]
    #: human-readable accepted forms, listed in connection-string errors
    forms: str = ""


@dataclass(frozen=True)
class NamedFactory:
    """A named thing a plugin can build (a hand-off protocol, a scheduling policy)."""

    name: str
    factory: Callable[..., Any]
    #: one line for ``--help`` and error messages
    summary: str = ""
