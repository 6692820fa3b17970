"""Is this machine bimodal? Time a small and a large op, and a small model, over a few minutes.

    python benchmarks/machine_states.py [SECONDS] [THREADS] [MODEL]

Every ~0.07 s it times, in this one process: a 1x1 conv on 1x64x28x28 (small: its time is mostly
the cost of starting and joining the intra-op threads), a 384x384 matmul (large: compute), and
MODEL's forward pass (default torchvision:mnasnet0_5, 150 small ops). It prints a line per tick
and then the share of ticks in which the small conv ran more than 15% over its fastest tenth, and
how long such spells lasted.

On the 2-vCPU dev VM at 2 threads this found two states that switch every few seconds to minutes:
the small conv took 55 us or 72 us, mnasnet0_5 4.0 ms or 6.0 ms, while the matmul stayed within
3%. Over 300 s one afternoon 81% of 4458 ticks were slow (mnasnet0_5 5.83 ms against 3.98 ms in
the fast ticks), in 12 spells of a median 6.5 s and up to 63 s; in other minutes 10% were. At 1
thread the small conv did not move. OMP_PROC_BIND=true did not keep the fast state;
OMP_WAIT_POLICY=ACTIVE made every tick slow, PASSIVE took mnasnet0_5 to 16 ms. That is the scale
of what a 2-thread profile and a later evaluation disagree on for models of small ops (benchmarks/ACCURACY.md:
the re-measurement column).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from profilers import allocator
from profilers.specs import load_model

SLOW = 1.15  # a tick is slow when the small conv takes this much more than its fastest tenth


def _median_us(fn, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(seconds: float = 120.0, threads: int = 2, spec: str = "torchvision:mnasnet0_5") -> None:
    allocator.apply()
    torch.set_num_threads(threads)
    loaded = load_model(spec)
    inputs = loaded.make_inputs()
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    x, w = torch.randn(1, 64, 28, 28), torch.randn(64, 64, 1, 1)
    ticks = []
    start = time.monotonic()
    with torch.inference_mode():
        for _ in range(5):
            loaded.model(*inputs)
        while time.monotonic() - start < seconds:
            small = _median_us(lambda: torch.conv2d(x, w), 50)
            large = _median_us(lambda: a @ b, 15)
            model = _median_us(lambda: loaded.model(*inputs), 10) / 1e3
            t = time.monotonic() - start
            ticks.append((t, small, large, model))
            print(f"{t:7.1f} s  small conv {small:6.1f} us  matmul {large:6.1f} us  "
                  f"{spec} {model:7.2f} ms", flush=True)
    if not ticks:
        print("no ticks: give it some seconds")
        return
    fast = sorted(s for _, s, _, _ in ticks)[max(0, len(ticks) // 10 - 1)]
    slow = [s > SLOW * fast for _, s, _, _ in ticks]
    spells, run = [], 0.0
    for i, is_slow in enumerate(slow):
        if is_slow:
            run += ticks[i][0] - (ticks[i - 1][0] if i else 0.0)
        elif run:
            spells.append(run)
            run = 0.0
    if run:
        spells.append(run)
    by_state = {state: [m for (_, _, _, m), s in zip(ticks, slow, strict=True) if s == state]
                for state in (False, True)}
    print(f"\n{len(ticks)} ticks at {threads} threads: {100 * sum(slow) / len(ticks):.0f}% slow "
          f"(small conv > {SLOW:.2f} x {fast:.1f} us)")
    for state, models in by_state.items():
        if models:
            label = "slow" if state else "fast"
            print(f"  {label}: {spec} median {statistics.median(models):.2f} ms over "
                  f"{len(models)} ticks")
    if spells:
        print(f"  slow spells: {len(spells)}, median {statistics.median(spells):.1f} s, "
              f"longest {max(spells):.1f} s")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(float(args[0]) if args else 120.0, int(args[1]) if len(args) > 1 else 2,
         args[2] if len(args) > 2 else "torchvision:mnasnet0_5")
