"""How much CPU other processes took while we timed something.

A timing taken while another process computes on the same cores measures the contention, not the
model. Our threads meet at a barrier after every op, so a busy neighbour on one of their cores
slows a model far more than its share of the CPU: in a 2-thread profile here whose end-to-end
pass ran beside another job, settings took 1.0-2.4x their time an hour later (mobilenet_v3_large,
all small ops, 24x), and the correction fitted on them over-predicted held-out models by a median
39%. Nothing in the samples themselves gave it away (resnet18's were 1.12x apart, 1.69x slow).

So `Meter` reads the kernel's CPU accounting (/proc/stat, the CPUs this process may run on)
and this process's own CPU time (getrusage) around a timing: what the CPUs did beyond our own
use is other processes (and, on a VM, time the hypervisor gave to others: steal). Its unit is
cores: 0.5 means half a core was busy with others on average. Unknown (None) where /proc/stat
does not exist (macOS, Windows) or the window is too short for the kernel's 10 ms ticks.

`contended` says when that is too much. Measured on the 2-vCPU VM (resnet18 and
mobilenet_v3_large at 224 px, each timed as the profile does, twice; benchmarks/RESULTS.md,
2026-12-02): idle, others read 0.00-0.01 cores. At 2 threads one busy neighbour (a spin loop, a
1-thread matmul or copy) read 0.65-0.77 cores and made the models 2.1-4.0x slower; two read 1.0,
3.0-62x. At 1 thread a neighbour on the free core read 1.0: a spin loop or a matmul slowed them
0.97-1.07x, a memory copy 1.18-1.63x (two spin loops read 1.3, 1.09-1.40x). The accounting
cannot tell those apart, so a timing counts as contended once others use more than a little
(`SLACK_CORES`) plus a quarter of the cores our threads leave free (`SPARE_SHARE`): on that VM at
1 thread, any neighbour on the other core; on a 64-core server timing 4 threads, 15 cores' worth
of other work. The kernel counts each CPU in 10 ms ticks, so on many CPUs a short window reads a
little busy even when idle: the allowance grows by the ticks' rounding over the window
(`tick_noise_cores`). Logical CPUs
count as cores: a neighbour on the SMT sibling of one of our threads' cores is charged against
the free ones, so on an SMT machine timed at its physical core count one neighbour can go unseen.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

PROC_STAT = "/proc/stat"
MIN_WINDOW_S = 0.25
"""Shorter windows are not metered: /proc/stat counts in ticks (10 ms), so 0.25 s on 2 CPUs
reads to within ~0.07 cores (`tick_noise_cores`)."""
SLACK_CORES = 0.15
"""Others may always use this much: the system's own background (the profiler's parent waiting,
the kernel, a shell) read 0.00-0.01 cores on the idle VM."""
SPARE_SHARE = 0.25  # ... and this share of the cores our threads leave free

# /proc/stat fields after the name: user nice system idle iowait irq softirq steal guest
# guest_nice; guest time is already inside user. Busy is all but idle and iowait.
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class CpuUse:
    """What other processes used of our CPUs during one window."""

    others_cores: float  # average number of cores busy with other processes (>= 0)
    cpus: int  # CPUs this process may run on, which the reading covers
    window_s: float

    def contended(self, threads: int | None) -> bool:
        """Whether others used enough of the CPUs to have slowed a timing at `threads` threads
        (see above)."""
        spare = max(self.cpus - (threads or 1), 0)
        return (self.others_cores > SLACK_CORES + SPARE_SHARE * spare
                + tick_noise_cores(self.cpus, self.window_s))

    def to_stats(self) -> dict:
        """The reading as stored with a model measurement (kernels_db: `stats_json`)."""
        return {"others_cores": self.others_cores, "cpus": self.cpus, "window_s": self.window_s}

    @classmethod
    def from_stats(cls, stats: dict | None) -> CpuUse | None:
        """The reading a model measurement was stored with; None for one without (older ones)."""
        if not stats or any(stats.get(k) is None for k in ("others_cores", "cpus", "window_s")):
            return None
        return cls(float(stats["others_cores"]), int(stats["cpus"]), float(stats["window_s"]))


def _allowed_cpus() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None


def _busy_ticks(cpus: set[int]) -> int | None:
    """Busy ticks summed over `cpus`, from the per-CPU lines of /proc/stat; None if unreadable."""
    try:
        with open(PROC_STAT) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    total, seen = 0, 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        values = rest.split()
        total += sum(int(values[i]) for i in _BUSY_FIELDS if i < len(values))
        seen += 1
    return total if seen == len(cpus) else None


def _own_cpu_s() -> float:
    """CPU time (user + system) of every thread of this process."""
    import resource  # POSIX only: imported where /proc/stat already said this is Linux

    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def _ticks_per_s() -> int:
    return os.sysconf("SC_CLK_TCK")


class Meter:
    """`meter = Meter()` before a timing, `meter.stop()` after it in the same process: a
    `CpuUse`, or None if unknown. Reads /proc/stat each time; nothing runs in between."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._pid = os.getpid()  # a forked child's own CPU time starts again from 0
        self._cpus = _allowed_cpus()
        self._start = self._read()

    def _read(self) -> tuple[float, int, float] | None:
        """(clock, busy ticks of our CPUs, our own CPU seconds), or None if unreadable."""
        if not self._cpus:
            return None
        ticks = _busy_ticks(self._cpus)
        if ticks is None:
            return None
        return self._clock(), ticks, _own_cpu_s()

    def stop(self) -> CpuUse | None:
        end = self._read()
        if self._start is None or end is None or os.getpid() != self._pid:
            return None
        window_s = end[0] - self._start[0]
        if window_s < MIN_WINDOW_S:
            return None
        busy_s = (end[1] - self._start[1]) / _ticks_per_s()
        own_s = end[2] - self._start[2]
        return CpuUse(others_cores=max(busy_s - own_s, 0.0) / window_s, cpus=len(self._cpus),
                      window_s=window_s)


def tick_noise_cores(cpus: int, window_s: float) -> float:
    """How busy an idle machine can read from the ticks' rounding alone: each CPU's count over
    the window is off by less than a tick (two roundings: sd 1/sqrt(6) ticks); three sd of the
    sum over `cpus`. 0.07 cores for 2 CPUs over 0.25 s, 0.39 for 64."""
    return 3 * (cpus / 6) ** 0.5 / _ticks_per_s() / window_s


def contended(use: CpuUse | None, threads: int | None) -> bool:
    """`use.contended(threads)`; False when unknown: older timings carry no reading."""
    return use is not None and use.contended(threads)
