"""Did a sampler change price a model's ops better? Each op family's summed estimate from one or
more databases against the same ops re-timed alone now, per model and over all of them.

    python benchmarks/databases_vs_alone.py THREADS FAMILIES LABEL=DB@CACHE_HOME [...] \
        -- SPEC@INPUT [SPEC@INPUT ...]

FAMILIES is a comma-separated list (norm,reduce,eltwise,...); CACHE_HOME is the XDG_CACHE_HOME
each database's models were trained into (so they are reloaded, not retrained). Every distinct op
config is timed alone once, as a profile times it (`kernels_db.build._measure_config`), after the
flush a profile of this machine uses (`profilers.timer.flush_bytes`: its L2 per core x threads).
Each database prices it as `hwlat predict` would, hidden copies split off included
(`profilers.ops.split_hidden_work`), so an older database is priced with this code's split.
Unlike `inmodel_vs_isolated.py` it compares databases, not the model against its ops: the ops
alone are the ground truth of the op models, whatever the model does around them.

The machine's pace is probed around each op timed alone (`profilers.pace`, as a profile probes its
metering windows), and the sums are given twice: as timed, and brought to the first database's
usual pace with its exponents (`kernels_db.store.at_usual_pace`), the level its op models were
trained at. On the flapping Xeon of 12-06 a pool timed alone at a probe of 3.4 ms ran 5.2-5.8
ns per window element and at 2.2 ms 3.4-3.5: as timed, its ops read 0.65-0.75x priced where the
database priced them at its own resnet maxpool's rate.

Two settings in the environment make it compare code as well as databases:
- ALONE_TIMES=FILE: the times alone (at the usual pace and as timed) are read from FILE and the
  ones missing are timed and written back, so a second run from another checkout (a feature
  change) prices the very same timings, with no minute of the machine between them;
- TOP=N: under each model, its N ops with the most time alone, each with every database's price.

Written for the sampler's permuted views (`profilers.sampling.STRIDED_SHARE`): the 12-03 14:53
profile priced XCiT's and ConvNeXt-V2's reductions at 0.23x and 0.14x their time alone, the
18:19 profile with the views at 0.49x and 0.70x (benchmarks/RESULTS.md, 2026-12-03 evening).
"""

from __future__ import annotations

import collections
import json
import math
import os
import sys
from pathlib import Path

import torch

from kernels_db.build import _measure_config
from kernels_db.store import KernelDB, pace_exponents, to_usual_pace
from predictor.e2e import Predictor, _shapes
from profilers import allocator, pace
from profilers.capture import capture_spec
from profilers.fingerprint import cpu_caches
from profilers.ops import is_free, record_family
from profilers.specs import parse_input_spec
from profilers.timer import CacheFlusher, flush_bytes

ALONE, PACED = "alone", "alone@usual"


def _predictors(labelled: list[str]) -> list[tuple[str, Predictor]]:
    out = []
    for item in labelled:
        label, _, where = item.partition("=")
        db_path, _, cache = where.partition("@")
        os.environ["XDG_CACHE_HOME"] = cache  # read when the models are loaded, just below
        with KernelDB.open(db_path, readonly=True) as db:
            out.append((label, Predictor.for_device(db, db.list_devices()[0].id)))
    return out


def _usual_pace(labelled: str) -> tuple[float | None, dict[str, float]]:
    """The usual pace of a LABEL=DB@CACHE's device and its families' pace exponents."""
    db_path = labelled.partition("=")[2].partition("@")[0]
    with KernelDB.open(db_path, readonly=True) as db:
        device = db.list_devices()[0].id
        return (pace.usual_pace(m.pace_s for m in db.measured(device)),
                pace_exponents(db.paced_pairs(device)))


def _line(family: str, sums: dict[str, float], labels: list[str]) -> str:
    alone, paced = sums[ALONE], sums[PACED]
    return (f"  {family:8s} {ALONE} {alone * 1e3:8.3f} ms  {PACED} {paced * 1e3:8.3f}  "
            + "  ".join(f"{label} {sums[label] * 1e3:8.3f} ({sums[label] / alone:.2f}x,"
                        f" {sums[label] / paced:.2f}x)" for label in labels))


def main(threads: int, families: list[str], labelled: list[str], models: list[str]) -> None:
    torch.set_num_threads(threads)
    allocator.apply()
    predictors = _predictors(labelled)
    labels = [label for label, _ in predictors]
    flusher = CacheFlusher(flush_bytes("cpu", threads, cpu_caches().get("l2")))
    usual, exponents = _usual_pace(labelled[0])
    probe = pace.probe(pace.WINDOW_PROBE_RUNS)
    times_file = os.environ.get("ALONE_TIMES")
    top = int(os.environ.get("TOP", "0"))
    alone: dict[str, tuple[float, float]] = {}  # key -> (as timed, at the usual pace)
    if times_file and Path(times_file).exists():
        alone = {k: tuple(v) for k, v in json.loads(Path(times_file).read_text()).items()}
    overall: dict[str, dict[str, float]] = collections.defaultdict(
        lambda: collections.defaultdict(float))
    for item in models:
        spec, _, inp = item.partition("@")
        captured = capture_spec(spec, inputs=[parse_input_spec(inp)])
        for _, predictor in predictors:
            predictor.estimate_ops(captured.ops)
        sums: dict[str, dict[str, float]] = collections.defaultdict(
            lambda: collections.defaultdict(float))
        per_op: dict[str, list] = {}  # key -> [record, calls]
        for record in captured.ops:
            family = record_family(record)
            if is_free(record) or family not in families:
                continue
            if record.key not in alone:
                before = probe()
                seconds = _measure_config(record, "cpu", flusher, threads)[0].median_s
                now = math.sqrt(before * probe())
                alone[record.key] = (seconds, seconds * to_usual_pace(now, usual, family,
                                                                      exponents)
                                     if usual else seconds)
            per_op.setdefault(record.key, [record, 0])[1] += 1
            sums[family][ALONE] += alone[record.key][0]
            sums[family][PACED] += alone[record.key][1]
            for label, predictor in predictors:
                sums[family][label] += predictor.estimate(record).p50_s
        print(f"{spec} {inp}")
        for family, by_label in sorted(sums.items()):
            print(_line(family, by_label, labels))
            for label, seconds in by_label.items():
                overall[family][label] += seconds
        heaviest = sorted(per_op.values(), key=lambda rc: -rc[1] * alone[rc[0].key][1])[:top]
        for record, calls in heaviest:
            paced = alone[record.key][1]
            priced = [(label, p.estimate(record).p50_s) for label, p in predictors]
            print(f"    {record.op} {_shapes(record):50s} x{calls:<3d} {PACED} {paced * 1e3:8.3f} ms"
                  "  " + "  ".join(f"{label} {s * 1e3:8.3f} ({s / paced:.2f}x)"
                                   for label, s in priced))
        if times_file:
            Path(times_file).write_text(json.dumps(alone))
        sys.stdout.flush()
    print("all models")
    for family in families:
        if overall[family][ALONE]:
            print(_line(family, overall[family], labels))


if __name__ == "__main__":
    if "--" not in sys.argv or sys.argv.index("--") < 4:
        sys.exit(__doc__.split("\n\n")[1])
    split = sys.argv.index("--")
    main(int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3:split], sys.argv[split + 1:])
