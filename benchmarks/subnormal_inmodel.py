"""What each matrix product reading subnormals pays for them inside a model, against its count.

    python benchmarks/subnormal_inmodel.py SPEC INPUT THREADS [PASSES]

Runs SPEC (its own weights, a random INPUT) PASSES times (default 7) under a dispatch mode that,
at each matrix product (`profilers.subnormals.PRODUCTS`) with a subnormal input, times the call
as it comes and once more with those subnormals zeroed (two warm-up pairs first), and prints
per op the median extra time, the uses `count_uses` counts (multiply-adds meeting a nonzero
partner) and the ns per use; then the device's cost as `measure_cost` times it in the same
minutes. A batched matmul's line also gives its busiest-thread factor at THREADS (`crowding`).

On the 2-vCPU Intel Xeon (2026-12-06; 02:27 in a one-off script of the same timing, 03:31 with
this one), swin_t at 1 thread: its five attention matmuls at 224 px paid 21.7 and 23.1 ms for
8.2M uses (2.65 and 2.81 ns); at 160 px the same bmms paid 10.0 and 11.0 ms for 3.75M (2.67 and
2.94 ns; stage 3's zero-padded values leave 0.37x the uses of 224 px, 1.6-1.8 ms against 4.1-4.9
each), its three padded output projections 94.6 and 94.5 ms for 35.8-36.3M (2.64 and 2.60 ns);
`measure_cost` gave 2.44-2.62. At 2 threads the linears paid 1.30-1.35 ns per use (probe
1.28-1.32) and the attention matmuls at 224 px 2.08-2.19 ns, 1.6-1.7x the probe, where the
busiest-thread factor is 1.43-1.48.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from profilers.modelbench import prepare
from profilers.subnormals import (
    PRODUCTS,
    _floats,
    _subnormal,
    crowding,
    measure_cost,
    product_uses,
)
from profilers.timer import thread_count


def _zeroed(a):
    if isinstance(a, torch.Tensor) and a.is_floating_point():
        return torch.where(_subnormal(a), torch.zeros((), dtype=a.dtype), a)
    return a


def _timed(func, args, kwargs) -> float:
    start = time.perf_counter()
    func(*args, **kwargs)
    return time.perf_counter() - start


class _PerProduct(TorchDispatchMode):
    """Times each subnormal-reading matrix product as it comes and with its subnormals zeroed."""

    def __init__(self, threads: int) -> None:
        super().__init__()
        self.threads, self.calls, self.seen = threads, {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        ins = [t for a in (*args, *kwargs.values()) for t in _floats(a)]
        if name not in PRODUCTS or not any(bool(_subnormal(t).any()) for t in ins):
            return func(*args, **kwargs)
        zeroed = [_zeroed(a) for a in args]
        for _ in range(2):
            _timed(func, args, kwargs), _timed(func, zeroed, kwargs)
        plain, clean = _timed(func, args, kwargs), _timed(func, zeroed, kwargs)
        per, batched = product_uses(name, args)
        per = per.flatten()
        factor = 1.0
        if batched and float(per.sum()):
            profile = tuple(per.tolist())
            factor = 1 + crowding(profile, 1, self.threads) / sum(profile)
        shape = tuple(args[PRODUCTS[name][0]].shape)
        call = self.calls.setdefault(self.seen, [name, shape, float(per.sum()), factor, [], []])
        call[4].append(plain)
        call[5].append(clean)
        self.seen += 1
        return func(*args, **kwargs)


def main(argv: list[str]) -> None:
    spec, shape, threads = argv[0], argv[1], int(argv[2])
    passes = int(argv[3]) if len(argv) > 3 else 7
    with thread_count(threads), torch.inference_mode():
        model, args = prepare(spec, [shape])
        mode = _PerProduct(threads)
        for _ in range(passes):
            mode.seen = 0
            with mode:
                model(*args)
        cost = measure_cost(threads=threads)
    total_ms = total_uses = 0.0
    for name, shape_a, uses, factor, plain, clean in mode.calls.values():
        extra_ms = (statistics.median(plain) - statistics.median(clean)) * 1e3
        total_ms, total_uses = total_ms + extra_ms, total_uses + uses
        busiest = f"  busiest-thread factor {factor:.2f}" if factor > 1 else ""
        print(f"{name:13s} {str(shape_a):22s} extra {extra_ms:7.3f} ms  uses {uses:9.3g}  "
              f"{extra_ms * 1e6 / uses if uses else float('nan'):5.2f} ns per use{busiest}")
    print(f"all: {total_ms:.2f} ms for {total_uses:.4g} uses "
          f"({total_ms * 1e6 / total_uses if total_uses else float('nan'):.2f} ns per use); "
          f"measure_cost at {threads} thread(s): {cost['reuse_ns']} ns per use")


if __name__ == "__main__":
    main(sys.argv[1:])
