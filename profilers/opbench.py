"""Replaying one captured op for real: tensors with the recorded shapes, strides and dtypes.

`materialize` turns an OpRecord's TensorSpecs into real tensors (the registry's `make_inputs`
hook makes integer inputs valid, e.g. embedding indices below the table size); `op_callable`
binds them to the aten overload so a timer can call it repeatedly. Timing itself is
`profilers.timer.measure`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from profilers import ops
from profilers.errors import ReplayError
from profilers.oprecord import OpRecord, TensorSpec, dtype_from_name

# The C++ guard behind torch.inference_mode(): entering it costs ~0.4 us per call instead of
# ~1.1 us for the Python context manager, which would otherwise be timed with every small op.
_inference_guard = getattr(torch._C, "_InferenceMode", None) or (lambda on: torch.inference_mode(on))


def _storage_elems(spec: TensorSpec) -> int:
    """Elements the strided view reaches, from its storage offset on."""
    if any(s == 0 for s in spec.shape):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(spec.shape, spec.stride, strict=True))


def real_tensor(spec: TensorSpec, device: str, gen: torch.Generator) -> torch.Tensor:
    """A tensor with exactly `spec`'s shape, strides and storage offset, filled with values.

    Floats are standard normal (no overflow in exp, fp16 matmuls stay finite), integers are 1
    (valid as masks, divisors and ids; index inputs are redrawn by the registry's hook), bools
    random. The values fill the whole storage, so broadcast (stride 0) specs work too.
    """
    dtype = dtype_from_name(spec.dtype)
    n = spec.storage_offset + _storage_elems(spec)
    if dtype.is_floating_point or dtype.is_complex:
        base = torch.randn(n, generator=gen, device=device, dtype=dtype)
    elif dtype == torch.bool:
        base = torch.randint(0, 2, (n,), generator=gen, device=device).bool()
    else:
        base = torch.ones(n, device=device, dtype=dtype)
    t = torch.empty(0, device=device, dtype=dtype)
    with torch.no_grad():
        t.set_(base.untyped_storage(), spec.storage_offset, spec.shape, spec.stride)
    return t


def _real(value: Any, device: str, gen: torch.Generator) -> Any:
    if isinstance(value, TensorSpec):
        return real_tensor(value, device, gen)
    if isinstance(value, list | tuple):
        return type(value)(_real(v, device, gen) for v in value)
    if isinstance(value, dict):
        return {k: _real(v, device, gen) for k, v in value.items()}
    if isinstance(value, torch.device):
        return torch.device(device)  # the recorded device type becomes the replay device
    return value


def materialize(record: OpRecord, device: str = "cpu", *, seed: int = 0) -> tuple[list, dict]:
    """Real (args, kwargs) for `record` on `device`; integer inputs made valid by the registry."""
    gen = torch.Generator(device=device).manual_seed(seed)
    args = [_real(a, device, gen) for a in record.args]
    kwargs = {k: _real(v, device, gen) for k, v in record.kwargs.items()}
    info = ops.lookup(record.op)
    if info is not None and info.make_inputs is not None:
        with torch.no_grad():
            info.make_inputs(record, ops.bind(record.op, args, kwargs), gen)
    return args, kwargs


def _check_replayable(record: OpRecord) -> None:
    info = ops.lookup(record.op)
    if info is not None and not info.replayable:
        raise ReplayError(f"{record.op} is not replayable: its output sizes depend on the input "
                          "values; it is estimated, not timed")


def op_callable(record: OpRecord, device: str = "cpu", *, seed: int = 0) -> Callable[[], object]:
    """A no-argument callable running the recorded op on fresh real inputs, in inference mode
    (as capture records it: composite ops such as conv2d stay whole)."""
    _check_replayable(record)
    try:
        fn = ops.resolve_overload(record.op)
    except Exception as e:
        raise ReplayError(str(e)) from e
    args, kwargs = materialize(record, device, seed=seed)

    def call() -> object:
        with _inference_guard(True):
            return fn(*args, **kwargs)

    return call


def _output_tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, list | tuple):
        return [t for v in out for t in _output_tensors(v)]
    return []


def _same_layout(got: TensorSpec, want: TensorSpec) -> bool:
    """Shape, dtype and the strides of every dimension longer than 1 (others are arbitrary)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    return all(a == b for a, b, s in zip(got.stride, want.stride, want.shape, strict=True) if s > 1)


def replay_outputs(record: OpRecord, device: str = "cpu") -> list[TensorSpec]:
    """The specs of the outputs a real replay of `record` produces."""
    call = op_callable(record, device)
    try:
        out = call()
    except Exception as e:  # any kernel error means this config cannot be timed
        raise ReplayError(f"{record.op} failed on real inputs: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}") from e
    return [TensorSpec.of(t) for t in _output_tensors(out)]


def check_replay(record: OpRecord, device: str = "cpu") -> None:
    """Raise ReplayError unless the op replays and its outputs match the recorded specs."""
    got = replay_outputs(record, device)
    want = list(record.outputs)
    if len(got) != len(want) or not all(_same_layout(g, w) for g, w in zip(got, want, strict=True)):
        show = lambda specs: [(s.shape, s.stride, s.dtype) for s in specs]  # noqa: E731
        raise ReplayError(f"{record.op} replays to {show(got)}, recorded {show(want)}")
