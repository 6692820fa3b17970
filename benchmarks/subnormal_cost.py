"""What a subnormal value costs this CPU, op by op, and how well `profilers.subnormals` prices
the slow path of a whole model.

    python benchmarks/subnormal_cost.py [THREADS] [SPEC INPUT ...]

First, each op of the table below timed alone (median of 15) with 1%, 10% and 50% of its input
subnormal against none: the extra time per reuse of a subnormal input (the matmul families) and
per 16-value block holding one, read or written (the others). Then, for each SPEC INPUT pair, the
model's ops timed inside it (median of 7 passes under a dispatch mode) with and without
`torch.set_flush_denormal(True)`: the extra time per op kind against the price `count_uses` and
`measure_cost` give it (at 1 thread only: at more, flushing does not reach the OpenMP workers
already started). One process, nothing else timing meanwhile; about 10 s per model.

On the Intel Xeon of 2026-12-05 (1 thread): linear, bmm and 3x3 conv 2.1-2.9 ns per reuse at
every share; a 1x1 conv 34 ns at 1%, 4.5 at 50% (per vector); add, mul, silu and gelu 12-136 ns per
block, less as the share grows; softmax and layer norm nearly nothing for subnormal inputs. swin_t
at 1x3x160x160: its linear layers paid 86.3 ms for 35.7M reuses (2.4 ns), its attention matmuls
11.0 ms for 7.3M (1.5 ns), its softmax 3.0 ms writing them; hf:mobilevit at 1x3x256x256: linear
430 ms (4.0 ns: their outputs underflow too), conv 318 ms (2.6 ns), silu 19 ms.
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.nn.functional as F
from inmodel_vs_isolated import _TimeEachOp

from profilers import allocator
from profilers.modelbench import prepare
from profilers.subnormals import (
    _blocks,
    _Counter,
    _subnormal,
    _with_subnormals,
    measure_cost,
    price,
)
from profilers.timer import measure


def _median(fn) -> float:
    """The median of 15 timings after 3 warm-up runs (`profilers.timer.measure`)."""
    return measure(fn, warmup=3, min_reps=15, max_reps=15).median_s


W = torch.randn(384, 384) * 0.05
V = torch.randn(4, 49, 32)
W1 = torch.randn(64, 64, 1, 1) * 0.1
W3 = torch.randn(64, 64, 3, 3) * 0.05
# name: (op, input shape, reuse of an input value; None: priced per block)
OPS = {
    "linear 196x384 by 384x384": (lambda a: F.linear(a, W), (196, 384), 384),
    "bmm 4x49x49 by 4x49x32": (lambda a: torch.bmm(a, V), (4, 49, 49), 32),
    "conv 1x1 64->64 at 28x28": (lambda a: F.conv2d(a, W1), (1, 64, 28, 28), 64),
    "conv 3x3 64->64 at 28x28": (lambda a: F.conv2d(a, W3, padding=1), (1, 64, 28, 28), 576),
    "add": (lambda a: a + 1.0, (1, 64, 56, 56), None),
    "mul": (lambda a: a * 1.5, (1, 64, 56, 56), None),
    "silu": (F.silu, (1, 64, 56, 56), None),
    "gelu": (F.gelu, (1, 64, 56, 56), None),
    "softmax": (lambda a: torch.softmax(a, -1), (4, 12, 49, 49), None),
    "layer norm": (lambda a: F.layer_norm(a, (384,)), (196, 384), None),
}


def op_table() -> None:
    gen = torch.Generator().manual_seed(0)
    print(f"{'op':28s} {'share':>6s} {'x normal':>9s} {'ns per use':>11s}")
    for name, (fn, shape, reuse) in OPS.items():
        plain = _with_subnormals(shape, 0.0, gen)
        base = _median(lambda: fn(plain))  # noqa: B023
        for share in (0.01, 0.1, 0.5):
            x = _with_subnormals(shape, share, gen)
            t = _median(lambda: fn(x))  # noqa: B023
            uses = (int(_subnormal(x).sum()) * reuse if reuse
                    else _blocks(_subnormal(x)) + _blocks(_subnormal(fn(x))))
            print(f"{name:28s} {share:6.2f} {t / base:9.1f} {(t - base) / uses * 1e9:11.2f}")


def in_model(spec: str, inp: str, cost: dict) -> None:
    model, args = prepare(spec, [inp])

    def per_op() -> list[float]:
        runs = []
        for _ in range(7):
            with _TimeEachOp() as mode:
                model(*args)
            runs.append(mode.seconds)
        return [statistics.median(x) for x in zip(*runs, strict=True)]

    with torch.inference_mode():
        for _ in range(3):
            model(*args)
        plain = per_op()
        torch.set_flush_denormal(True)
        try:
            flushed = per_op()
        finally:
            torch.set_flush_denormal(False)
    # the same ops once more, each counted and priced on its own
    from torch.utils._python_dispatch import TorchDispatchMode

    priced: list[tuple[str, float]] = []

    class Each(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            out = func(*a, **(kw or {}))
            one = _Counter()
            one.record(func, a, kw or {}, out)
            priced.append((str(func), sum(price(one.uses, cost).values())))
            return out

    with torch.inference_mode(), Each():
        model(*args)
    by_op: dict[str, list[float]] = {}
    for (op, p), t, f in zip(priced, plain, flushed, strict=True):
        row = by_op.setdefault(op, [0.0, 0.0])
        row[0] += t - f
        row[1] += p
    print(f"\n{spec} {inp}: the ops took {sum(plain) * 1e3:.1f} ms inside it, "
          f"{sum(flushed) * 1e3:.1f} flushed; slow path {sum(r[0] for r in by_op.values()) * 1e3:.1f}"
          f" ms, priced {sum(r[1] for r in by_op.values()) * 1e3:.1f}")
    for op, (extra, p) in sorted(by_op.items(), key=lambda kv: -abs(kv[1][0]))[:8]:
        print(f"  {op:36s} slow path {extra * 1e3:8.2f} ms  priced {p * 1e3:8.2f} ms")


def main(argv: list[str]) -> None:
    threads = int(argv[0]) if argv else 1
    torch.set_num_threads(threads)
    allocator.apply()
    with torch.inference_mode():
        op_table()
    cost = measure_cost(threads)
    print(f"\nmeasure_cost: {cost}")
    if threads > 1 and argv[1:]:
        # torch.set_flush_denormal reaches OpenMP workers started after it only
        # (profilers.modelbench.time_forward): the flushed pass would still run their slow path
        sys.exit("the in-model comparison needs 1 thread: at more, flushing subnormals does not "
                 "reach the OpenMP workers already started")
    for spec, inp in zip(argv[1::2], argv[2::2], strict=True):
        in_model(spec, inp, cost)


if __name__ == "__main__":
    main(sys.argv[1:])
