"""Would another form of the end-to-end correction predict unseen models better? Refit each
candidate on a profile's own end-to-end timings and re-predict a recorded `hwlat evaluate --json`
of the same profile (no timing: captures only, ~25 s per pair on 2 cores).

    python benchmarks/correction_variants.py DB EVAL_JSON CACHE_HOME [DB EVAL_JSON CACHE_HOME ...]

VARIANTS_ONLY=WORD,WORD in the environment keeps "as fitted" and the variants whose names
contain one of the words. CACHE_HOME is the XDG_CACHE_HOME the evaluation ran with, so the op
models are the ones it predicted with (the first line per pair says how closely the refit
reproduces its predictions).
Per variant: held-out MAPE and share within 10% against the evaluation's measurements (those
with subnormals flushed where the evaluation has them, as `hwlat evaluate` scores "hwlat vs
subnormals flushed": hwlat predicts that run), the same
MAPE with the hour's level removed (each prediction/measurement ratio divided by their median),
and the zoo's own leave-one-family-out MAPE; then the mean over the pairs.

The variants (`VARIANTS`; one entry each):
- as fitted: `predictor.correction`'s five terms, fitted to each zoo setting's fastest timing
  brought to the profile's pace (`predictor.e2e.fit_target_s`);
- targets as timed: the same, fitted to the fastest timings as taken (the rule until 12-07);
- per-op term kept >= 0: as fitted, but the per-op term dropped where it comes out negative (the
  rule until 12-05; predictor/correction.py says what the sign bought);
- weights by footprint: the weight re-read term only for the share of a model's weights that
  cannot stay in the LLC from one forward pass to the next (1 - LLC / its weight bytes, >= 0):
  weights that fit stay cached between passes;
- conv weights apart: the weight re-read term split into convs' weights and the rest (a cold
  conv weight costs oneDNN a reorder, a linear's is streamed);
- weights by weight share / of weight-bound ops / weight-bound ops apart: the weight re-read
  term with each op's weights times their share of its bytes; only the ops whose weights are
  half their bytes or more (a 1x1 conv on a 7x7 map, a batch-1 linear: nothing to hide the cold
  read behind); those ops' weights as a term of their own beside the rest;
- conv sum apart: a multiplier of its own on the conv family's summed time;
- small-op traffic, signed: the memory-traffic term only over the ops within the timing's cache
  flush (the large-op term has the rest), and of either sign: inside a model such an op finds
  its input hot from the op before, timed alone it does not (mnasnet0_5's ops summed 0.99x their
  estimates inside the model where mnasnet1_0's summed 1.25x, batch 1, 1 thread, on the Xeon);
- large-op traffic, convs apart / without convs: the large-op traffic term split into the part
  from convs and products (`COMPUTE_FAMILIES`) and the rest, or with that part left out (at 2
  threads mnasnet0_5's ops summed the same inside the model as the database says at batch 8,
  where the term added 4.5 ms, +14%); neither kept (benchmarks/RESULTS.md, 2026-12-07 late
  morning);
- other weights read once: the weights of ops other than convs (linears, products) charged at
  their read time at the stream bandwidth, as priced, and only the convs' weights fitted (bert's
  1x128x768 by 3072x768 linears took 2.42-2.56 ms in the model, 2.13-2.22 alone: their 9.4 MB
  read once, not overlapped; the fitted term charged 0.683x); not kept: better at 2 threads,
  worse at 1 (benchmarks/RESULTS.md, 2026-12-07 late morning);
- no all-op traffic term: the four others (the large-op traffic term keeps the ops beyond the
  flush; inside a model the smaller ones run hot from the op before);
- small-op input reads, signed (with or without the per-op term): a sixth term, the activation
  bytes read by the ops within the flush (their bytes less weights and outputs) at the copy
  bandwidth, of either sign: what `benchmarks/flush_kinds.py` found per family (alone, a small
  op reads from L3 the input it finds in L2 inside the model);
- distinct configs, signed: a sixth term, the number of distinct op configs (each its own
  kernel, whose code and primitive a model of many shapes may find cold), of either sign;
- small ops' sum apart (with or without the per-op term): a multiplier of its own on the summed
  estimates of the ops within the timing's cache flush (inside a model they run warm, the larger
  ones cold), instead of the per-op term's one amount per op;
- op sum beyond the LLC apart / weights by the pass beyond the LLC: the share of a forward
  pass's footprint (its weights and every activation its ops write) beyond the LLC, as a sixth
  term times the op sum, or as the weight re-read term's factor (weights that fit with the pass's
  activations stay cached from one pass to the next);
- per-op term split at the flush: two per-op terms, both signed, for the ops within the timing's
  cache flush and those beyond it;
- no cold-weight floor: the predictor before every op was floored at its cold weights' stream
  time (`Predictor._cold_weights_s`, correction version 17): those ops' weights back in the
  weight re-read term;
- cold floors scaled by a: the floored ops' prices in the op sum, times `a` like the others
  (the predictor before correction version 18 took them so);
- second stage, ridge / gradient-boosted: the five-term correction, then a model of its
  leave-one-family-out log residual from model-level features (each op family's share of the
  op sum, log op sum, time per op, traffic, weight and large-op time over the op sum, log batch),
  the "second-stage gradient-boosted model" the predictor issue invites.
- bagged over the zoo's families: the five terms fitted on resampled families, averaged;
- per-op overhead fixed at 2, 6 or 10 us: the overhead not fitted but given (what a profile that
  measured it directly, instead of fitting it on ~50 noisy settings, would do), the other four
  terms fitted on what is left;
- per-op overhead held to 2-10 us: as fitted while the overhead comes out in that range, else
  fixed at the nearer bound;
- weight re-read fixed at 0.5, 1, 1.5 or 2x: the weight term given, not fitted (it came out
  0.13x and 1.90x in the 1- and 2-thread profiles of 12-04 02:32 and 03:01, whose 1-thread
  evaluation under-predicted the batch-1 settings by a median 10%).
- weights by the pass time, 5, 20 or 50 ms: the weight re-read term times t / (t + tau), t the
  pass's op sum: a layer's weights are colder the longer the pass since it last ran
  (`benchmarks/cold_after.py`).
- slow side Huber k 1, 0.5 or 0.25: the five terms with a lower Huber threshold (in robust
  sigmas, against `HUBER_K`'s 2) on the settings measured slower than their fit: a target timed
  in a slow spell the pace probe missed is only ever slow, never fast; not kept
  (benchmarks/RESULTS.md, 2026-12-07 late night).
- earliest timing only: each zoo setting's target from its earliest quiet timing alone: the fit
  without the second of a setting's two quiet timings (it differs from as fitted only on the
  settings timed twice in quiet: 0-23 per profile; a timing flagged slow is left out either way);
- targets at the 10th / 25th percentile: each timing's median replaced by that percentile of its
  samples, times the profile's median ratio of median to that percentile over its quiet timings
  (`_low_targets`): a slow spell shorter than a timing slows some of its samples, not its fastest
  tenth (mobilenet_v3_small at 1x3x224x224 in the 1-thread profile of 21:16 took a median 1.50x
  its 19:26 timing, its 10th percentile 1.16x). Neither percentile kept, nor the earliest timing
  only (benchmarks/RESULTS.md, 2026-12-07 midnight).
- ridge on the traffic and weight terms, lambda 0.1, 1 or by LOFO / on all but the op sum, by
  LOFO: the five terms with a ridge penalty pulling those terms toward 0 (`_ridge_solve`; lambda
  by LOFO: the `RIDGE_LAMBDAS` value with the lowest leave-one-family-out MAPE on the profile's
  own zoo). The traffic and weight terms are collinear and trade places from profile to profile
  (the weight term 0-0.85 over ten profiles of one VM). Not kept: over twelve pairs 8.6-8.9% MAPE
  against 8.7% as fitted (benchmarks/RESULTS.md, 2026-12-08 small hours).

On the 2-vCPU dev VM's 32 MiB-L3 incarnation (eleven pairs, 12-02 23:51 to 12-03 09:25;
benchmarks/RESULTS.md, 2026-12-03 late morning; thirteen with the fixed overheads, the midday
entry; fifteen and six timm2 evaluations with the bounded overhead, the afternoon entry; nine
pairs of 12-04 with the weight-share variants, the evening entry) none was adopted: see those
entries for the numbers. On the 2-vCPU Intel Xeon (twelve pairs of 12-05, eight at 1 thread and
four at 2; the 12-05 midday entry) only the per-op term's sign was (predictor/correction.py).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kernels_db.store import KernelDB, profile_pace_s, quiet_ids
from predictor.correction import (
    HUBER_K,
    MIN_SHARE_OF_SUM,
    SIGNED_TERMS,
    Correction,
    solve_columns,
)
from predictor.e2e import Predictor, fit_target_s
from predictor.evaluate import metrics
from profilers import ops
from profilers.capture import capture_spec
from profilers.errors import HwlatError
from profilers.specs import parse_input_spec

FAMILIES = (*(f for f in ops.FAMILIES if f != "free"), ops.UNKNOWN)
COMPUTE_FAMILIES = ("conv", "matmul")  # the large-op traffic variants set these apart
LOW_QUANTILES = (10, 25)  # the low-percentile target variants (`_low_targets`)


@dataclass
class Setting:
    """One model setting: its measured time and what the predictor computes from its ops."""

    family: str  # the zoo family (zoo settings) or the spec (evaluated ones)
    measured_s: float
    terms: np.ndarray  # the correction's five inputs (predictor.correction.ModelRow.terms)
    op_s: dict[str, float]  # summed op time by op family
    conv_weights_s: float  # the conv family's part of the weight re-read term
    footprint: float  # share of the weight bytes that cannot stay in the LLC between passes
    batch: int
    weights_by_share_s: float = 0.0  # the weight term, each op's part times its weight share
    weight_bound_s: float = 0.0  # the weight term of the ops whose weights are most of their bytes
    small_input_s: float = 0.0  # activations read by the ops within the timing's flush, at copy bw
    n_distinct: int = 0  # distinct op configs among the timed ops (each its own kernel)
    cold_extra_s: float = 0.0  # what the cold-weight floor (Predictor._cold_weights_s) adds
    cold_weights_s: float = 0.0  # the weight re-read term of the ops that floor raises
    small_sum_s: float = 0.0  # the summed estimates of the ops within the timing's cache flush
    n_small: int = 0  # ... and their number
    pass_beyond: float = 0.0  # share of a pass's weights and written activations beyond the LLC
    floored_s: float = 0.0  # the ops priced at their cold weights, taken as priced (not fitted)
    large_compute_s: float = 0.0  # the large-op traffic term's part from convs and products
    timed_s: float = 0.0  # a zoo setting's fastest timing as taken (measured_s: at the profile's pace)
    # a zoo setting's target from each timing's LOW_QUANTILES percentile of samples instead of
    # its median, times the profile's typical median / that percentile (`_low_targets`)
    low_s: dict[int, float] | None = None
    first_s: float = 0.0  # a zoo setting's target from its earliest quiet timing alone


def _setting(predictor: Predictor, captured, family: str, measured_s: float) -> Setting:
    p = predictor._assemble(captured.ops, spec=captured.spec, correction=Correction())
    timed = [(r, predictor._cache[r.key]) for r in captured.ops]
    timed = [(r, e) for r, e in timed if e.source != "free"]
    op_s: dict[str, float] = {}
    for _, e in timed:
        op_s[e.family] = op_s.get(e.family, 0.0) + e.p50_s
    conv = [(r, e) for r, e in timed if e.family == "conv"]
    conv_bytes = [ops.bytes_of(r) for r, _ in conv]
    conv_weights_s = predictor._weights_s(conv, conv_bytes, [
        predictor._cold_weights_s(r, e, b) for (r, e), b in zip(conv, conv_bytes, strict=True)])
    weight_bytes = sum(r.weight_bytes for r, e in timed if e.family != "data")
    footprint = max(0.0, 1 - predictor._llc_bytes / weight_bytes) if weight_bytes else 0.0
    batch = captured.inputs[0].shape[0] if captured.inputs and captured.inputs[0].shape else 1
    by_share = bound = small_input = cold_extra = cold_weights = 0.0
    op_bytes = [ops.bytes_of(r) for r, _ in timed]
    small = [e.p50_s for (_, e), b in zip(timed, op_bytes, strict=True)
             if b <= predictor._large_op_bytes]
    written = sum(ops._out_bytes(r) for r, _ in timed) + weight_bytes
    pass_beyond = max(0.0, 1 - predictor._llc_bytes / written) if written else 0.0
    for (r, e), nbytes in zip(timed, op_bytes, strict=True):
        if cold := predictor._cold_weights_s(r, e, nbytes):
            cold_extra += cold - e.p50_s
            cold_weights += r.weight_bytes / predictor._bytes_per_s
    for (r, _), nbytes in zip(timed, op_bytes, strict=True):
        if nbytes <= predictor._large_op_bytes:  # inside a model its input is hot from the op before
            small_input += max(nbytes - r.weight_bytes - ops._out_bytes(r), 0.0)
    for (r, e), nbytes in zip(timed, op_bytes, strict=True):
        if e.family == "data" or nbytes > predictor._llc_bytes or not r.weight_bytes:
            continue
        share = min(r.weight_bytes / nbytes, 1.0)
        by_share += r.weight_bytes * share / predictor._bytes_per_s
        bound += r.weight_bytes / predictor._bytes_per_s if share >= 0.5 else 0.0
    compute = [(r, e) for r, e in timed if e.family in COMPUTE_FAMILIES]
    large_compute = predictor._traffic_s(compute, [ops.bytes_of(r) for r, _ in compute],
                                         over=predictor._large_op_bytes)
    # column 0 leaves out the floored ops: the predictor takes them as priced (the `given` part)
    terms = np.array([(p.sum_ops_ms - p.floored_ms) / 1e3, p.n_timed_ops, p.traffic_ms / 1e3,
                      p.weights_ms / 1e3, p.large_traffic_ms / 1e3])
    return Setting(family, measured_s, terms, op_s, conv_weights_s, footprint, int(batch),
                   by_share, bound, small_input / predictor._bytes_per_s,
                   len({r.key for r, _ in timed}), cold_extra, cold_weights, sum(small),
                   len(small), pass_beyond, p.floored_ms / 1e3, large_compute)


# ------------------------------------------------------------------------------ variants
# A linear variant maps a setting to its columns (column 0: the op sum, or part of it).

def _as_fitted(s: Setting) -> np.ndarray:
    return s.terms


def _weights_by_footprint(s: Setting) -> np.ndarray:
    t = s.terms.copy()
    t[3] *= s.footprint
    return t


def _weights_by_share(s: Setting) -> np.ndarray:
    t = s.terms.copy()
    t[3] = s.weights_by_share_s
    return t


def _weight_bound_only(s: Setting) -> np.ndarray:
    t = s.terms.copy()
    t[3] = s.weight_bound_s
    return t


def _weight_bound_apart(s: Setting) -> np.ndarray:
    return np.append(s.terms - np.eye(5)[3] * s.weight_bound_s, s.weight_bound_s)


def _conv_weights_apart(s: Setting) -> np.ndarray:
    return np.append(s.terms - np.eye(5)[3] * s.conv_weights_s, s.conv_weights_s)


def _conv_sum_apart(s: Setting) -> np.ndarray:
    conv = s.op_s.get("conv", 0.0)
    return np.append(s.terms - np.eye(5)[0] * conv, conv)


def _small_traffic(s: Setting) -> np.ndarray:
    t = s.terms.copy()
    t[2] -= t[4]
    return t


def _large_compute_apart(s: Setting) -> np.ndarray:
    return np.append(s.terms - np.eye(5)[4] * s.large_compute_s, s.large_compute_s)


def _large_without_compute(s: Setting) -> np.ndarray:
    return s.terms - np.eye(5)[4] * s.large_compute_s


def _small_input_apart(s: Setting) -> np.ndarray:
    return np.append(s.terms, s.small_input_s)


def _small_sum_apart(s: Setting) -> np.ndarray:
    return np.append(s.terms - np.eye(5)[0] * s.small_sum_s, s.small_sum_s)


def _per_op_split(s: Setting) -> np.ndarray:
    """The per-op term over the ops within the flush, and a sixth over those beyond it."""
    t = s.terms.copy()
    t[1] = s.n_small
    return np.append(t, s.terms[1] - s.n_small)


def _no_cold_floor(s: Setting) -> np.ndarray:
    """The floored ops back at their estimates, in the op sum, their weights in the re-read term
    (fitted with nothing given)."""
    t = s.terms.copy()
    t[0] += s.floored_s - s.cold_extra_s
    t[3] += s.cold_weights_s
    return t


def _floors_scaled(s: Setting) -> np.ndarray:
    """The floored ops in the op sum, times `a` like the rest (fitted with nothing given)."""
    return s.terms + np.eye(5)[0] * s.floored_s


def _features(s: Setting) -> np.ndarray:
    total = s.terms[0]
    shares = [s.op_s.get(f, 0.0) / total for f in FAMILIES]
    return np.array([*shares, math.log(total), total / max(s.terms[1], 1.0),
                     *(s.terms[2:] / total), math.log(s.batch)])


def _floored(s: Setting) -> float:
    return s.floored_s


def _nothing(s: Setting) -> float:
    return 0.0


def _solve(columns: Callable[[Setting], np.ndarray], train: list[Setting],
           given: Callable[[Setting], float] = _floored,
           signed: tuple[int, ...] = SIGNED_TERMS, k_slow: float = HUBER_K) -> np.ndarray:
    """The coefficients of `columns` fitted to each measured time beside the part `given` (not
    fitted; by default the floored ops, as the predictor takes them), the error relative to the
    measured time; those in `signed` (by default the per-op term, column 1, as the predictor
    fits it) may come out negative."""
    x = np.array([columns(s) for s in train])
    return solve_columns(x, np.array([s.measured_s for s in train]), signed=signed,
                         given=np.array([given(s) for s in train]), k_slow=k_slow)


def _fit_linear(columns: Callable[[Setting], np.ndarray], train: list[Setting],
                given: Callable[[Setting], float] = _floored,
                signed: tuple[int, ...] = SIGNED_TERMS,
                k_slow: float = HUBER_K) -> Callable[[Setting], float]:
    """`_solve`'s fit as a predictor (with `Correction.apply`'s floor under the op sum)."""
    coef = _solve(columns, train, given, signed, k_slow)
    return lambda s: max(float(columns(s) @ coef + given(s)),
                         MIN_SHARE_OF_SUM * coef[0] * columns(s)[0] + given(s))


def _lofo(fit: Callable[[list[Setting]], Callable[[Setting], float]],
          settings: list[Setting]) -> list[float]:
    """Each setting predicted by a fit without its family (NaN with fewer than two families)."""
    families = {s.family for s in settings}
    if len(families) < 2:
        return [math.nan] * len(settings)
    out: dict[int, float] = {}
    for family in families:
        predict = fit([s for s in settings if s.family != family])
        out.update({i: predict(s) for i, s in enumerate(settings) if s.family == family})
    return [out[i] for i in range(len(settings))]


def _ridge(x: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    mu, sd = x.mean(0), x.std(0) + 1e-12
    z = (x - mu) / sd
    w = np.linalg.solve(z.T @ z + len(x) * np.eye(z.shape[1]), z.T @ (y - y.mean()))
    return lambda xx: y.mean() + ((xx - mu) / sd) @ w


def _gbm(x: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    import lightgbm as lgb

    model = lgb.LGBMRegressor(n_estimators=60, learning_rate=0.05, num_leaves=4,
                              min_child_samples=6, n_jobs=1, verbose=-1)
    model.fit(x, y)
    return model.predict


def _second_stage(learner) -> Callable[[list[Setting]], Callable[[Setting], float]]:
    def fit(train: list[Setting]) -> Callable[[Setting], float]:
        first = _fit_linear(_as_fitted, train)
        if len({s.family for s in train}) < 2:  # no held-out-family residuals to learn from
            return first
        held = _lofo(lambda t: _fit_linear(_as_fitted, t), train)
        residual = np.array([math.log(s.measured_s / p) for s, p in zip(train, held, strict=True)])
        model = learner(np.array([_features(s) for s in train]), residual)
        return lambda s: first(s) * math.exp(float(model(_features(s)[None, :])[0]))
    return fit


def _bagged(n: int = 40) -> Callable[[list[Setting]], Callable[[Setting], float]]:
    """The five terms fitted on `n` resamples of the zoo's families (drawn with replacement),
    their predictions averaged in log: the terms are collinear (the per-op overhead came out 0-15
    us over eleven profiles of one VM), and averaging fits is the usual cure for an unstable one."""
    def fit(train: list[Setting]) -> Callable[[Setting], float]:
        rng = np.random.default_rng(0)
        families = sorted({s.family for s in train})
        fits = []
        for _ in range(n):
            drawn = rng.choice(len(families), len(families))
            sample = [s for i in drawn for s in train if s.family == families[i]]
            fits.append(_fit_linear(_as_fitted, sample))
        return lambda s: float(np.exp(np.mean([np.log(max(f(s), 1e-12)) for f in fits])))
    return fit


def _overhead_fixed(us: float) -> Callable[[list[Setting]], Callable[[Setting], float]]:
    """The per-op overhead given, not fitted: it came out 0-15 us over eleven profiles of one VM,
    traded against the traffic and weight terms (collinear on ~50 settings). The other terms are
    fitted to what is left of each measured time (the solver's error relative to the whole)."""
    return lambda t: _fit_linear(lambda s: np.delete(s.terms, 1), t,
                                 given=lambda s: s.floored_s + us * 1e-6 * s.terms[1], signed=())


def _overhead_within(lo_us: float, hi_us: float
                     ) -> Callable[[list[Setting]], Callable[[Setting], float]]:
    """The five terms as fitted while the per-op overhead comes out within [lo_us, hi_us] (the
    dispatch cost of an eager op on a CPU), else the overhead fixed at the nearer bound and the
    other terms refitted (`_overhead_fixed`): a fit's 0 or 28 us is its collinearity, not a
    machine whose ops cost nothing, or 28 us, to launch."""
    def fit(train: list[Setting]) -> Callable[[Setting], float]:
        us = _solve(_as_fitted, train)[1] * 1e6
        if lo_us <= us <= hi_us:
            return _fit_linear(_as_fitted, train)
        return _overhead_fixed(min(max(us, lo_us), hi_us))(train)
    return fit


def _pass_share(s: Setting, tau_s: float) -> float:
    """How cold a layer's weights are when the next forward pass reaches them, by the time since
    it last ran: the pass's op sum t over t + tau (`benchmarks/cold_after.py`: on the Xeon an op
    slowed with the time away, whatever the bytes moved in between)."""
    t = s.terms[0] + s.floored_s
    return t / (t + tau_s)


def _weights_fixed(c: float) -> Callable[[list[Setting]], Callable[[Setting], float]]:
    """The weight re-read coefficient given, not fitted (it came out 0-1.9 over eleven profiles
    of one VM); the other four terms fitted on what is left."""
    return lambda t: _fit_linear(lambda s: np.delete(s.terms, 3), t,
                                 given=lambda s: s.floored_s + c * s.terms[3])


RIDGE_LAMBDAS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0)  # the grid `_ridge_by_lofo` picks from


def _ridge_solve(train: list[Setting], lam: float, shrunk: tuple[int, ...]) -> np.ndarray:
    """The five terms as `solve_columns` fits them (Huber-weighted relative error, >= 0 but the
    per-op term, the floored ops given), with a ridge penalty pulling the terms in `shrunk`
    toward 0: lam * n * (coefficient * the column's root mean square)^2 each, so lam = 1 weighs
    a term as much as the whole fit's error when it moves every prediction by its own size."""
    y = np.array([s.measured_s for s in train])
    columns = np.array([s.terms for s in train]) / y[:, None]
    target = 1.0 - np.array([s.floored_s for s in train]) / y
    active = list(range(5))
    while True:
        pen = [i for i in shrunk if i in active]
        rows = np.zeros((len(pen), len(active)))
        for r, i in enumerate(pen):
            rows[r, active.index(i)] = math.sqrt(lam * len(y)) * math.sqrt(
                float(np.mean(columns[:, i] ** 2)))
        a = np.vstack([columns[:, active], rows])
        b = np.concatenate([target, np.zeros(len(pen))])
        w = np.ones(len(b))
        for _ in range(10):
            coef, *_ = np.linalg.lstsq(a * w[:, None], b * w, rcond=None)
            r_abs = np.abs(columns[:, active] @ coef - target)
            k = HUBER_K * (1.4826 * float(np.median(r_abs)) + 1e-12)
            w[:len(y)] = np.where(r_abs <= k, 1.0, np.sqrt(k / np.maximum(r_abs, 1e-12)))
        kept = [i for i, c in zip(active, coef, strict=True)
                if c >= 0 or i == 0 or i in SIGNED_TERMS]
        if kept == active:
            break
        active = kept
    full = np.zeros(5)
    full[active] = coef
    return full


def _ridge_fit(train: list[Setting], lam: float, shrunk: tuple[int, ...]
               ) -> Callable[[Setting], float]:
    coef = _ridge_solve(train, lam, shrunk)
    return lambda s: max(float(s.terms @ coef + s.floored_s),
                         MIN_SHARE_OF_SUM * coef[0] * s.terms[0] + s.floored_s)


def _ridge_by_lofo(shrunk: tuple[int, ...]) -> Callable[[list[Setting]], Callable[[Setting], float]]:
    """`_ridge_fit` at the `RIDGE_LAMBDAS` value whose leave-one-family-out MAPE on the training
    settings is lowest (ties to the larger): the traffic and weight terms are collinear and their
    fits swap between profiles of one machine (the weight term 0-0.85 at 1 thread, 0-0.69 at 2,
    over ten profiles of 12-07), the textbook case for shrinking them."""
    def fit(train: list[Setting]) -> Callable[[Setting], float]:
        if len({s.family for s in train}) < 3:
            return _ridge_fit(train, 0.0, shrunk)
        best = None
        for lam in RIDGE_LAMBDAS:
            held = _lofo(lambda t, lam=lam: _ridge_fit(t, lam, shrunk), train)
            err = float(np.mean([abs(p / s.measured_s - 1) for s, p in zip(train, held, strict=True)]))
            if best is None or err <= best[0]:
                best = (err, lam)
        return _ridge_fit(train, best[1], shrunk)
    return fit


VARIANTS: dict[str, Callable[[list[Setting]], Callable[[Setting], float]]] = {
    "as fitted": lambda t: _fit_linear(_as_fitted, t),
    "targets as timed": lambda t: _fit_linear(
        _as_fitted, [replace(s, measured_s=s.timed_s or s.measured_s) for s in t]),
    "per-op term kept >= 0": lambda t: _fit_linear(_as_fitted, t, signed=()),
    "weights by footprint": lambda t: _fit_linear(_weights_by_footprint, t),
    "conv weights apart": lambda t: _fit_linear(_conv_weights_apart, t),
    "weights by weight share": lambda t: _fit_linear(_weights_by_share, t),
    "weights of weight-bound ops": lambda t: _fit_linear(_weight_bound_only, t),
    "weight-bound ops apart": lambda t: _fit_linear(_weight_bound_apart, t),
    "conv sum apart": lambda t: _fit_linear(_conv_sum_apart, t),
    "small-op traffic, signed": lambda t: _fit_linear(_small_traffic, t, signed=(1, 2)),
    "large-op traffic, convs apart": lambda t: _fit_linear(_large_compute_apart, t),
    "other weights read once": lambda t: _fit_linear(
        lambda s: s.terms - np.eye(5)[3] * (s.terms[3] - s.conv_weights_s), t,
        given=lambda s: s.floored_s + s.terms[3] - s.conv_weights_s),
    "large-op traffic without convs": lambda t: _fit_linear(_large_without_compute, t),
    "no all-op traffic term": lambda t: _fit_linear(lambda s: np.delete(s.terms, 2), t),
    "small-op input reads, signed": lambda t: _fit_linear(_small_input_apart, t, signed=(1, 5)),
    "small-op input reads, signed, no per-op term":
        lambda t: _fit_linear(lambda s: np.delete(_small_input_apart(s), 1), t, signed=(4,)),
    "distinct configs, signed": lambda t: _fit_linear(
        lambda s: np.append(s.terms, s.n_distinct), t, signed=(1, 5)),
    "no cold-weight floor": lambda t: _fit_linear(_no_cold_floor, t, given=_nothing),
    "cold floors scaled by a": lambda t: _fit_linear(_floors_scaled, t, given=_nothing),
    "small ops' sum apart": lambda t: _fit_linear(_small_sum_apart, t),
    "op sum beyond the LLC apart": lambda t: _fit_linear(
        lambda s: np.append(s.terms, s.terms[0] * s.pass_beyond), t),
    "weights by the pass beyond the LLC": lambda t: _fit_linear(
        lambda s: s.terms * np.array([1, 1, 1, s.pass_beyond, 1]), t),
    "per-op term split at the flush": lambda t: _fit_linear(_per_op_split, t, signed=(1, 5)),
    "small ops' sum apart, no per-op term":
        lambda t: _fit_linear(lambda s: np.delete(_small_sum_apart(s), 1), t, signed=()),
    "second stage, ridge": _second_stage(_ridge),
    "second stage, gradient-boosted": _second_stage(_gbm),
    "bagged over the zoo's families": _bagged(),
    **{f"per-op overhead fixed at {us} us": _overhead_fixed(us) for us in (2, 6, 10)},
    "per-op overhead held to 2-10 us": _overhead_within(2, 10),
    **{f"weight re-read fixed at {c}x": _weights_fixed(c) for c in (0.5, 1, 1.5, 2)},
    **{f"weights by the pass time, {ms} ms": lambda t, ms=ms: _fit_linear(
        lambda s: s.terms * np.array([1, 1, 1, _pass_share(s, ms / 1e3), 1]), t)
       for ms in (5, 20, 50)},
    **{f"slow side Huber k {k}": lambda t, k=k: _fit_linear(_as_fitted, t, k_slow=k)
       for k in (1, 0.5, 0.25)},
    "earliest timing only": lambda t: _fit_linear(
        _as_fitted, [replace(s, measured_s=s.first_s) for s in t]),
    **{f"targets at the {q}th percentile": lambda t, q=q: _fit_linear(
        _as_fitted, [replace(s, measured_s=s.low_s[q]) for s in t]) for q in LOW_QUANTILES},
    **{f"ridge on the traffic and weight terms, lambda {lam}": lambda t, lam=lam: _ridge_fit(
        t, lam, (2, 3, 4)) for lam in (0.1, 1.0)},
    "ridge on the traffic and weight terms, lambda by LOFO": _ridge_by_lofo((2, 3, 4)),
    "ridge on all but the op sum, lambda by LOFO": _ridge_by_lofo((1, 2, 3, 4)),
}


def _scores(predicted: list[float], settings: list[Setting]) -> tuple[float, float, float]:
    """MAPE, % within 10% and MAPE with the level removed (`predictor.evaluate.metrics`, as
    `benchmarks/ground_truth_repeat.py` scores)."""
    measured = [s.measured_s for s in settings]
    raw = metrics(measured, predicted)
    flat = metrics(measured, list(np.divide(predicted, np.median(np.divide(predicted, measured)))))
    return raw["mape_pct"], 100 * raw["within_10pct"], flat["mape_pct"]


def settings_of(db: KernelDB, report: dict) -> tuple[Predictor, list[tuple[list, Setting]],
                                                   list[Setting]]:
    """The device's predictor, its zoo settings (each beside its end-to-end timings,
    `Predictor.e2e_passes`; measured as the profile fits them) and the recorded evaluation's
    models, each setting captured once."""
    captures: dict[tuple, object] = {}

    def captured(spec: str, inputs: list[str], device_type: str, dtype: str):
        key = (spec, tuple(inputs), device_type, dtype)
        if key not in captures:
            captures[key] = capture_spec(spec, inputs=[parse_input_spec(i) for i in inputs] or None,
                                         device_type=device_type, dtype=dtype)
        return captures[key]

    predictor = Predictor.for_device(db, report["device"])
    timings = db.model_measurements(predictor.device.id, kind="e2e")
    then_s = profile_pace_s(timings)
    ratios = low_ratios(timings)
    zoo = []
    for (spec, _), group in predictor.e2e_passes(db).items():
        m = group[0]
        try:
            c = captured(spec, m.settings.get("inputs", []),
                         m.settings.get("device", predictor.device.kind),
                         m.settings.get("dtype", "float32"))
        except HwlatError:
            continue
        zoo.append((group, replace(_setting(predictor, c, m.family, fit_target_s(group, then_s)),
                                   timed_s=min(g.median_s for g in group),
                                   low_s=_low_targets(group, ratios, then_s),
                                   first_s=fit_target_s([min(group, key=lambda g: g.created_at)],
                                                        then_s))))
    held = [_setting(predictor, captured(m["spec"], m["inputs"], predictor.device.kind,
                                         m["dtype"]),
                     m["spec"], (m.get("measured_flushed_ms") or m["measured_ms"]) / 1e3)
            for m in report["models"]]
    return predictor, zoo, held


def low_ratios(timings: list) -> dict[int, float]:
    """Per `LOW_QUANTILES` percentile, the profile's median ratio of a timing's median to that
    percentile of its samples, over its quiet timings (`quiet_ids`)."""
    quiet = quiet_ids(timings)
    return {q: float(np.median([m.median_s / np.percentile(m.samples_s, q)
                                for m in timings if m.id in quiet])) for q in LOW_QUANTILES}


def _low_targets(group: list, ratios: dict[int, float], then_s: float | None) -> dict[int, float]:
    """A zoo setting's target as `fit_target_s` fits it, with each timing's median replaced by
    a low percentile of its samples times the profile's ratio of median to it (`low_ratios`): a
    slow spell shorter than a timing slows some of its samples, not its fastest tenth."""
    return {q: fit_target_s([replace(m, median_s=float(np.percentile(m.samples_s, q)) * ratio)
                             for m in group], then_s) for q, ratio in ratios.items()}


def reproduction_gap(predict: Callable[[Setting], float], held: list[Setting],
                     report: dict) -> float:
    """How far a refit's predictions of the evaluated models are from the evaluation's own,
    at the profile's anchor (relative, the largest)."""
    return max(abs(predict(s) * 1e3 / (m.get("predicted_profile_ms") or m["predicted_ms"]) - 1)
               for s, m in zip(held, report["models"], strict=True))


def pair(db_path: str, eval_path: str) -> dict[str, tuple[float, ...]]:
    report = json.load(open(eval_path))
    with KernelDB.open(db_path, readonly=True) as db:
        _, zoo_timings, held = settings_of(db, report)
    zoo = [s for _, s in zoo_timings]
    if not zoo or not held:
        sys.exit(f"{eval_path}: {len(zoo)} end-to-end settings and {len(held)} evaluated models: "
                 "nothing to fit or score")
    fitted = {name: fit(zoo) for name, fit in VARIANTS.items()}
    gap = reproduction_gap(fitted["as fitted"], held, report)
    print(f"{eval_path}: {len(zoo)} end-to-end settings, {len(held)} evaluated; the refit "
          f"reproduces the evaluation's predictions to {gap:.1e}")
    print(f"  {'variant':32s} {'MAPE':>6s} {'within 10%':>10s} {'level removed':>13s} "
          f"{'zoo LOFO':>9s}")
    out = {}
    for name, fit in VARIANTS.items():
        mape, within, level = _scores([fitted[name](s) for s in held], held)
        lofo = metrics([s.measured_s for s in zoo], _lofo(fit, zoo))["mape_pct"]
        out[name] = (mape, within, level, lofo)
        print(f"  {name:32s} {mape:5.1f}% {within:9.0f}% {level:12.1f}% {lofo:8.1f}%")
    return out


def main(argv: list[str]) -> None:
    if len(argv) < 3 or len(argv) % 3:
        sys.exit(__doc__.split("\n\n")[1])
    if only := os.environ.get("VARIANTS_ONLY"):
        for name in [n for n in VARIANTS
                     if n != "as fitted" and not any(w in n for w in only.split(","))]:
            del VARIANTS[name]
    results = []
    for i in range(0, len(argv), 3):
        os.environ["XDG_CACHE_HOME"] = argv[i + 2]
        results.append(pair(argv[i], argv[i + 1]))
    if len(results) > 1:
        print(f"mean over {len(results)} pairs; pairs better / worse than as fitted (MAPE, "
              "level removed, zoo LOFO)")
        base = np.array([r["as fitted"] for r in results])
        for name in VARIANTS:
            each = np.array([r[name] for r in results])
            mape, within, level, lofo = each.mean(axis=0)
            counts = ", ".join(f"{int((each[:, i] < base[:, i]).sum())}/"
                               f"{int((each[:, i] > base[:, i]).sum())}" for i in (0, 2, 3))
            print(f"  {name:32s} {mape:5.1f}% {within:9.0f}% {level:12.1f}% {lofo:8.1f}%"
                  + (f"  {counts}" if name != "as fitted" else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
