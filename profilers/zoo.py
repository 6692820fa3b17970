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


def locate(spec: str) -> str:
    """A spec read back from a database, found on this installation: the shipped zoo's file
    models are stored by absolute path (`<checkout>/data/models.py:factory`, see `resolve_spec`),
    which is gone once the checkout moves or the database is imported on another machine; such a
    spec points at this installation's data/ file again when the factory is one of the zoo's.
    Any other spec is returned as it is."""
    path, sep, factory = spec.rpartition(":")
    stored = Path(path)
    if not (sep and path.endswith(".py")) or stored.exists() or stored.parent.name != "data":
        return spec
    shipped = f"{stored.name}:{factory}"
    lists = load_zoo()
    if any(e["spec"] == shipped for e in [*lists["training"], *lists["heldout"]]):
        return resolve_spec(shipped)
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


def added_cases(spec: str, *, batches: tuple[int, ...] | None = None) -> tuple[ModelCase, ...]:
    """The cases of a model a user adds to the training zoo (`hwlat profile --add`): its own
    default inputs at the zoo's image batches (or `batches`), in the zoo's family its name
    starts with (`timm:mobilenetv3_large_100`: mobilenet_v3), else the family its spec names,
    so the end-to-end fit holds it out with its relatives. A file spec is made absolute (it is
    stored in the database and found again from any directory)."""
    path, sep, factory = spec.rpartition(":")
    if sep and path.endswith(".py") and Path(path).is_file():
        spec = f"{Path(path).resolve()}:{factory}"
    elif spec.endswith(".pt2") and Path(spec).is_file():
        spec = str(Path(spec).resolve())
    return _added_cases(resolve_spec(spec), batches)


@cache  # a profile asks for its cases several times; a user's model is built once
def _added_cases(spec: str, batches: tuple[int, ...] | None) -> tuple[ModelCase, ...]:
    from profilers.errors import NoDefaultInputs
    from profilers.specs import load_model, with_batch

    try:
        loaded = load_model(spec, meta=True)
    except NoDefaultInputs:
        raise NoDefaultInputs(
            f"{spec}: no default inputs to profile it with; add it as a file.py:FACTORY that "
            "returns {'model': ..., 'inputs': ['1x3x224x224']}") from None
    name = spec.rpartition(":")[2].replace("_", "").replace("-", "").lower()
    zoo_family = max((f for f in _zoo_families() if name.startswith(f.replace("_", ""))),
                     key=len, default=None)
    return tuple(ModelCase(loaded.spec, zoo_family or loaded.family or loaded.spec,
                           tuple(str(i) for i in with_batch(loaded.inputs, batch)))
                 for batch in batches or load_zoo()["settings"]["image_batches"])


def _zoo_families() -> set[str]:
    return {e["family"] for e in (*load_zoo()["training"], *load_zoo()["heldout"])}


def training_families() -> set[str]:
    return {e["family"] for e in load_zoo()["training"]}


def heldout_entries(*, only_unseen_families: bool = False) -> list[dict]:
    seen = training_families()
    return [e for e in load_zoo()["heldout"]
            if not (only_unseen_families and e["family"] in seen)]
