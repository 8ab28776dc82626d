"""mooncake_core/envs.py is the one place environment variables are declared and read.

Checks: the README's table is exactly the generated one; every ``MC_*`` / ``MOONCAKE_*`` name
the shipped code mentions is declared; no shipped module reads one from ``os.environ`` itself;
values are read at call time; booleans follow one rule; a bad value names the variable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mooncake_core import envs

ROOT = Path(__file__).resolve().parents[2]
#: the shipped code (connectors other helpers own are added to envs.py when they merge)
SCANNED = [ROOT / "mooncake_core", ROOT / "mooncake_proxy", ROOT / "mooncake_connectors" / "vllm", ROOT / "mooncake_connectors" / "sglang"]
NAME = re.compile(r"(?<![A-Z0-9_])(?:MC|MOONCAKE)_[A-Z0-9_]+(?![A-Z0-9_<])")
RAW_READ = re.compile(r"(?:environ(?:\.get)?\s*[\(\[]|getenv\s*\()\s*f?[\"'](?:MC|MOONCAKE)_")


def _files() -> list[Path]:
    return [p for d in SCANNED for p in d.rglob("*.py")]


def test_readme_table_is_generated_from_envs() -> None:
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- envs:begin[^\n]*-->\n(.*?)<!-- envs:end -->", readme, re.S)
    assert m, "README.md lacks the <!-- envs:begin --> ... <!-- envs:end --> block"
    assert m.group(1) == envs.markdown_table(), \
        "README.md's configuration table is stale: paste the output of `python -m mooncake_core.envs --markdown`"


def test_every_variable_the_code_mentions_is_declared() -> None:
    undeclared: dict[str, str] = {}
    for p in _files():
        for name in NAME.findall(p.read_text()):
            if name.endswith("_") or name in envs.VARIABLES or name.startswith("MOONCAKE_REQUIRE_"):
                continue
            undeclared.setdefault(name, str(p.relative_to(ROOT)))
    assert not undeclared, f"declare these in mooncake_core/envs.py: {undeclared}"


def test_only_envs_reads_them_from_the_environment() -> None:
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in _files() if p.name != "envs.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if RAW_READ.search(line)]
    assert not offenders, f"read these through mooncake_core.envs: {offenders}"


def test_values_are_read_at_call_time(monkeypatch) -> None:
    monkeypatch.delenv("MC_TCP_CONNECTIONS", raising=False)
    assert envs.MC_TCP_CONNECTIONS == 2
    monkeypatch.setenv("MC_TCP_CONNECTIONS", "7")
    assert envs.MC_TCP_CONNECTIONS == 7
    monkeypatch.setenv("MC_METRICS_PORT", "")
    assert envs.MC_METRICS_PORT is None  # blank means unset
    assert envs.get("MC_STORE_RPC_TIMEOUT", {"MC_STORE_RPC_TIMEOUT": "2.5"}) == 2.5


@pytest.mark.parametrize("raw,want", [("1", True), ("TRUE", True), (" yes ", True), ("on", True),
                                      ("0", False), ("false", False), ("No", False), ("off", False)])
def test_one_truthy_rule(monkeypatch, raw: str, want: bool) -> None:
    for name in ("MC_FORCE_TCP", "MC_STORE_PREFAULT", "MOONCAKE_CORE_COMPAT", "MC_LOG_JSON"):
        monkeypatch.setenv(name, raw)
        assert envs.get(name) is want, name


def test_bad_values_name_the_variable(monkeypatch) -> None:
    for name, raw, why in [("MC_FORCE_TCP", "maybe", "expected a boolean"),
                           ("MC_TCP_CONNECTIONS", "two", "not an integer"),
                           ("MC_TCP_CONNECTIONS", "0", "must be >= 1"),
                           ("MC_STORE_HEARTBEAT_INTERVAL", "soon", "not a number")]:
        monkeypatch.setenv(name, raw)
        with pytest.raises(ValueError, match=f"{name}=.*{why}"):
            envs.get(name)


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        envs.get("MC_NO_SUCH_THING")
    with pytest.raises(AttributeError):
        getattr(envs, "MC_NO_SUCH_THING")
