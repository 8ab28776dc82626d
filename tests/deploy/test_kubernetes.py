"""deploy/kubernetes/ and the Dockerfile: every manifest validates (strictly, offline) against the
Kubernetes schemas ``kubernetes-validate`` ships; the kustomization lists every file; each
container of ours starts a command this package installs with flags its own parser accepts
(the CLIs' parsers are run on the manifests' arguments, not compared with a list); every
``MOONCAKE_*`` variable is one ``mooncake_core.envs`` declares; the vLLM pods' connector config
names our connectors and options our connector reads; the pods have probes, requests and the auth
Secret; the images are the Dockerfile's targets and what it copies exists."""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import re
import shlex
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from mooncake_core import envs
from tests.proxy.conftest import make_env  # noqa: F401  (fixture)

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
OUR_IMAGES = {"mooncake-core", "mooncake-core-vllm"}
#: values the downward API / env would give $(VAR) references, for parsing the arguments
SAMPLE_ENV = {"POD_IP": "10.1.2.3", "POD_NAME": "pod-0", "MODEL": "some/model"}


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for f in sorted(K8S.glob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        out += [(f.name, d) for d in yaml.safe_load_all(f.read_text()) if d]
    return out


def _pod_specs() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(file, workload, pod spec) of every workload."""
    for name, d in _manifests():
        spec = d.get("spec", {})
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            yield name, d, spec["template"]["spec"]


def _containers() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for name, d, pod in _pod_specs():
        for c in pod.get("initContainers", []) + pod["containers"]:
            yield name, d, c


def _expand(arg: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), SAMPLE_ENV.get(m.group(1), "x")), arg)


def _scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_every_manifest_validates_against_the_kubernetes_schemas() -> None:
    import kubernetes_validate
    from kubernetes_validate.utils import latest_version

    version = latest_version()
    docs = _manifests()
    assert {d["kind"] for _, d in docs} >= {"Namespace", "Secret", "StatefulSet", "Deployment", "DaemonSet",
                                            "Service", "NetworkPolicy"}
    for name, d in docs:
        try:
            kubernetes_validate.validate(d, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{name}: {d['kind']} {d['metadata']['name']}: {e.message} at {list(e.path)}")


def test_schema_validation_catches_a_typo() -> None:
    """The validator is strict: a misspelt field (what a hand-edit introduces) is an error."""
    import kubernetes_validate
    from kubernetes_validate.utils import latest_version

    [(_, master)] = [(n, d) for n, d in _manifests() if d["kind"] == "Deployment"
                     and d["metadata"]["name"] == "mooncake-master"]
    master["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = master["spec"]["template"]["spec"][
        "containers"][0].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinessprobe"):
        kubernetes_validate.validate(master, latest_version(), strict=True)


def test_kustomization_lists_every_manifest_and_images_are_dockerfile_targets() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {f.name for f in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files
    assert all(d["metadata"].get("namespace", kust["namespace"]) == kust["namespace"] for _, d in _manifests()
               if d["kind"] != "Namespace")
    assert {i["name"] for i in kust["images"]} == OUR_IMAGES
    dockerfile = (ROOT / "Dockerfile").read_text()
    stages = set(re.findall(r"^FROM \S+ AS (\w+)", dockerfile, re.M))
    assert {"core", "vllm"} <= stages
    for src in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile, re.M):
        for part in src.split():
            assert (ROOT / part).exists(), f"Dockerfile copies {part}, which does not exist"
    used = {c["image"] for _, _, c in _containers()}
    assert OUR_IMAGES <= used


def _check_argparse(parser: argparse.ArgumentParser, args: list[str], where: str) -> argparse.Namespace:
    try:
        return parser.parse_args(args)
    except SystemExit:
        pytest.fail(f"{where}: {parser.prog} rejects {shlex.join(args)} (see the error above)")


def _check_our_cli(prog: str, args: list[str], where: str) -> None:
    """Run ``prog``'s own parser on ``args``: the argparse parser its module builds, or the
    gflags-style flag set of the master or of mooncake_client."""
    module_name, _, func = _scripts()[prog].partition(":")
    mod = importlib.import_module(module_name)
    if hasattr(mod, "build_parser"):
        ns = _check_argparse(mod.build_parser(), args, where)
        if hasattr(mod, "config_from_args"):  # the values too (ports, URLs, enums)
            mod.config_from_args(ns)
    elif hasattr(mod, "master_flagset") or hasattr(mod, "client_flagset"):
        from mooncake_core.store.flags import FlagError

        flagset = mod.master_flagset if hasattr(mod, "master_flagset") else mod.client_flagset
        try:
            flagset().parse(args)
        except FlagError as e:
            pytest.fail(f"{where}: {prog} rejects {shlex.join(args)}: {e}")
    else:
        pytest.fail(f"{where}: no parser found for {prog} ({module_name}); teach this test where it is")


def _connector_options() -> set[str]:
    """The kv_connector_extra_config keys our connectors read (``_extra(vllm_config, "key", ...)``
    or ``extra("key", ...)`` in their settings modules)."""
    out: set[str] = set()
    for f in (ROOT / "mooncake_connectors" / "vllm").glob("*.py"):
        out |= set(re.findall(r"\b(?:_?extra|x|get_from_extra_config)\(\s*(?:\w+,\s*)?\"(\w+)\"", f.read_text()))
    return out


def test_commands_and_flags_match_our_clis() -> None:
    from mooncake_connectors.vllm.plugin import CONNECTORS

    scripts = _scripts()
    seen: set[str] = set()
    options = _connector_options()
    assert "kv_lease_s" in options
    for name, d, c in _containers():
        where = f"{name}: {d['metadata']['name']}/{c['name']}"
        if c["image"] not in OUR_IMAGES:
            continue
        env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
        cmd = [_expand(a, env) for a in c.get("command", []) + c.get("args", [])]
        assert cmd, f"{where}: no command (the image's default is a help text)"
        if cmd[0] in scripts:
            _check_our_cli(cmd[0], cmd[1:], where)
            seen.add(cmd[0])
        elif cmd[:2] == ["vllm", "serve"]:
            i = cmd.index("--kv-transfer-config")
            cfg = json.loads(cmd[i + 1])
            assert cfg["kv_connector"] in CONNECTORS, f"{where}: unknown connector {cfg['kv_connector']}"
            assert cfg["kv_role"] in ("kv_producer", "kv_consumer", "kv_both"), where
            unknown = set(cfg.get("kv_connector_extra_config", {})) - options
            assert not unknown, f"{where}: our connectors read no option {sorted(unknown)}"
            seen.add("vllm")
        elif cmd[0] == "python":  # a script shipped in a ConfigMap of the same file
            script = Path(cmd[1]).name
            [body] = [cm["data"][script] for n, cm in _manifests() if n == name and cm["kind"] == "ConfigMap"]
            tree = ast.parse(body)  # it compiles
            imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            for m in imported - {None}:
                if m.split(".")[0].startswith("mooncake"):
                    importlib.import_module(m)
            seen.add("python")
        else:
            pytest.fail(f"{where}: starts {cmd[0]!r}, which this package does not install")
    assert {"mooncake_master", "mooncake_proxy", "mooncake_doctor", "mooncake_client", "vllm"} <= seen


def test_env_probes_requests_and_auth() -> None:
    for name, d, c in _containers():
        where = f"{name}: {d['metadata']['name']}/{c['name']}"
        assert c.get("resources", {}).get("requests"), f"{where}: no resource requests"
        if d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith("etcd"):
            continue
        for e in c.get("env", []):
            if e["name"].startswith(("MOONCAKE_", "MC_")):
                assert e["name"] in envs.VARIABLES, f"{where}: {e['name']} is not a variable of mooncake_core.envs"
            if e["name"] == "MOONCAKE_LOCAL_HOSTNAME":
                assert e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", where
        init = c in d["spec"]["template"]["spec"].get("initContainers", [])
        for probe in () if init else ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["path"] in ("/health", "/healthcheck"), f"{where}: {probe}"
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        assert "/etc/mooncake/auth" in mounts, f"{where}: the auth token Secret is not mounted"
        token_from = {e["name"]: e.get("value") for e in c.get("env", [])}.get("MOONCAKE_AUTH_TOKEN_FILE")
        args = " ".join(c.get("args", []))
        assert token_from == "/etc/mooncake/auth/token" or "--auth_token_file=/etc/mooncake/auth/token" in args, where
    annotated = {d["metadata"]["name"] for _, d, _ in _pod_specs()
                 if d["spec"]["template"]["metadata"].get("annotations", {}).get("prometheus.io/scrape") == "true"}
    assert {"mooncake-master", "mooncake-proxy", "mooncake-store-node"} <= annotated


@pytest.mark.integration
def test_store_node_runs_mooncake_client_as_written(tmp_path, python_exe: str, monkeypatch) -> None:
    """The DaemonSet's container, its arguments as the manifest has them (the etcd addresses
    pointed at a live master, free ports, a 16 MB segment): it mounts its segment, answers
    /health, serves a dummy client (setup_dummy) that needs the token, and unmounts on SIGTERM
    (exit 0)."""
    import signal
    import subprocess
    import time
    import urllib.request

    from mooncake_core.store.client import MooncakeDistributedStore
    from mooncake_core.store.master_client import MasterClient
    from mooncake_core.utils.net import free_port, wait_for_port
    from mooncake_core.utils.proc import stop_process
    from mooncake_lab.store_procs import Master

    [ds] = [d for n, d in _manifests() if n == "store-node.yaml" and d["kind"] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"].get("hostNetwork") is True  # dummies on the node reach its socket
    [c] = ds["spec"]["template"]["spec"]["containers"]
    master = Master(python_exe, str(tmp_path)).start()
    port, http = free_port(), free_port()
    token = tmp_path / "token"
    token.write_text("node-secret\n")
    subs = {"etcd://mooncake-etcd:2379": None, "50052": str(port), "9300": str(http), "4GB": "16MB",
            "/etc/mooncake/auth/token": str(token)}
    args = []
    for a in c["args"]:
        a = _expand(a, {"POD_IP": "127.0.0.1"})
        flag, _, value = a.partition("=")
        if value == "etcd://mooncake-etcd:2379":
            value = master.addr if flag == "--master_server_address" else master.meta
        elif value in subs:
            value = subs[value] or value
        args.append(f"{flag}={value}")
    assert c["command"] == ["mooncake_client"]
    proc = subprocess.Popen([python_exe, "-m", "mooncake_core.store.real_client_main", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    store = MooncakeDistributedStore()
    try:
        wait_for_port("127.0.0.1", http, 60, proc)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/health", timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "no /health 200 within 30 s"
                time.sleep(0.2)
        with MasterClient(master.addr, timeout=2.0) as mc:
            assert mc.ping().num_segments == 1
        assert store.setup_dummy(1 << 20, 1 << 20, f"127.0.0.1:{port}") == -1  # no token in this process
        monkeypatch.setenv("MOONCAKE_AUTH_TOKEN", "node-secret")
        assert store.setup_dummy(1 << 20, 1 << 20, f"127.0.0.1:{port}") == 0
        assert store.put("k", b"v" * 1000) == 0 and store.get("k") == b"v" * 1000
        store.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, proc.stdout.read().decode() if proc.stdout else ""
        deadline = time.monotonic() + 5
        with MasterClient(master.addr, timeout=2.0) as mc:
            while mc.ping().num_segments != 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert mc.ping().num_segments == 0
    finally:
        store.close()
        stop_process(proc)
        master.stop()


@pytest.mark.integration
async def test_engine_pod_hooks_join_drain_and_leave_the_proxy(make_env, tmp_path, python_exe: str) -> None:  # noqa: F811
    """The vLLM pods' postStart / preStop hooks, as the manifest ships them, against a live proxy:
    preStop drains the pod's instance (waiting until safe) and deletes it; postStart registers it."""
    import asyncio

    [(_, sts)] = [(n, d) for n, d in _manifests() if d["kind"] == "StatefulSet" and n == "vllm-decode.yaml"]
    [c] = sts["spec"]["template"]["spec"]["containers"]
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    hooks = {k: c["lifecycle"][k]["exec"]["command"][2].replace("/etc/mooncake/auth/token", str(token))
             for k in ("postStart", "preStop")}
    env = await make_env(n_decode=2, admin_key="s3cret")
    iid = f"decode@{env.decode_urls[1]}"
    hook_env = {"PROXY_INSTANCE": iid, "PROXY_ADMIN": env.url + "/admin/instances", "PATH": "/usr/bin:/bin"}

    async def run(hook: str) -> str:
        p = await asyncio.create_subprocess_exec(python_exe, "-c", hooks[hook], env=hook_env,
                                                 stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(p.communicate(), 60)
        assert p.returncode == 0, out.decode()
        return out.decode()

    out = await run("preStop")
    assert json.loads(out)["safe_to_stop"] is True
    assert env.server.registry.get(iid) is None
    await run("postStart")
    assert env.server.registry.get(iid) is not None
    await run("postStart")  # already registered: said, not an error
