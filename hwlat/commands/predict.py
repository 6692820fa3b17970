"""`hwlat predict`: a model's latency on a profiled device, without running it there."""

from __future__ import annotations

import click
from rich.table import Table

from hwlat.commands.common import input_options, json_option, open_db, parse_inputs
from hwlat.output import dim, emit_json, escape, stdout
from predictor.devices import choose_device
from predictor.e2e import Prediction, Predictor
from profilers.errors import HwlatError


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
@click.option("--values/--no-values", default=None,
              help="Run each model once here with its weights to count the subnormal floats it "
                   "computes, and add what they cost the device's CPU (default: on for a CPU "
                   "device whose profile measured that cost; fp32 only).")
@json_option
@click.pass_context
def predict(ctx, models, device, inputs, batch, dtype, threads, channels_last, strict, retrain,
            values, as_json):
    """Predict the latency of MODELS (specs: torchvision:NAME, timm:NAME, hf:TYPE, file.py:FN,
    model.pt2) on a profiled device. With several MODELS, one that cannot be predicted is reported
    in its place (with --json, as {"spec", "error"}), the others are still predicted, and the
    exit code is 1."""
    with open_db(ctx, readonly=True) as db:
        row = choose_device(db, device, threads=threads)
        predictor = Predictor.for_device(db, row.id, retrain=retrain,
                                         progress=None if as_json else dim)
    specs = parse_inputs(inputs)
    if values is None:
        values = (row.kind == "cpu" and dtype == "float32"
                  and bool((row.peaks or {}).get("subnormal")))

    def one(model: str) -> Prediction:
        return predictor.predict_spec(model, inputs=specs, batch=batch, dtype=dtype,
                                      strict=strict, channels_last=channels_last, values=values)

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
    for model, exc in failed:
        click.echo(f"error: {model}: {exc}", err=True)  # as hwlat.cli: one unwrapped line
    if failed:
        ctx.exit(1)


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
        dim("a negative row is a correction term fitted on this device's model timings ("
            "op_overhead below 0: ops run warmer inside a model than timed alone)", stdout)
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
