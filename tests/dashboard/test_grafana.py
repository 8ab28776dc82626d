"""The Grafana boards (deploy/grafana/) and the alert rules (deploy/prometheus/) ask only for
metrics the services really export: start a master, a store client (with its metrics port and
its Transfer Engine's), and a proxy in front of two fake engines, scrape each, and check every
metric an expression names (the vLLM connector's: against the vLLM board, which
tests/vllm/test_vllm_multi_connector.py checks against a real vLLM's scrape)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mooncake_core.dashboard.samples import metric_names
from mooncake_core.utils.net import free_port, wait_for_port
from tests.proxy.conftest import spawn  # noqa: F401  (fixture)
from mooncake_lab.store_procs import Master, make_client

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
BOARDS = ("mooncake-master", "mooncake-store-client", "mooncake-transfer-engine", "mooncake-proxy")
METRIC = re.compile(r"\bmooncake_[a-z0-9_]+")
VLLM_METRIC = re.compile(r"\bvllm:mooncake_core_[a-z0-9_]+")
ALERTS = ROOT / "deploy" / "prometheus" / "mooncake-alerts.yml"


def _load(name: str) -> dict:
    return json.loads((GRAFANA / f"{name}.json").read_text())


def _exprs(board: dict) -> list[str]:
    return [t["expr"] for p in board["panels"] if p["type"] != "row" for t in p["targets"]]


def _scrape(url: str) -> set[str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return metric_names(text_string_to_metric_families(r.read().decode()))


def test_boards_are_generated_and_well_formed() -> None:
    out = subprocess.run([sys.executable, str(GRAFANA / "generate.py"), "--check"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    for name in (*BOARDS, "mooncake-vllm"):  # the vLLM board's series: tests/vllm/test_vllm_multi_connector.py
        b = _load(name)
        assert b["uid"] == name and b["panels"][0]["type"] == "row"
        assert {v["name"] for v in b["templating"]["list"]} == {"datasource", "instance"}
        for p in b["panels"]:
            if p["type"] == "row":
                continue
            assert p["fieldConfig"]["defaults"]["unit"], f"{name}: panel {p['title']!r} has no unit"
            assert p["targets"] and all(t["expr"] for t in p["targets"])
        ids = [p["id"] for p in b["panels"]]
        assert len(ids) == len(set(ids))


@pytest.mark.integration
def test_every_queried_metric_is_exported(tmp_path, monkeypatch, spawn: Any) -> None:  # noqa: F811
    exported: dict[str, set[str]] = {}
    master = Master(sys.executable, str(tmp_path)).start()
    try:
        te_port, client_port = free_port(), free_port()
        monkeypatch.setenv("MC_METRICS_PORT", str(te_port))
        client = make_client(master, 16 << 20, enable_client_http_server=True, client_http_port=client_port)
        try:
            assert client.put("grafana-key", b"x" * 4096) == 0
            assert client.get("grafana-key") == b"x" * 4096
            wait_for_port("127.0.0.1", te_port, 10)
            exported["mooncake-master"] = _scrape(f"http://127.0.0.1:{master.metrics_port}/metrics")
            exported["mooncake-store-client"] = _scrape(f"http://127.0.0.1:{client_port}/metrics")
            exported["mooncake-transfer-engine"] = _scrape(f"http://127.0.0.1:{te_port}/metrics")
        finally:
            client.close()
    finally:
        master.stop()
    _p, pport = spawn(["-m", "mooncake_proxy.fake_engine", "--name", "P"], "fake_engine")
    _d, dport = spawn(["-m", "mooncake_proxy.fake_engine", "--name", "D"], "fake_engine")
    _x, port = spawn(["-m", "mooncake_proxy.cli", "--host", "127.0.0.1", "--port", "0",
                      "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", str(pport),
                      "--decoder-hosts", "127.0.0.1", "--decoder-ports", str(dport)], "mooncake_proxy")
    body = json.dumps({"model": "m", "prompt": "hello " * 100, "max_tokens": 3, "stream": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        r.read()
    exported["mooncake-proxy"] = _scrape(f"http://127.0.0.1:{port}/metrics")
    missing = {}
    for name in BOARDS:
        queried = {m for e in _exprs(_load(name)) for m in METRIC.findall(e)}
        assert queried, name
        lost = sorted(queried - exported[name])
        if lost:
            missing[name] = lost
    assert not missing, f"boards query metrics no service exports: {missing}"
    # the alert rules
    import yaml

    exprs = [r["expr"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    ours = set().union(*exported.values())
    queried = {m for e in exprs for m in METRIC.findall(e)} - {
        m for e in exprs for m in re.findall(r"vllm:(mooncake_[a-z0-9_]+)", e)}
    assert queried and not queried - ours, f"alert rules query metrics no service exports: {sorted(queried - ours)}"
    vllm_board = {m for e in _exprs(_load("mooncake-vllm")) for m in VLLM_METRIC.findall(e)}
    vllm_queried = {m for e in exprs for m in VLLM_METRIC.findall(e)}
    assert vllm_queried and not vllm_queried - vllm_board, sorted(vllm_queried - vllm_board)
