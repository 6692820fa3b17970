"""Timing logic against a deterministic fake clock, plus one real smoke test."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from profilers.clocks import FakeClock, PerfCounterClock, clock_for, parse_device
from profilers.contention import CpuUse
from profilers.errors import DeviceError
from profilers.timer import (
    NOISE_THRESHOLD,
    CacheFlusher,
    Measurement,
    _median_ci_ranks,
    default_threads,
    flush_bytes,
    format_seconds,
    measure,
    measure_stable,
    median_ci_halfwidth,
    thread_count,
)


def make(samples, **kw) -> Measurement:
    base = dict(warmup=0, threads=1, flushed=False, device="cpu", stopped_by="stable")
    return Measurement(samples_s=tuple(samples), **{**base, **kw})


def noop() -> None:
    return None


# --- the record -------------------------------------------------------------------------------


def test_statistics_are_exact_on_known_samples():
    m = make([5.0, 1.0, 4.0, 2.0, 3.0])
    assert m.n == 5
    assert m.median_s == 3.0
    assert m.quantile(0.25) == 2.0 and m.quantile(0.75) == 4.0
    assert m.iqr_s == 2.0
    assert m.mean_s == 3.0
    assert m.noise == pytest.approx(2.0 / 3.0)
    assert m.quantile(0.0) == 1.0 and m.quantile(1.0) == 5.0


def test_quantiles_interpolate_linearly_like_numpy():
    m = make([1.0, 2.0, 3.0, 4.0])
    assert m.median_s == 2.5
    assert m.quantile(0.25) == pytest.approx(1.75)
    assert m.quantile(0.9) == pytest.approx(3.7)
    with pytest.raises(ValueError):
        m.quantile(1.5)


def test_raw_samples_are_kept_in_order():
    m = make([3.0, 1.0, 2.0])
    assert m.samples_s == (3.0, 1.0, 2.0)


def test_noisy_flag_and_description():
    quiet = make([1e-3] * 9)
    noisy = make([1e-3, 1e-3, 1.2e-3, 1.5e-3, 1.7e-3])
    assert not quiet.is_noisy and noisy.noise > NOISE_THRESHOLD and noisy.is_noisy
    assert quiet.describe() == "median 1.000 ms, IQR 0% of the median, 9 samples"
    assert noisy.describe() == "median 1.200 ms, IQR 42% of the median (noisy), 5 samples"
    assert make([2e-6], label="conv").describe().startswith("conv: median 2.000 us")


def test_format_seconds_picks_the_unit():
    assert format_seconds(1.5) == "1.500 s"
    assert format_seconds(0.0123) == "12.300 ms"
    assert format_seconds(4e-6) == "4.000 us"
    assert format_seconds(8.12e-7) == "812.0 ns"


def test_record_is_frozen_and_validated():
    m = make([1.0])
    with pytest.raises(AttributeError):
        m.warmup = 5  # type: ignore[misc]
    with pytest.raises(ValueError):
        make([])
    with pytest.raises(ValueError):
        make([1.0], stopped_by="bored")


def test_merge_keeps_both_sample_sets_and_the_final_flag():
    a = make([1.0, 2.0], stopped_by="time_cap", label="x")
    b = make([3.0], stopped_by="stable")
    merged = a.merge(b)
    assert merged.samples_s == (1.0, 2.0, 3.0)
    assert merged.stopped_by == "stable" and merged.label == "x"
    with pytest.raises(ValueError, match="threads"):
        a.merge(make([1.0], threads=2))


def test_json_round_trip():
    m = make([1e-3, 2e-3, 1.5e-3], warmup=3, threads=2, flushed=True, label="mm")
    restored = Measurement.from_json(json.loads(json.dumps(m.to_json())))
    assert restored == m
    assert restored.median_s == m.median_s
    busy = make([1.0], threads=2, cpu_use=CpuUse(0.8, 2, 1.5))
    assert Measurement.from_json(json.loads(json.dumps(busy.to_json()))) == busy
    probed = make([1.0], pace_s=2.4e-3, chain_s=1.1e-3)  # an evaluation's rounds keep these
    assert Measurement.from_json(json.loads(json.dumps(probed.to_json()))) == probed


def test_contention_is_judged_on_the_threads_timed_and_merge_keeps_the_busier_reading():
    quiet = make([1.0], threads=2, cpu_use=CpuUse(0.05, 2, 1.0))
    busy = make([1.0], threads=2, cpu_use=CpuUse(0.9, 2, 1.0))
    assert busy.contended and not quiet.contended and not make([1.0]).contended  # unknown
    assert not make([1.0], threads=1, cpu_use=CpuUse(0.3, 2, 1.0)).contended  # a free core
    assert quiet.merge(busy).others_cores == 0.9 and busy.merge(quiet).contended
    assert quiet.merge(make([2.0], threads=2)).others_cores == 0.05
    assert make([1.0]).merge(make([2.0])).others_cores is None


# --- stopping rules ---------------------------------------------------------------------------


def test_stable_stream_stops_at_min_reps():
    clock = FakeClock([1e-3] * 100)
    m = measure(noop, clock=clock, min_reps=7)
    assert m.stopped_by == "stable"
    assert m.n == 7 and clock.calls == 7


def test_stability_needs_enough_samples_for_a_median_interval():
    # with fewer than 6 samples no 95% interval of the median exists: never "stable" before
    m = measure(noop, clock=FakeClock([1e-3] * 100), min_reps=2)
    assert m.stopped_by == "stable" and m.n == 6
    assert median_ci_halfwidth([1.0] * 5) is None


def test_median_interval_ranks_match_the_binomial_tables():
    assert _median_ci_ranks(6) == (0, 5)  # the whole range is the first 95% interval
    assert _median_ci_ranks(20) == (5, 14)  # 6th and 15th order statistics
    assert _median_ci_ranks(100) == (39, 60)
    lo, hi = _median_ci_ranks(10_000)  # large n: normal approximation, no float overflow
    assert (lo, hi) == (4901, 5098)


def test_slightly_noisy_stream_stops_once_the_median_is_pinned():
    m = measure(noop, clock=FakeClock.seeded(0, median_s=1e-3, spread=0.05), rel_tol=0.02)
    assert m.stopped_by == "stable"
    assert 7 < m.n < 200
    assert median_ci_halfwidth(m.samples_s) <= 0.02


def test_drifting_stream_hits_max_reps():
    drift = (1e-3 * 1.01**i for i in itertools.count())
    m = measure(noop, clock=FakeClock(drift), max_reps=40, max_time_s=1e9)
    assert m.stopped_by == "max_reps" and m.n == 40


def test_bimodal_stream_hits_the_time_cap_measured_on_the_injected_clock():
    modes = itertools.cycle([12.7e-6, 29.6e-6])
    clock = FakeClock(modes, overhead_s=1e-6)
    m = measure(noop, clock=clock, max_time_s=1e-3, max_reps=10_000)
    assert m.stopped_by == "time_cap"
    # virtual time per sample is 1 + (12.7 + 29.6) / 2 us; the cap stops at the first crossing
    assert clock.now() >= 1e-3
    assert clock.now() - (1e-6 + 29.6e-6) < 1e-3
    assert m.is_noisy


def test_time_cap_leaves_at_least_three_samples():
    m = measure(noop, clock=FakeClock([1.0] * 10), max_time_s=0.1, min_reps=7)
    assert m.stopped_by == "time_cap" and m.n == 3


def test_a_minimum_that_must_hold_outlasts_the_time_cap_then_the_cap_stops_the_rest():
    # hwlat evaluate: each round times its share of the 30 runs whatever they cost
    noisy = itertools.cycle([1.0, 1.5, 0.7])
    m = measure(noop, clock=FakeClock(noisy), max_time_s=0.1, min_reps=10, min_reps_under_cap=10)
    assert m.stopped_by == "time_cap" and m.n == 10


def test_time_cap_counts_wall_time_through_an_injected_wall_function():
    ticks = itertools.count()
    m = measure(noop, clock=FakeClock([1e-3, 2e-3] * 50), wall=lambda: next(ticks), max_time_s=5)
    # wall() is read once at the start and once per sample: 5 ticks elapse after 5 samples
    assert m.stopped_by == "time_cap" and m.n == 5


def test_warmup_calls_are_not_sampled():
    calls = []
    m = measure(lambda: calls.append(1), clock=FakeClock([1e-3] * 100), warmup=4)
    assert len(calls) == 4 + m.n and m.warmup == 4


# --- flushing ---------------------------------------------------------------------------------


class LoggingClock(FakeClock):
    def __init__(self, log: list[str]) -> None:
        super().__init__(itertools.repeat(1e-3))
        self.log = log

    def start(self) -> int:
        self.log.append("start")
        return super().start()

    def stop(self, token: int) -> float:
        self.log.append("stop")
        return super().stop(token)


def test_flush_runs_before_every_rep_and_outside_the_timed_region():
    log: list[str] = []
    m = measure(
        lambda: log.append("fn"),
        clock=LoggingClock(log),
        flush=lambda: log.append("flush"),
        warmup=2,
    )
    assert m.flushed
    assert log[:2] == ["fn", "fn"]  # warm-up, unflushed
    assert log[2:] == ["flush", "start", "fn", "stop"] * m.n


def test_cache_flusher_overwrites_its_buffer_each_call():
    flusher = CacheFlusher(1 << 20)
    assert flusher._buffer.numel() * 4 == 1 << 20
    flusher()
    flusher()
    assert torch.all(flusher._buffer == 2.0)
    with pytest.raises(ValueError):
        CacheFlusher(0)


# --- re-measurement ---------------------------------------------------------------------------


def test_measure_stable_remeasures_noisy_results_and_merges_samples():
    bimodal = itertools.cycle([1e-3, 3e-3])
    clock = FakeClock(bimodal)
    m = measure_stable(noop, retries=2, clock=clock, max_reps=10, max_time_s=1e9)
    assert m.n == 30 and clock.calls == 30  # noisy every time: 1 + 2 retries, all kept
    assert m.is_noisy and m.stopped_by == "max_reps"


def test_measure_stable_does_not_retry_quiet_results():
    clock = FakeClock([1e-3] * 100)
    m = measure_stable(noop, retries=3, clock=clock)
    assert m.n == 7 and clock.calls == 7


# --- threads, clocks and a real run -----------------------------------------------------------


def test_thread_count_sets_and_restores():
    before = torch.get_num_threads()
    with thread_count(1) as n:
        assert n == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with thread_count(None) as n:
        assert n == before
    assert default_threads() >= 1


def test_clock_for_devices():
    assert isinstance(clock_for("cpu"), PerfCounterClock)
    assert parse_device("cuda:1") == ("cuda", 1)
    with pytest.raises(DeviceError):
        parse_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="no NVIDIA GPU"):
            clock_for("cuda")


def test_fake_clock_runs_out_loudly():
    clock = FakeClock([1.0])
    clock.stop(clock.start())
    with pytest.raises(RuntimeError, match="ran out"):
        clock.stop(clock.start())


def test_real_smoke_on_a_tiny_cpu_op():
    x = torch.randn(32, 32)
    m = measure(lambda: torch.mm(x, x), flush=CacheFlusher(256 << 10), max_time_s=0.2, label="mm")
    assert m.n >= 3 and all(s > 0 for s in m.samples_s)
    assert m.stopped_by in ("stable", "time_cap", "max_reps")
    assert m.flushed and m.device == "cpu" and m.threads == torch.get_num_threads()
    assert m.describe().startswith("mm: median ")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_cuda_event_clock_smoke():
    x = torch.randn(256, 256, device="cuda")
    flush = CacheFlusher(8 << 20, device="cuda")
    m = measure(lambda: torch.mm(x, x), flush=flush, device="cuda", max_time_s=0.2)
    assert m.n >= 3 and m.median_s > 0 and m.device == "cuda"


def test_flush_size_is_l2_per_thread_on_a_cpu_and_the_shared_l2_on_a_gpu():
    assert flush_bytes("cpu", 2, 1 << 20) == 2 << 20
    assert flush_bytes("cuda", 16, 60 << 20) == 60 << 20  # not x threads: a 960 MB flush
    assert flush_bytes("cpu", 1, None) == flush_bytes("cpu", 0, 256 << 10) == 1 << 20  # floor

