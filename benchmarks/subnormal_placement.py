"""Whether the slow path of subnormal values splits evenly over threads: it depends on where the
values lie, not on the op's size.

    python benchmarks/subnormal_placement.py [THREADS,...]

Times swin_t's stage-1 attention matmul at 224 px (`torch.bmm` of 192x49x49 by 192x49x32 per
image: 64 windows x 3 heads) with 40% of the probabilities subnormal in 15 of the 64 windows,
either the last row and column of windows (where swin's shifted-window mask puts them) or 15
windows drawn at random, against none. Prints the extra time per reuse of a subnormal input
(`profilers.subnormals.measure_cost` spreads them evenly: 1.15 ns at 2 threads on the Xeon).

On the 2-vCPU Intel Xeon (2026-12-06; two runs at 1 thread, four at 2): 2.31-2.82 ns at 1 thread
however placed. At 2 threads and batch 1, where the busiest half of the bmm's windows holds 11 or
12 of the 15, 1.70-2.11 ns; at batch 8, where the images split 4 and 4, 1.19-1.37. Batch 1 cost
1.43-1.67x batch 8 in each run; the busiest half's share predicts 1.47x (11 of 15) to 1.6x (12).
"""

from __future__ import annotations

import functools
import sys

import torch

from profilers.subnormals import _median_s, _subnormal
from profilers.timer import thread_count

WINDOWS, HEADS, TOKENS, HEAD_DIM, GRID = 64, 3, 49, 32, 8
SHARE = 0.4  # of the probabilities in a window holding subnormals


def _windows(border: bool, gen: torch.Generator) -> torch.Tensor:
    """The 15 windows of one image holding subnormals: swin's border ones, or drawn at random."""
    chosen = torch.zeros(WINDOWS, dtype=torch.bool)
    if border:
        chosen[[w for w in range(WINDOWS) if w // GRID == GRID - 1 or w % GRID == GRID - 1]] = True
    else:
        chosen[torch.randperm(WINDOWS, generator=gen)[:2 * GRID - 1]] = True
    return chosen


def _probabilities(images: int, chosen: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    p = torch.rand(images, WINDOWS, HEADS, TOKENS, TOKENS, generator=gen)
    pick = (torch.rand(p.shape, generator=gen) < SHARE) & chosen[None, :, None, None, None]
    return p.masked_fill(pick, 1e-40).reshape(-1, TOKENS, TOKENS).contiguous()


def _bmm_s(a: torch.Tensor, v: torch.Tensor) -> float:
    return _median_s(functools.partial(torch.bmm, a, v), 0.4)


def main(argv: list[str]) -> None:
    threads = [int(t) for t in argv[0].split(",")] if argv else [1, 2]
    gen = torch.Generator().manual_seed(0)
    for t in threads:
        with thread_count(t), torch.inference_mode():
            for images in (1, 8):
                v = torch.randn(images * WINDOWS * HEADS, TOKENS, HEAD_DIM, generator=gen)
                plain_s = _bmm_s(torch.rand(images * WINDOWS * HEADS, TOKENS, TOKENS,
                                            generator=gen), v)
                for border in (True, False):
                    chosen = _windows(border, gen)
                    p = _probabilities(images, chosen, gen)
                    extra = _bmm_s(p, v) - plain_s
                    reuses = int(_subnormal(p).sum()) * HEAD_DIM
                    where = "border windows" if border else "scattered windows"
                    later = int(chosen[WINDOWS // 2:].sum())
                    print(f"threads {t}  batch {images}  {where:17s} ({later:2d} of "
                          f"{int(chosen.sum())} in the second half)  {extra * 1e3:7.3f} ms extra"
                          f"  {extra / reuses * 1e9:5.2f} ns per reuse")


if __name__ == "__main__":
    main(sys.argv[1:])
