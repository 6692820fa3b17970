"""Which statistic of a zoo setting's end-to-end runs should the correction be fitted to? Refit
the five terms (`predictor.correction`) on each statistic of the profile's own runs and
re-predict a recorded `hwlat evaluate --json` of the same profile (no timing: captures only,
~30 s per pair on 2 cores).

    python benchmarks/zoo_statistic.py DB EVAL_JSON CACHE_HOME [DB EVAL_JSON CACHE_HOME ...]

CACHE_HOME is the XDG_CACHE_HOME the evaluation ran with, so the op models are the ones it
predicted with (the first line per pair says how closely the median's refit reproduces its
predictions). The statistics (`STATISTICS`; one entry each), each taken per timing and then the
lowest over a setting's timings, as `Predictor.model_rows` takes the median:
- median: what the profile fits now;
- 25th / 10th percentile;
- fast-state median: the median of the runs within 10% of the 10th percentile. At 2 threads the
  dev VM runs in two states ~1.2x apart and can change state inside one timing: resnet50 at
  1x160 ran a median 44.5 ms over 57 runs whose 10th percentile was 36.7 (12-04 13:18 profile).
Each is scored against the evaluation's measurements (the median of its rounds' medians, as
`hwlat evaluate` reports) as the profile-anchored prediction and under `--anchor pace` (the
pace factor of `predictor.evaluate._pace_anchor`), with MAPE, share within 10% and MAPE with the
level removed; then the zoo's own leave-one-family-out MAPE against each statistic; then the mean over
the pairs.

On nine pairs of the held-out zoo on the dev VM (12-04 02:32 to 13:18, four at 1 thread, five at
2; benchmarks/RESULTS.md, 2026-12-04 evening) the median stayed: the lower statistics fit the
zoo more tightly (leave-one-family-out 7.0-7.3% against 7.8%) but leave the held-out shape as it
was (6.8% MAPE with the level removed for all four) and lower the level the evaluation's medians
are at (7.8% MAPE at the profile's anchor against 8.2-9.2%; 6.4% against 6.5-7.1% with the pace
anchor).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from correction_variants import (
    Setting,
    _as_fitted,
    _fit_linear,
    _lofo,
    _scores,
    reproduction_gap,
    settings_of,
)

from kernels_db.store import KernelDB
from predictor.evaluate import _pace_anchor, metrics


def _fast_state_median(samples: np.ndarray) -> float:
    return float(np.median(samples[samples <= 1.1 * np.percentile(samples, 10)]))


STATISTICS: dict[str, Callable[[np.ndarray], float]] = {
    "median": lambda s: float(np.median(s)),
    "25th percentile": lambda s: float(np.percentile(s, 25)),
    "10th percentile": lambda s: float(np.percentile(s, 10)),
    "fast-state median": _fast_state_median,
}


def _fit(zoo: list[Setting]) -> Callable[[Setting], float]:
    return _fit_linear(_as_fitted, zoo)


def pair(db_path: str, eval_path: str) -> dict[str, tuple[float, ...]]:
    report = json.load(open(eval_path))
    models = report["models"]
    with KernelDB.open(db_path, readonly=True) as db:
        _, zoo_timings, held = settings_of(db, report)
        _, pace = _pace_anchor([r["round_pace_ms"] for r in models],
                               [r["contended_rounds"] for r in models],
                               [r["slow_rounds"] for r in models],
                               db.model_measurements(report["device"], kind="e2e"))
    pace = pace or [1.0] * len(models)  # the probe unknown: the profile's anchor
    zoo = {name: [replace(s, measured_s=min(stat(np.asarray(g.samples_s)) for g in group))
                  for group, s in zoo_timings]
           for name, stat in STATISTICS.items()}
    fitted = {name: _fit(settings) for name, settings in zoo.items()}
    gap = reproduction_gap(fitted["median"], held, report)
    print(f"{eval_path}: {len(zoo['median'])} end-to-end settings, {len(held)} evaluated; the "
          f"median's refit reproduces the evaluation's predictions to {gap:.1e}")
    print(f"  {'statistic':20s} {'MAPE':>6s} {'in 10%':>6s} {'flat':>6s} | pace {'MAPE':>6s} "
          f"{'in 10%':>6s} | {'zoo LOFO':>8s} {'level':>6s}")
    out = {}
    for name, settings in zoo.items():
        predicted = [fitted[name](s) for s in held]
        mape, within, flat = _scores(predicted, held)
        pmape, pwithin, _ = _scores(list(np.multiply(predicted, pace)), held)
        lofo = metrics([s.measured_s for s in settings], _lofo(_fit, settings))["mape_pct"]
        level = float(np.median(np.divide(predicted, [fitted["median"](s) for s in held])))
        out[name] = (mape, within, flat, pmape, pwithin, lofo)
        print(f"  {name:20s} {mape:5.1f}% {within:5.0f}% {flat:5.1f}% |      {pmape:5.1f}% "
              f"{pwithin:5.0f}% | {lofo:7.1f}% {level:6.3f}")
    return out


def main(argv: list[str]) -> None:
    if len(argv) < 3 or len(argv) % 3:
        sys.exit(__doc__.split("\n\n")[1])
    results = []
    for i in range(0, len(argv), 3):
        os.environ["XDG_CACHE_HOME"] = argv[i + 2]
        results.append(pair(argv[i], argv[i + 1]))
    if len(results) > 1:
        print(f"mean over {len(results)} pairs (MAPE, within 10%, level removed | pace MAPE, "
              "within 10% | zoo LOFO)")
        for name in STATISTICS:
            each = np.array([r[name] for r in results]).mean(axis=0)
            print(f"  {name:20s} " + " ".join(f"{v:6.1f}" for v in each))


if __name__ == "__main__":
    main(sys.argv[1:])
