"""Export and import of a device profile: exact, idempotent, and refusing bad files."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from kernels_db import KernelDB, export_device, import_file
from profilers.errors import DatabaseError, DeviceError

DEVICE = "cpu-abc123"


def _profiled_db(path: Path, seed: int = 0) -> KernelDB:
    """A database with one device, two runs, 30 configs (25 measured, one twice), 2 models."""
    rng = random.Random(seed)
    db = KernelDB(path)
    db.upsert_device({"cpu": "Xeon", "flags": ["avx512"]}, device_id=DEVICE, kind="cpu",
                     threads=2, name="lab-box", peaks={"flops_per_s": 1.5e11})
    db.add_configs(DEVICE, [(f"k{i:03d}", "aten.convolution.default", "conv", "float32",
                             "zoo" if i < 10 else "random", {"op": "conv", "i": i})
                            for i in range(30)])
    ids = db.config_ids(DEVICE)
    for run_index in range(2):
        run = db.start_run(DEVICE, budget_s=60.0, settings={"run": run_index})
        for key in sorted(ids)[run_index * 12: run_index * 12 + 13]:  # k012 measured twice
            samples = [rng.lognormvariate(-9, 0.3) for _ in range(rng.randint(3, 9))]
            db.add_measurement(ids[key], run, samples, flushed=True, threads=2,
                               noisy=rng.random() < 0.2, telemetry={"temp_c": 40 + run_index})
        db.add_model_measurement(DEVICE, "torchvision:resnet18", "cnn",
                                 {"kind": "e2e", "batch": 1}, [rng.random() for _ in range(5)],
                                 run_id=run, stats={"p95_s": 0.05})
        if run_index == 1:
            db.mark_failed(ids["k029"], run, "RuntimeError: unsupported")
        db.finish_run(run, "done")
    return db


def _content(db: KernelDB) -> dict:
    """Everything an import must reproduce, by key and uuid rather than local ids."""
    ids = db.config_ids(DEVICE)
    return {
        "measured": sorted((m.key, m.median_s, m.iqr_s, m.n, m.noisy, m.record_json)
                           for m in db.measured(DEVICE)),
        "samples": {key: db.samples(cid) for key, cid in ids.items()},
        "configs": sorted((c.key, c.source, c.priority) for c in db.configs(DEVICE)),
        "models": sorted((m.uid, m.run_id, m.samples_s, m.settings.get("batch"))
                         for m in db.model_measurements(DEVICE)),
        "runs": sorted((r.id, r.status, r.budget_s) for r in db.runs(DEVICE)),
    }


def test_export_import_round_trip(tmp_path):
    with _profiled_db(tmp_path / "a.db") as src:
        summary = export_device(src, "lab-box", tmp_path / "box.hwlat.gz")
        expected = _content(src)
    assert (summary.n_configs, summary.n_measurements, summary.n_runs,
            summary.n_model_measurements) == (30, 26, 2, 2)
    with KernelDB(tmp_path / "b.db") as dst:
        result = import_file(dst, tmp_path / "box.hwlat.gz")
        assert result.device_created and result.configs_added == 30
        assert (result.measurements_added, result.runs_added,
                result.model_measurements_added) == (26, 2, 2)
        assert _content(dst) == expected
        device = dst.get_device("lab-box")
        assert device.fingerprint == {"cpu": "Xeon", "flags": ["avx512"]}
        assert device.peaks == {"flops_per_s": 1.5e11} and device.threads == 2
        run = dst.start_run(DEVICE, budget_s=None, settings={})
        unmeasured = {c.key for c in dst.claim_unmeasured(DEVICE, run, 100)}
        assert unmeasured == {f"k{i:03d}" for i in range(25, 29)}  # k029 failed at the source


def test_import_twice_is_idempotent(tmp_path):
    with _profiled_db(tmp_path / "a.db") as src:
        export_device(src, DEVICE, tmp_path / "box.gz")
        again = import_file(src, tmp_path / "box.gz")  # into its own source: nothing new
        assert not again.added_anything and again.measurements_skipped == 26
    with KernelDB(tmp_path / "b.db") as dst:
        import_file(dst, tmp_path / "box.gz")
        token, content = dst.state_token(DEVICE), _content(dst)
        second = import_file(dst, tmp_path / "box.gz")
        assert not second.added_anything
        assert (second.measurements_skipped, second.model_measurements_skipped) == (26, 2)
        assert dst.state_token(DEVICE) == token and _content(dst) == content


def test_import_merges_profiles_of_two_machines(tmp_path):
    with _profiled_db(tmp_path / "a.db", seed=1) as a, _profiled_db(tmp_path / "b.db", 2) as b:
        export_device(a, DEVICE, tmp_path / "a.gz")
        export_device(b, DEVICE, tmp_path / "b.gz")
        b_samples = {m.key: b.samples(m.config_id) for m in b.measured(DEVICE)}
        result = import_file(a, tmp_path / "b.gz")
        assert (result.configs_added, result.measurements_added, result.runs_added) == (0, 26, 2)
        ids = a.config_ids(DEVICE)
        for key, samples in b_samples.items():  # b's samples follow a's for every key
            assert a.samples(ids[key])[-len(samples):] == samples
        assert len(a.runs(DEVICE)) == 4


def test_alias_taken_by_another_device_is_dropped(tmp_path):
    with _profiled_db(tmp_path / "a.db") as src:
        export_device(src, DEVICE, tmp_path / "box.gz")
    with KernelDB(tmp_path / "b.db") as dst:
        dst.upsert_device({}, device_id="other", kind="cpu", threads=1, name="lab-box")
        result = import_file(dst, tmp_path / "box.gz")
        assert dst.get_device(DEVICE).name is None and "lab-box" in result.notes[0]


def _write_gz(path: Path, lines: list) -> Path:
    with gzip.open(path, "wt") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def test_format_1_exports_leave_their_max_pool_timings_out(tmp_path):
    with _profiled_db(tmp_path / "a.db") as src:
        src.add_configs(DEVICE, [("pool", "aten.max_pool2d.default", "pool", "float32", "zoo",
                                  {"op": "pool"})])
        src.add_measurement(src.config_ids(DEVICE)["pool"], None, [1e-3], flushed=True,
                            threads=2, noisy=False)
        n_measured = len(src.measured(DEVICE))
        export_device(src, DEVICE, tmp_path / "new.gz")
    with gzip.open(tmp_path / "new.gz", "rt") as f:
        lines = [json.loads(line) for line in f]
    _write_gz(tmp_path / "old.gz", [{**lines[0], "version": 1}, *lines[1:]])
    with KernelDB(tmp_path / "b.db") as old, KernelDB(tmp_path / "c.db") as new:
        result = import_file(old, tmp_path / "old.gz")
        assert result.measurements_stale == 1 and "max-pool" in result.notes[0]
        assert len(old.measured(DEVICE)) == n_measured - 1
        assert "pool" in old.config_ids(DEVICE)  # the config stays, to be timed again
        assert import_file(new, tmp_path / "new.gz").measurements_stale == 0
        assert len(new.measured(DEVICE)) == n_measured


@pytest.mark.parametrize("case", ["random", "other-json", "newer", "truncated", "bad-record",
                                  "missing"])
def test_bad_files_raise_and_change_nothing(tmp_path, case):
    with _profiled_db(tmp_path / "a.db") as src:
        export_device(src, DEVICE, tmp_path / "good.gz")
    with gzip.open(tmp_path / "good.gz", "rt") as f:
        good = [json.loads(line) for line in f]
    bad = tmp_path / "bad.gz"
    if case == "random":
        bad.write_bytes(random.Random(0).randbytes(4096))
    elif case == "other-json":
        _write_gz(bad, [{"name": "some other tool", "version": 1}])
    elif case == "newer":
        _write_gz(bad, [{**good[0], "version": 99}, *good[1:]])
    elif case == "truncated":  # no end record: must not be half-imported
        _write_gz(bad, good[:-1])
    elif case == "bad-record":
        measurement = next(i for i, r in enumerate(good) if r.get("type") == "measurement")
        broken = {k: v for k, v in good[measurement].items() if k != "samples_s"}
        _write_gz(bad, [*good[:measurement], broken, *good[measurement + 1:]])
    match = {"newer": "newer hwlat", "truncated": "truncated", "bad-record": "malformed at line",
             "missing": "no such file"}.get(case, "not an? .*hwlat profile export")
    with KernelDB(tmp_path / "b.db") as dst:
        with pytest.raises(DatabaseError, match=match) as err:
            import_file(dst, tmp_path / ("absent.gz" if case == "missing" else "bad.gz"))
        assert "\n" not in str(err.value)
        assert dst.list_devices() == []  # all or nothing


def test_export_unknown_device(tmp_path):
    with KernelDB(tmp_path / "a.db") as db, pytest.raises(DeviceError, match="unknown device"):
        export_device(db, "nope", tmp_path / "x.gz")
    assert not (tmp_path / "x.gz").exists()
