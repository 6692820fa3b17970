"""`hwlat bench`: time a model the way production feels it, closed-loop or under open-loop load.

The command is a thin wrapper: profilers.modelbench times the closed-loop stages,
profilers.loadtest runs the in-process server, and every result lands in the kernel database as
a model measurement of this machine (kind "bench" or "load").
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from typing import Any

import click
import torch

from hwlat.commands.common import duration, json_option, open_db, output_file
from hwlat.output import emit_json, stderr, stdout
from profilers.errors import BenchError, DeviceError

DTYPES = ("float32", "float16", "bfloat16")


def _device_option(ctx, param, value: str) -> str:
    from profilers.clocks import parse_device

    try:
        kind, index = parse_device(value)
    except DeviceError as exc:
        raise click.BadParameter(str(exc)) from None
    return "cpu" if kind == "cpu" else f"cuda:{index}"


def _positive_rate(ctx, param, value: float | None) -> float | None:
    if value is not None and not value > 0:  # `not >` also rejects NaN
        raise click.BadParameter(f"must be more than zero requests/s, got {value}")
    return value


@click.command()
@click.argument("model")
@click.option("--input", "inputs", multiple=True,
              help="Input spec, e.g. 1x3x224x224 or int64:1x128 (repeatable; default: the "
                   "model's own).")
@click.option("--batch", type=click.IntRange(min=1), help="Override the inputs' first dimension.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(DTYPES))
@click.option("--device", default="cpu", show_default=True, callback=_device_option,
              help="cpu, cuda or cuda:N.")
@click.option("--threads", type=click.IntRange(min=1),
              help="Torch intra-op threads (default: torch's default).")
@click.option("--runs", default=500, show_default=True, type=click.IntRange(min=1),
              help="Timed runs (closed loop); p99 with its 95% CI needs >= 473.")
@click.option("--warmup", default=10, show_default=True, type=click.IntRange(min=0),
              help="Untimed runs first.")
@click.option("--rate", type=float, callback=_positive_rate,
              help="Load mode: Poisson arrivals at this many requests/s (needs --duration).")
@click.option("--duration", callback=duration, help="Load mode: send for this long (20s, 1m).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--max-batch", default=1, show_default=True, type=click.IntRange(min=1),
              help="Dynamic batching: the largest batch a worker forms.")
@click.option("--max-wait-ms", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="Dynamic batching: how long a worker waits for a batch to fill.")
@click.option("--queue-capacity", default=1024, show_default=True, type=click.IntRange(min=1),
              help="Requests arriving at a full queue are rejected.")
@click.option("--trace", type=click.Path(dir_okay=False),
              help="Load mode: arrival times (s) from a file, one a line or a CSV with arrival_s.")
@click.option("--seed", default=0, show_default=True, help="Seed of the Poisson arrivals.")
@json_option
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), callback=output_file,
              help="Write every per-request sample to this CSV file.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), callback=output_file,
              help="Write the latency distributions (total, queue, compute / stages) as an image.")
@click.option("--no-store", is_flag=True, help="Do not store the result in the kernel database.")
@click.pass_context
def bench(ctx, model, inputs, batch, dtype, device, threads, runs, warmup, rate, duration,
          workers, max_batch, max_wait_ms, queue_capacity, trace, seed, as_json, csv_path,
          plot_path, no_store):
    """Measure MODEL's latency percentiles (p50..p99 with 95% intervals) on this machine.

    \b
    Closed loop (default): --warmup untimed runs, then --runs timed runs. A percentile the
    sample count cannot support (p95 needs >= 93 runs, p99 >= 473) shows as "insufficient".
    A file.py:FACTORY whose dict has `preprocess`/`postprocess` gets each stage timed:
    preprocess receives the dict's `raw_input` (or `sample`) when given, else the list of
    example input tensors; it returns a tensor, a tuple (positional inputs) or a dict (keyword
    inputs); postprocess receives the model output (on the CPU). On a GPU the host-to-device
    copy, forward pass and device-to-host copy are timed with CUDA events, and NVML telemetry
    before and after warns when clocks throttled.
    \b
    Load mode (--rate R --duration S, or --trace FILE): open-loop arrivals against an
    in-process server with --workers threads and dynamic batching; a request is one input of
    the given batch, a batch of n requests is n of them stacked. Reports queue and compute
    percentiles separately, offered vs achieved rate, and requests rejected at a full queue.
    Pre/postprocess are not run in load mode.
    \b
    Every result is stored in the kernel database as a model measurement of this machine at the
    thread count used (unless --no-store). Exit codes: 2 for bad flags (a rate or duration <= 0,
    --rate without --duration), 1 for anything else that went wrong (unknown model, failing
    preprocess, unreadable trace, a model that fails mid-run: the runs completed so far are
    still reported and stored).
    """
    load_mode = rate is not None or trace is not None
    _check_mode(ctx, load_mode, rate, duration, trace)
    from profilers.timer import thread_count

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError(f"device {device} is not available here (no CUDA); bench on a GPU "
                          "machine or use --device cpu")
    loaded = _load(model, list(inputs), batch)
    with thread_count(threads) as used_threads:
        if load_mode:
            result, stats, samples_s, kind = _run_load(
                loaded, dtype, device, rate, duration, trace, seed, workers, max_batch,
                max_wait_ms, queue_capacity)
        else:
            result, stats, samples_s, kind = _run_bench(loaded, dtype, device, runs, warmup)
    settings = _settings(loaded, dtype, used_threads, device, kind)
    stored = None if no_store else _store(ctx, loaded, settings, samples_s, stats, device,
                                          used_threads)
    _report(result, stats, loaded.spec, settings, stored, as_json)
    _write_files(result, kind, csv_path, plot_path)  # after the report: a failed write loses none
    if result.error:
        raise BenchError(f"{result.error} (the completed runs were reported"
                         f"{'' if no_store or stored is None else ' and stored'})")


def _check_mode(ctx: click.Context, load_mode: bool, rate, duration_s, trace) -> None:
    if rate is not None and trace is not None:
        raise click.UsageError("give either --rate (Poisson arrivals) or --trace, not both", ctx)
    if rate is not None and duration_s is None:
        raise click.UsageError("--rate needs --duration (e.g. --duration 20s)", ctx)
    if duration_s is not None and not load_mode:
        raise click.UsageError("--duration only applies to load mode; add --rate", ctx)


def _load(spec: str, inputs: list[str], batch: int | None):
    from profilers.specs import load_model, parse_input_spec

    return load_model(spec, inputs=[parse_input_spec(s) for s in inputs] or None, batch=batch)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    """Floating tensors (nested in tuples/lists/dicts) to the benchmark's dtype."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def telemetry_reader(device: str, nvml: Any = None) -> Callable[[], Any]:
    """NVML telemetry of a CUDA device, or None (never an error) where NVML cannot be read.

    A GPU without NVML still benchmarks; it only loses the throttling check.
    """
    from profilers import telemetry

    index = torch.device(device).index or 0

    def read() -> Any:
        try:
            return telemetry.read_telemetry(index, nvml=nvml)
        except (DeviceError, ImportError, OSError):
            return None

    return read


# ------------------------------------------------------------------------------ closed loop


def _then_cast(preprocess: Callable[[Any], Any], dtype: torch.dtype) -> Callable[[Any], Any]:
    """The user's preprocess plus the cast to the model's dtype (part of the stage's cost)."""
    return lambda raw: _cast(preprocess(raw), dtype)


def _run_bench(loaded, dtype_name: str, device: str, runs: int, warmup: int):
    from profilers.modelbench import bench_model
    from profilers.oprecord import dtype_from_name

    dtype = dtype_from_name(dtype_name)
    model = loaded.model.to(dtype=dtype)
    preprocess = _then_cast(loaded.preprocess, dtype) if loaded.preprocess else None
    is_cuda = device.startswith("cuda")
    result = bench_model(
        model, lambda: _cast(loaded.make_inputs("cpu"), dtype), runs=runs, warmup=warmup,
        preprocess=preprocess, postprocess=loaded.postprocess, device=device,
        raw_input=getattr(loaded, "raw_input", None),
        telemetry=telemetry_reader(device) if is_cuda else None)
    stats = result.to_json()
    return result, stats, list(result.total.samples_s), "bench"


def write_bench_csv(result, path: str) -> None:
    """One row per timed run: `run` and `<stage>_ms` for every measured stage."""
    names = list(result.stages)
    columns = [result.stages[name].samples_s for name in names]
    try:
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["run", *(f"{name}_ms" for name in names)])
            for run, row in enumerate(zip(*columns, strict=True)):
                writer.writerow([run, *(f"{v * 1e3:.6f}" for v in row)])
    except OSError as exc:
        raise BenchError(f"cannot write {path}: {exc.strerror}") from exc


# -------------------------------------------------------------------------------- load mode


def _run_load(loaded, dtype_name: str, device: str, rate, duration_s, trace, seed: int,
              workers: int, max_batch: int, max_wait_ms: float, queue_capacity: int):
    from profilers.loadtest import (
        arrivals_from_file,
        model_batch_runner,
        poisson_arrivals,
        run_load,
    )
    from profilers.oprecord import dtype_from_name

    dtype = dtype_from_name(dtype_name)
    arrivals = (arrivals_from_file(trace) if trace is not None
                else poisson_arrivals(rate, duration_s, seed=seed))
    model = loaded.model.to(device=device, dtype=dtype)

    def make_batch(n: int) -> list[torch.Tensor]:
        # one request = the inputs as given; n requests = n of them stacked on the first dim
        return [_cast(spec.with_batch(n * spec.shape[0]).make(device, loaded.vocab), dtype)
                for spec in loaded.inputs]

    infer = _synced(model_batch_runner(model, make_batch), device)
    _warm_up(infer, max_batch)
    result = run_load(infer, arrivals, workers=workers, max_batch=max_batch,
                      max_wait_s=max_wait_ms / 1e3, queue_capacity=queue_capacity,
                      duration_cap_s=None)
    stats = result.to_json()
    stats["arrivals"] = ({"source": "trace", "file": str(trace)} if trace is not None else
                         {"source": "poisson", "rate_rps": rate, "duration_s": duration_s,
                          "seed": seed})
    return result, stats, [r.total_s for r in result.served], "load"


def _synced(infer: Callable[[int], None], device: str) -> Callable[[int], None]:
    """On a GPU a batch is done when its kernels are, not when they are queued."""
    if not device.startswith("cuda"):
        return infer

    def infer_synced(n: int) -> None:
        infer(n)
        torch.cuda.synchronize(device)

    return infer_synced


def _warm_up(infer: Callable[[int], None], max_batch: int) -> None:
    """Every batch size once, untimed: builds the cached inputs and checks the model runs."""
    for n in range(1, max_batch + 1):
        try:
            infer(n)
        except Exception as exc:
            raise BenchError(f"model failed on its first run at batch {n}: "
                             f"{type(exc).__name__}: {exc}") from exc


# ------------------------------------------------------------------------------ store, report


def _settings(loaded, dtype: str, threads: int, device: str, kind: str) -> dict:
    first = loaded.inputs[0].shape if loaded.inputs else ()
    return {"inputs": [str(s) for s in loaded.inputs], "batch": first[0] if first else None,
            "dtype": dtype, "threads": threads, "device": device.split(":")[0],
            "grad_mode": "inference", "kind": kind}


def _store(ctx, loaded, settings: dict, samples_s: list[float], stats: dict, device: str,
           threads: int) -> dict | None:
    """Store as a model measurement of this machine's fingerprint; None when nothing to store."""
    from profilers.fingerprint import fingerprint

    if not samples_s:
        return None
    fp = fingerprint(device, threads)
    with open_db(ctx) as db:
        db.upsert_device(fp.to_json(), device_id=fp.device_id, kind=fp.kind, threads=fp.threads)
        row = db.add_model_measurement(fp.device_id, loaded.spec, loaded.family, settings,
                                       samples_s, stats=stats)
    return {"device_id": fp.device_id, "measurement_id": row}


def _write_files(result, kind: str, csv_path: str | None, plot_path: str | None) -> None:
    if csv_path:
        if kind == "load":
            result.to_csv(csv_path)
        else:
            write_bench_csv(result, csv_path)
    if plot_path:
        try:
            result.plot(plot_path)
        except BenchError:
            raise
        except (OSError, ValueError) as exc:
            raise BenchError(f"cannot write plot {plot_path}: {exc}") from exc


def _report(result, stats: dict, spec: str, settings: dict, stored: dict | None,
            as_json: bool) -> None:
    if as_json:
        emit_json({"model": spec, "mode": settings["kind"], "settings": settings,
                   "stored": stored, **stats})
        return
    stdout.print(result.table())
    if stored:
        stderr.print(f"stored as a {settings['kind']} measurement of device {stored['device_id']}")

