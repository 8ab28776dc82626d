"""Stopping child processes (services, and peers driven over a stdin/stdout line protocol)
without ever hanging the caller or leaving zombies."""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import TypeVar

_Main = TypeVar("_Main", bound=Callable[..., int])


def quiet_ctrl_c(prog: str) -> Callable[[_Main], _Main]:
    """Decorate a command's ``main``: Ctrl-C ends it with one line and exit code 130 instead of
    a traceback (a user stopping a long run made no mistake). The ``finally`` blocks on the way
    out still stop whatever the command started."""
    def wrap(main: _Main) -> _Main:
        @functools.wraps(main)
        def run(*args: object, **kwargs: object) -> int:
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                print(f"\n{prog}: interrupted", file=sys.stderr, flush=True)  # off a progress bar's line
                return 130
        return run  # type: ignore[return-value]
    return wrap


def close_piped(proc: subprocess.Popen, command: str = "exit", timeout: float = 10.0) -> int | None:
    """Ask a line-driven child to exit by writing ``command``; kill it if it does not.

    A polite exit lets the child unregister its segment/metadata; killing is the fallback so a
    wedged child can never hang the caller. Always reaps the process (no zombies) and returns
    its return code (None only if even a SIGKILL'd child did not go away within ``timeout``).
    """
    if proc.poll() is None:
        assert proc.stdin is not None  # started with stdin=PIPE
        try:
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
            proc.wait(timeout)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            proc.kill()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def stop_process(proc: subprocess.Popen, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
    """Send ``sig`` (default SIGTERM) so the child can shut down cleanly; SIGKILL it after
    ``timeout`` seconds. Always reaps it; returns its return code (None if even SIGKILL
    did not end it within ``timeout``). A no-op apart from reaping for an exited child."""
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def thread_report(pid: int) -> str:
    """Every thread of process ``pid`` as the kernel sees it: name, state, the kernel function it
    sleeps in, and its blocked / pending signal masks (hex, bit n-1 = signal n), plus the
    process-wide pending set. What a child that did not act on a signal shows: a signal pending
    and blocked in every thread was never delivered; one no thread blocks was delivered and the
    interpreter did not get to run its handler (a thread holding the GIL). '' when ``pid`` is gone."""
    base = f"/proc/{pid}"
    try:
        with open(f"{base}/status") as f:
            shared = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("ShdPnd:")), "?")
        tids = sorted(os.listdir(f"{base}/task"), key=int)
    except OSError:
        return ""
    lines = [f"pid {pid}: process-wide pending signals ShdPnd={shared}"]
    for tid in tids:
        fields: dict[str, str] = {}
        try:
            with open(f"{base}/task/{tid}/status") as f:
                for ln in f:
                    k, _, v = ln.partition(":")
                    fields[k] = v.strip()
            with open(f"{base}/task/{tid}/wchan") as f:
                wchan = f.read().strip() or "-"
        except OSError:
            continue
        lines.append(f"  tid {tid} {fields.get('Name', '?')!r} state={fields.get('State', '?')} wchan={wchan} "
                     f"SigBlk={fields.get('SigBlk', '?')} SigPnd={fields.get('SigPnd', '?')}")
    return "\n".join(lines)


def readline_timeout(proc: subprocess.Popen, timeout: float, *, what: str = "child process") -> str:
    """One line from ``proc.stdout`` within ``timeout`` seconds.

    A blocking ``readline`` on a wedged child would hang the caller forever; here the read runs
    in a helper thread, and on timeout the child is killed (which also ends the read) and a
    TimeoutError naming ``what`` is raised. Returns '' at end of stream, like ``readline``.
    """
    import threading

    out: list[str] = []
    stdout = proc.stdout
    assert stdout is not None  # started with stdout=PIPE
    t = threading.Thread(target=lambda: out.append(stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        proc.kill()
        t.join(5)
        raise TimeoutError(f"{what} (pid {proc.pid}) sent no answer within {timeout:.0f}s; killed it")
    return out[0] if out else ""


def _drain_in_background(proc: subprocess.Popen, lines: list[str], keep: int = 200) -> None:
    """Keep reading the child's output after start-up. A pipe nobody reads fills up (64 KiB)
    and then blocks the child on its next log line -- a service under a long test froze that
    way. The last ``keep`` lines stay readable as ``proc.output_tail`` for failure messages."""
    import collections
    import threading

    tail: collections.deque[str] = collections.deque(lines[-keep:], maxlen=keep)
    proc.output_tail = tail  # type: ignore[attr-defined]

    def run() -> None:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                tail.append(line)
        except (OSError, ValueError):
            pass

    threading.Thread(target=run, name=f"drain-{proc.pid}", daemon=True).start()


def spawn_until(cmd: list[str], pattern: str, timeout: float, env: dict[str, str] | None = None,
                what: str = "process") -> tuple[subprocess.Popen, re.Match[str]]:
    """Start ``cmd`` (stdout+stderr piped, text) and read lines until one matches ``pattern``.

    For services that print the address they bound (``... listening on http://h:PORT``): the
    caller learns the port without racing for a free one. After the match the output keeps
    being read (``proc.output_tail``: the last lines), so the child never blocks on a full pipe.
    The whole wait is bounded by ``timeout`` (each read goes through :func:`readline_timeout`); on
    timeout or early exit the process is killed and RuntimeError carries its output.
    """
    import time

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line matching {pattern!r} within {timeout:.0f}s")
            line = readline_timeout(proc, left, what=what)
            if not line:
                raise RuntimeError(f"exited with code {proc.wait(5)}")
            lines.append(line)
            m = re.search(pattern, line)
            if m:
                _drain_in_background(proc, lines)
                return proc, m
    except (TimeoutError, RuntimeError) as e:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)
        raise RuntimeError(f"{what} {cmd} did not start: {e}; output:\n{''.join(lines)}") from None
