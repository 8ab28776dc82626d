"""Small networking helpers: host:port parsing, port checks with clear errors, free ports."""

from __future__ import annotations

import socket
import subprocess
import time


def parse_host_port(value: str, default_port: int | None = None, *, what: str = "address") -> tuple[str, int]:
    """Split "host:port" (or "[v6]:port", or "host" with a default port).

    Raises ValueError naming ``what`` and the value when the port is missing or not a number.
    """
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what}: expected 'host:port', got {value!r}")
    value = value.strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port_s = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, port_s = value.split(":")
    else:
        host, port_s = value, ""
    if not port_s:
        if default_port is None:
            raise ValueError(f"{what}: missing port in {value!r} (expected 'host:port')")
        return host, default_port
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"{what}: port {port_s!r} in {value!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{what}: port {port} in {value!r} out of range 0..65535")
    return host, port


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on ``host`` (for tests and 'pick one for me' options)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def bind_listener(host: str, port: int, *, what: str, backlog: int = 512) -> socket.socket:
    """Bind+listen, turning EADDRINUSE and friends into an error that names the flag/service."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError as e:
        s.close()
        raise OSError(e.errno, f"{what}: cannot bind {host}:{port}: {e.strerror} "
                               f"(is another process using it? choose another port, or 0 for any)") from None
    s.listen(backlog)
    return s


def wait_for_port(host: str, port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Block until something accepts TCP connections on ``host:port``.

    Used wherever we start a service as a subprocess and must not talk to it before it
    listens. Polling (rather than reading a "ready" line) works for any binary, ours or not.
    When ``proc`` is given and exits first, fail at once with its return code instead of
    waiting out the timeout -- a crashed service is the common case and should be loud.

    Raises TimeoutError naming ``host:port`` after ``timeout`` seconds, RuntimeError when
    ``proc`` exited early.
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited early with code {proc.returncode} "
                               f"before listening on {host}:{port}")
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            with socket.create_connection((host, port), timeout=min(0.5, max(left, 0.05))):
                return
        except OSError:
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


def local_ip() -> str:
    """Best-effort non-loopback address of this host without sending traffic."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
