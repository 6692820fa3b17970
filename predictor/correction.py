"""From the sum of per-op latencies to a model's end-to-end latency.

DESIGN.md: with cache-flushed op timings, the plain sum lands within ~5% MAPE and a single
per-op overhead term is all the correction needed (per-family terms overfit). So the model is
`total = a * sum_ops + n_timed_ops * overhead`, fitted on the device's end-to-end measurements
by least squares on relative error (every model counts the same, whatever its size). The
residuals of that fit, as log ratios, calibrate the interval. Leave-one-family-out CV over the
measured models says whether the correction helps at all; it is reported, not assumed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass(frozen=True)
class ModelRow:
    """One measured model setting with what the predictor computes for it before correction."""

    spec: str
    family: str
    inputs: tuple[str, ...]
    measured_s: float
    sum_ops_s: float
    n_timed: int
    flops: float
    roofline_s: float
    measured_share: float

    def to_json(self) -> dict:
        return {**asdict(self), "inputs": list(self.inputs)}

    @classmethod
    def from_json(cls, d: dict) -> ModelRow:
        return cls(**{**d, "inputs": tuple(d["inputs"])})


@dataclass(frozen=True)
class Correction:
    a: float = 1.0
    overhead_s: float = 0.0
    resid_lo: float = 0.0  # 10th percentile of log(measured / corrected prediction)
    resid_hi: float = 0.0  # 90th percentile
    n_models: int = 0
    note: str = "no end-to-end measurements on this device: plain sum of ops, no correction"
    cv: dict = field(default_factory=dict)

    def apply(self, sum_ops_s: float, n_timed: int) -> float:
        return self.a * sum_ops_s + self.overhead_s * n_timed

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Correction:
        return cls(**d)


def _solve(rows: Sequence[ModelRow]) -> tuple[float, float]:
    """(a, overhead_s) minimising the squared relative error, with both kept >= 0."""
    y = np.array([r.measured_s for r in rows])
    s = np.array([r.sum_ops_s for r in rows]) / y
    n = np.array([r.n_timed for r in rows], dtype=float) / y
    if len(rows) >= 2 and np.ptp(n / np.maximum(s, 1e-30)) > 0:
        (a, overhead), *_ = np.linalg.lstsq(np.column_stack([s, n]), np.ones(len(y)), rcond=None)
        if a > 0 and overhead >= 0:
            return float(a), float(overhead)
    a = float(s.sum() / (s * s).sum()) if np.any(s > 0) else 1.0  # overhead pinned at 0
    return a, 0.0


def _residual_band(log_ratios: np.ndarray) -> tuple[float, float]:
    """Empirical 10/90% of the log residuals; a normal band when there are too few for that."""
    if len(log_ratios) >= 5:
        lo, hi = np.percentile(log_ratios, [10, 90])
        return float(min(lo, 0.0)), float(max(hi, 0.0))
    if len(log_ratios) >= 2:
        width = 1.2816 * float(np.std(log_ratios, ddof=1))
        return -width, width
    return 0.0, 0.0


def mape(rows: Sequence[ModelRow], correction: Correction) -> float:
    errors = [abs(correction.apply(r.sum_ops_s, r.n_timed) / r.measured_s - 1) for r in rows]
    return float(np.mean(errors)) if errors else float("nan")


def leave_one_family_out(rows: Sequence[ModelRow]) -> dict:
    """Held-out-family MAPE of the fitted correction vs the plain sum (a=1, overhead=0)."""
    families = sorted({r.family for r in rows})
    if len(families) < 2:
        return {"n_families": len(families)}
    held_out = []
    for family in families:
        train = [r for r in rows if r.family != family]
        a, overhead = _solve(train)
        held_out += [abs((a * r.sum_ops_s + overhead * r.n_timed) / r.measured_s - 1)
                     for r in rows if r.family == family]
    return {"n_families": len(families), "lofo_mape": float(np.mean(held_out)),
            "plain_sum_mape": mape(rows, Correction())}


def fit_correction(rows: Sequence[ModelRow]) -> Correction:
    rows = [r for r in rows if r.measured_s > 0 and r.sum_ops_s > 0]
    if not rows:
        return Correction()
    a, overhead = _solve(rows)
    fitted = Correction(a, overhead)
    log_ratios = np.array([math.log(r.measured_s / fitted.apply(r.sum_ops_s, r.n_timed))
                           for r in rows])
    lo, hi = _residual_band(log_ratios)
    note = (f"fitted on {len(rows)} end-to-end measurements: total = {a:.3f} x sum of ops"
            f" + {overhead * 1e6:.2f} us per timed op")
    return Correction(a, overhead, lo, hi, len(rows), note, leave_one_family_out(rows))
