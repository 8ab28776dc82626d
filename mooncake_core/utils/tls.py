"""TLS contexts of the HTTP services (metadata server, proxy) from a certificate and key file.

Why a helper: the services take ``--tls-cert``/``--tls-key`` flags; a missing file, a key that
does not match the certificate or a half-given pair must fail at start with a message naming
the flag, not as an ssl traceback at the first connection. Clients verify with the system's
trust store; a private CA is added the OpenSSL way (``SSL_CERT_FILE=ca.pem``).
"""

from __future__ import annotations

import ssl


def server_context(cert: str | None, key: str | None, *, what: str = "--tls-cert/--tls-key") -> ssl.SSLContext | None:
    """An HTTPS server context, or None when neither file is given (plain HTTP)."""
    if not cert and not key:
        return None
    if not cert or not key:
        raise ValueError(f"{what}: give both the certificate and the private key (got only the "
                         f"{'certificate' if cert else 'key'})")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except FileNotFoundError as e:
        raise ValueError(f"{what}: {e.filename or cert}: no such file") from None
    except ssl.SSLError as e:
        raise ValueError(f"{what}: cannot load certificate {cert!r} with key {key!r}: {e.reason or e}") from None
    return ctx
