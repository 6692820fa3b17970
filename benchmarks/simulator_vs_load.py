"""Simulated vs measured queue p99 for resnet18 on this machine (issue item 6).

For each (rate, batching window): a real load test (profilers.loadtest.run_load, the engine of
`hwlat bench --rate`) and the advisor's simulator on the same Poisson arrivals (same seed), fed
with (a) the predictor's latency-vs-batch curve, (b) a batch curve measured beforehand with the
bench harness (noise = measured batch-1 spread): two interleaved passes over the batch sizes,
the mean of both per size, so that one disturbed pass does not skew the curve (a single pass
once measured batch 4 at 110 ms where the server's own batches of 4 took 92 ms).
"""
import json
import statistics
import sys
import time

import torch

from advisor.simulator import BatchCurve, simulate
from kernels_db.store import KernelDB
from predictor.e2e import Predictor
from profilers import allocator
from profilers.capture import capture
from profilers.loadtest import model_batch_runner, poisson_arrivals, run_load
from profilers.modelbench import bench_model
from profilers.specs import load_model

DB, DEVICE = sys.argv[1], sys.argv[2]
REQUESTS = int(sys.argv[3]) if len(sys.argv) > 3 else 2000  # p99 needs >= 473 to exist at all
THREADS, MAX_BATCH = 1, 4
allocator.apply()  # as the CLI does: time under hwlat's allocator policy from the start
torch.set_num_threads(THREADS)
loaded = load_model("torchvision:resnet18")
model = loaded.model
def make(n): return torch.randn(n, 3, 224, 224)

# (a) predicted curve
with KernelDB.open(DB, readonly=True) as db:
    pred = Predictor.for_device(db, DEVICE)
    predicted = {b: pred.predict_ops(capture(model, [loaded.inputs[0].with_batch(b)])).p50_ms / 1e3
                 for b in range(1, MAX_BATCH + 1)}
# (b) measured curve
passes, noise = {b: [] for b in range(1, MAX_BATCH + 1)}, ()
for _ in range(2):
    for b in range(1, MAX_BATCH + 1):
        x = make(b)
        r = bench_model(model, lambda x=x: x, runs=40, warmup=3, threads=THREADS)
        s = r.stages["forward"]
        passes[b].append(s.p50)
        if b == 1 and not noise:
            noise = tuple(v / s.p50 for v in s.samples_s)
measured = {b: statistics.mean(v) for b, v in passes.items()}
print("curve ms predicted", {b: round(v * 1e3, 2) for b, v in predicted.items()})
print("curve ms measured ", {b: round(v * 1e3, 2) for b, v in measured.items()})
service = measured[1]
rows = []
for util in (0.45, 0.75):
    rate = round(util / service, 1)
    for wait_ms in (2.0, 10.0):
        arrivals = poisson_arrivals(rate, REQUESTS / rate, seed=7)
        runner = model_batch_runner(model, make)
        runner(1)
        t = time.time()
        real = run_load(runner, arrivals, workers=1, max_batch=MAX_BATCH, max_wait_s=wait_ms / 1e3)
        took = time.time() - t
        row = {"rate": rate, "max_batch": MAX_BATCH, "wait_ms": wait_ms, "n": real.queue.n,
               "measured_queue_p99": real.queue.p99 * 1e3,
               "measured_total_p99": real.total.p99 * 1e3,
               "measured_mean_batch": real.mean_batch_size,
               "p99_supported": real.queue.supported(0.99)}
        for name, curve in (("predicted", BatchCurve(predicted, noise)),
                            ("measured", BatchCurve(measured, noise))):
            sim = simulate(curve, arrivals, workers=1, max_batch=MAX_BATCH,
                           max_wait_s=wait_ms / 1e3, seed=7)
            row[f"sim_{name}_queue_p99"] = sim.queue.p99 * 1e3
            row[f"sim_{name}_total_p99"] = sim.total.p99 * 1e3
            row[f"err_{name}_queue_p99"] = sim.queue.p99 / real.queue.p99 - 1
        rows.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}),
              f"({took:.0f} s)", flush=True)
print(json.dumps({"predicted_curve_ms": predicted, "measured_curve_ms": measured}))
