"""`hwlat predict`: a model's latency on a profiled device, without running it there."""

from __future__ import annotations

import click
from rich.table import Table

from hwlat.commands.common import input_options, json_option, open_db, parse_inputs
from hwlat.output import dim, emit_json, escape, stdout
from predictor.devices import choose_device, require_this_machine
from predictor.e2e import Prediction, Predictor
from predictor.evaluate import PACE_NOW_S, at_pace, pace_now, probed_then
from profilers.errors import DeviceError, HwlatError


@click.command()
@click.argument("models", nargs=-1, required=True)
@click.option("--device", metavar="DEVICE", help="Device id or alias, or cpu|cuda[:N] for this machine's "
                                "(default: this machine, else the only profiled device).")
@input_options
@click.option("--threads", type=click.IntRange(min=1),
              help="Predict at this thread count (needs a profile at that count).")
@click.option("--channels-last", is_flag=True, help="Run 4-d tensors in channels_last.")
@click.option("--strict", is_flag=True, help="Fail on ops hwlat cannot model.")
@click.option("--retrain", is_flag=True, help="Retrain the device's models even if cached.")
@click.option("--anchor", type=click.Choice(("profile", "pace")), default="profile",
              show_default=True,
              help="profile: as profiled; pace: time the profile's pace probes here now (2 s) "
                   "and move the prediction three quarters of the way to how fast this machine "
                   "runs now (a model timed moments later follows the probe only partway; this "
                   "machine's CPU profile only; an option: it adds the probe's noise where the "
                   "machine runs as profiled).")
@click.option("--values/--no-values", default=None,
              help="Run each model once here with its weights to count the subnormal floats it "
                   "computes, and add what they cost the device's CPU (default: on for a CPU "
                   "device whose profile measured that cost; fp32 only).")
@json_option
@click.pass_context
def predict(ctx, models, device, inputs, batch, dtype, threads, channels_last, strict, retrain,
            anchor, values, as_json):
    """Predict the latency of MODELS (specs: torchvision:NAME, timm:NAME, hf:TYPE, file.py:FN,
    model.pt2) on a profiled device. With several MODELS, one that cannot be predicted is reported
    in its place (with --json, as {"spec", "error"}), the others are still predicted, and the
    exit code is 1."""
    with open_db(ctx, readonly=True) as db:
        row = choose_device(db, device, threads=threads)
        timings = []
        if anchor == "pace":  # before any training: a wrong device or profile fails at once
            timings = db.model_measurements(row.id, kind="e2e")
            _require_pace_here(row, timings)
        predictor = Predictor.for_device(db, row.id, retrain=retrain,
                                         progress=None if as_json else dim)
    now = None
    if anchor == "pace":
        if not as_json:
            dim(f"timing this machine's pace for {PACE_NOW_S:g} s")
        now = pace_now(predictor, timings)
    specs = parse_inputs(inputs)
    if values is None:
        values = (row.kind == "cpu" and dtype == "float32"
                  and bool((row.peaks or {}).get("subnormal")))

    def one(model: str) -> Prediction:
        p = predictor.predict_spec(model, inputs=specs, batch=batch, dtype=dtype,
                                   strict=strict, channels_last=channels_last, values=values)
        return at_pace(p, now) if now is not None else p

    if len(models) == 1:  # its error is the command's: one line, exit 1 (hwlat.cli)
        try:
            prediction = one(models[0])
        except HwlatError as exc:
            if as_json:  # a script still reads JSON: the same object as with several models
                emit_json({"spec": models[0], "error": str(exc)})
            raise
        if as_json:
            emit_json(prediction.to_json())
        else:
            _show_one(prediction)
        return
    # several models: one that fails is reported in its place and the others still predicted
    results: list[tuple[str, Prediction | HwlatError]] = []
    for model in models:
        try:
            results.append((model, one(model)))
        except HwlatError as exc:
            results.append((model, exc))
    failed = [(model, r) for model, r in results if isinstance(r, HwlatError)]
    if as_json:
        emit_json([{"spec": model, "error": str(r)} if isinstance(r, HwlatError) else r.to_json()
                   for model, r in results])
    else:
        _show_many(results)
        if now is not None:
            dim(now.summary(), stdout)
    for model, exc in failed:
        click.echo(f"error: {model}: {exc}", err=True)  # as hwlat.cli: one unwrapped line
    if failed:
        ctx.exit(1)


def _require_pace_here(row, timings) -> None:
    """`--anchor pace` probes this machine: the device must be this machine's CPU profile, and
    its profile must have timed the probe (`timings`: its end-to-end timings)."""
    if row.kind != "cpu":
        raise DeviceError(f"--anchor pace probes a CPU's pace, and {row.label} is a "
                          f"{row.kind.upper()}; drop --anchor pace")
    require_this_machine(row)
    if not probed_then(timings):
        raise DeviceError(f"the profile of {row.label} has no pace probe beside its end-to-end "
                          "timings (a profile older than the probe), so its pace then is "
                          "unknown; run `hwlat profile` again or drop --anchor pace")


def _show_one(p: Prediction) -> None:
    lo, hi = p.interval_ms
    stdout.print(f"[bold]{escape(p.spec)}[/] {escape('[' + ', '.join(p.inputs) + ']')} on "
                 f"{escape(p.device)}")
    stdout.print(f"predicted p50 [bold]{p.p50_ms:.2f} ms[/] (80% interval {lo:.2f}-{hi:.2f} ms), "
                 f"{_gflops(p.flops)} GFLOPs, {p.n_ops} ops ({p.n_timed_ops} timed), "
                 f"{p.measured_share:.0%} of the time from exactly profiled configs")
    fam = Table("family", "ms", "share", title="by op family")
    for name, ms in sorted(p.per_family.items(), key=lambda kv: -kv[1]):
        fam.add_row(name, f"{ms:.3f}", f"{ms / p.p50_ms:.0%}" if p.p50_ms else "")
    stdout.print(fam)
    top = Table("op", "module", "shapes", "ms", "source", title="ten most expensive ops")
    for op in p.top_ops:
        top.add_row(*(escape(op.get(k, "")) for k in ("op", "module", "shapes")),
                    f"{op['ms']:.3f}", escape(op.get("source", "")))
    stdout.print(top)
    if p.unmodelled:
        stdout.print("[yellow]unmodelled ops (roofline fallback, not 0):[/] " + escape(", ".join(
            f"{u['op']} x{u['count']} {u['estimated_ms']:.3f} ms ({u['share']:.1%})" for u in p.unmodelled)))
    if any(ms < 0 for ms in p.per_family.values()):
        dim("a negative row is a correction term: op_overhead is fitted on this device's model "
            "timings (below 0: ops run warmer inside a model than timed alone); small_op_pace "
            "is the chain probe's (below 0: small ops run faster now than the pace factor says)",
            stdout)
    for note in p.notes:
        dim(note, stdout)


def _show_many(results: list[tuple[str, Prediction | HwlatError]]) -> None:
    table = Table("model", "inputs", "p50 ms", "interval ms", "GFLOPs", "ops", "unmodelled")
    table.columns[0].overflow = "fold"  # a narrow terminal wraps a spec rather than cut it
    for model, p in results:
        if isinstance(p, HwlatError):
            table.add_row(escape(model), "", "failed", "", "", "", "")
            continue
        lo, hi = p.interval_ms
        table.add_row(escape(p.spec), escape(",".join(p.inputs)), f"{p.p50_ms:.2f}",
                      f"{lo:.2f}-{hi:.2f}", _gflops(p.flops), str(p.n_ops),
                      f"{sum(u['share'] for u in p.unmodelled):.1%}" if p.unmodelled else "-")
    stdout.print(table)


def _gflops(flops: float) -> str:
    """Two decimals, or three significant digits below 0.1 (a tiny model is not "0.00")."""
    g = flops / 1e9
    return f"{g:.2f}" if g >= 0.1 or g == 0 else f"{g:.3g}"
