"""`hwlat profile` as a user runs it: covers the zoo, survives SIGKILL, shares a db with itself."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from profilers.ops import is_free

REPO = Path(__file__).resolve().parents[1]
QUICK = ["--models", "torchvision:squeezenet1_1", "--batch", "1", "--random-per-family", "3",
         "--threads", "1"]


@pytest.fixture(autouse=True)
def _no_neighbours(monkeypatch):
    """In-process profiles here read their op timings as unmetered, whatever else this machine
    runs: the tests of contention fake their readings."""
    from kernels_db import build

    class Unknown:
        def stop(self):
            return None

    monkeypatch.setattr(build, "Meter", Unknown)


def _hwlat(db: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "hwlat", "--db", str(db), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _measured(db: Path) -> dict[str, bytes]:
    """Every measurement's raw samples by (config key, measurement uid)."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT c.key, m.uid, m.samples FROM measurements m "
                           "JOIN op_configs c ON c.id = m.config_id").fetchall()
    finally:
        con.close()
    return {(k, u): s for k, u, s in rows}


def _count(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        con = sqlite3.connect(db, timeout=30)
        try:
            return con.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
        finally:
            con.close()
    except sqlite3.OperationalError:
        return 0  # schema not created yet


def test_kill_9_then_resume_loses_nothing(tmp_path):
    db = tmp_path / "k.db"
    proc = _hwlat(db, "profile", "--budget", "120s", "--no-e2e", *QUICK, "--json")
    deadline = time.monotonic() + 90
    while _count(db) < 15 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _measured(db)
    assert len(before) >= 15

    again = _hwlat(db, "profile", "--budget", "25s", "--no-e2e", *QUICK, "--json")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    report = json.loads(out)
    after = _measured(db)
    # nothing measured before the kill is lost or changed, and the second run added more
    assert all(after.get(k) == v for k, v in before.items())
    assert len(after) > len(before)
    assert report["zoo_measured"] == report["zoo_configs"] > 0
    # zoo configs are timed again at the end, once, and so are configs timed beside other work
    # (the test suite's own neighbours can cause those), never a third time
    counts = Counter(k for k, _ in after)
    twice = [k for k, n in counts.items() if n == 2]
    assert max(counts.values()) <= 2
    assert len(twice) <= report["zoo_configs"] + report["ops_retimed_now"]


def test_two_concurrent_runs_split_the_work(tmp_path):
    db = tmp_path / "k.db"
    first = _hwlat(db, "profile", "--budget", "30s", "--no-e2e", *QUICK, "--json")
    time.sleep(1.0)
    second = _hwlat(db, "profile", "--budget", "30s", "--no-e2e", *QUICK, "--json")
    results = [p.communicate(timeout=150) for p in (first, second)]
    assert first.returncode == 0, results[0][1]
    assert second.returncode == 0, results[1][1]
    reports = [json.loads(out) for out, _ in results]
    measured = _measured(db)
    counts = Counter(k for k, _ in measured)  # a zoo config's second timing is one run's
    assert max(counts.values()) <= 2, "two runs measured the same config"
    assert sum(r["measured_now"] + r["zoo_retimed_now"] + r["ops_retimed_now"]
               for r in reports) == len(measured)  # each sees the other: contended op timings
    assert reports[1]["zoo_measured"] == reports[1]["zoo_configs"]


def test_unknown_training_model_is_a_one_line_error(tmp_path):
    proc = _hwlat(tmp_path / "k.db", "profile", "--budget", "10s", "--models", "torchvision:nope")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert err.strip().count("\n") == 0 and "training zoo" in err


@pytest.mark.parametrize("budget", ["0s", "-5m", "ten"])
def test_bad_budget_is_bad_usage(tmp_path, budget):
    from click.testing import CliRunner

    from hwlat.cli import cli

    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "k.db"), "profile", "--budget", budget])
    assert result.exit_code == 2
    assert "--budget" in result.output


def test_zoo_models_are_timed_at_the_start_and_again_at_the_end(tmp_path, monkeypatch):
    """Two passes per setting, the second after the op sampling, which runs with the second
    pass's time kept back, and the weight stream timed again before it; a resumed run adds
    nothing; without fresh processes, one pass."""
    from kernels_db import build
    from kernels_db.store import KernelDB
    from profilers import isolate, modelbench

    log: list[str] = []

    def fake_forward(spec, inputs, **kw):
        log.append(f"model {inputs[0]}")
        return forward_timing([0.01 + 0.001 * len(log)] * 5)

    def fake_configs(db, device_id, run_id, settings, deadline, *args, **kw):
        log.append(f"configs {deadline.reserved_s > 0}")
        return 0

    def fake_stream(db, device_id, device, threads):
        log.append("stream")
        return 20.0

    monkeypatch.setattr(modelbench, "time_forward_isolated", fake_forward)
    monkeypatch.setattr(build, "measure_configs", fake_configs)
    monkeypatch.setattr(build, "retime_stream", fake_stream)
    settings = build.ProfileSettings(threads=1, budget_s=600, models=("torchvision:squeezenet1_1",),
                                     batches=(1,), random_per_family=1)
    with KernelDB.open(tmp_path / "k.db") as db:
        report = build.profile_device(db, settings)
        rows = db.model_measurements(report.device_id, kind="e2e")
        assert report.models_measured_now == 4 and len(rows) == 4 and report.models_untimed == 0
        assert log[:3] == ["model 1x3x224x224", "model 1x3x160x160", "configs True"]
        assert log[-3:] == ["stream", "model 1x3x224x224", "model 1x3x160x160"]
        assert set(log[2:-3]) == {"configs True"} and report.stream_gbps_now == 20.0
        again = build.profile_device(db, settings)
        assert again.models_measured_now == 0 and "configs False" in log  # nothing to keep back
    monkeypatch.setattr(isolate, "enabled", lambda: False)
    log.clear()
    with KernelDB.open(tmp_path / "single.db") as db:
        report = build.profile_device(db, settings)
    assert report.models_measured_now == 2
    assert [e.split()[0] for e in log] == ["model", "model"] + ["configs"] * (len(log) - 3) + [
        "stream"]


def forward_timing(samples, threads=1, **kw):
    """What `time_forward_isolated` returns: a Measurement (kw: cpu_use)."""
    from profilers.timer import Measurement

    return Measurement(samples_s=tuple(samples), warmup=2, threads=threads, flushed=False,
                       device="cpu", stopped_by="stable", **kw)


def test_a_timing_beside_other_work_does_not_count_and_is_timed_again_first(tmp_path,
                                                                           monkeypatch):
    """A setting timed while other processes shared the cores (profilers.contention) stays
    pending: the second pass times it before the others, and the report says how many."""
    from kernels_db import build
    from kernels_db.store import KernelDB
    from profilers import isolate, modelbench
    from profilers.contention import CpuUse

    monkeypatch.setattr(isolate, "enabled", lambda: True)
    log: list[str] = []

    def fake_forward(spec, inputs, **kw):
        log.append(inputs[0])
        busy = 1.6 if len(log) == 2 else 0.02  # a neighbour on the free core and on ours
        return forward_timing([0.01] * 5, cpu_use=CpuUse(busy, 2, 1.0))

    monkeypatch.setattr(modelbench, "time_forward_isolated", fake_forward)
    monkeypatch.setattr(build, "measure_configs", lambda *a, **kw: 0)
    settings = build.ProfileSettings(threads=1, budget_s=600, models=("torchvision:squeezenet1_1",),
                                     batches=(1,), random_per_family=1)
    with KernelDB.open(tmp_path / "k.db") as db:
        report = build.profile_device(db, settings)
        rows = db.model_measurements(report.device_id, kind="e2e")
    assert log == ["1x3x224x224", "1x3x160x160", "1x3x160x160", "1x3x224x224"]
    assert [r.contended for r in rows] == [False, True, False, False]
    assert rows[1].stats == {"others_cores": 1.6, "cpus": 2, "window_s": 1.0}
    assert report.models_contended_now == 1 and report.others_cores_max == 1.6
    assert report.models_untimed == 1  # the 160 px setting has one timing that counts


def test_a_timing_in_a_slow_spell_does_not_count_and_is_timed_again_first(tmp_path,
                                                                          monkeypatch):
    """A timing whose probe ran 1.8x the device's usual pace (profilers.pace: a slow spell no
    CPU accounting sees) stays pending like a contended one: the second pass times its setting
    before the others, its pace is stored, and the report counts it."""
    from kernels_db import build
    from kernels_db.store import KernelDB, quiet_ids
    from profilers import isolate, modelbench

    monkeypatch.setattr(isolate, "enabled", lambda: True)
    log: list[str] = []

    def fake_forward(spec, inputs, **kw):
        log.append(f"{spec} {inputs[0]}")
        return forward_timing([0.01] * 5, pace_s=0.009 if len(log) == 3 else 0.005,
                              chain_s=0.002)

    monkeypatch.setattr(modelbench, "time_forward_isolated", fake_forward)
    monkeypatch.setattr(build, "measure_configs", lambda *a, **kw: 0)
    settings = build.ProfileSettings(
        threads=1, budget_s=600, models=("torchvision:squeezenet1_1", "torchvision:resnet18"),
        batches=(1, 8), random_per_family=1)
    with KernelDB.open(tmp_path / "k.db") as db:
        report = build.profile_device(db, settings)
        rows = db.model_measurements(report.device_id, kind="e2e")
    assert len(log) == 16 and log[8] == log[2]  # 8 settings, each twice; the slow one first
    assert [r.pace_s for r in rows[:3]] == [0.005, 0.005, 0.009]
    assert {r.chain_s for r in rows} == {0.002}  # kept beside it, for the evaluation's anchor
    assert quiet_ids(rows) == {r.id for r in rows} - {rows[2].id}
    assert report.models_slow_now == 1 and report.models_contended_now == 0
    assert report.models_untimed == 1  # its setting has one timing that counts


def test_the_usual_pace_is_a_low_quantile_and_a_slow_spell_is_well_above_it():
    from profilers import pace

    paces = {i: p for i, p in enumerate([5.0, 5.2, 5.1, 7.4, 5.5, None, 9.8, 5.3])}
    assert pace.usual_pace(paces.values()) == pytest.approx(5.15)  # 25th of the 7 known
    assert pace.slow_ids(paces) == {3, 6}  # >= 1.2 x 5.15
    assert pace.slow_ids({i: paces[i] for i in range(4)}) == set()  # too few to know the usual


def test_op_timings_beside_other_work_are_flagged_and_timed_again(tmp_path, monkeypatch):
    """Op timings are metered in windows long enough for the kernel's ticks (the first window
    here is too short, so it takes in the second timing too); timings taken while others shared
    the cores are recorded as such, a config timed once that way is timed a second time (at
    the end of the run, before the zoo's re-timing) but never a third, and the report says so."""
    from types import SimpleNamespace

    from kernels_db import build
    from kernels_db.store import KernelDB
    from profilers.contention import CpuUse

    clock, timed = [0.0], []

    def fake_measure(record, device, flusher, threads):
        clock[0] += 1.0
        timed.append(record.key)
        return SimpleNamespace(samples_s=[1e-5] * 3, is_noisy=False), None

    class FakeMeter:  # a neighbour on the other of 2 CPUs whenever the first four are timed
        def stop(self):
            if len(timed) == 1:
                return None
            return CpuUse(1.0 if timed[-1] in timed[:4] else 0.01, 2, 1.0)

    monkeypatch.setattr(build, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(build, "_measure_config", fake_measure)
    monkeypatch.setattr(build, "Meter", FakeMeter)
    settings = build.ProfileSettings(threads=1, budget_s=120, models=("torchvision:resnet18",),
                                     batches=(1,), e2e=False, random_per_family=3)
    with KernelDB.open(tmp_path / "k.db") as db:
        report = build.profile_device(db, settings)
        first = {c.key: c.id for c in db.configs(report.device_id)}
        flagged = [db.samples(first[k]) for k in timed[:4]]
    assert report.ops_contended_now == 8 and report.ops_others_cores_max == 1.0
    assert report.ops_retimed_now == 4
    assert [len(s) for s in flagged] == [6, 6, 6, 6]  # timed twice: 3 samples each time
    assert [Counter(timed)[k] for k in timed[:4]] == [2, 2, 2, 2]  # never a third time
    assert timed[-report.zoo_retimed_now - 4:len(timed) - report.zoo_retimed_now] == timed[:4]


def _additions(db, n: int) -> tuple[dict[str, int], str]:
    """Device "d" with `n` add configs k0..k{n-1} and a run: (config ids by key, the run)."""
    db.upsert_device({"cpu": "test"}, device_id="d", kind="cpu", threads=1)
    db.add_configs("d", [(f"k{i}", "aten.add.Tensor", "eltwise", "float32", "random",
                          {"op": "aten.add.Tensor", "i": i}) for i in range(n)])
    return ({c.key: c.id for c in db.configs("d")},
            db.start_run("d", budget_s=None, settings={}))


def test_the_op_timings_flagged_are_recorded_with_their_reading(tmp_path):
    """The reading goes into each timing's telemetry beside what is there (a GPU's NVML
    snapshots); the configs timed once, beside other work, are claimed for a second timing."""
    from kernels_db.store import KernelDB
    from profilers.contention import CpuUse

    with KernelDB.open(tmp_path / "k.db") as db:
        ids, run = _additions(db, 3)
        m = [db.add_measurement(ids[k], run, [1e-5], flushed=True, threads=1, noisy=False,
                                telemetry={"throttled": False} if k == "k0" else None)
             for k in ("k0", "k1", "k2", "k1")]
        db.annotate_cpu_use(m[:3], CpuUse(0.9, 2, 0.5), threads=1)
        db.annotate_cpu_use(m[3:], CpuUse(0.0, 2, 0.3), threads=1)
        telemetry = json.loads(db._query("SELECT telemetry_json FROM measurements WHERE id = ?",
                                         (m[0],))[0]["telemetry_json"])
        assert telemetry == {"throttled": False, "cpu_use": {
            "others_cores": 0.9, "cpus": 2, "window_s": 0.5, "contended": True}}
        assert db.run_contention(run) == (3, 0.9)
        assert db.claim_unmeasured("d", run, 10, contended=True, earlier_than=run) == []
        later = db.start_run("d", budget_s=None, settings={})
        claimed = db.claim_unmeasured("d", later, 10, contended=True, earlier_than=later)
        assert [c.key for c in claimed] == ["k0", "k2"]  # k1 has a quiet timing
        assert db.claim_unmeasured("d", run, 10, contended=True) == []  # claimed already


def test_a_last_window_too_short_to_meter_still_gets_its_pace(tmp_path, monkeypatch):
    """Its CPU use stays unknown, but every timing of a finished call carries a pace: a
    concurrent run's re-timing counted one without it as unpaired and timed the config a third
    time (test_two_concurrent_runs_split_the_work, once)."""
    from kernels_db import build
    from kernels_db.store import KernelDB

    paces = iter([2.0, 8.0])  # ms: the probe before the window and after it

    class Meter:  # every window too short for the kernel's ticks
        def stop(self):
            return None

    def time_config(db, row, run_id, settings, flusher, threads, metered):
        metered.timed(db.add_measurement(row.id, run_id, [1e-3], flushed=True, threads=1,
                                         noisy=False))
        return True

    monkeypatch.setattr(build, "Meter", Meter)
    monkeypatch.setattr(build, "window_probe", lambda device: lambda: next(paces) * 1e-3)
    monkeypatch.setattr(build, "_time_config", time_config)
    with KernelDB.open(tmp_path / "k.db") as db:
        ids, run = _additions(db, 2)
        done = build.measure_configs(db, "d", run, build.ProfileSettings(), build._Deadline(60),
                                     None, 1)
        assert done == 2
        assert [r.pace_s for r in db.measured("d")] == pytest.approx([4e-3, 4e-3])
        assert db.run_contention(run) == (0, None)  # no reading: their CPU use unknown
        other = db.start_run("d", budget_s=None, settings={})
        db.add_measurement(ids["k0"], other, [1e-3], flushed=True, threads=1, noisy=False)
        db.finish_run(run)
        later = db.start_run("d", budget_s=None, settings={})
        # k0 has two timings, both paced (the other run's as its own: still running); k1 one
        assert [c.key for c in db.claim_unmeasured("d", later, 10, below=2, paced=True)] == ["k1"]


def test_each_metering_window_gets_the_pace_around_it_and_timings_are_brought_to_the_usual(
        tmp_path, monkeypatch):
    """A VM flapping between two speeds: the probe between windows reads each window's pace,
    and the training rows come back at the usual (fast) pace."""
    from kernels_db import build
    from kernels_db.store import KernelDB, at_usual_pace, pace_exponents
    from profilers import contention

    paces = iter([2.0, 2.0, 2.0, 2.0, 4.5, 4.5, 2.0, 2.0])  # ms: a slow spell around window 4

    class Meter:  # one window per timing, metered at once
        def stop(self):
            return contention.CpuUse(0.0, 2, 0.3)

    with KernelDB.open(tmp_path / "k.db") as db:
        ids, run = _additions(db, 7)
        monkeypatch.setattr(build, "Meter", Meter)
        metered = build._Metered(db, 1, probe=lambda: next(paces) * 1e-3)
        for i in range(7):  # each config 1 ms at the fast pace, as much slower as the pace
            slow = 2.25 if i == 4 else (1.5 if i in (3, 5) else 1.0)
            metered.timed(db.add_measurement(ids[f"k{i}"], run, [1e-3 * slow], flushed=True,
                                             threads=1, noisy=False))
        rows = {r.key: r for r in db.measured("d")}
        # each window between its two probes: sqrt(before x after)
        assert [rows[f"k{i}"].pace_s * 1e3 for i in range(7)] == pytest.approx(
            [2.0, 2.0, 2.0, 3.0, 4.5, 3.0, 2.0])
        follows = {"*": 1.0}  # these timings follow the pace whole
        usual = {r.key: r.median_s for r in at_usual_pace(list(rows.values()), follows)}
        assert [usual[f"k{i}"] * 1e3 for i in range(7)] == pytest.approx([1.0] * 7)
        half = {r.key: r.median_s for r in at_usual_pace(list(rows.values()), {"eltwise": 0.5})}
        assert half["k4"] * 1e3 == pytest.approx(2.25 * (2.0 / 4.5) ** 0.5)
        assert at_usual_pace(list(rows.values()), {}) == list(rows.values())  # exponent 0
        # a config timed without a probe (an older profile) keeps its median
        db.add_configs("d", [("old", "aten.add.Tensor", "eltwise", "float32", "random",
                              {"op": "aten.add.Tensor", "i": 99})])
        db.add_measurement(db.config_ids("d")["old"], run, [3e-3], flushed=True, threads=1,
                           noisy=False)
        kept = {r.key: r.median_s for r in at_usual_pace(db.measured("d"), follows)}
        assert kept["old"] == 3e-3 and kept["k4"] == pytest.approx(1e-3)
        # too few paces to say what is usual: nothing is moved
        few = [r for r in db.measured("d") if r.key in ("k0", "k4", "old")]
        assert [r.median_s for r in at_usual_pace(few, follows)] == [r.median_s for r in few]
        # each config timed once: no pairs, so no exponent, and nothing moved
        assert db.paced_pairs("d") == {} and pace_exponents({}) == {"*": 0.0}
        assert db.measured_at_usual_pace("d") == db.measured("d")


def test_each_family_follows_the_pace_as_far_as_its_configs_timed_twice_did():
    import math

    from kernels_db.store import PACE_MIN_PAIRS, pace_exponents

    rng = __import__("random").Random(0)
    steps = [math.log(rng.uniform(0.6, 1.7)) for _ in range(PACE_MIN_PAIRS)]
    pairs = {"conv": [(x, 0.8 * x + rng.gauss(0, 0.01)) for x in steps],
             "data": [(x, 0.4 * x + rng.gauss(0, 0.01)) for x in steps],
             "matmul": [(x, 0.4 * x) for x in steps[:3]]}  # too few pairs of its own
    k = pace_exponents(pairs)
    assert k["conv"] == pytest.approx(0.8, abs=0.02) and k["data"] == pytest.approx(0.4, abs=0.02)
    assert k["matmul"] == k["*"] == pytest.approx(0.6, abs=0.03)  # all pairs' slope
    assert pace_exponents({"x": [(x, -x) for x in steps]})["x"] == 0.0  # never the wrong way
    assert pace_exponents({"x": [(x, 9 * x) for x in steps]})["x"] == 1.5  # nor past 1.5


def test_end_to_end_passes_go_round_the_models(tmp_path):
    """A pass cut short must not leave out the zoo's last models whole (those then got only a
    second-pass timing, in a slow spell, and skewed the correction)."""
    from kernels_db import build
    from kernels_db.store import KernelDB

    settings = build.ProfileSettings(threads=1, batches=(1, 8),
                                     models=("torchvision:squeezenet1_1", "torchvision:resnet18"))
    with KernelDB.open(tmp_path / "k.db") as db:
        db.upsert_device({"t": 1}, device_id="d", kind="cpu", threads=1)
        pending = build.pending_models(db, "d", settings, 1, below=1)
        specs = [case.spec for case, _, _ in pending]
        assert len(specs) == 8 and len(set(specs[:2])) == 2
        assert specs == specs[:2] * 4  # every model's first setting, then every model's second...
        first, dtype, key = pending[0]
        db.add_model_measurement("d", first.spec, first.family, key, [0.01] * 3)
        again = build.pending_models(db, "d", settings, 1, below=2)
        assert again[-1][0] == first and again[-1][2] == key  # the least measured first


def test_a_setting_that_cannot_finish_before_the_deadline_is_left_for_the_next_run(
        tmp_path, monkeypatch):
    """A setting is skipped when its start-up, warm-up and fewest runs at its earlier pace take
    longer than the time left (a 10-minute profile ran 12 s over on convnext_tiny at batch 8);
    the ones after it that fit are still timed, and the skipped one waits for a resumed run."""
    from types import SimpleNamespace

    from kernels_db import build
    from kernels_db.store import KernelDB
    from profilers import modelbench

    clock = [0.0]
    monkeypatch.setattr(build, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    pace = {"1x3x224x224": 0.5, "1x3x160x160": 4.0, "8x3x224x224": 0.6,
            "8x3x160x160": 0.3}  # seconds a forward pass, in the order they are timed

    def fake_forward(spec, inputs, **kw):
        clock[0] += 2.0 + 5 * pace[inputs[0]]  # start-up, 2 warm-up runs, 3 timed (time cap)
        return forward_timing([pace[inputs[0]]] * 3)

    monkeypatch.setattr(modelbench, "time_forward_isolated", fake_forward)
    settings = build.ProfileSettings(threads=1, models=("torchvision:squeezenet1_1",),
                                     batches=(1, 8))

    def timed_pass(db, pass_no, budget_s):
        deadline = build._Deadline(budget_s)
        done = build.measure_models(db, "d", None, settings, deadline, 1, share_s=budget_s,
                                    pass_no=pass_no)
        assert deadline.left() >= 0
        return done, Counter(m.settings["inputs"][0]
                             for m in db.model_measurements("d", kind="e2e"))

    with KernelDB.open(tmp_path / "k.db") as db:
        db.upsert_device({"t": 1}, device_id="d", kind="cpu", threads=1)
        assert timed_pass(db, 1, 600)[0] == 4
        # 15 s: 1x224 takes 4.5; 1x160 needs 2 + 5 x 4 s > 10.5 left; 8x224 (5 s) and 8x160
        # (3.5 s) fit after it
        assert timed_pass(db, 2, 15) == (3, {"1x3x224x224": 2, "1x3x160x160": 1,
                                             "8x3x224x224": 2, "8x3x160x160": 2})
        waiting = build.pending_models(db, "d", settings, 1, below=2)
        assert [key["inputs"] for _, _, key in waiting] == [["1x3x160x160"]]
        # 8.5 s: 1x160 skipped again, 1x224 timed (4.5 s); 8x224's 3 s of forward passes would
        # fit the 4 s left, but not with the 2 s start-up 1x224 showed; 8x160 (3.5 s) does
        assert timed_pass(db, 3, 8.5) == (2, {"1x3x224x224": 3, "1x3x160x160": 1,
                                              "8x3x224x224": 2, "8x3x160x160": 3})
        db.upsert_device({"t": 2}, device_id="new", kind="cpu", threads=1)
        never_timed = build.measure_models(db, "new", None, settings, build._Deadline(2.9), 1,
                                           share_s=2.9)
        assert never_timed == 0  # under least_setting_s(None) = 3 s left: nothing started


def test_settings_timed_in_a_moved_checkout_are_not_timed_again(tmp_path):
    from kernels_db import build
    from kernels_db.store import KernelDB

    settings = build.ProfileSettings(threads=1, batches=(1,),
                                     models=("models.py:transformer_encoder",))
    with KernelDB.open(tmp_path / "k.db") as db:
        db.upsert_device({"t": 1}, device_id="d", kind="cpu", threads=1)
        pending = build.pending_models(db, "d", settings, 1, below=1)
        assert pending and pending[0][0].spec.endswith("/data/models.py:transformer_encoder")
        for case, _, key in pending:  # timed where the checkout used to be
            db.add_model_measurement("d", "/old/checkout/data/models.py:transformer_encoder",
                                     case.family, key, [0.01] * 3)
        assert build.pending_models(db, "d", settings, 1, below=1) == []


def test_second_pass_keeps_what_the_first_left_and_never_nothing():
    from kernels_db.build import SECOND_PASS_MIN, second_pass_reserve

    # first pass done in 40 s of a 100 s share, 20 settings at 2 s each: 30 waiting take 60 s
    assert second_pass_reserve(100, 40, 20, 999, 30) == pytest.approx(60)
    assert second_pass_reserve(100, 40, 20, 999, 10) == pytest.approx(20)  # no more than needed
    # the first pass used the whole share (and overran it): the second still gets its minimum
    assert second_pass_reserve(100, 104, 52, 999, 59) == pytest.approx(SECOND_PASS_MIN * 100)
    assert second_pass_reserve(100, 104, 52, 0, 0) == 0  # nothing waiting
    # a resumed run whose first pass had nothing to time: what the waiting settings need
    assert second_pass_reserve(100, 0, 0, 13.5, 1) == pytest.approx(13.5)


def test_the_least_a_setting_takes_is_its_start_up_warm_up_and_fewest_runs():
    from kernels_db.build import least_setting_s

    assert least_setting_s(2.5, start_s=1.2) == pytest.approx(1.2 + 5 * 2.5)  # 2 warm-up + 3
    assert least_setting_s(None) == 3.0  # never timed


def test_a_budget_the_zoo_fills_reports_what_is_left(tmp_path, monkeypatch):
    """On a slow machine the zoo's configs (timed first) can take the whole budget: the report
    counts the configs still untimed, per source, for the next run."""
    from types import SimpleNamespace

    from kernels_db import build
    from kernels_db.store import KernelDB

    clock = [0.0]  # a fake clock: each config takes one second
    monkeypatch.setattr(build, "time", SimpleNamespace(monotonic=lambda: clock[0]))

    def fake_measure(record, device, flusher, threads):
        clock[0] += 1.0
        return SimpleNamespace(samples_s=[1e-5] * 3, is_noisy=False), None

    monkeypatch.setattr(build, "_measure_config", fake_measure)
    settings = build.ProfileSettings(threads=1, budget_s=40, models=("torchvision:resnet18",),
                                     batches=(1,), e2e=False, random_per_family=3)
    with KernelDB.open(tmp_path / "k.db") as db:
        report = build.profile_device(db, settings)
        timed = Counter(c.source for c in db.configs(report.device_id) if db.samples(c.id))
        planned = Counter(c.source for c in db.configs(report.device_id))
    assert report.zoo_configs > 40 and timed["zoo"] == report.zoo_measured == report.measured_now
    assert report.untimed == {source: planned[source] - timed[source] for source in planned}
    assert report.untimed["random"] == planned["random"] > 0


def test_the_untimed_line_names_op_configs_and_model_settings_left():
    from hwlat.commands.profile import untimed_line
    from kernels_db.build import ProfileReport

    report = ProfileReport("d", "r", untimed={"zoo": 3, "random": 40}, models_untimed=2)
    line = untimed_line(report)
    assert line.startswith("43 planned op configs (40 random, 3 zoo) and 2 end-to-end model "
                           "settings are not timed yet;") and "hwlat profile` again" in line
    assert untimed_line(replace(report, untimed={})).startswith("2 end-to-end model settings")
    assert untimed_line(replace(report, untimed={}, models_untimed=0)) is None


def test_the_contended_line_counts_timings_beside_other_work_and_says_what_to_do():
    from hwlat.commands.profile import contended_line
    from kernels_db.build import ProfileReport

    report = ProfileReport("d", "r", models_measured_now=40, models_contended_now=7,
                           others_cores_max=1.34)
    assert contended_line(report) == (
        "7 of 40 end-to-end model timings ran while other processes kept up to 1.3 cores busy; "
        "the fit leaves them out while enough others are quiet, and the next `hwlat profile` "
        "times those models again first: run it on an idle machine")
    assert contended_line(replace(report, models_contended_now=0)) is None
    ops = replace(report, models_contended_now=0, measured_now=500, zoo_retimed_now=40,
                  ops_retimed_now=12, ops_contended_now=30, ops_others_cores_max=0.96)
    assert contended_line(ops) == (
        "30 of 552 op timings ran while other processes kept up to 1.0 cores busy; a config "
        "timed once that way is timed again later in the run or by the next `hwlat profile`, "
        "and the faster timing counts (12 re-timed in this run): run it on an idle machine")
    assert contended_line(replace(ops, models_contended_now=7)).startswith(
        "7 of 40 end-to-end model timings ran while other processes kept up to 1.3 cores busy;"
        " the fit leaves them out while enough others are quiet, and the next `hwlat profile` "
        "times those models again first; 30 of 552 op timings")


def test_pass_spread_compares_a_settings_quiet_timings_and_the_profile_warns_past_slow_spell(
        tmp_path):
    """A setting this run timed twice quietly, 1.78x apart, is a slow spell no CPU accounting
    saw (the 2-thread profile that over-predicted the held-out zoo by a median 29%); a contended
    timing and settings this run did not time are not compared."""
    from hwlat.commands.profile import slow_spell_line
    from kernels_db import build
    from kernels_db.store import KernelDB
    from profilers import zoo
    from profilers.contention import CpuUse

    key = {"inputs": ["1x3x224x224"], "threads": 2, "kind": "e2e"}
    other = {**key, "inputs": ["1x3x160x160"]}
    busy = CpuUse(1.5, 2, 1.0).to_stats()
    with KernelDB.open(tmp_path / "k.db") as db:
        db.upsert_device({"t": 2}, device_id="d", kind="cpu", threads=2)
        earlier, now = (db.start_run("d", budget_s=60, settings={}) for _ in range(2))
        assert build.pass_spread(db.model_measurements("d", kind="e2e"), now) == (0, None)
        db.add_model_measurement("d", "tv:a", "a", key, [0.1217] * 3, run_id=now)
        db.add_model_measurement("d", "tv:a", "a", key, [0.0500] * 3, run_id=now, stats=busy)
        assert build.pass_spread(db.model_measurements("d", kind="e2e"), now) == (0, None)  # the contended one not compared
        db.add_model_measurement("d", "tv:a", "a", key, [0.0685] * 3, run_id=earlier)
        db.add_model_measurement("d", "tv:b", "b", other, [0.02] * 3, run_id=earlier)
        db.add_model_measurement("d", "tv:b", "b", other, [0.03] * 3, run_id=earlier)
        n, ratio = build.pass_spread(db.model_measurements("d", kind="e2e"), now)
        assert n == 1 and ratio == pytest.approx(0.1217 / 0.0685)  # tv:b: not timed by this run
        here = zoo.resolve_spec("models.py:transformer_encoder")  # and where it used to be:
        db.add_model_measurement("d", "/old/checkout/data/models.py:transformer_encoder", "t",
                                 key, [0.01] * 3, run_id=earlier)
        db.add_model_measurement("d", here, "t", key, [0.011] * 3, run_id=now)
        assert build.pass_spread(db.model_measurements("d", kind="e2e"), now)[0] == 2

    report = build.ProfileReport("d", "now", models_timed_twice=n, models_pass_ratio_max=ratio)
    assert slow_spell_line(report).startswith(
        "end-to-end timings of the same model setting differ by up to 1.78x (1 setting timed "
        "twice) with no other process busy: the machine had a slow spell")
    assert slow_spell_line(replace(report, models_pass_ratio_max=1.04)) is None
    assert slow_spell_line(replace(report, models_pass_ratio_max=None)) is None
    probed = replace(report, models_pass_ratio_max=1.04, models_slow_now=3,
                     models_measured_now=40)
    assert slow_spell_line(probed).startswith(
        "3 of 40 end-to-end model timings ran in a slow spell of the machine (a fixed probe "
        "beside them ran 1.2x or more its usual time)")


def _profile_on_a_fake_clock(tmp_path, monkeypatch, budget_s: float, zoo_share: float):
    """A resnet18 profile on a fake clock: all zoo configs together take `zoo_share` of the
    budget, every other config a second. (report, configs timed, seconds spent re-timing)."""
    from types import SimpleNamespace

    from kernels_db import build
    from kernels_db.store import KernelDB

    clock = [0.0]
    monkeypatch.setattr(build, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    sources: dict[str, str] = {}
    zoo_config_s = [0.0]  # what one zoo config takes, once the plan says how many there are
    seen: Counter = Counter()
    real_plan = build.plan

    def plan_and_note_sources(db, device_id, settings, progress=None):
        planned = real_plan(db, device_id, settings, progress)
        sources.update((c.key, c.source) for c in db.configs(device_id))
        zoo_config_s[0] = zoo_share * budget_s / sum(s == "zoo" for s in sources.values())
        return planned

    def fake_measure(record, device, flusher, threads):
        seen[record.key] += 1
        clock[0] += zoo_config_s[0] if sources[record.key] == "zoo" else 1.0
        return SimpleNamespace(samples_s=[1e-5] * 3, is_noisy=False), None

    monkeypatch.setattr(build, "plan", plan_and_note_sources)
    monkeypatch.setattr(build, "_measure_config", fake_measure)
    settings = build.ProfileSettings(threads=1, budget_s=budget_s,
                                     models=("torchvision:resnet18",), batches=(1,), e2e=False,
                                     random_per_family=3)
    with KernelDB.open(tmp_path / "k.db") as db:
        report = build.profile_device(db, settings)
        timed = [c for c in db.configs(report.device_id) if db.samples(c.id)]
    retimed_s = sum(n - 1 for n in seen.values()) * zoo_config_s[0]
    return report, timed, retimed_s


def test_a_short_sampling_phase_times_some_of_every_source_and_family(tmp_path, monkeypatch):
    """After the zoo, perturbations and random configs are dealt in turn (build.plan): a run
    with little time left still times random configs of several families, which reach shapes
    the zoo lacks (queued last, none was timed on a slow VM: alexnet +126%)."""
    report, timed, _ = _profile_on_a_fake_clock(tmp_path, monkeypatch, 40, zoo_share=0.02)
    assert report.zoo_measured == report.zoo_configs
    families = {source: {c.family for c in timed if c.source == source}
                for source in ("perturb", "random")}
    assert len(families["perturb"]) >= 3 and len(families["random"]) >= 4
    assert sum(c.source != "zoo" for c in timed) >= 30


def test_the_zoo_retiming_keeps_back_a_third_of_what_the_zoo_left(tmp_path, monkeypatch):
    """A zoo that fills 85% of the budget leaves 15 s of 100: the re-timing keeps back 5 s
    (build.RETIME_OF_LEFT), not the 10 s of its share, and the sampling gets the other 10."""
    report, timed, retimed_s = _profile_on_a_fake_clock(tmp_path, monkeypatch, 100,
                                                        zoo_share=0.85)
    assert report.zoo_measured == report.zoo_configs and report.zoo_retimed_now > 0
    assert retimed_s <= 5.0 + 0.85 * 100 / report.zoo_configs
    assert sum(c.source != "zoo" for c in timed) >= 9


def test_a_resumed_run_plans_again_only_when_the_plan_changed(tmp_path, monkeypatch):
    from kernels_db import build
    from kernels_db.store import KernelDB

    plans = []
    real_plan = build.plan

    def counting_plan(db, device_id, settings, progress=None):
        plans.append(settings.random_per_family)
        return real_plan(db, device_id, settings, progress)

    monkeypatch.setattr(build, "plan", counting_plan)
    settings = build.ProfileSettings(threads=1, budget_s=3, models=("torchvision:squeezenet1_1",),
                                     batches=(1,), e2e=False, random_per_family=2)
    with KernelDB.open(tmp_path / "k.db") as db:
        first = build.profile_device(db, settings)
        again = build.profile_device(db, settings)
        assert plans == [2] and first.planned > 0 and again.planned == 0
        assert again.zoo_configs == first.zoo_configs  # still reported, from the database
        build.profile_device(db, replace(settings, random_per_family=3))
        assert plans == [2, 3]


def test_adaptive_rounds_sample_only_families_the_zoo_uses(tmp_path):
    from kernels_db import build
    from kernels_db.store import KernelDB
    from profilers import sampling
    from profilers.ops import family_of, flops_of

    settings = build.ProfileSettings(threads=1)
    with KernelDB.open(tmp_path / "k.db") as db:
        db.upsert_device({"t": 1}, device_id="dev", kind="cpu", threads=1)
        for family, source in (("conv", "zoo"), ("rnn", "random")):
            records = [r for r in sampling.random_records(family, 40, seed=3)
                       if family_of(r.op) == family][:35]
            db.add_configs("dev", [(r.key, r.op, family, r.dtype, source, r.to_json(), 0)
                                   for r in records])
            ids = db.config_ids("dev")
            for i, r in enumerate(records):  # latencies the quick model cannot fully learn
                db.add_measurement(ids[r.key], None, [1e-6 + flops_of(r) * 1e-11 * (1 + i % 3)],
                                   flushed=True, threads=1, noisy=False)
        before = {c.key for c in db.configs("dev")}
        assert build.adaptive_round(db, "dev", settings, round_no=1) > 0
        added = [c for c in db.configs("dev") if c.key not in before]
    assert added and {c.family for c in added} == {"conv"}


def test_added_models_are_profiled_as_part_of_the_zoo(tmp_path, monkeypatch):
    """`--add`: a model outside the zoo gets its ops planned and timed with the zoo's, and end-to-
    end timings at the zoo's batches that the correction fits on, in its own family."""
    from kernels_db import build
    from kernels_db.store import KernelDB
    from profilers import isolate, modelbench
    from profilers.capture import capture_spec
    from profilers.specs import parse_input_spec

    monkeypatch.setattr(isolate, "enabled", lambda: True)  # two passes, whatever HWLAT_ISOLATE says
    timed: list[str] = []
    monkeypatch.setattr(modelbench, "time_forward_isolated",
                        lambda spec, inputs, **kw: timed.append(spec) or forward_timing([0.01] * 5))
    monkeypatch.setattr(build, "measure_configs", lambda *a, **kw: 0)
    added = "torchvision:shufflenet_v2_x0_5"
    settings = build.ProfileSettings(threads=1, budget_s=600, models=("torchvision:squeezenet1_1",),
                                     added=(added,), batches=(1, 2), random_per_family=1)
    with KernelDB.open(tmp_path / "k.db") as db:
        report = build.profile_device(db, settings)
        zoo_keys = {c.key for c in db.configs(report.device_id, source="zoo")}
        rows = db.model_measurements(report.device_id, kind="e2e")
    ops = capture_spec(added, inputs=[parse_input_spec("2x3x224x224")]).ops
    assert {r.key for r in ops if not is_free(r)} <= zoo_keys
    mine = [r for r in rows if r.model == added]
    assert sorted(r.settings["batch"] for r in mine) == [1, 1, 2, 2]  # two passes
    assert {r.family for r in mine} == {"shufflenet"}  # the zoo's family: held out together

    # resumed without --add, the run still knows the model: its missing second pass is taken
    con = sqlite3.connect(tmp_path / "k.db")
    with con:
        con.execute("DELETE FROM model_measurements WHERE id = (SELECT MAX(id) FROM "
                    "model_measurements WHERE model = ?)", (added,))
    con.close()
    timed.clear()
    with KernelDB.open(tmp_path / "k.db") as db:
        build.profile_device(db, build.ProfileSettings(
            threads=1, budget_s=600, models=("torchvision:squeezenet1_1",), batches=(1, 2),
            random_per_family=1))
    assert timed == [added]


def test_an_added_model_that_cannot_load_is_a_one_line_error(tmp_path):
    proc = _hwlat(tmp_path / "k.db", "profile", "--budget", "10s", "--add", "torchvision:nope")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert err.strip().count("\n") == 0 and "unknown torchvision model" in err
    assert _count(tmp_path / "k.db") == 0


def test_the_stream_is_timed_again_each_run_and_the_fastest_kept(tmp_path):
    """The predictor floors weights beyond the LLC at the stream bandwidth: one timing in a slow
    spell must not stay the device's (`build.retime_stream`)."""
    from kernels_db.build import retime_stream
    from kernels_db.store import KernelDB

    def failing(device, threads):
        raise MemoryError

    with KernelDB.open(tmp_path / "s.db") as db:
        db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=2,
                         peaks={"gbps": 30.0, "stream_gbps": 12.4})
        db.upsert_device({"t": 2}, device_id="old", kind="cpu", threads=1, peaks={"gbps": 20.0})
        db.upsert_device({"t": 3}, device_id="new", kind="cpu", threads=1)
        assert retime_stream(db, "dev1", "cpu", 2, measure=lambda d, t: 18.2,
                             measure_batched=lambda d, t: 8.1,
                             measure_reorder=lambda d, t: 7.7) == 18.2
        assert db.get_device("dev1").peaks == {"gbps": 30.0, "stream_gbps": 18.2,
                                               "batched_gbps": 8.1, "reorder_gbps": 7.7}
        token = db.state_token("dev1")
        assert retime_stream(db, "dev1", "cpu", 2, measure=lambda d, t: 11.0,
                             measure_batched=lambda d, t: 5.0,
                             measure_reorder=lambda d, t: 6.0) == 11.0
        assert db.get_device("dev1").peaks["stream_gbps"] == 18.2  # the slower one is not kept
        assert db.get_device("dev1").peaks["batched_gbps"] == 8.1
        assert db.get_device("dev1").peaks["reorder_gbps"] == 7.7
        assert db.state_token("dev1") == token  # nor written: the models stay as trained
        # each is kept on its own: a faster batched rate is written beside a slower stream
        assert retime_stream(db, "dev1", "cpu", 2, measure=lambda d, t: 11.0,
                             measure_batched=lambda d, t: 9.0,
                             measure_reorder=lambda d, t: 7.0) == 11.0
        assert db.get_device("dev1").peaks == {"gbps": 30.0, "stream_gbps": 18.2,
                                               "batched_gbps": 9.0, "reorder_gbps": 7.7}
        assert retime_stream(db, "dev1", "cpu", 2, measure=failing,
                             measure_batched=failing, measure_reorder=failing) is None
        # a device profiled before the stream was measured gets it; one with no peaks, nothing
        assert retime_stream(db, "old", "cpu", 1, measure=lambda d, t: 19.0,
                             measure_batched=lambda d, t: None,
                             measure_reorder=lambda d, t: None) == 19.0
        assert db.get_device("old").peaks == {"gbps": 20.0, "stream_gbps": 19.0}
        assert retime_stream(db, "new", "cpu", 1, measure=lambda d, t: 1 / 0) is None


def test_a_cpu_profiled_before_subnormals_were_costed_gets_its_cost_once(tmp_path):
    """`build.measure_subnormal_once`: a CPU without the cost gets it, once; a GPU never."""
    from kernels_db.build import measure_subnormal_once
    from kernels_db.store import KernelDB

    calls = []
    cost = {"reuse_ns": 2.3, "block_ns": 98.0, "threads": 1, "share": 0.1}

    def measure(threads):
        calls.append(threads)
        return cost

    with KernelDB.open(tmp_path / "s.db") as db:
        db.upsert_device({"t": 1}, device_id="old", kind="cpu", threads=1, peaks={"gbps": 20.0})
        db.upsert_device({"t": 3}, device_id="gpu", kind="cuda", threads=None,
                         peaks={"gbps": 900.0})
        before = db.state_token("old")
        measure_subnormal_once(db, "old", 1, measure=measure)
        measure_subnormal_once(db, "old", 1, measure=measure)
        assert db.get_device("old").peaks == {"gbps": 20.0, "subnormal": cost} and calls == [1]
        assert db.state_token("old") != before  # the predictor's models see the new peaks
        measure_subnormal_once(db, "gpu", None, measure=measure)
        assert "subnormal" not in db.get_device("gpu").peaks and calls == [1]


def test_a_cpu_profiled_before_the_llc_sweep_gets_it_once(tmp_path):
    """`build.measure_llc_once`: the measured LLC is written into the peaks of a CPU that lacks
    it, None included (no cache faster than memory), and never measured again; a GPU's, never."""
    from kernels_db.build import measure_llc_once
    from kernels_db.store import KernelDB

    calls = []

    def sweep(device, threads):
        calls.append(threads)
        return 64 << 20

    with KernelDB.open(tmp_path / "l.db") as db:
        db.upsert_device({"t": 1}, device_id="old", kind="cpu", threads=1, peaks={"gbps": 20.0})
        db.upsert_device({"t": 2}, device_id="flat", kind="cpu", threads=2, peaks={"gbps": 20.0})
        db.upsert_device({"t": 3}, device_id="gpu", kind="cuda", threads=None,
                         peaks={"gbps": 900.0})
        measure_llc_once(db, "old", "cpu", 1, measure=sweep)
        measure_llc_once(db, "old", "cpu", 1, measure=sweep)
        assert db.get_device("old").peaks == {"gbps": 20.0, "llc_bytes": 64 << 20}
        measure_llc_once(db, "flat", "cpu", 2, measure=lambda d, t: None)
        assert db.get_device("flat").peaks == {"gbps": 20.0, "llc_bytes": None}
        measure_llc_once(db, "gpu", "cuda:0", None, measure=sweep)
        assert "llc_bytes" not in db.get_device("gpu").peaks
    assert calls == [1]
