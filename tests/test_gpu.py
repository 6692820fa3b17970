"""GPU paths: the logic runs here with a fake NVML; what needs a real GPU is marked and skipped."""

from __future__ import annotations

import csv
import importlib.util
import json
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from hwlat.cli import cli
from hwlat.commands.bench import _synced, bench, telemetry_reader
from profilers import telemetry

if "bench" not in cli.commands:  # until hwlat/commands/__init__.py registers it
    cli.add_command(bench)




class NVMLError(Exception):
    pass


class FakeNVML:
    """The slice of pynvml that profilers.telemetry reads, with settable readings."""

    NVMLError = NVMLError
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, sm_mhz: int = 1980, reasons: int = 0, fail_init: bool = False) -> None:
        self.sm_mhz, self.reasons, self.fail_init = sm_mhz, reasons, fail_init

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index != 0:
            raise NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return self.sm_mhz if kind == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 41

    def nvmlDeviceGetPowerUsage(self, handle):
        return 120_500  # mW



def test_telemetry_reader_reads_clocks_temperature_and_power():
    snapshot = telemetry_reader("cuda:0", nvml=FakeNVML())()
    assert snapshot.sm_clock_mhz == 1980 and snapshot.mem_clock_mhz == 3201
    assert snapshot.temperature_c == 41 and snapshot.power_w == pytest.approx(120.5)
    assert snapshot.gpu_util_pct is None  # not offered by this NVML: unknown, not a crash


def test_telemetry_reader_without_nvml_gives_none_instead_of_failing_the_bench():
    assert telemetry_reader("cuda", nvml=FakeNVML(fail_init=True))() is None
    assert telemetry_reader("cuda:3", nvml=FakeNVML())() is None  # no such GPU index


def test_clocks_throttled_during_a_bench_become_a_warning():
    before = telemetry_reader("cuda", nvml=FakeNVML())()
    after = telemetry_reader("cuda", nvml=FakeNVML(sm_mhz=1410, reasons=0x20 | 0x4))()
    warnings = telemetry.compare(before, after)
    assert len(warnings) == 1
    assert "1980 to 1410 MHz" in warnings[0] and "thermal throttling" in warnings[0]


def test_the_load_server_runs_cpu_batches_without_a_device_sync():
    calls = []
    infer = _synced(calls.append, "cpu")
    infer(3)
    assert calls == [3] and infer == calls.append  # the same function, unwrapped


# ------------------------------------------------------------------------- gpu_check summary


def _gpu_check():
    path = Path(__file__).parents[1] / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(spec: str, measured: float, predicted: float) -> dict:
    return {"spec": spec, "measured_ms": measured, "predicted_ms": predicted,
            "error_pct": (predicted / measured - 1) * 100}


def test_gpu_check_summarises_mape_and_share_within_ten_percent_per_dtype_and_batch():
    check = _gpu_check()
    fp16 = {"models": [_row("a", 1.0, 1.05), _row("b", 2.0, 2.6), _row("c", 4.0, 3.8),
                       _row("d", 10.0, 11.0)]}
    rows = check.summary_rows({"float16/1": fp16,
                               "float32/16": {"error": "timed out after 60 s", "cmd": []}})
    first, second = rows
    assert (first["dtype"], first["batch"], first["n"]) == ("float16", 1, 4)
    # APEs 5, 30, 5, 10 -> MAPE 12.5%, three of four within +-10% (10 counts as within)
    assert first["mape_pct"] == pytest.approx(12.5)
    assert first["within_10pct"] == pytest.approx(0.75)
    assert first["worst"] == "b +30%"
    assert second == {"dtype": "float32", "batch": 16, "n": 0, "mape_pct": None,
                      "within_10pct": None, "worst": None, "error": "timed out after 60 s"}
    table = check.format_table(rows)
    assert "12.5%" in table and "75%" in table and "timed out" in table


def test_gpu_check_falls_back_to_the_reports_own_summary():
    check = _gpu_check()
    report = {"summary": {"hwlat": {"n": 9, "mape_pct": 14.2, "within_10pct": 0.44}}}
    assert check.accuracy(report) == {"n": 9, "mape_pct": 14.2, "within_10pct": 0.44,
                                      "worst": None}


# ------------------------------------------------------------------------ on a real GPU only

TINY = textwrap.dedent("""
    from torch import nn

    def tiny():
        return {"model": nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)),
                "inputs": ["8x256"], "postprocess": lambda out: out.argmax(dim=1)}
""")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_cuda_bench_splits_copies_forward_and_postprocess(tmp_path, dtype):
    (tmp_path / "m.py").write_text(TINY)
    csv_path = tmp_path / "runs.csv"
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "k.db"), "bench",
                                      f"{tmp_path / 'm.py'}:tiny", "--device", "cuda",
                                      "--dtype", dtype, "--runs", "50", "--json",
                                      "--csv", str(csv_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert list(report["stages_ms"]) == ["h2d", "forward", "d2h", "postprocess", "total"]
    assert report["stored"]["device_id"].startswith("cuda-")
    assert report["settings"]["device"] == "cuda" and report["settings"]["dtype"] == dtype
    if importlib.util.find_spec("pynvml") is not None:
        assert report["telemetry"]["before"]["sm_clock_mhz"] is not None
    with open(csv_path) as handle:
        for row in csv.DictReader(handle):  # CUDA-event stages fit inside the host total
            inner = sum(float(row[f"{s}_ms"]) for s in ("h2d", "forward", "d2h"))
            assert 0 < inner <= float(row["total_ms"]) * 1.05


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_cuda_load_mode_serves_every_request(tmp_path):
    (tmp_path / "m.py").write_text(TINY)
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "k.db"), "bench",
                                      f"{tmp_path / 'm.py'}:tiny", "--device", "cuda",
                                      "--rate", "200", "--duration", "1", "--max-batch", "4",
                                      "--max-wait-ms", "1", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["status_counts"]["ok"] == report["requests"] > 100


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_cuda_profile_smoke(tmp_path):
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "k.db"), "profile", "--device",
                                      "cuda", "--budget", "20s", "--models",
                                      "torchvision:resnet18", "--batch", "1", "--no-e2e",
                                      "--dtype", "float16", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["device_id"].startswith("cuda-") and report["measured_now"] > 20
