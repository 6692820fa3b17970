"""`--verify K`: apply the top K levers for real, measure them, check accuracy against the floor.

Latency: without a rate, the forward pass under the bench harness (`bench_model`, the device's
profiled thread count unless the lever sets another); with a rate, a real load test
(`run_load`, the same Poisson arrivals seed as the simulation) so the measured percentile is
the one the simulator predicted. The baseline is measured the same way, for measured speedups.

Accuracy: the user's `--eval file.py:FN` (FN(model) -> score, higher is better) or, without it,
fidelity to the original model on N seeded sample inputs: top-1 agreement for classifier-shaped
outputs (N x classes), else the mean cosine similarity of the flattened outputs. Input levers are
compared on the original inputs through a wrapper that resizes/truncates them; precision levers
through one that casts. A lever below the floor is marked rejected and never recommended.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from advisor.levers import CastInputs, LeverContext, Variant
from advisor.rank import LeverResult, rank
from profilers import stats
from profilers.errors import AdvisorError, HwlatError
from profilers.loadtest import model_batch_runner, poisson_arrivals, run_load
from profilers.modelbench import bench_model, flushed_denormals
from profilers.oprecord import dtype_from_name
from profilers.specs import with_batch
from profilers.timer import thread_count

FIDELITY_SAMPLES = 16
BENCH_SECONDS = 2.0  # per lever, without a rate
LOAD_REQUESTS = 500  # per lever, with a rate (p95 needs 93, p99 473)
LOAD_MAX_SECONDS = 20.0
ProgressFn = Callable[[str], None]


def load_eval(spec: str) -> Callable[[nn.Module], float]:
    """`path/to/file.py:FN` -> FN, which scores a model (higher is better)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise AdvisorError(f"--eval must be path/to/file.py:FUNCTION, got {spec!r}")
    if not Path(path).is_file():
        raise AdvisorError(f"--eval file {path} does not exist")
    module_name = f"hwlat_eval_{abs(hash(path))}"
    loader = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader)
    sys.modules[module_name] = module
    try:
        loader.loader.exec_module(module)
    except Exception as exc:
        raise AdvisorError(f"--eval file {path} failed to import: {exc}") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AdvisorError(f"--eval: {path} has no function {name!r}")
    return fn


TOP1, COSINE = "top1_agreement", "cosine_similarity"
FIDELITY_METRICS = frozenset({TOP1, COSINE})  # what `fidelity` scores: agreement, not accuracy


def fidelity(reference: list[Any], outputs: list[Any]) -> tuple[str, float]:
    """(metric, value) comparing outputs with the reference ones, sample by sample."""
    ref = torch.cat([_first_tensor(o).float().reshape(_first_tensor(o).shape[0], -1)
                     if _first_tensor(o).dim() == 2 else _flat(o) for o in reference])
    out = torch.cat([_first_tensor(o).float().reshape(_first_tensor(o).shape[0], -1)
                     if _first_tensor(o).dim() == 2 else _flat(o) for o in outputs])
    if ref.shape != out.shape:  # truncated sequences: compare the common prefix
        width = min(ref.shape[1], out.shape[1])
        ref, out = ref[:, :width], out[:, :width]
    classifier = _first_tensor(reference[0]).dim() == 2 and ref.shape[1] > 1
    if classifier:
        return TOP1, float((ref.argmax(1) == out.argmax(1)).float().mean())
    cos = nn.functional.cosine_similarity(ref, out, dim=1)
    return COSINE, float(cos.mean())


def _first_tensor(out: Any) -> torch.Tensor:
    if torch.is_tensor(out):
        return out
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, dict):
        out = list(out.values())
    for item in out:
        if torch.is_tensor(item):
            return item
    raise AdvisorError("the model returns no tensor to compare; pass --eval")


def _flat(out: Any) -> torch.Tensor:
    t = _first_tensor(out).float()
    return t.reshape(t.shape[0], -1) if t.dim() > 1 else t.reshape(1, -1)


class Verifier:
    """Measures the baseline once, then each lever, on this machine."""

    def __init__(self, ctx: LeverContext, *, percentile_q: float, floor: float | None,
                 eval_fn: Callable[[nn.Module], float] | None, rate: float | None,
                 seed: int = 0, progress: ProgressFn | None = None) -> None:
        self.ctx, self.q, self.floor, self.eval_fn = ctx, percentile_q, floor, eval_fn
        self.rate, self.seed = rate, seed
        self.say = progress or (lambda text: None)
        self.samples = self._samples()
        with torch.inference_mode():
            self.reference = [ctx.model(*s) for s in self.samples]
        self.baseline_score = self._score(ctx.model, None)

    def _samples(self) -> list[list[torch.Tensor]]:
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)
        try:
            return [self.ctx.loaded.make_inputs() for _ in range(FIDELITY_SAMPLES)]
        finally:
            torch.random.set_rng_state(generator_state)

    # --------------------------------------------------------------------------- latency

    def measure(self, v: Variant) -> dict[str, float | None]:
        """Measured p50/p95/p99 and the budget's percentile ("target"), in ms."""
        model = v.model(self.ctx.model)
        dtype = dtype_from_name(v.dtype or self.ctx.dtype)
        if dtype != torch.float32:  # .to() casts in place: never touch the shared baseline
            model = copy.deepcopy(model).to(dtype)
        inputs = list(v.inputs or self.ctx.inputs)
        if v.batch is not None:
            inputs = with_batch(inputs, v.batch)
        threads = v.threads or self.ctx.device.threads
        make = MakeInputs(tuple(inputs), self.ctx.loaded.vocab, dtype, v.channels_last)
        load = None
        if self.rate is not None:
            serving = v.serving or {"workers": self.ctx.workers, "max_batch": self.ctx.max_batch,
                                    "max_wait_ms": self.ctx.max_wait_ms}
            load = (self.rate, self.seed, serving)
        if v.flush_denormal:
            return self._flushed(make, threads, load)
        return _measure(model, make, threads, self.q, load)

    def _flushed(self, make: MakeInputs, threads: int | None, load: tuple | None) -> dict:
        """Flushing subnormals to zero holds only in threads started after it was set, so the
        lever is timed in a fresh child process that sets it first; the baseline is timed
        again the same way, in another, and its speedup is measured against that. Each child
        builds the model from its spec and loads the weights of the one advised."""
        import pickle

        from profilers import isolate

        if not isolate.enabled() and (threads or 1) > 1:
            raise AdvisorError(f"timing it flushed at {threads} threads needs a fresh process, "
                               f"which {isolate.ENV}=0 turns off")
        weights = self.ctx.model.state_dict() if isinstance(self.ctx.model, nn.Module) else None
        model = (self.ctx.spec, list(make.specs), weights)
        try:
            plain = isolate.run(_measure_in_child, model, make, threads, self.q, load, False)
            flushed = isolate.run(_measure_in_child, model, make, threads, self.q, load, True)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise AdvisorError(f"its model could not be sent to a fresh process to be timed "
                               f"flushed ({type(e).__name__}: {e})") from None
        return {**flushed, "baseline_target": plain["target"]}

    # -------------------------------------------------------------------------- accuracy

    def _score(self, model: nn.Module, v: Variant | None) -> dict[str, Any] | None:
        if v is not None and v.wrap is not None:
            model = v.wrap(model)
        if v is not None and v.dtype:
            dtype = dtype_from_name(v.dtype)
            model = CastInputs(copy.deepcopy(model).to(dtype), dtype)
        model.eval()
        with flushing_subnormals() if v is not None and v.flush_denormal else nullcontext():
            return self._score_as_is(model, v)

    def _score_as_is(self, model: nn.Module, v: Variant | None) -> dict[str, Any] | None:
        if self.eval_fn is not None:
            value = self.eval_fn(model)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise AdvisorError(f"--eval returned {value!r}, not a finite number")
            return {"metric": "eval", "value": float(value)}
        if v is None:
            return None
        with torch.inference_mode():
            outputs = [model(*s) for s in self.samples]
        metric, value = fidelity(self.reference, outputs)
        return {"metric": metric, "value": value, "samples": len(self.samples)}

    def accuracy(self, v: Variant) -> dict[str, Any]:
        if not v.changes_model:
            base = self.baseline_score or {"metric": "fidelity", "value": 1.0}
            return {**base, "note": "the computation is unchanged"}
        if v.spec is not None and self.eval_fn is None:
            return {"metric": "unverified", "value": None,
                    "note": "another network: fidelity to an untrained copy says nothing; "
                            "pass --eval"}
        score = self._score(v.model(self.ctx.model), v)
        if self.baseline_score is not None:
            score["baseline"] = self.baseline_score["value"]
        return score

    def check(self, r: LeverResult) -> None:
        """Measure one lever in place; mark it rejected below the floor or if it fails."""
        self.say(f"verifying: {r.label}")
        try:
            r.accuracy = self.accuracy(r.variant)
            r.measured_ms = self.measure(r.variant)
            if "baseline_target" in r.measured_ms:
                r.notes.append(f"timed in a fresh process, against the baseline timed again "
                               f"the same way ({r.measured_ms['baseline_target']:.1f} ms): "
                               "flushing must be set before a process's threads start")
        except HwlatError as exc:
            r.rejected = f"could not be applied: {exc}"
            return
        except (RuntimeError, NotImplementedError, TypeError) as exc:
            r.rejected = f"could not be applied: {type(exc).__name__}: {str(exc)[:200]}"
            return
        value = r.accuracy.get("value")
        if self.floor is not None and value is not None and value < self.floor:
            r.rejected = (f"measured {r.accuracy['metric']} {value:.4f} is below the accuracy "
                          f"floor {self.floor}")
        if self.floor is not None:
            r.accuracy["floor"] = self.floor
            r.accuracy["passes"] = None if value is None else value >= self.floor


@dataclass(frozen=True)
class MakeInputs:
    """A variant's inputs, made anew at its batch or another (picklable: a child process that
    times the variant makes them too)."""

    specs: tuple
    vocab: int | None
    dtype: torch.dtype
    channels_last: bool

    def __call__(self, batch: int | None = None) -> list[torch.Tensor]:
        specs = list(self.specs) if batch is None else with_batch(list(self.specs), batch)
        made = [s.make("cpu", self.vocab) for s in specs]
        made = [t.to(self.dtype) if t.is_floating_point() else t for t in made]
        if self.channels_last:
            made = [t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
                    for t in made]
        return made


def _measure(model: nn.Module, make: MakeInputs, threads: int | None, q: float,
             load: tuple | None) -> dict:
    """The forward pass under the bench harness, or with `load` = (rate, seed, serving) a load
    test with those Poisson arrivals."""
    if load is None:
        return _bench(model, make, threads, q)
    return _load(model, make, threads, q, *load)


def _measure_in_child(model: tuple, make: MakeInputs, threads: int | None, q: float,
                      load: tuple | None, flush: bool) -> dict:
    """`_measure` in a fresh process (`profilers.isolate.run`) of `model` = (spec, inputs,
    weights: a state dict or None), with subnormals flushed to zero from before any of its
    threads starts if `flush`."""
    from profilers.specs import load_model

    with flushed_denormals(flush):  # set back where this is the advising process (isolation off)
        spec, inputs, weights = model
        built = load_model(spec, inputs=inputs).model
        if weights is not None:
            built.load_state_dict(weights)
        return _measure(built, make, threads, q, load)


def _bench(model: nn.Module, make: MakeInputs, threads: int | None, q: float) -> dict:
    args = make()
    probe = bench_model(model, lambda: args, runs=3, warmup=1, threads=threads)
    p50 = probe.stages["forward"].p50
    runs = int(min(100, max(15, BENCH_SECONDS / max(p50, 1e-6))))
    result = bench_model(model, lambda: args, runs=runs, warmup=2, threads=threads)
    stats = result.stages["forward"]
    return {"p50": stats.p50 * 1e3, "p95": stats.p95 * 1e3, "p99": stats.p99 * 1e3,
            "target": stats.quantile(q) * 1e3, "runs": stats.n,
            "target_supported": stats.supported(q)}


def _load(model: nn.Module, make: MakeInputs, threads: int | None, q: float, rate: float,
          seed: int, serving: dict) -> dict:
    duration = min(LOAD_MAX_SECONDS, LOAD_REQUESTS / rate)
    arrivals = poisson_arrivals(rate, duration, seed)
    with thread_count(threads):
        runner = model_batch_runner(model, make)
        runner(1)  # warm up outside the measured run
        result = run_load(runner, arrivals, workers=serving["workers"],
                          max_batch=serving["max_batch"],
                          max_wait_s=serving["max_wait_ms"] / 1e3)
    total = result.total
    if total.n == 0:
        raise AdvisorError(f"the load test served no request: {result.error}")
    return {"p50": total.p50 * 1e3, "p95": total.p95 * 1e3, "p99": total.p99 * 1e3,
            "target": total.quantile(q) * 1e3, "runs": total.n,
            "target_supported": total.supported(q),
            "queue_p99": result.queue.p99 * 1e3, "rejected": result.rejected}


@contextmanager
def flushing_subnormals() -> Iterator[None]:
    """Subnormals flushed to zero in this thread, at 1 thread (torch's other threads keep the
    setting they started with): for accuracy passes, not timings."""
    with flushed_denormals(), thread_count(1):
        yield


def verify(advice, k: int, *, eval_fn: Callable | None = None,
           progress: ProgressFn | None = None) -> dict:
    """Measure the baseline and the top `k` levers; re-rank; return the comparison summary."""
    _check_here(advice.context)
    # Fidelity passes run at the device's thread count too: more threads than the profile's
    # only contend with whatever else runs here.
    with thread_count(advice.context.device.threads):
        return _verify(advice, k, eval_fn, progress)


def _verify(advice, k: int, eval_fn: Callable | None, progress: ProgressFn | None) -> dict:
    req = advice.request
    verifier = Verifier(advice.context, percentile_q=req.q, floor=req.accuracy_floor,
                        eval_fn=eval_fn, rate=req.rate, seed=req.seed, progress=progress)
    if progress:
        progress("verifying: the baseline")
    advice.baseline.measured_ms = verifier.measure(advice.baseline.variant)
    advice.baseline.accuracy = verifier.baseline_score
    # Verify down the ranking until k levers pass (a rejected one is replaced by the next),
    # trying at most 2k, so the recommendation that comes out has been measured.
    chosen = []
    for r in [r for r in advice.results if not r.rejected][:2 * k]:
        chosen.append(r)
        verifier.check(r)
        if sum(1 for c in chosen if not c.rejected) >= k:
            break
    base_ms = advice.baseline.measured_ms["target"]
    for r in chosen:
        if r.measured_ms:  # against the baseline timed the same way, where it was timed again
            r.measured_ms["speedup"] = (r.measured_ms.get("baseline_target", base_ms)
                                        / r.measured_ms["target"])
            r.measured_ms["meets_budget"] = r.measured_ms["target"] <= r.budget_ms
    advice.results = rank(advice.results)
    measured = [r for r in chosen if r.measured_ms]
    summary = {"k": k, "verified": [r.label for r in chosen],
               "baseline_measured_ms": advice.baseline.measured_ms,
               "spearman_speedup": spearman([r.speedup for r in measured],
                                            [r.measured_ms["speedup"] for r in measured]),
               "rejected": {r.label: r.rejected for r in chosen if r.rejected}}
    advice.verification = summary
    return summary


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman rank correlation of verified levers; None under 3 pairs or for a constant side."""
    if len(a) < 3 or len(a) != len(b):
        return None
    rho = stats.spearman(a, b)
    return None if math.isnan(rho) else rho


def _check_here(ctx: LeverContext) -> None:
    """Verification measures on this machine: it must be the device advised about."""
    from profilers.fingerprint import fingerprint

    if ctx.device.kind != "cpu":
        if not torch.cuda.is_available():
            raise AdvisorError(f"--verify measures here, but {ctx.device.id} is a GPU and this "
                               "machine has none; run advise --verify on that machine")
        raise AdvisorError("--verify on GPUs is not implemented yet; verify on a CPU device")
    here = fingerprint("cpu", ctx.device.threads).device_id
    if here != ctx.device.id:
        raise AdvisorError(f"--verify measures here, but this machine is {here}, not "
                           f"{ctx.device.id}; run advise --verify on that machine")
