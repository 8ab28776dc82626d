"""How each ``<!-- doc-test: NAME -->`` block of the docs is run (tests/docs/test_doc_commands.py).

A run takes the block as the doc has it, makes the few substitutions a test needs (free ports
for fixed ones, a temporary directory for fixed paths), each of which must still match the doc
(a doc that changed under a substitution fails, naming its line), and runs it with bash in a
session of its own; whatever it left running in the background is stopped afterwards.

Commands that install things (``scripts/install*.sh``) are not run again: CI ran them before the
tests (``.ci/run``), so their run checks their effect instead and says so.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .doc_blocks import DocBlock, commands, load_docs

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Ctx:
    tmp: Path
    env: dict[str, str]
    free_port: Callable[[], int]


def substitute(block: DocBlock, text: str, subs: list[tuple[str, str]]) -> str:
    """Apply ``(pattern, replacement)`` pairs; a pattern is a regex matched at word edges
    (``\\b``) when it starts and ends with word characters. Each must match."""
    for pat, new in subs:
        rx = re.escape(pat)
        if re.match(r"\w", pat) and re.search(r"\w$", pat):
            rx = rf"(?<![\w.]){rx}(?![\w])"
        text, n = re.subn(rx, new.replace("\\", "\\\\"), text)
        assert n, (f"{block.where(-1)}: the block no longer contains {pat!r}, which its doc test replaces; "
                   f"update the run in tests/docs/doc_runs.py to the doc's new text")
    return text


def run_bash(block: DocBlock, script: str, ctx: Ctx, timeout: float, name: str) -> str:
    """Run ``script`` with bash -e in its own session; returns its output. Fails naming the doc
    line when it exits non-zero or runs past ``timeout``; background processes are stopped."""
    log = ctx.tmp / f"{name}.log"
    path = ctx.tmp / f"{name}.sh"
    path.write_text("set -eo pipefail\n" + script + "\n")
    with open(log, "wb") as out:
        p = subprocess.Popen(["bash", str(path)], cwd=REPO, env=ctx.env, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            stop_session(p.pid)
    text = log.read_text(errors="replace")
    assert rc is not None, f"{block.where(-1)}: the block ran past {timeout:.0f} s; output:\n{text[-4000:]}"
    assert rc == 0, f"{block.where(-1)}: the block exited with {rc}; output:\n{text[-4000:]}"
    return text


def stop_session(sid: int) -> None:
    """SIGINT (what Ctrl-C sends), then SIGTERM, then SIGKILL to every process of session ``sid``."""
    for sig, wait in ((signal.SIGINT, 10.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
        pids = session_pids(sid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and session_pids(sid):
            time.sleep(0.2)


def session_pids(sid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if os.getsid(int(d.name)) == sid and (d / "stat").read_text().split()[2] != "Z":
                out.append(int(d.name))
        except (ProcessLookupError, PermissionError, FileNotFoundError, OSError):
            continue
    return out


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> bytes:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.read()
        except Exception as e:  # noqa: BLE001 - not up yet
            last = e
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {timeout:.0f} s: {last}")


def start_and_interrupt(block: DocBlock, offset: int, argv: list[str], ctx: Ctx, ready: Callable[[], object],
                        name: str) -> str:
    """Start one of the block's servers, wait until ``ready()`` passes, press Ctrl-C (SIGINT):
    it must exit 0 at once, with no traceback. Returns its output."""
    log = ctx.tmp / f"{name}.log"
    with open(log, "wb") as out:
        p = subprocess.Popen(argv, cwd=ctx.tmp, env=ctx.env, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            try:
                ready_check(p, ready)
            except AssertionError as e:
                raise AssertionError(f"{block.where(offset)}: {' '.join(argv)}: {e}\n{log.read_text()[-3000:]}") \
                    from None
            p.send_signal(signal.SIGINT)
            rc = p.wait(15)
        finally:
            stop_session(p.pid)
    text = log.read_text(errors="replace")
    assert rc == 0, f"{block.where(offset)}: exited with {rc} on Ctrl-C:\n{text[-3000:]}"
    assert "Traceback" not in text, f"{block.where(offset)}: a traceback:\n{text[-3000:]}"
    return text


def ready_check(p: subprocess.Popen, ready: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise AssertionError(f"exited with {p.returncode} before it was ready")
        try:
            ready()
            return
        except Exception as e:  # noqa: BLE001 - not ready yet
            last = e
            time.sleep(0.2)
    raise AssertionError(f"not ready within {timeout:.0f} s: {last}")


def master_ready(port: int) -> Callable[[], object]:
    from mooncake_core.store.master_client import MasterClient

    def check() -> object:
        with MasterClient(f"127.0.0.1:{port}", timeout=1.0) as c:
            return c.ping()
    return check


def lines_of(block: DocBlock) -> dict[int, list[str]]:
    """The block's commands by line offset (their words, comments dropped)."""
    return {c.offset: list(c.words) for c in commands(block.text)}


def ci_script() -> str:
    return (REPO / ".ci" / "run").read_text()


def venv_python(framework: str) -> Path:
    from mooncake_lab.venvs import venv_python as vp

    return vp(framework)


# ---------------------------------------------------------------------------- the runs
def run_install_and_demo(block: DocBlock, ctx: Ctx) -> None:
    """README quick start: ``scripts/install.sh`` already ran in CI (.ci/run runs it with
    --with-frameworks before the tests): checked by its effect (this package importable from
    the environment, the console script on PATH); then ``mooncake_demo`` runs as written."""
    assert "scripts/install.sh" in ci_script(), ".ci/run no longer runs scripts/install.sh"
    assert shutil.which("mooncake_demo", path=ctx.env["PATH"]), "scripts/install.sh did not put mooncake_demo on PATH"
    if os.environ.get("CI"):  # what it installs with apt, for the suite's services
        missing = [b for b in ("etcd", "redis-server") if not shutil.which(b, path=ctx.env["PATH"])]
        assert not missing, f"scripts/install.sh ran in CI but {missing} are not on PATH"
    script = substitute(block, block.text, [("scripts/install.sh && ", "")])
    out = run_bash(block, script, ctx, 300, "demo")
    assert "transfer engine demo PASSED" in out and "all checks passed" in out, out[-3000:]


def run_full_tests(block: DocBlock, ctx: Ctx) -> None:
    """README: the whole suite. This is what CI itself runs (.ci/run: the same install command,
    then the same pytest command), so the check is that .ci/run still runs these exactly."""
    ci = ci_script()
    for c in commands(block.text):
        line = " ".join(c.words)
        expect = ("bash " + line) if line.startswith("scripts/") else line
        assert expect in ci, f"{block.where(c.offset)}: .ci/run no longer runs {line!r}"


def run_fast_lane(block: DocBlock, ctx: Ctx) -> None:
    """README: the fast lane. Its tests run within the whole suite CI runs (collecting them all
    again here costs a minute); what is checked is that the command, as written, selects the
    tests without processes and leaves out the integration ones -- on two directories that
    hold both kinds (``--collect-only`` added)."""
    [c] = commands(block.text)
    cmd = " ".join(shlex.quote(w) for w in c.words) + " --collect-only -p no:cacheprovider tests/docs tests/unit"
    out = run_bash(block, cmd, ctx, 120, "fastlane")
    m = re.search(r"(\d+)/(\d+) tests collected \((\d+) deselected\)", out)
    assert m and int(m.group(1)) > 0 and int(m.group(3)) > 0, \
        f"{block.where(c.offset)}: the fast lane's marker expression selects nothing or everything:\n{out[-2000:]}"
    assert "test_doc_commands.py" not in out and "test_doc_blocks.py" in out, out[-3000:]


def run_vllm_1p1d(block: DocBlock, ctx: Ctx) -> None:
    """README: prefill and decode vLLM servers with MooncakeCoreConnector behind mooncake_proxy,
    then a completion. ``scripts/install_vllm.sh`` already ran in CI (checked: the vLLM venv
    has vLLM and this package); ports and the model directory are made free/temporary."""
    _vllm_block(block, ctx)


def run_vllm_guide(block: DocBlock, ctx: Ctx) -> None:
    """docs/vllm.md: the same pair with the decode's ``kv_load_failure_policy``; served until
    the proxy reports both instances healthy, then a completion through it."""
    _vllm_block(block, ctx)


def _vllm_block(block: DocBlock, ctx: Ctx) -> None:
    py = venv_python("vllm")
    assert py.exists(), f"no vLLM venv at {py}: scripts/install_vllm.sh (CI runs it) did not build it"
    p_port, d_port, x_port = ctx.free_port(), ctx.free_port(), ctx.free_port()
    model = ctx.tmp / "tiny"
    install = next(ln for ln in block.text.splitlines() if "scripts/install_vllm.sh" in ln)
    # the install line: already ran (CI); what follows `&&` on it, or the lines after, run
    subs = [(install, install.split("&& ", 1)[1] if "&& " in install else ""),
            ("/tmp/tiny", str(model)), ("8100", str(p_port)), ("8200", str(d_port))]
    subs += [("8000", str(x_port))]
    script = substitute(block, block.text, subs)
    out = run_bash(block, script, ctx, 840, "vllm-" + str(block.line))  # 2 cores: ~2 min; shared: more
    # curl's answer has no newline: the servers' shutdown lines may follow it on its line
    at = out.rfind('{"id":')
    assert at >= 0, f"{block.where(-1)}: no JSON answer from the proxy:\n{out[-4000:]}"
    answer, _ = json.JSONDecoder().raw_decode(out, at)
    assert answer.get("choices") and isinstance(answer["choices"][0].get("text"), str), answer
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", answer["id"]), f"completion id {answer['id']!r}"


def run_store_quickstart(block: DocBlock, ctx: Ctx) -> None:
    """docs/store.md: the store demo, then a master with its metadata server in the background
    (ports made free), which must serve, and stop cleanly on Ctrl-C."""
    cmds = lines_of(block)
    demo = next(w for w in cmds.values() if w and w[0] == "mooncake_store_demo")
    out = run_bash(block, " ".join(demo), ctx, 300, "store-demo")
    assert "all checks passed" in out or "PASSED" in out, out[-3000:]
    offset, master = next((o, w) for o, w in cmds.items() if w and w[0] == "mooncake_master")
    port, meta, metrics = ctx.free_port(), ctx.free_port(), ctx.free_port()
    argv = [re.sub(r"--http_metadata_server_port=8080$", f"--http_metadata_server_port={meta}", w) for w in master]
    assert argv != master, f"{block.where(offset)}: no --http_metadata_server_port=8080 to replace"
    argv += [f"--port={port}", f"--metrics_port={metrics}"]

    def ready() -> None:
        master_ready(port)()
        _metadata_up(meta)
    start_and_interrupt(block, offset, argv, ctx, ready, "store-master")


def run_store_service(block: DocBlock, ctx: Ctx) -> None:
    """docs/store.md, the store as a service: the master and ``mooncake_client`` as written
    (ports free, a 256 MB segment), its health URL, then the doc's Python snippet (a dummy
    client); a second dummy process reads what the first stored (the objects outlived it);
    Ctrl-C stops the service with 0 and no traceback."""
    port, meta, metrics, svc, http = (ctx.free_port() for _ in range(5))
    text = substitute(block, block.text, [("50051", str(port)), ("8080", str(meta)), ("4GB", "256MB"),
                                          ("50052", str(svc)), ("9300", str(http))])
    cmds = {c.offset: list(c.words) for c in commands(text)}
    master = next(w for w in cmds.values() if w[0] == "mooncake_master") + [f"--port={port}",
                                                                             f"--metrics_port={metrics}"]
    offset, client = next((o, w) for o, w in cmds.items() if w[0] == "mooncake_client")
    url = next(w for w in cmds.values() if w[0] == "curl")[-1]
    [snippet] = [b for b in load_docs(REPO) if b.path == block.path and b.lang == "python"
                 and b.line > block.line and b.line < block.line + 30][:1]
    code = substitute(snippet, snippet.text, [("50052", str(svc))])
    procs: list[subprocess.Popen] = []
    try:
        for name, argv in (("master", master), ("client", client)):
            with open(ctx.tmp / f"service-{name}.log", "wb") as out:
                procs.append(subprocess.Popen(argv, cwd=ctx.tmp, env=ctx.env, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True))
            if name == "master":
                ready_check(procs[-1], master_ready(port))
        try:
            assert wait_http(url, 60, procs[-1]).strip() == b"OK"
        except AssertionError as e:
            raise AssertionError(f"{block.where(offset)}: {e}\n{(ctx.tmp / 'service-client.log').read_text()[-3000:]}") \
                from None
        for what, src in (("snippet", code), ("reader", _SERVICE_READER.format(svc=svc))):
            r = subprocess.run([sys.executable, "-c", src], cwd=ctx.tmp, env=ctx.env, capture_output=True, text=True,
                               timeout=120)
            assert r.returncode == 0, f"{snippet.where(-1)}: the {what} failed:\n{r.stderr[-3000:]}"
        client_proc = procs[-1]
        client_proc.send_signal(signal.SIGINT)
        rc = client_proc.wait(15)
    finally:
        for p in reversed(procs):
            stop_session(p.pid)
    text_out = (ctx.tmp / "service-client.log").read_text(errors="replace")
    assert rc == 0 and "Traceback" not in text_out, f"{block.where(offset)}: exit {rc} on Ctrl-C:\n{text_out[-3000:]}"


#: a second engine-like process: what the doc's snippet stored is still in the pool
_SERVICE_READER = """
from mooncake_core.store import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup_dummy(4 << 20, 4 << 20, "127.0.0.1:{svc}") == 0
assert s.get("prefix/1") == b"kv bytes", s.get("prefix/1")
assert s.get_size("prefix/2") == 1 << 20
s.close()
"""


def run_store_master(block: DocBlock, ctx: Ctx) -> None:
    """docs/store-master.md: each single-host form starts, serves and stops on Ctrl-C (ports
    free, the SSD directory temporary); ``--help`` prints every flag. The HA form needs etcd
    members on other hosts: its flags are parsed (test_doc_blocks), it is not started."""
    ran = 0
    for offset, words in lines_of(block).items():
        if not words or words[0] != "mooncake_master":
            continue
        if any(w.startswith("--enable_ha") for w in words):
            continue  # several hosts (etcd members 10.0.0.x)
        if "--help" in words:
            out = run_bash(block, "mooncake_master --help", ctx, 60, "master-help")
            assert "--eviction_high_watermark_ratio" in out and "--enable_ha" in out, out[:2000]
            ran += 1
            continue
        port, metrics, meta = ctx.free_port(), ctx.free_port(), ctx.free_port()
        argv = [w.replace("/mnt/kvssd", str(ctx.tmp / "kvssd")) for w in words]
        argv = [a for a in argv if not a.startswith("--port=")]
        argv += [f"--port={port}", f"--metrics_port={metrics}", f"--http_metadata_server_port={meta}"]
        start_and_interrupt(block, offset, argv, ctx, master_ready(port), f"master-{offset}")
        ran += 1
    assert ran >= 4, f"{block.where(-1)}: expected at least 4 runnable mooncake_master lines, ran {ran}"


def run_lmcache_master(block: DocBlock, ctx: Ctx) -> None:
    """docs/lmcache.md: the master with its HTTP metadata server (ports free); both must serve."""
    [(offset, words)] = [(o, w) for o, w in lines_of(block).items() if w and w[0] == "mooncake_master"]
    port, meta, metrics = ctx.free_port(), ctx.free_port(), ctx.free_port()
    argv = substitute(block, " ".join(words), [("50051", str(port)), ("8080", str(meta))]).split()
    argv += [f"--metrics_port={metrics}"]

    def ready() -> None:
        master_ready(port)()
        _metadata_up(meta)
    start_and_interrupt(block, offset, argv, ctx, ready, "lmcache-master")


def _metadata_up(port: int) -> None:
    import urllib.error

    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metadata?key=doc-test-probe", timeout=2)
    except urllib.error.HTTPError as e:
        assert e.code == 404, e  # the server answers: no such key


def run_chaos_help(block: DocBlock, ctx: Ctx) -> None:
    """docs/chaos.md: the runs take minutes each (their flags are parsed by test_doc_blocks);
    the ``--help`` line runs."""
    [(offset, _)] = [(o, w) for o, w in lines_of(block).items() if "--help" in w]
    line = block.text.splitlines()[offset].split("#")[0]
    out = run_bash(block, line, ctx, 60, "chaos-help")
    assert out.count("usage:") == 2, out[:2000]


def run_replay(block: DocBlock, ctx: Ctx) -> None:
    """docs/proxy.md: mooncake_replay against a live mooncake_proxy over two fake engines (the
    trace: the first 60 rows of the conversation trace kept in tests/replay)."""
    p_port, d_port, x_port = ctx.free_port(), ctx.free_port(), ctx.free_port()
    procs = []
    try:
        for port in (p_port, d_port):
            procs.append(subprocess.Popen([sys.executable, "-m", "mooncake_proxy.fake_engine", "--port", str(port),
                                           "--chunks", "4"], env=ctx.env, cwd=ctx.tmp, start_new_session=True,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen(["mooncake_proxy", "--port", str(x_port), "--prefill",
                                       f"http://127.0.0.1:{p_port}", "--decode", f"http://127.0.0.1:{d_port}"],
                                      env=ctx.env, cwd=ctx.tmp, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_http(f"http://127.0.0.1:{x_port}/health", 30, procs[-1])
        trace = REPO / "tests" / "replay" / "conversation_head60.jsonl"
        script = substitute(block, block.text, [("traces/conversation_trace.jsonl", str(trace)),
                                                ("8000", str(x_port))])
        out = run_bash(block, script, ctx, 240, "replay")
    finally:
        for p in procs:
            stop_session(p.pid)
    m = re.search(r"requests (\d+)\s+completed (\d+)\s+failed (\d+)", out)
    assert m and int(m.group(2)) > 0 and m.group(3) == "0", f"{block.where(-1)}: replay report:\n{out[-3000:]}"


RUNS: dict[str, Callable[[DocBlock, Ctx], None]] = {
    "install-demo": run_install_and_demo,
    "full-tests": run_full_tests,
    "fast-lane": run_fast_lane,
    "vllm-1p1d": run_vllm_1p1d,
    "vllm-guide": run_vllm_guide,
    "store-quickstart": run_store_quickstart,
    "store-service": run_store_service,
    "store-master": run_store_master,
    "lmcache-master": run_lmcache_master,
    "chaos-help": run_chaos_help,
    "replay": run_replay,
}
