"""`advise`: predict the model as deployed, diagnose it, predict every lever, rank them.

Latency of one request without load: the predictor gives the p50 of a model call; its p95/p99 is
that p50 times the device's measured model-level spread (the median over the device's whole-model
measurements of their p95/p50, resp. p99/p50), and the predicted interval is scaled the same way.
With a request rate, every percentile comes from the serving simulator instead, fed with the
predicted latency-vs-batch curve (a lever that changes the model scales the curve by its predicted
batch-1 ratio) and the measured spread as noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from advisor.diagnose import Diagnosis, diagnose
from advisor.levers import LEVERS, Lever, LeverContext, Variant
from advisor.rank import LeverResult, fastest_meeting, pareto, rank
from advisor.simulator import BatchCurve, SimResult, capacity_rps, simulate_poisson, utilization
from kernels_db.store import KernelDB
from predictor.e2e import Prediction, Predictor
from profilers.capture import capture_or_run
from profilers.errors import AdvisorError, HwlatError
from profilers.specs import batch_of, load_model, with_batch
from profilers.subnormals import SubnormalUses, count_uses, price

PERCENTILES = {"p95": 0.95, "p99": 0.99}
CURVE_BATCHES = (1, 2, 4, 8)
MIN_SPREAD_SAMPLES = 20
ProgressFn = Callable[[str], None]


@dataclass
class AdviceRequest:
    spec: str
    device: str
    budget_ms: float
    percentile: str = "p95"
    inputs: list[str] | None = None
    batch: int | None = None
    dtype: str = "float32"
    rate: float | None = None
    workers: int = 1
    max_batch: int = 1
    max_wait_ms: float = 0.0
    accuracy_floor: float | None = None
    eval_spec: str | None = None
    levers: tuple[str, ...] | None = None  # restrict to these registry names
    seed: int = 0
    sim_requests: int = 2000

    @property
    def q(self) -> float:
        return PERCENTILES[self.percentile]


@dataclass
class Spread:
    """Measured whole-model spread on the device: percentile / median, and noise ratios."""

    ratio: dict[str, float]
    noise: tuple[float, ...]
    basis: str


@dataclass
class Advice:
    request: AdviceRequest
    device_id: str
    baseline: LeverResult
    prediction: Prediction
    diagnosis: Diagnosis
    results: list[LeverResult]  # ranked, best first
    not_applicable: dict[str, str]
    spread: Spread
    simulation: dict | None = None
    verification: dict | None = None
    notes: list[str] = field(default_factory=list)
    context: Any = None  # the LeverContext (for verify)

    @property
    def fastest(self) -> LeverResult | None:
        return fastest_meeting(self.results)

    @property
    def pareto(self) -> list[LeverResult]:
        return pareto(self.results)

    def to_json(self) -> dict:
        pct = self.request.percentile
        fastest = self.fastest
        return {
            "model": self.request.spec, "device": self.device_id,
            "budget_ms": {pct: self.request.budget_ms},
            "accuracy_floor": self.request.accuracy_floor,
            "rate": self.request.rate,
            "baseline": self.baseline.to_json(pct),
            "diagnosis": self.diagnosis.to_json(),
            "levers": [r.to_json(pct) for r in self.results],
            "fastest_meeting_budget": fastest.label if fastest else None,
            "pareto": [r.label for r in self.pareto],
            "not_applicable": self.not_applicable,
            "spread": {"ratio": self.spread.ratio, "basis": self.spread.basis},
            "simulation": self.simulation, "verification": self.verification,
            "unmodelled": self.prediction.unmodelled, "notes": self.notes,
        }


# ------------------------------------------------------------------------------ spread


def measured_spread(db: KernelDB, device_id: str) -> Spread:
    """Median percentile/median ratio over the device's whole-model measurements."""
    rows = [m for m in db.model_measurements(device_id)
            if m.kind in ("e2e", "bench")  # load samples include queueing: not compute spread
            and len(m.samples_s) >= MIN_SPREAD_SAMPLES and m.median_s > 0
            and not m.contended]  # another process's share of the cores is not the model's spread
    if not rows:
        return Spread({"p95": 1.0, "p99": 1.0}, (),
                      "no whole-model measurement with >= 20 samples on this device: spread "
                      "unknown, percentiles shown equal to the predicted p50")
    ratio = {name: float(np.median([np.quantile(m.samples_s, q) / m.median_s for m in rows]))
             for name, q in PERCENTILES.items()}
    noise = tuple(float(s / m.median_s) for m in rows for s in m.samples_s)
    n = sum(len(m.samples_s) for m in rows)
    return Spread(ratio, noise, f"median over {len(rows)} whole-model measurements on this "
                               f"device ({n} samples) of p95/p50 = {ratio['p95']:.3f}, "
                               f"p99/p50 = {ratio['p99']:.3f}")


# ------------------------------------------------------------------------------ advise


@dataclass
class Subnormals:
    """The subnormal values the model as deployed uses, where they are priced (`uses`, counted
    at batch 1), and otherwise why not; `counted`: its values were looked at."""

    uses: SubnormalUses | None
    why: str
    counted: bool


def count_subnormals(loaded: Any, inputs: list, dtype: str, device: Any) -> Subnormals:
    """Count the subnormal values one forward pass of `loaded` uses at batch 1 (their count
    scales with the batch: `SubnormalUses.scaled`), where `device` is a CPU whose profile
    measured their slow path; the baseline and every lever computing them pay it."""
    if device.kind != "cpu":
        return Subnormals(None, "subnormal values take a slow path on CPUs, not GPUs", False)
    if dtype != "float32":
        return Subnormals(None, "the slow path for subnormal values was measured in float32, "
                                f"not {dtype}", False)
    cost = (device.peaks or {}).get("subnormal")
    if not cost:
        return Subnormals(None, f"{device.id} has no measured cost for subnormal values "
                                "(`hwlat profile` measures one)", False)
    try:
        uses = _uses_at_batch_one(loaded.model, inputs, loaded.vocab)
    except Exception as e:  # noqa: BLE001 - a model that cannot run here at batch 1: say why
        return Subnormals(None, f"its values could not be counted ({_first_line(e)})", False)
    if not uses.any:
        return Subnormals(None, "its forward pass computes no subnormal values", True)
    if sum(price(uses, cost).values()) <= 0:
        return Subnormals(None, "its subnormal values cost nothing on this CPU (only copied, or "
                                "no slow path measured)", True)
    return Subnormals(uses, "", True)


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__


def _uses_at_batch_one(model: Any, inputs: list, vocab: int | None) -> SubnormalUses:
    return count_uses(model, [s.make("cpu", vocab) for s in with_batch(inputs, 1)])


def subnormal_note(p: Prediction) -> str | None:
    """What the baseline pays for its subnormal values (`Predictor.add_subnormals`)."""
    if not p.subnormal_ms:
        return None
    return (f"the baseline includes {p.subnormal_ms:.4g} ms for this CPU's slow path on the "
            "subnormal values its forward pass computes, and each lever the slow path of the "
            "values it computes (its notes say where not); flush_subnormals removes it")


class _Advisor:
    def __init__(self, db: KernelDB, req: AdviceRequest, progress: ProgressFn | None) -> None:
        self.db, self.req = db, req
        self.say = progress or (lambda text: None)
        self.device = db.get_device(req.device)
        self.say(f"loading the predictor of {self.device.id}")
        self.predictor = Predictor.for_device(db, self.device.id)
        self.others: dict[str, Predictor] = {}
        self.spread = measured_spread(db, self.device.id)
        self.curve: BatchCurve | None = None
        self.base_sim: SimResult | None = None
        self.base_target: float | None = None
        self.vocab: int | None = None

    def run(self) -> Advice:
        req = self.req
        self.say(f"capturing {req.spec}")
        batch = 1 if req.rate is not None else req.batch
        loaded = load_model(req.spec, inputs=req.inputs, batch=batch)
        self.vocab = loaded.vocab  # a forward that reads values is run once, with valid ids
        base_ops = self.capture(loaded.model, loaded.inputs)
        sub = count_subnormals(loaded, list(loaded.inputs), req.dtype, self.device)
        self.counted = sub.counted  # no guess from a mask pattern where the values were seen
        base = self.predictor.predict_ops(base_ops, spec=req.spec, values_counted=sub.counted)
        if sub.uses is not None:
            self.predictor.add_subnormals(base, sub.uses.scaled(batch_of(loaded.inputs)))
        ctx = LeverContext(req.spec, loaded, list(loaded.inputs), req.dtype, self.device,
                           self.db, req.rate, req.workers, req.max_batch, req.max_wait_ms,
                           base_flops=base.flops, subnormals=sub.uses, subnormals_why=sub.why)
        self.ctx, self.base_ops, self.base = ctx, base_ops, base
        simulation = self.simulate_baseline() if req.rate is not None else None
        baseline = self.result(_BASELINE, Variant("none", "as deployed now", {}),
                               (base.p50_ms, *base.interval_ms))
        diagnosis = diagnose(base, base_ops, self.device.peaks, device_kind=self.device.kind,
                             input_bytes=sum(_nbytes(i) for i in loaded.inputs),
                             queue=self.queue_signal())
        results, skipped = self.levers(baseline)
        for r in results:
            r.why = _why(r, diagnosis)
        notes = [f"{req.percentile} without load: {self.spread.basis}" if req.rate is None else
                 f"percentiles from the serving simulator ({req.sim_requests} Poisson requests, "
                 f"seed {req.seed}); compute noise: {self.spread.basis}"]
        if line := subnormal_note(base):
            notes.append(line)
        return Advice(req, self.device.id, baseline, base, diagnosis, rank(results), skipped,
                      self.spread, simulation, notes=notes, context=ctx)

    # ------------------------------------------------------------------ predicting pieces

    def capture(self, model, inputs, *, dtype: str | None = None,
                channels_last: bool = False) -> list:
        ops, _ = capture_or_run(model, list(inputs), device_type=self.device.kind,
                                dtype=dtype or self.req.dtype, channels_last=channels_last,
                                vocab=self.vocab)
        return ops

    def simulate_baseline(self) -> dict:
        req = self.req
        sizes = sorted({*CURVE_BATCHES, req.max_batch})
        self.say("predicting the latency-vs-batch curve")
        points = {}
        for b in sizes:
            ops = self.capture(self.ctx.model, with_batch(self.ctx.inputs, b))
            p = self.predictor.predict_ops(ops, values_counted=self.counted)
            if self.ctx.subnormals is not None:
                self.predictor.add_subnormals(p, self.ctx.subnormals.scaled(b))
            points[b] = p.p50_ms / 1e3
        self.curve = BatchCurve(points, self.spread.noise)
        self.base_sim = self.sim(self.curve, self.serving())
        return {"curve_ms": {b: t * 1e3 for b, t in points.items()},
                "utilization_batch1": utilization(self.curve, req.rate, req.workers),
                "baseline": self.base_sim.to_json()}

    def serving(self, variant: Variant | None = None) -> dict:
        if variant is not None and variant.serving:
            return variant.serving
        return {"workers": self.req.workers, "max_batch": self.req.max_batch,
                "max_wait_ms": self.req.max_wait_ms}

    def sim(self, curve: BatchCurve, serving: dict) -> SimResult:
        return simulate_poisson(curve, self.req.rate, requests=self.req.sim_requests,
                                seed=self.req.seed, workers=serving["workers"],
                                max_batch=serving["max_batch"],
                                max_wait_s=serving["max_wait_ms"] / 1e3)

    def queue_signal(self) -> dict | None:
        if self.base_sim is None:
            return None
        q, serving = self.req.q, self.serving()
        return {"utilization": utilization(self.curve, self.req.rate, self.req.workers),
                "capacity_rps": capacity_rps(self.curve, serving["workers"],
                                             serving["max_batch"]),
                "rate": self.req.rate,
                "queue_ms": self.base_sim.queue.quantile(q) * 1e3,
                "compute_ms": self.base_sim.compute.quantile(q) * 1e3,
                "percentile": self.req.percentile}

    def predict_call(self, v: Variant) -> tuple[float, float, float, Prediction | None]:
        """(p50, lo, hi) ms of one model call of the variant, and its Prediction."""
        if v.serving is not None:
            return (self.base.p50_ms, *self.base.interval_ms, None)
        if v.device_id is not None:
            if v.device_id not in self.others:
                self.say(f"loading the predictor of {v.device_id}")
                self.others[v.device_id] = Predictor.for_device(self.db, v.device_id)
            predictor, model, inputs = self.others[v.device_id], self.ctx.model, self.ctx.inputs
            p = predictor.predict_ops(self.base_ops, spec=self.req.spec, values_counted=self.counted)
        else:
            predictor, inputs = self.predictor, v.inputs or self.ctx.inputs
            if v.batch is not None:
                inputs = with_batch(inputs, v.batch)
            model = self.ctx.model if (v.build is None and v.spec is None) else \
                v.model(self.ctx.model)
            ops = self.capture(model, inputs, dtype=v.dtype, channels_last=v.channels_last)
            p = predictor.predict_ops(ops, spec=v.label, values_counted=self.counted)
        self.add_slow_path(v, p, predictor, model, inputs)
        return (p.p50_ms, *p.interval_ms, p)

    def add_slow_path(self, v: Variant, p: Prediction, predictor: Predictor, model: Any,
                      inputs: list) -> None:
        """Price the subnormal values the variant computes into `p`, as the baseline's were:
        none where it flushes them; the baseline's where it computes the same values (another
        layout, thread count or batch); counted again where it computes others (another model
        or input); not priced in another precision (the slow path was measured in float32)."""
        one = self.ctx.subnormals
        if one is None or v.flush_denormal:
            return
        base_ms = self.base.subnormal_ms or 0.0
        if v.dtype:
            v.notes.append(f"the slow path for subnormal values ({base_ms:.4g} ms in the "
                           f"baseline) is measured in float32 and not priced in {v.dtype}")
            return
        if (v.build is not None and not v.channels_last) or v.spec or v.inputs:
            try:
                one = _uses_at_batch_one(model, inputs, self.ctx.loaded.vocab)
            except Exception as e:  # noqa: BLE001 - the variant's forward pass with values
                v.notes.append(f"its subnormal values could not be counted ({_first_line(e)}), "
                               "so their slow path is not priced")
                return
        if not (predictor.device.peaks or {}).get("subnormal"):
            v.notes.append(f"{predictor.device.id} has no measured cost for subnormal values, "
                           f"so their slow path ({base_ms:.4g} ms in the baseline) is left out")
            return
        predictor.add_subnormals(p, one.scaled(batch_of(inputs)))

    def result(self, lever: Lever, v: Variant, call: tuple) -> LeverResult:
        p50, lo, hi = call[:3]
        req, extra, notes = self.req, {}, []
        if req.rate is None:
            r = self.spread.ratio[req.percentile]
            target, interval = p50 * r, [lo * r, hi * r]
            extra["p95_ms"] = p50 * self.spread.ratio["p95"]
            if v.batch:
                extra["throughput_rps"] = v.batch / p50 * 1e3
                extra["per_request"] = "every request of a batch completes with the batch"
        else:
            base_p50 = self.base.p50_ms
            factor = p50 / base_p50 if v.serving is None else 1.0
            serving = self.serving(v)
            curve = self.curve.scaled(factor)
            sim = self.sim(curve, serving)
            cap = capacity_rps(curve, serving["workers"], serving["max_batch"])
            # beyond capacity the queue grows all run: its percentiles are the run's length
            target, p50, p95 = ((math.inf,) * 3 if req.rate >= cap else
                                (sim.total.quantile(q) * 1e3 for q in (req.q, 0.5, 0.95)))
            interval = [self.steady_ms(self.curve.scaled(factor * x / call[0]), serving)
                        for x in (lo, hi)]
            extra.update(p95_ms=p95, simulated=sim.to_json())
            if math.isinf(target):
                notes.append(f"unstable: {req.rate:g} req/s is more than "
                             f"{serving['workers']} worker(s) at batch <= "
                             f"{serving['max_batch']} can serve ({cap:.1f} req/s predicted), so "
                             "the queue grows without bound and no percentile is steady")
        if lever is _BASELINE:
            self.base_target = target
        base_target = self.base_target or target
        if math.isinf(base_target) and math.isinf(target):
            speedup = 1.0  # both unbounded: no change to show
        else:
            speedup = base_target / target if target > 0 else math.nan
        return LeverResult(v.lever, v.label, v.params, p50, target, interval, speedup,
                           req.budget_ms, lever.risk_level, lever.risk, lever.effort_level,
                           lever.effort, notes=[*v.notes, *notes], extra=extra, variant=v)

    def steady_ms(self, curve: BatchCurve, serving: dict) -> float:
        """The simulated target percentile of total latency (ms), or inf where the rate is beyond
        what the serving setup can serve: a growing queue's percentile is the run's length."""
        if self.req.rate >= capacity_rps(curve, serving["workers"], serving["max_batch"]):
            return math.inf
        return self.sim(curve, serving).total.quantile(self.req.q) * 1e3

    def levers(self, baseline: LeverResult) -> tuple[list[LeverResult], dict[str, str]]:
        results, skipped = [], {}
        for lever in LEVERS.values():
            if self.req.levers and lever.name not in self.req.levers:
                continue
            self.say(f"lever: {lever.title}")
            try:
                variants = lever.variants(self.ctx)
            except HwlatError as exc:
                variants = str(exc)
            if isinstance(variants, str):
                skipped[lever.name] = variants
                continue
            mine = []
            for v in variants:
                try:
                    call = self.predict_call(v)
                except HwlatError as exc:
                    skipped[f"{lever.name}: {v.label}"] = str(exc)
                    continue
                r = self.result(lever, v, call)
                share = sum(u["share"] for u in call[3].unmodelled) if call[3] else 0.0
                if share >= 0.005:
                    r.notes.append(f"{share:.0%} of its predicted time is unmodelled ops "
                                   "(roofline fallback)")
                profiled = self.predictor.profiled_dtypes
                if v.dtype and profiled and v.dtype not in profiled:
                    r.notes.append(f"no {v.dtype} op was profiled on this device, so its ops are "
                                   f"extrapolated from {', '.join(sorted(profiled))} ones "
                                   f"(`hwlat profile --dtype {v.dtype}` measures them)")
                mine.append(r)
            if lever.best_only and mine:
                mine = [min(mine, key=lambda r: r.target_ms)]
            results += mine
        return results, skipped


_BASELINE = Lever("none", "as deployed now", 0, "none", 0, "none", lambda ctx: [])


def _nbytes(spec) -> float:
    from profilers.oprecord import dtype_from_name

    return float(math.prod(spec.shape) * dtype_from_name(spec.dtype).itemsize)


def _why(r: LeverResult, d: Diagnosis) -> str:
    if math.isinf(r.target_ms):
        return "the queue grows without bound at this rate (see its note)"
    if math.isinf(r.speedup):
        return "serves this rate, which the deployment as it is cannot"
    if r.slower:
        return f"predicted {1 / r.speedup:.2f}x slower on this device"
    fits = d.bottleneck if r.lever in d.first_fix else None
    head = f"first fix for {fits}" if fits else f"{r.speedup:.2f}x predicted"
    if fits:
        head += f", {r.speedup:.2f}x predicted"
    return head + ("" if r.meets_budget else "; misses the budget alone")


def advise(db: KernelDB, request: AdviceRequest, progress: ProgressFn | None = None) -> Advice:
    """Diagnose `request.spec` on its device and rank every applicable lever by prediction."""
    if request.percentile not in PERCENTILES:
        raise AdvisorError(f"percentile must be one of {', '.join(PERCENTILES)}")
    if request.levers:
        unknown = [n for n in request.levers if n not in LEVERS]
        if unknown:
            raise AdvisorError(f"unknown lever(s) {', '.join(unknown)}; known: "
                               f"{', '.join(LEVERS)}")
    return _Advisor(db, request, progress).run()

