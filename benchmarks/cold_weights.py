"""How much slower a linear layer runs with its weights evicted than with them cached, by rows.

    python benchmarks/cold_weights.py [THREADS] [ROWS,...]

Per weight shape and row count M: the median of 11 runs with the weights cached, interleaved with
11 right after a write of a buffer far beyond the LLC, and their ratio (the cached time in
brackets, ms). This is the evidence behind `fingerprint.BATCHED_ROWS` and the batched floor
(`Predictor._cold_rate`): inside a model the forward pass evicts a linear's weights, while the
database times it with only L2 flushed. On the Xeon of 12-06 the ratio peaked at M = 4-8 (1.7-2.0)
and fell to ~1.0 by M = 256 (benchmarks/RESULTS.md, 2026-12-06 evening). One process, nothing
else timing: ~35 s per thread count.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from profilers.fingerprint import _beyond_llc_bytes
from profilers.timer import CacheFlusher

SHAPES = ((768, 3072), (4096, 1000), (4096, 4096))  # (in, out): bert's MLP, a classifier, fc7
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def ratios(k: int, n: int, rows: tuple[int, ...], evict: CacheFlusher
           ) -> list[tuple[int, float, float]]:
    """(M, cold / cached, cached seconds) per row count."""
    lin = torch.nn.Linear(k, n).eval()
    out = []
    for m in rows:
        x = torch.randn(m, k)
        with torch.inference_mode():
            for _ in range(3):
                lin(x)
            warm, cold = [], []
            for _ in range(11):
                t = time.perf_counter()
                lin(x)
                warm.append(time.perf_counter() - t)
                evict()
                t = time.perf_counter()
                lin(x)
                cold.append(time.perf_counter() - t)
        w = statistics.median(warm)
        out.append((m, statistics.median(cold) / w, w))
    return out


def main(argv: list[str]) -> None:
    threads = int(argv[0]) if argv else 1
    rows = tuple(int(r) for r in argv[1].split(",")) if len(argv) > 1 else ROWS
    torch.set_num_threads(threads)
    evict = CacheFlusher(_beyond_llc_bytes("cpu"))
    for k, n in SHAPES:
        cells = " ".join(f"M{m}:{r:.2f}({w * 1e3:.2f})" for m, r, w in ratios(k, n, rows, evict))
        print(f"{threads} thread(s) {k}x{n} ({k * n * 4 / 1e6:.0f} MB): {cells}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
