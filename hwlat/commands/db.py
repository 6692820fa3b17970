"""`hwlat devices` and `hwlat db export|import`: what is in the kernel database, and moving it."""

from __future__ import annotations

import click
from rich.table import Table

from hwlat.commands.common import json_option, open_db
from hwlat.output import emit_json, stdout
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
        table.add_row(r.id, r.name or "", str(r.threads), str(r.n_configs), str(r.n_measured),
                      str(r.n_samples), str(r.n_models), str(r.last_profiled or "never"))
    stdout.print(table)


@click.group()
def db():
    """Move a device's profile between machines."""


@db.command("export")
@click.argument("device")
@click.argument("file", type=click.Path(dir_okay=False))
@click.pass_context
def export_cmd(ctx, device, file):
    """Write DEVICE's profile (configs, raw samples, model measurements) to FILE."""
    with open_db(ctx, readonly=True) as kdb:
        summary = export_device(kdb, device, file)
    click.echo(f"exported {summary} to {file}", err=True)


@db.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.pass_context
def import_cmd(ctx, file):
    """Merge a profile exported with `hwlat db export` into this database."""
    with open_db(ctx) as kdb:
        summary = import_file(kdb, file)
    click.echo(f"imported {summary}", err=True)
