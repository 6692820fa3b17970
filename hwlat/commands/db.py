"""`hwlat devices` and `hwlat db export|import`: what is in the kernel database, and moving it."""

from __future__ import annotations

from dataclasses import asdict

import click
from rich.table import Table

from hwlat.commands.common import json_option, open_db
from hwlat.output import emit_json, escape, stdout
from kernels_db.portable import export_device, import_file


@click.command()
@json_option
@click.pass_context
def devices(ctx, as_json):
    """List profiled devices with their counts."""
    with open_db(ctx, readonly=True) as db:
        rows = db.list_devices()
    if as_json:
        emit_json([r.to_json() for r in rows])
        return
    if not rows:
        stdout.print("no devices profiled yet; run `hwlat profile` on the target machine")
        return
    table = Table("id", "name", "threads", "configs", "measured", "samples", "models",
                  "last profiled")
    for r in rows:
        table.add_row(r.id, escape(r.name or ""), str(r.threads), str(r.n_configs), str(r.n_measured),
                      str(r.n_samples), str(r.n_models), _when(r.last_profiled))
    stdout.print(table)


def _when(timestamp: float | None) -> str:
    """A measurement time in local time, to the minute; "never" for a device with no profile
    (only `hwlat bench` timings)."""
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp)) if timestamp else "never"


@click.group()
def db():
    """Move a device's profile between machines."""


@db.command("export")
@click.argument("device")
@click.argument("file", type=click.Path(dir_okay=False))
@json_option
@click.pass_context
def export_cmd(ctx, device, file, as_json):
    """Write DEVICE's profile (configs, raw samples, model measurements) to FILE."""
    with open_db(ctx, readonly=True) as kdb:
        s = export_device(kdb, device, file)
    if as_json:
        emit_json({**asdict(s), "path": str(s.path)})
        return
    click.echo(f"exported {s.device_id}: {s.n_configs} op configs, {s.n_measurements} "
               f"measurements, {s.n_model_measurements} model measurements, {s.n_runs} runs "
               f"to {file}", err=True)


@db.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@json_option
@click.pass_context
def import_cmd(ctx, file, as_json):
    """Merge a profile exported with `hwlat db export` into this database (idempotent)."""
    with open_db(ctx) as kdb:
        s = import_file(kdb, file)
    if as_json:
        emit_json(asdict(s))
        return
    click.echo(f"imported {s.device_id}: {s.configs_added} new op configs, "
               f"{s.measurements_added} new measurements ({s.measurements_skipped} already "
               f"here), {s.model_measurements_added} new model measurements"
               + "".join(f"; {n}" for n in s.notes), err=True)
