"""The reference model lists shipped in `data/zoo.json`, expanded into concrete model cases.

The training zoo is what `hwlat profile` measures; the held-out list is what `hwlat evaluate`
measures against predictions. Keeping both in one data file lets evaluation hold whole families
out of training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
# data/ of a checkout (editable installs, tests); a wheel carries it as hwlat/data (a symlink to
# data/ in the source tree, copied into the package when built)
DATA_DIR = next((d for d in (_ROOT / "data", _ROOT / "hwlat" / "data") if (d / "zoo.json").exists()),
                _ROOT / "data")


@dataclass(frozen=True)
class ModelCase:
    """One model at one setting: a spec, its family and concrete input specs."""

    spec: str
    family: str
    inputs: tuple[str, ...]

    @property
    def batch(self) -> int:
        first = self.inputs[0].split(":")[-1]
        return int(first.split("x")[0])

    @property
    def label(self) -> str:
        shapes = ",".join(self.inputs)
        return f"{self.spec} [{shapes}]"


@cache
def load_zoo() -> dict:
    return json.loads((DATA_DIR / "zoo.json").read_text())


def resolve_spec(spec: str) -> str:
    """A zoo spec naming a file in data/ (`models.py:factory`) as an absolute file spec."""
    path, sep, factory = spec.rpartition(":")
    if sep and path.endswith(".py") and not Path(path).is_absolute():
        return f"{DATA_DIR / path}:{factory}"
    return spec


def _fill(template: str, batch: int, resolution: int, seq: int) -> str:
    return template.format(B=batch, R=resolution, S=seq)


def expand(entry: dict, *, batches: list[int] | None = None) -> list[ModelCase]:
    """The concrete cases of one zoo entry over the zoo's settings (optionally fewer batches)."""
    settings = load_zoo()["settings"]
    spec, family, templates = resolve_spec(entry["spec"]), entry["family"], entry["inputs"]
    is_sequence = any("{S}" in t for t in templates)
    cases = []
    if is_sequence:
        for batch, seq in settings["sequence_settings"]:
            if batches is None or batch in batches:
                cases.append(ModelCase(spec, family, tuple(_fill(t, batch, 0, seq) for t in templates)))
        return cases
    resolutions = [224] if entry.get("fixed_resolution") else settings["image_resolutions"]
    for batch in batches or settings["image_batches"]:
        for res in resolutions:
            cases.append(ModelCase(spec, family, tuple(_fill(t, batch, res, 0) for t in templates)))
    return cases


def training_cases(batches: list[int] | None = None) -> list[ModelCase]:
    return [c for e in load_zoo()["training"] for c in expand(e, batches=batches)]


@cache  # a profile asks for its cases several times; a user's model is built once
def added_cases(spec: str, *, batches: tuple[int, ...] | None = None) -> tuple[ModelCase, ...]:
    """The cases of a model a user adds to the training zoo (`hwlat profile --add`): its own
    default inputs at the zoo's image batches (or `batches`), in the architecture family its
    name says, so the end-to-end fit holds it out with its relatives."""
    from profilers.specs import load_model

    path, sep, factory = spec.rpartition(":")
    if sep and path.endswith(".py"):  # stored in the database: found again from any directory
        spec = f"{Path(path).resolve()}:{factory}"
    elif spec.endswith(".pt2"):
        spec = str(Path(spec).resolve())
    loaded = load_model(resolve_spec(spec), meta=True)
    return tuple(ModelCase(loaded.spec, loaded.family or loaded.spec,
                           tuple(str(i.with_batch(batch)) for i in loaded.inputs))
                 for batch in batches or load_zoo()["settings"]["image_batches"])


def training_families() -> set[str]:
    return {e["family"] for e in load_zoo()["training"]}


def heldout_entries(*, only_unseen_families: bool = False) -> list[dict]:
    seen = training_families()
    return [e for e in load_zoo()["heldout"]
            if not (only_unseen_families and e["family"] in seen)]
