"""Does the pace probe see the machine's slow spells? Time models as the profile does, each in a
fresh process with the probe beside it (`profilers.pace`), and compare.

    python benchmarks/pace_probe.py [ROUNDS] [THREADS] [MODEL ...]

Each round times every MODEL (default: torchvision resnet18, mobilenet_v2 and squeezenet1_1 at
1x3x224x224) with `time_forward_isolated`, the profile's end-to-end timing. It then prints, per
model: the correlation of the median forward pass with the pace; the timings over `SLOW` times
the model's fastest (slow), how many of them the probe flagged (`pace.slow_ids` over all of this
run's timings, as the profile flags a device's), how many fast ones it flagged too; and the
90th percentile of the timings over the fastest, of all and of those it leaves unflagged.

On the 2-vCPU dev VM at 2 threads (30 rounds, an earlier script with the same probe; benchmarks/ACCURACY.md
and RESULTS.md, 2026-12-02 evening): r = 0.82, 0.83 and 0.70; of 45 slow timings 28
flagged, 3 fast ones flagged; 90th percentiles 1.38x/1.54x/1.65x for all, 1.13x/1.25x/1.37x for
those kept.
"""

from __future__ import annotations

import sys

import numpy as np

from profilers import pace
from profilers.modelbench import time_forward_isolated

SLOW = 1.15
MODELS = ("torchvision:resnet18", "torchvision:mobilenet_v2", "torchvision:squeezenet1_1")


def main(rounds: int = 30, threads: int = 2, models: tuple[str, ...] = MODELS) -> None:
    timed: list[tuple[str, float, float | None]] = []  # model, median s, pace s
    for r in range(rounds):
        for spec in models:
            m = time_forward_isolated(spec, ["1x3x224x224"], threads=threads, max_time_s=2.5)
            timed.append((spec, m.median_s, m.pace_s))
            print(f"round {r + 1}/{rounds} {spec}: {m.median_s * 1e3:.2f} ms, pace "
                  + (f"{m.pace_s * 1e3:.2f} ms" if m.pace_s else "unknown"), flush=True)
    flagged = pace.slow_ids({i: p for i, (_, _, p) in enumerate(timed)})
    usual = pace.usual_pace(p for _, _, p in timed)
    print(f"\nusual pace {usual * 1e3:.2f} ms; flagged at {pace.SLOW_PACE}x: {len(flagged)} of "
          f"{len(timed)}" if usual else "\ntoo few paces to flag any")
    for spec in models:
        ids = [i for i, t in enumerate(timed) if t[0] == spec and t[2] is not None]
        ms = np.array([timed[i][1] for i in ids])
        paces = np.array([timed[i][2] for i in ids])
        over = ms / ms.min()
        slow = over > SLOW
        hit = np.array([i in flagged for i in ids])
        kept = over[~hit] if (~hit).any() else over
        print(f"{spec}: r = {np.corrcoef(ms, paces)[0, 1]:.2f}; slow {slow.sum()} of {len(ids)}, "
              f"flagged {(slow & hit).sum()} of them and {(~slow & hit).sum()} others; "
              f"90th percentile over the fastest {np.percentile(over, 90):.2f}x all, "
              f"{np.percentile(kept, 90):.2f}x unflagged")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 30, int(args[1]) if len(args) > 1 else 2,
         tuple(args[2:]) or MODELS)
