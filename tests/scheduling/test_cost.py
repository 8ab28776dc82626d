"""CostModel: shipped profile, file round trip, fitting from measurements."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mooncake_proxy.scheduling import CostModel


def test_default_profile_is_plausible() -> None:
    c = CostModel.default()
    assert c.name.startswith("llama2-70b")
    # An 8k-token prefill of a 70B model on 8 GPUs takes on the order of a second.
    assert 0.3 < c.prefill_time(8192) < 3.0
    # Quadratic attention: doubling the tokens more than doubles the time.
    assert c.prefill_time(64_000) > 2 * c.prefill_time(32_000)
    # Reusing a prefix costs less than recomputing it, more than nothing.
    assert c.prefill_time(1000, 8000) < c.prefill_time(9000)
    assert c.prefill_time(1000, 8000) > c.prefill_time(1000)
    assert c.prefill_time(0) == 0.0
    # Decode steps: tens of ms, growing with batch and KV.
    assert 0.005 < c.decode_step_time(1, 1000) < 0.05
    assert c.decode_step_time(64, 500_000) > c.decode_step_time(8, 50_000)
    # Moving a 512-token block (160 MiB) is far cheaper than recomputing it.
    assert c.transfer_time(1) < c.prefill_time(512) / 10
    assert c.transfer_time(0) == 0.0


def test_file_round_trip_and_errors(tmp_path) -> None:
    c = CostModel(c0=0.1, c1=2e-4, c2=1e-9, d0=0.02, d1=1e-4, d2=5e-8, transfer_latency_s=0.002,
                  bytes_per_token=1000.0, bandwidth_bytes_per_s=1e9, block_size=256, name="x")
    p = tmp_path / "prof.json"
    c.save(p)
    assert CostModel.from_file(p) == c
    with pytest.raises(FileNotFoundError, match="nope.json"):
        CostModel.from_file(tmp_path / "nope.json")
    p.write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        CostModel.from_file(p)
    d = c.to_dict()
    del d["decode"]["d1"]
    p.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="'d1'"):
        CostModel.from_file(p)
    d = c.to_dict()
    d["prefill"]["c1"] = -1
    p.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="c1"):
        CostModel.from_file(p)


def test_fit_recovers_coefficients_from_noisy_measurements() -> None:
    rng = np.random.default_rng(7)
    true = CostModel(c0=0.03, c1=1.5e-4, c2=3e-9, d0=0.012, d1=8e-5, d2=4e-8,
                     transfer_latency_s=0.002, bandwidth_bytes_per_s=5e10)
    samples = []
    for _ in range(200):
        n, c = int(rng.integers(100, 60_000)), int(rng.integers(0, 30_000))
        samples.append({"kind": "prefill", "new_tokens": n, "cached_tokens": c,
                        "seconds": true.prefill_time(n, c) * rng.normal(1, 0.01)})
        b, kv = int(rng.integers(1, 128)), int(rng.integers(1000, 2_000_000))
        samples.append({"kind": "decode", "batch_size": b, "kv_tokens": kv,
                        "seconds": true.decode_step_time(b, kv) * rng.normal(1, 0.01)})
        k = int(rng.integers(1, 64))
        samples.append({"kind": "transfer", "num_blocks": k, "seconds": true.transfer_time(k) * rng.normal(1, 0.01)})
    fit = CostModel.fit(samples)
    assert fit.name == "fitted"
    for n, c in [(500, 0), (8000, 4000), (50_000, 0)]:
        assert fit.prefill_time(n, c) == pytest.approx(true.prefill_time(n, c), rel=0.05)
    assert fit.c1 == pytest.approx(true.c1, rel=0.1)
    assert fit.c2 == pytest.approx(true.c2, rel=0.1)
    assert fit.decode_step_time(32, 400_000) == pytest.approx(true.decode_step_time(32, 400_000), rel=0.05)
    assert fit.transfer_time(10) == pytest.approx(true.transfer_time(10), rel=0.05)


def test_fit_keeps_unfitted_parts_and_validates() -> None:
    base = CostModel.default()
    samples = [{"kind": "prefill", "new_tokens": n, "seconds": 0.01 + 1e-4 * n} for n in (100, 1000, 5000, 20000)]
    fit = CostModel.fit(samples)
    assert (fit.d0, fit.d1, fit.d2) == (base.d0, base.d1, base.d2)
    assert fit.prefill_time(10_000) == pytest.approx(0.01 + 1e-4 * 10_000, rel=0.02)
    assert min(fit.c0, fit.c1, fit.c2) >= 0
    with pytest.raises(ValueError, match="at least 3"):
        CostModel.fit(samples[:2])
    with pytest.raises(ValueError, match="kind"):
        CostModel.fit([{"kind": "warmup", "seconds": 1}])
    with pytest.raises(ValueError, match="missing field"):
        CostModel.fit([{"kind": "decode", "seconds": 1}])


@pytest.mark.integration
def test_fit_profile_cli(python_exe, tmp_path) -> None:
    import subprocess

    rng = np.random.default_rng(3)
    true = CostModel(c0=0.05, c1=2e-4, c2=2e-9)
    lines = []
    for _ in range(50):
        n = int(rng.integers(100, 40_000))
        lines.append(json.dumps({"kind": "prefill", "new_tokens": n, "cached_tokens": 0,
                                 "seconds": true.prefill_time(n) * rng.normal(1, 0.02)}))
    (tmp_path / "s.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "prof.json"
    p = subprocess.run([python_exe, "-m", "mooncake_proxy.scheduling.fit_profile", "--samples",
                        str(tmp_path / "s.jsonl"), "--out", str(out), "--name", "mine"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "prefill" in p.stdout and "median rel. error" in p.stdout
    m = CostModel.from_file(out)
    assert m.name == "mine" and m.prefill_time(20_000) == pytest.approx(true.prefill_time(20_000), rel=0.05)
    assert m.d0 == CostModel.default().d0
    (tmp_path / "bad.jsonl").write_text('{"kind": "prefill"\n')
    p = subprocess.run([python_exe, "-m", "mooncake_proxy.scheduling.fit_profile", "--samples",
                        str(tmp_path / "bad.jsonl"), "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "bad.jsonl:1" in p.stderr
