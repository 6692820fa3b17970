"""Does a database with random grouped convs predict the grouped convs of unseen models better?

    python benchmarks/grouped_convs.py DB DEVICE THREADS [ROUNDS]

Copies DB, adds the grouped convs that ROUNDS (default 40) random conv rounds draw
(`profilers.sampling`, GROUPED_SHARE) and times them into the copy, interleaved with timing the
convs of unseen models with grouped convs (and their dense and depthwise convs as a control). Then
the conv model of each database predicts those convs; the table is MAPE, the median of
predicted/measured and the share within 10%, by kind and by channels per group and batch. Every
timing is in this one process, one after another, so a slow spell of a shared machine reaches both
databases' scores alike. This is how `sampling.GROUPED_SHARE` was measured.
"""

from __future__ import annotations

import collections
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from kernels_db.build import _measure_config
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


def main(db_path: str, device: str, threads: int, rounds: int) -> None:
    torch.set_num_threads(threads)
    allocator.apply()
    work = Path(tempfile.mkdtemp(prefix="hwlat-grouped-"))
    with KernelDB.open(db_path, readonly=True) as db:
        row = db.get_device(device)
        known = set(db.config_ids(row.id))
        l2 = (row.fingerprint.get("caches") or {}).get("l2")
    flusher = CacheFlusher(flush_bytes("cpu", threads, l2))
    tests: dict[str, tuple[str, int, OpRecord]] = {}
    for spec in UNSEEN:
        for batch in (1, 8):
            for r in capture_spec(spec, inputs=[parse_input_spec(f"{batch}x3x224x224")]).ops:
                if is_conv2d(r) and r.key not in known:
                    tests.setdefault(r.key, (spec, batch, r))
    extra = {r.key: r for seed in range(rounds)
             for r in sampling.random_records("conv", 40, seed=1000 + seed)
             if is_conv2d(r) and kind(r) == "grouped" and r.key not in known}
    print(f"{len(tests)} convs of {len(UNSEEN)} unseen models "
          f"{dict(collections.Counter(kind(r) for _, _, r in tests.values()))}; "
          f"{len(extra)} random grouped convs added", flush=True)
    order = list(tests.values())
    random.Random(0).shuffle(order)
    copy = work / "with_grouped.db"
    shutil.copy(db_path, copy)
    measured: dict[str, float] = {}
    with KernelDB.open(copy) as db:
        run = db.start_run(row.id, budget_s=None, settings={"benchmark": "grouped_convs"})
        db.add_configs(row.id, [(r.key, r.op, family_of(r.op), r.dtype, "random", r.to_json(), 2)
                                for r in extra.values()])
        ids = db.config_ids(row.id)
        pending, tested = list(extra.values()), iter(order)
        for i in range(max(len(pending), len(order))):
            if i < len(pending):
                m, _ = _measure_config(pending[i], "cpu", flusher, threads)
                db.add_measurement(ids[pending[i].key], run, m.samples_s, flushed=True,
                                   threads=threads, noisy=m.is_noisy)
            for _, _, r in [next(tested, (None, None, None))]:
                if r is not None:
                    measured[r.key] = _measure_config(r, "cpu", flusher, threads)[0].median_s
        for _, _, r in tested:
            measured[r.key] = _measure_config(r, "cpu", flusher, threads)[0].median_s
        db.finish_run(run)
    ratios: dict[str, dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(list))
    for name, path in (("as profiled", db_path), ("with grouped", copy)):
        with KernelDB.open(path, readonly=True) as db:
            predictor = Predictor.for_device(db, row.id, cache_dir=str(work / name.replace(" ", "_")))
        predictor.estimate_ops([r for _, _, r in order])
        for _, batch, r in order:
            ratio = predictor.estimate(r).p50_s / measured[r.key]
            ratios[kind(r)][name].append(ratio)
            if kind(r) == "grouped":
                per_group = r.inputs[0].shape[1] // r.args[6]
                ratios[f"  {per_group} ch/group, batch {batch}"][name].append(ratio)
    for label, by_db in ratios.items():
        print(f"{label:26s} n={len(by_db['as profiled']):3d}")
        for name, values in by_db.items():
            print(f"    {name:14s} {score(values)}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__.split("\n\n")[1])
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 40)
