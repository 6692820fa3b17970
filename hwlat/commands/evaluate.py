"""`hwlat evaluate`: measure models for real on this device, predict them, compare."""

from __future__ import annotations

import click
from rich.table import Table

from hwlat.commands.common import json_option, open_db, output_file, parse_inputs, write_plot
from hwlat.output import dim, emit_json, escape, stderr, stdout
from kernels_db.build import measure_subnormal_once
from predictor.devices import choose_device, require_this_machine
from predictor.evaluate import (
    ANCHORS,
    EXTRA_ROUNDS,
    MIN_QUIET_ROUNDS,
    ROUND_TIME_S,
    ROUNDS,
    EvalCase,
    EvalReport,
    evaluate,
    session_drift_note,
    zoo_cases,
)
from predictor.journal import EvalJournal


@click.command("evaluate")
@click.argument("models", nargs=-1)
@click.option("--device", metavar="DEVICE", help="Device id or alias (must be this machine).")
@click.option("--threads", type=click.IntRange(min=1), help="Evaluate the profile at this count.")
@click.option("--holdout-families", is_flag=True,
              help="Without MODELS: only held-out models of families absent from training.")
@click.option("--batch", "batches", multiple=True, type=click.IntRange(min=1),
              help="Batch sizes (repeatable; default 1).")
@click.option("--input", "inputs", multiple=True, metavar="SPEC",
              help="Input shape for MODELS (repeatable), e.g. 1x3x224x224.")
@click.option("--dtype", "dtypes", multiple=True, default=("float32",), show_default=True,
              type=click.Choice(["float32", "float16", "bfloat16"]), help="Repeatable.")
@click.option("--runs", default=30, show_default=True, type=click.IntRange(min=30),
              help="Timed runs per model (median reported).")
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(min=1))
@click.option("--rounds", default=ROUNDS, show_default=True, type=click.IntRange(min=1),
              help="Measure every model in this many rounds spread over the evaluation "
                   "(runs split between them; a round adds passes until its median is stable, "
                   f"for up to {ROUND_TIME_S:g} s): a slow spell of the machine then hits every "
                   "model a little instead of a few a lot. A model left with fewer than "
                   f"{MIN_QUIET_ROUNDS} (or --rounds) quiet rounds is timed up to {EXTRA_ROUNDS} "
                   "more times at the end.")
@click.option("--anchor", type=click.Choice(ANCHORS), default="profile", show_default=True,
              help="profile: predict as profiled; session: also re-time training-zoo references "
                   "here, before and after the models (~1 min), report the device's drift since "
                   "profiling and scale every predictor by it; pace: scale each model's predictions "
                   "by the pace probe's time over its time in the profile, the geometric mean of "
                   "the probe beside the model's rounds and over all rounds (no extra timing). "
                   "The profile-anchored numbers are kept beside.")
@click.option("--plot", type=click.Path(dir_okay=False), callback=output_file,
              help="Predicted vs measured (PNG).")
@click.option("--fresh", is_flag=True,
              help="Time everything again, not resuming an interrupted run of this evaluation.")
@json_option
@click.pass_context
def evaluate_cmd(ctx, models, device, threads, holdout_families, batches, inputs, dtypes, runs,
                 warmup, rounds, anchor, plot, fresh, as_json):
    """Measure MODELS (default: the held-out zoo) here and compare with hwlat's predictions and
    with FLOPs and roofline baselines fitted on the same database."""
    if models and holdout_families:
        raise click.UsageError("--holdout-families picks models from the zoo; drop MODELS or it")
    batches = batches or (1,)
    parse_inputs(inputs)  # a malformed --input is bad usage, before anything is measured
    cases = _cases(models, inputs, batches, dtypes, holdout_families)
    progress = None if as_json else dim
    with open_db(ctx, readonly=True) as db:
        row = choose_device(db, device, threads=threads)
        require_this_machine(row)
    if row.kind == "cpu" and row.peaks and not row.peaks.get("subnormal"):
        if progress:
            progress("measuring what a subnormal value costs this CPU (once, under a second)")
        with open_db(ctx) as db:
            measure_subnormal_once(db, row.id, row.threads)
    journal = EvalJournal.for_evaluation(row.id, cases, runs=runs, warmup=warmup, rounds=rounds,
                                         anchor=anchor, fresh=fresh)
    if not journal.unwritable:
        ctx.find_root().obj["on_interrupt"] = ("the timings made so far are kept: run the same "
                                               "command again to resume")
    with open_db(ctx, readonly=True) as db:
        report = evaluate(db, row.id, cases, runs=runs, warmup=warmup, rounds=rounds,
                          anchor=anchor, progress=progress, journal=journal)
    if as_json:
        emit_json(report.to_json())
    else:
        show(report)
    if plot:  # after the report: a plot that fails to write loses no measurement
        write_plot(report.plot, plot)
        if not as_json:
            stderr.print(f"plot written to {escape(plot)}")


def _cases(models, inputs, batches, dtypes, holdout_families) -> list[EvalCase]:
    if models:
        base = [EvalCase(m, _inputs_for(m, inputs, b)) for m in models for b in batches]
    else:
        base = zoo_cases(holdout_families=holdout_families, batches=batches)
    return [EvalCase(c.spec, c.inputs, c.family, d) for c in base for d in dtypes]


def _inputs_for(spec: str, inputs: tuple[str, ...], batch: int) -> tuple[str, ...]:
    """The given input shapes at `batch`, else the model's default inputs at `batch`."""
    from profilers.specs import load_model, parse_input_spec

    specs = [parse_input_spec(s) for s in inputs] or load_model(spec, meta=True).inputs
    return tuple(str(s.with_batch(batch)) for s in specs)


SUMMARY_LABELS = {"flops": "FLOPs-linear", "hwlat_profile_anchor": "hwlat, profile anchor",
                  "hwlat_flushed": "hwlat, subnormals flushed", "remeasurement": "re-measurement",
                  "hwlat_pace_factor_only": "hwlat, pace factor alone"}


def show(report: EvalReport) -> None:
    dtypes = {r.dtype for r in report.rows}
    table = Table(title=f"predicted vs measured on {report.device}")
    table.add_column("model", no_wrap=True)
    table.add_column("inputs", no_wrap=True)
    if len(dtypes) > 1:
        table.add_column("dtype")
    for name in ("measured ms", "hwlat ms", "error", "FLOPs-linear error"):
        table.add_column(name, justify="right")
    for r in report.rows:
        flops_err = (f"{(r.flops_pred_ms / r.measured_ms - 1):+.1%}"
                     if r.flops_pred_ms is not None else "n/a")
        row = [escape(r.spec.removeprefix("torchvision:")), escape(",".join(r.inputs))]
        row += [r.dtype] if len(dtypes) > 1 else []
        table.add_row(*row, f"{r.measured_ms:.2f}", f"{r.predicted_ms:.2f}",
                      f"{r.error_pct / 100:+.1%}", flops_err)
    stdout.print(table)
    summary = Table("predictor", "MAPE", "median APE", "within 5%", "within 10%", "within 20%",
                    "Spearman", title=f"summary over {len(report.rows)} model{'s' if len(report.rows) != 1 else ''}")
    rows = list(report.summary.items())
    remeasurement = report.remeasurement()
    if remeasurement:
        rows.append(("remeasurement", remeasurement))
    for name, m in rows:
        # its pairs are rounds of one model: a rank correlation over them compares nothing
        rho = m.get("spearman")
        spearman = "-" if name == "remeasurement" or rho is None or rho != rho else f"{rho:.3f}"
        summary.add_row(SUMMARY_LABELS.get(name, name), f"{m['mape_pct']:.1f}%",
                        f"{m['median_ape_pct']:.1f}%",
                        f"{m['within_5pct']:.0%}", f"{m['within_10pct']:.0%}",
                        f"{m['within_20pct']:.0%}", spearman,
                        style="dim" if name == "remeasurement" else None)
    stdout.print(summary)
    if report.drift and report.drift.pace_ms:
        d = report.drift
        stdout.print(f"anchor: each model's hwlat and baseline predictions are scaled by the pace "
                     "probe (beside its rounds and over all rounds, geometric mean) over the probe "
                     f"in the profile: median factor x{d.ratio:.3f} (IQR {d.q25:.3f}-{d.q75:.3f}); the probe {d.pace_ms[0]:.2f} ms "
                     f"over all rounds kept, {d.pace_ms[1]:.2f} ms then")
    elif report.drift:
        d = report.drift
        stdout.print(f"anchor: {len(d.references)} training-zoo references run x{d.ratio:.3f} "
                     f"(IQR {d.q25:.3f}-{d.q75:.3f}) of their profiled time in this session; "
                     "hwlat and the baselines are scaled by it")
    stdout.print(f"interval coverage: {report.interval_coverage:.0%} of measured medians inside "
                 f"the predicted 80% interval")
    spread = report.round_spread_pct()
    if spread:
        passes = [sum(r.round_runs) for r in report.rows if r.round_runs]
        most = max(len(r.measured_rounds_ms) for r in report.rows)
        stdout.print(f"ground truth: each model measured in {spread['rounds']} rounds"
                     + (f" (some in up to {most}: timed again, short of quiet ones)"
                        if most > spread["rounds"] else "")
                     + (f" ({min(passes)}-{max(passes)} timed passes)" if passes else "")
                     + f"; the medians of the rounds kept differ by {spread['median']:.1f}% (median "
                     f"over models, largest {spread['max']:.1f}%), the noise of the measurement "
                     "itself; 're-measurement' scores each round's median against the model's other "
                     "rounds (one pair per round kept): errors near it are within that noise")
    stale = session_drift_note(report.drift) if report.anchor == "session" else None
    for note in report.notes:
        if note == stale:  # the numbers above may not hold: said as a warning, not a note
            stdout.print(f"[yellow]warning:[/] {escape(note)}")
        else:
            dim(note, stdout)
