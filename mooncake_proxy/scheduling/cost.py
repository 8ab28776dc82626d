"""Cost model: predicted prefill time, decode step time and KV transfer time.

Forms (fitted, not hard-coded — the numbers live in a JSON profile):

* prefill(new, cached) = c0 + c1·new + c2·(new·cached + new²/2)
  — linear work per computed token plus causal attention, where each new token attends to the
  reused prefix and to the new tokens before it.
* decode_step(batch, kv) = d0 + d1·batch + d2·kv
  — a memory-bound step: stream the weights once (d0), per-sequence overhead (d1), read every
  KV token of the batch (d2).
* transfer(blocks) = latency + blocks·block_size·bytes_per_token / bandwidth.

``CostModel.default()`` loads ``profiles/default.json`` shipped with the package (a derived
LLaMA2-70B-on-8×A800 profile, the paper's setup); ``CostModel.fit(samples)`` fits the
coefficients from measurements by non-negative least squares; ``save()`` writes a profile.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

__all__ = ["CostModel"]


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (drop negative terms and refit) —
    a time model with a negative term would predict negative durations somewhere."""
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[active] = sol
            return x
        worst = active[int(np.argmin(sol))]
        active.remove(worst)
    return x


def _num(section: Mapping[str, Any], key: str, where: str) -> float:
    if key not in section:
        raise ValueError(f"cost profile {where}: missing '{key}'")
    v = section[key]
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
        raise ValueError(f"cost profile {where}: '{key}' must be a finite number >= 0, got {v!r}")
    return float(v)


@dataclass(frozen=True, slots=True)
class CostModel:
    """Coefficients of the three time models (seconds). See module docstring for the forms."""

    c0: float = 0.02
    c1: float = 1.38e-4
    c2: float = 2.6e-9
    d0: float = 0.014
    d1: float = 5.0e-5
    d2: float = 3.4e-8
    transfer_latency_s: float = 0.001
    bytes_per_token: float = 327680.0
    bandwidth_bytes_per_s: float = 1.0e11
    block_size: int = 512
    name: str = "custom"

    # ------------------------------------------------------------------ predictions
    def prefill_time(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Seconds to prefill ``new_tokens`` on top of ``cached_tokens`` reused prefix."""
        if new_tokens <= 0:
            return 0.0
        return self.c0 + self.c1 * new_tokens + self.c2 * (new_tokens * cached_tokens + 0.5 * new_tokens * new_tokens)

    def decode_step_time(self, batch_size: int, kv_tokens: int) -> float:
        """Seconds per decode step (= time between tokens) for a batch holding ``kv_tokens``."""
        if batch_size <= 0:
            return 0.0
        return self.d0 + self.d1 * batch_size + self.d2 * kv_tokens

    def transfer_time(self, num_blocks: int) -> float:
        """Seconds to move ``num_blocks`` KV blocks between nodes (or from the store)."""
        if num_blocks <= 0:
            return 0.0
        nbytes = num_blocks * self.block_size * self.bytes_per_token
        return self.transfer_latency_s + nbytes / self.bandwidth_bytes_per_s

    # ------------------------------------------------------------------ profiles
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "<dict>") -> "CostModel":
        try:
            p, dec, t = d["prefill"], d["decode"], d["transfer"]
        except (KeyError, TypeError):
            raise ValueError(f"cost profile {where}: needs 'prefill', 'decode' and 'transfer' sections") from None
        bs = d.get("block_size", 512)
        if not isinstance(bs, int) or bs <= 0:
            raise ValueError(f"cost profile {where}: 'block_size' must be a positive int, got {bs!r}")
        bw = _num(t, "bandwidth_bytes_per_s", where + " transfer")
        if bw <= 0:
            raise ValueError(f"cost profile {where}: transfer 'bandwidth_bytes_per_s' must be > 0")
        return cls(
            c0=_num(p, "c0", where + " prefill"), c1=_num(p, "c1", where + " prefill"),
            c2=_num(p, "c2", where + " prefill"),
            d0=_num(dec, "d0", where + " decode"), d1=_num(dec, "d1", where + " decode"),
            d2=_num(dec, "d2", where + " decode"),
            transfer_latency_s=_num(t, "latency_s", where + " transfer"),
            bytes_per_token=_num(t, "bytes_per_token", where + " transfer"),
            bandwidth_bytes_per_s=bw, block_size=bs, name=str(d.get("name", "custom")))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "block_size": self.block_size,
            "prefill": {"c0": self.c0, "c1": self.c1, "c2": self.c2},
            "decode": {"d0": self.d0, "d1": self.d1, "d2": self.d2},
            "transfer": {"latency_s": self.transfer_latency_s, "bytes_per_token": self.bytes_per_token,
                         "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s},
        }

    @classmethod
    def from_file(cls, path: str | Path) -> "CostModel":
        """Load a JSON profile (format: ``profiles/default.json``); clear error naming the file."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"cost profile not found: {path}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"cost profile {path}: invalid JSON: {e}") from None
        return cls.from_dict(data, str(path))

    @classmethod
    def default(cls) -> "CostModel":
        """The shipped derived LLaMA2-70B / 8×A800 profile (see its ``description``)."""
        text = resources.files(__package__).joinpath("profiles/default.json").read_text()
        return cls.from_dict(json.loads(text), "default.json")

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def scaled(self, factor: float) -> "CostModel":
        """All compute times multiplied by ``factor`` (a slower/faster accelerator)."""
        return replace(self, c0=self.c0 * factor, c1=self.c1 * factor, c2=self.c2 * factor,
                       d0=self.d0 * factor, d1=self.d1 * factor, d2=self.d2 * factor)

    @classmethod
    def fit(cls, samples: Iterable[Mapping[str, Any]], base: "CostModel | None" = None) -> "CostModel":
        """Fit coefficients from measurements.

        Each sample is a mapping with ``kind`` and ``seconds``:
        ``{"kind": "prefill", "new_tokens", "cached_tokens" (opt.), "seconds"}``,
        ``{"kind": "decode", "batch_size", "kv_tokens", "seconds"}``,
        ``{"kind": "transfer", "num_blocks", "seconds"}``.
        Kinds without samples keep ``base``'s (default profile's) coefficients. A kind needs
        at least as many samples as coefficients (3, 3, 2).
        """
        base = base or cls.default()
        rows: dict[str, list[tuple[list[float], float]]] = {"prefill": [], "decode": [], "transfer": []}
        for i, s in enumerate(samples):
            kind = s.get("kind")
            try:
                sec = float(s["seconds"])
                if kind == "prefill":
                    n, c = float(s["new_tokens"]), float(s.get("cached_tokens", 0))
                    rows["prefill"].append(([1.0, n, n * c + 0.5 * n * n], sec))
                elif kind == "decode":
                    rows["decode"].append(([1.0, float(s["batch_size"]), float(s["kv_tokens"])], sec))
                elif kind == "transfer":
                    rows["transfer"].append(([1.0, float(s["num_blocks"])], sec))
                else:
                    raise ValueError(f"sample {i}: kind must be prefill/decode/transfer, got {kind!r}")
            except KeyError as e:
                raise ValueError(f"sample {i} ({kind}): missing field {e}") from None
        out = {}
        for kind, need in (("prefill", 3), ("decode", 3), ("transfer", 2)):
            r = rows[kind]
            if not r:
                continue
            if len(r) < need:
                raise ValueError(f"fit: {kind} needs at least {need} samples, got {len(r)}")
            a = np.array([x for x, _ in r], dtype=float)
            b = np.array([y for _, y in r], dtype=float)
            if (b <= 0).any():
                raise ValueError(f"fit: {kind} samples need seconds > 0")
            # Minimise RELATIVE error (weight 1/seconds): short and long requests matter
            # equally to a scheduler, and timing noise is roughly proportional to duration.
            a, b = a / b[:, None], np.ones_like(b)
            # Scale columns so the solver is well conditioned (tokens² reach 1e10).
            scale = np.abs(a).max(axis=0)
            scale[scale == 0] = 1.0
            out[kind] = _nnls(a / scale, b) / scale
        kw: dict[str, Any] = {"name": "fitted"}
        if "prefill" in out:
            kw.update(c0=float(out["prefill"][0]), c1=float(out["prefill"][1]), c2=float(out["prefill"][2]))
        if "decode" in out:
            kw.update(d0=float(out["decode"][0]), d1=float(out["decode"][1]), d2=float(out["decode"][2]))
        if "transfer" in out:
            lat, per_block = float(out["transfer"][0]), float(out["transfer"][1])
            kw.update(transfer_latency_s=lat)
            if per_block > 0:
                kw.update(bandwidth_bytes_per_s=base.block_size * base.bytes_per_token / per_block)
        return replace(base, **kw)

    def as_json(self) -> str:
        return json.dumps(asdict(self))
