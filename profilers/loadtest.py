"""Open-loop load test against a real in-process server with dynamic batching.

The server: a dispatcher thread releases requests at their arrival times into a bounded queue and
never waits for completions (open loop: a slow server does not slow the clients down, so queueing
shows up as it would in production). A full queue rejects the request. K worker threads each take
the first waiting request, wait up to `max_wait_s` for more (up to `max_batch`), and call
`infer_batch(batch_size)`; torch releases the GIL inside its ops, so workers overlap.

Per request, in seconds from the start of the run:
  arrival_s        the intended send time. Measuring from it, not from when the dispatcher got
                   round to enqueueing, avoids coordinated omission: dispatcher lag counts as
                   waiting, as it would for a real client.
  dequeue_s        taken off the queue by a worker (first of a batch, or while the batch fills)
  compute_start_s  the batch's model call begins
  compute_end_s    the model call returns
  completion_s     the response is handed back to the request
and queue_ms = compute_start - arrival (queueing plus the batching wait; `batch_wait_ms` =
compute_start - dequeue is reported on its own), compute_ms = completion - compute_start (the
model call plus hand-back), total_ms = completion - arrival = queue_ms + compute_ms.
"""

from __future__ import annotations

import csv
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from profilers import allocator
from profilers.errors import BenchError
from profilers.stats import LatencyStats, format_ms, insufficient_note, plot_distributions

CSV_COLUMNS = ("request_id", "arrival_s", "dequeue_s", "compute_start_s", "compute_end_s",
               "completion_s", "queue_ms", "compute_ms", "total_ms", "batch_size", "status")

# Statuses: ok (served), rejected (queue full), error (its batch raised), timeout (accepted but
# not served before the hard cap), cancelled (accepted, dropped after a model error),
# not_sent (its arrival time came after the run was stopped).
STATUSES = ("ok", "rejected", "error", "timeout", "cancelled", "not_sent")

# How long after the last arrival the server may take to drain before the run is cut off.
DEFAULT_DRAIN_S = 30.0
OVERLOAD_SHARE = 0.1  # still queued (or rejected) at the last arrival: overloaded


def poisson_arrivals(rate: float, duration: float, seed: int = 0) -> list[float]:
    """Arrival times (s) of a Poisson process of `rate` requests/s over [0, duration)."""
    _check_positive("rate", rate)
    _check_positive("duration", duration)
    rng = np.random.default_rng(seed)
    arrivals: list[float] = []
    t = 0.0
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t >= duration:
            return arrivals
        arrivals.append(t)


def arrivals_from_file(path: str | Path) -> list[float]:
    """Arrival times (s) from a file: one number per line, or a CSV with an `arrival_s` column.

    Times are sorted; they may start at any offset >= 0 (a trace's own clock is kept).
    """
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise BenchError(f"cannot read arrival trace {path}: {exc.strerror}") from exc
    lines = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise BenchError(f"arrival trace {path} is empty")
    if "arrival_s" in lines[0]:
        rows = csv.DictReader(lines)
        raw = [row.get("arrival_s") or "" for row in rows]
    else:
        raw = [line.split(",")[0] for line in lines]
    arrivals = []
    for number, text in enumerate(raw, start=1):
        try:
            value = float(text)
        except ValueError:
            raise BenchError(f"arrival trace {path}: entry {number} is not a number: "
                             f"{text.strip()!r}") from None
        if not math.isfinite(value) or value < 0:
            raise BenchError(f"arrival trace {path}: entry {number} must be a time >= 0 s, "
                             f"got {text.strip()}")
        arrivals.append(value)
    if not arrivals:
        raise BenchError(f"arrival trace {path} has no arrival times")
    return sorted(arrivals)


def model_batch_runner(model: torch.nn.Module,
                       make_batch: Callable[[int], Any]) -> Callable[[int], None]:
    """An `infer_batch` for `run_load` that runs `model` on a batch of the requested size.

    `make_batch(n)` returns the model input for n requests (a tensor, a tuple of positional
    inputs, or a dict of keyword inputs). Inputs are built once per batch size and reused: the
    server times the model, not input synthesis.
    """
    cache: dict[int, Any] = {}
    lock = threading.Lock()

    def infer_batch(batch_size: int) -> None:
        with lock:
            if batch_size not in cache:
                cache[batch_size] = make_batch(batch_size)
            inputs = cache[batch_size]
        with torch.inference_mode():
            if isinstance(inputs, dict):
                model(**inputs)
            elif isinstance(inputs, (tuple, list)):
                model(*inputs)
            else:
                model(inputs)

    return infer_batch


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request; times in seconds from the start of the run."""

    request_id: int
    arrival_s: float
    dequeue_s: float | None
    compute_start_s: float | None
    compute_end_s: float | None
    completion_s: float | None
    batch_size: int | None
    status: str

    @property
    def queue_s(self) -> float | None:
        return None if self.compute_start_s is None else self.compute_start_s - self.arrival_s

    @property
    def compute_s(self) -> float | None:
        if self.completion_s is None or self.compute_start_s is None:
            return None
        return self.completion_s - self.compute_start_s

    @property
    def total_s(self) -> float | None:
        return None if self.completion_s is None else self.completion_s - self.arrival_s

    @property
    def batch_wait_s(self) -> float | None:
        if self.compute_start_s is None or self.dequeue_s is None:
            return None
        return self.compute_start_s - self.dequeue_s

    def csv_row(self) -> dict[str, Any]:
        def ms(value: float | None) -> str:
            return "" if value is None else f"{value * 1e3:.6f}"

        def sec(value: float | None) -> str:
            return "" if value is None else f"{value:.9f}"

        return {"request_id": self.request_id, "arrival_s": sec(self.arrival_s),
                "dequeue_s": sec(self.dequeue_s), "compute_start_s": sec(self.compute_start_s),
                "compute_end_s": sec(self.compute_end_s), "completion_s": sec(self.completion_s),
                "queue_ms": ms(self.queue_s), "compute_ms": ms(self.compute_s),
                "total_ms": ms(self.total_s),
                "batch_size": "" if self.batch_size is None else self.batch_size,
                "status": self.status}


@dataclass(frozen=True)
class LoadResult:
    """Every request of a load test, and the rates, percentiles and checks derived from them."""

    records: tuple[RequestRecord, ...]
    workers: int
    max_batch: int
    max_wait_s: float
    queue_capacity: int
    stopped_by: str  # "done", "cap" (hard time cap) or "error"
    error: str | None = None
    max_dispatch_lag_s: float = 0.0

    @cached_property
    def served(self) -> tuple[RequestRecord, ...]:
        return tuple(r for r in self.records if r.status == "ok")

    def count(self, status: str) -> int:
        return sum(1 for r in self.records if r.status == status)

    @property
    def rejected(self) -> int:
        return self.count("rejected")

    @cached_property
    def total(self) -> LatencyStats:
        return LatencyStats.of(r.total_s for r in self.served)

    @cached_property
    def queue(self) -> LatencyStats:
        return LatencyStats.of(r.queue_s for r in self.served)

    @cached_property
    def compute(self) -> LatencyStats:
        return LatencyStats.of(r.compute_s for r in self.served)

    @cached_property
    def batch_wait(self) -> LatencyStats:
        return LatencyStats.of(r.batch_wait_s for r in self.served)

    @cached_property
    def window_s(self) -> tuple[float, float]:
        """The measured window: first to last arrival (the offered load), excluding the drain.

        A single arrival has no span; then the window runs to its completion.
        """
        arrivals = [r.arrival_s for r in self.records if r.status != "not_sent"]
        if not arrivals:
            return (0.0, 0.0)
        start, end = min(arrivals), max(arrivals)
        if end <= start:
            end = max([start, *(r.completion_s for r in self.served)])
        return (start, end)

    @property
    def window_length_s(self) -> float:
        start, end = self.window_s
        return end - start

    @cached_property
    def offered_rps(self) -> float:
        """Requests sent per second within the window (rejected ones included)."""
        start, end = self.window_s
        if end <= start:
            return math.nan
        sent = sum(1 for r in self.records
                   if r.status != "not_sent" and start <= r.arrival_s <= end)
        return sent / (end - start)

    @cached_property
    def achieved_rps(self) -> float:
        """Throughput: requests completed per second within the window."""
        start, end = self.window_s
        if end <= start:
            return math.nan
        done = sum(1 for r in self.served if start <= r.completion_s <= end)
        return done / (end - start)

    @cached_property
    def backlog(self) -> int:
        """Requests waiting in the queue (or turned away from a full one) when the last request
        arrived: a few under a load the server keeps up with, a growing share when it cannot."""
        end = self.window_s[1]
        return sum(1 for r in self.records
                   if r.status == "rejected"
                   or (r.status != "not_sent" and r.arrival_s <= end
                       and (r.compute_start_s is None or r.compute_start_s > end)))

    @property
    def overloaded(self) -> bool:
        """More than `OVERLOAD_SHARE` of the requests sent were still queued, or rejected, when
        the last one arrived: the queue grew through the run, so total latency measures how long
        the run was, not the service."""
        sent = sum(1 for r in self.records if r.status != "not_sent")
        return sent > 0 and self.backlog > OVERLOAD_SHARE * sent

    @cached_property
    def mean_batch_size(self) -> float:
        """Mean size of the batches that served requests (each batch counted once)."""
        if not self.served:
            return math.nan
        # A batch of size b contributes b records; weighting each by 1/b counts it once.
        batches = sum(1.0 / r.batch_size for r in self.served)
        return len(self.served) / batches

    @cached_property
    def littles_law(self) -> dict[str, float]:
        """L = X * W over the window: time-averaged requests in system vs throughput * mean total.

        L integrates, over the window, the number of served requests that have arrived and not yet
        completed; X is `achieved_rps`; W the mean total time of requests completing in the window.
        Edge effects (requests straddling the window's ends) make the two differ by about W / T.
        """
        start, end = self.window_s
        if end <= start or not self.served:
            return {"mean_in_system": math.nan, "throughput_x_mean_total": math.nan,
                    "ratio": math.nan}
        overlap = sum(max(0.0, min(r.completion_s, end) - max(r.arrival_s, start))
                      for r in self.served)
        mean_in_system = overlap / (end - start)
        in_window = [r.total_s for r in self.served if start <= r.completion_s <= end]
        mean_total = float(np.mean(in_window)) if in_window else math.nan
        predicted = self.achieved_rps * mean_total
        ratio = mean_in_system / predicted if predicted > 0 else math.nan
        return {"mean_in_system": mean_in_system, "throughput_x_mean_total": predicted,
                "ratio": ratio}

    def to_json(self) -> dict[str, Any]:
        """JSON-ready summary; latencies in ms, rates in requests/s."""
        return {
            "requests": len(self.records),
            "status_counts": {s: self.count(s) for s in STATUSES},
            "rejected": self.rejected,
            "stopped_by": self.stopped_by,
            "error": self.error,
            "workers": self.workers,
            "max_batch": self.max_batch,
            "max_wait_ms": self.max_wait_s * 1e3,
            "queue_capacity": self.queue_capacity,
            "window_s": list(self.window_s),
            "offered_rps": _finite_or_none(self.offered_rps),
            "achieved_rps": _finite_or_none(self.achieved_rps),
            "overloaded": self.overloaded,
            "backlog": self.backlog,
            "mean_batch_size": _finite_or_none(self.mean_batch_size),
            "max_dispatch_lag_ms": self.max_dispatch_lag_s * 1e3,
            "littles_law": {k: _finite_or_none(v) for k, v in self.littles_law.items()},
            "latency_ms": {"total": self.total.summary_ms(), "queue": self.queue.summary_ms(),
                           "compute": self.compute.summary_ms(),
                           "batch_wait": self.batch_wait.summary_ms()},
        }

    def to_csv(self, path: str | Path) -> None:
        """Every request, one row each, columns `CSV_COLUMNS`; empty cells where not reached."""
        try:
            with open(path, "w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
                writer.writeheader()
                writer.writerows(r.csv_row() for r in self.records)
        except OSError as exc:
            raise BenchError(f"cannot write {path}: {exc.strerror}") from exc

    def plot(self, path: str | Path) -> None:
        """ECDFs of total, queue and compute latency (log x), p50/p95/p99 marked where supported."""
        plot_distributions(str(path), {"total": self.total, "queue": self.queue,
                                       "compute": self.compute},
                           f"load test: {self.achieved_rps:.1f} req/s achieved, "
                           f"{self.workers} workers, batch <= {self.max_batch}")

    def table(self) -> Any:
        """A rich Table of the latency percentiles plus a caption with rates and counts."""
        from rich.markup import escape
        from rich.table import Table

        table = Table(title=f"load test: offered {self.offered_rps:.1f} req/s, "
                            f"achieved {self.achieved_rps:.1f} req/s (ms, [95% CI])")
        table.add_column("latency")
        names = ("p50", "p90", "p95", "p99", "max")
        for name in names:
            table.add_column(name, justify="right")
        summaries = []
        for label, stats in (("total", self.total), ("queue", self.queue),
                             ("compute", self.compute), ("batch wait", self.batch_wait)):
            summaries.append(stats.summary_ms())
            table.add_row(label, *(format_ms(summaries[-1], name) for name in names))
        law = self.littles_law
        lines = [f"{len(self.served)}/{len(self.records)} served, {self.rejected} rejected "
                 f"(queue full), mean batch {self.mean_batch_size:.2f}; Little's law "
                 f"L={law['mean_in_system']:.2f} vs X*W={law['throughput_x_mean_total']:.2f}"]
        if self.overloaded:
            lines.append(f"overloaded: {self.backlog} of the requests sent were still queued or "
                         f"rejected when the last arrived ({self.achieved_rps:.1f} of "
                         f"{self.offered_rps:.1f} req/s served), so the queue grew all run and its "
                         "latency is the run's length, not the service's; lower --rate or add "
                         "--workers or --max-batch")
        if self.error:
            lines.append(f"stopped early: {escape(self.error)}")
        note = insufficient_note(summaries)
        table.caption = "\n".join([*lines, note] if note else lines)
        return table


def run_load(
    infer_batch: Callable[[int], None],
    arrivals: Sequence[float],
    *,
    workers: int = 1,
    max_batch: int = 1,
    max_wait_s: float = 0.0,
    queue_capacity: int = 1024,
    duration_cap_s: float | None = None,
) -> LoadResult:
    """Serve requests arriving at `arrivals` (s) with `workers` threads; returns every record.

    Stops by itself once every accepted request is served, or at `duration_cap_s` after the
    start (default: last arrival + 30 s), whichever is first; at the cap, requests still queued or
    computing are reported as "timeout". A batch whose `infer_batch` raises marks its requests
    "error", stops the run, and keeps every request served so far.
    """
    _check_load_args(arrivals, workers, max_batch, max_wait_s, queue_capacity)
    allocator.apply()
    cap = duration_cap_s if duration_cap_s is not None else max(arrivals) + DEFAULT_DRAIN_S
    _check_positive("duration cap", cap)
    server = _Server(infer_batch, sorted(arrivals), workers, max_batch, max_wait_s,
                     queue_capacity)
    stopped_by = server.run(cap)
    return LoadResult(records=server.records(), workers=workers, max_batch=max_batch,
                      max_wait_s=max_wait_s, queue_capacity=queue_capacity,
                      stopped_by=stopped_by, error=server.error,
                      max_dispatch_lag_s=server.max_lag_s)


class _Req:
    """A request in flight; mutated by the dispatcher and one worker, frozen at the end."""

    __slots__ = ("rid", "arrival", "dequeue", "start", "end", "completion", "batch", "status")

    def __init__(self, rid: int, arrival: float) -> None:
        self.rid, self.arrival = rid, arrival
        self.dequeue = self.start = self.end = self.completion = None
        self.batch: int | None = None
        self.status = "not_sent"

    def freeze(self) -> RequestRecord:
        return RequestRecord(self.rid, self.arrival, self.dequeue, self.start, self.end,
                             self.completion, self.batch, self.status)


class _Server:
    """Dispatcher + bounded queue + K batching workers, all on one perf_counter timeline."""

    def __init__(self, infer_batch: Callable[[int], None], arrivals: list[float], workers: int,
                 max_batch: int, max_wait_s: float, capacity: int) -> None:
        self.infer_batch, self.workers = infer_batch, workers
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self.requests = [_Req(i, a) for i, a in enumerate(arrivals)]
        self.queue: queue.Queue[_Req] = queue.Queue(maxsize=capacity)
        self.stop = threading.Event()
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.outstanding = 0  # accepted and not yet finished
        self.dispatching = True
        self.error: str | None = None
        self.max_lag_s = 0.0
        self.t0 = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def run(self, cap_s: float) -> str:
        self.t0 = time.perf_counter()
        threads = [threading.Thread(target=self._dispatch, name="hwlat-dispatch", daemon=True)]
        threads += [threading.Thread(target=self._work, name=f"hwlat-worker-{i}", daemon=True)
                    for i in range(self.workers)]
        for thread in threads:
            thread.start()
        finished = self.done.wait(timeout=cap_s)
        self.stop.set()
        for thread in threads:
            # A worker stuck in a model call cannot be interrupted; its requests become timeouts.
            thread.join(timeout=5.0 if finished else 1.0)
        if self.error is not None:
            return "error"
        return "done" if finished else "cap"

    def records(self) -> tuple[RequestRecord, ...]:
        with self.lock:
            leftover = "cancelled" if self.error is not None else "timeout"
            for req in self.requests:
                if req.status in ("queued", "computing"):
                    req.status = leftover
            return tuple(req.freeze() for req in self.requests)

    def _dispatch(self) -> None:
        for req in self.requests:
            while not self.stop.is_set():
                delay = req.arrival - self.now()
                if delay <= 0:
                    break
                self.stop.wait(delay)
            if self.stop.is_set():
                break
            self.max_lag_s = max(self.max_lag_s, self.now() - req.arrival)
            with self.lock:
                try:
                    self.queue.put_nowait(req)
                    req.status = "queued"
                    self.outstanding += 1
                except queue.Full:
                    req.status = "rejected"
        with self.lock:
            self.dispatching = False
            self._maybe_done()

    def _maybe_done(self) -> None:
        # Called with the lock held.
        if not self.dispatching and self.outstanding == 0:
            self.done.set()

    def _work(self) -> None:
        while not self.stop.is_set():
            batch = self._take_batch()
            if batch:
                self._serve(batch)

    def _take_batch(self) -> list[_Req]:
        try:
            first = self.queue.get(timeout=0.02)
        except queue.Empty:
            return []
        first.dequeue = self.now()
        batch = [first]
        deadline = first.dequeue + self.max_wait_s
        while len(batch) < self.max_batch and not self.stop.is_set():
            remaining = deadline - self.now()
            try:
                req = (self.queue.get(timeout=remaining) if remaining > 0
                       else self.queue.get_nowait())
            except queue.Empty:
                break
            req.dequeue = self.now()
            batch.append(req)
        return batch

    def _serve(self, batch: list[_Req]) -> None:
        size = len(batch)
        start = self.now()
        for req in batch:
            req.start, req.batch, req.status = start, size, "computing"
        try:
            self.infer_batch(size)
            failure = None
        except Exception as exc:  # the run stops, served requests are kept
            failure = f"model failed under load: {type(exc).__name__}: {exc}"
        end = self.now()
        with self.lock:
            for req in batch:
                req.end = end
                if failure is None:
                    req.completion, req.status = self.now(), "ok"
                else:
                    req.status = "error"
            self.outstanding -= size
            if failure is not None and self.error is None:
                self.error = failure
                self.stop.set()
                self.done.set()
            self._maybe_done()


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise BenchError(f"{name} must be a positive number, got {value}")


def _check_load_args(arrivals: Sequence[float], workers: int, max_batch: int,
                     max_wait_s: float, capacity: int) -> None:
    if len(arrivals) == 0:
        raise BenchError("no arrivals to serve: the rate or duration is too small")
    if min(arrivals) < 0 or not all(math.isfinite(a) for a in arrivals):
        raise BenchError("arrival times must be finite and >= 0 s")
    for name, value in (("workers", workers), ("max batch", max_batch),
                        ("queue capacity", capacity)):
        if not isinstance(value, int) or value < 1:
            raise BenchError(f"{name} must be an integer >= 1, got {value}")
    if not (math.isfinite(max_wait_s) and max_wait_s >= 0):
        raise BenchError(f"max wait must be >= 0 ms, got {max_wait_s * 1e3} ms")


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
