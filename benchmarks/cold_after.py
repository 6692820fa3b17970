"""How much slower an op runs after the core did something else for a while: the same conv timed
straight after itself, and after 1, 5 or 17 ms of other work (small matmuls, pure Python, an
in-place add on 16 KB, another conv) or of sleep. The profile times each op back to back after an
L2-sized flush; inside a model an op's weights were last used a whole forward pass ago.

    python benchmarks/cold_after.py [THREADS] [REPEATS]

On 12-05's Xeon (12-07 morning, 1 thread) the 1152x192 1x1 conv of efficientnet_b1 on 1x192x7x7
took 0.25 ms straight after itself and 0.41 ms after 17 ms of pure Python, which touches almost
no memory: the penalty grows with the time away, not with the bytes this process moved
(benchmarks/RESULTS.md, 2026-12-07 morning).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from profilers import allocator


def _spin(seconds: float, work):
    def run() -> None:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            work()
    return run


def main(threads: int, repeats: int) -> None:
    allocator.apply()  # as hwlat times
    torch.set_num_threads(threads)
    small, vec = torch.randn(64, 64), torch.randn(4096)
    conv, x = torch.nn.Conv2d(192, 1152, 1, bias=False), torch.randn(1, 192, 7, 7)
    other, y = torch.nn.Conv2d(24, 24, 3, padding=1, bias=False), torch.randn(1, 24, 80, 80)
    works = {"matmul": lambda: small @ small, "python": lambda: sum(range(50)),
             "add": lambda: vec.add_(1), "other conv": lambda: other(y)}
    befores = [("nothing", lambda: None)]
    for ms in (1, 5, 17):
        befores += [(f"{name} {ms} ms", _spin(ms / 1e3, work)) for name, work in works.items()]
        befores.append((f"sleep {ms} ms", lambda ms=ms: time.sleep(ms / 1e3)))
    with torch.inference_mode():
        for _ in range(5):
            conv(x)
        print(f"1152x192 1x1 conv on 1x192x7x7, {threads} thread(s), median of {repeats}:")
        for label, before in befores:
            times = []
            for _ in range(repeats):
                before()
                start = time.perf_counter()
                conv(x)
                times.append(time.perf_counter() - start)
            print(f"  after {label:18s} {statistics.median(times) * 1e3:7.3f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1,
         int(sys.argv[2]) if len(sys.argv) > 2 else 21)
