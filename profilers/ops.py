"""The op registry: each aten op's family, FLOP and byte counters, and feature extractor.

One dict (`REGISTRY`) maps an op name to an `OpInfo`, as fvcore's flop counter maps op names to
handlers. Keys are either a full overload name ("aten.add.Tensor") or an overload packet
("aten.add", covering every overload); `lookup` tries the full name first, so a user can override
one overload or a whole packet with `register(..., override=True)`. An op that is not registered is
"unknown": it is never treated as free, and `fallback_info` gives it a stated estimate.

Conventions (one multiply-add = 2 FLOPs, as in `torch.utils.flop_counter`):
- conv, matmul and attention count only their multiply-adds: bias adds, softmax and the
  elementwise parts of fused layers are not counted, so the numbers match PyTorch's flop counter.
- elementwise, norm, pool and reduce ops count a fixed number of FLOPs per element, listed in
  `ELTWISE_FLOPS_PER_ELEM`, `NORM_FLOPS_PER_ELEM`, `REDUCE_FLOPS_PER_ELEM` and the pool counters.
- bytes_moved is what the kernel must read plus what it writes, from the TensorSpecs: a
  broadcast (stride 0) input is read once, views move nothing, ops that only write their first
  argument (fill_, zero_, copy_) do not read it, and gathers read only the rows they pick.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from profilers.errors import HwlatError
from profilers.oprecord import (
    OpRecord,
    TensorSpec,
    _channels_last_strides,
    _contiguous_strides,
    _with_first_tensor,
    dtype_from_name,
    tensors_in,
)

FAMILIES = ("conv", "matmul", "attention", "rnn", "pool", "norm", "eltwise", "reduce", "data",
            "free")
UNKNOWN = "unknown"

Features = dict[str, float]
InputsHook = Callable[[OpRecord, dict[str, Any], torch.Generator | None], None]


def _zero(record: OpRecord) -> float:
    return 0.0


def _no_features(record: OpRecord) -> Features:
    return {}


def _no_path_features(record: OpRecord, threads: int | None) -> Features:
    return {}


@dataclass(frozen=True)
class OpInfo:
    """What hwlat knows about one op.

    `free` ops (views, metadata) cost 0 by definition and are still counted in n_ops;
    `free_when` makes an op free only for some calls (a reshape that is a view, an eval-mode
    dropout). `make_inputs` fills real replay tensors in place with values the kernel accepts
    (valid indices, positive inputs to log/sqrt); it receives the op's schema-bound arguments.
    `dense_input`: ATen copies a first input that is neither contiguous nor channels_last into
    one of those before the kernel runs (`dense_input_split`).
    `path_features`: features of the kernel ATen picks for the call, which can depend on the
    device's thread count as well as the shapes (`conv_path_features`); NaN where unknown.
    """

    family: str
    flops: Callable[[OpRecord], float] = _zero
    bytes_moved: Callable[[OpRecord], float] | None = None  # None: default_bytes
    features: Callable[[OpRecord], Features] = _no_features
    path_features: Callable[[OpRecord, int | None], Features] = _no_path_features
    free: bool = False
    replayable: bool = True
    make_inputs: InputsHook | None = None
    free_when: Callable[[OpRecord], bool] | None = None
    dense_input: bool = False  # the kernel runs on a dense copy of a strided input (see below)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise HwlatError(f"unknown op family {self.family!r}; use one of {', '.join(FAMILIES)}")


# --------------------------------------------------------------------------- schema binding

def split_op_name(op: str) -> tuple[str, str, str]:
    """"aten.add.Tensor" -> ("aten", "add", "Tensor"); a packet name gets overload "default"."""
    parts = op.split(".")
    if len(parts) == 2:
        return parts[0], parts[1], "default"
    if len(parts) != 3:
        raise HwlatError(f"op name {op!r} is not of the form namespace.name.overload")
    return parts[0], parts[1], parts[2]


def resolve_overload(op: str) -> torch._ops.OpOverload:
    """The torch OpOverload named by `op`, e.g. torch.ops.aten.convolution.default."""
    ns, name, overload = split_op_name(op)
    if ns == "torchvision":  # its ops exist once it is imported (a profile child may not have)
        import torchvision  # noqa: F401
    try:
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, RuntimeError) as e:
        raise HwlatError(f"no torch operator {op!r} in torch {torch.__version__}") from e


@cache
def _schema_args(op: str) -> tuple[tuple[str, bool, bool, Any], ...]:
    """(name, kwarg_only, has_default, default) per schema argument; () if the op is unknown."""
    try:
        schema = resolve_overload(op)._schema
    except HwlatError:
        return ()
    return tuple((a.name, a.kwarg_only, a.has_default_value(),
                  a.default_value if a.has_default_value() else None) for a in schema.arguments)


def bind(op: str, args: tuple | list, kwargs: dict) -> dict[str, Any]:
    """Arguments by schema name, defaults filled in; works for TensorSpecs and real tensors."""
    bound: dict[str, Any] = {}
    positional = [a for a in _schema_args(op) if not a[1]]
    for (name, _, _, _), value in zip(positional, args, strict=False):
        bound[name] = value
    for name, _, has_default, default in _schema_args(op):
        if name not in bound:
            bound[name] = kwargs.get(name, default if has_default else None)
    return bound


def bound(record: OpRecord) -> dict[str, Any]:
    return bind(record.op, record.args, record.kwargs)


def _prod(xs: Any) -> int:
    return math.prod(int(x) for x in xs)


def _pair(v: Any, n: int = 2, default: int = 1) -> list[int]:
    """A conv/pool int-or-list argument expanded to n values (the last n if longer)."""
    if v is None or (isinstance(v, list | tuple) and len(v) == 0):
        return [default] * n
    if isinstance(v, int | float):
        return [int(v)] * n
    vals = [int(x) for x in v]
    return ([vals[0]] * (n - len(vals)) + vals)[-n:] if len(vals) < n else vals[-n:]


# --------------------------------------------------------------------------- bytes

def unique_bytes(t: TensorSpec) -> int:
    """Bytes a kernel must touch to read `t`: broadcast (stride 0) dimensions are read once."""
    return t.itemsize * _prod(s for s, st in zip(t.shape, t.stride, strict=True) if st != 0)


def _reads(record: OpRecord) -> list[TensorSpec]:
    """Input tensors, without an `out=` buffer (it is written, counted with the outputs)."""
    if not _schema_args(record.op):
        return record.inputs
    return [t for k, v in bound(record).items() if k != "out" for t in tensors_in(v)]


def default_bytes(record: OpRecord) -> float:
    return float(sum(unique_bytes(t) for t in _reads(record))
                 + sum(t.nbytes for t in record.outputs))


def _write_only_bytes(record: OpRecord) -> float:
    """fill_/zero_/copy_: the first argument is overwritten, never read."""
    rest = _reads(record)[1:]
    return float(sum(unique_bytes(t) for t in rest) + sum(t.nbytes for t in record.outputs))


def _gather_bytes(record: OpRecord) -> float:
    """embedding/index/gather read the picked rows (as many bytes as written) plus the indices."""
    b = bound(record)
    idx = [t for k in ("indices", "index") for t in tensors_in(b.get(k))]
    out = sum(t.nbytes for t in record.outputs)
    return float(sum(unique_bytes(t) for t in idx) + 2 * out)


def _alloc_bytes(record: OpRecord) -> float:
    """empty-like allocations write nothing."""
    return 0.0


def _out_bytes(record: OpRecord) -> float:
    """Factory ops (zeros, full, arange) write their output and read nothing."""
    return float(sum(t.nbytes for t in record.outputs))


def bytes_of(record: OpRecord, info: OpInfo | None = None) -> float:
    info = info if info is not None else (lookup(record.op) or fallback_info())
    if is_free(record, info):
        return 0.0
    return (info.bytes_moved or default_bytes)(record)


# --------------------------------------------------------------------------- conv

def conv_flops(record: OpRecord) -> float:
    """2 * N * prod(weight.shape) * prod(out spatial) (prod(in spatial) when transposed)."""
    b = bound(record)
    x, w = b["input"], b["weight"]
    spatial = x.shape[2:] if b.get("transposed") else record.outputs[0].shape[2:]
    batch = x.shape[0] if len(x.shape) == len(w.shape) else 1  # unbatched conv: (C, H, W)
    return 2.0 * batch * _prod(w.shape) * _prod(spatial)


def _conv_padding(b: dict, k: list[int], dil: list[int], n: int) -> list[float]:
    pad = b.get("padding")
    if pad == "valid":
        return [0.0] * n
    if pad == "same":
        return [((kk - 1) * d) / 2 for kk, d in zip(k, dil, strict=True)]
    return [float(p) for p in _pair(pad, n, 0)]


def _align(n: int, cap: int = 64) -> float:
    """The largest power of two dividing `n`, up to `cap`: kernels vectorise over channels in
    blocks of 8 or 16, and a count off the block runs a slower path (a 3x3 depthwise conv on
    56x56 took 0.47 ns an element with 144 channels and 1.1 ns with 72 or 108, 1 thread)."""
    n = int(n)
    return float(min(n & -n, cap)) if n > 0 else 0.0


def conv_features(record: OpRecord) -> Features:
    b = bound(record)
    x, w, out = b["input"], b["weight"], record.outputs[0]
    nd = len(w.shape) - 2
    batched = len(x.shape) == len(w.shape)
    xs, os_ = (x.shape[1:], out.shape[1:]) if batched else (x.shape, out.shape)
    # 1-d convs have W=1; 3-d convs fold their depth into D
    hw = list(xs[1:])[-2:] if nd >= 2 else [xs[1], 1]
    ohw = list(os_[1:])[-2:] if nd >= 2 else [os_[1], 1]
    transposed = bool(b.get("transposed"))
    groups = int(b.get("groups") or 1)
    cin = xs[0]
    cout = os_[0]
    k = [int(s) for s in w.shape[2:]]
    stride, dil = _pair(b.get("stride"), nd), _pair(b.get("dilation"), nd)
    pad = _conv_padding(b, k, dil, nd)
    return {
        "N": x.shape[0] if batched else 1, "Cin": cin, "Cout": cout,
        "D": _prod(xs[1:-2]) if nd == 3 else 1, "H": hw[0], "W": hw[1],
        "Hout": ohw[0], "Wout": ohw[1],
        "kh": k[-2] if nd >= 2 else k[0], "kw": k[-1] if nd >= 2 else 1,
        "kd": k[0] if nd == 3 else 1,
        "stride_h": stride[-2] if nd >= 2 else stride[0], "stride_w": stride[-1] if nd >= 2 else 1,
        "pad_h": pad[-2] if nd >= 2 else pad[0], "pad_w": pad[-1] if nd >= 2 else 0,
        "dilation_h": dil[-2] if nd >= 2 else dil[0], "dilation_w": dil[-1] if nd >= 2 else 1,
        "groups": groups, "depthwise": float(groups > 1 and groups == cin),
        "channels_per_group": cin / groups, "transposed": float(transposed),
        "has_bias": float(isinstance(b.get("bias"), TensorSpec)), "spatial_dims": nd,
        "weight_channels_last": float(w.memory_format == "channels_last"),
        "Cin_align": _align(cin), "Cout_align": _align(cout),
    }


def conv_path_features(record: OpRecord, threads: int | None) -> Features:
    """`native_path`: 1 where ATen runs the conv on its own im2col + GEMM kernels (slow_conv2d,
    slow_conv3d, their dilated and transposed kinds), 0 where on oneDNN; NaN off the CPU or
    without a thread count. ATen picks by shape and thread count (`_select_conv_backend`): an
    unstrided 1x1 conv below batch 16 at 1 thread, a batch-1 conv with kernels of at most 3 on
    at most 20480 input elements in its first four dims. The native kernels are much slower at
    the same FLOPs (1 thread here: a 3x3x3 conv3d 16->16 on 1x16x8x56x56 32.7 ms against 3.5 ms a
    sample at batch 2; a 3x3 conv 256->256 on 7x7 0.74 against 0.31 ms). Given to the conv model,
    its grouped-CV MAPE went from 15.3% to 12.8% (1 thread, 3306 configs) and 22.4% to 20.9%
    (2 threads, 2823 configs).

    `reorder_bytes`: what oneDNN's per-call weight reorder moves (reads the plain-format weights,
    writes them blocked: twice their bytes), 0 on the native path. Eager PyTorch keeps no blocked
    copy, so every call pays it, at about the device's copy bandwidth (ONEDNN_VERBOSE, 1 thread,
    10.5 GB/s copies: 0.13-0.23 ms a MB of 3x3-7x7 weights, 0.11 for 1x1; 2 threads, 20.4 GB/s:
    0.05-0.13). It dominates a batch-1 conv with big weights on a small image: 1024->1024 3x3 on
    7x7, 0.93 GFLOP and 37.7 MB of weights, reordered in 7.6 ms of its 14.6."""
    arg = record.args[0] if record.args else None
    if threads is None or not isinstance(arg, TensorSpec) or arg.device != "cpu":
        return {"native_path": float("nan"), "reorder_bytes": float("nan")}
    base = split_op_name(record.op)[1]
    if base.startswith(("slow_", "thnn_", "mkldnn_")):
        native = float(not base.startswith("mkldnn_"))
    else:
        native = _native_conv(record, threads)
    w = bound(record)["weight"]
    return {"native_path": native, "reorder_bytes": (1.0 - native) * 2.0 * w.numel * w.itemsize}


def _native_conv(record: OpRecord, threads: int) -> float:
    b = bound(record)
    x, w = b["input"], b["weight"]
    nd = len(w.shape) - 2
    shape = tuple(x.shape) if len(x.shape) == len(w.shape) else (1, *x.shape)
    transposed = bool(b.get("transposed")) or "transpose" in record.op
    pad = [int(p) for p in _conv_padding(b, [int(k) for k in w.shape[2:]],
                                         _pair(b.get("dilation"), nd), nd)]
    return _native_backend(shape, tuple(w.shape), x.dtype, tuple(_pair(b.get("stride"), nd)),
                           tuple(pad), tuple(_pair(b.get("dilation"), nd)), transposed,
                           tuple(_pair(b.get("output_padding"), nd, 0)),
                           int(b.get("groups") or 1), threads)


@cache
def _native_backend(x: tuple, w: tuple, dtype: str, stride: tuple, pad: tuple, dilation: tuple,
                    transposed: bool, output_padding: tuple, groups: int, threads: int) -> float:
    """Ask ATen which backend it would run, on stride-0 stand-ins (nothing is allocated)."""
    select = getattr(torch._C, "_select_conv_backend", None)
    if select is None:
        return float("nan")
    dt = dtype_from_name(dtype)
    before = torch.get_num_threads()
    try:
        if before != threads:
            torch.set_num_threads(threads)
        chosen = select(torch.empty(1, dtype=dt).expand(*x), torch.empty(1, dtype=dt).expand(*w),
                        None, list(stride), list(pad), list(dilation), transposed,
                        list(output_padding), groups, None)
    except (RuntimeError, TypeError, ValueError):
        return float("nan")
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
    return float(str(chosen).rsplit(".", 1)[-1].startswith("Slow"))


# --------------------------------------------------------------------------- matmul

def _mnk(record: OpRecord) -> tuple[float, float, float, float]:
    """(batch, M, N, K) of a matrix product; einsum is handled separately."""
    base = split_op_name(record.op)[1]
    b = bound(record)
    if base == "einsum":
        return _einsum_mnk(b["equation"], b["tensors"])
    if base == "linear":
        x, w = b["input"], b["weight"]
        return 1.0, float(_prod(x.shape[:-1])), float(w.shape[0]), float(w.shape[-1])
    a, m2 = _matmul_operands(b)
    k = a.shape[-1]
    m = a.shape[-2] if len(a.shape) >= 2 else 1
    n = m2.shape[-1] if len(m2.shape) >= 2 else 1
    out = record.outputs[0].numel if record.outputs else m * n
    return float(out // max(m * n, 1)), float(m), float(n), float(k)


def _matmul_operands(b: dict) -> tuple[TensorSpec, TensorSpec]:
    for pair in (("mat1", "mat2"), ("batch1", "batch2"), ("self", "mat2"), ("self", "other"),
                 ("self", "vec"), ("mat", "vec"), ("self", "tensor"), ("input", "other")):
        if isinstance(b.get(pair[0]), TensorSpec) and isinstance(b.get(pair[1]), TensorSpec):
            return b[pair[0]], b[pair[1]]
    raise HwlatError(f"cannot find the matrix operands in {sorted(b)}")


def _einsum_letters(equation: str, operands: list) -> tuple[list[str], str, dict[str, int]]:
    """Operand subscripts, output subscripts and each letter's size ('...' expanded)."""
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    n_ell = max((len(t.shape) - len(term.replace("...", ""))
                 for term, t in zip(terms, operands, strict=True) if "..." in term), default=0)
    ell = "".join(chr(0x100 + i) for i in range(n_ell))  # stand-ins that cannot clash
    sizes: dict[str, int] = {}
    expanded = []
    for term, t in zip(terms, operands, strict=True):
        if "..." in term:
            term = term.replace("...", ell[n_ell - (len(t.shape) - len(term) + 3):])
        for c, s in zip(term, t.shape, strict=True):
            sizes[c] = max(sizes.get(c, 1), int(s))
        expanded.append(term)
    if arrow:
        return expanded, rhs.replace("...", ell), sizes
    once = sorted(c for c in sizes if c not in ell and sum(e.count(c) for e in expanded) == 1)
    return expanded, ell + "".join(once), sizes


def _einsum_mnk(equation: str, operands: list) -> tuple[float, float, float, float]:
    terms, out, sizes = _einsum_letters(equation, operands)
    if len(terms) != 2:
        return 1.0, float(_prod(sizes.values())), 1.0, 1.0
    a, b = set(terms[0]), set(terms[1])
    size = lambda letters: float(_prod(sizes[c] for c in letters))  # noqa: E731
    return (size(a & b & set(out)), size((a - b) & set(out)), size((b - a) & set(out)),
            size((a & b) - set(out)))


def matmul_flops(record: OpRecord) -> float:
    batch, m, n, k = _mnk(record)
    return 2.0 * batch * m * n * k


def matmul_features(record: OpRecord) -> Features:
    batch, m, n, k = _mnk(record)
    b = bound(record)
    ops = [t for t in record.inputs if len(t.shape) >= 2][-2:]
    has_bias = isinstance(b.get("bias"), TensorSpec) or split_op_name(record.op)[1] in (
        "addmm", "baddbmm", "addbmm", "addmv")
    # a stride-1 last dim means row-major; otherwise the operand is read transposed (t()+addmm)
    trans = [float(t.stride[-1] != 1 and t.shape[-1] > 1) for t in ops] + [0.0, 0.0]
    return {"batch": batch, "M": m, "N": n, "K": k, "has_bias": float(has_bias),
            "a_transposed": trans[0], "b_transposed": trans[1], "N_align": _align(n),
            "K_align": _align(k)}


# --------------------------------------------------------------------------- attention

def _attention_dims(record: OpRecord) -> Features:
    b = bound(record)
    base = split_op_name(record.op)[1]
    if base in ("_native_multi_head_attention", "_transformer_encoder_layer_fwd"):
        return _fused_attention_dims(record, b, base)
    q, k, v = b["query"], b["key"], b["value"]
    if base in ("_flash_attention_forward", "_efficient_attention_forward"):
        # (B, L, H, E) layout
        batch, lq, heads, e = q.shape[0], q.shape[1], q.shape[2], q.shape[3]
        lk, ev = k.shape[1], v.shape[-1]
    else:  # (..., H, L, E); 3-d inputs have one head
        lead = q.shape[:-2]
        heads = lead[-1] if len(lead) >= 2 else 1
        batch = _prod(lead) // max(heads, 1)
        lq, e, lk, ev = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    mask = b.get("attn_mask", b.get("attn_bias", b.get("bias")))
    causal = b.get("is_causal") or b.get("custom_mask_type") == 1
    return {"batch": batch, "heads": heads, "Lq": lq, "Lk": lk, "head_dim": e, "head_dim_v": ev,
            "causal": float(bool(causal)), "has_mask": float(isinstance(mask, TensorSpec)),
            "embed_dim": float("nan"), "ffn_dim": float("nan"), "fused_layer": 0.0}


def _fused_attention_dims(record: OpRecord, b: dict, base: str) -> Features:
    """nn.MultiheadAttention / nn.TransformerEncoderLayer fast paths, batch_first (B, L, D)."""
    q = b["query"] if base == "_native_multi_head_attention" else b["src"]
    k = b["key"] if base == "_native_multi_head_attention" else q
    d, heads = int(b["embed_dim"]), int(b["num_heads"] if "num_heads" in b else b["num_head"])
    lead = q.shape[:-2]
    ffn = b["ffn_weight_1"].shape[0] if isinstance(b.get("ffn_weight_1"), TensorSpec) else None
    return {"batch": _prod(lead), "heads": heads, "Lq": q.shape[-2], "Lk": k.shape[-2],
            "head_dim": d // heads, "head_dim_v": d // heads, "causal": 0.0,
            "has_mask": float(isinstance(b.get("mask"), TensorSpec)), "embed_dim": d,
            "ffn_dim": float(ffn) if ffn is not None else float("nan"),
            "fused_layer": 2.0 if ffn is not None else 1.0}


def attention_flops(record: OpRecord) -> float:
    """QK^T and AV (2*B*H*Lq*Lk*(E+Ev)); fused layers add their projections and FFN."""
    f = _attention_dims(record)
    bh = f["batch"] * f["heads"]
    core = 2.0 * bh * f["Lq"] * f["Lk"] * (f["head_dim"] + f["head_dim_v"])
    if not f["fused_layer"]:
        return core
    d, bt = f["embed_dim"], f["batch"]
    proj = 2.0 * bt * d * d * (f["Lq"] + 2 * f["Lk"]) + 2.0 * bt * f["Lq"] * d * d
    ffn = 4.0 * bt * f["Lq"] * d * f["ffn_dim"] if f["fused_layer"] == 2 else 0.0
    return core + proj + ffn


# --------------------------------------------------------------------------- rnn

RNN_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _rnn_dims(record: OpRecord) -> Features:
    """Whole recurrent layers (aten.lstm/gru/rnn_*): `.input` takes a (T, B, I) or batch-first
    tensor, `.data` a packed (tokens, I) one with per-step batch sizes."""
    b = bound(record)
    base = split_op_name(record.op)[1]
    packed = isinstance(b.get("data"), TensorSpec)
    x = b["data"] if packed else b["input"]
    weights = [t for t in b.get("params") or () if isinstance(t, TensorSpec) and len(t.shape) == 2]
    gates = RNN_GATES.get(base, 1)
    hidden = weights[0].shape[0] / gates if weights else 0.0
    tokens = x.numel / max(x.shape[-1], 1)
    if packed:
        steps = float(b["batch_sizes"].shape[0]) if isinstance(b.get("batch_sizes"), TensorSpec) else tokens
    elif len(x.shape) == 3:
        steps = float(x.shape[1] if b.get("batch_first") else x.shape[0])
    else:
        steps = float(x.shape[0])  # unbatched (T, I): a direct aten call (nn.LSTM adds the batch)
    layers, bidirectional = float(b.get("num_layers") or 1), float(bool(b.get("bidirectional")))
    return {"tokens": tokens, "steps": steps, "batch": tokens / max(steps, 1.0),
            "input_size": float(x.shape[-1]), "hidden": hidden, "gates": float(gates),
            "layers": layers, "bidirectional": bidirectional,
            "weight_numel": float(sum(t.numel for t in weights)), "packed": float(packed),
            # cell updates that wait on each other, each a small matmul and a few gate kernels
            "serial_steps": steps * layers * (1.0 + bidirectional)}


def rnn_flops(record: OpRecord) -> float:
    """The gate matmuls: every token meets every weight matrix of every layer and direction once
    (2 flops per weight); the gates' elementwise work is small beside them."""
    f = _rnn_dims(record)
    return 2.0 * f["tokens"] * f["weight_numel"]


# --------------------------------------------------------------------------- pool

# timed on activation-like inputs (`_activation_inputs`): their speed depends on the values
MAX_POOLS = ("max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices",
             "max_pool3d_with_indices", "adaptive_max_pool1d", "adaptive_max_pool2d",
             "adaptive_max_pool3d", "mkldnn_max_pool2d")


def _pool_dims(record: OpRecord) -> Features:
    b = bound(record)
    x, out = b["self"] if "self" in b else b["input"], record.outputs[0]
    base = split_op_name(record.op)[1]
    nd = 3 if "3d" in base else 1 if "1d" in base else 2
    batched = len(x.shape) == nd + 2
    n, c = (x.shape[0], x.shape[1]) if batched else (1, x.shape[0])
    sp, osp = list(x.shape[-nd:]), list(out.shape[-nd:])
    hw = (sp + [1])[-2:] if nd == 1 else sp[-2:]
    ohw = (osp + [1])[-2:] if nd == 1 else osp[-2:]
    adaptive = base.startswith(("adaptive", "_adaptive"))
    if adaptive:
        kernel = [-(-i // max(o, 1)) for i, o in zip(hw, ohw, strict=True)]
        stride = [i // max(o, 1) for i, o in zip(hw, ohw, strict=True)]
        pad = [0, 0]
    else:
        kernel = (_pair(b["kernel_size"], nd) + [1])[:2] if nd == 1 else _pair(b["kernel_size"], nd)[-2:]
        st = b.get("stride")
        stride = kernel if not st else ((_pair(st, nd) + [1])[:2] if nd == 1 else _pair(st, nd)[-2:])
        pad = ((_pair(b.get("padding"), nd, 0) + [0])[:2] if nd == 1
               else _pair(b.get("padding"), nd, 0)[-2:])
    return {"N": n, "C": c, "D": _prod(sp[:-2]) if nd == 3 else 1, "H": hw[0], "W": hw[1],
            "Hout": ohw[0], "Wout": ohw[1], "kernel_h": kernel[0], "kernel_w": kernel[1],
            "kernel_d": _pair(b.get("kernel_size"), 3)[0] if nd == 3 and not adaptive else 1,
            "stride_h": stride[0], "stride_w": stride[1], "pad_h": pad[0], "pad_w": pad[1],
            "adaptive": float(adaptive), "is_max": float("max" in base),
            "channels_last": float(x.memory_format == "channels_last")}


def pool_flops(record: OpRecord) -> float:
    """One FLOP per window element per output (a compare or an add), one more per output for avg."""
    f = _pool_dims(record)
    out = record.outputs[0].numel
    per_out = f["kernel_h"] * f["kernel_w"] * f["kernel_d"] + (0 if f["is_max"] else 1)
    return float(out * per_out)


# --------------------------------------------------------------------------- norm

NORM_FLOPS_PER_ELEM = {
    "batch_norm": 4,        # (x - mean) * invstd * w + b with running stats
    "batch_norm_train": 7,  # plus sum and sum of squares for the batch statistics
    "layer_norm": 7,        # sum, sum of squares, then sub, mul, mul, add (+1 for the variance)
    "group_norm": 7,
    "instance_norm": 7,
    "rms_norm": 4,          # square, sum, mul, mul
}


def _norm_kind(record: OpRecord) -> str:
    base = split_op_name(record.op)[1].lstrip("_")
    b = bound(record)
    for kind in ("batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm"):
        if kind in base:
            training = b.get("training", b.get("train"))
            if kind == "batch_norm" and training and "no_training" not in base:
                return "batch_norm_train"
            return kind
    return "layer_norm"


def norm_flops(record: OpRecord) -> float:
    x = record.inputs[0]
    return float(NORM_FLOPS_PER_ELEM[_norm_kind(record)] * x.numel)


def norm_features(record: OpRecord) -> Features:
    b = bound(record)
    x = record.inputs[0]
    kind = _norm_kind(record)
    n = x.shape[0] if x.shape else 1
    c = x.shape[1] if len(x.shape) > 1 else 1
    groups = float(b.get("group", b.get("num_groups")) or 1) if "group" in kind else 1.0
    if kind.startswith("batch_norm") or kind == "instance_norm":
        normalized = x.numel / max(c, 1) if kind.startswith("batch") else x.numel / max(n * c, 1)
    elif kind == "group_norm":
        normalized = x.numel / max(n * groups, 1)
    else:
        normalized = float(_prod(b.get("normalized_shape") or x.shape[-1:]))
    return {"numel": x.numel, "normalized_size": normalized, "N": n, "C": c, "groups": groups,
            "has_weight": float(isinstance(b.get("weight"), TensorSpec)),
            "training": float(kind == "batch_norm_train"),
            "kind": float(list(NORM_FLOPS_PER_ELEM).index(kind))}


# --------------------------------------------------------------------------- eltwise / reduce / data

ELTWISE_FLOPS_PER_ELEM = {
    # arithmetic, comparisons and selections: one operation per output element
    **{k: 1 for k in (
        "add", "sub", "rsub", "mul", "div", "neg", "abs", "relu", "relu6", "clamp", "clamp_min",
        "clamp_max", "hardtanh", "maximum", "minimum", "where", "masked_fill", "eq", "ne", "lt",
        "le", "gt", "ge", "logical_not", "logical_and", "logical_or", "bitwise_not",
        "bitwise_and", "bitwise_or", "sign", "floor", "ceil", "round", "trunc", "remainder",
        "fmod", "floor_divide", "threshold", "square", "pow", "triu", "tril", "isnan", "isinf",
        "dropout", "feature_dropout", "alpha_dropout", "native_dropout", "type_as",
        "bitwise_xor", "logical_xor", "__and__", "__or__", "__xor__",
    )},
    # two operations: fused multiply-adds and piecewise-linear activations
    **{k: 2 for k in ("addcmul", "addcdiv", "lerp", "leaky_relu", "prelu", "_prelu_kernel")},
    "hardsigmoid": 3, "hardswish": 4,
    # transcendental functions, counted as 4 (a polynomial evaluation)
    **{k: 4 for k in ("exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "rsqrt",
                      "reciprocal", "sigmoid", "tanh", "erf", "sin", "cos", "softplus", "elu",
                      "selu", "celu", "logit", "tan", "atan", "atan2", "asin", "acos", "sinh",
                      "cosh", "asinh", "acosh", "atanh")},
    "silu": 5,   # sigmoid + mul
    "glu": 5,    # sigmoid of one half times the other, per output element
    "gelu": 8,   # 0.5 * x * (1 + erf(x / sqrt 2)), or its tanh form
    "mish": 9,   # x * tanh(softplus(x))
}
REDUCE_FLOPS_PER_ELEM = {
    "softmax": 5, "_softmax": 5, "log_softmax": 5, "_log_softmax": 5,  # max, sub, exp, sum, div/log
    "linalg_vector_norm": 2, "norm": 2, "std": 3, "var": 3, "var_mean": 3, "std_mean": 3,
    "logsumexp": 5,
    "_weight_norm": 3, "_weight_norm_interface": 3,  # square-sum over the weight, then scale it
}


def op_kind(op: str) -> str:
    """"aten.add_.Tensor" -> "aten.add": the op whatever its overload or in-place form."""
    namespace, name, _ = split_op_name(op)
    return f"{namespace}.{name if name.startswith('__') else name.rstrip('_')}"


def _base_name(record: OpRecord) -> str:
    """"aten.add_.Tensor" -> "add" (in-place and out variants count like the plain op)."""
    return op_kind(record.op).split(".", 1)[1]


def eltwise_flops(record: OpRecord) -> float:
    out = record.outputs[0].numel if record.outputs else 0
    return float(ELTWISE_FLOPS_PER_ELEM.get(_base_name(record), 1) * out)


def reduce_flops(record: OpRecord) -> float:
    """Per input element; sort/topk count n*log2(size of the sorted dim)."""
    x = record.inputs[0]
    base = _base_name(record)
    if base in ("sort", "topk", "argsort"):
        return float(x.numel * math.log2(max(_reduce_size(record), 2)))
    return float(REDUCE_FLOPS_PER_ELEM.get(base, 1) * x.numel)


def _reduced_dims(record: OpRecord) -> list[int] | None:
    """The dims a reduction (or scan) runs over, non-negative; None where the op has no dim."""
    b = bound(record)
    x = record.inputs[0] if record.inputs else None
    if x is None or "dim" not in b:
        return None
    nd = max(len(x.shape), 1)
    dims = b["dim"]
    if dims is None or (isinstance(dims, list | tuple) and not dims):  # None or []: all of them
        return list(range(nd))
    return [d % nd for d in ([dims] if isinstance(dims, int) else dims)]


def _reduce_size(record: OpRecord) -> float:
    """Number of elements combined into each output (nan when the op does not reduce)."""
    dims = _reduced_dims(record)
    if dims is None:
        return float("nan")
    shape = record.inputs[0].shape or (1,)
    return float(_prod(shape[d] for d in dims))


def _reduces_inner(record: OpRecord) -> float:
    """1 where the reduced (or scanned) dims include the innermost one, 0 where they run across
    rows: cumsum over dim 1 of 8x128x256 took 1.04 ms at 1 thread, 0.17x what the model trained
    on innermost scans said. NaN where the op has no dim."""
    dims = _reduced_dims(record)
    if dims is None:
        return float("nan")
    return float(max(len(record.inputs[0].shape), 1) - 1 in dims)


def generic_features(record: OpRecord) -> Features:
    ins = record.inputs
    out = record.outputs[0] if record.outputs else None
    numel_out = float(out.numel) if out else 0.0
    return {
        "numel_in": float(max((t.numel for t in ins), default=0)),
        "numel_in_total": float(sum(t.numel for t in ins)),
        "numel_out": numel_out, "n_tensor_inputs": float(len(ins)),
        "ndim_out": float(len(out.shape)) if out else 0.0,
        "reduce_size": _reduce_size(record) if family_of(record.op) == "reduce" else float("nan"),
        "reduce_inner": (_reduces_inner(record) if family_of(record.op) == "reduce"
                         else float("nan")),
        "broadcast": float(any(0 in t.stride and t.numel > 1 for t in ins)
                           or any(t.numel < numel_out for t in ins)),
        "inputs_contiguous": float(all(t.memory_format == "contiguous" for t in ins)),
        "output_contiguous": float(out is None or out.memory_format == "contiguous"),
        "in_place": float(split_op_name(record.op)[1].endswith("_") or "out" in record.kwargs),
        "flops_per_elem": flops_of(record) / numel_out if numel_out else 0.0,
        "log_gather_stride": _log_gather_stride(ins[0] if ins else None, out),
        "gather_stride_pow2": _gather_stride_pow2(ins[0] if ins else None, out),
        "log_gather_footprint": _log_gather_footprint(ins[0] if ins else None, out),
        "op_code": op_code(record),
    }


def op_code(record: OpRecord) -> float:
    """Which op this is, as a number trees can split on: its base name's CRC-32 mod 10007
    (stable across processes and versions; a rare collision only merges two ops). These
    families share one model across many ops whose sizes say little of their cost (hardswish on
    1x36x2940 was predicted at 21x its time): given the op, the eltwise model's grouped-CV MAPE
    went from 19.4% to 10.2% (1 thread, 2203 configs of 12 ops), reduce 20.1% to 18.3%, data
    28.3% to 26.9%."""
    return float(zlib.crc32(_base_name(record).encode()) % 10007)


def _gather_stride(x: TensorSpec | None, out: TensorSpec | None) -> int | None:
    """How far apart, in elements, the input elements are that the output writes next to each
    other; None where input and output shapes differ."""
    if x is None or out is None or x.shape != out.shape or not out.shape:
        return None
    inner = min((d for d, n in enumerate(out.shape) if n > 1),
                key=lambda d: out.stride[d], default=None)
    return abs(x.stride[inner]) if inner is not None else 1


def _log_gather_stride(x: TensorSpec | None, out: TensorSpec | None) -> float:
    """log2 of `_gather_stride`: 0 for a plain copy, large for a transposing one (1x128x56x56
    from a transposed sequence reads every 128th element and took 0.43 ms, where the data model
    trained without such copies said 0.04 ms). NaN where input and output shapes differ."""
    stride = _gather_stride(x, out)
    return math.log2(max(1, stride)) if stride is not None else float("nan")


def _gather_stride_pow2(x: TensorSpec | None, out: TensorSpec | None) -> float:
    """log2 of the largest power of two dividing the gather stride in bytes, at most 16.

    Rows a power-of-two number of bytes apart fall in the same few cache sets, so a gather
    across them misses far more: transposing a 1x1024xC sequence took 3.27 ms at C=1024 and
    0.71 ms at C=1040, 1.18 against 0.35 at 512 and 520, 0.48 against 0.27 for 3136x128 and
    3136x136 (1 thread). NaN where input and output shapes differ."""
    stride = _gather_stride(x, out)
    if stride is None or x is None:  # (x is None only where stride is; for the type checker)
        return float("nan")
    stride_bytes = max(1, stride) * x.itemsize
    return float(min(16, (stride_bytes & -stride_bytes).bit_length() - 1))


CACHE_LINE_BYTES = 64


def _log_gather_footprint(x: TensorSpec | None, out: TensorSpec | None) -> float:
    """log2 of the bytes of input a copy reads before it reads from one cache line again: the
    output's dims from the innermost out, multiplying in each one that reads a line apart from
    the last, until one steps within a line (where the next pass over the inner dims finds the
    lines it just read).

    A 2-D transpose steps within a line at its second dim (1024x1024: 1024 lines, 64 KiB); a
    reversal of three dims only at its third. XLNet's weight copy, 1024x16x64 to 64x16x1024,
    passes over 16384 lines (1 MiB, beyond L2) before the first comes round again, and took 5.3 ms
    against 3.3 for the 2-D transpose of the same 1M floats; `log_gather_stride` and
    `gather_stride_pow2` are the same for both (1 thread). 6 (one line) for a contiguous read,
    NaN where input and output shapes differ."""
    if x is None or out is None or x.shape != out.shape or not out.shape:
        return float("nan")
    lines = 1
    for d in sorted((d for d, n in enumerate(out.shape) if n > 1), key=lambda d: out.stride[d]):
        if abs(x.stride[d]) * x.itemsize < CACHE_LINE_BYTES:
            break
        lines *= out.shape[d]
    return math.log2(lines * CACHE_LINE_BYTES)


# per output element and sampled dimension, by interpolation_mode: bilinear, nearest, bicubic
GRID_SAMPLER_FLOPS = {0: 4, 1: 0, 2: 16}


def grid_sampler_flops(record: OpRecord) -> float:
    """Interpolating at every output point: per sampled dimension, like `upsample_flops`."""
    mode = record.args[2] if len(record.args) > 2 and isinstance(record.args[2], int) else 0
    dims = 3 if "3d" in _base_name(record) else 2
    return float(GRID_SAMPLER_FLOPS.get(mode, 4) * dims * record.outputs[0].numel)


ROI_SAMPLES = 4
"""Bilinear samples per output element of roi_align when its sampling ratio is adaptive (0):
ceil(box side / output side) per dimension, which for boxes of 4-24 feature cells pooled to 7x7
(`_roi_inputs`, and FPN levels assigned by box size) is about 2 x 2."""


def roi_align_flops(record: OpRecord) -> float:
    """Per output element, `sampling_ratio`^2 bilinear samples of 4 multiply-adds each."""
    ratio = bound(record).get("sampling_ratio") or 0
    samples = ratio * ratio if ratio > 0 else ROI_SAMPLES
    return float(8 * samples * record.outputs[0].numel)


NMS_IOU_FLOPS = 12  # intersection, union and the comparison of one pair of boxes


def nms_flops(record: OpRecord) -> float:
    """Every kept box is compared with the boxes after it that are still in: about
    K * (N - K / 2) overlaps for N boxes of which K are kept, plus sorting the scores."""
    n = record.inputs[0].shape[0] if record.inputs and record.inputs[0].shape else 0
    k = record.outputs[0].numel if record.outputs else 0
    return float(NMS_IOU_FLOPS * k * max(n - k / 2, 0) + n * math.log2(max(n, 2)))


def upsample_flops(record: OpRecord) -> float:
    """Linear interpolation: 4 FLOPs per output element per interpolated dimension."""
    base = _base_name(record)
    if "nearest" in base:
        return 0.0
    nd = 1 if "linear1d" in base else 3 if "trilinear" in base else 2
    return float(4 * nd * record.outputs[0].numel)


def upsample_path_features(record: OpRecord, threads: int | None) -> Features:
    """`kernel_path`: 1 where ATen resamples a 2-D map with its channels-last kernel, 0 where with
    the generic one. It picks the channels-last kernel for a channels-last input of more than 3
    channels, or whenever the output's height plus width is at most 128 (UpSampleKernel.cpp,
    `_use_vectorized_kernel_cond_2d`); a contiguous input is then copied to channels-last and
    back. At 1 thread here, nearest x2 of 1x128 channels to 62x62, 64x64 and 66x66 took 0.81,
    1.86 and 0.22 ms; bilinear 0.82, 1.90, 0.71. NaN off the CPU and for other dimensions."""
    x = record.inputs[0] if record.inputs else None
    out = record.outputs[0] if record.outputs else None
    if x is None or out is None or x.device != "cpu" or len(x.shape) != 4:
        return {"kernel_path": float("nan")}
    channels_last = x.memory_format == "channels_last" and x.shape[1] > 3
    return {"kernel_path": float(channels_last or out.shape[-2] + out.shape[-1] <= 128)}


# --------------------------------------------------------------------------- conditional views

def _meta(t: TensorSpec) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride, dtype=torch.float32, device="meta")


def _view_possible(record: OpRecord) -> bool:
    """reshape/flatten: a view when the input's strides allow it (the same test torch applies)."""
    x, out = record.inputs[0], record.outputs[0]
    try:
        _meta(x).view(out.shape)
    except RuntimeError:
        return False
    return True


def _already_contiguous(record: OpRecord) -> bool:
    fmt = bound(record).get("memory_format") or torch.contiguous_format
    return _meta(record.inputs[0]).is_contiguous(memory_format=fmt)


def _same_tensor(record: OpRecord) -> bool:
    """to()/type_as(): returns its input when nothing changes and no copy was asked for."""
    return (not bound(record).get("copy")) and bool(record.outputs) and \
        record.outputs[0] == record.inputs[0]


def _dropout_is_identity(record: OpRecord) -> bool:
    b = bound(record)
    return not b.get("train") or not b.get("p")


def is_free(record: OpRecord, info: OpInfo | None = None) -> bool:
    """Free by definition (views, metadata), or for this call (a reshape that is a view)."""
    info = info if info is not None else lookup(record.op)
    if info is None:
        return False
    return info.free or (info.free_when is not None and info.free_when(record))


def record_family(record: OpRecord) -> str:
    """The family of this call: "free" for conditional views that are views here."""
    info = lookup(record.op)
    if info is None:
        return UNKNOWN
    return "free" if is_free(record, info) else info.family


# --------------------------------------------------------------------------- input hooks

def _fill_indices(t: Any, high: int, gen: torch.Generator | None) -> None:
    """Valid indices in the whole storage: an expanded (stride-0) index such as GPT-2's position
    ids cannot be written through the view itself."""
    if isinstance(t, torch.Tensor) and not t.dtype.is_floating_point and t.dtype != torch.bool:
        storage = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
        storage.random_(0, max(int(high), 1), generator=gen)


def _embedding_inputs(record: OpRecord, b: dict[str, Any], gen: torch.Generator | None) -> None:
    _fill_indices(b["indices"], b["weight"].shape[0], gen)


def _dim_index_inputs(record: OpRecord, b: dict[str, Any], gen: torch.Generator | None) -> None:
    """index_select/gather/scatter: indices below the size of `dim` of self."""
    x = b["self"]
    size = x.shape[b["dim"] % max(x.dim(), 1)] if x.dim() else 1
    _fill_indices(b["index"], size, gen)


def _index_inputs(record: OpRecord, b: dict[str, Any], gen: torch.Generator | None) -> None:
    """x[i0, i1, ...]: each integer index below its dim; a bool mask gets as many Trues as the
    recorded output selected, so the replayed output has the recorded shape."""
    x, pos = b["self"], 0
    for idx in b["indices"]:
        if idx is None:
            pos += 1
            continue
        if idx.dtype == torch.bool:
            n_true = record.outputs[0].numel * idx.numel() // max(x.numel(), 1) if record.outputs else 0
            idx.zero_().view(-1)[:n_true] = True
            pos += idx.dim()
            continue
        _fill_indices(idx, x.shape[pos], gen)
        pos += 1


def _positive_inputs(record: OpRecord, b: dict[str, Any], gen: torch.Generator | None) -> None:
    """log/sqrt/rsqrt/pow of negative numbers give NaN: time them on positive inputs."""
    for v in b.values():
        if isinstance(v, torch.Tensor) and v.dtype.is_floating_point:
            v.abs_().add_(0.5)


def _grid_inputs(record: OpRecord, b: dict[str, Any], gen: torch.Generator | None) -> None:
    """grid_sampler reads where its grid points; a normal grid puts most points outside [-1, 1]
    (padding, nothing read), while a model's grid (RAFT, spatial transformers) covers the image."""
    grid = b.get("grid")
    if isinstance(grid, torch.Tensor) and grid.dtype.is_floating_point:
        grid.uniform_(-1, 1, generator=gen)


ROI_CELLS = (4, 24)  # side of a random region of interest, in feature-map cells


def _roi_inputs(record: OpRecord, b: dict[str, Any], gen: torch.Generator | None) -> None:
    """roi_align reads the boxes it is given: each row of `rois` becomes (image index, x1, y1,
    x2, y2) in image coordinates, a box `ROI_CELLS` feature cells a side inside the map (what
    a detector's proposals are on the FPN level their size selects)."""
    x, rois, scale = b["input"], b["rois"], float(b.get("spatial_scale") or 1.0)
    if not isinstance(rois, torch.Tensor) or rois.numel() == 0 or x.dim() != 4:
        return
    k, (n, _, h, w) = rois.shape[0], x.shape

    def uniform(size: float) -> torch.Tensor:
        return torch.rand(k, generator=gen, device=rois.device, dtype=rois.dtype) * size

    lo, hi = ROI_CELLS
    side_w = (lo + uniform(hi - lo)).clamp(max=max(w - 1, 1))
    side_h = (lo + uniform(hi - lo)).clamp(max=max(h - 1, 1))
    x1, y1 = uniform(1.0) * (w - side_w).clamp(min=0), uniform(1.0) * (h - side_h).clamp(min=0)
    rois[:, 0] = torch.randint(0, max(n, 1), (k,), generator=gen, device=rois.device).to(rois.dtype)
    rois[:, 1:] = torch.stack([x1, y1, x1 + side_w, y1 + side_h], dim=1) / scale


def _nms_inputs(record: OpRecord, b: dict[str, Any], gen: torch.Generator | None) -> None:
    """Boxes that non-maximum suppression reduces to the recorded count K, as a detector's do.

    K boxes on a grid whose neighbours overlap below the threshold (half of it, as IoU), in a
    random score order; the other N - K are shifted copies of them (overlap above the threshold)
    scoring below their original, so each is suppressed by it and exactly K remain. Disjoint
    boxes with exact copies, all kept ones scoring first, ran 2.6x faster than a Faster R-CNN's
    own boxes (N 1000, K 751: 1.06 ms against 2.7 ms): the kernel's branches then never miss.
    """
    dets, scores = b["dets"], b["scores"]
    n = dets.shape[0] if isinstance(dets, torch.Tensor) and dets.dim() == 2 else 0
    k = min(record.outputs[0].numel if record.outputs else n, n)
    if n == 0 or k == 0:
        return
    threshold = min(max(float(b.get("iou_threshold") or 0.5), 0.05), 0.95)
    half = threshold / 2  # IoU o / (2 - o) of two boxes overlapping a share o of their side
    spacing = 10.0 * (1 - 2 * half / (1 + half))
    shift = 10.0 * 0.3 * (1 - threshold) / (1 + threshold)  # IoU well above the threshold

    def rand(m: int) -> torch.Tensor:
        return torch.rand(m, generator=gen, device=dets.device, dtype=torch.float32)

    side = math.ceil(math.sqrt(k))
    i = torch.arange(k, device=dets.device)
    x1, y1 = (i % side).float() * spacing, (i // side).float() * spacing
    kept = torch.stack([x1, y1, x1 + 10, y1 + 10], dim=1)
    kept_scores = rand(k)
    original = torch.randint(0, k, (n - k,), generator=gen, device=dets.device)
    offset = (rand(n - k) * 2 - 1) * shift
    copies = kept[original] + torch.stack([offset, offset.flip(0), offset, offset.flip(0)], 1)
    order = torch.randperm(n, generator=gen, device=dets.device)
    dets[order] = torch.cat([kept, copies]).to(dets.dtype)
    scores[order] = torch.cat([kept_scores, kept_scores[original] * rand(n - k)]).to(scores.dtype)


def _one_hot_inputs(record: OpRecord, b: dict[str, Any], gen: torch.Generator | None) -> None:
    _fill_indices(b["self"], b.get("num_classes") or 2, gen)


ACTIVATION_BIAS_STD = 2.0  # spread of the per-channel offsets of `_activation_inputs`


def _activation_inputs(record: OpRecord, b: dict[str, Any], gen: torch.Generator | None) -> None:
    """Max pooling branches on every comparison, so its speed depends on the values: time it on
    what it sees inside a model, not on noise.

    Its input is almost always a ReLU output whose channels differ: some nearly all zero, some
    nearly all positive (about a third each in the max-pool inputs of googlenet, squeezenet,
    alexnet, vgg11 and inception_v3). Standard-normal inputs made the 24 distinct max pools of
    those models a median 1.31x as slow as on their real activations (1 thread; 1.29x at 2).
    `relu(z + b_c)`, with one offset `b_c ~ N(0, 2^2)` per channel, lands at a median 1.04x
    (1.05x at 2 threads); an image-facing stem pool, whose input is still uniform noise when the
    model is fed noise, runs 0.81-0.87x of its real time on it.
    """
    x = b.get("self")
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.numel() == 0:
        return
    spatial = int(next((ch for ch in record.op if ch in "123"), "2"))
    channel_dim = max(x.dim() - spatial - 1, 0)
    offsets = torch.randn(x.shape[channel_dim], generator=gen, dtype=torch.float32,
                          device=x.device) * ACTIVATION_BIAS_STD
    shape = [1] * x.dim()
    shape[channel_dim] = x.shape[channel_dim]
    noise = torch.randn(x.shape, generator=gen, dtype=torch.float32, device=x.device)
    x.copy_((noise + offsets.view(shape)).relu_())


# --------------------------------------------------------------------------- hidden copies

def dense_input_split(record: OpRecord) -> tuple[OpRecord, OpRecord] | None:
    """(the copy ATen makes of a strided first input, the op on that dense copy), or None.

    A conv whose input is a transposed token sequence (segformer, mobilevit at batch 1) is not
    channels_last to ATen, so the kernel first copies it, inside the one dispatched op: a 3x3
    depthwise conv on 1x128x56x56 took 0.60 ms on such an input against 0.17 ms on a contiguous
    one. A layer norm copies a strided input the same way (`_build_registry`). A model trained
    on dense inputs cannot see that copy, so the two parts are predicted separately; a measured
    config needs no split (its timing holds the copy)."""
    info = lookup(record.op)
    ins = record.inputs
    if info is None or not info.dense_input or not ins or ins[0].memory_format != "strided":
        return None
    x = ins[0]
    weight = ins[1] if len(ins) > 1 else None
    fmt = "channels_last" if (weight is not None and len(x.shape) == 4
                              and weight.memory_format == "channels_last") else "contiguous"
    copy = _dense_copy(x, fmt, record.module)
    dense = copy.outputs[0]
    done = [False]  # the activation is the first tensor of two or more dims, as in batch_key
    on_dense = replace(record, args=_with_first_tensor(record.args, lambda _: dense, done),
                       kwargs=_with_first_tensor(record.kwargs, lambda _: dense, done))
    return copy, on_dense


def _dense_copy(x: TensorSpec, fmt: str, module: str) -> OpRecord:
    """The copy of `x` into a dense tensor of memory format `fmt` (contiguous, channels_last)."""
    dense = TensorSpec(x.shape, _channels_last_strides(x.shape) if fmt == "channels_last"
                       else _contiguous_strides(x.shape), x.dtype, x.device)
    return OpRecord(op="aten.contiguous.default", args=(x,),
                    kwargs={"memory_format": torch.channels_last if fmt == "channels_last"
                            else torch.contiguous_format},
                    outputs=(dense,), module=module)


class _Calls(TorchDispatchMode):
    """The aten calls a composite op makes, as OpRecords (shapes only: run on meta tensors)."""

    def __init__(self, module: str) -> None:
        super().__init__()
        self.module = module
        self.records: list[OpRecord] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outs = out if isinstance(out, list | tuple) else [out]
        self.records.append(OpRecord.of_call(
            func, args, kwargs, (TensorSpec.of(t) for t in outs if isinstance(t, torch.Tensor)),
            self.module))
        return out


def einsum_split(record: OpRecord) -> tuple[OpRecord, ...] | None:
    """The calls an einsum makes, where one of them copies an operand; else None.

    torch.einsum permutes each operand so that its contracted letters sit together and reshapes
    it for one bmm. Where those letters do not merge in memory the reshape copies the operand,
    inside the one dispatched op. XLNet's output projection "ibnd,hnd->ibh" copies its 1024x16x64
    weight on every call: 8.1 ms at 1 thread where the bmm alone takes 2.8 ms and the input
    projection "ibh,hnd->ibnd", the same (M, N, K), 3.0 ms. The matmul features cannot tell the
    two apart, so the copies and the bmm are predicted separately. The calls are ATen's own
    einsum decomposition, replayed on meta tensors."""
    if split_op_name(record.op)[1] != "einsum":
        return None
    b = bound(record)
    operands = [torch.empty_strided(t.shape, t.stride, dtype=dtype_from_name(t.dtype),
                                    device="meta") for t in b["tensors"]]
    calls = _Calls(record.module)
    try:
        with torch.inference_mode(), calls:
            torch.ops.aten.einsum.default.decompose(b["equation"], operands, path=b.get("path"))
    except Exception:  # noqa: BLE001 - an equation meta cannot replay: price the einsum whole
        return None
    # a reshape that cannot be a view clones its input contiguous: priced as that copy, which
    # the profile draws transposing (a reshape is drawn only for window partitions)
    work = tuple(_dense_copy(r.inputs[0], "contiguous", r.module) if _base_name(r) == "reshape"
                 else r for r in calls.records if not is_free(r))
    if not any(record_family(r) == "data" for r in work):
        return None
    return work


def split_hidden_work(record: OpRecord) -> tuple[OpRecord, ...] | None:
    """The parts of an op that does hidden work a model of its own family cannot see (a copy of
    a strided input, einsum's operand copies), to be predicted one by one; None: no such work."""
    return einsum_split(record) or dense_input_split(record)


# --------------------------------------------------------------------------- registry

def _info(family: str, **kw: Any) -> OpInfo:
    defaults: dict[str, Any] = {
        "conv": {"flops": conv_flops, "features": conv_features,
                 "path_features": conv_path_features},
        "matmul": {"flops": matmul_flops, "features": matmul_features},
        "attention": {"flops": attention_flops, "features": _attention_dims},
        "rnn": {"flops": rnn_flops, "features": _rnn_dims},
        "pool": {"flops": pool_flops, "features": _pool_dims},
        "norm": {"flops": norm_flops, "features": norm_features},
        "eltwise": {"flops": eltwise_flops, "features": generic_features},
        "reduce": {"flops": reduce_flops, "features": generic_features},
        "data": {"features": generic_features},
        "free": {"free": True},
    }[family]
    return OpInfo(family=family, **{**defaults, **kw})


def _aten(names: str) -> list[str]:
    return [f"aten.{n}" for n in names.split()]


def _build_registry() -> dict[str, OpInfo]:
    reg: dict[str, OpInfo] = {}

    def add(names: str, info: OpInfo) -> None:
        for n in _aten(names):
            reg[n] = info

    add("convolution _convolution conv1d conv2d conv3d conv_transpose1d conv_transpose2d "
        "conv_transpose3d mkldnn_convolution cudnn_convolution cudnn_convolution_transpose "
        "_convolution_mode _nnpack_spatial_convolution _slow_conv2d_forward "
        "slow_conv_transpose2d slow_conv3d_forward", _info("conv", dense_input=True))
    add("mm addmm bmm baddbmm addbmm linear matmul mv addmv dot vdot einsum _addmm_activation "
        "bilinear", _info("matmul"))
    add("scaled_dot_product_attention _scaled_dot_product_flash_attention_for_cpu "
        "_scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention "
        "_scaled_dot_product_cudnn_attention _scaled_dot_product_attention_math "
        "_scaled_dot_product_fused_attention_overrideable _flash_attention_forward "
        "_efficient_attention_forward _native_multi_head_attention "
        "_transformer_encoder_layer_fwd", _info("attention"))
    add(" ".join(RNN_GATES), _info("rnn"))
    for name in RNN_GATES:  # packed sequences: the step batch sizes are values a replay lacks
        reg[f"aten.{name}.data"] = _info("rnn", replayable=False)
    add("avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d "
        "adaptive_avg_pool3d _adaptive_avg_pool2d _adaptive_avg_pool3d "
        "_mkldnn_adaptive_avg_pool2d", _info("pool"))
    add(" ".join(MAX_POOLS), _info("pool", make_inputs=_activation_inputs))
    add("batch_norm _batch_norm_impl_index native_batch_norm _native_batch_norm_legit "
        "_native_batch_norm_legit_no_training _native_batch_norm_legit_functional "
        "cudnn_batch_norm miopen_batch_norm group_norm native_group_norm instance_norm rms_norm "
        "_fused_rms_norm", _info("norm"))
    # ATen's CPU layer norm runs on a contiguous copy of its input: on XCiT's transposed tokens
    # (1x196x128) it took 47 us, a contiguous one 28 and the copy 16 (1 thread)
    add("layer_norm native_layer_norm", _info("norm", dense_input=True))
    eltwise = [k for k in ELTWISE_FLOPS_PER_ELEM if not k.endswith("dropout") and k != "type_as"]
    add(" ".join(eltwise + [k + "_" for k in eltwise]), _info("eltwise"))
    add("log log_ log2 log1p sqrt sqrt_ rsqrt rsqrt_ reciprocal reciprocal_ pow pow_ log10",
        _info("eltwise", make_inputs=_positive_inputs))
    add("dropout dropout_ feature_dropout feature_dropout_ alpha_dropout alpha_dropout_ "
        "native_dropout", _info("eltwise", free_when=_dropout_is_identity))
    add("softmax _softmax log_softmax _log_softmax _safe_softmax sum mean amax amin max min "
        "prod argmax argmin std var var_mean std_mean linalg_vector_norm norm logsumexp cumsum "
        "cumsum_ cumprod any all topk sort argsort count_nonzero _weight_norm "
        "_weight_norm_interface", _info("reduce"))
    add("clone _to_copy cat stack hstack vstack pad constant_pad_nd reflection_pad1d "
        "reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d "
        "replication_pad3d roll flip repeat tile repeat_interleave narrow_copy "
        "pixel_shuffle pixel_unshuffle channel_shuffle native_channel_shuffle lift_fresh_copy "
        "masked_scatter scalar_tensor _local_scalar_dense item is_nonzero select_scatter slice_scatter "
        "index_put index_put_ _unsafe_index_put view_copy _unsafe_view_copy unfold_copy "
        "col2im im2col", _info("data"))
    for name, fam in (("copy_", "data"), ("fill_", "data"), ("zero_", "data"),
                      ("fill", "data"), ("uniform_", "data"), ("normal_", "data"),
                      ("random_", "data"), ("bernoulli_", "data"), ("exponential_", "data")):
        reg[f"aten.{name}"] = _info(fam, bytes_moved=_write_only_bytes)
    add("arange zeros ones full zeros_like ones_like full_like new_zeros new_ones new_full "
        "eye linspace rand randn randint rand_like randn_like randint_like bernoulli "
        "normal", _info("data", bytes_moved=_out_bytes))
    add("empty empty_like empty_strided new_empty new_empty_strided resize_",
        _info("data", bytes_moved=_alloc_bytes))
    add("upsample_nearest1d upsample_nearest2d upsample_nearest3d upsample_bilinear2d "
        "upsample_linear1d upsample_bicubic2d upsample_trilinear3d _upsample_nearest_exact1d "
        "_upsample_nearest_exact2d _upsample_nearest_exact3d _upsample_bilinear2d_aa "
        "upsample_bicubic2d", _info("data", flops=upsample_flops,
                                    path_features=upsample_path_features))
    add("grid_sampler grid_sampler_2d grid_sampler_3d _grid_sampler_2d_cpu_fallback",
        _info("data", flops=grid_sampler_flops, make_inputs=_grid_inputs))
    add("embedding", _info("data", bytes_moved=_gather_bytes, make_inputs=_embedding_inputs))
    add("index_select gather take_along_dim",
        _info("data", bytes_moved=_gather_bytes, make_inputs=_dim_index_inputs))
    add("scatter scatter_ scatter_add scatter_add_ scatter_reduce index_add index_add_ "
        "index_copy index_copy_ index_fill index_fill_", _info("data", make_inputs=_dim_index_inputs))
    add("index _unsafe_index",
        _info("data", bytes_moved=_gather_bytes, make_inputs=_index_inputs))
    add("one_hot", _info("data", make_inputs=_one_hot_inputs))
    # torchvision's detection ops: pooling boxes out of feature maps, and suppressing overlaps
    reg["torchvision.roi_align"] = _info("data", flops=roi_align_flops, make_inputs=_roi_inputs)
    reg["torchvision.nms"] = _info("data", flops=nms_flops, make_inputs=_nms_inputs)
    # output sizes depend on the values: a replay with random values has other shapes
    add("nonzero masked_select unique _unique _unique2 unique_consecutive unique_dim argwhere "
        "nonzero_numpy", _info("data", replayable=False))
    reg["aten.where.default"] = _info("data", replayable=False)  # where(cond) is nonzero
    for name in ("aten.max.other", "aten.min.other"):  # binary max/min are elementwise
        reg[name] = _info("eltwise")
    add("reshape reshape_as flatten unflatten", _info("data", free_when=_view_possible))
    add("contiguous", _info("data", free_when=_already_contiguous))
    add("to type_as _autocast_to_reduced_precision _autocast_to_full_precision",
        _info("data", free_when=_same_tensor))
    add("view _unsafe_view _reshape_alias view_as expand expand_as t numpy_T mT mH adjoint "
        "transpose transpose_ swapaxes swapdims permute movedim moveaxis squeeze squeeze_ "
        "unsqueeze unsqueeze_ slice select narrow as_strided as_strided_ detach detach_ alias "
        "split split_with_sizes tensor_split chunk unbind unsafe_split unsafe_chunk lift "
        "lift_fresh unfold diagonal real imag view_as_real view_as_complex _conj _neg_view "
        "conj resolve_conj resolve_neg sym_size sym_stride sym_numel sym_storage_offset "
        "_assert_async _assert_tensor_metadata _assert_scalar set_ is_same_size "
        "_nested_tensor_from_mask_left_aligned dim size stride numel meshgrid broadcast_to",
        _info("free"))
    return reg


REGISTRY: dict[str, OpInfo] = _build_registry()


def lookup(op: str) -> OpInfo | None:
    """The OpInfo for an overload name: an exact entry first, then its overload packet."""
    if op in REGISTRY:
        return REGISTRY[op]
    ns, _, rest = op.partition(".")
    packet = f"{ns}.{rest.split('.')[0]}" if rest else op
    return REGISTRY.get(packet)


def register(op: str, info: OpInfo, *, override: bool = False) -> None:
    """Add or (with override=True) replace the entry for an overload or a packet name."""
    if op in REGISTRY and not override:
        raise HwlatError(f"{op} is already registered as {REGISTRY[op].family!r}; "
                         "pass override=True to replace it")
    REGISTRY[op] = info


def family_of(op: str) -> str:
    info = lookup(op)
    return info.family if info is not None else UNKNOWN


def fallback_info() -> OpInfo:
    """Stated estimate for an unregistered op: one FLOP per output element, default bytes."""
    return OpInfo(family="data", flops=_per_output_elem, features=generic_features)


def _per_output_elem(record: OpRecord) -> float:
    return float(sum(t.numel for t in record.outputs))


# --------------------------------------------------------------------------- features

COMMON_FEATURES = (
    "flops", "bytes_moved", "arithmetic_intensity", "log_flops", "log_bytes", "itemsize",
    "channels_last", "contiguous", "n_inputs", "numel_out", "log_numel_out", "roofline_s",
    "log_roofline_us",
)
_FAMILY_FEATURES: dict[str, tuple[str, ...]] = {
    "conv": ("N", "Cin", "Cout", "D", "H", "W", "Hout", "Wout", "kh", "kw", "kd", "stride_h",
             "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w", "groups", "depthwise",
             "channels_per_group", "transposed", "has_bias", "spatial_dims",
             "weight_channels_last", "Cin_align", "Cout_align", "native_path", "reorder_bytes"),
    "matmul": ("batch", "M", "N", "K", "has_bias", "a_transposed", "b_transposed", "N_align",
               "K_align"),
    "attention": ("batch", "heads", "Lq", "Lk", "head_dim", "head_dim_v", "causal", "has_mask",
                  "embed_dim", "ffn_dim", "fused_layer"),
    "rnn": ("tokens", "steps", "batch", "input_size", "hidden", "gates", "layers", "bidirectional",
            "weight_numel", "packed", "serial_steps"),
    "pool": ("N", "C", "D", "H", "W", "Hout", "Wout", "kernel_h", "kernel_w", "kernel_d",
             "stride_h", "stride_w", "pad_h", "pad_w", "adaptive", "is_max", "channels_last"),
    "norm": ("numel", "normalized_size", "N", "C", "groups", "has_weight", "training", "kind"),
    **{f: ("numel_in", "numel_in_total", "numel_out", "n_tensor_inputs", "ndim_out",
           "reduce_size", "reduce_inner", "broadcast", "inputs_contiguous",
           "output_contiguous", "in_place", "flops_per_elem", "log_gather_stride",
           "gather_stride_pow2", "log_gather_footprint", "op_code",
           "kernel_path")
       for f in ("eltwise", "reduce", "data", UNKNOWN)},
    "free": (),
}


def feature_names(family: str) -> list[str]:
    """The fixed column order of a family's feature vector (common features first)."""
    if family not in _FAMILY_FEATURES:
        raise HwlatError(f"unknown op family {family!r}; use one of {', '.join(FAMILIES)}")
    return list(COMMON_FEATURES) + [f"{family}.{n}" for n in _FAMILY_FEATURES[family]]


def flops_of(record: OpRecord, info: OpInfo | None = None) -> float:
    info = info if info is not None else (lookup(record.op) or fallback_info())
    return 0.0 if is_free(record, info) else float(info.flops(record))


NOMINAL_GFLOPS = 100.0  # used only when a device has no measured compute peak at all


def roofline_parts(record: OpRecord, peaks: dict) -> tuple[float, float]:
    """(compute seconds, memory seconds) of one op at the device's peaks (0 for free ops).

    peaks: {"gflops": {dtype: GFLOP/s}, "gbps": GB/s} as `measure_peaks` returns them; a dtype
    without a peak uses float32's. Unregistered ops get the stated `fallback_info` counters.
    """
    info = lookup(record.op) or fallback_info()
    gflops = peaks.get("gflops") or {"float32": NOMINAL_GFLOPS}
    peak = gflops.get(record.dtype) or gflops.get("float32") or max(gflops.values())
    return flops_of(record, info) / (peak * 1e9), bytes_of(record, info) / (peaks["gbps"] * 1e9)


def roofline_s(record: OpRecord, peaks: dict) -> float:
    """max(compute time, memory time) at the device's peaks."""
    return max(roofline_parts(record, peaks))


def common_features(record: OpRecord, info: OpInfo | None, peaks: dict | None = None) -> Features:
    info = info if info is not None else fallback_info()
    flops, nbytes = flops_of(record, info), bytes_of(record, info)
    ins = record.inputs
    numel_out = float(sum(t.numel for t in record.outputs))
    roof = roofline_s(record, peaks) if peaks else float("nan")
    itemsizes = [t.itemsize for t in ins + list(record.outputs) if t.dtype == record.dtype]
    return {
        "flops": flops, "bytes_moved": nbytes,
        "arithmetic_intensity": flops / nbytes if nbytes else 0.0,
        "log_flops": math.log1p(flops), "log_bytes": math.log1p(nbytes),
        "itemsize": float(itemsizes[0]) if itemsizes else float("nan"),
        "channels_last": float(any(t.memory_format == "channels_last" for t in ins)),
        "contiguous": float(all(t.memory_format == "contiguous" for t in ins)),
        "n_inputs": float(len(ins)), "numel_out": numel_out,
        "log_numel_out": math.log1p(numel_out), "roofline_s": roof,
        "log_roofline_us": math.log1p(roof * 1e6) if peaks else float("nan"),
    }


def features(record: OpRecord, peaks: dict | None = None, threads: int | None = None) -> Features:
    """The feature vector of one call, ordered as `feature_names(record_family(record))`.

    Training and prediction both call this. Values a family cannot compute are NaN;
    roofline features are NaN without `peaks`, kernel-path features without `threads` (the
    device's thread count).
    """
    info = lookup(record.op)
    family = record_family(record)
    values = common_features(record, info, peaks)
    specific = {}
    if family != "free":
        info = info or fallback_info()
        specific = {**info.features(record), **info.path_features(record, threads)}
    values.update({f"{family}.{k}": float(v) for k, v in specific.items()})
    return {n: float(values.get(n, float("nan"))) for n in feature_names(family)}
