"""`hwlat bench` through CliRunner: exit codes, JSON, stages, CSV, storage and load mode."""

from __future__ import annotations

import csv
import json
import textwrap

import pytest
import torch
from click.testing import CliRunner

from hwlat.cli import cli
from hwlat.commands.bench import bench
from profilers.specs import LoadedModel

if "bench" not in cli.commands:  # until hwlat/commands/__init__.py registers it
    cli.add_command(bench)

MODELS = textwrap.dedent("""
    import time
    import torch
    from torch import nn

    def tiny():
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def staged():
        def preprocess(raw):
            # gets the example input tensors (a list, one per input) when no raw input is given
            assert isinstance(raw, list) and raw[0].shape == (1, 16)
            return raw[0] * 2.0
        return {"model": tiny(), "inputs": ["1x16"], "preprocess": preprocess,
                "postprocess": lambda out: out.argmax(dim=1)}

    def raw_staged():
        return {"model": tiny(), "inputs": ["1x16"], "raw_input": [float(i) for i in range(16)],
                "preprocess": lambda raw: torch.tensor(raw).reshape(1, 16)}

    def bad_preprocess():
        def preprocess(raw):
            raise ValueError("cannot decode image")
        return {"model": tiny(), "inputs": ["1x16"], "preprocess": preprocess}

    class Flaky(nn.Module):
        def __init__(self, fail_after):
            super().__init__()
            self.net, self.calls, self.fail_after = tiny(), 0, fail_after

        def forward(self, x):
            self.calls += 1
            if self.calls > self.fail_after:
                raise RuntimeError("CUDA out of memory (simulated)")
            return self.net(x)

    def flaky():
        return {"model": Flaky(fail_after=17), "inputs": ["1x16"]}

    class Slow(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = tiny()

        def forward(self, x):
            time.sleep(0.02)
            return self.net(x)

    def slow():
        return {"model": Slow(), "inputs": ["1x16"]}
""")


@pytest.fixture
def env(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    db = str(tmp_path / "kernels.db")

    def run(*args: str):
        return CliRunner().invoke(cli, ["--db", db, "bench", *args])

    def n_models() -> int:
        if not (tmp_path / "kernels.db").exists():
            return 0
        out = CliRunner().invoke(cli, ["--db", db, "devices", "--json"])
        assert out.exit_code == 0, out.output
        return sum(d["n_models"] for d in json.loads(out.stdout))

    return {"model": lambda name: f"{path}:{name}", "run": run, "n_models": n_models,
            "tmp": tmp_path}


def _error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("flags", [
    ["--rate", "0", "--duration", "1"],
    ["--rate", "-5", "--duration", "1"],
    ["--rate", "10", "--duration", "0"],
    ["--rate", "10", "--duration", "-2s"],
    ["--rate", "10"],  # a rate without a duration
    ["--duration", "5"],  # a duration without load mode
    ["--runs", "0"],
    ["--device", "tpu"],
])
def test_bad_flags_are_usage_errors(env, flags):
    result = env["run"](env["model"]("tiny"), "--input", "1x16", *flags)
    assert result.exit_code == 2, result.output


def test_unknown_model_is_a_one_line_error(env):
    result = env["run"]("torchvision:resnet_nope", "--runs", "5")
    assert result.exit_code == 1
    assert "unknown torchvision model" in _error_line(result)


def test_failing_preprocess_is_a_one_line_error_and_stores_nothing(env):
    result = env["run"](env["model"]("bad_preprocess"), "--runs", "5")
    assert result.exit_code == 1
    line = _error_line(result)
    assert "preprocess failed" in line and "cannot decode image" in line
    assert env["n_models"]() == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_a_gpu_is_a_one_line_error(env):
    result = env["run"](env["model"]("tiny"), "--input", "1x16", "--device", "cuda")
    assert result.exit_code == 1
    assert "not available" in _error_line(result)


def test_json_flags_unsupported_percentiles_and_stores_the_result(env):
    before = env["n_models"]()
    result = env["run"](env["model"]("tiny"), "--input", "1x16", "--runs", "30", "--warmup", "2",
                        "--threads", "1", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    total = report["stages_ms"]["total"]
    assert total["n"] == 30 and report["completed_runs"] == 30
    assert total["p50"] > 0 and total["ci95"]["p50"][0] <= total["p50"] <= total["ci95"]["p50"][1]
    # 30 runs support p50 but not p95 (needs 93) nor p99 (needs 473): null, never a number
    assert total["p95"] is None and total["p99"] is None
    assert {"p95", "p99"} <= set(total["insufficient"])
    assert report["settings"] == {"inputs": ["1x16"], "batch": 1, "dtype": "float32",
                                  "threads": 1, "device": "cpu", "grad_mode": "inference",
                                  "kind": "bench"}
    assert report["stored"]["device_id"].endswith(report["stored"]["device_id"][-8:])
    assert "-t1-" in report["stored"]["device_id"]
    assert env["n_models"]() == before + 1


def test_enough_runs_support_p95(env):
    result = env["run"](env["model"]("tiny"), "--input", "1x16", "--runs", "100", "--warmup", "1",
                        "--json", "--no-store")
    total = json.loads(result.stdout)["stages_ms"]["total"]
    assert total["p95"] is not None and total["p99"] is None
    assert total["p50"] <= total["p95"] <= total["max"]
    assert env["n_models"]() == 0  # --no-store


def test_stages_csv_and_plot_for_a_factory_with_pre_and_postprocess(env):
    csv_path, plot_path = env["tmp"] / "runs.csv", env["tmp"] / "stages.png"
    result = env["run"](env["model"]("staged"), "--runs", "30", "--warmup", "2", "--json",
                        "--csv", str(csv_path), "--plot", str(plot_path))
    assert result.exit_code == 0, result.output
    stages = json.loads(result.stdout)["stages_ms"]
    assert list(stages) == ["preprocess", "forward", "postprocess", "total"]
    with open(csv_path) as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["run", "preprocess_ms", "forward_ms", "postprocess_ms", "total_ms"]
    assert len(rows) == 30
    for row in rows:  # the request total covers its stages
        parts = sum(float(row[f"{s}_ms"]) for s in ("preprocess", "forward", "postprocess"))
        assert float(row["total_ms"]) >= parts
    assert plot_path.stat().st_size > 1000


@pytest.mark.skipif(not hasattr(LoadedModel, "raw_input"),
                    reason="profilers.specs does not pass a factory's raw_input through yet")
def test_preprocess_receives_the_factorys_raw_input(env):
    result = env["run"](env["model"]("raw_staged"), "--runs", "10", "--json", "--no-store")
    assert result.exit_code == 0, result.output
    assert "preprocess" in json.loads(result.stdout)["stages_ms"]


def test_the_table_says_insufficient_instead_of_a_number(env):
    result = env["run"](env["model"]("tiny"), "--input", "1x16", "--runs", "30", "--no-store")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # the caption may wrap on a narrow terminal
    assert "insufficient: too few samples" in text and "p99 needs >= 473" in text
    assert "insuffic" in result.stdout.split("insufficient: too few")[0]  # the p99 cells


def test_a_model_failing_mid_run_keeps_and_stores_the_completed_runs(env):
    result = env["run"](env["model"]("flaky"), "--runs", "30", "--warmup", "2", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    # 17 calls succeed: 2 warm-up (the first is the untimed check), 15 timed
    assert report["completed_runs"] == 15 and report["runs"] == 30
    assert "out of memory" in report["error"]
    assert "out of memory" in _error_line(result)
    assert env["n_models"]() == 1


def test_load_mode_accounting_is_consistent(env):
    csv_path = env["tmp"] / "requests.csv"
    result = env["run"](env["model"]("tiny"), "--input", "1x16", "--rate", "150", "--duration",
                        "1", "--max-batch", "4", "--max-wait-ms", "2", "--workers", "2",
                        "--json", "--csv", str(csv_path))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["mode"] == "load" and report["settings"]["kind"] == "load"
    counts = report["status_counts"]
    assert sum(counts.values()) == report["requests"] > 50
    assert counts["ok"] == report["latency_ms"]["total"]["n"] == report["requests"]
    assert report["latency_ms"]["queue"]["n"] == report["latency_ms"]["compute"]["n"]
    assert report["offered_rps"] > 0 and report["achieved_rps"] > 0
    assert 1 <= report["mean_batch_size"] <= 4
    assert report["arrivals"] == {"source": "poisson", "rate_rps": 150.0, "duration_s": 1.0,
                                  "seed": 0}
    with open(csv_path) as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == report["requests"]
    for row in rows:
        assert float(row["total_ms"]) == pytest.approx(
            float(row["queue_ms"]) + float(row["compute_ms"]), abs=1e-3)
        assert 1 <= int(row["batch_size"]) <= 4
    assert env["n_models"]() == 1


def test_load_mode_rejects_requests_at_a_full_queue(env):
    # ~100 arrivals in 0.5 s against a 20 ms model with a one-slot queue: most are turned away
    result = env["run"](env["model"]("slow"), "--rate", "200", "--duration", "0.5",
                        "--queue-capacity", "1", "--json", "--no-store")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["rejected"] > report["requests"] // 3
    assert report["status_counts"]["ok"] + report["rejected"] == report["requests"]
    assert report["achieved_rps"] < report["offered_rps"]


def test_load_mode_from_a_trace_file(env):
    trace = env["tmp"] / "arrivals.txt"
    trace.write_text("# seconds\n0.00\n0.01\n0.02\n0.05\n0.30\n")
    result = env["run"](env["model"]("tiny"), "--input", "1x16", "--trace", str(trace), "--json",
                        "--no-store")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["requests"] == 5 and report["status_counts"]["ok"] == 5
    assert report["arrivals"]["source"] == "trace"


def test_a_bad_trace_is_a_one_line_error(env):
    trace = env["tmp"] / "arrivals.txt"
    trace.write_text("0.1\nsoon\n")
    result = env["run"](env["model"]("tiny"), "--input", "1x16", "--trace", str(trace))
    assert result.exit_code == 1
    assert "entry 2 is not a number" in _error_line(result)
