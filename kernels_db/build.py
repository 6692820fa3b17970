"""Filling a device's kernel database: plan op configs, time them, store every sample. Resumable.

A run plans (deterministically, so a rerun plans the same configs), then claims unmeasured
configs in small batches and stores each measurement in its own transaction. Killing the process
loses at most the config being timed; the next run (or a concurrent one) takes over its claims.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from kernels_db.store import (
    SOURCE_PRIORITY,
    KernelDB,
    ModelMeasurement,
    quiet_ids,
    settings_key,
    slow_spell_ids,
)
from profilers import isolate, sampling, zoo
from profilers.contention import CpuUse, Meter
from profilers.errors import HwlatError

ProgressFn = Callable[[str, float], None]
"""Called with a phase description and the fraction of the budget used (0..1)."""


@dataclass
class ProfileSettings:
    device: str = "cpu"
    threads: int | None = None
    dtypes: tuple[str, ...] = ("float32",)
    budget_s: float = 600.0
    name: str | None = None
    models: tuple[str, ...] | None = None  # restrict the training zoo to these specs
    added: tuple[str, ...] = ()  # the user's own models, profiled as part of the zoo
    batches: tuple[int, ...] | None = None
    e2e: bool = True
    seed: int = 0
    claim_batch: int = 8
    random_per_family: int = 60


@dataclass
class ProfileReport:
    device_id: str
    run_id: str
    elapsed_s: float = 0.0
    planned: int = 0
    measured_now: int = 0
    models_measured_now: int = 0
    zoo_retimed_now: int = 0  # zoo op configs timed a second time at the end (ZOO_RETIME_SHARE)
    zoo_configs: int = 0
    zoo_measured: int = 0
    untimed: dict[str, int] = field(default_factory=dict)  # per source, left for a resumed run
    models_untimed: int = 0  # zoo settings short of their end-to-end timings (E2E_PASSES)
    models_contended_now: int = 0  # of the run's end-to-end timings, taken beside other work
    models_slow_now: int = 0  # ... and the others taken in a slow spell (profilers.pace)
    others_cores_max: float | None = None  # the most cores other processes took in one of them
    ops_contended_now: int = 0  # of the run's op timings, taken beside other work (_Metered)
    ops_others_cores_max: float | None = None  # the most cores others took over metered op timings
    ops_retimed_now: int = 0  # op configs timed a second time as the first ran beside other work
    models_timed_twice: int = 0  # settings this run timed with another quiet timing to compare
    models_pass_ratio_max: float | None = None  # their largest slower/faster ratio (SLOW_SPELL)
    noise_median: float | None = None
    stream_gbps_now: float | None = None  # the weight-streaming bandwidth timed again (retime_stream)
    status: str = "done"
    phases: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return dict(self.__dict__)


class _Deadline:
    def __init__(self, budget_s: float):
        self.start, self.budget_s = time.monotonic(), budget_s
        self.reserved_s = 0.0  # kept back for a later phase: `left` does not count it

    def used(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.budget_s - self.reserved_s - self.used()

    def keep_back(self, seconds: float) -> None:
        """Reserve `seconds` of what is left for a later phase (0 releases the reserve)."""
        self.reserved_s = max(0.0, min(seconds, self.budget_s - self.used()))

    def fraction(self) -> float:
        return min(1.0, self.used() / self.budget_s) if self.budget_s > 0 else 1.0


def _zoo_cases(settings: ProfileSettings) -> list[zoo.ModelCase]:
    cases = zoo.training_cases(list(settings.batches) if settings.batches else None)
    if settings.models:
        wanted = {zoo.resolve_spec(m) for m in settings.models}
        cases = [c for c in cases if c.spec in wanted]
        if not cases:
            known = ", ".join(e["spec"] for e in zoo.load_zoo()["training"])
            raise HwlatError(f"none of {', '.join(settings.models)} is in the training zoo; "
                             f"pick from: {known}; profile other models with --add")
    have = {(c.spec, c.inputs) for c in cases}
    for spec in settings.added:
        for case in zoo.added_cases(spec, batches=settings.batches):
            if (case.spec, case.inputs) not in have:
                have.add((case.spec, case.inputs))
                cases.append(case)
    return cases


def _added_specs(settings: ProfileSettings) -> list[str]:
    """The `--add` models as the database stores them (file specs made absolute)."""
    return list(dict.fromkeys(c.spec for spec in settings.added
                              for c in zoo.added_cases(spec, batches=settings.batches)))


def _with_earlier_added(db: KernelDB, device_id: str, settings: ProfileSettings) -> ProfileSettings:
    """Settings that keep the models earlier runs of this device added (a resumed profile
    without `--add` still gives them their second end-to-end pass); one that no longer loads
    is left out."""
    earlier = []
    for spec in dict.fromkeys(s for run in db.runs(device_id) for s in run.settings.get("added", [])):
        try:
            zoo.added_cases(spec, batches=settings.batches)
        except HwlatError:
            continue
        earlier.append(spec)
    return replace(settings, added=tuple(dict.fromkeys([*earlier, *settings.added])))


def check_settings(settings: ProfileSettings) -> None:
    """Fail on bad settings before any time is spent."""
    _zoo_cases(settings)


def _device_type(device: str) -> str:
    return device.split(":")[0]


def plan(db: KernelDB, device_id: str, settings: ProfileSettings,
         progress: ProgressFn | None = None) -> tuple[int, int]:
    """Insert the run's op configs (zoo, perturbations, random); returns (new, zoo total).

    After the zoo, perturbed and random configs share one priority and are queued one per
    (source, family, dtype) in turn, so a run stopped early has timed some of every kind. Queued
    after all perturbations (random ones last, family by family), a 10-minute 1-thread profile
    on a slow VM (8 MiB L3) timed the zoo and some perturbations but no random config, hence no
    linear layer with more than 9 MB of weights: alexnet's fc6 (151 MB) was priced at 3.4 GB/s
    (it runs at 13) and alexnet at batch 1 +126%. (A database planned before keeps its configs'
    insertion order: there, perturbations still come first.)"""
    from profilers.capture import capture_spec
    from profilers.ops import family_of
    from profilers.specs import parse_input_spec

    device_type = _device_type(settings.device)
    samples: list[sampling.Sample] = []
    zoo_records = []
    cases = _zoo_cases(settings)
    for case in cases:
        if progress:
            progress(f"capturing {case.label}", 0.0)
        for dtype in settings.dtypes:
            captured = capture_spec(case.spec, inputs=[parse_input_spec(s) for s in case.inputs],
                                    device_type=device_type, dtype=dtype)
            recs = list(sampling.timed_records(captured.ops))
            zoo_records.extend(recs)
            samples.extend(sampling.Sample(r, "zoo", SOURCE_PRIORITY["zoo"]) for r in recs)
    n_zoo = len({r.key for r in zoo_records})
    rng_seed = settings.seed
    streams: dict[tuple[str, str, str], list] = {}  # (source, family, dtype) -> records
    for r in sampling.perturbations(zoo_records, max(200, n_zoo), seed=rng_seed):
        streams.setdefault(("perturb", family_of(r.op), r.dtype), []).append(r)
    for family in sampling.GENERATORS:
        for dtype in settings.dtypes:
            n = sampling.draws(family, settings.random_per_family)
            streams[("random", family, dtype)] = sampling.random_records(
                family, n, seed=rng_seed, device_type=device_type, dtype=dtype)
    for deal in itertools.zip_longest(*streams.values()):  # one of each stream in turn
        samples.extend(sampling.Sample(r, source, SOURCE_PRIORITY[source])
                       for (source, _, _), r in zip(streams, deal, strict=True) if r is not None)
    unique = sampling.dedupe(samples)
    new = db.add_configs(device_id, [
        (s.record.key, s.record.op, family_of(s.record.op), s.record.dtype, s.source,
         s.record.to_json(), s.priority) for s in unique])
    return new, n_zoo


PLAN_FIELDS = ("device", "dtypes", "models", "added", "batches", "seed", "random_per_family")
PLAN_SOURCES = ("profilers/sampling.py", "profilers/capture.py", "profilers/oprecord.py",
                "profilers/ops.py", "profilers/zoo.py", "data/zoo.json", "data/models.py")
"""The settings and files whose contents decide which configs a plan holds (with torch's
version): while none of them changed, a resumed profile skips planning."""
PLAN_VERSION = 2  # of `plan` itself: raise it when plan() changes what it queues (2: dealt in turn)


def plan_key(settings: ProfileSettings) -> str:
    """A digest of everything the plan depends on. Capturing the zoo for a plan took 112 s of a
    10-minute profile on the slow 2-vCPU VM, and a resumed run planned the same configs again."""
    import torch

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(f"{torch.__version__} plan {PLAN_VERSION}".encode())
    fields = {k: getattr(settings, k) for k in PLAN_FIELDS}
    h.update(json.dumps(fields, sort_keys=True, default=list).encode())
    files = [root / f for f in PLAN_SOURCES]
    files += [Path(spec.rpartition(":")[0] or spec) for spec in settings.added]  # .py / .pt2
    for path in files:
        if path.is_file():
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:16]


def planned_before(db: KernelDB, device_id: str, key: str) -> bool:
    """Whether an earlier run of this device got past planning with the same `plan_key` (it
    finished, or it timed something)."""
    return any(run.settings.get("plan_key") == key
               and (run.status == "done" or db.run_measured(run.id))
               for run in db.runs(device_id))


OP_REL_TOL = 0.04
"""An op config is timed until its median's 95% interval is within 4% (the timer's default is
2%): a medium conv's median already varies 4% from one process to the next (DESIGN.md), so the
narrower interval bought little, and on a noisy VM (IQR a median 8% of the median) it took 221
samples for a 0.9 ms op. 10-minute 1-thread profiles on the slow VM timed the zoo in 229 and 271 s
instead of 301 s; predicted from them the held-out zoo scored the same (11.7% and 11.6% MAPE on
one set of measurements): what it buys is time for sampling (benchmarks/RESULTS.md)."""


def _measure_config(record, device: str, flusher, threads: int):
    """(measurement, telemetry or None); on a GPU a config timed while throttled is re-timed."""
    from profilers.opbench import op_callable
    from profilers.timer import measure_stable

    fn = op_callable(record, device=device)

    def timed():
        return measure_stable(fn, flush=flusher, device=device, label=record.op,
                              rel_tol=OP_REL_TOL)

    if _device_type(device) != "cuda":
        return timed(), None
    m, tel = _with_telemetry(timed, device)
    if tel and tel["throttled"]:
        m, tel = _with_telemetry(timed, device)
        tel["remeasured"] = True
    return m, tel


def _with_telemetry(timed, device: str):
    """Run `timed()` between two NVML snapshots; telemetry None where NVML is unavailable."""
    from profilers import telemetry
    from profilers.errors import DeviceError

    index = int(device.partition(":")[2] or 0)
    try:
        before = telemetry.read_telemetry(index)
    except (DeviceError, ImportError):
        return timed(), None
    m = timed()
    after = telemetry.read_telemetry(index)
    warnings = telemetry.compare(before, after)
    return m, {"before": before.to_json(), "after": after.to_json(), "warnings": warnings,
               "throttled": after.throttled or bool(warnings), "remeasured": False}


class _Metered:
    """Meters consecutive op timings with `profilers.contention` and records the reading with
    them (`KernelDB.annotate_cpu_use`). One op is often timed in a few milliseconds, too short
    for the kernel's 10 ms ticks, so a reading covers the timings of at least
    `contention.MIN_WINDOW_S`; those a call times last, in a shorter window, stay unknown
    (`close` gives them their pace).

    With `probe` (`profilers.pace.probe`, on a CPU) the machine's pace is timed between windows
    and each window's timings get the geometric mean of the paces before and after it: a VM that
    flaps between two speeds puts a config's timing in either, and the models are trained on
    timings brought to one pace (`kernels_db.store.at_usual_pace`)."""

    def __init__(self, db: KernelDB, threads: int | None,
                 probe: Callable[[], float] | None = None) -> None:
        self.db, self.threads, self.probe = db, threads, probe
        self.pace_s = probe() if probe else None
        self.meter, self.ids = Meter(), []

    def timed(self, measurement_id: int) -> None:
        self.ids.append(measurement_id)
        use = self.meter.stop()
        if use is not None:
            self._close_window(use)

    def close(self) -> None:
        """The timings of a last window too short to meter get the pace around them all the same
        (their CPU use stays unknown). A timing with no pace counts as unpaired to a later run's
        re-timing (`KernelDB.claim_unmeasured`, `paced`): of two runs sharing a database, the
        one that finished second timed some of the other's last configs a third time."""
        if self.ids:
            self._close_window(None)

    def _close_window(self, use: CpuUse | None) -> None:
        """Record the window's reading and the pace around it (geometric mean of the probe
        before and after) with its timings, and open the next window."""
        window_pace = None
        if self.probe:
            after = self.probe()
            window_pace, self.pace_s = math.sqrt(self.pace_s * after), after
        self.db.annotate_cpu_use(self.ids, use, self.threads, pace_s=window_pace)
        self.meter, self.ids = Meter(), []


def window_probe(device: str) -> Callable[[], float] | None:
    """The pace probe `_Metered` times between windows of op timings (None off the CPU)."""
    from profilers import pace

    return pace.probe(pace.WINDOW_PROBE_RUNS) if device == "cpu" else None


def _time_config(db: KernelDB, row, run_id: str, settings: ProfileSettings, flusher,
                 threads: int, metered: _Metered) -> bool:
    """Time one claimed config and store it; False if it failed (marked, not retried)."""
    from profilers.oprecord import OpRecord

    record = OpRecord.from_json(row.record)
    try:
        m, tel = _measure_config(record, settings.device, flusher, threads)
    except Exception as exc:  # noqa: BLE001 - one bad config must not stop a run
        db.mark_failed(row.id, run_id, f"{type(exc).__name__}: {exc}"[:300])
        return False
    metered.timed(db.add_measurement(row.id, run_id, m.samples_s, flushed=flusher is not None,
                                     threads=threads, noisy=m.is_noisy, telemetry=tel))
    return True


def measure_configs(db: KernelDB, device_id: str, run_id: str, settings: ProfileSettings,
                    deadline: _Deadline, flusher, threads: int, *, max_priority: int | None = None,
                    below: int = 1, contended: bool = False, earlier_only: bool = False,
                    paced: bool = False, progress: ProgressFn | None = None) -> int:
    """Claim and time configs with fewer than `below` measurements (1: unmeasured ones) until
    none are left or the deadline passes; with `contended`, instead the configs timed once,
    beside other work, a second time (`earlier_only`: those timed so by an earlier run); with
    `paced`, where the window probe runs (a CPU), also those with fewer than `below` timings
    paced by it that this run has not timed (`KernelDB.claim_unmeasured`).

    Every timing is metered for other processes' CPU use (`_Metered`). A neighbour only slows a
    timing down (at 1 thread on the 2-vCPU VM a memory copy on the other core slowed models
    1.18-1.63x, at 2 threads one busy neighbour 2.1-4.0x; `profilers.contention`), and of a
    config's timings the predictor uses the faster (`kernels_db.store._pooled`): so a contended
    one is timed once more, and never a third time, so a machine that stays busy cannot hold a
    profile in re-timing. A run re-times its own at its end, not straight away: in a 3-minute
    profile beside a 1-thread matmul over a minute of it, 52 of 54 configs re-timed right after
    its zoo phase ran beside the matmul again."""
    done = 0
    verb = "timing" if below <= 1 and not contended else "re-timing"
    what = " timed beside other work" if contended else ""
    metered = _Metered(db, threads, window_probe(settings.device))
    while deadline.left() > 0:
        batch = db.claim_unmeasured(device_id, run_id, settings.claim_batch,
                                    max_priority=max_priority, below=below, contended=contended,
                                    earlier_than=run_id if earlier_only else None,
                                    paced=paced and metered.probe is not None)
        if not batch:
            break
        for row in batch:
            if deadline.left() <= 0:
                break
            if _time_config(db, row, run_id, settings, flusher, threads, metered):
                done += 1
                if progress:
                    progress(f"{verb} {row.family} ({row.source}{what})", deadline.fraction())
        db.release_claims(run_id)
    metered.close()
    return done


E2E_PASSES = 2
"""The training zoo's end-to-end timings are taken in two passes, at the start of a profile and
after its op sampling, and a setting's reference is the faster of its timings: a slow spell of
a shared machine during one pass then does not reach the correction fitted on them. (At 2
threads here, the second pass of one profile ran a median 1.10x as long as the first, up to
1.34x; zoo references timed at the start of another later ran 0.957x as long.) The
second pass needs fresh child processes (`profilers.isolate`): a process that has timed
thousands of op configs ran BERT 3.2x slower than a new one, so without isolation the zoo is
timed once, first.

The first pass may take the whole share (the second still gets `SECOND_PASS_MIN` of it, from the op
sampling): a setting timed only in the second pass has no faster timing to fall back on. In a
10-minute 2-thread profile whose first pass had half the share, 12 of the 59 settings (all of
vit_b_32, the transformer encoder, bert and gpt2, last in zoo order) were timed only at the end, in
a slow spell (resnet50 ran 1.25x its first-pass time there); they came out 1.2-1.3x their time an
hour later, pulled the weight re-read coefficient from 1.25 to 2.19, and the held-out CNNs at batch
1 were over-predicted by up to 25%. Re-timing the zoo's settings an hour later (its ops as
profiled) gave 6.8% held-out MAPE instead of 7.3%, and 81% instead of 77% within 10%, against the
same evaluation. Within a pass the settings go round the models (every model's first setting, then
every model's second), so a pass cut short leaves out the last settings of the models that have the
most, not whole models. The next profile (every setting timed in the first pass, 42 of 59 again in
the second) scored 6.1%, 5.6%, 5.0% and 5.9% MAPE on the four 2-thread sets of benchmarks/ACCURACY.md, against 7.5%,
8.7%, 16.6% and 9.5% before."""
E2E_SHARE = 0.25  # of the budget for both passes together (about)
SECOND_PASS_MIN = 0.25  # of that share, kept for the second pass even when the first used it all
ZOO_RETIME_SHARE = 0.1
"""The zoo's op configs are timed first, in one short phase, and every model sharing them uses
those medians as they are; a slow spell then biases all of them. So they are timed again after
the sampling (within this share of the budget) and each keeps its faster timing. (In one
2-thread profile here, the 869 configs timed 13-16 s into the run took a median 1.157x as long as
in the previous profile, the rest 1.01-1.07x; mobilenet_v2's summed ops went from 0.75x to 1.02x
of its end-to-end time.)"""
RETIME_OF_LEFT = 1 / 3
"""...and within a third of the time the zoo left: the rest goes to sampling. On the slow VM the
zoo took 271 s of a 10-minute profile, the re-timing kept back 58 s, and the sampling got none
(held-out zoo 12.2% MAPE, 65% within 10%); with this cap a profile sampled for 117 s and
re-timed for 58 s (6.9%, 85%; benchmarks/RESULTS.md)."""
E2E_MAX_TIME_S = 2.5  # per model and pass: most stop earlier, when their median is stable
E2E_START_S = 1.0
"""A setting's child process, imports and model build, before any is seen in a pass: 0.1-1.2 s for
the zoo's torchvision models on the slow VM, 5-6 s for the transformers."""
E2E_UNTIMED_S = 3.0  # what a setting never timed is taken to need (the cap of 2.5 s, start-up)
SLOW_SPELL = 1.25
"""A setting's two quiet end-to-end timings this far apart (the slower over the faster) mean the
machine ran slow in one of them without any other process busy, which CPU accounting cannot see,
and `hwlat profile` warns. In a 2-thread profile on the slow VM the first ~100 s of the first pass
ran 1.2-1.9x slow (resnet18 at 1x3x224x224: 121.7 ms, then 68.5 ms in the second pass); the
correction fitted on it over-predicted the held-out zoo by a median 29% (30.9% MAPE), and with
every setting timed once more 10.0% (benchmarks/RESULTS.md); its two settings timed twice were
1.37x and 1.78x apart, against 1.04x and 1.00x in the clean 2- and 1-thread profiles before it."""


def pass_spread(timings: Sequence[ModelMeasurement], run_id: str) -> tuple[int, float | None]:
    """(settings, largest ratio): of a device's end-to-end `timings`, the settings this run timed
    that have another quiet timing, this run's or an earlier one's (a file model's from another
    checkout too, as in `fastest_forwards`), and the largest ratio of a setting's slowest quiet
    timing to its fastest (None: no such setting)."""
    quiet: dict[tuple[str, str], list] = {}
    undisturbed = quiet_ids(timings)
    for m in timings:
        if m.id in undisturbed:
            quiet.setdefault((zoo.locate(m.model), m.settings_key), []).append(m)
    ratios = [max(t.median_s for t in ts) / min(t.median_s for t in ts)
              for ts in quiet.values()
              if len(ts) > 1 and any(t.run_id == run_id for t in ts)]
    return len(ratios), max(ratios, default=None)


def least_setting_s(pace_s: float | None, start_s: float = E2E_START_S) -> float:
    """The least an end-to-end timing of a setting takes whose forward pass took `pace_s` before:
    start-up, warm-up and the fewest runs `time_forward` keeps (its time cap stops at
    `timer.MIN_SAMPLES_UNDER_CAP`). `E2E_UNTIMED_S` for a setting never timed."""
    from profilers.modelbench import FORWARD_MIN_RUNS, FORWARD_WARMUP
    from profilers.timer import MIN_SAMPLES_UNDER_CAP

    if pace_s is None:
        return E2E_UNTIMED_S
    return start_s + (FORWARD_WARMUP + min(FORWARD_MIN_RUNS, MIN_SAMPLES_UNDER_CAP)) * pace_s


def fastest_forwards(db: KernelDB, device_id: str) -> dict[tuple[str, str], float]:
    """(spec, settings key) -> the fastest median forward pass of the device's e2e timings, the
    undisturbed ones where a setting has any (`quiet_ids`: a contended one ran 2-3x slow: as its
    pace, the setting it leaves pending would not seem to fit the time left)."""
    fastest: dict[tuple[str, str], float] = {}
    timings = db.model_measurements(device_id, kind="e2e")
    undisturbed = quiet_ids(timings)
    quiet = {(m.model, m.settings_key) for m in timings if m.id in undisturbed}
    for m in timings:
        if m.id not in undisturbed and (m.model, m.settings_key) in quiet:
            continue
        where = (zoo.locate(m.model), m.settings_key)
        fastest[where] = min(m.median_s, fastest.get(where, m.median_s))
    return fastest


def second_pass_reserve(share_s: float, took_s: float, done: int, waiting_s: float,
                        waiting: int) -> float:
    """Seconds to keep back for the second end-to-end pass: what the first left of the share,
    but at least `SECOND_PASS_MIN` of it (a first pass that used it all would leave no setting
    its faster timing), and no more than the `waiting` settings take - at the first pass's pace,
    or where it timed none (a resumed run), `waiting_s`: their least time at their earlier pace
    (a flat 3 s each kept back 3 s for convnext_tiny at batch 8, which then never fit)."""
    need_s = waiting * took_s / done if done else waiting_s
    return min(need_s, max(share_s - took_s, SECOND_PASS_MIN * share_s))


def measure_models(db: KernelDB, device_id: str, run_id: str, settings: ProfileSettings,
                   deadline: _Deadline, threads: int, *, share_s: float, pass_no: int = 1,
                   progress: ProgressFn | None = None) -> int:
    """End-to-end latency of the training zoo's cases with fewer than `pass_no` uncontended
    measurements on this device (`pending_models`), the least measured first (a case pass 1 had
    no time for comes before a second timing of another), within `share_s`; an interrupted
    profile's next run fills in the rest.

    A setting is skipped when the least it can take (`least_setting_s`: at its earlier pace,
    with the smallest start-up seen in this call, none before the first; 3 s if never timed) is
    more than the time left. A 10-minute profile ended 12 s past its budget, its last setting
    (convnext_tiny at batch 8: 1.2 s of start-up, then 2 warm-up and 3 timed forward passes of
    2.5 s) began 1.5 s before the deadline; a 2-thread one 6 s past it, on resnet50 at batch 8
    (never timed before, 7.4 s) began with 1.6 s left."""
    from profilers.modelbench import FORWARD_WARMUP, time_forward_isolated

    pending = pending_models(db, device_id, settings, threads, below=pass_no)
    earlier = fastest_forwards(db, device_id)
    stop_at = deadline.used() + share_s
    done, start_s = 0, None  # start_s: the smallest start-up seen so far
    for case, dtype, key in pending:
        if deadline.used() > stop_at or deadline.left() <= 0:
            break
        pace_s = earlier.get((case.spec, settings_key(key)))
        if least_setting_s(pace_s, start_s or 0.0) > deadline.left():
            continue  # it cannot finish in the time left: a resumed profile times it
        if progress:
            progress(f"end-to-end {case.label} (pass {pass_no}/{E2E_PASSES})", deadline.fraction())
        t = time.monotonic()
        m = time_forward_isolated(case.spec, list(case.inputs), threads=threads, dtype=dtype,
                                  device=settings.device,
                                  max_time_s=min(E2E_MAX_TIME_S, max(1.0, deadline.left() / 4)))
        runs_s = sum(m.samples_s) + FORWARD_WARMUP * m.median_s
        started_s = max(time.monotonic() - t - runs_s, 0.0)
        start_s = started_s if start_s is None else min(start_s, started_s)
        stats = {**(m.cpu_use.to_stats() if m.cpu_use else {}),
                 **({"pace_s": m.pace_s} if m.pace_s is not None else {}),
                 **({"chain_s": m.chain_s} if m.chain_s is not None else {})}
        db.add_model_measurement(device_id, case.spec, case.family, key, m.samples_s,
                                 run_id=run_id, stats=stats or None)
        done += 1
    return done


def pending_models(db: KernelDB, device_id: str, settings: ProfileSettings, threads: int, *,
                   below: int) -> list[tuple[zoo.ModelCase, str, dict]]:
    """(case, dtype, settings) of the zoo cases with fewer than `below` end-to-end measurements,
    the least measured first, then round the models (see E2E_PASSES; zoo order within a round).
    A timing taken while other processes shared the cores (`contended`) or in a slow spell of
    the machine (`slow_spell_ids`) does not count: the second pass, or the next profile, times
    its setting again."""
    timings = db.model_measurements(device_id, kind="e2e")
    undisturbed = quiet_ids(timings)
    have = Counter((zoo.locate(m.model), m.settings_key)
                   for m in timings if m.id in undisturbed)
    out = []
    nth_of_model: Counter = Counter()
    for case in _zoo_cases(settings):
        for dtype in settings.dtypes:
            key = model_settings(case, dtype, threads, settings.device)
            count = have[(case.spec, settings_key(key))]
            if count < below:
                out.append(((count, nth_of_model[case.spec]), case, dtype, key))
                nth_of_model[case.spec] += 1
    # a stable sort: zoo order within a round
    return [(case, dtype, key) for _, case, dtype, key in sorted(out, key=lambda t: t[0])]


def model_settings(case: zoo.ModelCase, dtype: str, threads: int, device: str) -> dict:
    return {"inputs": list(case.inputs), "batch": case.batch, "dtype": dtype, "threads": threads,
            "device": _device_type(device), "grad_mode": "inference", "kind": "e2e"}


def adaptive_round(db: KernelDB, device_id: str, settings: ProfileSettings, round_no: int) -> int:
    """Plan more configs for the families a quick model predicts worst on held-out configs,
    among those the zoo's models use: a family only random configs stand for (recurrent layers
    in a CNN zoo) is hard to predict, so it topped the ranking of every round and took 1628
    configs of one 10-minute profile that no zoo or held-out model needed.

    `round_no` counts over all runs of the device, so a resumed profile samples new configs.
    """
    measured = db.measured_at_usual_pace(device_id)  # read once: the ranking, the perturbations
    in_zoo = {m.family for m in measured if m.source == "zoo"}
    errors = {f: e for f, e in family_errors(db, device_id, measured).items() if f in in_zoo}
    if not errors:
        return 0
    worst = sorted(errors, key=errors.get, reverse=True)
    from profilers.ops import family_of

    device_type = _device_type(settings.device)
    new_samples = []
    from profilers.oprecord import OpRecord

    for rank, family in enumerate(worst[:3]):
        n = 40 // (rank + 1)
        if family in sampling.GENERATORS:
            for dtype in settings.dtypes:
                new_samples += [sampling.Sample(r, "adaptive", SOURCE_PRIORITY["adaptive"])
                                for r in sampling.random_records(family, n, seed=1000 + round_no,
                                                                 device_type=device_type,
                                                                 dtype=dtype)]
        base = [OpRecord.from_json(m.record) for m in measured if m.family == family]
        new_samples += [sampling.Sample(r, "adaptive", SOURCE_PRIORITY["adaptive"])
                        for r in sampling.perturbations(base, n, seed=2000 + round_no)]
    unique = sampling.dedupe(new_samples)
    return db.add_configs(device_id, [
        (s.record.key, s.record.op, family_of(s.record.op), s.record.dtype, s.source,
         s.record.to_json(), s.priority) for s in unique])


ADAPTIVE_ROWS = 600  # per family: a rough error ranking needs few rows, and it runs every round


def family_errors(db: KernelDB, device_id: str, measured: list | None = None) -> dict[str, float]:
    """Held-out MAPE per family of a quick LightGBM on log latency (3-fold), where >= 30 configs.

    Cheap on purpose (a sample of configs, one thread: OpenMP workers left spinning would disturb
    the op timings that follow); it only ranks families for the next adaptive round.
    """
    import lightgbm as lgb

    from profilers.oprecord import OpRecord
    from profilers.ops import feature_names, features

    device = db.get_device(device_id)
    peaks = device.peaks
    by_family: dict[str, list] = {}
    for m in db.measured_at_usual_pace(device_id) if measured is None else measured:
        by_family.setdefault(m.family, []).append(m)
    errors = {}
    for family, rows in by_family.items():
        if len(rows) < 30 or family in ("free", "unknown"):
            continue
        if len(rows) > ADAPTIVE_ROWS:
            rows = random.Random(len(rows)).sample(rows, ADAPTIVE_ROWS)
        names = feature_names(family)
        feats = [features(OpRecord.from_json(r.record), peaks, device.threads) for r in rows]
        x = np.array([[f.get(n, np.nan) for n in names] for f in feats], dtype=float)
        y = np.log(np.array([r.median_s for r in rows]))
        idx = np.arange(len(rows))
        random.Random(0).shuffle(idx)
        folds = np.array_split(idx, 3)
        ape = []
        for k in range(3):
            test = folds[k]
            train = np.concatenate([folds[j] for j in range(3) if j != k])
            model = lgb.LGBMRegressor(n_estimators=60, learning_rate=0.15, num_leaves=15,
                                      min_child_samples=3, n_jobs=1, verbose=-1)
            model.fit(x[train], y[train])
            pred = model.predict(x[test])
            ape.extend(np.abs(np.exp(pred - y[test]) - 1))
        errors[family] = float(np.mean(ape))
    return errors


def _tf32_settings(device: str) -> dict | None:
    """fp32 matmuls/convs may run as TF32 on NVIDIA GPUs; what was timed depends on it."""
    if _device_type(device) != "cuda":
        return None
    import torch

    return {"matmul": torch.backends.cuda.matmul.allow_tf32,
            "cudnn": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def retime_stream(db: KernelDB, device_id: str, device: str, threads: int | None,
                  measure: Callable[[str, int | None], float | None] | None = None,
                  measure_batched: Callable[[str, int | None], float | None] | None = None,
                  measure_reorder: Callable[[str, int | None], float | None] | None = None
                  ) -> float | None:
    """Time a CPU's weight-reading bandwidths once more (~4 s) and keep the fastest of each in
    its peaks: the weight-streaming one (`fingerprint.measure_stream_gbps`), the batched one
    (`fingerprint.measure_batched_gbps`) and oneDNN's conv weight reorder
    (`fingerprint.measure_reorder_gbps`). The predictor floors weights at the first two
    (`Predictor._memory_floor_s`, `Predictor._cold_rate`) and adds the reorder to a conv's
    roofline at the third (`predictor.features.SERIAL_BYTES`), and one timing in a slow spell of the
    machine (a stream of 12.4 GB/s where 18-21 minutes later gave 18.1-18.4) would make that
    floor a worst case. Like an op config's timings, the fastest is kept: interference only
    slows a timing down. A device profiled before one was measured gets it here. The peaks
    (part of the state token) are written only when one rises, so the op models are refitted
    only for a floor that moved. Returns the stream's new timing (None: no peaks, a GPU, or
    the timing failed; the profile goes on without it)."""
    from profilers.fingerprint import (
        measure_batched_gbps,
        measure_reorder_gbps,
        measure_stream_gbps,
    )

    peaks = db.get_device(device_id).peaks
    if not peaks:
        return None
    timed = {}
    for key, fn in (("stream_gbps", measure or measure_stream_gbps),
                    ("batched_gbps", measure_batched or measure_batched_gbps),
                    ("reorder_gbps", measure_reorder or measure_reorder_gbps)):
        try:
            timed[key] = fn(device, threads)
        except (RuntimeError, MemoryError):  # e.g. no room for the 1 GiB buffer: keep what is
            timed[key] = None
    faster = {k: v for k, v in timed.items() if v is not None and v > (peaks.get(k) or 0)}
    if faster:
        db.set_peaks(device_id, {**peaks, **faster})
    return timed["stream_gbps"]


def measure_llc_once(db: KernelDB, device_id: str, device: str, threads: int | None,
                     measure: Callable[[str, int | None], int | None] | None = None) -> None:
    """Give a CPU profiled before `measure_peaks` swept its LLC the measured one (~1 s): the
    predictor takes it over lscpu's (`fingerprint.LLC_SPEEDUP`). Once: the peaks (part of the
    state token) are written once, with None where the sweep found no cache faster than memory."""
    from profilers.fingerprint import measure_llc_bytes

    row = db.get_device(device_id)
    if row.kind != "cpu" or not row.peaks or "llc_bytes" in row.peaks:
        return
    try:
        llc = (measure or measure_llc_bytes)(device, threads)
    except (RuntimeError, MemoryError):  # no room for the 1 GiB buffer: lscpu's stays
        return
    db.set_peaks(device_id, {**row.peaks, "llc_bytes": llc})


def measure_subnormal_once(db: KernelDB, device_id: str, threads: int | None,
                           measure: Callable[[int | None], dict] | None = None) -> None:
    """Give a CPU profiled before `measure_peaks` timed what a subnormal value costs it the
    measured cost (~0.2 s; `profilers.subnormals`): without it the predictor cannot price the
    subnormals a model computes. Once: the peaks (part of the state token) are written once."""
    from profilers.subnormals import measure_cost

    row = db.get_device(device_id)
    if row.kind != "cpu" or not row.peaks or row.peaks.get("subnormal"):
        return
    db.set_peaks(device_id, {**row.peaks,
                             "subnormal": (measure or measure_cost)(threads)})


def profile_device(db: KernelDB, settings: ProfileSettings,
                   progress: ProgressFn | None = None) -> ProfileReport:
    """The whole `hwlat profile` job within `settings.budget_s`."""
    from profilers.fingerprint import fingerprint, measure_peaks
    from profilers.timer import CacheFlusher, flush_bytes, thread_count

    check_settings(settings)
    deadline = _Deadline(settings.budget_s)
    fp = fingerprint(settings.device, settings.threads)
    device_id = fp.device_id
    db.upsert_device(fp.to_json(), device_id=device_id, kind=fp.kind, threads=fp.threads,
                     name=settings.name)
    settings = _with_earlier_added(db, device_id, settings)
    report = ProfileReport(device_id=device_id, run_id="")
    second_pass = settings.e2e and isolate.enabled()
    with thread_count(fp.threads):
        if db.get_device(device_id).peaks is None:
            if progress:
                progress("measuring device peaks", deadline.fraction())
            db.set_peaks(device_id, measure_peaks(settings.device, fp.threads,
                                                  dtypes=settings.dtypes, budget_s=5.0))
        key = plan_key(settings)
        replan = not planned_before(db, device_id, key)
        run_id = db.start_run(device_id, budget_s=settings.budget_s,
                              settings={"dtypes": list(settings.dtypes), "seed": settings.seed,
                                        "models": list(settings.models or []),
                                        "added": _added_specs(settings),
                                        "tf32": _tf32_settings(settings.device),
                                        "plan_key": key})
        report.run_id = run_id
        status = "interrupted"
        try:
            t = time.monotonic()
            if replan:
                report.planned, report.zoo_configs = plan(db, device_id, settings, progress)
            report.phases["plan_s"] = time.monotonic() - t
            flusher = CacheFlusher(flush_bytes(fp.kind, fp.threads, fp.l2_bytes),
                                   settings.device)
            e2e_reserve_s = 0.0
            if settings.e2e:
                share_s = max(10.0, E2E_SHARE * deadline.left())
                t = time.monotonic()
                report.models_measured_now = done = measure_models(
                    db, device_id, run_id, settings, deadline, fp.threads, share_s=share_s,
                    progress=progress)
                report.phases["models_s"] = took = time.monotonic() - t
                if second_pass:
                    waiting = pending_models(db, device_id, settings, fp.threads,
                                             below=E2E_PASSES)
                    earlier = fastest_forwards(db, device_id)
                    waiting_s = sum(least_setting_s(earlier.get((c.spec, settings_key(k))))
                                    for c, _, k in waiting)
                    e2e_reserve_s = second_pass_reserve(share_s, took, done, waiting_s,
                                                        len(waiting))
            deadline.keep_back(e2e_reserve_s)
            t = time.monotonic()
            report.measured_now += measure_configs(db, device_id, run_id, settings, deadline, flusher,
                                                   fp.threads, max_priority=0, progress=progress)
            report.phases["zoo_s"] = time.monotonic() - t
            zoo_reserve_s = min(report.phases["zoo_s"], ZOO_RETIME_SHARE * settings.budget_s,
                                RETIME_OF_LEFT * max(deadline.left(), 0.0))
            deadline.keep_back(e2e_reserve_s + zoo_reserve_s)
            t = time.monotonic()
            report.ops_retimed_now += measure_configs(  # earlier runs' (this run's: at its end)
                db, device_id, run_id, settings, deadline, flusher, fp.threads, contended=True,
                earlier_only=True, progress=progress)
            report.measured_now += measure_configs(db, device_id, run_id, settings, deadline,
                                                   flusher, fp.threads, progress=progress)
            round_no, empty = 100 * len(db.runs(device_id)), 0
            while deadline.left() > 5 and empty < 3:
                round_no += 1
                added = adaptive_round(db, device_id, settings, round_no)
                empty = 0 if added else empty + 1
                report.measured_now += measure_configs(db, device_id, run_id, settings, deadline,
                                                       flusher, fp.threads, progress=progress)
            report.phases["sampling_s"] = time.monotonic() - t
            t = time.monotonic()
            deadline.keep_back(e2e_reserve_s)
            report.ops_retimed_now += measure_configs(  # this run's, before the zoo's re-timing
                db, device_id, run_id, settings, deadline, flusher, fp.threads, contended=True,
                progress=progress)
            report.zoo_retimed_now = measure_configs(  # and any without two paced timings
                db, device_id, run_id, settings, deadline, flusher, fp.threads, max_priority=0,
                below=2, paced=True, progress=progress)
            report.phases["zoo_retime_s"] = time.monotonic() - t
            t = time.monotonic()
            report.stream_gbps_now = retime_stream(db, device_id, settings.device, fp.threads)
            measure_llc_once(db, device_id, settings.device, fp.threads)
            measure_subnormal_once(db, device_id, fp.threads)
            report.phases["stream_s"] = time.monotonic() - t
            if second_pass:
                t = time.monotonic()
                deadline.keep_back(0.0)
                report.models_measured_now += measure_models(
                    db, device_id, run_id, settings, deadline, fp.threads,
                    share_s=max(deadline.left(), 0.0), pass_no=E2E_PASSES, progress=progress)
                report.phases["models_s"] += time.monotonic() - t
            status = "done"
        finally:
            db.release_claims(run_id)
            db.finish_run(run_id, status)
    report.status = status
    report.elapsed_s = deadline.used()
    zoo_keys = db.zoo_coverage(device_id)
    report.zoo_measured = zoo_keys[0]
    report.zoo_configs = zoo_keys[1]
    report.untimed = db.untimed(device_id)
    timings = db.model_measurements(device_id, kind="e2e")
    mine = [m for m in timings if m.run_id == run_id]
    report.models_contended_now = sum(m.contended for m in mine)
    slow = slow_spell_ids(timings)
    report.models_slow_now = sum(m.id in slow and not m.contended for m in mine)
    report.others_cores_max = max((m.others_cores for m in mine if m.others_cores is not None),
                                  default=None)
    report.ops_contended_now, report.ops_others_cores_max = db.run_contention(run_id)
    report.models_timed_twice, report.models_pass_ratio_max = pass_spread(timings, run_id)
    if settings.e2e:
        report.models_untimed = len(pending_models(
            db, device_id, settings, fp.threads, below=E2E_PASSES if second_pass else 1))
    noises = [m.iqr_s / m.median_s for m in db.measured(device_id) if m.median_s > 0]
    report.noise_median = float(np.median(noises)) if noises else None
    return report
