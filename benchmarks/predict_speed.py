"""How fast hwlat answers: capture + predict of one model warm, and a NAS-style batch of variants.

Usage: python benchmarks/predict_speed.py DB DEVICE [N]
Prints the warm capture+predict time of resnet50 (median of 5) and the throughput of
`Predictor.predict_many` over N mobilenet_v2 variants (width multiplier x resolution).
"""

from __future__ import annotations

import statistics
import sys
import time

import torchvision

from kernels_db.store import KernelDB
from predictor.e2e import Predictor
from profilers.capture import CapturedModel, capture
from profilers.specs import InputSpec


def variants(n: int) -> list[CapturedModel]:
    out = []
    for i in range(n):
        width = 0.5 + (i % 10) * 0.1
        res = 160 + 16 * ((i // 10) % 5)
        model = torchvision.models.mobilenet_v2(width_mult=width)
        spec = InputSpec((1, 3, res, res))
        t = time.perf_counter()
        ops = capture(model.eval(), [spec])
        out.append(CapturedModel(f"mobilenet_v2(width_mult={width:.1f})", "mobilenet_v2",
                                 [spec], ops, "cpu", time.perf_counter() - t))
    return out


def main() -> None:
    db_path, device = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    with KernelDB.open(db_path, readonly=True) as db:
        predictor = Predictor.for_device(db, device)
    predictor.predict_spec("torchvision:resnet50")  # warm: imports, model load
    times = []
    for _ in range(5):
        t = time.perf_counter()
        predictor.predict_spec("torchvision:resnet50")
        times.append(time.perf_counter() - t)
    print(f"resnet50 capture+predict warm: median {statistics.median(times) * 1e3:.0f} ms")
    t = time.perf_counter()
    models = variants(n)
    built = time.perf_counter() - t
    t = time.perf_counter()
    predictions = predictor.predict_many(models)
    predicted = time.perf_counter() - t
    total = built + predicted
    print(f"{n} mobilenet_v2 variants: build+capture {built:.1f} s, predict {predicted:.2f} s, "
          f"{n / total * 60:.0f} models/min end to end "
          f"(p50 range {min(p.p50_ms for p in predictions):.1f}-"
          f"{max(p.p50_ms for p in predictions):.1f} ms)")


if __name__ == "__main__":
    main()
