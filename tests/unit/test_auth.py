"""The pure auth rules (mooncake_core/auth.py): token sources, challenge proofs, bearer checks,
the exposure warning. No sockets: the services' tests (tests/security) drive them for real."""

from __future__ import annotations

import pytest

from mooncake_core import auth


def test_token_sources_in_order(tmp_path) -> None:
    f = tmp_path / "tok"
    f.write_text("from-file\nignored second line\n")
    env = {"MOONCAKE_AUTH_TOKEN": "from-env", "MOONCAKE_AUTH_TOKEN_FILE": str(f)}
    assert auth.resolve_token("from-flag", env) == "from-flag"
    assert auth.resolve_token(None, env) == "from-file"
    assert auth.resolve_token(None, {"MOONCAKE_AUTH_TOKEN": "from-env"}) == "from-env"
    assert auth.resolve_token(None, {}) is None
    assert auth.resolve_token(None, {"MOONCAKE_AUTH_TOKEN": ""}) is None


def test_a_broken_token_file_is_an_error_not_auth_off(tmp_path) -> None:
    with pytest.raises(auth.AuthConfigError, match="cannot read"):
        auth.resolve_token(None, {"MOONCAKE_AUTH_TOKEN_FILE": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(auth.AuthConfigError, match="empty"):
        auth.resolve_token(None, {"MOONCAKE_AUTH_TOKEN_FILE": str(tmp_path / "empty")})


def test_challenge_proofs() -> None:
    n1, n2 = auth.new_nonce(), auth.new_nonce()
    assert len(n1) == auth.NONCE_BYTES and n1 != n2
    p = auth.prove("tok", n1, auth.TE_CONTEXT)
    assert auth.verify("tok", n1, p, auth.TE_CONTEXT)
    assert not auth.verify("other", n1, p, auth.TE_CONTEXT)           # wrong token
    assert not auth.verify("tok", n2, p, auth.TE_CONTEXT)             # replayed on another challenge
    assert not auth.verify("tok", n1, p, auth.MASTER_CONTEXT)         # made for another channel
    assert not auth.verify("tok", n1, p[:-1], auth.TE_CONTEXT)        # truncated
    assert not auth.verify("tok", n1, b"", auth.TE_CONTEXT)
    assert b"tok" not in p


@pytest.mark.parametrize("header, alt, ok", [
    ("Bearer tok", None, True), ("bearer tok", None, True), ("Bearer  tok ", None, True),
    ("Bearer nope", None, False), ("tok", None, False), ("Basic tok", None, False), (None, None, False),
    ("", "tok", True), ("Bearer nope", "tok", True), (None, "nope", False), ("Bearer ", None, False),
])
def test_bearer(header, alt, ok) -> None:
    assert auth.bearer_ok("tok", header, alt) is ok
    assert auth.bearer_ok(None, header, alt) is True  # no token configured: open


@pytest.mark.parametrize("host, loop", [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True),
                                        ("localhost", True), ("0.0.0.0", False), ("::", False), ("", False),
                                        ("10.0.0.5", False), ("myhost", False)])
def test_exposure_warning(host, loop) -> None:
    w = auth.exposure_warning("svc", host, None, "do harm")
    assert (w is None) is loop
    if w:
        assert "SECURITY" in w and "MOONCAKE_AUTH_TOKEN" in w and "do harm" in w
    assert auth.exposure_warning("svc", host, "tok") is None


def test_refusal_names_service_reason_and_fix() -> None:
    m = auth.refusal("master x refused ping", "wrong token")
    assert "master x refused ping" in m and "wrong token" in m and "MOONCAKE_AUTH_TOKEN" in m
