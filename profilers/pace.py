"""How fast the machine runs at the moment of a timing: a fixed probe timed beside it.

A VM's speed changes with no process of its own busy, which CPU accounting
(`profilers.contention`) cannot see: the hypervisor moves its vCPUs between host cores, or onto
the two hyperthreads of one. On the 2-vCPU dev VM at 2 threads, the 1-second medians of four
3x3 convolutions ran 5.0 ms in one second and 7.8 ms a few seconds later, with both CPUs busy
only with them and no steal; a profile's first end-to-end pass ran 1.2-1.9x slow for ~100 s, and
the correction fitted on it over-predicted the held-out zoo by a median 29% (benchmarks/
RESULTS.md, 2026-12-02). At 1 thread the probe's median in ten fresh processes was 8.4-10.8 ms
(at 2 threads 4.8-9.5 ms).

So each end-to-end timing times this probe just before and just after the model (`probe`): the
faster of the two is the machine's pace then, and a timing whose pace is `SLOW_PACE` times the
device's usual one (`PACE_QUANTILE` of its timings' paces) counts as taken in a slow spell
(`slow_ids`), like one taken beside other work: left out where its setting has another, and
timed again with the settings not timed yet. Measured on the dev VM at 2 threads (resnet18, mobilenet_v2 and
squeezenet1_1 at 1x3x224x224, 30 fresh processes each, in one run): the pace correlated with the
model's median at r = 0.82, 0.83 and 0.70; of the 45 timings over 1.15x their model's fastest it
flagged 28, and 3 others; the timings kept were at most 1.13x, 1.25x and 1.37x their fastest at
the 90th percentile, against 1.38x, 1.54x and 1.65x for all.

Beside it each timing also times a chain probe (`chain_probe`): small ops one after another, the
shape of a mobile network, whose time goes more to the framework and the caches between and
around kernels than to the kernels. In a slow spell the two probes' models parted: dense models
slowed as the convolutions did, depthwise ones half as much again (`predictor.evaluate`'s pace
anchor uses both).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Iterable, Mapping

import numpy as np

PROBE_CONVS = ((32, 56), (64, 28), (128, 14), (256, 7))
"""3x3 convolutions (channels in and out, height and width, batch 1) that make up the probe: the
shapes a CNN's stages run, ~5 ms at 2 threads on the dev VM. One convolution alone was no use:
in fresh processes its median varied 1.8x, each steady within itself (where its buffers land)."""
PROBE_WARMUP = 3  # in the process's first probe only: then it is warm
PROBE_RUNS = 10
WINDOW_PROBE_RUNS = 3
"""Passes of the probe between two metering windows of op timings (`kernels_db.build._Metered`):
8.4 ms at 1 thread and 5.7 at 2 on the Xeon of 12-06 (with its one warm-up pass; median of 30),
against windows of a quarter second or more: at most 3.4% of a profile's op timing."""
SLOW_PACE = 1.2  # a pace this many times the usual marks a slow spell
PACE_QUANTILE = 25  # the usual pace: this percentile of the device's timings' paces
MIN_PACES = 5  # fewer paces than this give no usual pace, and no timing is flagged
CHAIN_BLOCKS, CHAIN_CHANNELS, CHAIN_SIZE = 8, 16, 28  # the chain probe (`chain_probe`)
CHAIN_OPS = 5 * CHAIN_BLOCKS  # its ops (aten calls) per pass


def probe(runs: int = PROBE_RUNS) -> Callable[[], float]:
    """A function that times the probe once more and returns its median seconds (CPU, in this
    process, at torch's current thread count) over `runs` passes."""
    import torch

    gen = torch.Generator().manual_seed(0)
    convs = [(torch.nn.Conv2d(c, c, 3, padding=1).eval(),
              torch.randn(1, c, s, s, generator=gen)) for c, s in PROBE_CONVS]

    def once() -> None:
        with torch.inference_mode():
            for conv, x in convs:
                conv(x)

    return _timed(once, runs)


def chain_probe() -> Callable[[], float]:
    """Like `probe`, for the chain probe: `CHAIN_BLOCKS` depthwise-and-pointwise blocks, each a
    depthwise 3x3 convolution, batch norm, ReLU6, a 1x1 convolution and batch norm, on
    1x`CHAIN_CHANNELS`x`CHAIN_SIZE`x`CHAIN_SIZE`: `CHAIN_OPS` small ops one after another, which
    cost what the framework and the caches do between and around kernels more than the kernels."""
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(0)
    c = CHAIN_CHANNELS
    chain = nn.Sequential(*(m for _ in range(CHAIN_BLOCKS) for m in (
        nn.Conv2d(c, c, 3, padding=1, groups=c), nn.BatchNorm2d(c), nn.ReLU6(),
        nn.Conv2d(c, c, 1), nn.BatchNorm2d(c)))).eval()
    x = torch.randn(1, c, CHAIN_SIZE, CHAIN_SIZE, generator=gen)

    def once() -> None:
        with torch.inference_mode():
            chain(x)

    return _timed(once, PROBE_RUNS)


def _timed(once: Callable[[], None], runs: int) -> Callable[[], float]:
    """A function that runs `once` `runs` times (after `PROBE_WARMUP` runs the first time, one
    after that) and returns the median seconds."""
    warm = [PROBE_WARMUP]

    def run() -> float:
        for _ in range(warm[0]):
            once()
        warm[0] = 1  # one warm-up run after the model: its ops evicted the probe's
        samples = []
        for _ in range(runs):
            t = time.perf_counter()
            once()
            samples.append(time.perf_counter() - t)
        return statistics.median(samples)

    return run


def usual_pace(paces: Iterable[float | None]) -> float | None:
    """The device's usual pace: `PACE_QUANTILE` of the known paces (None with fewer than
    `MIN_PACES`)."""
    known = [p for p in paces if p is not None and p > 0]
    return float(np.percentile(known, PACE_QUANTILE)) if len(known) >= MIN_PACES else None


def slow_ids(paces: Mapping[Hashable, float | None]) -> set:
    """Of timings by id (a database id, or an evaluation's (model, round)) with their pace (None:
    not probed), those taken in a slow spell: their pace at least `SLOW_PACE` times the usual one
    of all of them."""
    usual = usual_pace(paces.values())
    if usual is None:
        return set()
    return {i for i, p in paces.items() if p is not None and p >= SLOW_PACE * usual}
