"""What would a recorded `hwlat evaluate --json` have scored with another database? Each model's
recorded prediction times the ratio of its predictions from the second database and from the
first (the one it was evaluated with), against the same measurements. No timing: captures only.

    python benchmarks/evaluation_with_database.py DB CACHE_HOME OTHER_DB OTHER_CACHE EVAL_JSON [...]

CACHE_HOME is the XDG_CACHE_HOME the evaluation ran with, so the first database's op models are
the ones it predicted with; OTHER_CACHE is where the second one's are trained (or reloaded). The
ratio keeps what the evaluation added on top of the op models (the pace anchor, subnormals).
This is how a sampler change was measured on the same timings (benchmarks/RESULTS.md, 2026-12-07
day): `add_random.py DB OTHER_DB FAMILY ROUNDS` times more random configs into a copy, or the
configs a change added are deleted from a copy of a profile made with it. Per set: MAPE, share
within 10% and Spearman as evaluated and with the other database, and each model whose prediction
moved by more than 3%.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from kernels_db.store import KernelDB
from predictor.e2e import Predictor
from predictor.evaluate import metrics

MOVED = 0.03  # a model whose prediction moves by more than this is listed


def _predictor(db_path: str, cache_home: str) -> Predictor:
    os.environ["XDG_CACHE_HOME"] = cache_home
    with KernelDB.open(db_path, readonly=True) as db:
        return Predictor.for_device(db, db.list_devices()[0].id)


def main(argv: list[str]) -> None:
    if len(argv) < 5:
        sys.exit(__doc__.split("\n\n")[1])
    first, other = _predictor(argv[0], argv[1]), _predictor(argv[2], argv[3])
    for path in argv[4:]:
        report = json.loads(Path(path).read_text())
        measured, as_evaluated, with_other = [], [], []
        for m in report["models"]:
            ratio = (other.predict_spec(m["spec"], inputs=list(m["inputs"])).latency_ms["p50"]
                     / first.predict_spec(m["spec"], inputs=list(m["inputs"])).latency_ms["p50"])
            measured.append(m["measured_ms"])
            as_evaluated.append(m["predicted_ms"])
            with_other.append(m["predicted_ms"] * ratio)
            if abs(ratio - 1) > MOVED:
                print(f"  {m['spec']:34s} {'/'.join(m['inputs']):16s} "
                      f"{100 * (as_evaluated[-1] / measured[-1] - 1):+6.1f}% -> "
                      f"{100 * (with_other[-1] / measured[-1] - 1):+6.1f}%")
        a, b = metrics(measured, as_evaluated), metrics(measured, with_other)
        print(f"{Path(path).name}: {len(measured)} models; MAPE {a['mape_pct']:.1f}% -> "
              f"{b['mape_pct']:.1f}%, within 10% {100 * a['within_10pct']:.0f}% -> "
              f"{100 * b['within_10pct']:.0f}%, Spearman {a['spearman']:.3f} -> "
              f"{b['spearman']:.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
