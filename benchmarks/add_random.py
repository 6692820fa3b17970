"""What more random configs of one op family would give: a copy of a database with them timed in.

    python benchmarks/add_random.py DB COPY FAMILY ROUNDS

Copies DB (a CPU device's) to COPY and times into it, as a profile times them (flushed, metered,
paced by the window probe: `kernels_db.build._Metered`), the configs of FAMILY that ROUNDS more
random draws of 60 give (`sampling.random_records(FAMILY, 60, seed=5000..)`), those DB lacks.
Then compare the two with `databases_vs_alone.py`, or re-score recorded evaluations with
`evaluation_with_database.py`.

This measured the pool draw (`sampling.DRAWS`, benchmarks/RESULTS.md, 2026-12-06 late night):
`add_random.py DB COPY pool 2` added 119 pools in 37 s at 1 thread, and googlenet's pools went
from 0.74-0.79x their time alone at the usual pace to 0.80-0.92x.
"""

from __future__ import annotations

import sqlite3
import sys
import time

import torch

from kernels_db.build import _measure_config, _Metered, window_probe  # as the profile times
from kernels_db.store import KernelDB
from profilers import allocator, sampling
from profilers.ops import family_of
from profilers.timer import CacheFlusher, flush_bytes


def main(db_path: str, copy: str, family: str, rounds: int) -> None:
    with sqlite3.connect(db_path) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)  # a WAL database's last writes are not in its main file yet
    with KernelDB.open(copy) as db:
        row = db.get_device(db.list_devices()[0].id)
        if row.kind != "cpu":
            sys.exit(f"{row.id} is a {row.kind} device; this benchmark times on the CPU")
        known = {m.key for m in db.measured(row.id)}
        torch.set_num_threads(row.threads)
        allocator.apply()
        flusher = CacheFlusher(flush_bytes("cpu", row.threads,
                                           (row.fingerprint.get("caches") or {}).get("l2")))
        extra = list({r.key: r for seed in range(rounds)
                      for r in sampling.random_records(family, 60, seed=5000 + seed)
                      if family_of(r.op) == family and r.key not in known}.values())
        run = db.start_run(row.id, budget_s=None, settings={"benchmark": f"add_random {family}"})
        db.add_configs(row.id, [(r.key, r.op, family, r.dtype, "random", r.to_json(), 2)
                                for r in extra])
        ids = db.config_ids(row.id)
        metered = _Metered(db, row.threads, window_probe("cpu"))
        start = time.monotonic()
        for r in extra:
            m, _ = _measure_config(r, "cpu", flusher, row.threads)
            metered.timed(db.add_measurement(ids[r.key], run, m.samples_s, flushed=True,
                                             threads=row.threads, noisy=m.is_noisy))
        db.finish_run(run)
    print(f"{len(extra)} random {family} configs timed into {copy} in "
          f"{time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__.split("\n\n")[1])
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
