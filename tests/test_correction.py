"""The end-to-end correction: exact recovery, robustness to a disturbed timing, honest terms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from predictor.correction import (
    ALL_TERMS_ROWS,
    Correction,
    ModelRow,
    fit_correction,
    leave_one_family_out,
    repeat_spread,
    solve_columns,
)

SHAPES = [(0.004, 60, 0.001), (0.020, 150, 0.006), (0.001, 200, 0.0004), (0.050, 90, 0.03),
          (0.010, 400, 0.002), (0.002, 30, 0.0015), (0.030, 120, 0.004), (0.006, 250, 0.003)]


def rows(a: float, overhead_s: float, c: float, *, disturb: int | None = None) -> list[ModelRow]:
    out = []
    for i, (s, n, t) in enumerate(SHAPES):
        y = a * s + overhead_s * n + c * t
        if i == disturb:
            y *= 2.6  # another process stole the core during this one timing
        out.append(ModelRow(f"m{i}", f"fam{i % 4}", ("1x3x224x224",), y, s, n, 1e9, s / 3, 1.0,
                            traffic_s=t))
    return out


def test_recovers_scale_overhead_and_traffic_terms_exactly():
    fit = fit_correction(rows(1.05, 4e-6, 0.4))
    assert fit.a == pytest.approx(1.05, rel=1e-6)
    assert fit.overhead_s == pytest.approx(4e-6, rel=1e-5)
    assert fit.c_traffic == pytest.approx(0.4, rel=1e-5)
    assert fit.apply(0.01, 100, 0.002) == pytest.approx(1.05 * 0.01 + 4e-4 + 0.4 * 0.002)


def test_one_disturbed_timing_does_not_drag_the_fit():
    clean = fit_correction(rows(1.05, 4e-6, 0.4))
    disturbed = fit_correction(rows(1.05, 4e-6, 0.4, disturb=3))
    errors = [abs(disturbed.apply(r.sum_ops_s, r.n_timed, r.traffic_s) / r.measured_s - 1)
              for i, r in enumerate(rows(1.05, 4e-6, 0.4)) if i != 3]
    assert np.median(errors) < 0.05
    assert disturbed.a == pytest.approx(clean.a, rel=0.1)


def test_recovers_the_weight_reload_term_beside_the_others():
    shapes = [(s, n, t, w) for (s, n, t), w in zip(SHAPES, (0.0, 0.002, 0.0001, 0.004, 0.0,
                                                            0.0008, 0.003, 0.0005), strict=True)]
    out = [ModelRow(f"m{i}", f"fam{i % 4}", (), 1.02 * s + 3e-6 * n + 0.45 * t + 1.9 * w, s, n,
                    1e9, s / 3, 1.0, traffic_s=t, weights_s=w)
           for i, (s, n, t, w) in enumerate(shapes)]
    fit = fit_correction(out)
    assert fit.coefficients == pytest.approx((1.02, 3e-6, 0.45, 1.9, 0.0), rel=1e-4, abs=1e-12)
    assert "1.900 x weight re-read time" in fit.note
    assert all(fit.of(r) == pytest.approx(r.measured_s) for r in out)


def test_recovers_traffic_that_only_ops_larger_than_l2_pay():
    """The 2-thread case: traffic of ops that fit in L2 costs nothing extra, the rest does."""
    large = (0.0, 0.004, 0.0, 0.025, 0.0005, 0.0, 0.003, 0.001)
    out = [ModelRow(f"m{i}", f"fam{i % 4}", (), 0.92 * s + 2.1 * w + 0.6 * big, s, n, 1e9, s / 3,
                    1.0, traffic_s=t, weights_s=w, large_traffic_s=big)
           for i, ((s, n, t), w, big) in enumerate(zip(SHAPES, (0.0, 0.002, 0.0001, 0.004, 0.0,
                                                                0.0008, 0.003, 0.0005),
                                                       large, strict=True))]
    fit = fit_correction(out)
    assert fit.terms == (0, 3, 4)
    assert fit.coefficients == pytest.approx((0.92, 0.0, 0.0, 2.1, 0.6), rel=1e-4, abs=1e-12)
    assert "0.600 x large-op traffic time" in fit.note
    assert fit.apply(0.01, 100, 0.003, 0.001, 0.002) == pytest.approx(0.0092 + 0.0021 + 0.0012)


def test_a_term_that_would_be_negative_is_dropped_not_kept():
    fit = fit_correction(rows(1.2, 0.0, -0.3))  # traffic would "speed things up": not physical
    assert fit.c_traffic == 0.0 and fit.a > 0


def test_ops_priced_at_their_cold_weights_are_taken_as_priced_not_scaled():
    """A floored op's price is its time inside a model (`ModelRow.floored_s`): the fit scales
    only the rest of the op sum, recovers `a` exactly where half of it would be wrong, and a
    prediction adds the floored part as it is."""
    floored = [0.0, 0.008, 0.0, 0.02, 0.0, 0.0005, 0.0, 0.002]
    out = [ModelRow(f"m{i}", f"fam{i % 4}", (), 0.7 * s + 3e-6 * n + 0.4 * t + f, s + f, n, 1e9,
                    s / 3, 1.0, traffic_s=t, floored_s=f)
           for i, ((s, n, t), f) in enumerate(zip(SHAPES, floored, strict=True))]
    fit = fit_correction(out)
    assert fit.coefficients == pytest.approx((0.7, 3e-6, 0.4, 0.0, 0.0), rel=1e-4, abs=1e-12)
    assert all(fit.of(r) == pytest.approx(r.measured_s) for r in out)
    assert "0.700 x sum of ops not priced at their cold weights (those as priced)" in fit.note
    assert fit.apply(0.03, 100, 0.002, floored_s=0.01) == pytest.approx(
        0.7 * 0.02 + 0.01 + 3e-4 + 0.4 * 0.002)
    # the floor under a negative per-op term leaves the floored part whole too
    assert Correction(a=1.0, overhead_s=-6e-6).apply(0.012, 5000, floored_s=0.002) == \
        pytest.approx(0.5 * 0.010 + 0.002)


def test_recovers_a_negative_per_op_term_and_says_what_it_is():
    """Ops timed alone after a cache flush start colder than inside a model: the per-op term is
    the one term that may come out negative (the Xeon of 12-05: -6 us per op at 1 thread)."""
    fit = fit_correction(rows(1.03, -6e-6, 0.3))
    assert fit.overhead_s == pytest.approx(-6e-6, rel=1e-5)
    assert fit.a == pytest.approx(1.03, rel=1e-6) and fit.c_traffic == pytest.approx(0.3, rel=1e-5)
    assert "- 6.00 us per timed op (timed alone, an op starts colder" in fit.note
    assert "per-op overhead" not in fit.note  # kept, not listed as left out


def test_a_negative_per_op_term_never_takes_a_prediction_below_half_the_op_sum():
    c = Correction(a=1.0, overhead_s=-6e-6)
    assert c.apply(0.010, 100) == pytest.approx(0.010 - 6e-4)
    assert c.apply(0.010, 5000) == pytest.approx(0.005)  # 30 ms of "savings" on a 10 ms sum


def test_solve_columns_fits_any_number_of_candidate_terms_and_drops_negative_ones():
    """The solver behind the correction takes extra columns (benchmarks/correction_variants.py)."""
    rng = np.random.default_rng(3)
    x = np.column_stack([rng.uniform(0.001, 0.05, 40), rng.integers(30, 400, 40),
                         *rng.uniform(0.0, 0.01, (4, 40))])
    y = x @ np.array([1.1, 3e-6, 0.0, 0.5, 0.0, 1.7])
    assert solve_columns(x, y) == pytest.approx([1.1, 3e-6, 0.0, 0.5, 0.0, 1.7], rel=1e-6,
                                                abs=1e-9)
    only = solve_columns(x, y, terms=(5,))  # column 0 always, 5 asked for, the rest held at 0
    assert only[1:5] == pytest.approx([0, 0, 0, 0]) and only[5] > 0
    x[:, 2] = x[:, 0] * rng.uniform(0.0, 0.5, 40)  # a column that would "speed things up"
    anti = solve_columns(x, x[:, 0] + 3e-6 * x[:, 1] - 0.5 * x[:, 2])
    assert anti[2] == 0.0 and np.all(anti >= 0) and anti[1] > 0
    # only column 0 negative: nothing to drop, so the plain-sum ratio instead (this looped forever)
    y = -0.5 * x[:, 0] + 1e-4 * x[:, 1]
    s = x[:, 0] / y
    assert solve_columns(x, y, terms=(1,)) == pytest.approx([s.sum() / (s * s).sum(), 0, 0, 0, 0, 0])


def test_a_lower_threshold_on_the_slow_side_weighs_slow_timings_less():
    """`k_slow` (benchmarks/correction_variants.py's "slow side" variants): settings measured
    slower than their fit weigh less the lower it is."""
    rng = np.random.default_rng(5)
    x = rng.uniform(0.001, 0.05, (30, 1))
    y = x[:, 0] * (1 + rng.normal(0.0, 0.02, 30))
    y[:8] *= 1.35  # a quarter timed in a slow spell
    assert solve_columns(x, y)[0] > 1.04  # Huber at 2 robust sigmas on both sides
    assert solve_columns(x, y, k_slow=0.5)[0] == pytest.approx(1.0, abs=0.005)


def test_lofo_reports_held_out_error_against_the_plain_sum():
    cv = leave_one_family_out(rows(1.3, 5e-6, 0.2))
    assert cv["n_families"] == 4
    assert cv["lofo_mape"] < 0.01 < cv["plain_sum_mape"]


def test_no_rows_means_plain_sum_and_says_so():
    c = fit_correction([])
    assert c == Correction() and "no end-to-end" in c.note


def test_interval_band_comes_from_held_out_families_not_the_fit_itself():
    """A family the others do not explain widens the band; an in-sample fit would absorb it."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(24):
        s, n, t = 0.002 + 0.002 * i, 50 + 10 * i, 0.001 * (i % 5)
        family = f"fam{i % 6}"
        y = (1.1 * s + 5e-6 * n + 0.3 * t) * (1.12 if family == "fam0" else 1.0)
        y *= 1 + rng.normal(0, 0.005)
        out.append(ModelRow(f"m{i}", family, (), y, s, n, 1e9, s / 3, 1.0, traffic_s=t))
    fit = fit_correction(out)
    in_sample = np.log([r.measured_s / fit.of(r) for r in out])
    assert fit.resid_hi > np.percentile(in_sample, 90) + 0.01
    assert fit.resid_lo <= 0.0 <= fit.resid_hi


def test_terms_that_do_not_help_held_out_families_are_left_out():
    """Latency that is a plain multiple of the op sum: extra terms only fit the noise."""
    rng = np.random.default_rng(1)
    out = [ModelRow(f"m{i}", f"fam{i}", (), 1.1 * s * (1 + rng.normal(0, 0.02)), s, n, 1e9,
                    s / 3, 1.0, traffic_s=t, weights_s=w)
           for i, (s, n, t, w) in enumerate(zip(rng.uniform(0.002, 0.05, 6),
                                                rng.integers(30, 400, 6),
                                                rng.uniform(0, 0.01, 6), rng.uniform(0, 0.004, 6),
                                                strict=True))]
    fit = fit_correction(out)
    assert fit.terms == (0,)
    assert fit.coefficients[1:] == (0.0, 0.0, 0.0, 0.0)
    assert fit.a == pytest.approx(1.1, rel=0.03)
    assert "left out" in fit.note and "weight re-read" in fit.note


def test_a_full_profile_fits_every_term_and_drops_only_a_negative_one():
    """With a full zoo's settings no subset is chosen: a choice made on noisy timings flipped
    between profiles of one machine and predicted held-out models worse (module docstring)."""
    rng = np.random.default_rng(2)
    n_rows = ALL_TERMS_ROWS + 6
    s, n = rng.uniform(0.002, 0.05, n_rows), rng.integers(30, 400, n_rows)
    t, w, big = (rng.uniform(0, 0.01, n_rows), rng.uniform(0, 0.004, n_rows),
                 rng.uniform(0, 0.005, n_rows))
    out = [ModelRow(f"m{i}", f"fam{i % 6}", (), (1.05 * s[i] + 4e-6 * n[i] + 0.4 * t[i]
                                                  + 1.5 * w[i] - 0.2 * big[i])
                    * (1 + rng.normal(0, 0.01)), s[i], int(n[i]), 1e9, s[i] / 3, 1.0,
                    traffic_s=t[i], weights_s=w[i], large_traffic_s=big[i])
           for i in range(n_rows)]
    fit = fit_correction(out)
    assert fit.terms == (0, 1, 2, 3, 4)
    assert fit.c_large_traffic == 0.0  # it would "speed things up": not physical
    assert fit.a == pytest.approx(1.05, rel=0.1) and fit.c_weights == pytest.approx(1.5, rel=0.2)
    assert "large-op traffic left out: a negative fit" in fit.note


def test_repeat_spread_is_a_quantile_of_how_far_two_timings_of_a_setting_fall_apart():
    pairs = [[1.0, 1.0 * r] for r in (1.00, 1.02, 1.05, 1.10, 1.30)] + [[2.0]]  # one timed once
    spread = repeat_spread(pairs)
    assert np.log(1.10) < spread < np.log(1.30)  # the 80th percentile of the five log ratios
    assert repeat_spread([[1.0], [3.0]]) == 0.0


def test_the_interval_holds_the_device_repeatability_in_quadrature():
    from predictor.e2e import OpEstimate, Predictor

    est = [OpEstimate(1e-3, 0.9e-3, 1.1e-3, "model", "conv")]
    steady = Correction(resid_lo=-0.05, resid_hi=0.05)
    shaky = Correction(resid_lo=-0.05, resid_hi=0.05, repeat_spread=0.12)
    lo0, hi0 = Predictor._interval(1e-3, 1e-3, est, steady)
    lo1, hi1 = Predictor._interval(1e-3, 1e-3, est, shaky)
    assert lo1 < lo0 < 1e-3 < hi0 < hi1
    assert np.isclose(np.log(hi1 / 1e-3), math.hypot(np.log(1.1), 0.05, 0.12))
