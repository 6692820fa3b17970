"""The baselines hwlat's accuracy is compared with, fitted on the same device measurements.

- FLOPs-linear: `latency = a * flops + b`, what a FLOPs-counting proxy would predict.
- Roofline: the sum of per-op roofline times at the device's measured peaks, times one fitted
  scale (peaks are never reached, so the raw roofline is always too optimistic).
Both fit on the same `ModelRow`s as hwlat's end-to-end correction, by least squares on relative
error, and predict from a `Prediction` (which carries the model's FLOPs and roofline sum) or
from an op list through `predict_ops`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from predictor.correction import ModelRow
from predictor.features import roofline_s
from profilers import ops
from profilers.errors import NotFittedError
from profilers.oprecord import OpRecord


def _timed(records: Sequence[OpRecord]) -> list[OpRecord]:
    return [r for r in records if not ops.is_free(r)]


class FlopsLinear:
    """latency_s = a * flops + b."""

    def fit(self, rows: Sequence[ModelRow]) -> FlopsLinear:
        rows = [r for r in rows if r.measured_s > 0]
        if not rows:
            raise NotFittedError("the FLOPs baseline needs end-to-end measurements; run "
                                 "`hwlat profile` with model measurements on this device")
        y = np.array([r.measured_s for r in rows])
        f = np.array([r.flops for r in rows])
        if len(rows) >= 2 and np.ptp(f) > 0:
            (self.a_, self.b_), *_ = np.linalg.lstsq(np.column_stack([f / y, 1 / y]),
                                                     np.ones(len(y)), rcond=None)
        else:
            self.a_, self.b_ = float(np.mean(y / np.maximum(f, 1.0))), 0.0
        return self

    def predict_flops(self, flops: float) -> float:
        """Latency in seconds; floored at a microsecond so log-scale comparisons stay defined."""
        if not hasattr(self, "a_"):
            raise NotFittedError("FlopsLinear is not fitted; call fit() first")
        return max(float(self.a_ * flops + self.b_), 1e-6)

    def predict_ops(self, records: Sequence[OpRecord]) -> float:
        """Latency in ms of an op list."""
        return self.predict_flops(sum(ops.flops_of(r) for r in _timed(records))) * 1e3


class RooflineScaled:
    """latency_s = scale * sum of per-op roofline times."""

    def __init__(self, peaks: dict | None) -> None:
        self.peaks = peaks

    def fit(self, rows: Sequence[ModelRow]) -> RooflineScaled:
        rows = [r for r in rows if r.measured_s > 0 and r.roofline_s > 0]
        if not rows:
            raise NotFittedError("the roofline baseline needs end-to-end measurements; run "
                                 "`hwlat profile` with model measurements on this device")
        ratio = np.array([r.roofline_s / r.measured_s for r in rows])
        self.scale_ = float(ratio.sum() / (ratio * ratio).sum())
        return self

    def predict_roofline(self, roofline_sum_s: float) -> float:
        if not hasattr(self, "scale_"):
            raise NotFittedError("RooflineScaled is not fitted; call fit() first")
        return self.scale_ * roofline_sum_s

    def predict_ops(self, records: Sequence[OpRecord]) -> float:
        """Latency in ms of an op list."""
        return self.predict_roofline(sum(roofline_s(r, self.peaks) for r in _timed(records))) * 1e3
