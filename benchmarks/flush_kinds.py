"""Which cache flush makes ops timed alone add up like the same ops inside their model.

    python benchmarks/flush_kinds.py THREADS OUT.jsonl SPEC@INPUT [SPEC@INPUT ...]

For each model: its plain forward time (median of 15), the sum of its ops timed inside it (a
dispatch mode timing every aten call, median of 7 passes), and the sum of the same ops timed
alone as the profile times them (`kernels_db.build._measure_config`) after each kind of flush:
"rmw", the profile's own `CacheFlusher` (a read-modify-write of an L2-sized buffer, which leaves
its lines dirty), "read" (the same buffer only read: clean lines) and "none". A flush fits when
alone/model comes out the same for every model: then one correction multiplier carries op sums to
model times. One JSON line per model (totals and per-family sums, ms) is appended to OUT.jsonl.

Measured on the 2-vCPU Xeon at 1 thread (benchmarks/RESULTS.md, 2026-12-05 afternoon): the
read-only flush priced every model within 2% of the read-modify-write one, and no flush spread the
ratio wider (sd of log(alone/model) over 24 settings 0.122 against 0.083 for the profile's flush).
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inmodel_vs_isolated import time_in_model  # noqa: E402

from kernels_db.build import _measure_config  # noqa: E402
from profilers import allocator  # noqa: E402
from profilers.fingerprint import fingerprint  # noqa: E402
from profilers.ops import is_free, record_family  # noqa: E402
from profilers.timer import CacheFlusher, flush_bytes  # noqa: E402


class ReadFlusher(CacheFlusher):
    """The profile's buffer, read instead of rewritten: it evicts as much, leaving clean lines."""

    def __call__(self) -> None:
        self._buffer.sum()


def flushers(threads: int) -> dict[str, CacheFlusher | None]:
    nbytes = flush_bytes("cpu", threads, fingerprint("cpu", threads).caches.get("l2"))
    return {"rmw": CacheFlusher(nbytes), "read": ReadFlusher(nbytes), "none": None}


def one_model(spec: str, inp: str, threads: int, kinds: dict) -> dict:
    plain, passes, captured = time_in_model(spec, inp)
    alone: dict[tuple[str, str], float] = {}
    family = collections.defaultdict(collections.Counter)
    total = collections.Counter()
    for i, r in enumerate(captured.ops):
        if is_free(r):
            continue
        inside = statistics.median(p[i] for p in passes)
        f = record_family(r)
        family[f]["inm"] += inside
        total["inm"] += inside
        for kind, flusher in kinds.items():
            if (r.key, kind) not in alone:
                alone[r.key, kind] = _measure_config(r, "cpu", flusher, threads)[0].median_s
            family[f][kind] += alone[r.key, kind]
            total[kind] += alone[r.key, kind]
    return {"spec": spec, "input": inp, "threads": threads,
            "model_ms": statistics.median(plain) * 1e3,
            "total_ms": {k: v * 1e3 for k, v in total.items()},
            "family_ms": {f: {k: v * 1e3 for k, v in c.items()} for f, c in family.items()}}


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        raise SystemExit(__doc__)
    threads, out = int(argv[0]), Path(argv[1])
    torch.set_num_threads(threads)
    allocator.apply()
    kinds = flushers(threads)
    for arg in argv[2:]:
        spec, _, inp = arg.partition("@")
        line = one_model(spec, inp or "1x3x224x224", threads, kinds)
        with out.open("a") as f:
            f.write(json.dumps(line) + "\n")
        model = line["model_ms"]
        print(f"{spec:36s} {line['input']:14s} model {model:8.2f} ms, ops inside "
              f"{line['total_ms']['inm']:8.2f}; alone: " + ", ".join(
                  f"{k} {line['total_ms'][k]:8.2f} ({line['total_ms'][k] / model:.2f}x)"
                  for k in kinds), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
