"""`hwlat advise`: what to try first to meet a latency budget, predicted, and verified on demand."""

from __future__ import annotations

import click
from rich.table import Table

from hwlat.commands.common import json_option, open_db
from hwlat.output import dim, emit_json, escape, stdout
from predictor.devices import choose_device

_LEVEL = ("none", "low", "medium", "high")


def _fmt(value: float | None, digits: int = 1) -> str:
    """A number, "-" where it is unknown (None or NaN: e.g. a rank correlation of one lever), or
    "unbounded" (a latency under a rate beyond what the serving setup can serve)."""
    if value is None or value != value:
        return "-"
    return "unbounded" if value == float("inf") else f"{value:.{digits}f}"


def _interval(ms: list[float]) -> str:
    return f"[{_fmt(ms[0])}, {_fmt(ms[1])}]"


@click.command()
@click.argument("model")
@click.option("--device", metavar="DEVICE", help="Profiled device id or name, or cpu|cuda[:N] for this machine's "
              "(default: this machine, else the only profiled device; `hwlat devices` lists them).")
@click.option("--p95", type=click.FloatRange(min=0, min_open=True),
              help="Latency budget: p95 in ms.")
@click.option("--p99", type=click.FloatRange(min=0, min_open=True),
              help="Latency budget: p99 in ms (instead of --p95).")
@click.option("--input", "inputs", multiple=True,
              help="Input spec, e.g. 1x3x224x224 or int64:1x128 (repeatable).")
@click.option("--batch", type=click.IntRange(min=1), help="Override the first dimension.")
@click.option("--dtype", default="float32", show_default=True,
              type=click.Choice(["float32", "float16", "bfloat16"]))
@click.option("--rate", type=click.FloatRange(min=0, min_open=True),
              help="Requests per second: percentiles come from the serving simulator.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--max-batch", default=1, show_default=True, type=click.IntRange(min=1),
              help="Current dynamic-batching limit (with --rate).")
@click.option("--max-wait-ms", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="Current batching window (with --rate).")
@click.option("--accuracy-floor", type=float,
              help="Lowest acceptable score (--eval) or fidelity to the original (0-1).")
@click.option("--eval", "eval_spec", help="file.py:FN scoring a model (higher is better).")
@click.option("--lever", "levers", multiple=True, help="Only these levers (repeatable).")
@click.option("--verify", "verify_k", type=click.IntRange(min=1), is_flag=False, flag_value=3,
              default=None, help="Apply the top K levers for real and measure them [K=3].")
@click.option("--seed", default=0, show_default=True)
@json_option
@click.pass_context
def advise(ctx, model, device, p95, p99, inputs, batch, dtype, rate, workers, max_batch,
           max_wait_ms, accuracy_floor, eval_spec, levers, verify_k, seed, as_json):
    """Diagnose MODEL on DEVICE and rank what to try first to meet a p95/p99 budget."""
    from advisor.engine import AdviceRequest
    from advisor.engine import advise as run_advice
    from advisor.verify import load_eval, verify

    if accuracy_floor is not None and not verify_k:
        raise click.UsageError("--accuracy-floor is checked by measuring: add --verify [K]")
    if (p95 is None) == (p99 is None):
        raise click.BadParameter("give exactly one budget: --p95 MS or --p99 MS")
    if rate is None and (max_batch != 1 or max_wait_ms != 0 or workers != 1):
        raise click.BadParameter("--workers/--max-batch/--max-wait-ms describe serving under "
                                 "load; give --rate too")
    if rate is not None and batch not in (None, 1):
        raise click.BadParameter("with --rate each request is one sample; batching is set with "
                                 "--max-batch")
    eval_fn = load_eval(eval_spec) if eval_spec else None
    request = AdviceRequest(
        spec=model, device=device, budget_ms=p95 if p95 is not None else p99,
        percentile="p95" if p95 is not None else "p99", inputs=list(inputs) or None,
        batch=batch, dtype=dtype, rate=rate, workers=workers, max_batch=max_batch,
        max_wait_ms=max_wait_ms, accuracy_floor=accuracy_floor, eval_spec=eval_spec,
        levers=tuple(levers) or None, seed=seed)
    progress = None if as_json else dim
    with open_db(ctx, readonly=True) as db:
        request.device = choose_device(db, device).id
        advice = run_advice(db, request, progress)
    if verify_k:
        verify(advice, verify_k, eval_fn=eval_fn, progress=progress)
    if as_json:
        emit_json(advice.to_json())
        return
    _print(advice)


def _print(advice) -> None:
    req, pct = advice.request, advice.request.percentile
    base, d = advice.baseline, advice.diagnosis
    stdout.print(f"[bold]{escape(req.spec)}[/] on {escape(advice.device_id)}: predicted p50 "
                 f"{_fmt(base.p50_ms)} ms, {pct} {_fmt(base.target_ms)} ms "
                 f"{escape(_interval(base.interval_ms))}; budget {pct} "
                 f"{req.budget_ms:g} ms" + (" (met)" if base.meets_budget else ""))
    stdout.print(f"[bold]bottleneck: {escape(d.bottleneck)}[/] - {escape(d.why)}")
    verified = any(r.measured_ms for r in advice.results)
    table = Table(title=f"try first (ms; {pct} with its predicted interval)")
    table.add_column("#", justify="right")
    table.add_column("lever", no_wrap=True)
    for name in ("p50", pct, "speedup"):
        table.add_column(name, justify="right")
    for name in ("budget", "risk", "effort"):
        table.add_column(name)
    if verified:
        table.add_column(f"measured p50/{pct}", justify="right")
        table.add_column("accuracy")
    for i, r in enumerate(advice.results, start=1):
        budget = "REJECTED" if r.rejected else {"likely": "yes", "borderline": "maybe",
                                                "no": "no"}[r.confidence]
        if r.target_ms == float("inf"):
            speed = "queue grows"
        elif r.speedup == float("inf"):
            speed = "keeps up"  # where the deployment as it is cannot
        else:
            speed = f"{r.speedup:.2f}x" + (" slower" if r.slower else "")
        row = [str(i), escape(r.label), _fmt(r.p50_ms),
               f"{_fmt(r.target_ms)} {escape(_interval(r.interval_ms))}", speed,
               budget, _LEVEL[r.risk_level], _LEVEL[r.effort_level]]
        if verified:
            m = r.measured_ms
            row.append(f"{m['p50']:.1f}/{m['target']:.1f}" if m else "")
            a = r.accuracy or {}
            row.append("" if not a else f"{a['metric']} {_fmt(a.get('value'), 3)}")
        table.add_row(*row)
    stdout.print(table)
    from advisor.verify import FIDELITY_METRICS

    fidelity = {(r.accuracy or {}).get("metric") for r in advice.results} & FIDELITY_METRICS
    if fidelity:
        dim(f"accuracy: {' / '.join(sorted(fidelity))} with the unchanged model's outputs on "
            "seeded sample inputs, not task accuracy (a model built without trained weights "
            "agrees little after any change); --eval FILE.py:FN scores the real task", stdout)
    for i, r in enumerate(advice.results[:5], start=1):
        stdout.print(escape(f"{i}. {r.label} (--lever {r.lever}): {r.why}; risk: {r.risk}; "
                            f"effort: {r.effort}"
                            + "".join(f"; {n}" for n in r.notes)))
    fastest = advice.fastest
    stdout.print("fastest meeting the budget: " + escape(fastest.label if fastest else "none"))
    stdout.print("Pareto set (latency vs accuracy risk): "
                 + escape(", ".join(r.label for r in advice.pareto)))
    for name, why in advice.not_applicable.items():
        dim(f"not applicable: {name}: {why}", stdout)
    for r in advice.results:
        if r.rejected:
            stdout.print(f"[red]rejected[/] {escape(f'{r.label}: {r.rejected}')}")
    if advice.verification:
        rho = advice.verification["spearman_speedup"]
        n = len(advice.verification['verified'])
        stdout.print(f"verified {n} lever{'s' if n != 1 else ''}; Spearman of "
                     f"predicted vs measured speedup: {_fmt(rho, 2)}")
    for note in advice.notes:
        dim(note, stdout)
