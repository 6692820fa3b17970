"""Op capture: the aten ops a model's forward dispatches, recorded without computing anything.

The recipe (it matched real CPU traces op for op): swap every parameter and buffer for a
FakeTensor on the *target* device type with the same shape and strides, feed fake inputs, and run
the forward under FakeTensorMode in the deployment grad mode, with a recording TorchDispatchMode
on top of the fake mode. Fake tensors claim a real device, so the eager fast paths (fused
attention in nn.TransformerEncoderLayer / nn.MultiheadAttention, channels_last kernels) take the
same branches they take for real; a meta-device model would skip them. The recorder sits above
the fake mode, so it sees exactly the calls a real run dispatches, not the fake mode's own
decompositions. The caller's model is restored afterwards: its parameters are swapped back.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from profilers.errors import CaptureError, SpecError, ValueDependentCapture
from profilers.oprecord import (
    OpRecord,
    TensorSpec,
    _channels_last_strides,
    _contiguous_strides,
    dtype_from_name,
)
from profilers.specs import InputSpec, LoadedModel, load_model

GRAD_MODES: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "inference": torch.inference_mode,  # what deployment uses: conv2d, linear, fused paths
    "no_grad": torch.no_grad,  # composite ops decompose: convolution, t + addmm
    "grad": torch.enable_grad,
}

CaptureInput = TensorSpec | torch.Tensor | InputSpec


# ---------------------------------------------------------------- recording


class _ModuleStack:
    """The dotted path of the innermost module running, kept by global forward pre/post hooks.

    Global, not per-module, hooks: nn.TransformerEncoderLayer refuses its fused fast path when a
    module carries hooks of its own, so per-module hooks would change the ops being recorded.
    The hooks only act for this model's modules on the capturing thread.
    """

    def __init__(self, model: nn.Module) -> None:
        self.paths = {id(m): name for name, m in model.named_modules()}
        self.kinds = {name: type(m).__name__ for name, m in model.named_modules()}
        self.stack: list[str] = []
        self.failed_in: dict[int, tuple[BaseException, str]] = {}  # id(exc) -> (exc, module)
        self._thread = threading.get_ident()
        self._handles = [
            register_module_forward_pre_hook(self._enter),
            register_module_forward_hook(self._leave, always_call=True),
        ]

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else ""

    def _ours(self, module: nn.Module) -> bool:
        return id(module) in self.paths and threading.get_ident() == self._thread

    def _enter(self, module: nn.Module, args: Any) -> None:
        if self._ours(module):
            self.stack.append(self.paths[id(module)])

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self._ours(module):
            return
        # always_call hooks run inside the module's `except` when forward raised: note where.
        exc = sys.exc_info()[1]
        if exc is not None:
            self.failed_in.setdefault(id(exc), (exc, self.current))
        if self.stack:
            self.stack.pop()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class _OpRecorder(TorchDispatchMode):
    """Records each aten call that reaches it as an OpRecord, tensors replaced by specs."""

    def __init__(self, modules: _ModuleStack, state: Sequence[torch.Tensor] = ()) -> None:
        super().__init__()
        self.modules = modules
        self.records: list[OpRecord] = []
        self.failed_op: dict[int, tuple[BaseException, str]] = {}  # id(exc) -> (exc, its op)
        # parameters and buffers, and views of them (weight.t() for addmm): id -> tensor, the
        # tensor kept so that its id is not reused while capturing
        self.state: dict[int, torch.Tensor] = {id(t): t for t in state}

    def _weight_bytes(self, func: Any, args: tuple, kwargs: dict, out: Any) -> int:
        seen = {id(t): t for t in _tensors([*args, *kwargs.values()]) if id(t) in self.state}
        if seen and getattr(func, "is_view", False):
            self.state.update((id(t), t) for t in _tensors(out))
        return sum(TensorSpec.of(t).nbytes for t in seen.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        try:
            shortcut = _SHORTCUTS.get(func)
            out = shortcut(args, kwargs) if shortcut else None
            if out is None:
                out = func(*args, **kwargs)
        except Exception as e:
            self.failed_op.setdefault(id(e), (e, str(func)))
            raise
        if getattr(func, "is_view", False):
            out = _with_real_view_strides(func, args, kwargs, out)
        if func.namespace != "prim":  # prim.device & co are metadata queries of subclasses
            self.records.append(OpRecord.of_call(
                func, args, kwargs, _output_specs(out), self.modules.current,
                self._weight_bytes(func, args, kwargs, out)))
        return out


def _inference_batch_norm(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """`batch_norm` at inference on CPU fake tensors, without running its decomposition.

    FakeTensorMode has no meta kernel for it and runs ATen's Python decomposition, 3-13 ms a
    call: 26 of the 79 s that capturing the training zoo took here (2220 calls). For an input
    laid out exactly contiguous or channels_last, the CPU kernel's output is contiguous when the
    input also counts as contiguous (a size-1 dim's stride is free), else channels_last (checked
    against the decomposition and the real kernel: tests/test_capture.py). None: any other case
    (training, another device, other strides, statistics that do not match the channels); the op
    then runs as usual."""
    names = ("input", "weight", "bias", "running_mean", "running_var", "training")
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    x = bound.get("input")
    if (bound.get("training", True) or not isinstance(x, FakeTensor) or x.device.type != "cpu"
            or x.dim() < 2 or bound.get("running_mean") is None):
        return None
    channels = x.shape[1]
    if any(t is not None and t.numel() != channels
           for t in (bound.get(k) for k in ("weight", "bias", "running_mean", "running_var"))):
        return None
    shape, stride = tuple(x.shape), tuple(x.stride())
    if stride == _contiguous_strides(shape):
        out_stride = stride
    elif x.dim() == 4 and stride == _channels_last_strides(shape):
        out_stride = _contiguous_strides(shape) if x.is_contiguous() else stride
    else:
        return None
    return torch.empty_strided(shape, out_stride, dtype=x.dtype, device=x.device)


_SHORTCUTS: dict[Any, Callable[[tuple, dict], Any]] = {
    torch.ops.aten.batch_norm.default: _inference_batch_norm,
}
"""Ops whose fake outputs are made here instead of by FakeTensorMode (slow for them); each
returns None where it does not apply."""


def _with_real_view_strides(func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
    """A view's output with the strides the real kernel gives it.

    A dim of size 1 addresses no memory, so its stride is free, and FakeTensorMode's Python view
    rules pick other ones than ATen's C++ kernels (1x3136x128 transposed and viewed as
    1x128x56x56: batch stride 401408 fake, 128 real). Kernels choose their path by strides: that
    real tensor is not channels_last to ATen (a size-1 dim's stride still has to be the
    largest), so a depthwise conv converts it first and took 0.6 ms in segformer where the fake
    strides replay in 0.1 ms. The meta kernels are ATen's own, so the view is redone on meta
    tensors and a fake output whose strides differ is re-strided to match."""
    outs = list(_tensors(out))
    if not any(1 in t.shape for t in outs):
        return out
    try:
        with _disable_current_modes():
            meta_args = [_meta_like(a) for a in args]
            meta_kwargs = {k: _meta_like(v) for k, v in kwargs.items()}
            meta_out = list(_tensors(func(*meta_args, **meta_kwargs)))
    except Exception:  # noqa: BLE001 - a view meta cannot redo (data-dependent): keep fake's
        return out
    if len(meta_out) != len(outs):
        return out
    fixed = [o if (o.stride(), o.storage_offset()) == (m.stride(), m.storage_offset())
             else o.as_strided(o.shape, m.stride(), m.storage_offset())
             for o, m in zip(outs, meta_out, strict=True)]
    if isinstance(out, torch.Tensor):
        return fixed[0]
    return type(out)(fixed) if isinstance(out, list | tuple) else out


def _meta_like(value: Any) -> Any:
    """A meta tensor with the same shape, strides and storage offset; other values as they are."""
    if isinstance(value, list | tuple):
        return type(value)(_meta_like(v) for v in value)
    if not isinstance(value, torch.Tensor):
        return value
    extent = 1 + sum((n - 1) * st for n, st in zip(value.shape, value.stride(), strict=True)
                     if n > 0)
    base = torch.empty(value.storage_offset() + extent, dtype=value.dtype, device="meta")
    return base.as_strided(value.shape, value.stride(), value.storage_offset())


def _output_specs(out: Any) -> list[TensorSpec]:
    """Output tensors as specs. A fused kernel returns an undefined tensor (None) for a secondary
    output it skipped, where its fake kernel returns an empty one: empty secondary outputs go."""
    specs = [TensorSpec.of(t) for t in _tensors(out)]
    return specs[:1] + [s for s in specs[1:] if s.numel]


def _tensors(out: Any) -> Iterator[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, list | tuple):
        for o in out:
            yield from _tensors(o)
    elif isinstance(out, dict):  # a module's cache
        for o in out.values():
            yield from _tensors(o)


@contextlib.contextmanager
def _recording(model: nn.Module, state: Sequence[torch.Tensor] = ()) -> Iterator[_OpRecorder]:
    """Hooks for module paths plus a recorder; the failure point is turned into a CaptureError."""
    modules = _ModuleStack(model)
    recorder = _OpRecorder(modules, state)
    try:
        with quiet_fake_tensor_log():
            yield recorder
    except CaptureError:
        raise
    except Exception as e:
        raise _capture_error(e, modules, recorder) from e
    finally:
        modules.remove()


@contextlib.contextmanager
def quiet_fake_tensor_log() -> Iterator[None]:
    """FakeTensorMode logs a full traceback for a failing meta kernel; the CaptureError says it.
    And torchvision's fake nms asks for its output size the deprecated way (its concern)."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*create_unbacked_symint", FutureWarning)
            yield
    finally:
        logger.setLevel(level)


def _capture_error(e: BaseException, modules: _ModuleStack, recorder: _OpRecorder) -> CaptureError:
    path, op = None, None
    cause: BaseException | None = e
    while cause is not None and (path is None or op is None):
        path = path if path is not None else modules.failed_in.get(id(cause), (None, None))[1]
        op = op or recorder.failed_op.get(id(cause), (None, None))[1]
        cause = cause.__cause__ or cause.__context__
    where = f"module '{path}' ({modules.kinds[path]})" if path else "the top-level forward"
    at = f" at {op}" if op else ""
    text = str(e).strip().splitlines()
    message = f"capture failed in {where}{at}: {type(e).__name__}: {text[0] if text else ''}"
    if "DataDependent" in type(e).__name__ or "DynamicOutputShape" in type(e).__name__:
        return ValueDependentCapture(f"{message} (the forward depends on tensor values; capture "
                                     "needs shape-only control flow)")
    return CaptureError(message)


# ---------------------------------------------------------------- fake tensors


def _fake(mode: FakeTensorMode, shape: Sequence[int], stride: Sequence[int],
          dtype: torch.dtype, device: torch.device) -> FakeTensor:
    elem = torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device="meta")
    return FakeTensor(mode, elem, device)


def _target_stride(t: torch.Tensor, channels_last: bool) -> tuple[int, ...]:
    # Module.to(memory_format=channels_last) converts exactly the 4-d parameters and buffers.
    if channels_last and t.dim() == 4:
        return torch.empty(t.shape, device="meta", memory_format=torch.channels_last).stride()
    return tuple(t.stride())


def _fake_state(model: nn.Module, mode: FakeTensorMode, device: torch.device, dtype: torch.dtype,
                channels_last: bool) -> list[tuple[dict, str, Any, Any]]:
    """(store, name, original, fake) for every parameter and buffer; nothing is swapped yet."""
    swaps: list[tuple[dict, str, Any, Any]] = []
    fakes: dict[int, torch.Tensor] = {}  # tied weights stay tied
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for name, t in list(store.items()):
                if t is None:
                    continue
                if id(t) not in fakes:
                    fakes[id(t)] = _fake_of(t, mode, device, dtype, channels_last)
                swaps.append((store, name, t, fakes[id(t)]))
    return swaps


def _fake_of(t: torch.Tensor, mode: FakeTensorMode, device: torch.device, dtype: torch.dtype,
             channels_last: bool) -> torch.Tensor:
    target_dtype = dtype if t.is_floating_point() else t.dtype
    fake = _fake(mode, t.shape, _target_stride(t, channels_last), target_dtype, device)
    if isinstance(t, nn.Parameter):
        # what nn.Parameter(fake) makes of a tensor subclass, without its detach: a detach
        # through the fake mode per weight took 75 of the 126 ms of mobilenet_v2's capture
        fake.requires_grad_(t.requires_grad)
        fake._is_param = True
    return fake


def _fake_input(x: CaptureInput, mode: FakeTensorMode, device: torch.device, dtype: torch.dtype,
                channels_last: bool) -> FakeTensor:
    spec = _tensor_spec(x)
    in_dtype = dtype_from_name(spec.dtype)
    in_dtype = dtype if in_dtype.is_floating_point else in_dtype
    stride = spec.stride
    if channels_last and len(spec.shape) == 4:
        stride = torch.empty(spec.shape, device="meta", memory_format=torch.channels_last).stride()
    return _fake(mode, spec.shape, stride, in_dtype, device)


def _tensor_spec(x: CaptureInput) -> TensorSpec:
    if isinstance(x, TensorSpec):
        return x
    if isinstance(x, InputSpec):
        return x.tensor_spec()
    if isinstance(x, torch.Tensor):
        return TensorSpec.of(x)
    raise CaptureError(f"a capture input must be a TensorSpec, InputSpec or tensor, got {type(x).__name__}")


# ---------------------------------------------------------------- public API


def _grad_context(grad_mode: str) -> contextlib.AbstractContextManager:
    if grad_mode not in GRAD_MODES:
        raise CaptureError(f"unknown grad mode {grad_mode!r}; use one of {', '.join(GRAD_MODES)}")
    return GRAD_MODES[grad_mode]()


def _target(device_type: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    try:
        device = torch.device(device_type)
    except RuntimeError as e:
        raise CaptureError(f"unknown device type {device_type!r}; use cpu or cuda") from e
    if device.type in ("cuda", "xpu") and device.index is None:
        device = torch.device(device.type, 0)  # no index would ask the (absent) runtime for one
    floating = getattr(torch, dtype, None)
    if not isinstance(floating, torch.dtype) or not floating.is_floating_point:
        raise CaptureError(f"capture dtype must be a floating dtype such as float32, got {dtype!r}")
    return device, floating


def capture(
    model: nn.Module,
    inputs: list[CaptureInput],
    *,
    device_type: str = "cpu",
    dtype: str = "float32",
    grad_mode: str = "inference",
    channels_last: bool = False,
) -> list[OpRecord]:
    """The aten ops `model(*inputs)` dispatches on `device_type`, computed on fake tensors only.

    Floating parameters, buffers and inputs take `dtype`; integer ones keep theirs. The model may
    be built on meta or on a real device; its parameters, buffers, submodules and attributes are
    put back as they were (`_restore_attributes`).
    """
    device, floating = _target(device_type, dtype)
    grad = _grad_context(grad_mode)
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # plain tensor attributes become constants
    try:
        swaps = _fake_state(model, mode, device, floating, channels_last)
        fake_inputs = [_fake_input(x, mode, device, floating, channels_last) for x in inputs]
    except (RuntimeError, AssertionError) as e:
        raise CaptureError(f"cannot fake tensors on {device}: {e}") from e
    attributes = _attributes(model)
    for store, name, _, fake in swaps:
        store[name] = fake
    try:
        with _recording(model, [fake for *_, fake in swaps]) as recorder, grad, mode, recorder, \
                quiet_fake_tensor_log():
            _steady_forward(model, fake_inputs, recorder)
    finally:
        for store, name, original, _ in swaps:
            store[name] = original
        _restore_attributes(model, attributes)
    return recorder.records


_REGISTERED = ("_parameters", "_buffers", "_modules")

_Snapshot = list[tuple[nn.Module, dict[str, Any], dict[str, dict], dict[str, dict | list]]]


def _attributes(model: nn.Module) -> _Snapshot:
    """Every module's plain attributes, its registered parameters, buffers and submodules, and the
    contents of its dict and list attributes (a cache the forward fills in place)."""
    return [(m, dict(m.__dict__), {k: dict(getattr(m, k)) for k in _REGISTERED},
             {k: v.copy() for k, v in m.__dict__.items()
              if k not in _REGISTERED and type(v) in (dict, list)})
            for m in model.modules()]


def _new_values(now: dict | list, then: dict | list) -> list[Any]:
    """The values of container `now` that are not (the same object) in its copy `then`."""
    if isinstance(now, dict):
        return [v for k, v in now.items() if k not in then or then[k] is not v]
    held = {id(v) for v in then}
    return [v for v in now if id(v) not in held]


def _memoised(before: _Snapshot) -> bool:
    """Whether a forward left a new tensor on its modules for the next call to reuse: LeViT's
    attention biases, gathered from their table on the first call and cached per device. A list
    rebuilt from the tensors it held (torchvision's AnchorGenerator moves its cell anchors each
    call) is not one; nor is a cache of plain values (MultiScaleRoIAlign's scales, a few small
    ops that detectors' predictions keep)."""
    for module, old, registered, containers in before:
        pairs = [(module.__dict__, old), *((getattr(module, k), registered[k]) for k in _REGISTERED),
                 *((old[name], then) for name, then in containers.items())]
        for now, then in pairs:
            held = {id(t) for t in _tensors(then)}
            if any(id(t) not in held for t in _tensors(_new_values(now, then))):
                return True
    return False


def _steady_forward(model: nn.Module, inputs: Sequence[Any], recorder: _OpRecorder) -> None:
    """Run the forward; when it cached a tensor on its modules, record a second call instead.
    A deployed model runs warm, and `hwlat evaluate` times it after warm-up: levit_128's 14
    attention-bias gathers (3.2 ms of its 17.6 ms op sum at 1 thread) run on its first call only."""
    before = _attributes(model)
    model(*inputs)
    if _memoised(before):
        recorder.records.clear()
        model(*inputs)


def _restore_attributes(model: nn.Module, before: _Snapshot) -> None:
    """Undo what the forward assigned or registered on its modules, and what it put into their
    dict and list attributes: a module that caches a tensor of its forward (torchvision RAFT
    keeps its correlation pyramid, LeViT its attention biases, some rotary embeddings register a
    buffer) would otherwise keep a fake one, and copying the model afterwards corrupted the
    heap."""
    for module, old, registered, containers in before:
        for now, then in [(module.__dict__, old),
                          *((getattr(module, k), registered[k]) for k in _REGISTERED)]:
            for name in [n for n in now if n not in then]:
                del now[name]
            for name, value in then.items():
                if now.get(name, _MISSING) is not value:
                    now[name] = value
        for name, then in containers.items():
            if isinstance(now := old[name], dict):
                now.clear()
                now.update(then)
            else:
                now[:] = then


_MISSING = object()


def record_real(
    model: nn.Module,
    inputs: list[CaptureInput],
    grad_mode: str = "inference",
    *,
    vocab: int | None = None,
) -> list[OpRecord]:
    """The aten ops of a real CPU forward of `model` (real values), recorded like `capture`."""
    grad = _grad_context(grad_mode)
    real_inputs = [_real_input(x, vocab) for x in inputs]
    state = [*model.parameters(), *model.buffers()]
    with _recording(model, state) as recorder, grad, recorder:
        _steady_forward(model, real_inputs, recorder)
    return recorder.records


def _real_input(x: CaptureInput, vocab: int | None) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, InputSpec):
        return x.make("cpu", vocab)
    spec = _tensor_spec(x)
    made = InputSpec(spec.shape, spec.dtype).make("cpu", vocab)
    if spec.stride == made.stride():
        return made
    return torch.empty_strided(spec.shape, spec.stride, dtype=made.dtype).copy_(made)


@dataclass
class CapturedModel:
    """A model spec's op list at one input setting, and how it was obtained."""

    spec: str
    family: str
    inputs: list[InputSpec]
    ops: list[OpRecord]
    built_on: str
    capture_s: float
    ran: bool = False  # recorded from one real forward pass: its control flow reads values
    note: str = ""  # how the spec built the model, when that bears on its latency


def capture_spec(
    spec: str,
    *,
    inputs: list[InputSpec | str] | None = None,
    batch: int | None = None,
    device_type: str = "cpu",
    dtype: str = "float32",
    grad_mode: str = "inference",
    channels_last: bool = False,
) -> CapturedModel:
    """Load a model spec (on meta when it can) and capture its ops; `capture_s` is the capture only.

    A model that builds on meta but cannot be captured there (a tensor attribute that is not a
    buffer stays on meta) is rebuilt on CPU and captured again. One whose forward reads tensor
    values (`.item()`, shapes that depend on values: Longformer's padding, Reformer's axial
    positions) is run once for real instead, when the target is the CPU at float32 (`ran`).
    """
    options = {"device_type": device_type, "dtype": dtype, "grad_mode": grad_mode,
               "channels_last": channels_last}
    loaded = load_model(spec, inputs=inputs, batch=batch, meta=True)
    try:
        return _timed_capture(loaded, options)
    except CaptureError as e:
        failure = e
    can_run = can_run_instead(device_type, dtype, channels_last)
    if isinstance(failure, ValueDependentCapture) and not can_run:
        raise failure  # fake tensors fail it on any build; a real run would time other ops
    if loaded.built_on == "meta":
        try:
            loaded = load_model(spec, inputs=inputs, batch=batch, meta=False)
        except SpecError as e:  # too large to build for real: say why it was needed
            raise SpecError(f"{str(failure).rstrip('.')} (without weights); with weights: "
                            f"{e}") from e
        if not isinstance(failure, ValueDependentCapture):
            try:
                return _timed_capture(loaded, options)
            except CaptureError as e:
                failure = e
    if not isinstance(failure, ValueDependentCapture):
        raise failure
    # the forward reads tensor values (`.item()`, data-dependent shapes): run it once for real
    start = time.perf_counter()
    ops = record_real(loaded.model, list(loaded.inputs), grad_mode, vocab=loaded.vocab)
    return CapturedModel(loaded.spec, loaded.family, loaded.inputs, ops, loaded.built_on,
                         time.perf_counter() - start, ran=True, note=loaded.note)


def can_run_instead(device_type: str, dtype: str, channels_last: bool) -> bool:
    """Whether one real forward here runs the ops the target would: CPU, float32, plain layout."""
    return device_type == "cpu" and dtype == "float32" and not channels_last


def capture_or_run(model: nn.Module, inputs: list[CaptureInput], *, device_type: str = "cpu",
                   dtype: str = "float32", channels_last: bool = False,
                   vocab: int | None = None) -> tuple[list[OpRecord], bool]:
    """(ops, ran): `capture` on fake tensors, or, for a forward that reads tensor values (a
    detector's NMS, Longformer's padding), one real run where `can_run_instead`. For a model
    already built for real; `capture_spec` also handles specs built on meta."""
    try:
        return capture(model, inputs, device_type=device_type, dtype=dtype,
                       channels_last=channels_last), False
    except ValueDependentCapture:
        if not can_run_instead(device_type, dtype, channels_last):
            raise
    return record_real(model, inputs, vocab=vocab), True


def _timed_capture(loaded: LoadedModel, options: dict[str, Any]) -> CapturedModel:
    start = time.perf_counter()
    ops = capture(loaded.model, list(loaded.inputs), **options)
    elapsed = time.perf_counter() - start
    return CapturedModel(loaded.spec, loaded.family, loaded.inputs, ops, loaded.built_on, elapsed,
                         note=loaded.note)
