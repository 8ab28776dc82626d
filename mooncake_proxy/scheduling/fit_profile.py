"""Fit a cost profile from measurements: ``python -m mooncake_proxy.scheduling.fit_profile``.

Input: JSONL, one measurement per line, as accepted by :meth:`CostModel.fit`::

    {"kind": "prefill", "new_tokens": 4096, "cached_tokens": 0, "seconds": 0.61}
    {"kind": "decode", "batch_size": 32, "kv_tokens": 250000, "seconds": 0.031}
    {"kind": "transfer", "num_blocks": 8, "seconds": 0.014}

Kinds without measurements keep the base profile's coefficients. The output is a profile JSON
for ``mooncake_proxy --profile`` / ``mooncake_sim --profile``; the fit's relative error per kind
is printed so a bad fit is visible before it steers a cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .cost import CostModel


def _predict(m: CostModel, s: dict[str, Any]) -> float:
    k = s["kind"]
    if k == "prefill":
        return m.prefill_time(int(s["new_tokens"]), int(s.get("cached_tokens", 0)))
    if k == "decode":
        return m.decode_step_time(int(s["batch_size"]), int(s["kv_tokens"]))
    return m.transfer_time(int(s["num_blocks"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mooncake_proxy.scheduling.fit_profile",
                                 description="Fit prefill/decode/transfer cost coefficients from timing "
                                             "measurements and write a cost profile JSON.")
    ap.add_argument("--samples", required=True, help="JSONL measurements (kind, seconds and the kind's fields)")
    ap.add_argument("--out", required=True, help="profile JSON to write")
    ap.add_argument("--base", default=None, help="profile whose coefficients are kept for kinds without samples "
                                                  "(default: the shipped default profile)")
    ap.add_argument("--name", default="fitted", help="name stored in the profile")
    args = ap.parse_args(argv)
    try:
        base = CostModel.from_file(args.base) if args.base else CostModel.default()
        samples = []
        with open(args.samples) as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        samples.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{args.samples}:{lineno}: not valid JSON: {e}") from None
        model = CostModel.fit(samples, base)
    except (OSError, ValueError) as e:
        print(f"fit_profile: error: {e}", file=sys.stderr)
        return 2
    from dataclasses import replace

    model = replace(model, name=args.name)
    model.save(args.out)
    for kind in ("prefill", "decode", "transfer"):
        ks = [s for s in samples if s.get("kind") == kind]
        if ks:
            errs = sorted(abs(_predict(model, s) - s["seconds"]) / s["seconds"] for s in ks)
            print(f"{kind:<8} {len(ks):5d} samples  median rel. error {100 * errs[len(errs) // 2]:.1f}%  "
                  f"max {100 * errs[-1]:.1f}%")
    print(f"wrote {Path(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
