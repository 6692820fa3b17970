"""The command line as a user drives it: exit codes, one-line errors, the JSON contracts."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from hwlat.cli import cli


def run(*args: str, db=None):
    prefix = ["--db", str(db)] if db is not None else []
    return CliRunner().invoke(cli, [*prefix, *args])


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """squeezenet's zoo fully timed; a slow or busy machine may need the run again, as a user would."""
    db = tmp_path_factory.mktemp("cli") / "k.db"
    reports = []
    while not reports or (reports[-1]["untimed"].get("zoo") and len(reports) < 4):
        result = run("profile", "--budget", "25s", "--models", "torchvision:squeezenet1_1",
                     "--batch", "1", "--random-per-family", "4", "--threads", "1", "--name", "box",
                     "--json", db=db)
        assert result.exit_code == 0, result.output
        reports.append(json.loads(result.stdout))
    return db, reports


def test_help_and_version():
    assert run("--help").exit_code == 0
    assert "hwlat" in run("--version").output


def test_profile_report_covers_the_zoo(profiled):
    _, reports = profiled
    for report in reports:  # every zoo config is timed or left for the next run (all can run)
        assert report["zoo_configs"] > 10
        assert report["zoo_measured"] + report["untimed"].get("zoo", 0) == report["zoo_configs"]
        assert report["status"] == "done" and 0 < report["noise_median"] < 1
    assert reports[-1]["zoo_measured"] == reports[-1]["zoo_configs"]
    assert "zoo" not in reports[-1]["untimed"]  # what is left for a resumed run, per source
    if len(reports) > 1:  # a resumed run does not plan again while its plan is unchanged
        assert all(r["planned"] == 0 for r in reports[1:])


def test_devices_json_has_counts(profiled):
    db, reports = profiled
    report = reports[-1]
    result = run("devices", "--json", db=db)
    assert result.exit_code == 0
    (device,) = json.loads(result.stdout)
    assert device["id"] == report["device_id"] and device["name"] == "box"
    assert device["threads"] == 1
    assert device["n_configs"] >= device["n_measured"] >= report["zoo_configs"]
    # the untimed ones, less any found unable to run on this device
    assert sum(report["untimed"].values()) <= device["n_configs"] - device["n_measured"]
    assert device["n_samples"] > device["n_measured"] and device["n_models"] >= 1


def test_predict_json_contract(profiled):
    db, _ = profiled
    result = run("predict", "torchvision:squeezenet1_1", "--device", "box", "--json", db=db)
    assert result.exit_code == 0, result.output
    p = json.loads(result.stdout)
    lo, hi = p["interval_ms"]
    assert lo <= p["latency_ms"]["p50"] <= hi and p["latency_ms"]["p50"] > 0
    assert p["n_ops"] > 0 and isinstance(p["unmodelled"], list)
    assert p["device"].startswith("cpu-")
    assert abs(sum(p["per_family"].values()) - p["latency_ms"]["p50"]) < 1e-6 * p["latency_ms"]["p50"] + 1e-9
    assert p["measured_share"] > 0.9  # squeezenet's own configs were profiled exactly


def test_predict_several_models_and_unseen_ones(profiled):
    db, _ = profiled
    result = run("predict", "torchvision:squeezenet1_1", "torchvision:mnasnet0_5",
                 "--batch", "2", "--json", db=db)
    assert result.exit_code == 0, result.output
    a, b = json.loads(result.stdout)
    assert a["inputs"] == ["2x3x224x224"] and b["latency_ms"]["p50"] > 0
    assert b["measured_share"] < 1.0


def test_predict_prices_subnormals_by_default_on_a_profiled_cpu(profiled, tmp_path):
    """The profile measured what a subnormal costs this CPU, so predict counts a model's in one
    real forward pass unless told not to (the cost may be ~0 on a CPU without a slow path)."""
    db, _ = profiled
    (tmp_path / "under.py").write_text(
        "import torch\n"
        "class Under(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(256, 256)\n"
        "    def forward(self, x):\n"  # exp(-100) = 3.7e-44: subnormal
        "        return self.fc(torch.exp(x.abs() * 0 - 100))\n"
        "def make():\n"
        "    return Under()\n")
    spec = f"{tmp_path / 'under.py'}:make"
    counted = run("predict", spec, "--input", "8x256", "--json", db=db)
    assert counted.exit_code == 0, counted.output
    p = json.loads(counted.stdout)
    assert p["subnormal_ms"] >= 0 and p["per_family"]["subnormal_slow_path"] == p["subnormal_ms"]
    assert any("are subnormal (one forward pass here" in n for n in p["notes"])
    skipped = json.loads(run("predict", spec, "--input", "8x256", "--no-values", "--json",
                             db=db).stdout)
    assert skipped["subnormal_ms"] is None and "subnormal_slow_path" not in skipped["per_family"]
    assert skipped["latency_ms"]["p50"] == pytest.approx(p["latency_ms"]["p50"] - p["subnormal_ms"])


def test_predict_at_the_pace_now_scales_the_profiles_prediction(profiled, monkeypatch):
    """--anchor pace times the profile's probes here: the prediction is the profile's times the
    pace factor (weighted, `PACE_WEIGHT`), plus the chain probe's term per priced op
    (weighted); the breakdown still sums to it."""
    from predictor import evaluate

    monkeypatch.setattr(evaluate, "PACE_NOW_S", 0.2)  # the least rounds, not 2 s
    db, _ = profiled
    args = ("predict", "torchvision:squeezenet1_1", "--no-values", "--json")
    plain = json.loads(run(*args, db=db).stdout)
    result = run(*args, "--anchor", "pace", db=db)
    assert result.exit_code == 0, result.output
    p, a = json.loads(result.stdout), json.loads(result.stdout)["anchor"]
    assert plain["anchor"] is None and a["kind"] == "pace"
    assert a["factor"] == pytest.approx(a["pace_now_ms"] / a["pace_then_ms"]) and a["factor"] > 0
    assert a["scale"] == pytest.approx(a["factor"] ** evaluate.PACE_WEIGHT)
    assert a["added_per_op_ms"] == pytest.approx((a["per_op_ms"] or 0) * evaluate.PACE_WEIGHT)
    chain_ms = (a["added_per_op_ms"] or 0) * p["n_timed_ops"]
    assert p["latency_ms"]["p50"] == pytest.approx(a["scale"] * plain["latency_ms"]["p50"]
                                                   + chain_ms)
    assert sum(p["per_family"].values()) == pytest.approx(p["latency_ms"]["p50"])
    assert "as profiled: " in p["notes"][-1] and "of the way in log" in p["notes"][-1]


def test_predict_at_the_pace_now_needs_this_machines_cpu_profile(profiled, tmp_path):
    import sqlite3

    from kernels_db.store import KernelDB

    db, _ = profiled
    copy = tmp_path / "copy.db"
    with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    with KernelDB.open(copy) as kdb:
        kdb.upsert_device({"t": 1}, device_id="cpu-elsewhere-t1", kind="cpu", threads=1)
        kdb.upsert_device({"t": 2}, device_id="cuda-elsewhere", kind="cuda", threads=1)
    unprobed = tmp_path / "unprobed.db"  # this machine's profile, its probe timings removed
    with sqlite3.connect(copy) as src, sqlite3.connect(unprobed) as dst:
        src.backup(dst)
    with sqlite3.connect(unprobed) as con:
        con.execute("UPDATE model_measurements SET stats_json = json_remove(stats_json, "
                    "'$.pace_s')")
    for path, device, says in ((copy, "cpu-elsewhere-t1", "is not this machine"),
                               (copy, "cuda-elsewhere", "CUDA"), (unprobed, "box", "no pace probe")):
        result = run("predict", "torchvision:squeezenet1_1", "--device", device, "--anchor",
                     "pace", db=path)
        assert result.exit_code == 1 and says in result.output, result.output
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_several_models_one_failing_keeps_the_others(profiled):
    db, _ = profiled
    result = run("predict", "torchvision:squeezenet1_1", "torchvision:resnet19", "--json", db=db)
    assert result.exit_code == 1
    good, bad = json.loads(result.stdout)
    assert good["spec"] == "torchvision:squeezenet1_1" and good["latency_ms"]["p50"] > 0
    assert bad["spec"] == "torchvision:resnet19" and "resnet18" in bad["error"]
    assert "error: torchvision:resnet19: " in result.stderr and "Traceback" not in result.stderr
    text = run("predict", "torchvision:resnet19", "torchvision:squeezenet1_1", db=db)
    # the table keeps the failed model's row and squeezenet1_1's (0.70 GFLOPs)
    assert text.exit_code == 1 and "failed" in text.stdout and "0.70" in text.stdout
    assert text.stderr.startswith("error: torchvision:resnet19: ")


def test_unknown_device_lists_known_ones(profiled):
    db, _ = profiled
    result = run("predict", "torchvision:resnet18", "--device", "nope", db=db)
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "box" in result.output


def test_bad_input_spec_is_bad_usage(profiled):
    db, _ = profiled
    result = run("predict", "torchvision:resnet18", "--input", "1xAx3", db=db)
    assert result.exit_code == 2


def test_an_unwritable_output_file_is_bad_usage_before_anything_is_measured(profiled, tmp_path):
    db, _ = profiled
    for args in (("evaluate", "torchvision:resnet18", "--plot", str(tmp_path / "no" / "e.png")),
                 ("bench", "torchvision:resnet18", "--csv", str(tmp_path / "no" / "b.csv"))):
        result = run(*args, db=db)
        assert result.exit_code == 2 and "does not exist" in result.output
        assert "measuring" not in result.output


def test_unknown_model_is_a_domain_error(profiled):
    db, _ = profiled
    result = run("predict", "torchvision:resnet19", db=db)
    assert result.exit_code == 1 and "resnet18" in result.output
    scripted = run("predict", "torchvision:resnet19", "--json", db=db)
    assert scripted.exit_code == 1 and scripted.stderr.startswith("error: ")
    assert json.loads(scripted.stdout) == {"spec": "torchvision:resnet19",
                                           "error": scripted.stderr[len("error: "):].strip()}


def test_export_import_round_trip(profiled, tmp_path):
    db, _ = profiled
    path = tmp_path / "box.hwlat.gz"
    assert run("db", "export", "box", str(path), db=db).exit_code == 0
    other = tmp_path / "other.db"
    assert run("db", "import", str(path), db=other).exit_code == 0
    mine = json.loads(run("devices", "--json", db=db).stdout)[0]
    theirs = json.loads(run("devices", "--json", db=other).stdout)[0]
    for key in ("id", "n_configs", "n_measured", "n_samples", "n_models"):
        assert mine[key] == theirs[key]
    p1 = json.loads(run("predict", "torchvision:squeezenet1_1", "--json", db=db).stdout)
    p2 = json.loads(run("predict", "torchvision:squeezenet1_1", "--json", db=other).stdout)
    assert p1["latency_ms"]["p50"] == pytest.approx(p2["latency_ms"]["p50"], rel=1e-9)


def test_corrupt_database_is_refused_and_kept(tmp_path):
    path = tmp_path / "bad.db"
    path.write_bytes(b"this is not sqlite" * 100)
    result = run("devices", db=path)
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert path.read_bytes() == b"this is not sqlite" * 100


def test_missing_database_says_what_to_do(tmp_path):
    for args in (["devices", "--json"], ["predict", "torchvision:resnet18"]):
        result = run(*args, db=tmp_path / "new.db")
        assert result.exit_code == 1 and "hwlat profile" in result.output
        assert result.output.count("\n") == 1
    assert not (tmp_path / "new.db").exists()


def _copy(db, tmp_path):
    import sqlite3

    copy = tmp_path / "copy.db"
    with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    return copy


def test_bench_timings_neither_become_the_default_device_nor_retrain(profiled, tmp_path):
    from kernels_db.store import KernelDB
    from profilers.fingerprint import fingerprint

    db = _copy(profiled[0], tmp_path)
    box = json.loads(run("devices", "--json", db=db).stdout)[0]["id"]
    assert run("predict", "torchvision:squeezenet1_1", db=db).exit_code == 0  # models cached
    bench = fingerprint("cpu", 2)  # what `hwlat bench` without --threads stores on 2 cores
    with KernelDB(db) as kdb:
        kdb.upsert_device(bench.to_json(), device_id=bench.device_id, kind="cpu", threads=2)
        for device in (bench.device_id, box):
            kdb.add_model_measurement(device, "torchvision:squeezenet1_1", "squeezenet",
                                      {"kind": "bench", "threads": 2}, [0.01, 0.011])
    for device in ((), ("--device", "cpu")):
        result = run("predict", "torchvision:squeezenet1_1", *device, db=db)
        assert result.exit_code == 0, result.output
        assert box in result.stdout and "training" not in result.stderr
    listed = run("devices", db=db).stdout
    assert "never" in listed  # the bench-only device
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", listed)  # box's, not a unix time


def test_brackets_in_specs_are_printed_not_read_as_markup(profiled):
    db, _ = profiled
    result = run("predict", "torchvision:squeezenet1_1", "--input", "float16:1x3x64x64", db=db)
    assert result.exit_code == 0, result.output
    assert "torchvision:squeezenet1_1 [float16:1x3x64x64] on" in result.stdout
