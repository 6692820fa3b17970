"""How far each op family's timings follow the pace probe: the configs a profile timed twice.

    python benchmarks/pace_pairs.py DB

Per family, over the configs timed twice with the probe between metering windows beside both
(`KernelDB.paced_pairs`): the exponent `kernels_db.store.pace_exponents` fits, the correlation of
log(timing ratio) with log(pace ratio), and the pairs' |log ratio| left (median and 90th
percentile) as timed, brought to one pace whole (exponent 1) and by the fitted exponent. This is
the evidence behind `at_usual_pace` (benchmarks/RESULTS.md, 2026-12-06 night). Reads only.
"""

from __future__ import annotations

import sys

import numpy as np

from kernels_db.store import KernelDB, pace_exponents


def _row(name: str, xy: list[tuple[float, float]], k: float) -> str:
    x, y = np.array([p for p, _ in xy]), np.array([t for _, t in xy])
    r = float(np.corrcoef(x, y)[0, 1]) if len(xy) > 2 and x.std() > 0 else float("nan")
    left = [np.abs(y - e * x) for e in (0.0, 1.0, k)]
    cells = "  ".join(f"{np.median(v):.3f}/{np.percentile(v, 90):.3f}" for v in left)
    return f"{name:9s} {len(xy):5d}  k {k:4.2f}  r {r:5.2f}  {cells}"


def main(db_path: str) -> None:
    with KernelDB.open(db_path, readonly=True) as db:
        device = db.list_devices()[0].id
        pairs = db.paced_pairs(device)
    if not pairs:
        sys.exit(f"{db_path}: no config timed twice with the pace probe beside it")
    k = pace_exponents(pairs)
    print(f"{device}: |log ratio| of a config's two timings, median/90th percentile")
    print("family    pairs  fitted   corr    as timed      at pace^1     at pace^k")
    for family, xy in sorted(pairs.items(), key=lambda kv: -len(kv[1])):
        print(_row(family, xy, k[family]))
    print(_row("all", [p for xy in pairs.values() for p in xy], k["*"]))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    main(sys.argv[1])
