"""Swappable clocks for the timer.

The timing logic in `profilers.timer` only ever talks to a `Clock`, so it can be tested with a
deterministic `FakeClock` and run unchanged on CPUs (`PerfCounterClock`) and NVIDIA GPUs
(`CudaEventClock`). CUDA is imported and touched only when a CUDA clock is constructed, so CPU
machines never initialise it.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

from profilers.errors import DeviceError


@runtime_checkable
class Clock(Protocol):
    """Times one region: `token = clock.start(); ...; seconds = clock.stop(token)`."""

    def start(self) -> Any: ...

    def stop(self, token: Any) -> float: ...


class PerfCounterClock:
    """Host wall time from `time.perf_counter`."""

    def start(self) -> float:
        return time.perf_counter()

    def stop(self, token: float) -> float:
        return time.perf_counter() - token

    def __repr__(self) -> str:
        return "PerfCounterClock()"


class CudaEventClock:
    """Device time between two CUDA events recorded on the device's current stream.

    Events time the GPU's own work: everything queued on the stream before `start()` (warm-up,
    a cache flush) is excluded because the start event only fires once that work is done.
    """

    def __init__(self, device: str = "cuda") -> None:
        import torch  # lazily: constructing this clock is the first CUDA touch

        if not torch.cuda.is_available():
            raise DeviceError(
                "no NVIDIA GPU visible on this machine; time on a GPU machine or use device 'cpu'"
            )
        self.device = torch.device(device)
        self._torch = torch

    def start(self) -> Any:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record(self._torch.cuda.current_stream(self.device))
        return event

    def stop(self, token: Any) -> float:
        end = self._torch.cuda.Event(enable_timing=True)
        end.record(self._torch.cuda.current_stream(self.device))
        end.synchronize()
        return token.elapsed_time(end) / 1000.0  # elapsed_time is in milliseconds

    def __repr__(self) -> str:
        return f"CudaEventClock({str(self.device)!r})"


class FakeClock:
    """A deterministic clock for tests: `stop()` returns the given durations in order.

    `now()` is virtual wall time: the sum of the durations handed out so far plus `overhead_s`
    for every `start()` (the untimed work around a sample), so time caps are testable too.
    """

    def __init__(self, durations: Iterable[float], overhead_s: float = 0.0) -> None:
        self._durations: Iterator[float] = iter(durations)
        self.overhead_s = overhead_s
        self.elapsed_s = 0.0
        self.calls = 0

    @classmethod
    def seeded(
        cls, seed: int, median_s: float = 1e-3, spread: float = 0.05, overhead_s: float = 0.0
    ) -> FakeClock:
        """An endless log-normal stream around `median_s` with relative `spread`, fixed by `seed`."""
        rng = random.Random(seed)
        stream = (median_s * rng.lognormvariate(0.0, spread) for _ in itertools.count())
        return cls(stream, overhead_s=overhead_s)

    def start(self) -> int:
        self.elapsed_s += self.overhead_s
        return self.calls

    def stop(self, token: int) -> float:
        try:
            duration = float(next(self._durations))
        except StopIteration:
            raise RuntimeError(f"FakeClock ran out of durations after {self.calls}") from None
        self.calls += 1
        self.elapsed_s += duration
        return duration

    def now(self) -> float:
        return self.elapsed_s

    def __repr__(self) -> str:
        return f"FakeClock(calls={self.calls})"


def parse_device(device: str) -> tuple[str, int]:
    """Split 'cpu', 'cuda' or 'cuda:N' into (kind, index); anything else is a DeviceError."""
    kind, _, index = device.strip().lower().partition(":")
    if kind == "cpu" and not index:
        return "cpu", 0
    if kind == "cuda" and (not index or index.isdigit()):
        return "cuda", int(index or 0)
    raise DeviceError(f"unknown device {device!r}; use 'cpu', 'cuda' or 'cuda:N'")


def clock_for(device: str) -> Clock:
    """The right clock for a device string: host time on CPU, CUDA events on GPUs."""
    kind, index = parse_device(device)
    if kind == "cpu":
        return PerfCounterClock()
    return CudaEventClock(f"cuda:{index}")
