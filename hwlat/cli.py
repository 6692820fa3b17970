"""The `hwlat` command group. Commands live one per module in hwlat/commands/.

Domain errors (`HwlatError`) become one line on stderr and exit code 1; bad usage is click's
exit code 2. Nothing here computes anything: commands call the packages below.
"""

from __future__ import annotations

import sys

import click

from hwlat import __version__
from hwlat.commands import COMMANDS
from profilers import allocator
from profilers.errors import HwlatError


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except HwlatError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt:
            obj = ctx.obj or {}
            kept = obj.get("on_interrupt") or ("what was already stored is kept"
                                               if obj.get("writes") else "nothing was stored")
            click.echo(f"interrupted; {kept}", err=True)
            ctx.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hwlat")
@click.option("--db", "db_path", envvar="HWLAT_DB", type=click.Path(dir_okay=False),
              help="Kernel database (default: $XDG_DATA_HOME/hwlat/kernels.db).")
@click.pass_context
def cli(ctx: click.Context, db_path: str | None) -> None:
    """Predict how fast a neural network runs on a device you profiled once."""
    allocator.apply()  # before anything is allocated for timing; see profilers/allocator.py
    ctx.obj = {"db_path": db_path}


for command in COMMANDS:
    cli.add_command(command)


def main() -> None:
    cli.main(prog_name="hwlat", standalone_mode=True)


if __name__ == "__main__":
    sys.exit(main())
