"""Ranking levers: what to try first, the fastest that meets the budget, the Pareto set.

Order (best first):
  0  meets the budget even at the top of its predicted interval, and not rejected
  1  meets the budget at its predicted value, but its interval crosses the budget
  2  faster than now but misses the budget
  3  predicted no faster than now (< 1.02x; under 0.98x shown as slower: "the optimization
     made it slower")
  4  rejected: measured below the accuracy floor (never recommended), or failed to apply
Within groups 0-1 the predicted speedup is divided by a risk/effort penalty,
1 + RISK_WEIGHT * risk + EFFORT_WEIGHT * effort (levels 0-3), so a cast that nearly matches a
pruning's speedup comes first; groups 2-3 sort by speedup alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

RISK_WEIGHT = 0.15
EFFORT_WEIGHT = 0.10
SLOWER_BELOW = 0.98  # a predicted speedup under this is shown as a slowdown
FASTER_FROM = 1.02  # and one under this is no change: nothing to try


@dataclass
class LeverResult:
    """One lever variant: its prediction, and after --verify its measurement."""

    lever: str
    label: str
    params: dict[str, Any]
    p50_ms: float
    target_ms: float  # the budget's percentile (p95 or p99), predicted
    interval_ms: list[float]  # of target_ms
    speedup: float  # baseline target / this target
    budget_ms: float
    risk_level: int
    risk: str
    effort_level: int
    effort: str
    why: str = ""
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    measured_ms: dict[str, float | None] | None = None
    accuracy: dict[str, Any] | None = None
    rejected: str | None = None
    variant: Any = None  # the advisor.levers.Variant (not serialized)

    @property
    def meets_budget(self) -> bool:
        return self.target_ms <= self.budget_ms

    @property
    def confidence(self) -> str:
        """likely / borderline / no: where the budget falls against the predicted interval."""
        if self.interval_ms[1] <= self.budget_ms:
            return "likely"
        return "borderline" if self.meets_budget else "no"

    @property
    def slower(self) -> bool:
        return self.speedup < SLOWER_BELOW

    @property
    def penalty(self) -> float:
        return 1.0 + RISK_WEIGHT * self.risk_level + EFFORT_WEIGHT * self.effort_level

    @property
    def group(self) -> int:
        if self.rejected:
            return 4
        if self.speedup < FASTER_FROM:
            return 3
        if self.meets_budget:
            return 0 if self.confidence == "likely" else 1
        return 2

    def to_json(self, percentile: str) -> dict[str, Any]:
        out = {"lever": self.lever, "label": self.label, "params": self.params,
               "predicted_ms": {"p50": self.p50_ms, percentile: self.target_ms,
                                "interval": self.interval_ms},
               "speedup": self.speedup, "meets_budget": self.meets_budget,
               "budget_confidence": self.confidence, "slower": self.slower,
               "risk": {"level": self.risk_level, "why": self.risk},
               "effort": {"level": self.effort_level, "what": self.effort},
               "why": self.why, "notes": self.notes, **self.extra}
        if percentile != "p95":
            out["predicted_ms"].setdefault("p95", self.extra.get("p95_ms"))
        if self.measured_ms is not None:
            out["measured_ms"] = self.measured_ms
        if self.accuracy is not None:
            out["accuracy"] = self.accuracy
        if self.rejected:
            out["rejected"] = self.rejected
        return out


def rank(results: Sequence[LeverResult]) -> list[LeverResult]:
    """Best first, by the groups and penalties in the module docstring."""
    def key(r: LeverResult) -> tuple:
        score = r.speedup / r.penalty if r.group <= 1 else r.speedup
        return (r.group, -score, r.target_ms)

    return sorted(results, key=key)


def fastest_meeting(results: Sequence[LeverResult]) -> LeverResult | None:
    """The fastest non-rejected lever meeting the budget (measured latency when verified)."""
    ok = [r for r in results if not r.rejected and _effective_ms(r) <= r.budget_ms]
    return min(ok, key=_effective_ms, default=None)


def pareto(results: Sequence[LeverResult]) -> list[LeverResult]:
    """Non-rejected levers that no other beats on both latency and accuracy risk."""
    live = [r for r in results if not r.rejected]
    front = [r for r in live
             if not any(_dominates(o, r) for o in live if o is not r)]
    return sorted(front, key=_effective_ms)


def _effective_ms(r: LeverResult) -> float:
    """The measured percentile when verified, else the predicted one."""
    if r.measured_ms:
        value = r.measured_ms.get("target")
        if value is not None and math.isfinite(value):
            return value
    return r.target_ms


def _dominates(a: LeverResult, b: LeverResult) -> bool:
    la, lb = _effective_ms(a), _effective_ms(b)
    return (la <= lb and a.risk_level <= b.risk_level) and (la < lb or a.risk_level < b.risk_level)
