"""The dependency-free SVG charts (mooncake_proxy/svgplot.py) used where matplotlib is not installed."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from mooncake_proxy.svgplot import Panel, cdf_points, render_svg

NS = "{http://www.w3.org/2000/svg}"


def test_cdf_points_sorted_fractions_skip_nan() -> None:
    assert cdf_points([3.0, float("nan"), 1.0, 2.0, float("inf")]) == [(1.0, 1 / 3), (2.0, 2 / 3), (3.0, 1.0)]
    assert cdf_points([]) == []


def test_panels_side_by_side_valid_svg() -> None:
    live = Panel("live", {"conductor": cdf_points([0.5, 1, 2]), "random <&>": cdf_points([1, 4, 9])},
                 "TTFT (s)", "fraction", log_x=True)
    sim = Panel("simulated", {"conductor": [(1, 10), (10, 40), (100, 55)]}, hlines={"unlimited": 60.0})
    root = ET.fromstring(render_svg([live, sim]))
    assert root.get("width") == "1040"
    lines = root.findall(f"{NS}polyline")
    assert len(lines) == 3
    for pl in lines:  # every point lies inside its panel's plot area
        for xy in pl.get("points").split():
            x, y = map(float, xy.split(","))
            assert 0 <= x <= 1040 and 0 <= y <= 340
    texts = [t.text for t in root.iter(f"{NS}text")]
    assert "random <&>" in texts and "unlimited" in texts and "live" in texts and "simulated" in texts
    assert "no data" in render_svg([Panel("empty", {"x": []}, log_x=True)])
    with pytest.raises(ValueError):
        render_svg([])


def test_sim_ttft_panel_from_results(conversation_trace) -> None:
    from mooncake_proxy.sim import SimConfig, load_trace, simulate
    from mooncake_proxy.sim.plot import ttft_cdf_panel

    recs = load_trace(conversation_trace)[:200]
    res = {"load_balance": simulate(recs, SimConfig(policy="load_balance", prefill=2, decode=2))}
    panel = ttft_cdf_panel(res, "sim")
    [(name, pts)] = panel.series.items()
    assert name.startswith("load_balance (mean") and len(pts) == 200 and pts[-1][1] == 1.0
