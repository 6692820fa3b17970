"""The levers the advisor considers, one registry entry each.

A `Lever` says what it risks and costs, and turns the model being advised into `Variant`s: the
transformed real model (pruned, quantized), or the same model under other settings (dtype, memory
format, inputs, threads, batching). The same variant is captured to be predicted and built to be
verified, so prediction and verification never disagree about what the lever does.
Adding a lever is one `Lever(...)` in `LEVERS` and its variants function.

Risk and effort levels: 0 none, 1 low, 2 medium, 3 high.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from advisor.pruning import prunable_sites, prune_model
from kernels_db.store import DeviceRow, KernelDB
from profilers.fingerprint import CPU_BF16_FLAGS
from profilers.specs import InputSpec, LoadedModel, batch_of
from profilers.subnormals import SubnormalUses

PRUNE_RATIOS = (0.25, 0.5, 0.75)
RESOLUTION_SCALES = (0.875, 0.75, 0.5)
SEQUENCE_SCALES = (0.75, 0.5)
BATCH_SIZES = (2, 4, 8)
WINDOW_MS = (1.0, 2.0, 5.0, 10.0)
MAX_SMALLER = 3
_SHORT = {"float16": "fp16", "bfloat16": "bf16"}


@dataclass
class LeverContext:
    """What the levers may look at: the model as deployed now, its device, the serving setup."""

    spec: str
    loaded: LoadedModel  # built for real (pruning needs weights)
    inputs: list[InputSpec]
    dtype: str
    device: DeviceRow
    db: KernelDB
    rate: float | None = None
    workers: int = 1
    max_batch: int = 1
    max_wait_ms: float = 0.0
    base_flops: float = 0.0
    # the subnormal values one forward pass of the model as deployed uses, counted at batch 1
    # (`profilers.subnormals`), where this CPU's slow path for them has a price; else why not
    subnormals: SubnormalUses | None = None
    subnormals_why: str = "its values were not counted"

    @property
    def model(self) -> nn.Module:
        return self.loaded.model


@dataclass
class Variant:
    """One setting of a lever; unset fields mean "as the baseline"."""

    lever: str
    label: str
    params: dict[str, Any]
    build: Callable[[], nn.Module] | None = None  # the transformed real model
    spec: str | None = None  # another model spec (a smaller family member)
    inputs: list[InputSpec] | None = None
    dtype: str | None = None
    channels_last: bool = False
    device_id: str | None = None  # another profile of this hardware (threads)
    threads: int | None = None
    batch: int | None = None  # requests per model call, without --rate
    serving: dict[str, Any] | None = None  # workers, max_batch, max_wait_ms under --rate
    # Wraps a model so it takes the baseline's inputs (for fidelity/eval of input levers).
    wrap: Callable[[nn.Module], nn.Module] | None = None
    flush_denormal: bool = False  # subnormals read and written as zero (a CPU setting)
    notes: list[str] = field(default_factory=list)
    _model: nn.Module | None = None

    def model(self, base: nn.Module) -> nn.Module:
        """The real model this variant runs (built once)."""
        if self._model is None:
            if self.build is not None:
                self._model = self.build()
            elif self.spec is not None:
                from profilers.specs import load_model

                self._model = load_model(self.spec, inputs=self.inputs).model
            else:
                self._model = base
        return self._model

    @property
    def changes_model(self) -> bool:
        """Whether the function computed changes (so accuracy must be checked)."""
        return any((self.build, self.spec, self.inputs, self.dtype, self.flush_denormal))


@dataclass(frozen=True)
class Lever:
    name: str
    title: str
    risk_level: int
    risk: str
    effort_level: int
    effort: str
    variants: Callable[[LeverContext], list[Variant] | str]  # a str says why it does not apply
    best_only: bool = False  # show only its best variant (a search grid)


# ------------------------------------------------------------------------------ wrappers


class CastInputs(nn.Module):
    """Runs `model` in `dtype` on float32 inputs and returns float32 outputs (for comparing)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, *args: Any) -> Any:
        cast = [a.to(self.dtype) if torch.is_tensor(a) and a.is_floating_point() else a
                for a in args]
        return _to_float(self.model(*cast))


class ResizeInputs(nn.Module):
    """Downscales image inputs (bilinear) or truncates token inputs before `model`: the first
    input and every other shaped like it (two frames; token ids and their attention mask)."""

    def __init__(self, model: nn.Module, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.model, self.shape = model, shape

    def forward(self, x: torch.Tensor, *rest: Any) -> Any:
        first = x.shape
        return self.model(*(self._resize(t) if torch.is_tensor(t) and t.shape == first else t
                            for t in (x, *rest)))

    def _resize(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.shape) == 2:  # token ids, and a mask shaped like them even if it is float
            return x[:, : self.shape[1]]
        return nn.functional.interpolate(x, size=self.shape[2:], mode="bilinear",
                                         align_corners=False)


def _to_float(out: Any) -> Any:
    if torch.is_tensor(out):
        return out.float() if out.is_floating_point() else out
    if isinstance(out, (tuple, list)):
        return type(out)(_to_float(o) for o in out)
    if isinstance(out, dict):
        return {k: _to_float(v) for k, v in out.items()}
    return out


# --------------------------------------------------------------------- variants per lever


def prune_variants(ctx: LeverContext) -> list[Variant] | str:
    if prunable_sites(ctx.model) == 0:
        return ("no prunable block (ResNet blocks, inverted residuals, conv/linear chains in "
                "nn.Sequential)")
    return [Variant("prune", f"prune {int(r * 100)}%", {"ratio": r},
                    build=lambda r=r: prune_model(ctx.model, r)[0]) for r in PRUNE_RATIOS]


def precision_variants(ctx: LeverContext) -> list[Variant] | str:
    if ctx.dtype != "float32":
        return f"already runs in {ctx.dtype}"
    isa = set(ctx.device.fingerprint.get("isa", []))
    if ctx.device.kind == "cpu":
        if not isa & CPU_BF16_FLAGS:
            return "this CPU has no native bf16 (avx512_bf16/amx_bf16); bf16 would be emulated"
        choices = ["bfloat16"]
    else:
        sm = max((int(f[3:]) for f in isa if f.startswith("sm_") and f[3:].isdigit()),
                 default=0)
        choices = ["float16", "bfloat16"] if sm >= 80 else ["float16"]
    return [Variant("precision", _SHORT[d], {"dtype": d}, dtype=d) for d in choices]


def int8_variants(ctx: LeverContext) -> list[Variant] | str:
    if ctx.device.kind != "cpu":
        return "torch.ao dynamic int8 runs on CPU only"
    if ctx.dtype != "float32":
        return "dynamic int8 quantization starts from a float32 model"
    if not any(isinstance(m, nn.Linear) for m in ctx.model.modules()):
        return "no nn.Linear layers to quantize"

    def build() -> nn.Module:
        with warnings.catch_warnings():  # torch deprecates the quantized tensor constructors
            warnings.simplefilter("ignore")
            return torch.ao.quantization.quantize_dynamic(copy.deepcopy(ctx.model),
                                                          {nn.Linear}, dtype=torch.qint8)

    return [Variant("int8_dynamic", "int8 dynamic (Linear)",
                    {"dtype": "qint8", "layers": "Linear"}, build=build,
                    notes=["quantized linear ops have no profile: estimated by the stated "
                           "roofline fallback (see unmodelled)"])]


def channels_last_variants(ctx: LeverContext) -> list[Variant] | str:
    if not any(isinstance(m, nn.Conv2d) for m in ctx.model.modules()):
        return "no convolutions"
    if len(ctx.inputs[0].shape) != 4:
        return "the first input is not a 4-d image batch"

    def build() -> nn.Module:
        return copy.deepcopy(ctx.model).to(memory_format=torch.channels_last)

    return [Variant("channels_last", "channels_last", {}, build=build,
                    channels_last=True)]


def input_size_variants(ctx: LeverContext) -> list[Variant] | str:
    first = ctx.inputs[0]
    if first.is_floating and len(first.shape) == 4:
        h, w = first.shape[2:]
        sizes = sorted({(_round8(h * s), _round8(w * s)) for s in RESOLUTION_SCALES} - {(h, w)},
                       reverse=True)
        if not sizes:
            return f"the input ({h}x{w}) is already at the smallest size tried (32)"
        return [_resized(ctx, (*first.shape[:2], sh, sw), f"input {sh}x{sw}")
                for sh, sw in sizes]
    if not first.is_floating and len(first.shape) == 2 and first.shape[1] >= 16:
        n = first.shape[1]
        lengths = sorted({max(8, int(n * s)) for s in SEQUENCE_SCALES} - {n}, reverse=True)
        return [_resized(ctx, (first.shape[0], length), f"seq len {length}")
                for length in lengths]
    return "the first input is neither an image batch (NxCxHxW) nor token ids (NxL)"


def _round8(x: float) -> int:
    return max(32, int(round(x / 8.0)) * 8)


def _resized(ctx: LeverContext, shape: tuple[int, ...], label: str) -> Variant:
    first = ctx.inputs[0].shape  # inputs shaped like the first are resized with it (RAFT's frames)
    inputs = [replace(i, shape=shape) if i.shape == first else i for i in ctx.inputs]
    return Variant("input_size", label, {"shape": list(shape)}, inputs=inputs,
                   wrap=lambda m, s=shape: ResizeInputs(m, s))


def thread_variants(ctx: LeverContext) -> list[Variant] | str:
    if ctx.device.kind != "cpu":
        return "thread count is a CPU setting"
    here = _hardware(ctx.device.fingerprint)
    others = [d for d in ctx.db.list_devices()
              if d.id != ctx.device.id and d.kind == "cpu" and d.n_measured > 0
              and _hardware(ctx.db.get_device(d.id).fingerprint) == here]
    if not others:
        return ("no profile of this hardware at another thread count; run `hwlat profile "
                "--threads N` to predict it")
    return [Variant("threads", f"{d.threads} thread{'s' if d.threads != 1 else ''}",
                    {"threads": d.threads}, device_id=d.id,
                    threads=d.threads) for d in sorted(others, key=lambda d: d.threads or 0)]


def _hardware(fingerprint: dict) -> tuple:
    return tuple(str(fingerprint.get(k)) for k in ("kind", "model", "cores", "isa", "caches"))


def smaller_variants(ctx: LeverContext) -> list[Variant] | str:
    from profilers import ops
    from profilers.capture import capture_spec
    from profilers.errors import HwlatError
    from profilers.specs import family_of, list_torchvision_classification

    kind, _, name = ctx.spec.partition(":")
    if kind != "torchvision":
        return "smaller family members are listed for torchvision models only"
    family = family_of(name)
    smaller = []
    for other in list_torchvision_classification():
        if other == name or family_of(other) != family:
            continue
        try:
            captured = capture_spec(f"torchvision:{other}", inputs=ctx.inputs,
                                    device_type=ctx.device.kind, dtype=ctx.dtype)
        except HwlatError:
            continue
        flops = sum(ops.flops_of(r) for r in captured.ops)
        if flops < ctx.base_flops:
            smaller.append((flops, other))
    if not smaller:
        return f"no smaller member of the {family} family"
    chosen = sorted(smaller, reverse=True)[:MAX_SMALLER]  # the closest in size first
    return [Variant("smaller_model", other, {"spec": f"torchvision:{other}"},
                    spec=f"torchvision:{other}", inputs=ctx.inputs) for _, other in chosen]


def flush_variants(ctx: LeverContext) -> list[Variant] | str:
    if ctx.subnormals is None:
        return ctx.subnormals_why
    return [Variant("flush_subnormals", "flush subnormals to zero", {"flush_denormal": True},
                    flush_denormal=True)]


def batch_variants(ctx: LeverContext) -> list[Variant] | str:
    if ctx.rate is not None:
        return "with --rate, batching is the dynamic_batching lever"
    current = batch_of(ctx.inputs)
    return [Variant("batch", f"batch {b}", {"batch": b}, batch=b)
            for b in BATCH_SIZES if b > current]


def batching_variants(ctx: LeverContext) -> list[Variant] | str:
    if ctx.rate is None:
        return "needs a request rate (--rate) to simulate the queue"
    grid = []
    for max_batch in BATCH_SIZES:
        for wait in WINDOW_MS:
            serving = {"workers": ctx.workers, "max_batch": max_batch, "max_wait_ms": wait}
            if (max_batch, wait) != (ctx.max_batch, ctx.max_wait_ms):
                grid.append(Variant("dynamic_batching",
                                    f"batching <={max_batch}, {wait:g} ms",
                                    serving, serving=serving))
    return grid


LEVERS: dict[str, Lever] = {lever.name: lever for lever in (
    Lever("prune", "structured pruning", 3,
          "removes channels: accuracy drops until fine-tuned, more at higher ratios", 2,
          "prune + fine-tune", prune_variants),
    Lever("precision", "lower precision", 1,
          "16-bit floats round activations; fp16 can overflow, bf16 keeps fp32's range", 1,
          "one cast, no retraining", precision_variants),
    Lever("int8_dynamic", "int8 dynamic quantization", 2,
          "int8 weights/activations: outliers can lose accuracy; verify", 1,
          "torch.ao.quantize_dynamic, no retraining", int8_variants),
    Lever("channels_last", "channels_last layout", 0, "same math, another memory layout", 1,
          "one .to(memory_format=...) on model and inputs", channels_last_variants),
    Lever("input_size", "smaller input", 2,
          "less detail or context: small objects / long-range tokens suffer", 1,
          "change preprocessing", input_size_variants),
    Lever("threads", "thread count", 0, "same computation", 0,
          "torch.set_num_threads / OMP_NUM_THREADS", thread_variants),
    Lever("smaller_model", "smaller family member", 3,
          "a different network: retrain or distill, accuracy differs", 3,
          "train or distill a new model", smaller_variants),
    Lever("flush_subnormals", "flush subnormals to zero", 1,
          "values under 1.2e-38 read and written as 0: negligible beside float32's normal "
          "values, unless a model needs gradual underflow", 0,
          "torch.set_flush_denormal(True) before the first forward pass (threads copy it "
          "when they start)", flush_variants),
    Lever("batch", "larger batch", 0, "same computation", 1,
          "collect requests into one call", batch_variants),
    Lever("dynamic_batching", "dynamic batching", 0, "same computation", 1,
          "server setting: max batch and max wait window", batching_variants, best_only=True),
)}
