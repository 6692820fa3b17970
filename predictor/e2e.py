"""End-to-end prediction: a model's op list -> per-op estimates -> corrected total with interval.

Per op, in order of trust: an exact config measured on the device (its median), the family's
LightGBM model, else a roofline estimate scaled by the device's median measured/roofline ratio.
Free ops (views, metadata) cost 0 by an explicit registry entry and are counted. Every op that
falls back is listed with its share of the total - never silently 0 (STYLE.md #4); `strict`
turns it into an error. Estimates are cached per config key, and `predict_many` batches the
LightGBM calls of all candidates, so a search loop pays mostly for capture.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from kernels_db.store import DeviceRow, KernelDB, at_profile_pace, profile_pace_s, quiet_ids
from predictor import model_store
from predictor.correction import (
    REPEAT_QUANTILE,
    Correction,
    ModelRow,
    fit_correction,
    repeat_spread,
)
from predictor.features import feature_matrix, peaks_or_nominal, roofline_s
from profilers import ops, zoo
from profilers.capture import CapturedModel, capture_spec
from profilers.errors import HwlatError, UnmodelledOpError
from profilers.oprecord import OpRecord
from profilers.subnormals import SubnormalUses, crowded_s, price
from profilers.timer import flush_bytes

SOURCES = ("measured", "interpolated", "model", "free", "fallback")
CORRECTION_CACHE = "e2e_fit"
# per_family entries that are correction terms, not op families
CORRECTION_TERMS = ("op_overhead", "memory_traffic", "weight_reload", "large_op_traffic")
SUBNORMAL_TERM = "subnormal_slow_path"  # the per_family entry of `Prediction.subnormal_ms`
# the per_family entry of the chain probe's term in a prediction scaled to the pace now
# (`predictor.evaluate.at_pace`): what the small ops between and around kernels cost beyond it
CHAIN_TERM = "small_op_pace"
CORRECTION_VERSION = 22  # bump when ModelRow or the correction formula changes (11: the
# large-op traffic leaves out the weights of ops over the LLC; 12: contended timings left out;
# 13: so does the memory traffic; 14: weights over the LLC floored at the stream bandwidth;
# 15: the per-op term may be negative; 16: the LLC as the profile measured it; 17: every op
# floored at its cold weights' stream time, Predictor._cold_weights_s; 18: linears at several
# rows at the batched rate, Predictor._cold_rate, and floored ops not times `a`; 19: their
# fit's error relative to the whole measured time, not to what is left of it; 20: op timings
# brought to the usual pace, kernels_db.store.at_usual_pace; 21: end-to-end timings brought
# to the profile's pace, TARGET_PACE_EXPONENT; 22: tree-priced ops at their expected time,
# family_model.SMEAR_FOLDS)
TARGET_PACE_EXPONENT = 0.75
"""How far the correction's targets, the zoo's end-to-end timings, are brought from the pace
probe beside each to the profile's median (`kernels_db.store.at_profile_pace`): a setting's
fastest timing at that pace is what the correction fits, and the pace anchor moves predictions
from that pace to the probe's now. A slow spell under `pace.SLOW_PACE` was a target 1.15-1.2x
high: on the AMD EPYC of 12-07 at 2 threads the probe beside the profile's timings flapped
between 1.50-1.57 and 1.76-2.00 ms, the correction fitted 1.117x the op sum and the held-out zoo
came out a median 1.069x its measurements (7.6% MAPE, 69% within 10%, pace-anchored; the zoo's
leave-one-family-out 10.6%). Refitted on targets brought to the pace to the power 0.5 / 0.75 / 1:
6.1% / 5.9% / 5.8%, within 10% 77-79%, the leave-one-family-out 8.1% / 7.1% / 6.7%; at 1 thread,
where the probe held within 1.1x, 3.2% / 3.3% / 3.4% against 3.2% (`benchmarks/
correction_variants.py` scores the old rule as "targets as timed"). Live on fresh profiles at
0.75: 4.5% and 90% within 10% at 2 threads, 3.4% and 100% at 1; re-predicted with the targets as
timed, 4.6% and 87%, 3.3%: those profiles' fastest timings were in the fast state, and the rule
changed little there (benchmarks/RESULTS.md, 2026-12-07 afternoon). 0.75 is also how far a prediction follows the probe now
(`predictor.evaluate.PACE_WEIGHT`); the probe timed beside a model moved its time 0.32-1.04x as
steeply on the Xeon of 12-06."""
ProgressFn = Callable[[str], None]


def fit_target_s(group: Sequence, then_s: float | None) -> float:
    """What the correction fits for a setting's end-to-end timings `group`: the fastest, each
    brought to the profile's pace `then_s` (`kernels_db.store.profile_pace_s`;
    `TARGET_PACE_EXPONENT`; kernels_db.store._pooled says why the fastest)."""
    return min(at_profile_pace(g, then_s, TARGET_PACE_EXPONENT) for g in group)


@dataclass(frozen=True)
class OpEstimate:
    p50_s: float
    lo_s: float
    hi_s: float
    source: str  # one of SOURCES
    family: str
    reason: str = ""  # why a fallback was needed


@dataclass
class Prediction:
    """A model's predicted latency on one device. Times in ms; `per_family` sums to p50."""

    spec: str
    device: str
    latency_ms: dict[str, float]
    interval_ms: list[float]
    n_ops: int
    n_timed_ops: int
    flops: float
    per_family: dict[str, float]
    top_ops: list[dict]
    unmodelled: list[dict]
    measured_share: float
    correction: dict
    sum_ops_ms: float
    roofline_ms: float
    # the part of sum_ops_ms priced at reading cold weights (_cold_weights_s), taken as it is
    floored_ms: float = 0.0
    traffic_ms: float = 0.0  # bytes moved by the timed ops at the copy bandwidth (_traffic_s)
    weights_ms: float = 0.0  # weight bytes re-read from DRAM each pass, at the copy bandwidth
    large_traffic_ms: float = 0.0  # traffic of ops over timer.flush_bytes (Predictor._traffic_s)
    # the CPU's slow path for the subnormal values one real forward pass used (in p50 and
    # per_family; None: values not counted, or no cost measured on the device)
    subnormal_ms: float | None = None
    inputs: list[str] = field(default_factory=list)
    capture_s: float | None = None
    notes: list[str] = field(default_factory=list)
    # None: as profiled; else how it was scaled to the machine's pace now (`evaluate.at_pace`)
    anchor: dict | None = None

    @property
    def p50_ms(self) -> float:
        return self.latency_ms["p50"]

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _rows(record: OpRecord) -> int:
    """The rows of a product: its output's elements over its last dimension (1: no output)."""
    out = record.outputs[0].shape if record.outputs else ()
    return math.prod(out[:-1]) if out else 1


def _shapes(record: OpRecord) -> str:
    return ", ".join("x".join(map(str, t.shape)) or "scalar" for t in record.inputs)


class Predictor:
    """Predicts models on one device from its trained family models and measured configs."""

    def __init__(self, device: DeviceRow, models: model_store.DeviceModels,
                 measured_s: dict[str, float], correction: Correction | None = None,
                 measured_records: Sequence[tuple[str, str]] = ()) -> None:
        self.device = device
        self.models = models
        self.measured_s = measured_s
        self._measured_records = measured_records  # (key, record JSON) of measured configs
        self._by_batch: dict[str, list[tuple[int, float]]] | None = None
        self.correction = correction or Correction()
        self.profiled_dtypes: set[str] = set()  # empty: unknown, no notes
        self.profiled_ops: set[str] = set()  # `ops.op_kind` of each measured config; empty: unknown
        self._bytes_per_s = peaks_or_nominal(models.peaks)["gbps"] * 1e9
        # weights streamed by an op beyond the LLC, on a CPU (a GPU, or a profile from before it
        # was measured: the copy's bandwidth; `build.retime_stream` keeps a CPU's steady)
        stream_gbps = (models.peaks or {}).get("stream_gbps") if device.kind == "cpu" else None
        self._stream_bytes_per_s = (stream_gbps or 0) * 1e9 or self._bytes_per_s
        # cold weights read by a linear at several rows (`fingerprint.measure_batched_gbps`; a
        # CPU profiled before it was measured: 0, such linears floored at the stream like one row)
        batched_gbps = (models.peaks or {}).get("batched_gbps") if device.kind == "cpu" else None
        self._batched_bytes_per_s = (batched_gbps or 0) * 1e9
        caches = (device.fingerprint or {}).get("caches", {})
        # the LLC as measured by the profile's read sweep (`fingerprint.LLC_SPEEDUP`), else as
        # lscpu says; the assumed 32 MiB only applies to a fingerprint without cache sizes
        measured_llc = (models.peaks or {}).get("llc_bytes") if device.kind == "cpu" else None
        self._llc_bytes = float(measured_llc or caches.get("l3") or caches.get("l2") or 32 << 20)
        # ops moving more than this do not fit in the L2 of the threads running them: what the
        # op timings flush (correction.py: the large-op traffic term)
        self._large_op_bytes = float(flush_bytes(device.kind, device.threads or 1,
                                                 caches.get("l2")))
        self._cache: dict[str, OpEstimate] = {}
        self.skipped_settings: list[str] = []  # end-to-end settings `model_rows` could not capture
        self.contended_settings = 0  # ... timed only beside other work (`e2e_passes`)
        self.contended_in_fit = False  # ... and fitted on all the same: they were too many

    @classmethod
    def for_device(cls, db: KernelDB, device: str, *, cache_dir: str | None = None,
                   target: str = "auto", retrain: bool = False,
                   progress: ProgressFn | None = None) -> Predictor:
        """The predictor of a profiled device; trains or reloads its models as needed."""
        row = db.get_device(device)
        models = model_store.load_or_train(db, row.id, directory=cache_dir, target=target,
                                           force=retrain, progress=progress)
        rows = [m for m in db.measured_at_usual_pace(row.id) if m.median_s > 0]
        predictor = cls(row, models, {m.key: m.median_s for m in rows},
                        measured_records=[(m.key, m.record_json) for m in rows])
        predictor.profiled_dtypes = {m.dtype for m in rows}
        predictor.profiled_ops = {ops.op_kind(m.op) for m in rows}
        predictor.correction = predictor._load_or_fit_correction(db, progress)
        return predictor

    # -------------------------------------------------------------------------- correction

    def e2e_passes(self, db: KernelDB) -> dict[tuple[str, str], list]:
        """The device's 'e2e' model measurements by setting (the profile times each twice),
        without those timed beside other work (`ModelMeasurement.contended`) or in a slow spell
        of the machine (`store.slow_spell_ids`) where the setting has another; a setting with
        only such timings is left out while the others are at least half of all
        (`self.contended_settings` counts them)."""
        passes: dict[tuple[str, str], list] = {}
        timings = db.model_measurements(self.device.id, kind="e2e")
        for m in timings:  # by where the model is now
            passes.setdefault((zoo.locate(m.model), m.settings_key), []).append(m)
        undisturbed = quiet_ids(timings)
        quiet = {where: [m for m in group if m.id in undisturbed]
                 for where, group in passes.items()}
        spoilt = [where for where, group in quiet.items() if not group]
        self.contended_settings = len(spoilt)
        self.contended_in_fit = 2 * len(spoilt) > len(passes)
        if self.contended_in_fit:  # better timings beside other work than too few to fit
            return {where: quiet[where] or group for where, group in passes.items()}
        return {where: group for where, group in quiet.items() if group}

    def model_rows(self, db: KernelDB, progress: ProgressFn | None = None,
                   passes: dict[tuple[str, str], list] | None = None) -> list[ModelRow]:
        """The device's 'e2e' model measurements with the uncorrected prediction of each."""
        from profilers.specs import parse_input_spec

        rows = []
        self.skipped_settings = []
        then_s = profile_pace_s(db.model_measurements(self.device.id, kind="e2e"))
        for (spec, _), group in (self.e2e_passes(db) if passes is None else passes).items():
            m = group[0]
            median_s = fit_target_s(group, then_s)
            inputs = [parse_input_spec(s) for s in m.settings.get("inputs", [])] or None
            shown = " ".join([spec, *m.settings.get("inputs", [])])
            if progress:  # one line per setting: a model is timed at several inputs
                progress(f"capturing {shown} for the end-to-end fit")
            try:
                captured = capture_spec(spec, inputs=inputs,
                                        device_type=m.settings.get("device", self.device.kind),
                                        dtype=m.settings.get("dtype", "float32"))
            except HwlatError as exc:  # a model that does not load here cannot inform the fit
                self.skipped_settings.append(f"{shown} ({exc})")
                continue
            p = self._assemble(captured.ops, spec=spec, correction=Correction())
            rows.append(ModelRow(spec, m.family, tuple(m.settings.get("inputs", [])),
                                 median_s, p.sum_ops_ms / 1e3, p.n_timed_ops, p.flops,
                                 p.roofline_ms / 1e3, p.measured_share, p.traffic_ms / 1e3,
                                 p.weights_ms / 1e3, m.settings.get("dtype", "float32"),
                                 p.large_traffic_ms / 1e3, p.floored_ms / 1e3))
        return rows

    def _load_or_fit_correction(self, db: KernelDB, progress: ProgressFn | None) -> Correction:
        cached = self.models.read_extra(CORRECTION_CACHE)
        if cached is not None and cached.get("version") == CORRECTION_VERSION:
            return Correction.from_json(cached["correction"])
        passes = self.e2e_passes(db)
        rows = self.model_rows(db, progress, passes)
        fitted = fit_correction(rows)
        spread = repeat_spread([[m.median_s for m in group] for group in passes.values()])
        note = fitted.note + (f"; the profile's two timings of a setting differ by up to "
                              f"{math.exp(spread):.2f}x ({REPEAT_QUANTILE}th percentile), which "
                              "the interval includes" if spread else "")
        if self.skipped_settings:
            note += (f"; {len(self.skipped_settings)} measured settings could not be captured "
                     f"here and are left out, e.g. {self.skipped_settings[0]}")
        if self.contended_settings:
            n = self.contended_settings
            note += (f"; {n} setting{'s were' if n > 1 else ' was'} timed only while other "
                     "processes used the CPUs or the machine ran slow, and "
                     + ("are" if n > 1 else "is") + " "
                     + ("in the fit (too few others)" if self.contended_in_fit else "left out")
                     + "; `hwlat profile` times them again")
        correction = replace(fitted, repeat_spread=spread, note=note)
        self.models.write_extra(CORRECTION_CACHE, {
            "version": CORRECTION_VERSION, "correction": correction.to_json(),
            "rows": [r.to_json() for r in rows]})
        return correction

    def cached_model_rows(self) -> list[ModelRow]:
        """The rows the correction was fitted on (for baselines), from the cache."""
        cached = self.models.read_extra(CORRECTION_CACHE) or {}
        return [ModelRow.from_json(r) for r in cached.get("rows", [])]

    # ---------------------------------------------------------------------- per-op estimates

    def _fallback(self, record: OpRecord, family: str, reason: str) -> OpEstimate:
        r = self.models.roofline_ratios
        base = roofline_s(record, self.models.peaks)
        return OpEstimate(base * r["q50"], base * r["q10"], base * r["q90"], "fallback", family,
                          reason)

    def _classify(self, record: OpRecord) -> OpEstimate | str:
        """A final estimate, or the family whose model must predict it."""
        info = ops.lookup(record.op)
        if info is None:
            return self._fallback(record, ops.UNKNOWN, "unregistered op")
        if ops.is_free(record, info):
            return OpEstimate(0.0, 0.0, 0.0, "free", "free")
        if record.key in self.measured_s:
            t = self.measured_s[record.key]
            return OpEstimate(t, t, t, "measured", info.family)
        t = self._interpolated_s(record)
        if t is not None:
            return OpEstimate(t, t, t, "interpolated", info.family)
        if info.family in self.models.models:
            return info.family
        why = ("not replayable and no model" if not info.replayable
               else f"no {info.family} model (under {model_store.MIN_ROWS} measured configs)")
        return self._fallback(record, info.family, why)

    def _interpolated_s(self, record: OpRecord) -> float | None:
        """Linear in the batch between the nearest measured batch sizes below and above, when
        the same config was measured at both (never extrapolated). The zoo measures batch 1 and
        8; inside that range a conv's time is close to affine in the batch (resnet18's convs at
        batch 2: 36.0 ms interpolated, 36.4 ms inside the model, 38.8 ms from the conv model)."""
        split = record.batch_key
        if split is None:
            return None
        if self._by_batch is None:
            self._by_batch = defaultdict(list)
            for key, text in self._measured_records:
                other = OpRecord.from_json(json.loads(text)).batch_key
                if other is not None:
                    self._by_batch[other[0]].append((other[1], self.measured_s[key]))
        points = self._by_batch.get(split[0], ())
        n = split[1]
        below = max((p for p in points if p[0] < n), default=None)
        above = min((p for p in points if p[0] > n), default=None)
        if below is None or above is None:
            return None
        (n0, t0), (n1, t1) = below, above
        return t0 + (t1 - t0) * (n - n0) / (n1 - n0)

    def estimate(self, record: OpRecord) -> OpEstimate:
        """One op's estimate (from the per-key cache `estimate_ops` fills for many at once)."""
        if record.key not in self._cache:
            self.estimate_ops([record])
        return self._cache[record.key]

    def estimate_ops(self, records: Iterable[OpRecord]) -> None:
        """Fill the per-key cache for `records`, one LightGBM call per family."""
        pending: dict[str, dict[str, OpRecord]] = defaultdict(dict)
        queued: set[str] = set()
        split: dict[str, tuple[OpRecord, ...]] = {}
        for record in records:
            if record.key in self._cache or record.key in queued:
                continue
            queued.add(record.key)
            result = self._classify(record)
            if isinstance(result, OpEstimate):
                self._cache[record.key] = result
            elif (parts := ops.split_hidden_work(record)) is not None:
                split[record.key] = parts  # e.g. a hidden copy and the op on dense input
            else:
                pending[result][record.key] = record
        for family, by_key in pending.items():
            model = self.models.models[family]
            x = feature_matrix(list(by_key.values()), family, self.models.peaks,
                               self.models.threads)
            for (key, record), p50, lo, hi in zip(by_key.items(), *model.predict_matrix(x),
                                                  strict=True):
                floor = self._memory_floor_s(record, family)
                self._cache[key] = OpEstimate(max(float(p50), floor), max(float(lo), floor),
                                              max(float(hi), floor), "model", family)
        if split:
            self.estimate_ops(p for parts in split.values() for p in parts)
            for key, parts in split.items():
                est = [self._cache[p.key] for p in parts]
                self._cache[key] = OpEstimate(sum(e.p50_s for e in est), sum(e.lo_s for e in est),
                                              sum(e.hi_s for e in est), "model", est[-1].family)

    def _notes(self, timed: list[tuple[OpRecord, OpEstimate]], cold_s: Sequence[float],
               values_counted: bool = False) -> list[str]:
        """`values_counted`: the model's subnormal values were counted (`add_subnormals` says
        what they cost), so the guess from its mask pattern is not needed. `cold_s`: each timed
        op's `_cold_weights_s`."""
        notes = []
        sum_s = sum(e.p50_s for _, e in timed)
        cold = [(r, e, c) for (r, e), c in zip(timed, cold_s, strict=True) if c]
        cold_total = sum(c for _, _, c in cold)
        if cold and cold_total >= self.COLD_NOTE_SHARE * sum_s:
            top = max(cold, key=lambda rec: rec[2])[0]
            first = top.module or top.op
            ops_named = (f"1 op ({first})" if len(cold) == 1
                         else f"{len(cold)} ops ({first} and others)")
            notes.append(
                f"{ops_named} priced at reading {'its' if len(cold) == 1 else 'their'} weights "
                f"from memory at the measured {self._rates(cold)}: "
                f"{cold_total * 1e3:.2f} ms, {cold_total / sum_s:.0%} of the op time; inside a "
                "model the weights are evicted between forward passes, and reading them bounds "
                "these ops")
        dtypes = {r.dtype for r, _ in timed if "float" in r.dtype} - self.profiled_dtypes
        if dtypes and self.profiled_dtypes:
            notes.append(f"no {', '.join(sorted(dtypes))} op configs were profiled on "
                         f"{self.device.id} (profiled: {', '.join(sorted(self.profiled_dtypes))});"
                         " those ops are extrapolated by the family models: profile with "
                         "--dtype to measure them")
        if (self.device.kind == "cpu" and not values_counted
                and (fill := _subnormal_mask([r for r, _ in timed]))):
            notes.append(
                f"subnormals likely: {fill.module or 'it'} fills a mask with {fill.args[2]:g} "
                f"({fill.op}) and "
                "takes a softmax, as Swin does: the masked probabilities, exp of that, can be "
                "subnormal in float32, and a CPU with a slow path for subnormals then runs the "
                "model slower than predicted (an Intel Xeon: swin_t at 1x3x160x160 took 168 ms, "
                "65 ms with torch.set_flush_denormal(True), predicted 60); hwlat predicts the "
                "flushed run unless its values are counted (`hwlat predict --values`); "
                "`hwlat evaluate` counts them")
        untimed = self._untimed_ops(timed)
        if untimed:
            listed = ", ".join(f"{op} ({share:.0%} of the op time)" for op, share in untimed)
            notes.append(f"never timed on {self.device.id}, so predicted from other ops of their "
                         f"family: {listed}; `hwlat profile --add MODEL` times them")
        return notes

    COLD_NOTE_SHARE = 0.05  # ops bound by their cold weights are noted from this share
    UNTIMED_NOTE_SHARE = 0.01
    """Model-predicted ops of an op kind the device never timed are noted from this share of the
    summed op time: such ops were predicted at 0.02-0.6x their time before the profile drew them
    (sort, top-k, cumsum, up-sampling, pixel shuffle; benchmarks/RESULTS.md)."""

    def _untimed_ops(self, timed: list[tuple[OpRecord, OpEstimate]]) -> list[tuple[str, float]]:
        """(op, share of the summed op time) of the model-predicted ops whose kind (the op
        without its in-place or overload suffix) has no measured config on the device."""
        total = sum(e.p50_s for _, e in timed)
        if not self.profiled_ops or total <= 0:
            return []
        by_op: dict[str, float] = defaultdict(float)
        for r, e in timed:
            if e.source == "model" and ops.op_kind(r.op) not in self.profiled_ops:
                by_op[r.op] += e.p50_s
        shares = [(op, s / total) for op, s in by_op.items()
                  if s / total >= self.UNTIMED_NOTE_SHARE]
        return sorted(shares, key=lambda kv: -kv[1])

    def _memory_floor_s(self, record: OpRecord, family: str) -> float:
        """An op whose data cannot fit in the last-level cache streams it from memory at best
        at the measured bandwidths: its weights at the weight-streaming one (a matrix-vector
        product's, `fingerprint.measure_peaks`), the rest at the copy's. Trees cannot extrapolate
        past their largest training config (alexnet's 151 MB fc weights were predicted 4x below
        this bound), so model predictions are floored here; measured configs are left as
        measured. A gather (the data family) reads a few rows of its table, not all of it.

        At 2 threads a copy moves 1.3-1.7x the bytes a batch-1 linear streams (24.5-31.7 against
        18.5-19.0 GB/s over the three 2-thread profiles of 12-04), so the copy's floor priced
        alexnet's fc6 at 4.8 ms where it ran 8.1 alone, and alexnet at batch 1 came out -22% and
        -21%. Seven recorded evaluations re-predicted with the stream floor: -3% and +4% there,
        MAPE lower or the same (to 0.1 point) on each, 11.0% -> 10.3% on that one
        (benchmarks/RESULTS.md, 2026-12-04 late morning).
        A stream timed in a slow spell (12.4 GB/s once, 12-03) would make it a worst case, so
        each profile run times it again and the fastest is kept (`kernels_db.build`)."""
        nbytes = ops.bytes_of(record)
        if nbytes <= self._llc_bytes:
            return 0.0
        weights = 0.0 if family == "data" else min(float(record.weight_bytes), nbytes)
        return weights / self._stream_bytes_per_s + (nbytes - weights) / self._bytes_per_s

    def _rates(self, cold: Sequence[tuple[OpRecord, OpEstimate, float]]) -> str:
        """The rates the floored ops were priced at (`_cold_rate`), e.g. "4.9 GB/s (linears at
        several rows) and 13.7 GB/s"."""
        batched = sorted({self._batched(r, e.family) for r, e, _ in cold}, reverse=True)
        return " and ".join(
            f"{self._batched_bytes_per_s / 1e9:.1f} GB/s (linears at several rows)" if b
            else f"{self._stream_bytes_per_s / 1e9:.1f} GB/s" for b in batched)

    def _batched(self, record: OpRecord, family: str) -> bool:
        """Whether `_cold_rate` prices this op's weights at the batched rate."""
        return family == "matmul" and bool(self._batched_bytes_per_s) and _rows(record) >= 2

    def _cold_weights_s(self, record: OpRecord, estimate: OpEstimate, nbytes: float) -> float:
        """How long an op takes inside a model when reading its weights bounds it: the weights
        at the rate `_cold_rate` gives, if that is longer than its estimate, else 0. Timed alone,
        its weights were in the cache; inside a model the ops between two forward passes have
        evicted them, and a weight read from DRAM cannot run faster than that rate.

        alexnet at batch 1, 2 threads, on the Xeon: fc7's 67 MB took 2.10 ms inside the model
        and 1.26 ms alone, and 67 MB at its 31.6 GB/s stream is 2.12 ms; fc8's 16 MB 0.52 ms
        inside, 0.32 alone, 0.52 at the stream. Priced instead by the fitted weight re-read term
        (0.83x their bytes at the copy's 26.9 GB/s), the two came out 1.7 ms over their in-model
        time and alexnet at batch 1 +19% and +9% (benchmarks/RESULTS.md, 2026-12-05 night).
        Their bytes stay in the traffic terms: taken out of those too, alexnet at batch 1 came out
        -10% and -5% (re-predicted, the same measurements). At batch 8, 1 thread (12-06): fc7
        15.75 ms inside the model, 8.09 alone, 13.7 at the batched rate (4.9 GB/s); fc8 3.20,
        1.96 and 3.35."""
        rate = self._cold_rate(record, estimate.family, nbytes)
        if not rate:
            return 0.0
        cold = record.weight_bytes / rate
        return cold if cold > estimate.p50_s else 0.0

    def _cold_rate(self, record: OpRecord, family: str, nbytes: float) -> float:
        """Bytes per second at which an op inside a model reads weights the forward pass
        evicted (0: not floored). A linear (the matmul family) at two rows or more reads them at
        the batched rate (`fingerprint.measure_batched_gbps`), wherever they fit alone: a blocked
        product runs 1.6-2x slower with its weights evicted than cached, reading them at about a
        third of the stream's rate (`fingerprint.BATCHED_ROWS`). Other ops within the LLC read
        them at the stream (`fingerprint.measure_peaks`); ops beyond it are floored there already
        (`_memory_floor_s`: timed alone they stream from memory too, so their estimates stay
        times `a`); gathers (the data family) read a few rows, not their table."""
        if family == "data" or not record.weight_bytes:
            return 0.0
        if self._batched(record, family):
            return self._batched_bytes_per_s
        return self._stream_bytes_per_s if nbytes <= self._llc_bytes else 0.0

    def _weights_s(self, timed: list[tuple[OpRecord, OpEstimate]],
                   op_bytes: Sequence[float], cold_s: Sequence[float]) -> float:
        """Weight bytes a forward pass re-reads from DRAM, at the copy bandwidth: the parameters
        and buffers of timed ops that read them whole (not gathers such as embeddings) and
        whose time does not already stream them from DRAM (ops larger than the LLC, and those
        floored at their cold weights' read time). `op_bytes`: each timed op's
        `ops.bytes_of`; `cold_s`: each one's `_cold_weights_s`."""
        nbytes = sum(r.weight_bytes for (r, e), b, c in zip(timed, op_bytes, cold_s, strict=True)
                     if e.family != "data" and b <= self._llc_bytes and not c)
        return nbytes / self._bytes_per_s

    def _traffic_s(self, timed: list[tuple[OpRecord, OpEstimate]], op_bytes: Sequence[float],
                   over: float = 0.0) -> float:
        """Bytes moved by the timed ops of more than `over` bytes, at the copy bandwidth: the
        memory-traffic term (all ops) and the large-op traffic term (ops over the timing's cache
        flush, `over=self._large_op_bytes`; correction.py). Less the weights of ops larger than
        the LLC: timed alone, those stream their weights from DRAM already, and inside a model
        they do no worse. Counted whole in the large-op term, alexnet's 151 MB fc6 weights put
        15 ms of traffic on top of a linear measured at DRAM speed, and batch 1 came out at +34%
        and +54%; counted in the memory-traffic term, +16% and +26% (2 threads; +8% and +14%
        without). Gathers (the data family) keep all their bytes: they read a few rows of their
        table, not all of it."""
        nbytes = 0.0
        for (r, e), b in zip(timed, op_bytes, strict=True):
            if b > over:
                streamed = b > self._llc_bytes and e.family != "data"
                nbytes += max(b - r.weight_bytes, 0.0) if streamed else b
        return nbytes / self._bytes_per_s

    # ---------------------------------------------------------------------------- assembling

    def _assemble(self, records: Sequence[OpRecord], *, spec: str,
                  correction: Correction, strict: bool = False,
                  values_counted: bool = False) -> Prediction:
        self.estimate_ops(records)
        est = [self._cache[r.key] for r in records]
        if strict:
            _raise_if_unmodelled(records, est)
        timed = [(r, e) for r, e in zip(records, est, strict=True) if e.source != "free"]
        op_bytes = [ops.bytes_of(r) for r, _ in timed]
        cold_s = [self._cold_weights_s(r, e, b) for (r, e), b in zip(timed, op_bytes, strict=True)]
        timed = [(r, replace(e, p50_s=c, lo_s=max(e.lo_s, c), hi_s=max(e.hi_s, c)) if c else e)
                 for (r, e), c in zip(timed, cold_s, strict=True)]
        sum_s = sum(e.p50_s for _, e in timed)
        floored_s = sum(cold_s)  # in-model times already: not times `a` (ModelRow.floored_s)
        scales = [1.0 if c else correction.a for c in cold_s]
        traffic_s = self._traffic_s(timed, op_bytes)
        weights_s = self._weights_s(timed, op_bytes, cold_s)
        large_s = self._traffic_s(timed, op_bytes, over=self._large_op_bytes)
        total_s = correction.apply(sum_s, len(timed), traffic_s, weights_s, large_s, floored_s)
        lo_s, hi_s = self._interval(total_s, sum_s, [e for _, e in timed], correction)
        per_family: dict[str, float] = defaultdict(float)
        for (_, e), k in zip(timed, scales, strict=True):
            per_family[e.family] += k * e.p50_s * 1e3
        if correction.overhead_s:
            per_family["op_overhead"] = correction.overhead_s * len(timed) * 1e3
        if correction.c_traffic:
            per_family["memory_traffic"] = correction.c_traffic * traffic_s * 1e3
        if correction.c_weights:
            per_family["weight_reload"] = correction.c_weights * weights_s * 1e3
        if correction.c_large_traffic:
            per_family["large_op_traffic"] = correction.c_large_traffic * large_s * 1e3
        measured = sum(e.p50_s for _, e in timed if e.source == "measured")
        return Prediction(
            spec=spec, device=self.device.id, latency_ms={"p50": total_s * 1e3},
            interval_ms=[lo_s * 1e3, hi_s * 1e3], n_ops=len(records), n_timed_ops=len(timed),
            flops=float(sum(_flops(r) for r, _ in timed)),
            per_family=dict(sorted(per_family.items(), key=lambda kv: -kv[1])),
            top_ops=_top_ops(timed, scales), unmodelled=_unmodelled(timed, scales, total_s),
            measured_share=measured / sum_s if sum_s > 0 else 0.0,
            correction={"a": correction.a, "overhead_us": correction.overhead_s * 1e6,
                        "c_traffic": correction.c_traffic, "c_weights": correction.c_weights,
                        "c_large_traffic": correction.c_large_traffic,
                        "n_models": correction.n_models,
                        "note": correction.note},
            sum_ops_ms=sum_s * 1e3, floored_ms=floored_s * 1e3, traffic_ms=traffic_s * 1e3,
            weights_ms=weights_s * 1e3,
            large_traffic_ms=large_s * 1e3,
            notes=self._notes(timed, cold_s, values_counted),
            roofline_ms=sum(roofline_s(r, self.models.peaks) for r, _ in timed) * 1e3)

    @staticmethod
    def _interval(total_s: float, sum_s: float, est: list[OpEstimate],
                  correction: Correction) -> tuple[float, float]:
        """Combine the per-op model spread with the calibrated end-to-end residual band.

        Summing per-op quantiles assumes fully correlated op errors (they share a model, so
        mostly are); the end-to-end band is independent of that, hence added in quadrature, and
        so is how far the device repeats its own timings (`correction.REPEAT_QUANTILE`).
        """
        if total_s <= 0:
            return 0.0, 0.0
        lo_ops, hi_ops = sum(e.lo_s for e in est), sum(e.hi_s for e in est)
        u_lo = math.log(sum_s / lo_ops) if lo_ops > 0 else 0.0
        u_hi = math.log(hi_ops / sum_s) if sum_s > 0 else 0.0
        down = math.hypot(u_lo, correction.resid_lo, correction.repeat_spread)
        up = math.hypot(u_hi, correction.resid_hi, correction.repeat_spread)
        return total_s * math.exp(-down), total_s * math.exp(up)

    # ------------------------------------------------------------------------------ public

    def predict_ops(self, records: Sequence[OpRecord], *, spec: str = "",
                    strict: bool = False, values_counted: bool = False) -> Prediction:
        """`values_counted`: the caller counted the model's subnormal values and prices them
        (`add_subnormals`), so no guess from its mask pattern is noted."""
        return self._assemble(records, spec=spec, correction=self.correction, strict=strict,
                              values_counted=values_counted)

    def predict_spec(self, spec: str, *, inputs: list | None = None, batch: int | None = None,
                     dtype: str = "float32", strict: bool = False,
                     channels_last: bool = False, values: bool = False) -> Prediction:
        """`values`: on a CPU, also run the model once here with its weights to count the
        subnormal values it computes and price their slow path (`predict_captured`)."""
        captured = capture_spec(spec, inputs=inputs, batch=batch, device_type=self.device.kind,
                                dtype=dtype, channels_last=channels_last)
        uses, why = None, ""
        if values and self.device.kind == "cpu":
            from profilers.subnormals import uses_at_batch_one

            try:
                uses = uses_at_batch_one(spec, captured.inputs, dtype=dtype)
            except (HwlatError, RuntimeError, MemoryError) as e:  # too large to build, say
                why = str(e).splitlines()[0] if str(e) else type(e).__name__
        p = self.predict_captured(captured, strict=strict, subnormals=uses)
        if why:
            p.notes.append(f"its subnormal values were not counted (the forward pass with "
                           f"weights failed: {why}); any slow path for them is not priced")
        return p

    def predict_captured(self, captured: CapturedModel, *, strict: bool = False,
                         subnormals: SubnormalUses | None = None) -> Prediction:
        """`subnormals`: the values one real forward pass of the model used
        (`profilers.subnormals.count_uses`); on a CPU their slow path is added."""
        counted = subnormals is not None and self.device.kind == "cpu"
        p = self._assemble(captured.ops, spec=captured.spec, correction=self.correction,
                           strict=strict, values_counted=counted)
        p.inputs = [str(i) for i in captured.inputs]
        p.capture_s = captured.capture_s
        if counted:
            self.add_subnormals(p, subnormals)
        if captured.ran:
            p.notes.append("its forward reads tensor values, so its ops were recorded from one "
                           "real run on random inputs; other inputs may run other ops")
        if captured.note:
            p.notes.append(captured.note)
        return p

    SUBNORMAL_BAND = (0.8, 1.4)
    """The interval of the slow path's price, as multiples of it. In the evaluations of 12-05 and
    12-06 on the Xeon, swin_t's measured slow path (plain minus flushed) came to 0.88-1.19x its
    price over 1 and 2 threads, batch 1 and 8; random-weight hf:mobilevit's to 0.91-1.28x since
    the products of normal values that underflow count too (`benchmarks/subnormal_products.py`,
    five builds; before, its linears paid 1.7x their price and the band reached 1.7)."""

    def add_subnormals(self, p: Prediction, uses: SubnormalUses) -> None:
        """Price the subnormal values a forward pass used at the device's measured cost, into
        p50, the interval and the breakdown; say so, or that it could not be priced."""
        if not uses.any:
            return
        cost = (self.device.peaks or {}).get("subnormal")
        share = (f"{uses.share * 100:.2g}% of the values its forward pass computes are subnormal"
                 if uses.share > 0 else
                 "its forward pass multiplies normal values whose products underflow")
        if not cost:
            p.notes.append(f"{share}, which a CPU may compute on a slow path; {self.device.id} "
                           "has no measured cost for them, so they are not priced: "
                           "`hwlat profile` on it measures one")
            return
        by_family = price(uses, cost)
        if not by_family:  # they were only copied or viewed: no arithmetic, no slow path
            p.notes.append(f"{share}, but no op computes with them (copies and views only), "
                           "so they cost nothing")
            return
        extra_ms = sum(by_family.values()) * 1e3
        lo, hi = self.SUBNORMAL_BAND
        p.subnormal_ms = extra_ms
        p.latency_ms["p50"] += extra_ms
        p.interval_ms = [p.interval_ms[0] + lo * extra_ms, p.interval_ms[1] + hi * extra_ms]
        p.per_family = dict(sorted({**p.per_family, SUBNORMAL_TERM: extra_ms}.items(),
                                   key=lambda kv: -kv[1]))
        main = max(by_family, key=by_family.get)
        crowded_ms = sum(crowded_s(uses, cost).values()) * 1e3
        crowded = (f" ({crowded_ms:.2g} ms of it waiting on one thread, whose part of a "
                   "batched matmul holds more of them than the others')"
                   if crowded_ms >= 0.01 * extra_ms else "")
        p.notes.append(
            f"{share} (one forward pass here, with its weights): this CPU's slow path for them "
            f"adds {extra_ms:.4g} ms{crowded}, most in its {main} ops (measured on "
            f"{self.device.id}: "
            f"{cost['reuse_ns']:.3g} ns per use in a matmul, {cost['block_ns']:.3g} ns per "
            "16 values elsewhere); torch.set_flush_denormal(True) removes it")

    def predict_many(self, items: Sequence[str | CapturedModel], *, strict: bool = False,
                     batch: int | None = None, dtype: str = "float32") -> list[Prediction]:
        """Predict many candidates: capture each, then one batched model call for all ops."""
        captured = [c if isinstance(c, CapturedModel) else
                    capture_spec(c, batch=batch, device_type=self.device.kind, dtype=dtype)
                    for c in items]
        self.estimate_ops(r for c in captured for r in c.ops)
        return [self.predict_captured(c, strict=strict) for c in captured]


# ------------------------------------------------------------------------------- helpers


# exp(x) is subnormal in float32 for x in (ln 2^-149, ln 2^-126) = (-103.28, -87.34): a mask value
# there, added to logits before a softmax, leaves the masked probabilities subnormal wherever the
# logits are within a few units of their row's maximum (Swin's -100; -inf or finfo.min gives 0).
# A fused attention kernel (scaled_dot_product_attention) never writes them out: hf:swin fills
# its mask with -100 too and computed no subnormal at all
SUBNORMAL_EXP = (-103.28, -87.34)
SOFTMAX_OPS = ("aten._softmax.default", "aten.softmax.int")


def _subnormal_mask(records: Sequence[OpRecord]) -> OpRecord | None:
    """The first float32 masked_fill whose fill value's exp is subnormal, where an explicit
    softmax follows it; None if there is none."""
    lo, hi = SUBNORMAL_EXP
    for i, r in enumerate(records):
        if (r.op.startswith("aten.masked_fill") and len(r.args) > 2
                and isinstance(r.args[2], float) and lo < r.args[2] < hi
                and r.outputs and r.outputs[0].dtype == "float32"
                and any(later.op in SOFTMAX_OPS for later in records[i + 1:])):
            return r
    return None


def _flops(record: OpRecord) -> float:
    """FLOPs by the registry; an unregistered op counts its stated fallback FLOPs."""
    return ops.flops_of(record)


def _top_ops(timed: list[tuple[OpRecord, OpEstimate]], scales: Sequence[float],
             n: int = 10) -> list[dict]:
    """The `n` costliest ops, each at its estimate times its scale in the total (`a`, or 1 for
    an op priced at its cold weights)."""
    ranked = sorted(zip(timed, scales, strict=True), key=lambda ek: -ek[0][1].p50_s * ek[1])[:n]
    return [{"op": r.op, "module": r.module, "shapes": _shapes(r), "family": e.family,
             "ms": k * e.p50_s * 1e3, "source": e.source} for (r, e), k in ranked]


def _unmodelled(timed: list[tuple[OpRecord, OpEstimate]], scales: Sequence[float],
                total_s: float) -> list[dict]:
    groups: dict[str, dict] = {}
    for (r, e), k in zip(timed, scales, strict=True):
        if e.source != "fallback":
            continue
        g = groups.setdefault(r.op, {"op": r.op, "family": e.family, "count": 0,
                                     "estimated_ms": 0.0, "reason": e.reason})
        g["count"] += 1
        g["estimated_ms"] += k * e.p50_s * 1e3
    for g in groups.values():
        g["share"] = g["estimated_ms"] / (total_s * 1e3) if total_s > 0 else 0.0
        g["estimate"] = "roofline x device median measured/roofline ratio"
    return sorted(groups.values(), key=lambda g: -g["estimated_ms"])


def _raise_if_unmodelled(records: Sequence[OpRecord], est: list[OpEstimate]) -> None:
    missing = sorted({f"{r.op} ({e.reason})" for r, e in zip(records, est, strict=True)
                      if e.source == "fallback"})
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        # what would help: a longer profile only for a family short of measured configs
        fix = ("profile longer (`hwlat profile`) or " if any("measured configs" in m for m in missing)
               else "")
        raise UnmodelledOpError(
            f"{len(missing)} op kind(s) have no measurement or model: {shown}; {fix}drop --strict "
            "to use the stated roofline fallback")

