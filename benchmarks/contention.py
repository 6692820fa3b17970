"""What another process on the CPUs does to a whole-model timing, and what the meter reads.

Times resnet18 and mobilenet_v3_large (224 px) as the profile does (a fresh child process,
`time_forward_isolated`, 2.5 s cap) at 1 and 2 threads, idle and beside a neighbour: a spin loop,
a 1-thread matmul, a 1-thread memory copy, two spin loops. Prints one JSON line per timing
(median ms, others_cores, contended). benchmarks/RESULTS.md (2026-12-02) has a run.

usage: python benchmarks/contention.py [REPEATS]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from profilers.modelbench import time_forward_isolated

SPIN = [sys.executable, "-c", "while True: pass"]
MATMUL = [sys.executable, "-c", "import torch; torch.set_num_threads(1); a = torch.randn(1024, 1024)"
          "\nwhile True: a @ a"]
COPY = [sys.executable, "-c", "import torch; torch.set_num_threads(1); a = torch.randn(16 << 20)"
        "\nb = torch.empty_like(a)\nwhile True: b.copy_(a)"]
NEIGHBOURS = {"none": [], "spin": [SPIN], "matmul": [MATMUL], "copy": [COPY], "2 spins": [SPIN] * 2}
MODELS = (("torchvision:resnet18", ["1x3x224x224"]),
          ("torchvision:mobilenet_v3_large", ["1x3x224x224"]))


def main(repeats: int = 2) -> None:
    for rep in range(repeats):
        for threads in (1, 2):
            for name, commands in NEIGHBOURS.items():
                neighbours = [subprocess.Popen(c) for c in commands]
                time.sleep(1.5 if neighbours else 0.0)  # started and busy
                try:
                    for spec, inputs in MODELS:
                        m = time_forward_isolated(spec, inputs, threads=threads, max_time_s=2.5)
                        print(json.dumps({"repeat": rep, "threads": threads, "neighbour": name,
                                          "model": spec, "median_ms": round(m.median_s * 1e3, 2),
                                          "others_cores": m.others_cores,
                                          "contended": m.contended, "n": m.n}), flush=True)
                finally:
                    for p in neighbours:
                        p.kill()
                        p.wait()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
