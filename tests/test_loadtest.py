"""Open-loop load tests against the real in-process server: accounting, batching, rejection."""

from __future__ import annotations

import csv
import json
import threading
import time

import pytest
import torch
from torch import nn

from profilers.errors import BenchError
from profilers.loadtest import (
    CSV_COLUMNS,
    arrivals_from_file,
    model_batch_runner,
    poisson_arrivals,
    run_load,
)


def sleeping_infer(base_s: float = 0.004, per_item_s: float = 0.001):
    """An infer_batch that takes a known time and records the batch sizes it was given."""
    sizes: list[int] = []

    def infer(batch_size: int) -> None:
        sizes.append(batch_size)
        time.sleep(base_s + per_item_s * batch_size)

    return infer, sizes


def assert_consistent(result, max_batch: int) -> None:
    for r in result.served:
        assert r.arrival_s <= r.dequeue_s <= r.compute_start_s <= r.compute_end_s
        assert r.compute_end_s <= r.completion_s
        assert r.queue_s + r.compute_s == pytest.approx(r.total_s, abs=1e-12)
        assert 1 <= r.batch_size <= max_batch


@pytest.fixture(scope="module")
def queued_run():
    # ~180 req/s against one worker that needs 5-8 ms per batch: requests queue and batch.
    infer, sizes = sleeping_infer()
    arrivals = poisson_arrivals(180, 2.0, seed=11)
    result = run_load(infer, arrivals, workers=1, max_batch=4, max_wait_s=0.002)
    return result, sizes, arrivals


def test_every_request_is_accounted_for(queued_run):
    result, sizes, arrivals = queued_run
    assert result.stopped_by == "done" and result.error is None
    assert len(result.records) == len(arrivals)
    assert [r.arrival_s for r in result.records] == sorted(arrivals)
    assert len(result.served) == len(arrivals)  # capacity 1024 never fills here
    assert_consistent(result, max_batch=4)
    assert max(sizes) <= 4 and sum(sizes) == len(result.served)
    assert result.mean_batch_size == pytest.approx(len(result.served) / len(sizes))


def test_queue_time_is_reported_and_batching_happens(queued_run):
    result, sizes, _ = queued_run
    assert max(sizes) > 1  # the load is high enough that batches form
    assert result.queue.p95 > 0
    assert result.total.n == result.queue.n == result.compute.n == len(result.served)


def test_littles_law_holds_over_the_window(queued_run):
    result, _, _ = queued_run
    law = result.littles_law
    assert law["mean_in_system"] > 0
    assert law["ratio"] == pytest.approx(1.0, rel=0.15)
    assert result.achieved_rps == pytest.approx(result.offered_rps, rel=0.15)
    assert not result.overloaded


def test_overload_is_said():
    # 200 req/s for 0.5 s against one worker serving 50 req/s: most of the run is queueing
    infer, _ = sleeping_infer(base_s=0.02, per_item_s=0.0)
    result = run_load(infer, [i / 200 for i in range(100)], workers=1, max_batch=1)
    assert result.overloaded and result.to_json()["overloaded"] is True
    assert "overloaded" in result.table().caption


def test_json_and_csv(queued_run, tmp_path):
    result, _, arrivals = queued_run
    out = result.to_json()
    json.dumps(out)
    assert out["status_counts"]["ok"] == len(arrivals)
    assert out["latency_ms"]["total"]["n"] == len(arrivals)
    path = tmp_path / "requests.csv"
    result.to_csv(path)
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == CSV_COLUMNS
        rows = list(reader)
    assert len(rows) == len(arrivals)
    for row in rows:
        assert row["status"] == "ok"
        total = float(row["queue_ms"]) + float(row["compute_ms"])
        assert total == pytest.approx(float(row["total_ms"]), abs=1e-5)
        assert int(row["batch_size"]) >= 1


def test_plot(queued_run, tmp_path):
    result, _, _ = queued_run
    path = tmp_path / "load.png"
    result.plot(path)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_full_queue_rejects_requests():
    # 60 requests within 30 ms, one worker at 20 ms per request, room for 2 in the queue.
    infer, _ = sleeping_infer(base_s=0.02, per_item_s=0.0)
    arrivals = [i * 0.0005 for i in range(60)]
    result = run_load(infer, arrivals, workers=1, max_batch=1, queue_capacity=2)
    statuses = [r.status for r in result.records]
    assert result.rejected == statuses.count("rejected") > 40
    assert set(statuses) == {"ok", "rejected"}
    rejected = [r for r in result.records if r.status == "rejected"]
    assert all(r.completion_s is None and r.total_s is None for r in rejected)
    assert_consistent(result, max_batch=1)


def test_workers_run_batches_in_parallel():
    infer, _ = sleeping_infer(base_s=0.1, per_item_s=0.0)
    result = run_load(infer, [0.0] * 4, workers=4, max_batch=1)
    starts = [r.compute_start_s for r in result.records]
    assert max(starts) - min(starts) < 0.1  # all four started before the first finished
    assert max(r.queue_s for r in result.records) < 0.1


def test_real_tiny_model_under_load():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
    infer = model_batch_runner(model, lambda n: torch.randn(n, 64))
    result = run_load(infer, poisson_arrivals(200, 0.5, seed=2), workers=2, max_batch=8,
                      max_wait_s=0.001)
    assert result.stopped_by == "done"
    assert len(result.served) == len(result.records)
    assert_consistent(result, max_batch=8)


def test_model_failing_under_load_keeps_served_requests():
    calls = {"n": 0}
    lock = threading.Lock()

    def infer(batch_size: int) -> None:
        with lock:
            calls["n"] += 1
            n = calls["n"]
        if n > 10:
            raise RuntimeError("CUDA error (simulated)")
        time.sleep(0.002)

    result = run_load(infer, [i * 0.005 for i in range(100)], workers=1, max_batch=1)
    assert result.stopped_by == "error" and "CUDA error" in result.error
    assert len(result.served) == 10
    statuses = {r.status for r in result.records}
    assert statuses <= {"ok", "error", "cancelled", "not_sent"} and "error" in statuses


def test_hard_cap_stops_a_stuck_server():
    release = threading.Event()

    def infer(batch_size: int) -> None:
        release.wait(5.0)

    start = time.perf_counter()
    result = run_load(infer, [0.0, 0.01, 0.02], workers=1, duration_cap_s=0.3)
    release.set()
    assert time.perf_counter() - start < 3.0
    assert result.stopped_by == "cap"
    assert {r.status for r in result.records} == {"timeout"}


def test_poisson_arrivals_are_seeded_and_match_the_rate():
    a = poisson_arrivals(100, 10.0, seed=5)
    assert a == poisson_arrivals(100, 10.0, seed=5)
    assert a != poisson_arrivals(100, 10.0, seed=6)
    assert a == sorted(a) and 0 < a[0] and a[-1] < 10.0
    assert len(a) == pytest.approx(1000, rel=0.1)


@pytest.mark.parametrize("rate, duration", [(0, 1.0), (-5, 1.0), (10, 0), (10, -1.0)])
def test_bad_rate_or_duration_is_a_bench_error(rate, duration):
    with pytest.raises(BenchError, match="must be a positive number"):
        poisson_arrivals(rate, duration)


def test_bad_server_arguments():
    infer, _ = sleeping_infer()
    with pytest.raises(BenchError):
        run_load(infer, [], workers=1)
    with pytest.raises(BenchError):
        run_load(infer, [0.0], workers=0)
    with pytest.raises(BenchError):
        run_load(infer, [0.0], max_batch=0)


def test_arrivals_from_plain_and_csv_files(tmp_path):
    plain = tmp_path / "trace.txt"
    plain.write_text("# arrivals\n0.5\n0.1\n0.25\n")
    assert arrivals_from_file(plain) == [0.1, 0.25, 0.5]
    table = tmp_path / "trace.csv"
    table.write_text("request_id,arrival_s\n0,0.0\n1,0.2\n")
    assert arrivals_from_file(table) == [0.0, 0.2]
    bad = tmp_path / "bad.txt"
    bad.write_text("0.1\nsoon\n")
    with pytest.raises(BenchError, match="not a number"):
        arrivals_from_file(bad)
    negative = tmp_path / "neg.txt"
    negative.write_text("-1\n")
    with pytest.raises(BenchError):
        arrivals_from_file(negative)
    with pytest.raises(BenchError, match="cannot read"):
        arrivals_from_file(tmp_path / "missing.txt")
