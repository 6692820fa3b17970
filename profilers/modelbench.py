"""Closed-loop model benchmark: warm-up, then N timed requests split into their stages.

A request is preprocess (raw input -> tensors), host-to-device copy, forward pass, device-to-host
copy, postprocess. Each stage is timed on its own clock and kept as raw samples, so a report can
show that the forward pass is not the whole story. On CUDA the copies and the forward pass are
timed with CUDA events (host timers would only see the kernel launches); the rest, and the
request total, with a host clock.

Clocks are `profilers.clocks.Clock`s (`start() -> token`, `stop(token) -> seconds`) made by an
injectable factory, so the stage accounting is tested with a fake clock.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from profilers.clocks import Clock, CudaEventClock, PerfCounterClock
from profilers.errors import BenchError, DeviceError
from profilers.stats import (
    QUANTILES,
    LatencyStats,
    format_ms,
    insufficient_note,
    plot_distributions,
)

if TYPE_CHECKING:
    from profilers.timer import Measurement

STAGES = ("preprocess", "h2d", "forward", "d2h", "postprocess", "total")


class HostClock:
    """A host wall clock over any `now() -> seconds` function (a fake one in tests)."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now

    def start(self) -> float:
        return self._now()

    def stop(self, token: float) -> float:
        return self._now() - token


# kind ("host" or "cuda") -> a fresh clock
ClockFactory = Callable[[str], Clock]


def default_clock_factory(now: Callable[[], float] | None = None,
                          device: str = "cuda") -> ClockFactory:
    """kind "host" -> perf_counter (or a host clock over `now`); kind "cuda" -> CUDA events."""

    def make(kind: str) -> Clock:
        if kind == "cuda":
            return CudaEventClock(device)
        return HostClock(now) if now is not None else PerfCounterClock()

    return make


@dataclass(frozen=True)
class BenchResult:
    """Per-stage latency samples of a closed-loop benchmark, and what went wrong, if anything."""

    stages: Mapping[str, LatencyStats]
    device: str
    runs: int
    completed_runs: int
    warmup: int
    threads: int
    error: str | None = None
    telemetry_before: Mapping[str, Any] | None = None
    telemetry_after: Mapping[str, Any] | None = None
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def total(self) -> LatencyStats:
        return self.stages["total"]

    def all_warnings(self) -> list[str]:
        """Telemetry warnings plus a noise warning for every noisy stage."""
        noisy = [f"{name}: {s.noise_warning}" for name, s in self.stages.items()
                 if s.noise_warning]
        return [*self.warnings, *noisy]

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict; latencies in milliseconds, unsupported percentiles are null."""
        return {
            "device": self.device,
            "runs": self.runs,
            "completed_runs": self.completed_runs,
            "warmup": self.warmup,
            "threads": self.threads,
            "error": self.error,
            "stages_ms": {name: s.summary_ms() for name, s in self.stages.items()},
            "telemetry": {"before": self.telemetry_before, "after": self.telemetry_after},
            "warnings": self.all_warnings(),
        }

    def table(self) -> Any:
        """A rich Table: one row per stage, p50..p99 with 95% intervals, max and noise."""
        from rich.markup import escape
        from rich.table import Table

        table = Table(title=f"{self.completed_runs}/{self.runs} runs on {self.device}, "
                            f"{self.threads} threads (ms, [95% CI])")
        table.add_column("stage")
        for name in (*QUANTILES, "max", "IQR/median"):
            table.add_column(name, justify="right")
        summaries = []
        for name, stats in self.stages.items():
            summary = stats.summary_ms()
            summaries.append(summary)
            noise = summary["noise"]
            table.add_row(name, *(format_ms(summary, q) for q in (*QUANTILES, "max")),
                          "-" if noise is None else f"{noise * 100:.1f}%")
        lines = [f"stopped early: {self.error}"] if self.error else []
        note = insufficient_note(summaries)
        lines += [note] if note else []
        lines += [f"warning: {w}" for w in self.all_warnings()]
        if lines:
            table.caption = escape("\n".join(lines))  # an error's text is not markup
        return table

    def plot(self, path: str) -> None:
        """ECDF of every measured stage (log x), with p50/p95/p99 marked where supported."""
        plot_distributions(path, self.stages, f"hwlat bench on {self.device}")


def bench_model(
    model: torch.nn.Module,
    make_inputs: Callable[[], Any],
    *,
    runs: int = 200,
    warmup: int = 10,
    preprocess: Callable[[Any], Any] | None = None,
    postprocess: Callable[[Any], Any] | None = None,
    device: str = "cpu",
    clock_factory: ClockFactory | None = None,
    raw_input: Any = None,
    threads: int | None = None,
    telemetry: Callable[[], Any] | None = None,
    compare_telemetry: Callable[[Any, Any], list[str]] | None = None,
) -> BenchResult:
    """Warm up, then time `runs` requests stage by stage.

    Inputs: with `preprocess`, each request calls `preprocess(raw)` where raw is `raw_input`, or
    `make_inputs()` when no raw input is given; without it, `make_inputs()` is the model input
    (created once, outside the timing). A tensor is passed positionally, a tuple/list as
    positional arguments, a dict as keyword arguments.

    Failures: a preprocess that raises on its first call -> BenchError("preprocess failed: ...");
    a model that raises on its very first call -> BenchError (nothing to report). A failure
    later keeps every completed run, sets `error` and `completed_runs`; the caller reports both.
    On CUDA `telemetry()` is read before and after (defaults to profilers.telemetry for the
    device's index) and `compare_telemetry` turns the pair into warnings (e.g. throttling).
    """
    if runs < 1 or warmup < 0:
        raise BenchError(f"runs must be >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    is_cuda = torch.device(device).type == "cuda"
    if is_cuda and not torch.cuda.is_available():
        raise DeviceError(f"device {device} is not available here (no CUDA); bench on a GPU "
                          "machine or use --device cpu")
    clocks = clock_factory or default_clock_factory(device=device)
    request = _Request(model.to(device).eval(), make_inputs, preprocess, postprocess,
                       raw_input, device, clocks, is_cuda)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        read, compare = _telemetry_hooks(device, is_cuda, telemetry, compare_telemetry)
        before = read() if read else None
        samples, error = _run_all(request, runs, warmup)
        after = read() if read else None
        used_threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(previous_threads)
    warnings = tuple(compare(before, after)) if compare and before and after else ()
    stages = {name: LatencyStats.of(values) for name, values in samples.items()}
    return BenchResult(stages=stages, device=device, runs=runs,
                       completed_runs=stages["total"].n, warmup=warmup, threads=used_threads,
                       error=error, telemetry_before=_as_dict(before),
                       telemetry_after=_as_dict(after), warnings=warnings)


class _Request:
    """One request through the stages, each stage timed on its own clock."""

    def __init__(self, model: torch.nn.Module, make_inputs: Callable[[], Any],
                 preprocess: Callable[[Any], Any] | None,
                 postprocess: Callable[[Any], Any] | None, raw_input: Any, device: str,
                 clocks: ClockFactory, is_cuda: bool) -> None:
        self.model, self.preprocess, self.postprocess = model, preprocess, postprocess
        self.device, self.is_cuda = device, is_cuda
        self.host = clocks("host")
        self.gpu = clocks("cuda") if is_cuda else None
        if preprocess is None:
            self.fixed_inputs = make_inputs()
        else:
            self.fixed_inputs = None
            self.raw = raw_input if raw_input is not None else make_inputs()
        self.stage_names = [name for name in STAGES if self._has(name)]

    def _has(self, stage: str) -> bool:
        if stage in ("h2d", "d2h"):
            return self.is_cuda
        if stage == "preprocess":
            return self.preprocess is not None
        if stage == "postprocess":
            return self.postprocess is not None
        return True

    def run(self) -> dict[str, float]:
        """Time one request; returns seconds per stage, "total" included."""
        times: dict[str, float] = {}
        total = self.host.start()
        inputs = self.fixed_inputs
        if self.preprocess is not None:
            token = self.host.start()
            try:
                inputs = self.preprocess(self.raw)
            except Exception as exc:
                raise _PreprocessError() from exc
            times["preprocess"] = self.host.stop(token)
        if self.gpu is not None:
            token = self.gpu.start()
            inputs = _move(inputs, self.device)
            times["h2d"] = self.gpu.stop(token)
        with torch.inference_mode():
            clock = self.gpu or self.host
            token = clock.start()
            output = _call(self.model, inputs)
            times["forward"] = clock.stop(token)
        if self.gpu is not None:
            token = self.gpu.start()
            output = _move(output, "cpu")
            times["d2h"] = self.gpu.stop(token)
        if self.postprocess is not None:
            token = self.host.start()
            self.postprocess(output)
            times["postprocess"] = self.host.stop(token)
        times["total"] = self.host.stop(total)
        return times


class _PreprocessError(Exception):
    """Marks a failure inside the user's preprocess, so it is reported as such."""


def _run_all(request: _Request, runs: int,
             warmup: int) -> tuple[dict[str, list[float]], str | None]:
    """Warm-up plus timed runs; a failure after the first call ends the loop, keeping samples.

    The first call is never timed: it checks that the pipeline works at all (it is the first
    warm-up run, and an extra untimed run when warmup=0).
    """
    samples: dict[str, list[float]] = {name: [] for name in request.stage_names}
    _first_call(request)
    untimed = max(warmup - 1, 0)
    for i in range(untimed + runs):
        try:
            times = request.run()
        except Exception as exc:  # any failure mid-run is reported; completed runs are kept
            cause = exc.__cause__ if isinstance(exc, _PreprocessError) else exc
            stage = "preprocess" if isinstance(exc, _PreprocessError) else "model"
            done = max(0, i - untimed)
            return samples, (f"{stage} failed after {done} timed runs: "
                             f"{type(cause).__name__}: {cause}")
        if i >= untimed:
            for name, value in times.items():
                samples[name].append(value)
    return samples, None


def _first_call(request: _Request) -> None:
    try:
        request.run()
    except _PreprocessError as exc:
        cause = exc.__cause__
        raise BenchError(f"preprocess failed: {type(cause).__name__}: {cause}") from cause
    except Exception as exc:
        raise BenchError(f"model failed on its first run: {type(exc).__name__}: {exc}") from exc


def _call(model: torch.nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _move(value: Any, device: str) -> Any:
    """Move every tensor in a (nested) tuple/list/dict to `device`, leaving other values alone."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, Mapping):
        return {k: _move(v, device) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_move(v, device) for v in value)
    if hasattr(value, "to_tuple"):  # transformers ModelOutput
        return _move(value.to_tuple(), device)
    return value


def _telemetry_hooks(device: str, is_cuda: bool, read: Callable[[], Any] | None,
                     compare: Callable[[Any, Any], list[str]] | None,
                     ) -> tuple[Callable[[], Any] | None, Callable[[Any, Any], list[str]] | None]:
    """Injected hooks win; on CUDA fall back to profilers.telemetry when it is installed."""
    if read is not None or not is_cuda:
        return read, compare
    try:
        from profilers import telemetry as nvml_telemetry
    except ImportError:
        return None, compare
    index = torch.device(device).index or 0
    return (lambda: nvml_telemetry.read_telemetry(index)), compare or nvml_telemetry.compare


def _as_dict(snapshot: Any) -> dict[str, Any] | None:
    if snapshot is None:
        return None
    if hasattr(snapshot, "to_json"):
        return dict(snapshot.to_json())
    if dataclasses.is_dataclass(snapshot) and not isinstance(snapshot, type):
        return dataclasses.asdict(snapshot)
    if isinstance(snapshot, Mapping):
        return dict(snapshot)
    return {"value": repr(snapshot)}


def prepare(spec: str, inputs: list[str] | None = None, *, batch: int | None = None,
            dtype: str = "float32", device: str = "cpu") -> tuple[torch.nn.Module, list]:
    """A model spec built for real on `device` in `dtype`, with example inputs to call it with."""
    from profilers.oprecord import dtype_from_name
    from profilers.specs import load_model, parse_input_spec

    specs = [parse_input_spec(s) for s in inputs] if inputs else None
    loaded = load_model(spec, inputs=specs, batch=batch)
    torch_dtype = dtype_from_name(dtype)
    model = loaded.model.to(device=device, dtype=torch_dtype)
    args = [t.to(torch_dtype) if t.is_floating_point() else t
            for t in loaded.make_inputs(device)]
    return model, args


FORWARD_MIN_RUNS = 5
FORWARD_WARMUP = 2


def time_forward(spec: str, inputs: list[str] | None = None, *, batch: int | None = None,
                 dtype: str = "float32", device: str = "cpu", min_runs: int = FORWARD_MIN_RUNS,
                 warmup: int = FORWARD_WARMUP, max_time_s: float = 3.0,
                 threads: int | None = None, keep_min_runs: bool = False,
                 flush_denormal: bool = False) -> Measurement:
    """Raw end-to-end forward latencies (seconds) of a model spec, as deployed (inference mode),
    in this process (`threads`: torch's intra-op threads, None leaves them as they are;
    `keep_min_runs`: `min_runs` even past `max_time_s`, else the time cap may leave fewer;
    `flush_denormal`: on a CPU, with `torch.set_flush_denormal(True)`, subnormals read and
    written as zero, which takes the slow path for them out of the timing; at more than one
    thread only in a process whose OpenMP workers have not started yet, as in
    `time_forward_isolated`'s fresh child), with
    other processes' CPU use meanwhile and, on a CPU, the machine's pace (`profilers.pace`: a
    fixed probe timed just before and just after, the faster of the two; and the same for its
    chain probe of small ops).

    No cache flush: a model's ops already evict each other, which is what it measures. Other
    processes' CPU use is read over the timing, or where that is too short for the kernel's 10 ms
    ticks (`contention.MIN_WINDOW_S`: a small model's), over the model's build and the timing.
    """
    from profilers import contention, pace
    from profilers.clocks import clock_for
    from profilers.timer import MIN_SAMPLES_UNDER_CAP, measure, thread_count

    on_cpu = device.split(":")[0] == "cpu"  # GPU speed states are not probed
    # before anything runs: set_flush_denormal sets the calling thread's floating-point control
    # only, and OpenMP's workers copy it when they start; set after the model was built, swin_t
    # at 8x3x160x160 and 2 threads took 585 ms flushed against 602 ms (1 thread: 398 and 1159)
    with flushed_denormals(flush_denormal and on_cpu):
        whole = contention.Meter()
        with thread_count(threads):
            model, args = prepare(spec, inputs, batch=batch, dtype=dtype, device=device)

            def forward() -> None:
                with torch.inference_mode():
                    model(*args)

            probe = pace.probe() if on_cpu else None
            chain = pace.chain_probe() if on_cpu else None
            before_s = probe() if probe else None
            chain_before_s = chain() if chain else None
            timing = contention.Meter()
            m = measure(forward, clock=clock_for(device), warmup=warmup, min_reps=min_runs,
                        max_reps=max(min_runs, 200), max_time_s=max_time_s, rel_tol=0.01,
                        device=device.split(":")[0], label=spec,
                        min_reps_under_cap=min_runs if keep_min_runs else MIN_SAMPLES_UNDER_CAP)
            use = timing.stop() or whole.stop()
            pace_s = min(before_s, probe()) if probe and before_s is not None else None
            chain_s = (min(chain_before_s, chain()) if chain and chain_before_s is not None
                       else None)
    return dataclasses.replace(m, cpu_use=use, pace_s=pace_s, chain_s=chain_s)


@contextmanager
def flushed_denormals(on: bool = True) -> Iterator[None]:
    """Subnormals read and written as zero (`torch.set_flush_denormal(True)`) in this thread and
    the threads it starts inside the block, set back to off after; `on` False: nothing. A CPU
    that cannot flush them raises BenchError, rather than time a plain run labelled flushed."""
    if not on:
        yield
        return
    if not torch.set_flush_denormal(True):
        raise BenchError("this CPU cannot flush subnormals to zero (torch.set_flush_denormal)")
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def can_flush_denormal() -> bool:
    """Whether this CPU can flush subnormals to zero (`torch.set_flush_denormal` says so by
    setting it; it is set back)."""
    if not torch.set_flush_denormal(True):
        return False
    torch.set_flush_denormal(False)
    return True


def time_forward_isolated(spec: str, inputs: list[str] | None = None, *,
                          threads: int | None = None, **kw: Any) -> Measurement:
    """`time_forward` in a fresh child process (profilers.isolate: why), at `threads` threads
    (None: this process's current count)."""
    return _in_child(time_forward, spec, inputs, threads, **kw)


def _in_child(fn: Callable[..., Any], spec: str, inputs: list[str] | None,
              threads: int | None, **kw: Any) -> Any:
    """`fn(spec, inputs, threads=..., **kw)` in a fresh child process (profilers.isolate), at
    `threads` threads (None: this process's current count)."""
    from profilers import isolate

    return isolate.run(fn, spec, inputs,
                       threads=threads if threads is not None else torch.get_num_threads(), **kw)
