"""One captured operator call: the aten op, its arguments with tensors as specs, its outputs.

An `OpRecord` is the unit everything else works on: capture produces them, the op benchmark
replays them, the kernel database stores them under their `key`, the predictor turns them into
features. Tensors are replaced by `TensorSpec` (shape, strides, dtype, device), so a record is
plain data that round-trips through JSON exactly.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import torch

_DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16,
    "qint8": 1, "quint8": 1, "qint32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> "float32"."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    return getattr(torch, name)


@dataclass(frozen=True)
class TensorSpec:
    """What an op needs to know about a tensor argument, without its values."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    device: str = "cpu"
    storage_offset: int = 0

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSpec:
        return cls(
            shape=tuple(int(s) for s in t.shape),
            stride=tuple(int(s) for s in t.stride()),
            dtype=dtype_name(t.dtype),
            device=t.device.type,
            storage_offset=int(t.storage_offset()),
        )

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return _DTYPE_BYTES.get(self.dtype, 4)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def memory_format(self) -> str:
        """"channels_last" for 4-d NHWC-strided tensors, "contiguous", or "strided"."""
        if self.numel <= 1:
            return "contiguous"
        if self.stride == _contiguous_strides(self.shape):
            return "contiguous"
        if len(self.shape) == 4 and self.stride == _channels_last_strides(self.shape):
            return "channels_last"
        return "strided"

    def to_json(self) -> dict:
        d = {"shape": list(self.shape), "stride": list(self.stride), "dtype": self.dtype,
             "device": self.device}
        if self.storage_offset:
            d["offset"] = self.storage_offset
        return {"__tensor__": d}

    @classmethod
    def from_json(cls, d: dict) -> TensorSpec:
        t = d["__tensor__"]
        return cls(tuple(t["shape"]), tuple(t["stride"]), t["dtype"], t.get("device", "cpu"),
                   t.get("offset", 0))


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def _channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def encode(value: Any) -> Any:
    """A Python/torch argument value as JSON-able data; tensors must already be TensorSpecs."""
    if isinstance(value, TensorSpec):
        return value.to_json()
    if isinstance(value, torch.Tensor):
        return TensorSpec.of(value).to_json()
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"__float__": repr(value)}
        return value
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if isinstance(value, torch.dtype):
        return {"__dtype__": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"__device__": value.type}
    if isinstance(value, torch.memory_format):
        return {"__memory_format__": str(value).removeprefix("torch.")}
    if isinstance(value, torch.layout):
        return {"__layout__": str(value).removeprefix("torch.")}
    if isinstance(value, dict):
        return {"__dict__": {k: encode(v) for k, v in value.items()}}
    return {"__repr__": repr(value)}


def decode(value: Any) -> Any:
    """Inverse of `encode`: TensorSpecs stay specs, torch enums come back as torch objects."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        return TensorSpec.from_json(value)
    if "__float__" in value:
        return float(value["__float__"])
    if "__dtype__" in value:
        return dtype_from_name(value["__dtype__"])
    if "__device__" in value:
        return torch.device(value["__device__"])
    if "__memory_format__" in value:
        return getattr(torch, value["__memory_format__"])
    if "__layout__" in value:
        return getattr(torch, value["__layout__"])
    if "__dict__" in value:
        return {k: decode(v) for k, v in value["__dict__"].items()}
    if "__repr__" in value:
        return value["__repr__"]
    return value


def spec_value(value: Any) -> Any:
    """An argument as `encode`-compatible plain data: tensors become TensorSpecs."""
    if isinstance(value, torch.Tensor):
        return TensorSpec.of(value)
    if isinstance(value, list | tuple):
        return [spec_value(v) for v in value]
    if isinstance(value, torch.device):
        return torch.device(value.type)  # the index is placement, not part of the config
    if isinstance(value, bool | int | float | str | torch.dtype | torch.memory_format | torch.layout):
        return value
    if value is None:
        return None
    return repr(value)


def tensors_in(value: Any) -> list[TensorSpec]:
    """Every TensorSpec inside a nested argument structure, in order."""
    if isinstance(value, TensorSpec):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def _with_first_tensor(value: Any, fn: Callable[[TensorSpec], TensorSpec], done: list[bool]) -> Any:
    """`value` with `fn` applied to its first TensorSpec of two or more dims (in order)."""
    if done[0]:
        return value
    if isinstance(value, TensorSpec):
        if len(value.shape) >= 2:
            done[0] = True
            return fn(value)
        return value
    if isinstance(value, list | tuple):
        return type(value)(_with_first_tensor(v, fn, done) for v in value)
    if isinstance(value, dict):
        return {k: _with_first_tensor(v, fn, done) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class OpRecord:
    """One aten op call as captured: `op` is the overload name, e.g. "aten.convolution.default"."""

    op: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    outputs: tuple[TensorSpec, ...] = ()
    module: str = ""  # dotted path of the innermost nn.Module that issued the call, "" if unknown
    # bytes of the model's parameters and buffers among the inputs (capture fills it; like
    # `module`, it describes the call site, not the config, and is not part of the key)
    weight_bytes: int = 0

    @classmethod
    def of_call(cls, func: Any, args: tuple, kwargs: dict, outputs: Iterable[TensorSpec],
                module: str, weight_bytes: int = 0) -> OpRecord:
        """One dispatched aten call, its tensor arguments replaced by specs (`spec_value`)."""
        return cls(op=str(func), args=tuple(spec_value(a) for a in args),
                   kwargs={k: spec_value(v) for k, v in kwargs.items()}, outputs=tuple(outputs),
                   module=module, weight_bytes=weight_bytes)

    @cached_property
    def inputs(self) -> list[TensorSpec]:
        return tensors_in(list(self.args)) + tensors_in(self.kwargs)

    @cached_property
    def config_json(self) -> str:
        """The canonical description of what is timed: op, arguments, kwargs (not the module)."""
        body = {"op": self.op, "args": encode(list(self.args)), "kwargs": encode(self.kwargs)}
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @cached_property
    def key(self) -> str:
        """Stable id of the config: the same op with the same argument specs has the same key."""
        return hashlib.sha1(self.config_json.encode()).hexdigest()[:20]

    @cached_property
    def batch_key(self) -> tuple[str, int] | None:
        """(key of the config with its batch left open, the batch): the same op at another batch
        size has the same batch key. The batch is dim 0 of the first input of two or more dims
        (a conv's or a linear layer's activation, mm's rows) and of every output; None when the
        outputs do not share it."""
        firsts = [t for t in self.inputs if len(t.shape) >= 2]
        if not firsts or not self.outputs:
            return None
        n = firsts[0].shape[0]
        if n < 1 or any(not o.shape or o.shape[0] != n for o in self.outputs):
            return None

        def open_batch(t: TensorSpec) -> TensorSpec:
            return replace(t, shape=(-1, *t.shape[1:]))

        args = _with_first_tensor(list(self.args), open_batch, done := [False])
        kwargs = _with_first_tensor(self.kwargs, open_batch, done)
        body = {"op": self.op, "args": encode(args), "kwargs": encode(kwargs),
                "outputs": encode([open_batch(o) for o in self.outputs])}
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha1(text.encode()).hexdigest()[:20], n

    @property
    def dtype(self) -> str:
        """The dtype of the first floating input (else of the first input, else of the output)."""
        specs = self.inputs or list(self.outputs)
        for t in specs:
            if t.dtype.startswith(("float", "bfloat")):
                return t.dtype
        return specs[0].dtype if specs else "none"

    @property
    def device_type(self) -> str:
        specs = self.inputs or list(self.outputs)
        return specs[0].device if specs else "cpu"

    def to_json(self) -> dict:
        return {
            "op": self.op,
            "args": encode(list(self.args)),
            "kwargs": encode(self.kwargs),
            "outputs": [o.to_json() for o in self.outputs],
            "module": self.module,
            "weight_bytes": self.weight_bytes,
        }

    @classmethod
    def from_json(cls, d: dict) -> OpRecord:
        return cls(
            op=d["op"],
            args=tuple(decode(d["args"])),
            kwargs=decode(d.get("kwargs", {})),
            outputs=tuple(TensorSpec.from_json(o) for o in d.get("outputs", [])),
            module=d.get("module", ""),
            weight_bytes=int(d.get("weight_bytes", 0)),
        )
