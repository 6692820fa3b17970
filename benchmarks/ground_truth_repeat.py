"""How well does the machine's ground truth repeat, and how close is the predictor to it?

    python benchmarks/ground_truth_repeat.py EVAL_JSON EVAL_JSON [EVAL_JSON ...]

Reads recorded `hwlat evaluate --json` reports (no timing). Every pair of reports of one device
(its id holds the thread count) is compared on the settings both measured: one evaluation's
measurements as a prediction of the other's, for three ground truths of a model: the median of
its round medians with only the rounds beside other work left out (as `hwlat evaluate` measured
before 2026-12-03), the same with the rounds in a slow spell left out too (as it measures now,
`predictor.evaluate.quiet_rounds`), and the fastest of those rounds. Then each report's own
predictions against all three. "Level removed" divides every prediction by the median ratio of
prediction to measurement first: what is left is how well the models are told apart, not how
fast the machine ran that hour. Where the predictor's level-removed error is near the
evaluations' level-removed error against each other, the predictor is at the noise of this
ground truth.

On the 2-vCPU dev VM's 32 MiB-L3 incarnation (benchmarks/RESULTS.md, 2026-12-03 day; three
evaluations at 1 thread and three at 2, each right after its own 10-minute profile), evaluations
of one thread count agreed with each other at 6.7-11.7% MAPE on the median of rounds as recorded,
5.5-10.4% with the rounds in a slow spell left out (as `hwlat evaluate` measures now), and
3.3-8.2% on the fastest round with the hour's level removed; hwlat's level-removed error against
that was 4.2-8.8%. A fourth evaluation at each thread count, in a slower hour, set against the
others at 11.2-22.8% (level removed 5.7-11.2%).
"""

from __future__ import annotations

import itertools
import json
import sys

import numpy as np

from predictor.evaluate import metrics, quiet_rounds, slow_rounds

TRUTHS = ("median of rounds", "... slow ones out", "fastest round")


def _with_slow_rounds(report: dict) -> dict:
    """The report with each model's rounds in a slow spell as `hwlat evaluate` finds them now
    (`quiet_rounds`; reports from before it have the paces but not the verdict)."""
    slow = slow_rounds([m.get("round_pace_ms", []) for m in report["models"]])
    for m, rounds in zip(report["models"], slow, strict=True):
        m["slow_rounds"] = rounds
    return report


def _truth(model: dict, how: str) -> float:
    """The model's measurement as `hwlat evaluate` took it before slow rounds were left out, as
    it does now, or its fastest quiet round."""
    rounds, contended = model["measured_rounds_ms"], model.get("contended_rounds", [])
    if how == "median of rounds":
        return float(np.median(quiet_rounds(rounds, contended)))
    quiet = quiet_rounds(rounds, contended, model["slow_rounds"])
    return float(np.median(quiet) if how == "... slow ones out" else min(quiet))


def _line(measured: list[float], predicted: list[float]) -> str:
    ratio = np.divide(predicted, measured)
    raw = metrics(measured, predicted)
    flat = metrics(measured, list(np.asarray(predicted) / np.median(ratio)))
    return (f"MAPE {raw['mape_pct']:5.1f}%  within 10% {raw['within_10pct'] * 100:3.0f}%  "
            f"median error {(np.median(ratio) - 1) * 100:+5.1f}%  | level removed: MAPE "
            f"{flat['mape_pct']:4.1f}%  within 10% {flat['within_10pct'] * 100:3.0f}%")


def main(paths: list[str]) -> None:
    reports = {p: _with_slow_rounds(json.load(open(p))) for p in paths}
    keyed = {p: {(m["spec"], tuple(m["inputs"]), m["dtype"]): m for m in r["models"]}
             for p, r in reports.items()}
    print("one evaluation's measurements as a prediction of another's:")
    for a, b in itertools.combinations(paths, 2):
        shared = sorted(set(keyed[a]) & set(keyed[b]))
        if reports[a]["device"] != reports[b]["device"] or len(shared) < 5:
            continue
        print(f"  {a} -> {b} ({len(shared)} settings, {reports[a]['device']})")
        for how in TRUTHS:
            print(f"    {how:17s} " + _line([_truth(keyed[b][k], how) for k in shared],
                                            [_truth(keyed[a][k], how) for k in shared]))
    print("hwlat's predictions:")
    for p, r in reports.items():
        print(f"  {p} ({len(r['models'])} settings, {r['device']})")
        for how in TRUTHS:
            print(f"    {how:17s} " + _line([_truth(m, how) for m in r["models"]],
                                            [m["predicted_ms"] for m in r["models"]]))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("\n\n")[1])
    main(sys.argv[1:])
