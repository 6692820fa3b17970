"""Does `hwlat predict --anchor pace` beat the profile's prediction on a machine whose speed moved?

    python benchmarks/predict_at_pace.py DB DEVICE [ROUNDS] > LOG.tsv

What a user does, case after case over the held-out zoo (batch 1 and 8, 224 and 160 px), ROUNDS
times: time the pace probes here (`predictor.evaluate.pace_now`, as `predict --anchor pace` does),
predict the model as profiled and at that pace (`at_pace`), then time it for real in a fresh
process (`profilers.modelbench.time_forward_isolated`, median of its runs). One line per case: the
two predictions, the measurement, and the probes now, in the child beside the model, and in the
profile (a field left empty where unknown). A summary follows on stderr: MAPE and share within 10%
for the profile's prediction, `--anchor pace`, the same with the whole factor (`PaceNow.weight` 1,
not `PACE_WEIGHT`), the factor alone (whole, no chain term), and the factor the probe beside the
model in its child would have given (what the moment of the prediction costs); then, for the
interval as profiled, as `--anchor pace` gives it (`lo_ms`, `hi_ms`; meant to hold 80%) and with
the whole factor, the share of measurements inside and its median width. `factor` and `per_op_us`
are the probes' readings, `scale` what `--anchor pace` applied (`PaceNow.scale`); `probe_p10_ms`
and `probe_p90_ms` are the pace probe's spread over the rounds `pace_now` timed.
Models that compute subnormals (swin_t) are left out: their slow path is priced from a count
each prediction would make afresh, which is not what this compares.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace

from kernels_db.store import KernelDB
from predictor.e2e import Predictor
from predictor.evaluate import at_pace, metrics, pace_now, zoo_cases
from profilers.modelbench import time_forward_isolated


def _ms(value: float | None, scale: float, digits: int) -> str:
    """A TSV field: `value` x `scale`, or empty where unknown (no chain probe in the profile, no
    probe beside the child's timing), never 0."""
    return "" if value is None else f"{value * scale:.{digits}f}"


def _summary(name: str, got: list[tuple[float, float]]) -> str:
    """One line: MAPE and share within 10% (`predictor.evaluate.metrics`) and the median signed
    error of the (measured, predicted) pairs `got`."""
    measured, predicted = zip(*got, strict=True)
    m = metrics(measured, predicted)
    median = statistics.median(p / t - 1 for t, p in got)
    return (f"{name}: MAPE {m['mape_pct']:.1f}%, within 10% {100 * m['within_10pct']:.0f}%, "
            f"median error {100 * median:+.1f}% ({m['n']} timings)")


def main() -> None:
    db_path, device = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    with KernelDB.open(db_path, readonly=True) as db:
        predictor = Predictor.for_device(db, device)
        timings = db.model_measurements(device, kind="e2e")
    threads = predictor.device.threads
    cases = [c for c in zoo_cases(batches=(1, 8)) if "swin" not in c.spec]
    # (measured, predicted) ms per way of predicting
    pairs: dict[str, list[tuple[float, float]]] = {
        "profile": [], "pace": [], "pace, whole factor": [], "factor only": [],
        "factor of the child's probe": []}
    # whether the interval (meant to hold 80%) holds the measurement, and its width over p50
    covered: dict[str, list[tuple[bool, float]]] = {"profile": [], "pace": [],
                                                   "pace, whole factor": []}
    print("round\tspec\tinputs\tprofile_ms\tpace_ms\tmeasured_ms\tfactor\tscale\tper_op_us"
          "\tprobe_now_ms\tprobe_child_ms\tprobe_then_ms\tlo_ms\thi_ms\tprobe_p10_ms"
          "\tprobe_p90_ms", flush=True)
    for r in range(rounds):
        for case in cases:
            now = pace_now(predictor, timings)
            if now is None:
                sys.exit(f"{device}'s profile has no pace probe timings")
            plain = predictor.predict_spec(case.spec, inputs=list(case.inputs), values=False)
            paced = at_pace(plain, now)
            whole = at_pace(plain, replace(now, weight=1.0))
            m = time_forward_isolated(case.spec, list(case.inputs), threads=threads,
                                      min_runs=10, warmup=2, max_time_s=3.0)
            measured = m.median_s * 1e3
            for name, p in (("profile", plain), ("pace", paced), ("pace, whole factor", whole)):
                lo, hi = p.interval_ms
                covered[name].append((lo <= measured <= hi, (hi - lo) / p.p50_ms))
            pairs["profile"].append((measured, plain.p50_ms))
            pairs["pace"].append((measured, paced.p50_ms))
            pairs["pace, whole factor"].append((measured, whole.p50_ms))
            pairs["factor only"].append((measured, now.factor * plain.p50_ms))
            if m.pace_s:
                pairs["factor of the child's probe"].append(
                    (measured, m.pace_s * 1e3 / now.pace_then_ms * plain.p50_ms))
            print(f"{r}\t{case.spec}\t{','.join(case.inputs)}\t{plain.p50_ms:.3f}"
                  f"\t{paced.p50_ms:.3f}\t{measured:.3f}\t{now.factor:.4f}\t{now.scale:.4f}"
                  f"\t{_ms(now.per_op_ms, 1e3, 2)}\t{now.pace_now_ms:.3f}"
                  f"\t{_ms(m.pace_s, 1e3, 3)}\t{now.pace_then_ms:.3f}"
                  f"\t{paced.interval_ms[0]:.3f}\t{paced.interval_ms[1]:.3f}"
                  f"\t{now.pace_low_ms:.3f}\t{now.pace_high_ms:.3f}", flush=True)
    for name, got in pairs.items():
        if got:
            print(_summary(name, got), file=sys.stderr)
    for name, rows in covered.items():
        print(f"interval, {name}: {100 * sum(c for c, _ in rows) / len(rows):.0f}% of "
              f"measurements inside, median width {100 * statistics.median(w for _, w in rows):.0f}"
              f"% of p50", file=sys.stderr)


if __name__ == "__main__":
    main()
