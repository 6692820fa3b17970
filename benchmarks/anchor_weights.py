"""How much should the pace anchor trust the probe beside a model's own rounds? Re-anchors the
predictions a `hwlat evaluate --json` recorded (`predicted_profile_ms`, else `predicted_ms`, for a
profile-anchored one) with each model's factor the weighted geometric mean of two ratios to the
probe's median in the profile: the probe's median beside the rounds the model's measurement keeps
(the moment) and over every kept round (the session). No timing and no capture: seconds per pair.

    python benchmarks/anchor_weights.py DB EVAL_JSON [DB EVAL_JSON ...]

Per pair, MAPE and share within 10% with the profile anchor, the session's ratio alone (weight 0
on the moment), the moment's alone (weight 1) and weights 0.3, 0.5 (what `--anchor pace` uses:
checked against `predictor.evaluate._pace_anchor`) and 0.7; then the mean of each over the pairs.
"""

from __future__ import annotations

import json
import statistics
import sys

import numpy as np

from kernels_db.store import KernelDB
from predictor.evaluate import _kept_paces, _kept_rounds, _pace_anchor, _pace_drift

WEIGHTS = {"session": 0.0, "w0.3": 0.3, "w0.5": 0.5, "w0.7": 0.7, "moment": 1.0}


def _scores(predicted: list[float], measured: list[float], factors) -> tuple[float, float]:
    ape = [abs(p * f / m - 1) * 100 for p, m, f in zip(predicted, measured, factors, strict=True)]
    return float(np.mean(ape)), float(np.mean([a <= 10 for a in ape]))


def pair(db_path: str, eval_path: str) -> dict[str, tuple[float, float]]:
    report = json.load(open(eval_path))
    models = report["models"]
    with KernelDB.open(db_path, readonly=True) as db:
        profile_timings = db.model_measurements(report["device"], kind="e2e")
    paces = [m["round_pace_ms"] for m in models]
    contended = [m["contended_rounds"] for m in models]
    slow = [m["slow_rounds"] for m in models]
    overall = _pace_drift(_kept_paces(paces, contended, slow), profile_timings)
    if overall is None:
        raise SystemExit(f"{eval_path}: the pace probe is unknown in the profile or the evaluation")
    session, then = overall.ratio, overall.pace_ms[1]
    kept = [[ps[n] for n in _kept_rounds(len(ps), c, s) if ps[n]]
            for ps, c, s in zip(paces, contended, slow, strict=True)]
    moment = [statistics.median(k) / then if k else session for k in kept]
    predicted = [m.get("predicted_profile_ms") or m["predicted_ms"] for m in models]
    measured = [m["measured_ms"] for m in models]
    out = {"profile": _scores(predicted, measured, [1.0] * len(models))}
    for label, w in WEIGHTS.items():
        out[label] = _scores(predicted, measured, [session ** (1 - w) * m ** w for m in moment])
    _, factors = _pace_anchor(paces, contended, slow, profile_timings)
    assert np.allclose(factors, [(session * m) ** 0.5 for m in moment])  # the anchor as built
    print(f"{eval_path}: session x{session:.3f}, " + "  ".join(
        f"{k} {mape:.1f}%/{w10:.0%}" for k, (mape, w10) in out.items()))
    return out


def main(argv: list[str]) -> None:
    if not argv or len(argv) % 2:
        sys.exit(__doc__.split("\n\n")[1])
    runs = [pair(argv[i], argv[i + 1]) for i in range(0, len(argv), 2)]
    print(f"mean over {len(runs)}: " + "  ".join(
        f"{k} {np.mean([r[k][0] for r in runs]):.2f}%/{np.mean([r[k][1] for r in runs]):.1%}"
        for k in runs[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
