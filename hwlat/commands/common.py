"""Options and helpers shared by several commands."""

from __future__ import annotations

import click

from kernels_db.store import KernelDB


def open_db(ctx: click.Context, *, readonly: bool = False) -> KernelDB:
    obj = ctx.find_root().obj or {}
    if not readonly:
        obj["writes"] = True  # an interruption now keeps what was measured (hwlat.cli says so)
    return KernelDB.open(obj.get("db_path"), readonly=readonly)


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


def output_file(ctx, param, value):
    """A file the command writes at its end (--plot, --csv): checked before anything is measured,
    so a typo in its folder costs a usage error, not an evaluation's minutes."""
    import os
    from pathlib import Path

    if value is None:
        return None
    path = Path(value).expanduser()  # as written: `--plot=~/x.png` reaches no shell
    if not path.parent.is_dir():
        raise click.BadParameter(f"folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise click.BadParameter(f"{value} is not writable here")
    if param.name and "plot" in param.name:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.BadParameter("plotting needs matplotlib; pip install 'hwlat[plot]'") from None
    return str(path)


def input_options(f):
    """--input (repeatable), --batch, --dtype: how a model is fed."""
    f = click.option("--dtype", default="float32", show_default=True,
                     type=click.Choice(["float32", "float16", "bfloat16"]))(f)
    f = click.option("--batch", type=click.IntRange(min=1),
                     help="Override the first dimension of every input.")(f)
    f = click.option("--input", "inputs", multiple=True, metavar="SPEC",
                     help="Input shape, e.g. 1x3x224x224 or int64:1x128; repeat it for a "
                          "model with several inputs. Feeds every MODEL given (default: each "
                          "model's own input).")(f)
    return f


def parse_inputs(inputs: tuple[str, ...]):
    """Input spec strings -> InputSpecs (None when not given: the model's defaults)."""
    from profilers.errors import SpecError
    from profilers.specs import parse_input_spec

    if not inputs:
        return None
    try:
        return [parse_input_spec(s) for s in inputs]
    except SpecError as exc:
        raise click.BadParameter(str(exc), param_hint="--input") from None


def write_plot(draw, path: str) -> None:
    """Run `draw(path)`; a missing matplotlib or an unwritable path is one line, not a traceback."""
    from profilers.errors import HwlatError

    try:
        draw(path)
    except ImportError:
        raise HwlatError("plotting needs matplotlib; pip install 'hwlat[plot]'") from None
    except (OSError, ValueError) as exc:
        raise HwlatError(f"cannot write plot {path}: {exc}") from None
