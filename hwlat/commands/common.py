"""Options and helpers shared by several commands."""

from __future__ import annotations

import click

from kernels_db.store import KernelDB


def open_db(ctx: click.Context, *, readonly: bool = False) -> KernelDB:
    path = (ctx.find_root().obj or {}).get("db_path")
    return KernelDB.open(path, readonly=readonly)


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print JSON on stdout (and nothing else).")


def duration(ctx, param, value):
    from hwlat.output import parse_duration

    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if seconds <= 0:
        raise click.BadParameter("must be more than zero")
    return seconds
