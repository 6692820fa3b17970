"""Does scaling the predictions by the pace probe (`hwlat evaluate --anchor pace`) bring them to
the measurements of a session that ran at another speed than its profile? Replays the rounds a
`hwlat evaluate --json` recorded (each round's median and the probe's time beside it) through
`predictor.evaluate.evaluate`, once anchored to the profile and once to the pace (no timing:
captures only, ~25 s per pair on 2 cores).

    python benchmarks/pace_anchor.py DB EVAL_JSON [DB EVAL_JSON ...]

Run it with the XDG_CACHE_HOME the evaluation ran with, so the op models are the ones it predicted
with. Per pair: the recorded MAPE and the replayed one (they match: the replay marks the rounds
recorded beside other work as such, and takes the extra rounds the evaluation took), the pace anchor's median factor over the models
(each model's the geometric mean of the probe beside its kept rounds and over all kept rounds,
over the probe in the profile) with the probe's median now and then, and MAPE, share within 5% and
10%, and the median prediction/measurement ratio with each anchor.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from kernels_db.store import KernelDB
from predictor.e2e import Predictor
from predictor.evaluate import EvalCase, EvalReport, evaluate
from profilers.contention import CpuUse
from profilers.timer import Measurement

BUSY = CpuUse(others_cores=64.0, cpus=2, window_s=1.0)  # a recorded round beside other work


def _replay(report: dict):
    """A MeasureFn that returns each case's recorded rounds, in order, with their pace and
    whether they ran beside other work: so `evaluate` takes the extra rounds it took then."""
    rounds = {(m["spec"], tuple(m["inputs"]), m["dtype"]): iter(
        [(ms, pace_ms, n in m["contended_rounds"]) for n, (ms, pace_ms) in enumerate(
            zip(m["measured_rounds_ms"], m["round_pace_ms"], strict=True))])
        for m in report["models"]}

    def measure(spec, inputs, runs, warmup, threads, device, dtype) -> Measurement:
        ms, pace_ms, busy = next(rounds[spec, tuple(inputs), dtype])
        return Measurement(samples_s=(ms / 1e3,), warmup=warmup, threads=threads or 1,
                           flushed=False, device=device, stopped_by="stable",
                           pace_s=pace_ms / 1e3 if pace_ms else None,
                           cpu_use=BUSY if busy else None)
    return measure


def _line(label: str, r: EvalReport) -> str:
    m = r.summary["hwlat"]
    level = np.median([row.predicted_ms / row.measured_ms for row in r.rows])
    return (f"  {label:8s} MAPE {m['mape_pct']:5.1f}%  within 5% {m['within_5pct']:4.0%}  "
            f"within 10% {m['within_10pct']:4.0%}  predicted/measured median {level:.3f}")


def pair(db_path: str, eval_path: str) -> None:
    report = json.load(open(eval_path))
    cases = [EvalCase(m["spec"], tuple(m["inputs"]), m["family"], m["dtype"])
             for m in report["models"]]
    with KernelDB.open(db_path, readonly=True) as db:
        predictor = Predictor.for_device(db, report["device"])
        runs = {anchor: evaluate(db, report["device"], cases, runs=report["runs"],
                                 predictor=predictor, measure_fn=_replay(report), anchor=anchor,
                                 extra_rounds=report.get("extra_rounds", 0))
                for anchor in ("profile", "pace")}
    paced = runs["pace"]
    ratio = (f"median model factor {paced.drift.ratio:.3f}, the probe {paced.drift.pace_ms[0]:.2f} "
             f"ms over all kept rounds / {paced.drift.pace_ms[1]:.2f} ms in the profile"
             if paced.drift else "pace unknown (not probed)")
    print(f"{eval_path}: recorded MAPE {report['summary']['hwlat']['mape_pct']:.1f}%, {ratio}")
    for anchor, r in runs.items():
        print(_line(anchor, r))


def main(argv: list[str]) -> None:
    if not argv or len(argv) % 2:
        sys.exit(__doc__.split("\n\n")[1])
    for i in range(0, len(argv), 2):
        pair(argv[i], argv[i + 1])


if __name__ == "__main__":
    main(sys.argv[1:])
