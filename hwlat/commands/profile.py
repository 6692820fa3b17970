"""`hwlat profile`: measure this device's op latencies into the kernel database."""

from __future__ import annotations

import click

from hwlat.commands.common import duration, json_option, open_db
from hwlat.output import budget_progress, emit_json, escape, stderr
from kernels_db.build import SLOW_SPELL, ProfileSettings, check_settings, profile_device
from profilers.pace import SLOW_PACE


@click.command()
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--threads", type=click.IntRange(min=1),
              help="Threads to time with (default: torch's default, what you deploy with).")
@click.option("--budget", default="10m", show_default=True, callback=duration,
              help="Time budget: 90s, 10m, 1h.")
@click.option("--name", help="An alias for this device, usable wherever an id is.")
@click.option("--dtype", "dtypes", multiple=True, default=("float32",), show_default=True,
              type=click.Choice(["float32", "float16", "bfloat16"]), help="Repeatable.")
@click.option("--models", help="Comma-separated training-zoo specs to restrict the zoo to.")
@click.option("--add", "added", multiple=True, metavar="MODEL",
              help="Profile this model too, ops and end to end, as part of the training zoo, "
                   "at its default inputs (a file.py:FACTORY returns {'model', 'inputs'}) and "
                   "the zoo's batches; later runs keep it. Repeatable.")
@click.option("--batch", "batches", multiple=True, type=click.IntRange(min=1),
              help="Profile the zoo at these batch sizes only (repeatable).")
@click.option("--no-e2e", is_flag=True, help="Skip end-to-end model measurements.")
@click.option("--random-per-family", default=60, show_default=True, type=click.IntRange(min=0),
              help="Random modules sampled per op family in the plan (cheap families with many "
                   "ops draw a multiple: sampling.DRAWS).")
@click.option("--seed", default=0, show_default=True)
@json_option
@click.pass_context
def profile(ctx, device, threads, budget, name, dtypes, models, added, batches, no_e2e,
            random_per_family, seed, as_json):
    """Profile DEVICE once: per-op latencies and model latencies, within a time budget.

    Resumable: run it again (or twice at once) and it continues where it stopped.
    """
    settings = ProfileSettings(
        device=device, threads=threads, dtypes=tuple(dtypes), budget_s=budget, name=name,
        models=tuple(m.strip() for m in models.split(",")) if models else None,
        added=tuple(added),
        batches=tuple(batches) or None, e2e=not no_e2e, seed=seed,
        random_per_family=random_per_family)
    check_settings(settings)
    with open_db(ctx) as db, budget_progress("profiling", enabled=not as_json) as update:
        report = profile_device(db, settings, progress=update)
    if as_json:
        emit_json(report.to_json())
        return
    noise = f"{report.noise_median:.1%}" if report.noise_median is not None else "unknown"
    stderr.print(
        f"[bold]{report.device_id}[/]: measured {report.measured_now} op configs (and re-timed "
        f"{report.zoo_retimed_now} training-zoo ones"
        + (f" and {report.ops_retimed_now} first timed beside other work"
           if report.ops_retimed_now else "")
        + f"), {report.models_measured_now} end-to-end "
        f"model timings in {report.elapsed_s:.0f} s; training-zoo configs "
        f"covered {report.zoo_measured}/{report.zoo_configs}; median IQR/median {noise}.")
    if line := contended_line(report):
        stderr.print(f"[yellow]warning:[/] {escape(line)}")
    if line := slow_spell_line(report):
        stderr.print(f"[yellow]warning:[/] {escape(line)}")
    if line := untimed_line(report):
        stderr.print(line, markup=False)


def slow_spell_line(report) -> str | None:
    """A warning when the machine ran slow with no other process busy: end-to-end timings whose
    probe ran slow (`profilers.pace`), or a setting's quiet timings that disagree
    (build.SLOW_SPELL)."""
    parts = []
    if report.models_slow_now:
        parts.append(
            f"{report.models_slow_now} of {report.models_measured_now} end-to-end model timings "
            f"ran in a slow spell of the machine (a fixed probe beside them ran {SLOW_PACE}x or "
            "more its usual time); the fit leaves them out while enough others are not, and the "
            "next `hwlat profile` times those models again")
    ratio = report.models_pass_ratio_max
    if ratio is not None and ratio >= SLOW_SPELL:
        n = report.models_timed_twice
        parts.append(
            f"end-to-end timings of the same model setting differ by up to {ratio:.2f}x ({n} "
            f"setting{'s' if n != 1 else ''} timed twice) with no other process busy: the machine "
            "had a slow spell the probe did not catch, and a setting timed only once in it makes "
            "predictions run high (each setting's faster timing counts); run `hwlat profile` "
            "again to time more of them a second time")
    return "; ".join(parts) if parts else None


def contended_line(report) -> str | None:
    """A warning when other processes shared the cores during this run's timings."""
    parts = []
    if report.models_contended_now:
        parts.append(
            f"{report.models_contended_now} of {report.models_measured_now} end-to-end model "
            f"timings ran while other processes kept up to {report.others_cores_max:.1f} cores "
            "busy; the fit leaves them out while enough others are quiet, and the next `hwlat "
            "profile` times those models again first")
    if report.ops_contended_now:
        timed = report.measured_now + report.zoo_retimed_now + report.ops_retimed_now
        parts.append(
            f"{report.ops_contended_now} of {timed} op timings ran while other processes kept "
            f"up to {report.ops_others_cores_max:.1f} cores busy; a config timed once that way "
            "is timed again later in the run or by the next `hwlat profile`, and the faster "
            f"timing counts ({report.ops_retimed_now} re-timed in this run)")
    return "; ".join(parts) + ": run it on an idle machine" if parts else None


def untimed_line(report) -> str | None:
    """What the budget left untimed (op configs per source, end-to-end model timings) and how to
    finish it; None when nothing is."""
    left = sum(report.untimed.values())
    parts = []
    if left:
        per_source = ", ".join(f"{n} {source}" for source, n in sorted(report.untimed.items()))
        parts.append(f"{left} planned op configs ({per_source})")
    if report.models_untimed:
        parts.append(f"{report.models_untimed} end-to-end model settings")
    if not parts:
        return None
    return (f"{' and '.join(parts)} are not timed yet; run `hwlat profile` again to time them "
            "(it continues where this run stopped)")
