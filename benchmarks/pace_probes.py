"""Which probe follows which model when the machine's speed changes: models and candidate probes
timed in turn for a while, each model's log time then fitted on each probe's log time.

    python benchmarks/pace_probes.py MINUTES [THREADS,...] > LOG.tsv
    python benchmarks/pace_probes.py --fit LOG.tsv

The first form times, round after round until MINUTES have passed, at each thread count: the
pace probe (`profilers.pace`: four dense 3x3 convolutions), a depthwise probe (four depthwise
3x3 convolutions at the shapes of a mobile network's stages), a stream probe (adding two 64 MiB
tensors: DRAM bandwidth), the chain probe (`profilers.pace.chain_probe`: eight
depthwise-and-pointwise blocks on 1x16x28x28, 40 small ops one after another: what a mobile
network does between and around its kernels; every end-to-end timing times it since 24c9e09)
and six held-out-zoo models, each the median of a few runs, and writes a tab-separated line per
timing. The second prints, per model and thread count, the slope and
correlation of its log time on each probe's, and which probe explains it best.

Why (benchmarks/RESULTS.md, 2026-12-06 early morning): in a slow spell the pace probe ran 1.41x
its time of the night before at 2 threads while the held-out models ran 1.31-1.45x (alexnet,
resnet34, wide_resnet50) to 1.65-1.86x (mnasnet, regnet_x_800mf, efficientnet_v2_s), so one
pace factor for all models under-predicted the depthwise ones by 20-30%. Their ops alone had
slowed only 1.16x: the loss was between and around the kernels, which the chain probe imitates.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections import defaultdict

import torch

from profilers import pace
from profilers.modelbench import prepare
from profilers.timer import thread_count

MODELS = (("torchvision:mnasnet0_5", "1x3x224x224"), ("torchvision:regnet_x_800mf", "1x3x160x160"),
          ("torchvision:efficientnet_v2_s", "1x3x160x160"), ("torchvision:alexnet", "8x3x160x160"),
          ("torchvision:resnet34", "8x3x160x160"), ("torchvision:googlenet", "8x3x224x224"))
DEPTHWISE = ((96, 56), (144, 28), (240, 14), (480, 7))  # channels, height and width; batch 1
RUNS = 5


def _median_s(fn, runs: int = RUNS) -> float:
    fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _probes() -> dict:
    gen = torch.Generator().manual_seed(0)
    depthwise = [(torch.nn.Conv2d(c, c, 3, padding=1, groups=c).eval(),
                  torch.randn(1, c, s, s, generator=gen)) for c, s in DEPTHWISE]
    a, b = (torch.randn(16 * 2**20, generator=gen) for _ in range(2))  # 64 MiB each

    def dw() -> None:
        for conv, x in depthwise:
            conv(x)

    return {"pace": pace.probe(), "depthwise": lambda: _median_s(dw, 10),
            "stream": lambda: _median_s(lambda: torch.add(a, b), 5),
            "chain": pace.chain_probe()}


def record(minutes: float, threads: list[int]) -> None:
    built = {}
    for t in threads:
        with thread_count(t):
            built[t] = (_probes(), [(spec, prepare(spec, [shape])) for spec, shape in MODELS])
    end = time.time() + minutes * 60
    n = 0
    with torch.inference_mode():
        while time.time() < end:
            for t in threads:
                probes, models = built[t]
                with thread_count(t):
                    for name, run in probes.items():
                        print(f"{n}\t{time.time():.1f}\t{t}\t{name}\t{run() * 1e3:.4f}", flush=True)
                    for spec, (model, args) in models:
                        ms = _median_s(lambda m=model, a=args: m(*a)) * 1e3
                        print(f"{n}\t{time.time():.1f}\t{t}\t{spec}\t{ms:.4f}", flush=True)
            n += 1


def fit(path: str) -> None:
    rounds: dict = defaultdict(dict)  # (round, threads) -> name -> ms
    for line in open(path):
        n, _, t, name, ms = line.rstrip("\n").split("\t")
        rounds[(int(n), int(t))][name] = math.log(float(ms))
    for t in sorted({t for _, t in rounds}):
        rows = [v for (_, tt), v in sorted(rounds.items()) if tt == t and "chain" in v]
        probes = ("pace", "depthwise", "stream", "chain")
        spread = {p: math.exp(max(r[p] for r in rows) - min(r[p] for r in rows)) for p in probes}
        print(f"{t} thread(s), {len(rows)} rounds; max/min of each probe: "
              + ", ".join(f"{p} {s:.2f}x" for p, s in spread.items()))
        for spec, _ in MODELS:
            ys = [r[spec] for r in rows if spec in r]
            line = []
            for p in probes:
                xs = [r[p] for r in rows if spec in r]
                mx, my = statistics.mean(xs), statistics.mean(ys)
                sxx = sum((x - mx) ** 2 for x in xs)
                sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
                syy = sum((y - my) ** 2 for y in ys)
                slope = sxy / sxx if sxx else float("nan")
                corr = sxy / math.sqrt(sxx * syy) if sxx and syy else float("nan")
                line.append(f"{p} slope {slope:5.2f} r {corr:5.2f}")
            spread_y = math.exp(max(ys) - min(ys))
            print(f"  {spec:32s} {spread_y:4.2f}x  " + "  ".join(line))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fit"]:
        fit(sys.argv[2])
    else:
        record(float(sys.argv[1]),
               [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2, 1])
