"""Closed-loop model benchmark: exact stage accounting on a fake clock, failures, a real run."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from profilers.clocks import FakeClock
from profilers.errors import BenchError, DeviceError
from profilers.modelbench import bench_model, default_clock_factory


class FakeTime:
    """Virtual time that the model and the stages advance by known amounts."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class TimedModel(nn.Module):
    """A real tiny network whose forward also advances the fake time by `forward_s`."""

    def __init__(self, clock: FakeTime, forward_s: float, fail_on_call: int | None = None):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.clock, self.forward_s, self.fail_on_call = clock, forward_s, fail_on_call
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.fail_on_call is not None and self.calls >= self.fail_on_call:
            raise RuntimeError("out of memory (simulated)")
        self.clock.advance(self.forward_s)
        return self.net(x)


def test_stage_accounting_is_exact_with_a_fake_clock():
    clock = FakeTime()
    model = TimedModel(clock, forward_s=0.002)
    seen = []

    def preprocess(raw):
        clock.advance(0.001)
        return torch.tensor(raw, dtype=torch.float32).reshape(1, 8)

    def postprocess(out):
        clock.advance(0.0005)
        seen.append(out.shape)
        return out.argmax(dim=1)

    result = bench_model(model, lambda: list(range(8)), runs=30, warmup=4,
                         preprocess=preprocess, postprocess=postprocess,
                         clock_factory=default_clock_factory(now=clock), threads=1)
    assert list(result.stages) == ["preprocess", "forward", "postprocess", "total"]
    expected = {"preprocess": 1.0, "forward": 2.0, "postprocess": 0.5, "total": 3.5}
    for name, ms in expected.items():
        stats = result.stages[name]
        assert stats.n == 30
        assert min(stats.samples_s) == pytest.approx(ms / 1e3)
        assert max(stats.samples_s) == pytest.approx(ms / 1e3)
    assert model.calls == 4 + 30  # warm-up runs are untimed but real
    assert seen[-1] == (1, 4)
    assert result.completed_runs == 30 and result.error is None and result.threads == 1


def test_stage_accounting_with_the_shared_fake_clock():
    # profilers.clocks.FakeClock hands out durations in stop() order: forward, then total.
    durations = [0.004, 0.005] * 3
    result = bench_model(nn.Linear(4, 2), lambda: torch.ones(1, 4), runs=2, warmup=1,
                         clock_factory=lambda kind: FakeClock(iter(durations)))
    assert result.stages["forward"].samples_s == (0.004, 0.004)
    assert result.stages["total"].samples_s == (0.005, 0.005)


def test_json_has_stages_in_ms_and_flags_insufficient_percentiles():
    clock = FakeTime()
    result = bench_model(TimedModel(clock, 0.003), lambda: torch.ones(1, 8), runs=100,
                         warmup=1, clock_factory=default_clock_factory(now=clock))
    out = result.to_json()
    json.dumps(out)
    total = out["stages_ms"]["total"]
    assert total["p50"] == pytest.approx(3.0)
    assert total["p99"] is None and "p99" in total["insufficient"]
    assert out["completed_runs"] == 100 and out["error"] is None


def test_preprocess_that_raises_is_a_one_line_bench_error():
    def preprocess(raw):
        raise ValueError("bad image")

    with pytest.raises(BenchError) as info:
        bench_model(nn.Linear(8, 4), lambda: torch.ones(1, 8), runs=5, preprocess=preprocess)
    message = str(info.value)
    assert message.startswith("preprocess failed: ValueError: bad image")
    assert "\n" not in message


def test_model_failing_on_first_call_is_a_bench_error():
    with pytest.raises(BenchError, match="first run"):
        bench_model(nn.Linear(3, 4), lambda: torch.ones(1, 8), runs=5)


def test_model_failing_mid_run_keeps_the_samples_so_far():
    clock = FakeTime()
    warmup, k = 3, 7
    model = TimedModel(clock, 0.001, fail_on_call=warmup + k + 1)
    result = bench_model(model, lambda: torch.ones(1, 8), runs=50, warmup=warmup,
                         clock_factory=default_clock_factory(now=clock))
    assert result.completed_runs == k
    assert result.stages["forward"].n == k and result.stages["total"].n == k
    assert "failed after 7 timed runs" in result.error and "out of memory" in result.error
    assert result.to_json()["error"] == result.error
    assert "stopped early" in str(result.table().caption)


def test_real_tiny_model_on_cpu(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 10))
    result = bench_model(model, lambda: torch.randn(2, 3, 32, 32), runs=40, warmup=3)
    forward, total = result.stages["forward"], result.stages["total"]
    assert forward.n == total.n == 40
    assert all(f <= t for f, t in zip(forward.samples_s, total.samples_s, strict=True))
    assert result.table().row_count == 2
    path = tmp_path / "stages.png"
    result.plot(str(path))
    assert path.stat().st_size > 0


def test_telemetry_hooks_are_read_before_and_after():
    reads = iter([{"sm_clock_mhz": 1980}, {"sm_clock_mhz": 1410}])

    def compare(before, after):
        return ["SM clock dropped"] if after["sm_clock_mhz"] < before["sm_clock_mhz"] else []

    result = bench_model(nn.Linear(4, 2), lambda: torch.ones(1, 4), runs=3, warmup=1,
                         telemetry=lambda: next(reads), compare_telemetry=compare)
    assert result.telemetry_before == {"sm_clock_mhz": 1980}
    assert result.telemetry_after == {"sm_clock_mhz": 1410}
    assert "SM clock dropped" in result.to_json()["warnings"]


def test_bad_arguments():
    with pytest.raises(BenchError):
        bench_model(nn.Linear(4, 2), lambda: torch.ones(1, 4), runs=0)
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError):
            bench_model(nn.Linear(4, 2), lambda: torch.ones(1, 4), device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_cuda_splits_copies_from_forward():
    result = bench_model(nn.Linear(256, 256), lambda: torch.randn(64, 256), runs=20, warmup=2,
                         device="cuda")
    assert list(result.stages) == ["h2d", "forward", "d2h", "total"]
    assert all(s.n == 20 for s in result.stages.values())
    assert result.telemetry_before is not None


def test_time_forward_carries_other_processes_cpu_use_over_the_runs_else_build_and_runs(
        monkeypatch):
    from profilers import contention, modelbench

    spans: list[str] = []
    readings: list[contention.CpuUse | None] = []  # what each new meter's stop() returns

    class FakeMeter:
        def __init__(self):
            spans.append("start")
            self.reading = readings.pop(0)

        def stop(self):
            spans.append("stop")
            return self.reading

    real_prepare = modelbench.prepare
    monkeypatch.setattr(contention, "Meter", FakeMeter)
    monkeypatch.setattr(modelbench, "prepare",
                        lambda *a, **kw: spans.append("build") or real_prepare(*a, **kw))

    def timed():
        return modelbench.time_forward("torchvision:squeezenet1_1", ["1x3x32x32"], min_runs=3,
                                       threads=2, max_time_s=0.5)

    whole, runs = contention.CpuUse(0.1, 2, 1.3), contention.CpuUse(0.4, 2, 1.0)
    readings[:] = [whole, runs]
    m = timed()
    # the timing's own reading; the whole span's only where the timing's is too short to tell
    assert spans == ["start", "build", "start", "stop"] and m.n >= 3
    assert (m.others_cores, m.cpu_use.cpus, m.threads) == (0.4, 2, 2) and m.contended
    assert m.pace_s is not None and 0 < m.pace_s < 1  # the probe beside it (profilers.pace)
    assert m.chain_s is not None and 0 < m.chain_s < 1  # and the chain probe
    spans.clear()
    readings[:] = [whole, None]
    m = timed()
    assert spans == ["start", "build", "start", "stop", "stop"] and m.cpu_use == whole
