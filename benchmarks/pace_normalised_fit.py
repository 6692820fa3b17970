"""Would scaling each end-to-end timing to the device's usual pace make the correction steadier?
Refit it on the profile's own timings scaled by (usual pace / the timing's pace) ** beta and
re-predict a recorded `hwlat evaluate --json` of the same profile (no timing: captures only).

    python benchmarks/pace_normalised_fit.py DB EVAL_JSON [DB EVAL_JSON ...]

Run it with the XDG_CACHE_HOME the evaluation used, so the op models are the ones it predicted
with (the first line per pair checks that the unscaled refit reproduces its predictions). The
usual pace is either the 25th percentile of all the device's timings' paces (as `profilers.pace`
flags slow spells) or the median pace of the timings the fit uses; beta 0.5 or 1.

On the 2-vCPU dev VM's 32 MiB-L3 incarnation (six profile/evaluation pairs of 12-02 23:51 to
12-03 05:10, three at each thread count; benchmarks/RESULTS.md, 2026-12-03 morning) no variant
helped: held-out MAPE unscaled 8.9/10.6/4.6/11.1/9.1/9.2%, the best scaling 8.8/10.4/4.6/10.0/
9.8/8.9%, and the 25th percentile at beta 1 worse on five of six. The quiet timings the fit keeps
ran at their evaluation's pace already (1.79 vs 1.72 ms in the 2-thread pair of 04:10), yet their
models fitted at 1.19x the sum of their ops: the slowdowns that move a model's time are not the ones
the probe, timed before and after it, sees.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import numpy as np

from kernels_db.store import KernelDB
from predictor.correction import Correction, fit_correction
from predictor.e2e import Predictor
from predictor.evaluate import metrics
from profilers.capture import capture_spec
from profilers.specs import parse_input_spec


def _score(held: list[tuple[tuple, float]], correction: Correction) -> str:
    measured = [ms for _, ms in held]
    predicted = [correction.apply(*terms) * 1e3 for terms, _ in held]
    m = metrics(measured, predicted)
    median_error = np.median(np.divide(predicted, measured) - 1) * 100
    return (f"MAPE {m['mape_pct']:5.1f}%  within 10% {m['within_10pct'] * 100:3.0f}%  "
            f"median error {median_error:+5.1f}%")


def main(db_path: str, eval_path: str) -> None:
    report = json.load(open(eval_path))
    with KernelDB.open(db_path, readonly=True) as db:
        predictor = Predictor.for_device(db, report["device"])
        passes = predictor.e2e_passes(db)
        rows = predictor.model_rows(db, passes=passes)
        paces = {}  # each setting's pace: that of the faster timing, the one the fit uses
        for (spec, _), group in passes.items():
            fastest = min(group, key=lambda m: m.median_s)
            paces[spec, tuple(fastest.settings.get("inputs", []))] = fastest.pace_s
        every_pace = [m.pace_s for m in db.model_measurements(predictor.device.id, kind="e2e")
                      if m.pace_s]
    row_paces = [paces.get((r.spec, tuple(r.inputs))) for r in rows]
    if not every_pace or None in row_paces:
        sys.exit(f"{db_path}: its end-to-end timings have no pace (profiled before the probe)")
    unscaled = fit_correction(rows)
    held, reproduced = [], []
    for m in report["models"]:
        captured = capture_spec(m["spec"], inputs=[parse_input_spec(s) for s in m["inputs"]],
                                device_type="cpu", dtype=m["dtype"])
        p = predictor._assemble(captured.ops, spec=m["spec"], correction=Correction())
        terms = (p.sum_ops_ms / 1e3, p.n_timed_ops, p.traffic_ms / 1e3, p.weights_ms / 1e3,
                 p.large_traffic_ms / 1e3, p.floored_ms / 1e3)  # the last: apply's floored_s
        held.append((terms, m["measured_ms"]))
        reproduced.append(unscaled.apply(*terms) * 1e3 / m["predicted_ms"])
    print(f"{eval_path}: {len(rows)} end-to-end settings, {len(held)} evaluated; refit "
          f"reproduces the evaluation's predictions to {max(abs(r - 1) for r in reproduced):.1e}")
    print(f"  paces (ms): fitted timings' median {np.median(row_paces) * 1e3:.2f}, all timings' "
          f"25th percentile {np.percentile(every_pace, 25) * 1e3:.2f}; evaluation "
          + f"{np.median([p for m in report['models'] for p in m['round_pace_ms'] if p]):.2f}")
    print(f"  {'unscaled':24s} {_score(held, unscaled)}")
    for label, usual in (("25th percentile", np.percentile(every_pace, 25)),
                         ("fitted median", np.median(row_paces))):
        for beta in (0.5, 1.0):
            scaled = [replace(r, measured_s=r.measured_s * (usual / pace) ** beta)
                      for r, pace in zip(rows, row_paces, strict=True)]
            print(f"  {label + f', beta {beta}':24s} {_score(held, fit_correction(scaled))}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or len(sys.argv) % 2 == 0:
        sys.exit(__doc__.split("\n\n")[1])
    for i in range(1, len(sys.argv), 2):
        main(sys.argv[i], sys.argv[i + 1])
