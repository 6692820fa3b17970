"""Adaptive timing of one callable: raw samples in, a frozen `Measurement` out.

Modelled on `torch.utils.benchmark`: the record keeps every raw sample and derives its
statistics lazily; the clock is injected so the stopping logic is tested without hardware; noise
is reported ("IQR is 39% of the median"), never hidden.

Ops inside a real model run colder than the same op timed in a hot loop, so `measure` can
overwrite a buffer about the size of L2 (`CacheFlusher`) before every repetition. The flush runs
before the clock starts and is never part of a sample.
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import cached_property

import torch

from profilers import allocator, contention
from profilers.clocks import Clock, clock_for, parse_device

NOISE_THRESHOLD = 0.10  # IQR/median above this marks a measurement as noisy
CONFIDENCE = 0.95  # of the median's order-statistic interval used as the stopping rule
MIN_SAMPLES_UNDER_CAP = 3  # the time cap never leaves fewer samples than this

STOPPED_BY = ("stable", "time_cap", "max_reps")

_DEFAULT_THREADS = torch.get_num_threads()  # before anyone in this process changed it


@dataclass(frozen=True)
class Measurement:
    """Every raw sample of one timed callable, with the conditions it was timed under."""

    samples_s: tuple[float, ...]
    warmup: int
    threads: int
    flushed: bool
    device: str
    stopped_by: str
    label: str = ""
    cpu_use: contention.CpuUse | None = None  # other processes' meanwhile (None: unknown)
    pace_s: float | None = None  # the machine's pace then (profilers.pace; None: not probed)
    chain_s: float | None = None  # ... and its chain probe's (profilers.pace.chain_probe)

    @property
    def others_cores(self) -> float | None:
        return self.cpu_use.others_cores if self.cpu_use else None

    @property
    def contended(self) -> bool:
        """Other processes used enough of the CPUs to have slowed this (profilers.contention)."""
        return contention.contended(self.cpu_use, self.threads)

    def __post_init__(self) -> None:
        if not self.samples_s:
            raise ValueError("a Measurement needs at least one sample")
        if self.stopped_by not in STOPPED_BY:
            raise ValueError(f"stopped_by must be one of {STOPPED_BY}, got {self.stopped_by!r}")
        object.__setattr__(self, "samples_s", tuple(float(s) for s in self.samples_s))

    @cached_property
    def _sorted(self) -> tuple[float, ...]:
        return tuple(sorted(self.samples_s))

    @property
    def n(self) -> int:
        return len(self.samples_s)

    def quantile(self, q: float) -> float:
        """Linear-interpolation quantile (numpy's default), q in [0, 1]."""
        return _quantile(self._sorted, q)

    @cached_property
    def median_s(self) -> float:
        return self.quantile(0.5)

    @cached_property
    def iqr_s(self) -> float:
        return self.quantile(0.75) - self.quantile(0.25)

    @cached_property
    def mean_s(self) -> float:
        return math.fsum(self.samples_s) / self.n

    @cached_property
    def noise(self) -> float:
        """IQR relative to the median: the spread a reader should expect between runs."""
        return self.iqr_s / self.median_s if self.median_s > 0 else 0.0

    @property
    def is_noisy(self) -> bool:
        return self.noise > NOISE_THRESHOLD

    def describe(self) -> str:
        """One line, e.g. 'median 1.234 ms, IQR 39% of the median (noisy), 57 samples'."""
        prefix = f"{self.label}: " if self.label else ""
        flag = " (noisy)" if self.is_noisy else ""
        return (
            f"{prefix}median {format_seconds(self.median_s)}, "
            f"IQR {self.noise:.0%} of the median{flag}, {self.n} samples"
        )

    def merge(self, other: Measurement) -> Measurement:
        """Both sample sets as one measurement; the conditions must match."""
        for name in ("threads", "flushed", "device"):
            if getattr(self, name) != getattr(other, name):
                raise ValueError(
                    f"cannot merge measurements taken with different {name}: "
                    f"{getattr(self, name)!r} vs {getattr(other, name)!r}"
                )
        return Measurement(
            samples_s=self.samples_s + other.samples_s,
            warmup=self.warmup,
            threads=self.threads,
            flushed=self.flushed,
            device=self.device,
            stopped_by=other.stopped_by,
            label=self.label or other.label,
            cpu_use=max((m.cpu_use for m in (self, other) if m.cpu_use),
                        key=lambda use: use.others_cores, default=None),  # the busier reading
        )

    def to_json(self) -> dict:
        d = asdict(self)
        d["samples_s"] = list(self.samples_s)
        d["cpu_use"] = self.cpu_use.to_stats() if self.cpu_use else None
        return d

    @classmethod
    def from_json(cls, d: dict) -> Measurement:
        return cls(
            samples_s=tuple(d["samples_s"]),
            warmup=int(d["warmup"]),
            threads=int(d["threads"]),
            flushed=bool(d["flushed"]),
            device=str(d["device"]),
            stopped_by=str(d["stopped_by"]),
            label=str(d.get("label", "")),
            cpu_use=contention.CpuUse.from_stats(d.get("cpu_use")),
            pace_s=d.get("pace_s"),
            chain_s=d.get("chain_s"),
        )


def _quantile(sorted_values: tuple[float, ...], q: float) -> float:
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def format_seconds(seconds: float) -> str:
    """A duration in the unit that keeps 1-3 integer digits: '812.0 ns', '1.234 ms'."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3f} {unit}"
    return f"{seconds / 1e-9:.1f} ns"


@functools.lru_cache(maxsize=4096)
def _median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """0-based ranks (j, k) with P(x_(j) <= median <= x_(k)) >= confidence, distribution-free.

    The count of samples below the true median is Binomial(n, 1/2); None when n is too small
    for any interval to reach the confidence (n < 6 at 95%).
    """
    alpha = (1.0 - confidence) / 2.0
    if n > 500:  # 2**n leaves float range soon after; the normal approximation is exact enough
        z = statistics.NormalDist().inv_cdf(1.0 - alpha)
        j = math.floor(n / 2.0 - z * math.sqrt(n) / 2.0) - 1  # 1-based rank to 0-based
        return j, n - 1 - j
    cdf, j = 0.0, 0
    while True:  # largest j with P(Binom < j+1) <= alpha
        next_cdf = cdf + math.comb(n, j) / 2.0**n
        if next_cdf > alpha:
            break
        cdf, j = next_cdf, j + 1
    if j == 0:
        return None
    return j - 1, n - j


def median_ci_halfwidth(samples: list[float] | tuple[float, ...]) -> float | None:
    """Half-width of the distribution-free confidence interval of the median, relative to it."""
    ranks = _median_ci_ranks(len(samples))
    if ranks is None:
        return None
    ordered = sorted(samples)
    median = _quantile(tuple(ordered), 0.5)
    if median <= 0:
        return None
    return (ordered[ranks[1]] - ordered[ranks[0]]) / 2.0 / median


class CacheFlusher:
    """Overwrites a buffer of about `nbytes` so the next timed call starts with cold caches.

    About the size of L2 reproduced in-model latencies best on the development machine; a
    buffer well beyond L2 (32 MB) made ops slower than they run inside a model.
    """

    def __init__(self, nbytes: int, device: str = "cpu") -> None:
        if nbytes <= 0:
            raise ValueError(f"flush size must be positive, got {nbytes}")
        kind, index = parse_device(device)
        self.nbytes = int(nbytes)
        self.device = "cpu" if kind == "cpu" else f"cuda:{index}"
        numel = max(1, self.nbytes // 4)
        self._buffer = torch.zeros(numel, dtype=torch.float32, device=self.device)

    def __call__(self) -> None:
        # read-modify-write pulls every line into the cache hierarchy (a plain fill may use
        # non-temporal stores that bypass it)
        self._buffer.add_(1.0)
        if self.device != "cpu":
            # the flush must be finished, not just queued, before the start event is recorded
            torch.cuda.synchronize(self.device)

    def __repr__(self) -> str:
        return f"CacheFlusher({self.nbytes}, device={self.device!r})"


def flush_bytes(kind: str, threads: int, l2_bytes: int | None) -> int:
    """About the cache a timed op competes for: L2 per core x threads on a CPU, the whole
    (shared) L2 on a GPU - not x CPU threads, which made a 60 MB L2 a 960 MB flush."""
    l2 = l2_bytes or 0
    return max(l2 if kind == "cuda" else l2 * max(threads, 1), 1 << 20)


def measure(
    fn: Callable[[], object],
    *,
    clock: Clock | None = None,
    flush: Callable[[], object] | None = None,
    warmup: int = 3,
    min_reps: int = 7,
    max_reps: int = 200,
    max_time_s: float = 0.5,
    rel_tol: float = 0.02,
    device: str = "cpu",
    label: str = "",
    wall: Callable[[], float] | None = None,
    min_reps_under_cap: int = MIN_SAMPLES_UNDER_CAP,
) -> Measurement:
    """Time `fn` until its median is stable, the time cap is hit, or `max_reps` samples exist.

    Stable means the distribution-free 95% confidence interval of the median has a half-width
    below `rel_tol` of the median (checked from `min_reps` samples on). The time cap covers
    the whole call, warm-up and flushes included, as measured by `wall` (default: the clock's
    `now()` if it has one, else `time.perf_counter`); it never leaves fewer than
    `min_reps_under_cap` samples (default `MIN_SAMPLES_UNDER_CAP`; `min_reps` makes the minimum
    hold whatever the time).
    """
    allocator.apply()
    clock = clock if clock is not None else clock_for(device)
    wall = wall or getattr(clock, "now", None) or time.perf_counter
    max_reps = max(max_reps, 1)
    min_reps = min(max(min_reps, 1), max_reps)
    t0 = wall()
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    while True:
        if flush is not None:
            flush()
        token = clock.start()
        fn()
        samples.append(clock.stop(token))
        stopped_by = _stop_reason(samples, min_reps, max_reps, rel_tol, wall() - t0, max_time_s,
                                  min_reps_under_cap)
        if stopped_by:
            break
    return Measurement(
        samples_s=tuple(samples),
        warmup=warmup,
        threads=torch.get_num_threads(),
        flushed=flush is not None,
        device=device,
        stopped_by=stopped_by,
        label=label,
    )


def _stop_reason(
    samples: list[float],
    min_reps: int,
    max_reps: int,
    rel_tol: float,
    elapsed_s: float,
    max_time_s: float,
    min_reps_under_cap: int = MIN_SAMPLES_UNDER_CAP,
) -> str:
    """Why to stop now, or '' to take another sample."""
    n = len(samples)
    if n >= min_reps:
        halfwidth = median_ci_halfwidth(samples)
        if halfwidth is not None and halfwidth <= rel_tol:
            return "stable"
    if n >= max_reps:
        return "max_reps"
    if elapsed_s >= max_time_s and n >= min(min_reps_under_cap, max_reps):
        return "time_cap"
    return ""


def measure_stable(fn: Callable[[], object], *, retries: int = 1, **kw) -> Measurement:
    """`measure`, then re-measure up to `retries` times while the result is noisy.

    Samples of all attempts are kept (merged); `stopped_by` is the final attempt's.
    """
    result = measure(fn, **kw)
    for _ in range(retries):
        if not result.is_noisy:
            break
        result = result.merge(measure(fn, **kw))
    return result


@contextlib.contextmanager
def thread_count(n: int | None) -> Iterator[int]:
    """Run the block with `torch.set_num_threads(n)` (None: leave as is); restore afterwards."""
    previous = torch.get_num_threads()
    if n is not None:
        if n < 1:
            raise ValueError(f"thread count must be >= 1, got {n}")
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


def default_threads() -> int:
    """Torch's intra-op thread count as a fresh process starts: what a user deploys with."""
    return _DEFAULT_THREADS
