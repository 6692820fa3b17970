"""What an evaluation has timed so far, so an interrupted `hwlat evaluate` resumes where it stopped.

Evaluating the held-out zoo times 52 settings in three rounds, 14-18 minutes on 2 cores; before
this, Ctrl-C or a lost terminal at minute 17 threw every timing away. The journal is a JSON-lines
file: its first line says which evaluation it belongs to (device, cases, runs, warm-up, rounds,
anchor), then one line per timing as it completes, written and flushed before the next starts.
Running the same evaluation again takes the timings it holds and times only the rest; a finished
evaluation removes it. A journal of another evaluation, or one older than `MAX_AGE_S` (the
machine may have changed since), is started over. A line cut off by the interruption is ignored.
Where the journal cannot be written (a read-only home, a full disk) the evaluation goes on without
it and says so once (`unwritable`).

Only timings are kept: captures, predictions and the subnormal check are recomputed (seconds).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from profilers.timer import Measurement

MAX_AGE_S = 24 * 3600


def state_home() -> Path:
    """`$XDG_STATE_HOME/hwlat` (else `~/.local/state/hwlat`): data kept across runs, not a cache."""
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state",
                "hwlat").expanduser()


class EvalJournal:
    """The timings of one evaluation, keyed by what was timed: ("round", case, round),
    ("flushed", case), ("references", "before")."""

    def __init__(self, path: str | os.PathLike, key: dict, *, fresh: bool = False,
                 max_age_s: float = MAX_AGE_S) -> None:
        self.path = Path(path)
        self.key = key
        self.entries: dict[tuple, object] = {}
        self.started_at: float | None = None  # when the journal resumed was begun
        self.unwritable: str | None = None  # why timings are kept in memory only
        self._cut_off = False  # the file ends in a line an interruption cut off
        if not fresh:
            self._load(max_age_s)
        if not self.entries:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "w") as f:
                    f.write(json.dumps({"key": key, "started_at": time.time()}) + "\n")
            except OSError as exc:
                self.unwritable = f"cannot keep timings in {self.path.parent}: {exc.strerror}"

    @classmethod
    def for_evaluation(cls, device: str, cases: Sequence, *, runs: int, warmup: int,
                       rounds: int, anchor: str, fresh: bool = False,
                       directory: str | os.PathLike | None = None) -> EvalJournal:
        key = {"device": device, "runs": runs, "warmup": warmup, "rounds": rounds,
               "anchor": anchor,
               "cases": [[c.spec, list(c.inputs), c.dtype] for c in cases]}
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        try:
            root = Path(directory) if directory else state_home() / "evaluations"
        except RuntimeError:  # no home directory to put it under
            root = Path(".hwlat-evaluations")
        return cls(root / f"{digest}.jsonl", key, fresh=fresh)

    def _load(self, max_age_s: float) -> None:
        try:
            text = self.path.read_text()
        except OSError:
            return
        lines = text.splitlines()
        self._cut_off = bool(text) and not text.endswith("\n")
        try:
            head = json.loads(lines[0])
        except (IndexError, json.JSONDecodeError):
            return
        if head.get("key") != self.key or time.time() - head.get("started_at", 0) > max_age_s:
            return
        for line in lines[1:]:
            try:
                d = json.loads(line)
                value = (Measurement.from_json(d["value"]) if d.get("measurement")
                         else d["value"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # cut off by the interruption
            self.entries[tuple(d["what"])] = value
        self.started_at = head["started_at"]

    def get(self, *what):
        return self.entries.get(what)

    def add(self, value, *what) -> None:
        """Keep `value` (a Measurement or anything JSON can hold) for `what`, on disk now."""
        self.entries[what] = value
        if self.unwritable:
            return
        measurement = isinstance(value, Measurement)
        line = {"what": list(what), "measurement": measurement,
                "value": value.to_json() if measurement else value}
        try:
            with open(self.path, "a") as f:
                f.write(("\n" if self._cut_off else "") + json.dumps(line) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self._cut_off = False
        except OSError as exc:  # a full disk: the evaluation goes on, unjournaled
            self.unwritable = f"cannot keep timings in {self.path}: {exc.strerror}"

    def resumed(self) -> str | None:
        """One line saying what was taken from an interrupted run (None: nothing)."""
        if not self.entries:
            return None
        n = sum(1 for w in self.entries if w[0] == "round")
        begun = time.strftime("%H:%M", time.localtime(self.started_at))
        return (f"resuming the evaluation begun at {begun}: {n} timed round(s) kept "
                "(`hwlat evaluate --fresh` times everything again)")

    def finish(self) -> None:
        """The evaluation is done: nothing left to resume."""
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
