"""Shared output helpers for commands: JSON to stdout, everything human to stderr or tables."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape as escape  # re-exported: commands escape user text with it
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

REDRAW_S = 0.25  # progress bars redraw at most this often


def _console(stream, **kwargs) -> Console:
    """A terminal gets its own width; a pipe or a log file gets 160 columns (rich's 80 would cut
    model specs in tables short) unless COLUMNS says otherwise."""
    import os

    wide = not stream.isatty() and not os.environ.get("COLUMNS")
    return Console(width=160 if wide else None, emoji=False, **kwargs)  # "x:100:y" stays text


stdout = _console(sys.stdout)
stderr = _console(sys.stderr, stderr=True)


def dim(text: str, console: Console | None = None) -> None:
    """A grey line of plain text (stderr unless `console`): brackets in it (shapes, specs,
    dtypes such as [float16:1x3x64x64]) are printed, not read as rich markup."""
    (console or stderr).print(text, style="dim", markup=False)


def _clean(value):
    """JSON-safe: NaN and inf become None (unknown is unknown, never a fake number)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def emit_json(value) -> None:
    sys.stdout.write(json.dumps(_clean(value), indent=2, default=str) + "\n")


@contextmanager
def budget_progress(description: str, enabled: bool = True) -> Iterator:
    """A progress bar over a time budget; yields `update(text, fraction)`.

    The bar is redrawn by `update` itself, between measurements, at most `REDRAW_S` apart: rich's
    default refresh thread would wake ten times a second and take the GIL and a core from
    whatever is being timed (on a 2-core machine at 2 threads, one of the two cores).
    """
    if not enabled:
        yield lambda text, fraction: None
        return
    columns = (TextColumn("{task.description:<48.48}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=stderr, transient=False, auto_refresh=False) as progress:
        task = progress.add_task(description, total=1.0)
        last = -math.inf

        def update(text: str, fraction: float) -> None:
            nonlocal last
            progress.update(task, description=text, completed=max(fraction, 0.0))
            if time.monotonic() - last >= REDRAW_S:
                progress.refresh()
                last = time.monotonic()

        yield update
        progress.update(task, completed=1.0)
        progress.refresh()


def parse_duration(text: str) -> float:
    """'90s', '10m', '1h', '1h30m' or plain seconds -> seconds."""
    import re

    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([smh])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"cannot read duration {text!r}; use e.g. 90s, 10m or 1h")
    return sum(float(n) * {"s": 1, "m": 60, "h": 3600}[u] for n, u in parts)
