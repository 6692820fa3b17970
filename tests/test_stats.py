"""Percentiles, the insufficient-sample rule, bootstrap intervals and noise, on exact data."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from profilers.errors import BenchError
from profilers.stats import (
    LatencyStats,
    format_ms,
    insufficient_note,
    min_samples_for,
    percentile,
    plot_distributions,
)


def seeded_clock_samples(n: int, seed: int = 7) -> list[float]:
    """Durations from a seeded fake clock: log-normal around 1 ms."""
    rng = random.Random(seed)
    return [1e-3 * rng.lognormvariate(0.0, 0.2) for _ in range(n)]


def test_percentile_is_linear_interpolation_between_order_statistics():
    data = [5.0, 1.0, 4.0, 2.0, 3.0]  # sorted: 1 2 3 4 5, position h = 4q
    assert percentile(data, 0.5) == 3.0
    assert percentile(data, 0.0) == 1.0
    assert percentile(data, 1.0) == 5.0
    assert percentile(data, 0.9) == pytest.approx(4.6)  # h = 3.6 -> 4 + 0.6 * (5 - 4)
    assert percentile(data, 0.125) == pytest.approx(1.5)


def test_percentiles_of_1_to_100():
    stats = LatencyStats.of(range(1, 101))  # h = 99q, value = 1 + h
    assert stats.p50 == pytest.approx(50.5)
    assert stats.p90 == pytest.approx(90.1)
    assert stats.p95 == pytest.approx(95.05)
    assert stats.p99 == pytest.approx(99.01)
    assert stats.max == 100.0
    assert stats.iqr == pytest.approx(75.25 - 25.75)


def test_percentile_rejects_bad_input():
    with pytest.raises(BenchError):
        percentile([], 0.5)
    with pytest.raises(BenchError):
        percentile([1.0], 1.5)


def test_min_samples_rule_values():
    # Smallest n with P(Binomial(n, 1-q) >= 2) >= 0.95.
    assert min_samples_for(0.99) == 473
    assert min_samples_for(0.95) == 93
    assert min_samples_for(0.90) == 46
    assert min_samples_for(0.50) == 8


@pytest.mark.parametrize("q", [0.5, 0.9, 0.95, 0.99])
def test_min_samples_rule_is_the_smallest_n(q):
    def at_least_two_above(n):
        tail = 1 - q
        return 1 - q**n - n * tail * q ** (n - 1)

    n = min_samples_for(q)
    assert at_least_two_above(n) >= 0.95
    assert at_least_two_above(n - 1) < 0.95


def test_insufficient_rule_at_200_and_500_samples():
    small = LatencyStats.of(seeded_clock_samples(200))
    assert small.supported(0.95)
    assert not small.supported(0.99)
    big = LatencyStats.of(seeded_clock_samples(500))
    assert big.supported(0.99)


def test_summary_never_shows_a_number_for_an_insufficient_percentile():
    stats = LatencyStats.of(seeded_clock_samples(200))
    summary = stats.summary_ms()
    assert summary["insufficient"] == ["p99"]
    assert summary["p99"] is None and summary["ci95"]["p99"] is None
    assert summary["p95"] == pytest.approx(stats.p95 * 1e3)
    assert summary["max"] == pytest.approx(stats.max * 1e3)
    json.dumps(summary)  # JSON-ready
    assert format_ms(summary, "p99") == "insufficient"
    assert "p99 needs >= 473" in insufficient_note([summary])

    tiny = LatencyStats.of([0.001, 0.002, 0.003]).summary_ms()
    assert tiny["insufficient"] == ["p50", "p90", "p95", "p99"]
    assert all(tiny[name] is None for name in ("p50", "p90", "p95", "p99"))


def test_empty_stats_summary_is_all_none():
    summary = LatencyStats.of([]).summary_ms()
    assert summary["n"] == 0 and summary["p50"] is None and summary["max"] is None


def test_bootstrap_ci_is_seeded_and_contains_the_estimate():
    stats = LatencyStats.of(seeded_clock_samples(600))
    for q in (0.5, 0.95, 0.99):
        lo, hi = stats.ci(q, seed=3)
        assert (lo, hi) == stats.ci(q, seed=3)
        assert lo <= stats.quantile(q) <= hi
        assert lo < hi
    assert stats.ci(0.5, seed=3) != stats.ci(0.5, seed=4)
    # Several quantiles from one set of resamples agree with one at a time.
    assert stats.cis([0.5, 0.99], seed=3) == [stats.ci(0.5, seed=3), stats.ci(0.99, seed=3)]


def test_bootstrap_ci_narrows_with_more_samples():
    def width(n):
        lo, hi = LatencyStats.of(seeded_clock_samples(n)).ci(0.5)
        return hi - lo

    assert width(2000) < width(100)


def test_noise_is_iqr_over_median_with_a_warning():
    quiet = LatencyStats.of([1.0, 1.01, 1.02, 1.03, 1.04])
    assert quiet.noise == pytest.approx(0.02 / 1.02)
    assert quiet.noise_warning is None
    noisy = LatencyStats.of([1.0, 1.0, 2.0, 3.0, 3.0])
    assert noisy.noise == pytest.approx(1.0)
    assert "100.0% of the median" in noisy.noise_warning


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "dist.png"
    plot_distributions(str(path), {"total": LatencyStats.of(seeded_clock_samples(300)),
                                   "empty": LatencyStats.of([])}, "test")
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(BenchError):
        plot_distributions(str(tmp_path / "x.png"), {"e": LatencyStats.of([])}, "t")


def test_mean_and_numpy_agree():
    data = seeded_clock_samples(321)
    stats = LatencyStats.of(data)
    assert stats.mean == pytest.approx(float(np.mean(data)))
    assert math.isclose(stats.p90, float(np.percentile(data, 90)))
