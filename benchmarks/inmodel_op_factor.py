"""Could a per-op model of "how much slower (or faster) is this op inside a model than the
database says" replace part of the end-to-end correction? The correction is fitted on ~59
end-to-end timings; the zoo's models hold thousands of ops, each of which can be timed inside its
model (a dispatch mode around every aten call, `inmodel_vs_isolated._TimeEachOp`) beside its
estimate from the database.

    python benchmarks/inmodel_op_factor.py DB DEVICE EVAL_JSON OUT.jsonl [THREADS]

First it times, per model setting (the device's zoo settings, then the evaluation's models), each
op inside the model (median of 7 passes) and writes one JSON line per setting to OUT.jsonl; a
rerun resumes from what is there. One process and nothing else timing meanwhile: about 4 minutes
for the zoo and the held-out zoo at 1 thread. Then it scores three predictions of each setting,
fitted on the zoo (leave-one-family-out for the zoo, all of it for the evaluated models):
- as recorded: the evaluation's own prediction at the profile's anchor;
- op sum and per-op term: `a * sum + b * ops` (b of either sign, `predictor.correction`);
- in-model op factor: the same over each op's estimate times exp(f(op)), f a LightGBM model of
  log(in-model time / estimate) from the op's family, estimate, weight and moved bytes, their
  ratio, achieved bandwidth, whether it was measured exactly, and the model's total weights;
  trained on the zoo's ops, each model's ops weighted to count as one model.
The in-model times carry the dispatch mode's own cost (the ratio in-model/estimate runs 1.3-1.4
on the Xeon of 12-05); `a` and `b` absorb it.

On that Xeon (1 thread, the profile of 12-05 03:48, its held-out zoo as evaluated at 6dea6ba and
scored against the timings with subnormals flushed, 52 settings): as recorded (the per-op term
then kept >= 0) 7.6% MAPE, 73% within 10%; op sum and per-op term 6.3%, 83%; in-model op factor
5.3%, 85%; zoo leave-one-family-out 6.4% and 5.3% (the zoo's 10,527 ops, timed in 224 s with the
evaluated ones). The predictor's five terms with the per-op term allowed its sign re-predict the
same settings at 5.8%, 88% (`correction_variants.py`): the op factor buys about half a point
more, not yet worth recording in-model op times in every profile, and it has been measured on
one machine only (benchmarks/RESULTS.md, 2026-12-05 morning).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch
from inmodel_vs_isolated import _TimeEachOp

from kernels_db.store import KernelDB
from predictor.e2e import Predictor
from predictor.evaluate import metrics
from profilers import allocator, ops
from profilers.capture import capture_spec
from profilers.errors import HwlatError
from profilers.modelbench import prepare
from profilers.ops import is_free
from profilers.specs import parse_input_spec

PASSES = 7


def _settings(db_path: str, device: str, report: dict) -> tuple[Predictor, list[tuple]]:
    with KernelDB.open(db_path, readonly=True) as db:
        predictor = Predictor.for_device(db, device)
        zoo = [(spec, list(g[0].settings.get("inputs", [])), g[0].family,
                min(m.median_s for m in g), "zoo")
               for (spec, _), g in predictor.e2e_passes(db).items()]
    held = [(m["spec"], list(m["inputs"]), m["family"],
             (m.get("measured_flushed_ms") or m["measured_ms"]) / 1e3, "evaluated")
            for m in report["models"]]
    return predictor, zoo + held


def _time_in_model(spec: str, inputs: list[str]) -> list[float]:
    model, args = prepare(spec, inputs)
    with torch.inference_mode():
        for _ in range(3):
            model(*args)
        runs = []
        for _ in range(PASSES):
            with _TimeEachOp() as mode:
                model(*args)
            runs.append(mode.seconds)
    return [statistics.median(r[i] for r in runs) for i in range(len(runs[0]))]


def collect(predictor: Predictor, settings: list[tuple], out_path: str) -> None:
    done = set()
    if os.path.exists(out_path):
        for line in open(out_path):
            d = json.loads(line)
            done.add((d["spec"], tuple(d["inputs"]), d["set"]))
    with open(out_path, "a") as out:
        for spec, inputs, family, measured_s, which in settings:
            if (spec, tuple(inputs), which) in done:
                continue
            try:
                in_model = _time_in_model(spec, inputs)
                captured = capture_spec(spec, inputs=[parse_input_spec(i) for i in inputs] or None)
            except HwlatError as e:
                print(f"skipped {spec} {inputs}: {e}", file=sys.stderr)
                continue
            if len(captured.ops) != len(in_model):
                print(f"skipped {spec} {inputs}: capture saw {len(captured.ops)} ops, the real "
                      f"forward {len(in_model)}", file=sys.stderr)
                continue
            predictor.estimate_ops(captured.ops)
            rows = []
            for record, seconds in zip(captured.ops, in_model, strict=True):
                e = predictor.estimate(record)
                if is_free(record) or e.source == "free":
                    continue
                rows.append({"family": e.family, "source": e.source, "estimate_s": e.p50_s,
                             "in_model_s": seconds, "weight_bytes": record.weight_bytes,
                             "bytes": ops.bytes_of(record)})
            out.write(json.dumps({
                "spec": spec, "inputs": inputs, "family": family, "set": which,
                "measured_s": measured_s, "weight_bytes": sum(r["weight_bytes"] for r in rows),
                "ops": rows}) + "\n")
            out.flush()
            print(f"{which} {spec} {inputs}: {len(rows)} ops", file=sys.stderr)


def _features(op: dict, setting: dict, families: list[str]) -> list[float]:
    return [families.index(op["family"]), math.log(op["estimate_s"]),
            math.log1p(op["weight_bytes"]), math.log1p(op["bytes"]),
            op["weight_bytes"] / max(op["bytes"], 1.0), math.log1p(setting["weight_bytes"]),
            math.log1p(op["bytes"]) - math.log(op["estimate_s"]),
            1.0 if op["source"] == "measured" else 0.0]


def _op_factor(train: list[dict], families: list[str]):
    import lightgbm as lgb

    x, y, w = [], [], []
    for s in train:
        total = sum(o["estimate_s"] for o in s["ops"])
        for o in s["ops"]:
            x.append(_features(o, s, families))
            y.append(math.log(max(o["in_model_s"], 1e-7) / o["estimate_s"]))
            w.append(o["estimate_s"] / total)
    model = lgb.LGBMRegressor(n_estimators=200, learning_rate=0.05, num_leaves=8,
                              min_child_samples=20, n_jobs=1, verbose=-1)
    model.fit(np.array(x), np.clip(y, -1.5, 1.5), sample_weight=w)
    return model


def _columns(s: dict, model, families: list[str]) -> np.ndarray:
    est = np.array([o["estimate_s"] for o in s["ops"]])
    if model is not None:
        est = est * np.exp(model.predict(np.array([_features(o, s, families) for o in s["ops"]])))
    return np.array([est.sum(), len(s["ops"])])


def _fit(train: list[dict], model, families: list[str]) -> np.ndarray:
    x = np.array([_columns(s, model, families) for s in train])
    y = np.array([s["measured_s"] for s in train])
    coef, *_ = np.linalg.lstsq(x / y[:, None], np.ones(len(y)), rcond=None)
    return coef


def score(out_path: str, report: dict) -> None:
    settings = [json.loads(line) for line in open(out_path)]
    zoo = [s for s in settings if s["set"] == "zoo"]
    held = [s for s in settings if s["set"] == "evaluated"]
    families = sorted({o["family"] for s in settings for o in s["ops"]})
    recorded = {(m["spec"], tuple(m["inputs"])): (m.get("predicted_profile_ms")
                                                  or m["predicted_ms"]) / 1e3
                for m in report["models"]}

    def show(name: str, zoo_pred: list[float] | None, held_pred: list[float]) -> None:
        z = (metrics([s["measured_s"] for s in zoo], zoo_pred) if zoo_pred else None)
        h = metrics([s["measured_s"] for s in held], held_pred)
        print(f"  {name:28s} evaluated {h['mape_pct']:5.1f}% ({100 * h['within_10pct']:3.0f}% "
              f"within 10%)" + (f"   zoo leave-one-family-out {z['mape_pct']:5.1f}%" if z else ""))

    print(f"{len(zoo)} zoo settings, {len(held)} evaluated ones")
    show("as recorded", None, [recorded[s["spec"], tuple(s["inputs"])] for s in held])
    for name, learn in (("op sum and per-op term", False), ("in-model op factor", True)):
        lofo: dict[int, float] = {}
        for family in sorted({s["family"] for s in zoo}):
            train = [s for s in zoo if s["family"] != family]
            model = _op_factor(train, families) if learn else None
            coef = _fit(train, model, families)
            lofo.update({i: float(_columns(s, model, families) @ coef)
                         for i, s in enumerate(zoo) if s["family"] == family})
        model = _op_factor(zoo, families) if learn else None
        coef = _fit(zoo, model, families)
        show(name, [lofo[i] for i in range(len(zoo))],
             [float(_columns(s, model, families) @ coef) for s in held])


def main(argv: list[str]) -> None:
    if len(argv) < 4:
        sys.exit(__doc__.split("\n\n")[1])
    db_path, device, eval_path, out_path = argv[:4]
    threads = int(argv[4]) if len(argv) > 4 else 1
    torch.set_num_threads(threads)
    allocator.apply()
    report = json.load(open(eval_path))
    predictor, settings = _settings(db_path, device, report)
    t0 = time.perf_counter()
    collect(predictor, settings, out_path)
    print(f"timed in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    score(out_path, report)


if __name__ == "__main__":
    main(sys.argv[1:])
