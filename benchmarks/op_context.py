"""Would op timings taken after other kernels add up to a model better? Each model's aten calls
are recorded with their real tensors and replayed one by one, each timed three ways: after the
profile's cache flush only (how `hwlat profile` times an op), after seven tiny kernels of other
kinds and the flush (instruction cache, branch predictors and oneDNN's last primitive no longer
the op's own), and after seven larger ones and the flush. Per model: its whole time (the median
of four medians taken between the three passes) over each sum; then, over all models, the spread
of that ratio and the leave-one-model-out error of the two end-to-end fits it suggests (`a * sum`
and `a * sum + b * ops`, least squares on relative error, as `predictor.correction` fits).

    python benchmarks/op_context.py THREADS SPEC@INPUT [SPEC@INPUT ...]

One process, no other timing meanwhile: 1-2 minutes for 18 small torchvision models at 1 or 2
threads. At 2 threads the scrubbed timings fitted 4.9-6.6% leave-one-out against 8.7-9.7% for
flush-only ones with a per-op overhead, yet a 2-thread profile timed with the scrub predicted the
held-out zoo worse than one without, back to back: 14.0% against 9.1% MAPE (benchmarks/RESULTS.md,
2026-12-03 night).
Models whose forward calls ops through Python glue the replay cannot re-issue (a data-dependent
branch) still replay; only the aten calls are timed.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from profilers import allocator
from profilers.fingerprint import cpu_caches
from profilers.modelbench import prepare
from profilers.ops import lookup
from profilers.timer import CacheFlusher, flush_bytes


class _Record(TorchDispatchMode):
    """Every aten call of one forward pass, with the tensors it was called on."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def _median_s(fn, reps: int, before=None) -> float:
    samples = []
    for _ in range(reps):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _scrubs(flush: Callable[[], object]) -> dict[str, Callable[[], object]]:
    """What runs before each timed call, by variant name."""
    def kernels(c: int, hw: int) -> list:
        x, t = torch.randn(1, c, hw, hw), torch.randn(hw, c)
        dw, pw, fc = torch.randn(c, 1, 3, 3), torch.randn(c, c, 1, 1), torch.randn(c, c)
        return [lambda: torch.conv2d(x, dw, None, 1, 1, 1, c), lambda: torch.conv2d(x, pw),
                lambda: torch.nn.functional.linear(t, fc), lambda: torch.relu(x),
                lambda: x.mean((2, 3)), lambda: torch.softmax(t, -1),
                lambda: torch.layer_norm(t, (c,))]
    tiny, larger = kernels(8, 4), kernels(64, 28)
    return {"flush": flush,
            "7 tiny kernels + flush": lambda: ([k() for k in tiny], flush()),
            "7 larger kernels + flush": lambda: ([k() for k in larger], flush())}


def _loo(columns: np.ndarray, measured: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Leave-one-model-out MAPE and share within 10% of a relative least-squares fit, and the
    fit on all models."""
    errors = []
    for i in range(len(measured)):
        keep = np.arange(len(measured)) != i
        coef, *_ = np.linalg.lstsq(columns[keep] / measured[keep, None], np.ones(keep.sum()),
                                   rcond=None)
        errors.append(abs(columns[i] @ coef / measured[i] - 1))
    coef, *_ = np.linalg.lstsq(columns / measured[:, None], np.ones(len(measured)), rcond=None)
    return float(np.mean(errors)), float(np.mean(np.array(errors) < 0.1)), coef


def main(threads: int, settings: list[str]) -> None:
    torch.set_num_threads(threads)
    allocator.apply()
    flush = CacheFlusher(flush_bytes("cpu", threads, cpu_caches().get("l2")))
    scrubs = _scrubs(flush)
    wholes, counts, sums = [], [], {name: [] for name in scrubs}
    for setting in settings:
        spec, inp = setting.split("@")
        model, args = prepare(spec, [inp])
        with torch.inference_mode():
            for _ in range(3):
                model(*args)
            with _Record() as record:
                model(*args)
            calls = [(f, a, k) for f, a, k in record.calls if not _is_view(f)]
            replays = [lambda f=f, a=a, k=k: f(*a, **k) for f, a, k in calls]
            forward = functools.partial(model, *args)
            whole = [_median_s(forward, 11)]
            row = {}
            for name, before in scrubs.items():
                row[name] = sum(_median_s(fn, 11, before) for fn in replays)
                whole.append(_median_s(forward, 11))
        wholes.append(statistics.median(whole))
        counts.append(len(replays))
        for name, total in row.items():
            sums[name].append(total)
        print(f"{spec:34s} {inp:12s} {len(replays):4d} ops  whole {wholes[-1] * 1e3:8.2f} ms "
              f"({min(whole) * 1e3:.1f}-{max(whole) * 1e3:.1f})  whole/sum: "
              + "  ".join(f"{wholes[-1] / row[n]:.2f}" for n in scrubs), flush=True)
    measured, n_ops = np.array(wholes), np.array(counts, dtype=float)
    print(f"\nover {len(measured)} models at {threads} thread(s):")
    for name, values in sums.items():
        total = np.array(values)
        ratio = measured / total
        line = (f"  {name:26s} whole/sum mean {ratio.mean():.3f}, spread (CV) "
                f"{ratio.std() / ratio.mean() * 100:4.1f}%")
        for label, columns in (("a*sum", total[:, None]), ("a*sum+b*ops", np.c_[total, n_ops])):
            mape, within, coef = _loo(columns, measured)
            extra = f", {coef[1] * 1e6:.1f} us/op" if len(coef) > 1 else ""
            line += (f" | {label}: leave-one-out MAPE {mape * 100:4.1f}%, "
                     f"{within * 100:3.0f}% within 10% (a={coef[0]:.3f}{extra})")
        print(line)


def _is_view(func) -> bool:
    """Views and metadata calls, which `hwlat` never times (`profilers.ops`, free ops)."""
    info = lookup(f"aten.{func.__name__}")
    return info is not None and info.free


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("\n\n")[1])
    main(int(sys.argv[1]), sys.argv[2:])
