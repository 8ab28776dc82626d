"""``mooncake_sim`` as users run it: a real subprocess, JSON/text output, plots, errors."""

from __future__ import annotations

import json
import subprocess

import pytest

from mooncake_proxy.sim import load_trace, prefix_hit_ratio
from mooncake_proxy.sim.cli import build_parser

pytestmark = pytest.mark.integration


def _run(python_exe, *args, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([python_exe, "-m", "mooncake_proxy.sim.cli", *map(str, args)],
                       capture_output=True, text=True, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def test_help_explains_every_flag(python_exe) -> None:
    out = _run(python_exe, "--help").stdout
    for action in build_parser()._actions:
        for opt in action.option_strings:
            assert opt in out
        assert action.help, f"flag {action.option_strings} has no help"
    for flag in ("--trace", "--policy", "--prefill", "--decode", "--cache-blocks", "--speed", "--json",
                 "--cache-only", "--plot", "--limit", "--ttft-slo", "--tbt-slo", "--profile"):
        assert flag in out


def test_cache_only_json(python_exe, conversation_trace) -> None:
    p = _run(python_exe, "--trace", conversation_trace, "--cache-only", "--cache-blocks", 300, "--limit", 1000,
             "--json")
    d = json.loads(p.stdout)
    expect = prefix_hit_ratio(load_trace(conversation_trace, 1000), 300)
    assert d["hit_ratio"] == pytest.approx(expect.hit_ratio) and d["requests"] == 1000


def test_simulation_json_and_text(python_exe, conversation_trace, tmp_path) -> None:
    prof = tmp_path / "p.json"
    from mooncake_proxy.scheduling import CostModel

    CostModel.default().scaled(2.0).save(prof)
    d = json.loads(_run(python_exe, "--trace", conversation_trace, "--policy", "conductor", "--prefill", 4,
                        "--decode", 2, "--cache-blocks", 2000, "--limit", 600, "--ttft-slo", 20, "--tbt-slo", 0.1,
                        "--profile", prof, "--json").stdout)
    for k in ("hit_ratio", "ttft_mean", "ttft_p90", "tbt_p90", "slo_attainment", "rejected", "completed"):
        assert k in d
    assert d["completed"] + d["rejected"] == 600
    assert 0 < d["hit_ratio"] < 1 and d["ttft_mean"] > 0 and d["tbt_p90"] > 0
    per_req = tmp_path / "req.jsonl"
    text = _run(python_exe, "--trace", conversation_trace, "--policy", "conductor,random", "--limit", 300,
                "--prefill", 2, "--decode", 2, "--requests-out", per_req).stdout
    rows = [json.loads(x) for x in per_req.read_text().splitlines()]
    assert len(rows) == 600 and {r["policy"] for r in rows} == {"conductor", "random"}
    assert all(r["ttft"] > 0 and r["prefill_id"].startswith("p") for r in rows)
    assert "policy conductor" in text and "policy random" in text and "TTFT mean" in text
    assert "goodput" in text and "p90" in text


def test_plots_written(python_exe, conversation_trace, tmp_path) -> None:
    out = tmp_path / "plots"
    d = json.loads(_run(python_exe, "--trace", conversation_trace, "--policy", "conductor,load_balance",
                        "--limit", 300, "--prefill", 2, "--decode", 2, "--plot", out, "--curve", "100,1000,0",
                        "--json").stdout)
    assert set(d["policies"]) == {"conductor", "load_balance"}
    for name in ("ttft_cdf.png", "hit_ratio_vs_capacity.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_bad_input_clear_errors(python_exe, tmp_path) -> None:
    p = _run(python_exe, "--trace", tmp_path / "missing.jsonl", check=False)
    assert p.returncode == 2 and "trace file not found" in p.stderr
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5}\n')
    p = _run(python_exe, "--trace", bad, check=False)
    assert p.returncode == 2 and "t.jsonl:1" in p.stderr and "output_length" in p.stderr
    p = _run(python_exe, "--trace", bad, "--policy", "fastest", check=False)
    assert p.returncode == 2 and "fastest" in p.stderr and "conductor" in p.stderr
    p = _run(python_exe, "--trace", bad, "--prefill", 0, check=False)
    assert p.returncode == 2 and "--prefill" in p.stderr
