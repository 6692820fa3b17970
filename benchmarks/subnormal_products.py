"""A model's slow path for subnormals, measured against what `count_uses` prices, at 1 thread.

    python benchmarks/subnormal_products.py SPEC INPUT [SEEDS]

Times `profilers.subnormals.measure_cost` once, then for each seed (default 3; a random-weight
model underflows differently with each) builds SPEC, counts its uses in one forward pass, and
times it plain and with `torch.set_flush_denormal(True)` (set in this thread, which at 1 thread
computes everything): the difference is the slow path, beside its price per family.

On the 2-vCPU Intel Xeon (2026-12-06), hf:mobilevit at 1x3x256x256, seeds 0-2: slow path 1174,
1089 and 1230 ms; priced 0.60-0.69x of it when a matrix product's uses were only its subnormal
operands' multiply-adds, 0.78-0.87x once the products of normal values that underflow count too
(matmul uses 1.18-1.34e8 -> 1.88-2.12e8), at `measure_cost`'s 2.90 ns. Minutes later, the machine
slower (its cost 3.78 ns, mobilevit flushed 95-99 ms against 76-78), seeds 0-1 were priced 1.03x
and 1.10x: the price follows the cost probe's state, which the model's slow path follows less.
With 1x1 convolutions priced per vector of 16 channels holding a subnormal (their conv uses
+11%), three builds at 09:10 (cost 3.33 ns): 0.97x, 1.07x and 1.03x.
"""

from __future__ import annotations

import sys

import torch

from profilers import subnormals
from profilers.modelbench import flushed_denormals, prepare
from profilers.timer import measure, thread_count


def _median_ms(fn, runs: int) -> float:
    return measure(fn, warmup=1, min_reps=runs, max_reps=runs, min_reps_under_cap=runs).median_s * 1e3


def main(argv: list[str]) -> None:
    spec, shape = argv[0], argv[1]
    seeds = range(int(argv[2]) if len(argv) > 2 else 3)
    with thread_count(1), torch.inference_mode():
        cost = subnormals.measure_cost(threads=1)
        print(f"measure_cost: {cost['reuse_ns']} ns per use in a product, {cost['block_ns']} ns "
              "per block elsewhere")
        for seed in seeds:
            torch.manual_seed(seed)
            model, args = prepare(spec, [shape])
            uses = subnormals.count_uses(model, args)
            plain = _median_ms(lambda m=model, a=args: m(*a), 5)
            with flushed_denormals():
                flushed = _median_ms(lambda m=model, a=args: m(*a), 7)
            slow = plain - flushed
            priced = {f: s * 1e3 for f, s in subnormals.price(uses, cost).items()}
            total = sum(priced.values())
            families = ", ".join(f"{f} {ms:.1f}" for f, ms in sorted(priced.items(),
                                                                     key=lambda kv: -kv[1]))
            print(f"seed {seed}: plain {plain:.1f} ms, flushed {flushed:.1f}: slow path "
                  f"{slow:.1f} ms, priced {total:.1f} ({total / slow:.2f}x; {families})",
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
