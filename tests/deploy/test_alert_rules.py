"""deploy/prometheus/: the alert rules load (``promtool check``), pass their unit tests
(``promtool test rules`` on mooncake-alerts.test.yml), and every alert has a summary, the fix, and
at least one test that makes it fire. That their metrics exist is checked against live scrapes
in tests/dashboard/test_grafana.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

PROM = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = PROM / "mooncake-alerts.yml"
UNIT = PROM / "mooncake-alerts.test.yml"


def _alerts() -> dict[str, dict]:
    return {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}


def test_every_alert_names_its_fix_and_has_a_firing_test() -> None:
    alerts = _alerts()
    assert len(alerts) >= 10
    for name, rule in alerts.items():
        ann = rule.get("annotations", {})
        assert ann.get("summary") and ann.get("fix"), f"{name}: needs a summary and a fix annotation"
        assert rule.get("labels", {}).get("severity") in ("warning", "critical"), name
    fired = {t["alertname"] for case in yaml.safe_load(UNIT.read_text())["tests"]
             for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    assert not set(alerts) - fired, f"alerts no unit test makes fire: {sorted(set(alerts) - fired)}"
    assert not fired - set(alerts), f"unit tests of alerts that do not exist: {sorted(fired - set(alerts))}"


@pytest.mark.integration
def test_promtool_checks_and_unit_tests(promtool: str) -> None:
    for args in (["check", "rules", str(RULES)], ["check", "config", str(PROM / "prometheus.yml")],
                 ["test", "rules", str(UNIT)]):
        out = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"promtool {' '.join(args)}:\n{out.stdout}\n{out.stderr}"
