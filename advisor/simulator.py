"""Discrete-event simulation of the serving queue that `profilers.loadtest.run_load` really runs.

Same policy as the real server, so the two can be compared request for request:
* requests arrive (open loop) into one FIFO queue of `queue_capacity`; a full queue rejects;
* an idle worker takes the first waiting request (its dequeue time), then keeps taking requests,
  waiting at most until dequeue + `max_wait_s`, until it holds `max_batch`; with no wait left it
  still takes what is already queued;
* the batch's service time comes from a latency-vs-batch curve (optionally with noise), and every
  request of the batch completes when the batch does.
When several workers wait for the same arrival, the real server's `queue.Queue` wakes the waiter
that registered first; an idle worker re-registers every 20 ms (its poll timeout), a worker
filling a batch when it last took a request. The simulation hands arrivals out the same way.

queue = compute start - arrival (queueing plus the batching wait), compute = service time,
total = queue + compute: the loadtest's definitions. Times are seconds inside, ms at the edge.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from profilers.errors import AdvisorError
from profilers.loadtest import poisson_arrivals
from profilers.stats import LatencyStats

IDLE_POLL_S = 0.02  # the real worker's queue.get timeout while idle

# Event kinds, in the order simultaneous events are handled: a batch finishing frees a worker
# before a request arriving at the same instant is handed out; a window closing comes last.
_DONE, _ARRIVAL, _DEADLINE = 0, 1, 2


@dataclass(frozen=True)
class BatchCurve:
    """Service time (s) of one batch by its size, with optional multiplicative noise.

    `points_s` maps measured/predicted batch sizes to their median time; sizes in between are
    interpolated linearly, sizes beyond the largest extrapolated with the last slope. `noise` are
    ratios sample/median (e.g. a model's measured samples over their median); each batch draws
    one at random, so the simulated compute has the measured spread.
    """

    points_s: Mapping[int, float]
    noise: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.points_s or min(self.points_s) < 1:
            raise AdvisorError("a batch curve needs latencies for batch sizes >= 1")
        if any(not (math.isfinite(v) and v > 0) for v in self.points_s.values()):
            raise AdvisorError("batch latencies must be positive and finite")

    def median_s(self, batch: int) -> float:
        sizes = sorted(self.points_s)
        values = [self.points_s[s] for s in sizes]
        if len(sizes) == 1:
            return values[0] * batch / sizes[0] if batch > sizes[0] else values[0]
        if batch > sizes[-1]:
            slope = (values[-1] - values[-2]) / (sizes[-1] - sizes[-2])
            return values[-1] + slope * (batch - sizes[-1])
        return float(np.interp(batch, sizes, values))

    def draw_s(self, batch: int, rng: np.random.Generator) -> float:
        base = self.median_s(batch)
        if not self.noise:
            return base
        return base * float(self.noise[rng.integers(len(self.noise))])

    def scaled(self, factor: float) -> BatchCurve:
        """The same curve with every batch `factor` times as long (a lever's predicted ratio)."""
        return BatchCurve({b: t * factor for b, t in self.points_s.items()}, self.noise)


@dataclass(frozen=True)
class SimResult:
    """Per-request simulated latencies (s) of served requests, plus what could not be served."""

    queue: LatencyStats
    compute: LatencyStats
    total: LatencyStats
    batch_sizes: tuple[int, ...]  # one per served request (size of its batch)
    rejected: int
    workers: int
    max_batch: int
    max_wait_s: float
    offered: int

    @property
    def mean_batch_size(self) -> float:
        if not self.batch_sizes:
            return math.nan
        return len(self.batch_sizes) / sum(1.0 / b for b in self.batch_sizes)

    def to_json(self) -> dict:
        def ms(stats: LatencyStats) -> dict:
            if stats.n == 0:
                return {"p50": None, "p95": None, "p99": None}
            return {"p50": stats.p50 * 1e3, "p95": stats.p95 * 1e3, "p99": stats.p99 * 1e3}

        return {"requests": self.offered, "rejected": self.rejected, "workers": self.workers,
                "max_batch": self.max_batch, "max_wait_ms": self.max_wait_s * 1e3,
                "mean_batch_size": self.mean_batch_size,
                "latency_ms": {"queue": ms(self.queue), "compute": ms(self.compute),
                               "total": ms(self.total)}}


@dataclass
class _Worker:
    index: int
    state: str = "idle"  # idle | filling | busy
    since: float = 0.0  # idle: when it became idle; filling: its last take
    batch: list[int] = field(default_factory=list)
    deadline: float = 0.0
    generation: int = 0  # invalidates a stale deadline event

    def registered_at(self, now: float) -> float:
        """When this worker last started waiting on the queue (the waiter order)."""
        if self.state == "idle":
            return self.since + IDLE_POLL_S * math.floor((now - self.since) / IDLE_POLL_S)
        return self.since


class _Sim:
    def __init__(self, curve: BatchCurve | Callable[[int, np.random.Generator], float],
                 arrivals: Sequence[float], workers: int, max_batch: int, max_wait_s: float,
                 capacity: int, seed: int) -> None:
        self.service = curve.draw_s if isinstance(curve, BatchCurve) else curve
        self.arrivals = sorted(float(a) for a in arrivals)
        self.max_batch, self.max_wait_s, self.capacity = max_batch, max_wait_s, capacity
        self.workers = [_Worker(i) for i in range(workers)]
        self.rng = np.random.default_rng(seed)
        self.queue: deque[int] = deque()
        self.events: list[tuple[float, int, int, int, int]] = []
        self.start = [math.nan] * len(self.arrivals)
        self.end = [math.nan] * len(self.arrivals)
        self.size = [0] * len(self.arrivals)
        self.rejected = 0
        self._seq = 0

    def push(self, t: float, kind: int, who: int, tag: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, kind, self._seq, who, tag))

    def run(self) -> None:
        for i, a in enumerate(self.arrivals):
            self.push(a, _ARRIVAL, i)
        while self.events:
            t, kind, _, who, tag = heapq.heappop(self.events)
            if kind == _ARRIVAL:
                self.arrive(t, who)
            elif kind == _DONE:
                self.free(t, self.workers[who])
            elif self.workers[who].state == "filling" and self.workers[who].generation == tag:
                self.launch(t, self.workers[who])

    def arrive(self, t: float, rid: int) -> None:
        waiting = [w for w in self.workers if w.state in ("idle", "filling")]
        if not waiting:
            if len(self.queue) >= self.capacity:
                self.rejected += 1
            else:
                self.queue.append(rid)
            return
        worker = min(waiting, key=lambda w: (w.registered_at(t), w.index))
        if worker.state == "idle":
            self.open_batch(t, worker, [rid])
        else:
            worker.batch.append(rid)
            worker.since = t
            if len(worker.batch) >= self.max_batch:
                self.launch(t, worker)

    def open_batch(self, t: float, worker: _Worker, batch: list[int]) -> None:
        while len(batch) < self.max_batch and self.queue:
            batch.append(self.queue.popleft())  # already queued: taken at once
        worker.batch, worker.since = batch, t
        if len(batch) >= self.max_batch or self.max_wait_s <= 0:
            self.launch(t, worker)
            return
        worker.state, worker.deadline = "filling", t + self.max_wait_s
        worker.generation += 1
        self.push(worker.deadline, _DEADLINE, worker.index, worker.generation)

    def launch(self, t: float, worker: _Worker) -> None:
        size = len(worker.batch)
        done = t + self.service(size, self.rng)
        for rid in worker.batch:
            self.start[rid], self.end[rid], self.size[rid] = t, done, size
        worker.state, worker.batch = "busy", []
        worker.generation += 1
        self.push(done, _DONE, worker.index)

    def free(self, t: float, worker: _Worker) -> None:
        if self.queue:
            self.open_batch(t, worker, [self.queue.popleft()])
        else:
            worker.state, worker.since = "idle", t


def simulate(curve: BatchCurve | Callable[[int, np.random.Generator], float],
             arrivals: Sequence[float], *, workers: int = 1, max_batch: int = 1,
             max_wait_s: float = 0.0, queue_capacity: int = 1024, seed: int = 0) -> SimResult:
    """Serve `arrivals` (s) as the real load-test server would; `curve` gives batch times."""
    _check(arrivals, workers, max_batch, max_wait_s, queue_capacity)
    sim = _Sim(curve, arrivals, workers, max_batch, max_wait_s, queue_capacity, seed)
    sim.run()
    served = [i for i in range(len(sim.arrivals)) if not math.isnan(sim.start[i])]
    queue = [sim.start[i] - sim.arrivals[i] for i in served]
    compute = [sim.end[i] - sim.start[i] for i in served]
    return SimResult(queue=LatencyStats.of(queue), compute=LatencyStats.of(compute),
                     total=LatencyStats.of(q + c for q, c in zip(queue, compute, strict=True)),
                     batch_sizes=tuple(sim.size[i] for i in served), rejected=sim.rejected,
                     workers=workers, max_batch=max_batch, max_wait_s=max_wait_s,
                     offered=len(sim.arrivals))


def simulate_poisson(curve: BatchCurve, rate: float, *, duration_s: float | None = None,
                     requests: int = 2000, seed: int = 0, **serving) -> SimResult:
    """Poisson arrivals at `rate`/s (the load test's own generator and seed), then `simulate`.

    Without `duration_s`, long enough for about `requests` arrivals (p99 needs ~470+).
    """
    duration = duration_s if duration_s is not None else requests / rate
    return simulate(curve, poisson_arrivals(rate, duration, seed), seed=seed, **serving)


def capacity_rps(curve: BatchCurve, workers: int = 1, max_batch: int = 1) -> float:
    """The most requests a second the workers can serve, with every batch full at its best size:
    at a rate this high or higher the queue grows without bound (no steady-state percentile)."""
    return workers * max(b / curve.median_s(b) for b in range(1, max_batch + 1))


def utilization(curve: BatchCurve, rate: float, workers: int = 1) -> float:
    """Offered load at batch 1: rate x service time / workers (>= 1 means the queue grows)."""
    return rate * curve.median_s(1) / workers


def _check(arrivals: Sequence[float], workers: int, max_batch: int, max_wait_s: float,
           capacity: int) -> None:
    if len(arrivals) == 0:
        raise AdvisorError("no arrivals to simulate: the rate or duration is too small")
    for name, value in (("workers", workers), ("max batch", max_batch),
                        ("queue capacity", capacity)):
        if not isinstance(value, int) or value < 1:
            raise AdvisorError(f"{name} must be an integer >= 1, got {value}")
    if not (math.isfinite(max_wait_s) and max_wait_s >= 0):
        raise AdvisorError(f"max wait must be >= 0 ms, got {max_wait_s * 1e3} ms")
