"""Shared-secret authentication of mooncake-core's services (pure: no sockets, no logging).

One secret (``MOONCAKE_AUTH_TOKEN``, or the first line of the file ``MOONCAKE_AUTH_TOKEN_FILE``,
or a service's ``--auth_token`` flag) guards every surface a peer can reach: the master RPC,
the HTTP metadata server, the proxy's admin API and the Transfer Engine's rpc port. Clients
read the same variable, so a deployment sets it once and changes nothing else.

Why challenge-response on the binary channels (master RPC, TE rpc port) and a bearer header on
HTTP: the binary channels have no TLS, so the token itself never crosses them -- the server
sends a fresh random nonce and the client answers ``HMAC-SHA256(token, context | nonce)``; a
sniffed answer is useless on the next connection. HTTP clients (curl, upstream Mooncake tools)
speak ``Authorization: Bearer``; TLS (``--tls_cert``/``--tls_key``) keeps that header private.
Every comparison is constant time (:func:`hmac.compare_digest`).

The rest of this module says *whether* to warn: :func:`exposure_warning` is the loud line a
service logs when it listens beyond loopback with no token.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Mapping

from mooncake_core import envs

#: bytes of a server challenge
NONCE_BYTES = 16
#: the ``context`` of each channel: a proof made for one channel is refused by the others
TE_CONTEXT = "mooncake-te-rpc-v1"
MASTER_CONTEXT = "mooncake-master-rpc-v1"
#: the variables (declared in ``envs.py``; ``env`` lets tests pass a mapping instead of os.environ)
TOKEN_VAR = "MOONCAKE_AUTH_TOKEN"
TOKEN_FILE_VAR = "MOONCAKE_AUTH_TOKEN_FILE"


class AuthConfigError(ValueError):
    """The token is configured but unusable (unreadable or empty file)."""


def resolve_token(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The shared secret in force: ``explicit`` (a flag), else ``MOONCAKE_AUTH_TOKEN_FILE``'s
    first line, else ``MOONCAKE_AUTH_TOKEN``; None when none is set (auth off).

    A file that cannot be read or holds nothing is an error, not "auth off": a typo in the path
    must not silently open the service."""
    if explicit:
        return explicit
    path = envs.get(TOKEN_FILE_VAR, env)
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.readline().strip()
        except OSError as e:
            raise AuthConfigError(f"{TOKEN_FILE_VAR}={path!r}: cannot read the token file "
                                  f"({e.strerror or e})") from None
        if not token:
            raise AuthConfigError(f"{TOKEN_FILE_VAR}={path!r}: the file is empty (its first line is the token)")
        return token
    raw = envs.get(TOKEN_VAR, env)
    return raw if raw else None


def new_nonce() -> bytes:
    """A fresh server challenge."""
    return secrets.token_bytes(NONCE_BYTES)


def prove(token: str, nonce: bytes, context: str) -> bytes:
    """The client's answer to ``nonce`` on channel ``context``."""
    return hmac.new(token.encode(), context.encode() + b"|" + bytes(nonce), hashlib.sha256).digest()


def verify(token: str, nonce: bytes, proof: bytes, context: str) -> bool:
    """Is ``proof`` the answer to ``nonce`` for ``token`` (constant time)?"""
    return hmac.compare_digest(prove(token, nonce, context), bytes(proof))


def bearer_ok(token: str | None, authorization: str | None, *alternates: str | None) -> bool:
    """HTTP: does ``Authorization: Bearer X`` (or one of the ``alternates``, e.g. the proxy's
    ``X-Admin-Key``) carry ``token``? True when no token is configured."""
    if not token:
        return True
    presented: list[str] = []
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        presented.append(value.strip())
    presented += [a for a in alternates if a]
    want = token.encode()
    # evaluate every candidate (no short cut): the time taken does not depend on which matched
    return bool(sum(hmac.compare_digest(p.encode(), want) for p in presented))


def is_loopback(host: str) -> bool:
    """Does listening on ``host`` keep the service on this machine?"""
    h = host.strip().strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def exposure_warning(service: str, host: str, token: str | None, what: str = "") -> str | None:
    """The warning a service logs at start when it is reachable from the network with no token
    (None when it is loopback-only or protected). ``what`` says what an intruder could do."""
    if token or is_loopback(host):
        return None
    harm = f" -- anyone who can reach this host can {what}" if what else ""
    return (f"SECURITY: {service} listens on {host or '0.0.0.0'} (beyond loopback) WITHOUT authentication"
            f"{harm}; set {TOKEN_VAR} (or {TOKEN_FILE_VAR}) here and on every client, or bind to "
            f"127.0.0.1 (docs/security.md)")


def refusal(service: str, reason: str) -> str:
    """The error text both ends show for a refused peer."""
    return (f"{service}: authentication failed ({reason}); set {TOKEN_VAR} (or {TOKEN_FILE_VAR}) "
            f"to the server's token on this client")


__all__ = ["NONCE_BYTES", "TE_CONTEXT", "MASTER_CONTEXT", "TOKEN_VAR", "TOKEN_FILE_VAR", "AuthConfigError",
           "resolve_token", "new_nonce", "prove", "verify", "bearer_ok", "is_loopback", "exposure_warning",
           "refusal"]
