"""What random grouped convs are worth to the conv model, on the grouped convs of unseen models.

    python benchmarks/grouped_convs.py DB DEVICE [ROUNDS]

Copies DB (a CPU device's; best one profiled before random convs were grouped), adds the grouped
convs that ROUNDS (default 40) random conv rounds draw (`profilers.sampling`, GROUPED_SHARE) and
times them into the copy, interleaved with timing the convs of unseen models with grouped convs
(their dense convs are the control). Then the conv model of each database predicts those convs;
the table is MAPE, the median of predicted/measured and the share within 10%, by kind and by
channels per group and batch. Every timing is in this one process at the device's thread count,
one after another, so a slow spell of a shared machine reaches both databases' scores alike. This
measured the gain quoted at `sampling.GROUPED_SHARE`: the effect of adding ~260 grouped convs,
not of the share itself.
"""

from __future__ import annotations

import collections
import itertools
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from kernels_db.build import _measure_config  # how the profile times a config
from kernels_db.store import KernelDB
from predictor.e2e import Predictor
from profilers import allocator, sampling
from profilers.capture import capture_spec
from profilers.oprecord import OpRecord
from profilers.ops import family_of, is_free, record_family
from profilers.specs import parse_input_spec
from profilers.timer import CacheFlusher, flush_bytes

UNSEEN = ("torchvision:regnet_x_800mf", "torchvision:regnet_y_800mf", "torchvision:regnet_x_1_6gf",
          "torchvision:resnext50_32x4d", "timm:resnext26ts", "timm:seresnext26d_32x4d",
          "timm:regnetz_005", "timm:haloregnetz_b")


def kind(r: OpRecord) -> str:
    groups = r.args[6] if len(r.args) > 6 else 1
    return "dense" if groups == 1 else "depthwise" if groups == r.inputs[0].shape[1] else "grouped"


def is_conv2d(r: OpRecord) -> bool:
    return not is_free(r) and record_family(r) == "conv" and r.op.endswith("conv2d.default")


def score(ratios: list[float]) -> str:
    return (f"MAPE {100 * statistics.mean(abs(x - 1) for x in ratios):5.1f}%  median "
            f"{statistics.median(ratios):4.2f}  within 10% "
            f"{100 * sum(abs(x - 1) <= 0.1 for x in ratios) / len(ratios):3.0f}%")


def main(db_path: str, device: str, rounds: int) -> None:
    with KernelDB.open(db_path, readonly=True) as db:
        row = db.get_device(device)
        known = {m.key for m in db.measured(row.id)}
    if row.kind != "cpu":
        sys.exit(f"{row.id} is a {row.kind} device; this benchmark times CPU convs")
    torch.set_num_threads(row.threads)
    allocator.apply()
    flusher = CacheFlusher(flush_bytes("cpu", row.threads, (row.fingerprint.get("caches") or {}).get("l2")))
    tests: dict[str, tuple[str, int, OpRecord]] = {}
    for spec in UNSEEN:
        for batch in (1, 8):
            for r in capture_spec(spec, inputs=[parse_input_spec(f"{batch}x3x224x224")]).ops:
                if is_conv2d(r) and r.key not in known:
                    tests.setdefault(r.key, (spec, batch, r))
    extra = [r for r in {r.key: r for seed in range(rounds)
                         for r in sampling.random_records("conv", 40, seed=1000 + seed)}.values()
             if is_conv2d(r) and kind(r) == "grouped" and r.key not in known and r.key not in tests]
    print(f"{len(tests)} convs of {len(UNSEEN)} unseen models "
          f"{dict(collections.Counter(kind(r) for _, _, r in tests.values()))}; "
          f"{len(extra)} random grouped convs added", flush=True)
    order = list(tests.values())
    random.Random(0).shuffle(order)
    work = Path(tempfile.mkdtemp(prefix="hwlat-grouped-"))
    try:
        copy = work / "with_grouped.db"
        with sqlite3.connect(db_path) as src, sqlite3.connect(copy) as dst:
            src.backup(dst)  # a WAL database's last writes are not in its main file yet
        measured = _time_interleaved(copy, row, extra, order, flusher)
        ratios: dict[str, dict[str, list[float]]] = collections.defaultdict(
            lambda: collections.defaultdict(list))
        for name, path in (("as profiled", db_path), ("with grouped", copy)):
            with KernelDB.open(path, readonly=True) as db:
                predictor = Predictor.for_device(db, row.id,
                                                 cache_dir=str(work / name.replace(" ", "_")))
            predictor.estimate_ops([r for _, _, r in order])
            for _, batch, r in order:
                ratio = predictor.estimate(r).p50_s / measured[r.key]
                ratios[kind(r)][name].append(ratio)
                if kind(r) == "grouped":
                    per_group = r.inputs[0].shape[1] // r.args[6]
                    ratios[f"  {per_group:3d} ch/group, batch {batch}"][name].append(ratio)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for label in sorted(ratios, key=lambda k: (k.startswith(" "), k)):
        by_db = ratios[label]
        print(f"{label:26s} n={len(by_db['as profiled']):3d}")
        for name, values in by_db.items():
            print(f"    {name:14s} {score(values)}")


def _time_interleaved(copy: Path, row, extra: list[OpRecord],
                      order: list[tuple[str, int, OpRecord]], flusher) -> dict[str, float]:
    """Time the extra configs into `copy`, each followed by two of the test configs (there are
    about as many again); returns the test configs' medians."""
    measured: dict[str, float] = {}
    with KernelDB.open(copy) as db:
        run = db.start_run(row.id, budget_s=None, settings={"benchmark": "grouped_convs"})
        db.add_configs(row.id, [(r.key, r.op, family_of(r.op), r.dtype, "random", r.to_json(), 2)
                                for r in extra])
        ids = db.config_ids(row.id)
        tests = iter(order)
        for r in extra:
            m, _ = _measure_config(r, "cpu", flusher, row.threads)
            db.add_measurement(ids[r.key], run, m.samples_s, flushed=True, threads=row.threads,
                               noisy=m.is_noisy)
            for _, _, t in itertools.islice(tests, 2):
                measured[t.key] = _measure_config(t, "cpu", flusher, row.threads)[0].median_s
        for _, _, t in tests:  # the rest, if the tests outnumber the extras twice over
            measured[t.key] = _measure_config(t, "cpu", flusher, row.threads)[0].median_s
        db.finish_run(run)
    return measured


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("\n\n")[1])
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 40)
