"""predictor.evaluate: exact metrics on a hand-made example, the report, the plot, real timing."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from kernels_db.store import KernelDB
from predictor.e2e import Predictor
from predictor.evaluate import (
    EvalCase,
    evaluate,
    metrics,
    quiet_rounds,
    spearman,
    time_model,
    zoo_cases,
)
from predictor.features import roofline_s
from predictor.journal import EvalJournal
from profilers import ops, sampling
from profilers.contention import CpuUse
from profilers.subnormals import SubnormalUses
from profilers.timer import Measurement

PEAKS = {"gflops": {"float32": 50.0}, "gbps": 10.0}
SMALL = ("1x3x32x32",)
SPECS = ("torchvision:squeezenet1_1", "torchvision:resnet18")


def timing(samples, **kw) -> Measurement:
    """What a MeasureFn returns (kw: cpu_use, threads)."""
    return Measurement(samples_s=tuple(samples), **{
        "warmup": 5, "threads": 1, "flushed": False, "device": "cpu", "stopped_by": "stable",
        **kw})


def test_metrics_are_exact_on_a_hand_made_example():
    m = metrics([10, 20, 30, 40], [11, 9, 30, 50])  # APE 10, 55, 0, 25 %
    assert m["n"] == 4
    assert m["mape_pct"] == pytest.approx(22.5)
    assert m["median_ape_pct"] == pytest.approx(17.5)
    assert (m["within_5pct"], m["within_10pct"], m["within_20pct"]) == (0.25, 0.5, 0.5)
    assert m["spearman"] == pytest.approx(0.8)  # one adjacent swap of four: 1 - 6*2/60


def test_spearman_handles_ties_and_degenerate_input():
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)
    assert spearman([1, 1], [1, 2]) != spearman([1, 1], [1, 2])  # nan: a constant side


@pytest.fixture(scope="module")
def predictor(tmp_path_factory):
    records = []
    for family, n in (("conv", 40), ("matmul", 10), ("eltwise", 15), ("norm", 10), ("pool", 10)):
        records += sampling.random_records(family, n, seed=7)
    records = list({r.key: r for r in records}.values())
    path = tmp_path_factory.mktemp("db") / "k.db"
    with KernelDB.open(path) as db:
        db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, peaks=PEAKS)
        db.add_configs("dev1", [(r.key, r.op, ops.family_of(r.op), r.dtype, "random",
                                 r.to_json()) for r in records])
        ids = db.config_ids("dev1")
        for r in records:
            t = 1.5 * roofline_s(r, PEAKS) + 3e-6
            db.add_measurement(ids[r.key], None, [t] * 3, flushed=True, threads=1, noisy=False)
        for i, spec in enumerate(SPECS):
            db.add_model_measurement("dev1", spec, "f", {"inputs": list(SMALL), "threads": 1,
                                                         "dtype": "float32", "device": "cpu"},
                                     [0.002 * (i + 1)] * 3)
        return Predictor.for_device(db, "dev1", cache_dir=tmp_path_factory.mktemp("c"))


def test_evaluate_reports_each_model_and_both_baselines(predictor, tmp_path):
    measured_s = {"torchvision:squeezenet1_1": 0.003, "torchvision:resnet18": 0.005}
    calls = []

    def fake_measure(spec, inputs, runs, warmup, threads, device, dtype):
        calls.append((spec, tuple(inputs), runs, warmup, threads, device, dtype))
        return timing([measured_s[spec] * f for f in (0.99, 1.0, 1.02)])

    cases = [EvalCase(spec, SMALL) for spec in SPECS]
    report = evaluate(None, "dev1", cases, runs=30, predictor=predictor, measure_fn=fake_measure)
    # three rounds over all models, a third of the runs each
    assert calls == [(s, SMALL, 10, 5, 1, "cpu", "float32") for _ in range(3) for s in SPECS]
    by_spec = {r.spec: r for r in report.rows}
    for spec in SPECS:
        row = by_spec[spec]
        expected = predictor.predict_spec(spec, inputs=list(SMALL)).p50_ms
        assert row.measured_ms == pytest.approx(measured_s[spec] * 1e3)
        assert row.predicted_ms == pytest.approx(expected)
        assert row.error_pct == pytest.approx((expected / row.measured_ms - 1) * 100)
        assert row.flops_pred_ms > 0 and row.roofline_pred_ms > 0 and row.batch == 1
    assert set(report.summary) == {"hwlat", "flops", "roofline"}
    assert report.summary["hwlat"]["mape_pct"] == pytest.approx(
        sum(abs(r.error_pct) for r in report.rows) / 2)
    # both were timed end to end by the profile the predictor was fitted on: said, not hidden
    assert any("not unseen: torchvision:resnet18, torchvision:squeezenet1_1" in n
               for n in report.notes)
    data = json.loads(json.dumps(report.to_json()))
    assert len(data["models"]) == 2 and data["summary"]["flops"]["n"] == 2
    report.plot(str(tmp_path / "eval.png"))
    assert (tmp_path / "eval.png").read_bytes()[:4] == b"\x89PNG"


def test_session_anchor_scales_every_predictor_by_the_reference_drift(predictor):
    then_s = {"torchvision:squeezenet1_1": 0.002, "torchvision:resnet18": 0.004}  # the db's e2e
    order = []

    def fake_measure(spec, inputs, runs, warmup, threads, device, dtype):
        order.append(spec)
        if spec.endswith("x0_5"):  # the evaluated model
            return timing([0.010] * 3)
        # the references run 10% faster in this session, but resnet18 first ran into a slow spell
        slow = 1.3 if spec.endswith("resnet18") and order.count(spec) == 1 else 1.0
        return timing([then_s[spec] * 0.9 * slow] * 3)

    cases = [EvalCase("torchvision:shufflenet_v2_x0_5", SMALL)]
    plain = evaluate(None, "dev1", cases, predictor=predictor, measure_fn=fake_measure)
    assert plain.anchor == "profile" and plain.drift is None
    assert order == ["torchvision:shufflenet_v2_x0_5"] * 3
    order.clear()
    anchored = evaluate(None, "dev1", cases, predictor=predictor, measure_fn=fake_measure,
                        anchor="session")
    # every reference before the evaluated model's rounds and again after, the faster kept
    refs = ["torchvision:squeezenet1_1", "torchvision:resnet18"]
    assert order == [*refs, *["torchvision:shufflenet_v2_x0_5"] * 3, *refs]
    assert anchored.anchor == "session" and anchored.drift.ratio == pytest.approx(0.9)
    a, p = anchored.rows[0], plain.rows[0]
    assert a.predicted_ms == pytest.approx(0.9 * p.predicted_ms)
    assert a.predicted_profile_ms == pytest.approx(p.predicted_ms)
    assert a.flops_pred_ms == pytest.approx(0.9 * p.flops_pred_ms)
    assert a.interval_ms == pytest.approx([0.9 * v for v in p.interval_ms])
    assert anchored.summary["hwlat_profile_anchor"]["mape_pct"] == plain.summary["hwlat"]["mape_pct"]
    data = json.loads(json.dumps(anchored.to_json()))
    assert data["drift"]["n"] == 2 and data["drift"]["references"][0]["then_ms"] == 2.0
    slowed = data["drift"]["references"][1]
    assert slowed["before_ms"] == pytest.approx(4.0 * 0.9 * 1.3)
    assert slowed["now_ms"] == slowed["after_ms"] == pytest.approx(4.0 * 0.9)
    assert not any("their profiled time" in n for n in anchored.notes)  # x0.9: within 1.15
    with pytest.raises(ValueError):
        evaluate(None, "dev1", cases, predictor=predictor, measure_fn=fake_measure, anchor="x")


def test_references_far_from_their_profiled_time_say_the_profile_is_stale(predictor):
    from predictor.evaluate import Drift, session_drift_note

    then_s = {"torchvision:squeezenet1_1": 0.002, "torchvision:resnet18": 0.004}

    def fake_measure(spec, inputs, runs, warmup, threads, device, dtype):
        return timing([0.010] * 3 if spec.endswith("x0_5") else [then_s[spec] * 0.7] * 3)

    report = evaluate(None, "dev1", [EvalCase("torchvision:shufflenet_v2_x0_5", SMALL)],
                      predictor=predictor, measure_fn=fake_measure, anchor="session")
    assert report.drift.ratio == pytest.approx(0.7)
    stale = [n for n in report.notes if "their profiled time" in n]
    assert len(stale) == 1 and stale[0].startswith("the training zoo's references ran x0.70 ")
    assert "`hwlat --db fresh.db quickstart`" in stale[0]
    from hwlat.commands.evaluate import show
    from hwlat.output import stdout

    with stdout.capture() as shown:
        show(report)
    assert "warning: the training zoo's references ran x0.70" in " ".join(shown.get().split())
    assert session_drift_note(Drift(1.16, 1.1, 1.2, [])) is not None  # slower counts too
    assert session_drift_note(Drift(1.14, 1.1, 1.2, [])) is None
    assert session_drift_note(None) is None


def test_a_slow_spell_in_one_round_moves_the_measurement_little_and_is_reported(predictor):
    factors = iter([1.0, 1.0, 1.3, 1.3, 1.0, 1.0])  # round 2 ran 30% slow, for both models

    def fake_measure(spec, inputs, runs, warmup, threads, device, dtype):
        f = next(factors)
        return timing([0.004 * f] * (runs * (3 if f > 1 else 1)))  # a noisy round: more samples

    report = evaluate(None, "dev1", [EvalCase(spec, SMALL) for spec in SPECS], runs=30,
                      predictor=predictor, measure_fn=fake_measure)
    for row in report.rows:
        assert row.measured_rounds_ms == pytest.approx([4.0, 5.2, 4.0])
        assert row.measured_ms == pytest.approx(4.0)  # the median of the round medians
        assert row.round_spread_pct == pytest.approx(30.0)
    assert report.round_spread_pct() == {"median": pytest.approx(30.0), "max": pytest.approx(30.0),
                                         "rounds": 3}
    # re-measurement: 4.0 and 4.0 against median(5.2, 4.0) = 4.6 (13.0% off), 5.2 against 4.0
    remeasured = report.remeasurement()
    assert remeasured["n"] == 6
    assert remeasured["mape_pct"] == pytest.approx((2 * (0.6 / 4.6) + 0.3) / 3 * 100)
    assert (remeasured["within_10pct"], remeasured["within_20pct"]) == (0.0, pytest.approx(2 / 3))
    data = json.loads(json.dumps(report.to_json()))
    assert data["models"][0]["round_spread_pct"] == pytest.approx(30.0)
    assert data["remeasurement"]["n"] == 6
    from hwlat.commands.evaluate import show
    from hwlat.output import stdout

    with stdout.capture() as shown:
        show(report)
    rows = [x for x in shown.get().splitlines() if x.startswith("│ re-")]  # may wrap
    assert len(rows) == 1 and f"{remeasured['mape_pct']:.1f}%" in rows[0]
    single = evaluate(None, "dev1", [EvalCase(SPECS[0], SMALL)], rounds=1, predictor=predictor,
                      measure_fn=lambda *a: timing([0.004] * a[2]))
    assert single.rows[0].round_spread_pct is None and single.round_spread_pct() is None
    assert single.remeasurement() is None


def test_a_round_timed_beside_other_work_is_left_out_of_the_measurement_and_said(predictor):
    busy = {"cpu_use": CpuUse(1.4, 2, 1.0)}  # at 1 thread: others on the free core and ours
    rounds = iter([(1.0, {}), (1.0, busy), (1.5, busy), (1.5, busy), (1.1, {}), (1.5, busy),
                   (1.5, busy), (1.5, busy)])  # resnet18's two extra rounds: busy again

    def fake_measure(spec, inputs, runs, warmup, threads, device, dtype):
        f, use = next(rounds)
        return timing([0.004 * f] * runs, **use)

    report = evaluate(None, "dev1", [EvalCase(spec, SMALL) for spec in SPECS], runs=30,
                      predictor=predictor, measure_fn=fake_measure)
    quiet, spoilt = report.rows
    assert quiet.contended_rounds == [1] and quiet.measured_ms == pytest.approx(4.2)  # 4.0, 4.4
    assert quiet.slow_rounds == spoilt.slow_rounds == []  # no pace probed: none in a slow spell
    assert spoilt.contended_rounds == [0, 1, 2, 3, 4] and spoilt.measured_ms == pytest.approx(6.0)
    assert quiet.others_cores_max == 1.4
    # the machine's own noise is read off the rounds the measurements are made of
    assert quiet.quiet_rounds_ms == pytest.approx([4.0, 4.4])
    assert quiet.round_spread_pct == pytest.approx(0.4 / 4.2 * 100)
    assert report.remeasurement()["n"] == 2 + 5  # resnet18 had no quiet round: all five
    [note] = [n for n in report.notes if "other processes" in n]
    assert note.startswith("2 of 2 models had a round timed while other processes kept up to "
                           "1.4 cores busy; their measurement leaves it out, except 1 with no "
                           "quiet round, whose measured time includes it (e.g. "
                           "torchvision:resnet18 1x3x32x32)")
    assert json.loads(json.dumps(report.to_json()))["models"][1]["contended_rounds"] == [
        0, 1, 2, 3, 4]
    assert report.round_spread_pct()["rounds"] == 3  # the planned rounds


def test_a_round_timed_in_a_slow_spell_is_left_out_where_the_model_has_another(predictor):
    # (duration factor, pace ms) in timing order: each round times both models
    rounds = iter([(1.0, 5.0), (1.0, 5.0), (1.5, 10.0), (1.0, 5.0), (1.1, 5.0), (1.2, 5.2)])

    def fake_measure(spec, inputs, runs, warmup, threads, device, dtype):
        f, pace_ms = next(rounds)
        return timing([0.004 * f] * runs, pace_s=pace_ms / 1e3)

    report = evaluate(None, "dev1", [EvalCase(spec, SMALL) for spec in SPECS], runs=30,
                      predictor=predictor, measure_fn=fake_measure)
    slowed, steady = report.rows
    assert slowed.slow_rounds == [1] and steady.slow_rounds == []  # 10 ms >= 1.2 x usual 5 ms
    assert slowed.measured_ms == pytest.approx(4.2)  # median of 4.0 and 4.4, not 6.0
    assert slowed.quiet_rounds_ms == pytest.approx([4.0, 4.4])
    assert steady.measured_ms == pytest.approx(4.0)
    # the machine's own noise is read off the rounds the measurements are made of
    assert slowed.round_spread_pct == pytest.approx(0.4 / 4.2 * 100)
    assert report.remeasurement()["n"] == 2 + 3
    [note] = [n for n in report.notes if "ran slow" in n]
    assert note == ("1 of 2 models had a round timed while the machine ran slow (the pace probe "
                    "beside it at 1.2x or more its usual time, profilers.pace); their measurement "
                    "leaves it out")
    assert json.loads(json.dumps(report.to_json()))["models"][0]["slow_rounds"] == [1]


def test_a_model_whose_other_rounds_were_beside_other_work_keeps_its_slow_rounds(predictor):
    busy = {"cpu_use": CpuUse(1.4, 2, 1.0)}
    rounds = iter([(1.0, 5.0, busy), (1.0, 5.0, {}), (1.5, 10.0, {}), (1.0, 5.0, {}),
                   (1.3, 10.0, {}), (1.0, 5.0, {}),
                   (1.0, 5.0, busy), (1.0, 5.0, busy)])  # squeezenet's two extra rounds: busy

    def fake_measure(spec, inputs, runs, warmup, threads, device, dtype):
        f, pace_ms, use = next(rounds)
        return timing([0.004 * f] * runs, pace_s=pace_ms / 1e3, **use)

    report = evaluate(None, "dev1", [EvalCase(spec, SMALL) for spec in SPECS], runs=30,
                      predictor=predictor, measure_fn=fake_measure)
    row = report.rows[0]
    assert row.contended_rounds == [0, 3, 4] and row.slow_rounds == [1, 2]
    assert row.measured_ms == pytest.approx(5.6)  # median of the slow 6.0 and 5.2, not the busy 4
    [note] = [n for n in report.notes if "ran slow" in n]
    assert note.endswith("leaves it out, except 1 with no other round, whose measured time "
                         "includes it (e.g. torchvision:squeezenet1_1 1x3x32x32)")


def test_a_model_short_of_quiet_rounds_is_timed_again_at_the_end_and_resumes_so(predictor,
                                                                                 tmp_path):
    """Two of squeezenet's three rounds ran in a slow spell: it is timed again after every
    model's rounds until it has `MIN_QUIET_ROUNDS` quiet ones, at most `EXTRA_ROUNDS` more."""
    cases = [EvalCase(spec, SMALL) for spec in SPECS]
    # (spec, duration factor, pace ms) in timing order; the extra rounds come last
    plan = [(SPECS[0], 1.5, 10.0), (SPECS[1], 1.0, 5.0), (SPECS[0], 1.0, 5.0),
            (SPECS[1], 1.0, 5.0), (SPECS[0], 1.5, 10.0), (SPECS[1], 1.1, 5.0),
            (SPECS[0], 1.4, 10.0),  # extra round 1: slow again, still one quiet round
            (SPECS[0], 1.1, 5.0)]  # extra round 2: quiet; no third
    calls = []

    def measure(spec, inputs, runs, warmup, threads, device, dtype, stop_after=None):
        if stop_after is not None and len(calls) == stop_after:
            raise KeyboardInterrupt
        want, f, pace_ms = plan[len(calls)]
        assert spec == want
        calls.append(spec)
        return timing([0.004 * f] * runs, pace_s=pace_ms / 1e3)

    def run(journal=None, stop_after=None):
        return evaluate(None, "dev1", cases, predictor=predictor, runs=30,
                        measure_fn=lambda *a: measure(*a, stop_after=stop_after), journal=journal)

    report = run()
    assert calls == [p[0] for p in plan]
    short, steady = report.rows
    assert short.measured_rounds_ms == pytest.approx([6.0, 4.0, 6.0, 5.6, 4.4])
    assert short.slow_rounds == [0, 2, 3]
    assert short.measured_ms == pytest.approx(4.2)  # its two quiet rounds, 4.0 and 4.4
    assert steady.measured_rounds_ms == pytest.approx([4.0, 4.0, 4.4])  # three quiet: no more
    assert ("1 of 2 models were timed again at the end, up to 2 more rounds each (2 in all): "
            "fewer than 2 of their rounds were quiet (not beside other work, not in a slow spell)"
            in report.notes)
    assert json.loads(json.dumps(report.to_json()))["extra_rounds"] == 2
    assert report.round_spread_pct()["rounds"] == 3
    # interrupted during the second extra round: resumed, only that one is timed
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        run(EvalJournal.for_evaluation("dev1", cases, runs=30, warmup=5, rounds=3,
                                       anchor="profile", directory=tmp_path), stop_after=7)
    resumed = run(EvalJournal.for_evaluation("dev1", cases, runs=30, warmup=5, rounds=3,
                                             anchor="profile", directory=tmp_path))
    assert calls == [p[0] for p in plan]  # one more timing, the eighth
    assert [r.measured_rounds_ms for r in resumed.rows] == [r.measured_rounds_ms
                                                             for r in report.rows]
    # --rounds 1: one quiet round is enough (the rule asks for at most the planned rounds)
    calls.clear()
    plan[:] = [(SPECS[0], 1.0, 5.0), (SPECS[1], 1.0, 5.0)]
    one = evaluate(None, "dev1", cases, predictor=predictor, runs=30, rounds=1,
                   measure_fn=lambda *a: measure(*a))
    assert [len(r.measured_rounds_ms) for r in one.rows] == [1, 1]


def test_quiet_rounds_fall_back_to_rounds_not_beside_other_work_then_to_all():
    assert quiet_rounds([4, 5, 6], contended=[0], slow=[2]) == [5]
    assert quiet_rounds([4, 5, 6], contended=[0], slow=[1, 2]) == [5, 6]  # all out: slow back
    assert quiet_rounds([4, 5, 6], contended=[0, 1, 2], slow=[1]) == [4, 5, 6]
    assert quiet_rounds([4, 5, 6], contended=[]) == [4, 5, 6]


def test_each_rounds_pace_is_kept_and_a_session_at_another_pace_than_the_profile_is_noted(
        predictor):
    from types import SimpleNamespace

    from predictor.evaluate import pace_note

    report = evaluate(None, "dev1", [EvalCase(SPECS[0], SMALL)], runs=30, predictor=predictor,
                      measure_fn=lambda *a: timing([0.004] * a[2], pace_s=0.006))
    assert report.rows[0].round_pace_ms == pytest.approx([6.0] * 3)
    assert report.rows[0].round_runs == [10] * 3  # 30 runs split over 3 rounds
    assert json.loads(json.dumps(report.to_json()))["models"][0]["round_pace_ms"][0] == 6.0
    profile = [SimpleNamespace(id=i, pace_s=p, contended=busy) for i, (p, busy) in enumerate(
        [(0.005, False)] * 4 + [(0.009, True), (None, False)])]
    assert pace_note(report.rows, profile) == (
        "the machine ran 1.20x the profile's pace while these models were measured (a fixed "
        "probe beside each timing, profilers.pace: median 6.00 ms now, 5.00 ms in the profile), "
        "so measured latencies run high against the predictions for a reason outside the model; "
        "`--anchor pace` scales each model's predictions by the probe beside its rounds "
        "and over the evaluation")
    assert pace_note(report.rows, [SimpleNamespace(id=0, pace_s=0.0058, contended=False)]) is None
    assert pace_note(report.rows, []) is None  # an older profile, not probed


def test_a_reference_timed_beside_other_work_does_not_set_the_drift():
    from predictor.evaluate import _drift, _faster_of

    def ref(now_ms, contended, then_ms=2.0):
        return {"spec": "s", "inputs": [], "then_ms": then_ms, "now_ms": now_ms,
                "contended": contended}

    before = [ref(2.0, True), ref(4.0, False, 4.0), ref(9.0, True, 3.0)]
    after = [ref(2.2, False), ref(4.4, True, 4.0), ref(9.9, True, 3.0)]
    timed = _faster_of(before, after)
    assert [t["now_ms"] for t in timed] == [2.2, 4.0, 9.0]  # the quiet one, even when slower
    assert [t["contended"] for t in timed] == [False, False, True]
    assert _drift(timed).ratio == pytest.approx(1.05)  # the third left out: 3x slow, contended
    assert _drift([timed[2]]).ratio == pytest.approx(3.0)  # nothing else to go by


def test_time_model_times_a_real_model_and_restores_threads():
    before = torch.get_num_threads()
    m = time_model("torchvision:squeezenet1_1", list(SMALL), runs=3, warmup=1, threads=1)
    assert m.n >= 3 and all(s > 0 for s in m.samples_s) and m.threads == 1  # at least `runs`
    assert torch.get_num_threads() == before


def test_a_round_past_its_time_still_times_every_run_asked_for(monkeypatch):
    from predictor import evaluate as ev

    monkeypatch.setattr(ev, "ROUND_TIME_S", 0.0)  # every pass is past the round's time
    m = time_model("torchvision:squeezenet1_1", list(SMALL), runs=6, warmup=1, threads=1)
    assert m.n == 6  # the issue's minimum, not the time cap's 3


def test_zoo_cases_hold_out_unseen_families():
    from profilers import zoo

    seen = zoo.training_families()
    held = zoo_cases(holdout_families=True)
    assert held and all(c.family not in seen for c in held)
    assert all(c.inputs for c in held)


def test_a_model_with_subnormal_values_gets_a_note(predictor):
    cases = [EvalCase(spec, SMALL) for spec in SPECS]
    shares = {"torchvision:squeezenet1_1": 0.044, "torchvision:resnet18": 0.0}
    report = evaluate(None, "dev1", cases, predictor=predictor,
                      measure_fn=lambda *a: timing([0.004] * a[2]),
                      subnormal_fn=lambda spec, *a: SubnormalUses(shares[spec]))
    assert [r.subnormal_share for r in report.rows] == [0.044, 0.0]
    notes = [n for n in report.notes if "subnormal" in n]
    assert len(notes) == 1 and notes[0].startswith("torchvision:squeezenet1_1 1x3x32x32: 4.4%")
    assert json.loads(json.dumps(report.to_json()))["models"][0]["subnormal_share"] == 0.044
    unchecked = evaluate(None, "dev1", cases, predictor=predictor,
                         measure_fn=lambda *a: timing([0.004] * a[2]))
    assert [r.subnormal_share for r in unchecked.rows] == [None, None]


def test_a_model_with_subnormal_values_is_timed_again_with_them_flushed(predictor):
    cases = [EvalCase(spec, SMALL) for spec in SPECS]
    shares = {"torchvision:squeezenet1_1": 0.044, "torchvision:resnet18": 0.0}
    flushed = []

    def flushed_fn(spec, inputs, runs, warmup, threads, device, dtype):
        flushed.append((spec, runs))
        return timing([0.002] * runs)

    report = evaluate(None, "dev1", cases, predictor=predictor, runs=30,
                      measure_fn=lambda *a: timing([0.004] * a[2]),
                      subnormal_fn=lambda spec, *a: SubnormalUses(shares[spec]),
                      flushed_fn=flushed_fn)
    assert flushed == [("torchvision:squeezenet1_1", 30)]  # only the one computing subnormals
    squeeze, resnet = report.rows
    assert (squeeze.measured_flushed_ms, resnet.measured_flushed_ms) == (pytest.approx(2.0), None)
    (note,) = [n for n in report.notes if "subnormal" in n]
    assert "ran in 2.00 ms against 4.00 ms" in note
    # scored against the flushed timing where there is one, the plain measurement elsewhere
    predicted = [squeeze.predicted_ms, resnet.predicted_ms]
    assert report.summary["hwlat_flushed"]["mape_pct"] == metrics([2.0, 4.0], predicted)["mape_pct"]
    assert report.summary["hwlat"]["mape_pct"] == metrics([4.0, 4.0], predicted)["mape_pct"]
    assert report.summary["hwlat_flushed"]["mape_pct"] != report.summary["hwlat"]["mape_pct"]
    plain = evaluate(None, "dev1", cases, predictor=predictor,
                     measure_fn=lambda *a: timing([0.004] * a[2]),
                     subnormal_fn=lambda spec, *a: SubnormalUses(0.0), flushed_fn=flushed_fn)
    assert "hwlat_flushed" not in plain.summary and len(flushed) == 1


def test_a_forward_timed_with_subnormals_flushed_reads_them_as_zero(tmp_path):
    from profilers.modelbench import time_forward, time_forward_isolated

    seen = tmp_path / "seen.txt"
    (tmp_path / "probe.py").write_text(
        "import torch\n"
        "class Probe(torch.nn.Module):\n"
        "    def forward(self, x):\n"  # exp(-100) = 3.7e-44 is subnormal in float32: flushed,
        # it is written as 0; exp over 1M values is split between the threads, each with its own
        # floating-point control
        "        kept = int(torch.exp(torch.full((1 << 20,), -100.0)).count_nonzero())\n"
        f"        open({str(seen)!r}, 'a').write(f'{{kept}} ')\n"
        "        return x + 1\n"
        "def make():\n"
        "    return Probe()\n")
    spec = f"{tmp_path / 'probe.py'}:make"
    time_forward(spec, ["1x8"], min_runs=3, warmup=1, threads=1, flush_denormal=True)
    assert set(seen.read_text().split()) == {"0"}
    seen.write_text("")
    time_forward(spec, ["1x8"], min_runs=3, warmup=1, threads=1)  # and not after
    assert set(seen.read_text().split()) == {str(1 << 20)}
    seen.write_text("")  # every thread flushes, in the fresh child the evaluation times in
    time_forward_isolated(spec, ["1x8"], threads=2, min_runs=3, warmup=1, flush_denormal=True)
    assert set(seen.read_text().split()) == {"0"}


def test_a_cpu_that_cannot_flush_subnormals_gives_no_flushed_timing(monkeypatch):
    from profilers import modelbench
    from profilers.errors import BenchError

    assert modelbench.can_flush_denormal()  # x86 with SSE3: every machine this runs on
    monkeypatch.setattr(torch, "set_flush_denormal", lambda on: False)
    assert not modelbench.can_flush_denormal()
    with pytest.raises(BenchError, match="cannot flush subnormals"):
        modelbench.time_forward("torchvision:squeezenet1_1", list(SMALL), min_runs=3, warmup=1,
                                threads=1, flush_denormal=True)


def test_a_model_with_no_probe_beside_its_rounds_gets_the_median_over_all(monkeypatch):
    from predictor import evaluate as ev

    monkeypatch.setattr(ev, "_profile_pace_ms", lambda timings: 5.0)
    # ms beside each round: the first model's kept rounds 5.5 and 7.5 (1.3x the profile's), the
    # second none, the third 4.0 thrice; over all kept rounds the median is 4.0 (0.8x)
    drift, factors = ev._pace_anchor([[5.5, None, 7.5], [None, None, None], [4.0, 4.0, 4.0]],
                                     [[], [], []], [[], [], []], [])
    assert factors == pytest.approx([(1.3 * 0.8) ** 0.5, 0.8, 0.8])
    assert drift.ratio == pytest.approx(0.8) and drift.pace_ms == pytest.approx((4.0, 5.0))
    monkeypatch.setattr(ev, "_profile_pace_ms", lambda timings: None)  # a profile never probed
    assert ev._pace_anchor([[5.5]], [[]], [[]], []) == (None, [])


def test_pace_anchor_scales_each_model_by_the_probe_beside_its_rounds(predictor, tmp_path):
    with KernelDB.open(tmp_path / "paced.db") as db:
        db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, peaks=PEAKS)
        for i, pace_s in enumerate([0.005] * 6 + [0.020]):  # the last in a slow spell: not used
            db.add_model_measurement("dev1", f"m{i}", "f", {"inputs": list(SMALL)}, [0.002] * 3,
                                     stats={"pace_s": pace_s})
        cases = [EvalCase(spec, SMALL) for spec in SPECS]
        # rounds in turn (A, B, A, B, A, B): B's first two in a slow spell, 2x the usual pace, so
        # it is timed once more at the end (`MIN_QUIET_ROUNDS`), and its measurement and its factor
        # keep its third and that one (6.5 ms each: 1.3x the profile's 5 ms), and A's are its three
        # (median 6 ms: 1.2x); over all kept rounds (5.5, 6, 6, 6.5, 6.5) the median is 6 ms,
        # 1.2x, so B's factor is (1.3 * 1.2) ** 0.5
        paces = iter([0.0055, 0.012, 0.006, 0.012, 0.006, 0.0065,
                      0.0065])  # B timed again at the end: a second quiet round, as its third

        def paced(*a):
            return timing([0.004] * a[2], pace_s=next(paces))

        plain = evaluate(None, "dev1", cases, predictor=predictor,
                         measure_fn=lambda *a: timing([0.004] * a[2]))
        anchored = evaluate(db, "dev1", cases, predictor=predictor, measure_fn=paced,
                            anchor="pace")
        unprobed = evaluate(db, "dev1", cases, predictor=predictor,
                            measure_fn=lambda *a: timing([0.004] * a[2]), anchor="pace")
    factors = (1.2, (1.3 * 1.2) ** 0.5)
    assert anchored.anchor == "pace" and anchored.drift.ratio == pytest.approx(np.median(factors))
    assert (anchored.drift.q25, anchored.drift.q75) == pytest.approx(
        np.percentile(factors, [25, 75]))
    assert anchored.drift.pace_ms == pytest.approx((6.0, 5.0))  # over all rounds kept
    assert [len(r.measured_rounds_ms) for r in anchored.rows] == [3, 4]  # B timed again
    for a, p, factor in zip(anchored.rows, plain.rows, factors, strict=True):
        assert a.measured_ms == p.measured_ms == pytest.approx(4.0)  # the truth is untouched
        assert a.predicted_ms == pytest.approx(factor * p.predicted_ms)
        assert a.predicted_profile_ms == pytest.approx(p.predicted_ms)
        assert a.flops_pred_ms == pytest.approx(factor * p.flops_pred_ms)
        assert a.interval_ms == pytest.approx([factor * v for v in p.interval_ms])
    assert anchored.summary["hwlat_profile_anchor"]["mape_pct"] == plain.summary["hwlat"]["mape_pct"]
    assert not any("profile's pace" in n for n in anchored.notes)  # it acted on it instead
    data = json.loads(json.dumps(anchored.to_json()))
    assert data["anchor"] == "pace" and data["drift"]["pace_then_ms"] == pytest.approx(5.0)
    # no probe in this evaluation: said, and the predictions left as profiled
    assert unprobed.anchor == "profile" and unprobed.drift is None
    assert unprobed.rows[0].predicted_ms == pytest.approx(plain.rows[0].predicted_ms)
    assert any("pace probe was not timed" in n for n in unprobed.notes)


def test_the_chain_probe_adds_each_op_its_cost_beyond_the_pace_factor(predictor, tmp_path):
    """Where the profile timed the chain probe too, each op of a model costs what the chain's
    ops cost now beyond the model's pace factor (a machine state that slows small ops more than
    dense convolutions slows a model of many small ops more)."""
    from profilers import pace

    with KernelDB.open(tmp_path / "chained.db") as db:
        db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, peaks=PEAKS)
        for i in range(6):
            db.add_model_measurement("dev1", f"m{i}", "f", {"inputs": list(SMALL)}, [0.002] * 3,
                                     stats={"pace_s": 0.005, "chain_s": 0.002})
        cases = [EvalCase(spec, SMALL) for spec in SPECS]
        # every round at 1.2x the profile's pace; the chain at 1.5x (3 ms against 2), so each op
        # costs (3 - 1.2 x 2) / CHAIN_OPS ms more than the factor gives it
        chained = evaluate(db, "dev1", cases, predictor=predictor, anchor="pace",
                           measure_fn=lambda *a: timing([0.004] * a[2], pace_s=0.006,
                                                        chain_s=0.003))
        plain = evaluate(db, "dev1", cases, predictor=predictor,
                         measure_fn=lambda *a: timing([0.004] * a[2]))
        paced_only = evaluate(db, "dev1", cases, predictor=predictor, anchor="pace",
                              measure_fn=lambda *a: timing([0.004] * a[2], pace_s=0.006))
    per_op = (3.0 - 1.2 * 2.0) / pace.CHAIN_OPS
    for c, p, o in zip(chained.rows, plain.rows, paced_only.rows, strict=True):
        assert c.n_timed_ops > 0 and c.round_chain_ms == pytest.approx([3.0] * 3)
        assert c.chain_ms == pytest.approx(per_op * c.n_timed_ops)
        assert c.predicted_ms == pytest.approx(1.2 * p.predicted_ms + c.chain_ms)
        assert c.interval_ms == pytest.approx([1.2 * v + c.chain_ms for v in p.interval_ms])
        assert o.chain_ms is None and o.predicted_ms == pytest.approx(1.2 * p.predicted_ms)
    assert chained.summary["hwlat_pace_factor_only"]["mape_pct"] == pytest.approx(
        paced_only.summary["hwlat"]["mape_pct"])
    assert "hwlat_pace_factor_only" not in paced_only.summary
    [note] = [n for n in chained.notes if "chain probe" in n]
    assert note == (f"the chain probe of {pace.CHAIN_OPS} small ops ran 3.00 ms against 2.00 ms "
                    "in the profile (1.50x, the pace factor 1.20x): each priced op adds a median "
                    f"{per_op * 1e3:+.1f} us to the pace-anchored prediction")


def test_subnormals_are_priced_where_the_device_measured_their_cost(predictor):
    """With a measured cost, the slow path joins the prediction; "hwlat_flushed" scores the
    prediction without it against the flushed timing."""
    import copy
    import dataclasses

    priced = copy.copy(predictor)
    priced.device = dataclasses.replace(
        predictor.device, peaks={**predictor.device.peaks,
                                 "subnormal": {"reuse_ns": 2.0, "block_ns": 100.0}})
    cases = [EvalCase(spec, SMALL) for spec in SPECS]
    uses = {"torchvision:squeezenet1_1": SubnormalUses(0.05, {"conv": 1e6}, {"eltwise": 1e4}),
            "torchvision:resnet18": SubnormalUses(0.0)}
    kw = dict(measure_fn=lambda *a: timing([0.004] * a[2]),
              subnormal_fn=lambda spec, *a: uses[spec],
              flushed_fn=lambda spec, inputs, runs, *a: timing([0.002] * runs))
    plain = evaluate(None, "dev1", cases, predictor=predictor, **kw)
    report = evaluate(None, "dev1", cases, predictor=priced, **kw)
    squeeze, resnet = report.rows
    assert squeeze.subnormal_ms == pytest.approx(2.0 + 1.0)  # 1e6 x 2 ns + 1e4 x 100 ns
    assert squeeze.predicted_ms == pytest.approx(plain.rows[0].predicted_ms + 3.0)
    assert squeeze.predicted_flushed_ms == pytest.approx(plain.rows[0].predicted_ms)
    assert resnet.subnormal_ms is None and resnet.predicted_ms == plain.rows[1].predicted_ms
    assert report.summary["hwlat_flushed"] == plain.summary["hwlat_flushed"]
    assert report.summary["hwlat"] != plain.summary["hwlat"]
    (note,) = [n for n in report.notes if "subnormal" in n]
    assert "hwlat priced their slow path at 3 ms" in note
    assert json.loads(json.dumps(report.to_json()))["models"][0]["predicted_flushed_ms"] > 0


def test_the_slow_path_is_scaled_from_the_pace_its_cost_was_timed_at(predictor):
    """A cost timed by an evaluation is at that moment's pace: the pace anchor's factor (now /
    the profile's pace) times the profile's pace / the cost's scales it from its own pace."""
    import copy
    import dataclasses

    from predictor.evaluate import Drift, _cost_pace

    priced = copy.copy(predictor)
    priced.device = dataclasses.replace(
        predictor.device, peaks={**predictor.device.peaks, "subnormal": {
            "reuse_ns": 2.0, "block_ns": 100.0, "pace_ms": 2.2}})
    drift = Drift(1.1, 1.05, 1.15, [], (2.2, 2.0))  # now 2.2 ms, the profile's 2.0
    assert _cost_pace(priced, drift) == pytest.approx(2.0 / 2.2)  # k x this = 1: timed now
    assert _cost_pace(priced, None) == 1.0
    assert _cost_pace(predictor, drift) == 1.0  # no cost, or one timed before its pace was
    from profilers.subnormals import measure_cost

    assert measure_cost(threads=1, budget_s=0.2)["pace_ms"] > 0


def test_a_prediction_scaled_to_the_pace_now_keeps_its_parts_consistent():
    """`at_pace`: ops x the factor, the slow path x factor x cost pace, the chain term per priced
    op as its own row; the interval, breakdown and top ops follow, the profile's p50 is kept."""
    from predictor.e2e import CHAIN_TERM, SUBNORMAL_TERM, Prediction
    from predictor.evaluate import PaceNow, at_pace

    pred = Prediction(
        spec="m", device="dev1", latency_ms={"p50": 12.0}, interval_ms=[10.0, 16.0], n_ops=7,
        n_timed_ops=5, flops=1e9, per_family={"conv": 9.0, "op_overhead": -1.0,
                                              SUBNORMAL_TERM: 4.0},
        top_ops=[{"op": "aten.conv2d.default", "ms": 3.0}], unmodelled=[], measured_share=0.5,
        correction={}, sum_ops_ms=9.0, roofline_ms=2.0, subnormal_ms=4.0)
    pred.unmodelled = [{"op": "aten.foo", "count": 1, "estimated_ms": 1.0, "share": 1 / 12}]
    now = PaceNow(factor=2.0, pace_now_ms=4.0, pace_then_ms=2.0, chain_now_ms=3.0,
                  chain_then_ms=1.0, per_op_ms=0.1, cost_pace=0.5)
    p = at_pace(pred, now)
    # ops 8 ms x 2 = 16, slow path 4 x 2 x 0.5 = 4, chain 0.1 x 5 ops = 0.5
    assert p.p50_ms == pytest.approx(20.5) and p.subnormal_ms == pytest.approx(4.0)
    assert p.per_family == pytest.approx({"conv": 18.0, "op_overhead": -2.0, SUBNORMAL_TERM: 4.0,
                                          CHAIN_TERM: 0.5})
    assert sum(p.per_family.values()) == pytest.approx(p.p50_ms)
    lo, hi = Predictor.SUBNORMAL_BAND  # the slow path keeps its own band
    assert p.interval_ms == pytest.approx([2 * (10 - 4 * lo) + 4 * lo + 0.5,
                                           2 * (16 - 4 * hi) + 4 * hi + 0.5])
    assert p.top_ops[0]["ms"] == 6.0 and pred.top_ops[0]["ms"] == 3.0  # the original unchanged
    assert p.unmodelled[0]["estimated_ms"] == 2.0 and p.unmodelled[0]["share"] == 2.0 / 20.5
    assert p.anchor["kind"] == "pace" and p.anchor["factor"] == 2.0 and pred.anchor is None
    assert "x2.000" in p.notes[-1] and "as profiled: 12 ms" in p.notes[-1]
    assert at_pace(pred, PaceNow(1.0, 2.0, 2.0, None, None, None)).p50_ms == pytest.approx(12.0)
    with pytest.raises(ValueError, match="already scaled"):
        at_pace(p, now)
    # the pace moved 3-6 ms while probing, in a slow spell: said, and kept in the anchor; the
    # interval is only scaled (the profile's repeat spread holds the machine's moves)
    moved = at_pace(pred, replace(now, pace_low_ms=3.0, pace_high_ms=6.0, rounds=9,
                                  slow_rounds=2))
    assert moved.interval_ms == pytest.approx(p.interval_ms) and moved.p50_ms == p.p50_ms
    assert ("2 of 9 rounds ran in a slow spell (the probe ran 3.00-6.00 ms, 10th-90th "
            "percentile of every round)") in moved.notes[-1]
    assert moved.anchor["pace_low_ms"] == 3.0 and "the probe ran" not in p.notes[-1]
    # weighted: the factor 2 three quarters of the way in log (2 ** 0.75), the chain term x 0.75
    part = at_pace(pred, replace(now, weight=0.75))
    k = 2 ** 0.75
    assert part.p50_ms == pytest.approx(k * 8 + k * 4 * 0.5 + 0.75 * 0.5)
    assert part.per_family[CHAIN_TERM] == pytest.approx(0.375)
    assert sum(part.per_family.values()) == pytest.approx(part.p50_ms)
    assert part.anchor["scale"] == pytest.approx(k) and part.anchor["factor"] == 2.0
    assert "(x2.000; its ops x1.682, 0.75 of the way in log" in part.notes[-1]
    assert "+75.0 us added per priced op (0.75 of +100.0)" in part.notes[-1]
    assert "(x2.000; applied to its ops)" in p.notes[-1] and "of the way" not in p.notes[-1]
    assert "+100.0 us added per priced op" in p.notes[-1]


def test_pace_now_sets_the_probes_here_against_the_profiles(predictor, tmp_path, monkeypatch):
    from predictor.evaluate import PACE_WEIGHT, pace_now
    from profilers import pace

    monkeypatch.setattr(pace, "probe", lambda: lambda: 0.006)  # 6 ms now, 1.5x the profile's
    monkeypatch.setattr(pace, "chain_probe", lambda: lambda: 0.003)
    with KernelDB.open(tmp_path / "paced.db") as db:
        db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, peaks=PEAKS)
        assert pace_now(predictor, db.model_measurements("dev1")) is None  # nothing probed then
        for i in range(6):
            db.add_model_measurement("dev1", f"m{i}", "f", {}, [0.002] * 3,
                                     stats={"pace_s": 0.004, "chain_s": 0.0015})
        now = pace_now(predictor, db.model_measurements("dev1"), window_s=0.01)
    assert now.factor == pytest.approx(1.5)
    assert (now.pace_now_ms, now.pace_then_ms) == pytest.approx((6.0, 4.0))
    # the chain ran 3 ms against 1.5 x its 1.5 ms then: 0.75 ms over its ops
    assert now.per_op_ms == pytest.approx(0.75 / pace.CHAIN_OPS)
    assert (now.chain_now_ms, now.chain_then_ms) == pytest.approx((3.0, 1.5))
    assert now.cost_pace == 1.0 and now.weight == PACE_WEIGHT and now.scale < now.factor
    # a slow spell over three of five rounds (12 ms, 2x the others) is left out, its chain
    # timings too: the median of all would be 12 and 9 ms
    paces = iter([0.006] * 2 + [0.012] * 6 + [0.006] * 2)
    chains = iter([0.003] * 2 + [0.009] * 6 + [0.003] * 2)
    monkeypatch.setattr(pace, "probe", lambda: lambda: next(paces))
    monkeypatch.setattr(pace, "chain_probe", lambda: lambda: next(chains))
    with KernelDB.open(tmp_path / "paced.db") as db:
        spelled = pace_now(predictor, db.model_measurements("dev1"), window_s=0)  # 5 rounds
    assert spelled.pace_now_ms == pytest.approx(6.0)
    assert spelled.chain_now_ms == pytest.approx(3.0)
    assert (spelled.rounds, spelled.slow_rounds) == (5, 3) and now.slow_rounds == 0
    # the percentiles span every round, the slow ones too: 6 to 12 ms
    assert (spelled.pace_low_ms, spelled.pace_high_ms) == pytest.approx((6.0, 12.0))
    assert (now.pace_low_ms, now.pace_high_ms) == pytest.approx((6.0, 6.0))
    assert "3 of 5 rounds ran in a slow spell" in spelled.summary()


def test_an_interrupted_evaluation_resumes_with_the_timings_it_had_made(predictor, tmp_path):
    cases = [EvalCase(spec, SMALL) for spec in SPECS]
    shares = {"torchvision:squeezenet1_1": 0.044, "torchvision:resnet18": 0.0}
    calls = []

    def measure(spec, inputs, runs, warmup, threads, device, dtype, stop_after=None):
        if stop_after is not None and len(calls) == stop_after:
            raise KeyboardInterrupt
        calls.append(spec)  # each timing a little different, so a re-timed one would show
        return timing([0.003 + 1e-4 * len(calls)] * runs, pace_s=2e-3 + 1e-5 * len(calls))

    def run(journal, stop_after=None):
        return evaluate(None, "dev1", cases, predictor=predictor, runs=30, anchor="pace",
                        measure_fn=lambda *a: measure(*a, stop_after=stop_after),
                        subnormal_fn=lambda spec, *a: SubnormalUses(shares[spec]),
                        flushed_fn=lambda *a: timing([0.002] * a[2]), journal=journal)

    def journal(**kw):
        return EvalJournal.for_evaluation("dev1", cases, runs=30, warmup=5, rounds=3,
                                          anchor="pace", directory=tmp_path, **kw)

    whole = run(None)
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        run(journal(), stop_after=4)  # two of the three rounds timed
    (path,) = tmp_path.iterdir()
    with open(path, "a") as f:
        f.write('{"what": ["round", 0, 2], "measurement": tr')  # cut off mid-line
    resumed = journal()
    assert "4 timed round(s) kept" in resumed.resumed()
    report = run(resumed)
    assert calls == [*SPECS, *SPECS, *SPECS]  # the two left, not the four kept
    assert [r.measured_rounds_ms for r in report.rows] == [r.measured_rounds_ms for r in whole.rows]
    assert [r.round_pace_ms for r in report.rows] == [r.round_pace_ms for r in whole.rows]
    assert report.summary == whole.summary
    assert not path.exists()  # finished: nothing left to resume
    # another evaluation's journal, or an old one, is started over
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        run(journal(), stop_after=2)
    assert journal(fresh=True).resumed() is None
    other = EvalJournal.for_evaluation("dev1", cases, runs=20, warmup=5, rounds=3, anchor="pace",
                                       directory=tmp_path)
    assert other.resumed() is None and other.path != path
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        run(journal(), stop_after=2)
    assert EvalJournal(path, journal().key, max_age_s=0).resumed() is None


def test_a_journals_references_of_another_profile_are_timed_again(predictor, tmp_path):
    """quickstart profiles before its check: the references it picks may change in between."""
    cases = [EvalCase("torchvision:shufflenet_v2_x0_5", SMALL)]
    order = []

    def measure(spec, *a):
        order.append(spec)
        return timing([0.004] * 3)

    journal = EvalJournal.for_evaluation("dev1", cases, runs=30, warmup=5, rounds=3,
                                         anchor="session", directory=tmp_path)
    journal.add([{"spec": "torchvision:alexnet", "inputs": list(SMALL), "then_ms": 1.0,
                  "now_ms": 1.0, "contended": False}], "references", "before")
    report = evaluate(None, "dev1", cases, predictor=predictor, measure_fn=measure,
                      anchor="session", journal=journal)
    refs = ["torchvision:squeezenet1_1", "torchvision:resnet18"]
    assert order[:2] == refs and order[-2:] == refs  # re-timed before, and after as always
    assert [r["spec"] for r in report.drift.references] == refs


def test_a_cut_off_line_costs_no_later_timing_and_an_unwritable_journal_is_said(tmp_path):
    key = {"device": "dev1"}
    path = tmp_path / "j.jsonl"
    EvalJournal(path, key).add(timing([1.0]), "round", 0, 0)
    with open(path, "a") as f:
        f.write('{"what": ["round", 0, 1], "measur')  # the interruption, mid-line
    EvalJournal(path, key).add(timing([2.0]), "round", 0, 1)  # resumed once, timed again
    again = EvalJournal(path, key)  # resumed a second time
    assert again.get("round", 0, 0).median_s == 1.0 and again.get("round", 0, 1).median_s == 2.0
    (tmp_path / "file").write_text("not a folder")
    nowhere = EvalJournal(tmp_path / "file" / "j.jsonl", key)
    assert "cannot keep timings" in nowhere.unwritable
    nowhere.add(timing([3.0]), "round", 0, 0)  # kept in memory, the evaluation goes on
    assert nowhere.get("round", 0, 0).median_s == 3.0
    nowhere.finish()
