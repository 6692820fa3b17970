"""Where a prediction goes wrong, op family by op family: each op's time inside the model, its
estimate from the database, and its time re-measured alone now at one or more flush sizes.

    python benchmarks/inmodel_vs_isolated.py DB DEVICE SPEC INPUT THREADS [FLUSH_MIB,...] [TOP]

This is how two effects the op timings cannot see were found (README, predictor/correction.py):
mobilevit's silu took 1.03 ms in the model and 0.23 ms alone (subnormal activations), and
resnet18's pools at batch 8 and 2 threads 18.2 ms in the model against 13.9 ms alone, at any
flush size (the large-op traffic term). In-model times come from a dispatch mode that times every
aten call, so they include its small overhead; compare families, not single microseconds.
"""

from __future__ import annotations

import collections
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernels_db.build import _measure_config
from kernels_db.store import KernelDB
from predictor.e2e import Predictor
from profilers import allocator
from profilers.capture import capture_spec
from profilers.modelbench import prepare
from profilers.ops import is_free, record_family
from profilers.specs import parse_input_spec
from profilers.timer import CacheFlusher


class _TimeEachOp(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.seconds.append(time.perf_counter() - t)
        return out


def time_in_model(spec: str, inp: str, passes: int = 7):
    """(plain forward times, each op's time in `passes` passes under `_TimeEachOp`, the capture
    of the same ops), in seconds; exits where capture and the real forward disagree on the ops."""
    model, args = prepare(spec, [inp])
    with torch.inference_mode():
        for _ in range(3):
            model(*args)
        plain = []
        for _ in range(15):
            t = time.perf_counter()
            model(*args)
            plain.append(time.perf_counter() - t)
        runs = []
        for _ in range(passes):
            with _TimeEachOp() as mode:
                model(*args)
            runs.append(mode.seconds)
    captured = capture_spec(spec, inputs=[parse_input_spec(inp)])
    if len(captured.ops) != len(runs[0]):
        sys.exit(f"{spec}: capture saw {len(captured.ops)} ops, the real forward {len(runs[0])}: "
                 "the per-op comparison needs the two to match")
    return plain, runs, captured


def main(db_path: str, device: str, spec: str, inp: str, threads: int,
         flush_mib: list[float], top: int) -> None:
    torch.set_num_threads(threads)
    allocator.apply()  # as hwlat times: without it, resnet18 at batch 8 ran 120 ms, not 97
    with KernelDB.open(db_path, readonly=True) as db:
        predictor = Predictor.for_device(db, device)
    plain, runs, captured = time_in_model(spec, inp)
    predictor.estimate_ops(captured.ops)
    flushers = [CacheFlusher(int(m * (1 << 20))) for m in flush_mib]
    alone: dict[tuple[str, int], float] = {}
    by_family = collections.defaultdict(lambda: [0, 0.0, 0.0] + [0.0] * len(flushers))
    gaps = []
    for i, record in enumerate(captured.ops):
        if is_free(record):
            continue
        in_model = statistics.median(run[i] for run in runs)
        row = by_family[record_family(record)]
        row[0] += 1
        row[1] += in_model
        row[2] += predictor.estimate(record).p50_s
        for j, flusher in enumerate(flushers):
            if (record.key, j) not in alone:
                alone[record.key, j] = _measure_config(record, "cpu", flusher,
                                                       threads)[0].median_s
            row[3 + j] += alone[record.key, j]
        gaps.append((in_model - alone[record.key, 0], in_model, record))
    heads = [f"alone@{m:g}MiB" for m in flush_mib]
    print(f"{spec} {inp} at {threads} threads: model median "
          f"{statistics.median(plain) * 1e3:.2f} ms (ms below)")
    print(f"{'family':10s} {'ops':>4s} {'in-model':>9s} {'database':>9s} "
          + " ".join(f"{h:>12s}" for h in heads))
    totals = [sum(r[k] for r in by_family.values()) for k in range(1, 3 + len(flushers))]
    for family, row in [*sorted(by_family.items(), key=lambda kv: -kv[1][1]),
                        ("all", [sum(r[0] for r in by_family.values()), *totals])]:
        print(f"{family:10s} {row[0]:4d} {row[1] * 1e3:9.2f} {row[2] * 1e3:9.2f} "
              + " ".join(f"{v * 1e3:12.2f}" for v in row[3:]))
    print(f"\nops slower in the model than alone (first flush size), top {top}:")
    for gap, in_model, record in sorted(gaps, key=lambda g: -g[0])[:top]:
        shapes = ", ".join("x".join(map(str, t.shape)) for t in record.inputs)
        print(f"  {record.op:36s} in-model {in_model * 1e3:7.3f}  alone "
              f"{(in_model - gap) * 1e3:7.3f}  {record.module[-36:]:36s} {shapes[:60]}")


if __name__ == "__main__":
    if len(sys.argv) < 6:
        sys.exit(__doc__.split("\n\n")[1])
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]),
         [float(x) for x in (sys.argv[6] if len(sys.argv) > 6 else "1").split(",")],
         int(sys.argv[7]) if len(sys.argv) > 7 else 8)
