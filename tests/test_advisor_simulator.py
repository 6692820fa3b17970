"""advisor.simulator: exact queue times on deterministic cases, M/D/1 theory, the real server."""

from __future__ import annotations

import time

import numpy as np
import pytest

from advisor.simulator import BatchCurve, capacity_rps, simulate, simulate_poisson, utilization
from profilers.errors import AdvisorError
from profilers.loadtest import poisson_arrivals, run_load


def fixed(ms: float) -> BatchCurve:
    return BatchCurve({1: ms / 1e3})


def queue_ms(result) -> list[float]:
    return [round(q * 1e3, 9) for q in result.queue.samples_s]


def test_no_queueing_when_service_is_shorter_than_the_gap():
    result = simulate(fixed(5), [0.0, 0.01, 0.02, 0.03])
    assert queue_ms(result) == [0, 0, 0, 0]
    assert result.total.samples_s == pytest.approx([0.005] * 4)


def test_simultaneous_arrivals_wait_for_each_other_in_fifo_order():
    result = simulate(fixed(10), [0.0, 0.0, 0.0])
    assert queue_ms(result) == [0, 10, 20]
    two = simulate(fixed(10), [0.0, 0.0, 0.0], workers=2)
    assert queue_ms(two) == [0, 0, 10]


def test_batching_window_closes_at_the_deadline():
    curve = BatchCurve({1: 0.004, 4: 0.010})
    result = simulate(curve, [0.0, 0.001, 0.002], max_batch=4, max_wait_s=0.005)
    assert queue_ms(result) == [5, 4, 3]
    assert result.batch_sizes == (3, 3, 3)
    assert result.compute.samples_s == pytest.approx([curve.median_s(3)] * 3)
    assert curve.median_s(3) == pytest.approx(0.008)


def test_full_batch_starts_before_the_deadline():
    flat = BatchCurve({1: 0.004, 4: 0.004})
    result = simulate(flat, [0.0, 0.001, 0.002, 0.003, 0.004], max_batch=4,
                      max_wait_s=0.010)
    # The first four fill at 3 ms; the fifth waits for the worker (free at 7 ms), then its own
    # window (to 17 ms) since nothing else arrives.
    assert queue_ms(result) == [3, 2, 1, 0, 13]


def test_queued_requests_are_batched_at_once_when_the_worker_frees():
    result = simulate(fixed(10), [0.0, 0.001, 0.002, 0.003], max_batch=8, max_wait_s=0.0)
    assert result.batch_sizes == (1, 3, 3, 3)
    assert queue_ms(result) == [0, 9, 8, 7]


def test_full_queue_rejects():
    result = simulate(fixed(10), [0.0] * 5, queue_capacity=2)
    assert result.rejected == 2 and result.queue.n == 3


def test_md1_mean_wait_matches_pollaczek_khinchine():
    service_s, rate = 0.010, 70.0
    rho = rate * service_s
    result = simulate_poisson(fixed(10), rate, requests=40000, seed=3)
    expected = rho * service_s / (2 * (1 - rho))
    assert result.queue.mean == pytest.approx(expected, rel=0.05)
    assert utilization(fixed(10), rate) == pytest.approx(rho)


def test_noise_is_drawn_from_the_given_ratios():
    curve = BatchCurve({1: 0.01}, noise=(0.5, 1.5))
    result = simulate(curve, [i * 0.1 for i in range(200)])
    assert set(np.round(np.array(result.compute.samples_s) * 1e3, 6)) == {5.0, 15.0}


def test_bad_settings_are_domain_errors():
    with pytest.raises(AdvisorError):
        simulate(fixed(1), [0.0], max_batch=0)
    with pytest.raises(AdvisorError):
        BatchCurve({1: 0.0})


def _real_against_simulated(arrivals, sleep_s) -> list[str]:
    """Run the real server once and simulate it on its own compute times; say what disagrees."""
    real = run_load(lambda b: time.sleep(sleep_s(b)), arrivals, workers=1, max_batch=4,
                    max_wait_s=0.003)
    # Feed the simulator the real server's own compute times per batch size (sleep overshoot
    # included) so the comparison checks the queueing policy, not the sleep accuracy.
    measured: dict[int, list[float]] = {}
    for r in real.served:
        measured.setdefault(r.batch_size, []).append(r.compute_s)
    curve = BatchCurve({b: float(np.median(v)) for b, v in measured.items()})
    sim = simulate(curve, arrivals, workers=1, max_batch=4, max_wait_s=0.003)
    assert sim.queue.n == real.queue.n
    misses = []
    for q in (0.5, 0.9):
        s, r = sim.queue.quantile(q), real.queue.quantile(q)
        if s != pytest.approx(r, rel=0.3, abs=0.002):
            misses.append(f"p{q * 100:.0f} queue: simulated {s * 1e3:.1f} ms, "
                          f"real {r * 1e3:.1f} ms")
    if sim.mean_batch_size != pytest.approx(real.mean_batch_size, rel=0.2):
        misses.append(f"mean batch: simulated {sim.mean_batch_size:.2f}, "
                      f"real {real.mean_batch_size:.2f}")
    return misses


def test_matches_the_real_load_test_server_on_a_sleep_service():
    def sleep_s(batch: int) -> float:
        return 0.004 + 0.002 * batch

    arrivals = poisson_arrivals(120.0, 2.5, seed=11)
    # A stall on a shared machine (another process, a late wake-up) only ever makes the real
    # server slower than its median compute times say, and once cost a run 5 ms at p90; a wrong
    # queueing policy misses in every run. So up to three runs, and one must agree throughout.
    runs = []
    for _ in range(3):
        runs.append(_real_against_simulated(arrivals, sleep_s))
        if not runs[-1]:
            return
    pytest.fail("the simulator disagreed with the real server in 3 runs: "
                + " | ".join("; ".join(m) for m in runs))


def test_capacity_is_the_best_full_batch_rate():
    curve = BatchCurve({1: 0.01, 4: 0.02})  # 100 req/s one at a time, 200 in batches of 4
    assert capacity_rps(curve) == pytest.approx(100.0)
    assert capacity_rps(curve, workers=1, max_batch=4) == pytest.approx(200.0)
    assert capacity_rps(curve, workers=2, max_batch=4) == pytest.approx(400.0)
