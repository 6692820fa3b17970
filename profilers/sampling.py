"""Which op configs to profile: the training zoo's own, perturbations around them, random ones.

DESIGN.md: random configs alone generalise badly to real models (38-47% MAPE on real convs), so
the sample follows real architectures first: (a) the exact configs of the training zoo, (b)
perturbations of those (channel multipliers, odd channel counts, spatial and sequence sizes),
(c) random configs over each family's range, built from small real modules so that every
config is one that PyTorch really dispatches. Adaptive rounds live with the database build.
"""

from __future__ import annotations

import importlib.util
import math
import random
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import torch
from torch import nn
from torch.nn import functional as F

from profilers.oprecord import OpRecord, TensorSpec, _channels_last_strides, _contiguous_strides

SOURCES = ("zoo", "perturb", "random", "adaptive")  # priorities: kernels_db.store.SOURCE_PRIORITY


@dataclass(frozen=True)
class Sample:
    """An op config to profile, where it came from, and its priority (lower goes first)."""

    record: OpRecord
    source: str
    priority: int


def timed_records(records: Iterable[OpRecord]) -> Iterator[OpRecord]:
    """The records worth timing: registered, not free, replayable."""
    from profilers.ops import lookup

    for r in records:
        info = lookup(r.op)
        if info is not None and not info.free and info.replayable:
            yield r


def dedupe(samples: Iterable[Sample]) -> list[Sample]:
    """First occurrence of each config key wins (so the zoo's own configs keep priority)."""
    seen: dict[str, Sample] = {}
    for s in samples:
        if s.record.key not in seen:
            seen[s.record.key] = s
    return list(seen.values())


# --- (b) perturbations --------------------------------------------------------------------------

_MULTIPLIERS = (0.5, 0.75, 1.25, 1.5, 2.0)


def _respec(t: TensorSpec, old: int, new: int) -> TensorSpec:
    shape = tuple(new if s == old else s for s in t.shape)
    if t.memory_format == "channels_last":
        stride = _channels_last_strides(shape)
    else:
        stride = _contiguous_strides(shape)
    return replace(t, shape=shape, stride=stride, storage_offset=0)


def _swap(value, old: int, new: int):
    if isinstance(value, TensorSpec):
        return _respec(value, old, new) if old in value.shape else value
    if isinstance(value, list | tuple):
        return type(value)(_swap(v, old, new) for v in value)
    if isinstance(value, int) and not isinstance(value, bool) and value == old and old >= 8:
        return new  # e.g. groups of a depthwise conv, a view size that follows the channels
    return value


def outputs_of(op: str, args: tuple, kwargs: dict) -> tuple[TensorSpec, ...] | None:
    """Output specs of an op on abstract inputs, or None if the arguments are inconsistent."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from profilers.oprecord import dtype_from_name

    def build(v):
        if isinstance(v, TensorSpec):
            return torch.empty_strided(v.shape, v.stride, dtype=dtype_from_name(v.dtype),
                                       device=v.device)
        if isinstance(v, list | tuple):
            return type(v)(build(x) for x in v)
        return v

    from profilers.capture import quiet_fake_tensor_log

    namespace, name, overload = op.split(".", 2)
    func = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    try:
        with quiet_fake_tensor_log(), FakeTensorMode(allow_non_fake_inputs=False), \
                torch.inference_mode():
            out = func(*build(list(args)), **{k: build(v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 - an inconsistent perturbation is simply discarded
        return None
    outs = out if isinstance(out, list | tuple) else (out,)
    return tuple(TensorSpec.of(o) for o in outs if isinstance(o, torch.Tensor))


def perturb(record: OpRecord, rng: random.Random) -> OpRecord | None:
    """The same op with one of its sizes changed everywhere it occurs, or None if invalid.

    Changing a size in every input at once keeps convs, matmuls and elementwise ops consistent
    (a channel count appears in the input and in the weight); the outputs are re-derived with
    fake tensors, and a change the op rejects is dropped.
    """
    sizes = sorted({s for t in record.inputs for s in t.shape if s >= 2})
    if not sizes:
        return None
    old = rng.choice(sizes)
    if rng.random() < 0.3:
        new = old + rng.choice((-3, -1, 1, 3))  # odd counts, off the powers of two
    else:
        new = int(round(old * rng.choice(_MULTIPLIERS)))
    if new < 1 or new == old or new * max(t.numel for t in record.inputs) / old > 64e6:
        return None
    args, kwargs = _swap(record.args, old, new), {k: _swap(v, old, new) for k, v in record.kwargs.items()}
    outputs = outputs_of(record.op, tuple(args), kwargs)
    if outputs is None:
        return None
    return OpRecord(record.op, tuple(args), kwargs, outputs, record.module)


def perturbations(records: list[OpRecord], n: int, *, seed: int = 0) -> list[OpRecord]:
    rng = random.Random(seed)
    out, tries = [], 0
    while records and len(out) < n and tries < n * 4:
        tries += 1
        p = perturb(rng.choice(records), rng)
        if p is not None:
            out.append(p)
    return out


# --- (c) random configs from real modules --------------------------------------------------------

def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


T = TypeVar("T")
_DECKS: weakref.WeakKeyDictionary[random.Random, dict[tuple, list]] = weakref.WeakKeyDictionary()


def _deal(rng: random.Random, items: Sequence[T]) -> T:
    """One of `items`, dealt from a deck shuffled by `rng`: each comes up once per len(items)
    draws, so a family's 17 tail ops get an even share of a few dozen draws (drawn independently,
    some got 4 and others 12 of 120)."""
    decks = _DECKS.setdefault(rng, {})
    key = tuple(items)
    if not decks.get(key):
        decks[key] = rng.sample(key, len(key))
    return decks[key].pop()


def _channels(rng: random.Random, lo: int = 8, hi: int = 1024) -> int:
    c = _log_uniform(rng, lo, hi)
    return c if rng.random() < 0.3 else max(lo, (c // 8) * 8)  # real nets mostly use multiples of 8


def _spatial(rng: random.Random) -> int:
    return rng.choice((1, 7, 7, 14, 14, 28, 28, 56, 56, 112, 13, 17, 35, 20, 40, 80))


# one random config never eats the budget: ~0.2 s of compute at 1 thread here, and inputs of at
# most 256 MiB (fp32) for the memory-bound families
MAX_RANDOM_GFLOP = 20.0
MAX_RANDOM_NUMEL = 64 << 20


def _fit_spatial(n: int, c: int, hw: int, numel: int = MAX_RANDOM_NUMEL) -> int:
    while hw > 1 and n * c * hw * hw > numel:
        hw //= 2
    return hw


GROUPED_SHARE = 0.2
"""Of the random non-depthwise convs, the share drawn grouped (ResNeXt, RegNet and many timm
models: 2-256 groups of 2-128 channels, in = out, almost all 3x3). They are neither dense nor
depthwise, and a training zoo holds one group width (RegNet-Y 400MF: 8), so without random ones
the conv model extrapolated every other width. What such configs are worth, measured at 2 threads
here (`benchmarks/grouped_convs.py`, 5 runs, the machine at a different speed in each): adding
~260 random grouped convs (those of 40 random rounds; a 10-minute profile draws a few dozen, in
its plan and adaptive rounds) to a profile's database took the 92 grouped convs of 8 unseen models
(RegNet-X/Y 800MF, RegNet-X 1.6GF, ResNeXt-50, timm's resnext26ts, seresnext26d, regnetz_005,
haloregnetz_b; batch 1 and 8) from 21.0-22.1% to 17.2-20.6% MAPE, groups of 24 channels at batch
8 from 27% to 19%; their dense convs went from 9.9-14.6% to 10.5-13.8%. A small gain: groups of
4 channels stay under-predicted (0.5-0.75x, a slow path), groups of 16 at batch 1 over (1.2x)."""
GROUP_WIDTHS = (2, 4, 8, 16, 24, 32, 48, 64, 128)
DEPTHWISE_SHARE = 0.3
DEPTHWISE_MULTIPLIERS = (1, 1, 2)
"""Random convs drawn depthwise (groups = input channels), of any kernel size the draw gives,
1x1 included, and with one or two output channels per group. Reparameterisable blocks (timm's
RepViT, FastViT, MobileOne; RepVGG) train with a depthwise 1x1 branch beside the 3x3, and
FastViT's patch embeddings widen with a depthwise 7x7 of two outputs per group; no zoo model has either,
and depthwise convs were drawn only with kernels over 1. At 1 thread ATen runs an unstrided 1x1
conv below batch 16 on its native kernels (`ops.conv_path_features`), which loop over the
groups: a depthwise 1x1 on 1x384x7x7 took 2.24 ms alone, and 1x192x14x14 1.75 ms, where the conv
model (extrapolating from dense native 1x1 convs, one GEMM each) priced them at 0.03 ms; a 48 ->
96 depthwise 7x7 on 1x48x64x64 1.87 against 0.26 ms. RepViT-M0.9's 49 depthwise convs came to
37.9 ms alone against 4.4 ms predicted, and the model was under-predicted by 45% (FastViT-T8:
18.7 against 6.2 ms, -43%; 12-03 11:44 profile, `benchmarks/unseen_timm2.txt`)."""


CONV3D_SHARE = 0.2
"""Of the random convs, the share drawn 3-D (video models: full 3x3x3, R(2+1)D's 1x3x3 and 3x1x1
pairs, 1x1x1, the 3x7x7 stem). Without them the conv model priced a conv3d by what it learned of
2-D convs. Measured at 2 threads here: adding 47 random conv3d configs to a 10-minute profile's
database took the summed conv estimates of r3d_18, r2plus1d_18 and mc3_18 (16x112x112) from
-18%, -16%, -7% of their time inside the model to -2%, +3%, +14% (mean 13.7% -> 6.5%). At a share
of 0.1 a 10-minute 1-thread profile timed 4, two of them on ATen's own kernel (`native_path`),
as batch-1 video convs on small inputs are: a 3x3x3 conv 16->16 on 1x16x8x56x56 took 18.0 ms
and was predicted at 3.5."""


def _conv3d(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    cin = _channels(rng, 16, 512) if rng.random() > 0.05 else 3
    cout = _channels(rng, 16, 512)
    k = rng.choice(((3, 3, 3), (3, 3, 3), (1, 3, 3), (3, 1, 1), (1, 1, 1), (3, 7, 7)))
    stride = rng.choice(((1, 1, 1), (1, 1, 1), (1, 2, 2), (2, 2, 2)))
    n, frames, hw = rng.choice((1, 1, 2)), rng.choice((2, 4, 8, 16)), rng.choice((7, 14, 28, 56))
    per_voxel = 2 * math.prod(k) * cin * cout / math.prod(stride)
    cap = MAX_RANDOM_GFLOP / 4 * 1e9  # ATen's own conv3d kernel runs at ~20 GFLOP/s (1 thread)
    while hw > 7 and n * frames * hw * hw * per_voxel > cap:
        hw //= 2
    while frames > 1 and n * frames * hw * hw * per_voxel > cap:
        frames //= 2
    padding = tuple(d // 2 for d in k)
    mod = nn.Conv3d(cin, cout, k, stride, padding=padding, bias=rng.random() < 0.3)
    return mod, [(n, cin, max(frames, k[0]), max(hw, k[1]), max(hw, k[2]))], False


TRANSPOSED_SHARE = 0.08
"""Of the random convs, the share drawn transposed (U-Nets, GAN and segmentation decoders:
kernel 2 stride 2, kernel 4 stride 2 padding 1, kernel 3 stride 2 with output padding). No
training zoo model has one, and the conv model priced 2x2 and 4x4 ones at 1.3x and 2.8x their
time (1 thread)."""


def _conv_transpose(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    cin, cout = _channels(rng, 8, 512), _channels(rng, 8, 512)
    k, pad, out_pad = rng.choice(((2, 0, 0), (2, 0, 0), (4, 1, 0), (3, 1, 1)))
    n, hw = rng.choice((1, 1, 2, 8)), rng.choice((7, 8, 14, 16, 28, 32, 56, 64))
    while hw > 4 and 2 * n * hw * hw * k * k * cin * cout > MAX_RANDOM_GFLOP * 1e9:
        hw //= 2
    mod = nn.ConvTranspose2d(cin, cout, k, 2, padding=pad, output_padding=out_pad,
                             bias=rng.random() < 0.5)
    return mod, [(n, cin, hw, hw)], False


GROUP_LOOP_SHARE = 0.3
"""Of the random convs, the share drawn as a reparameterisable block's depthwise 1x1 branch:
unstrided, dense layout, batch 1-8, which ATen runs on its native kernels one group at a time,
about 4.1 us a group at 1 thread (1x384x7x7: 1.57 ms; 1x192x14x14: 0.78 ms). The general
draws above made 3 such configs in 2043 conv configs of a 10-minute profile, and the conv model
priced RepViT-M0.9's at 0.03-0.25x their time alone (1x384x7x7 0.053 ms against 1.594,
1x192x14x14 0.199 against 0.796; `unseen_timm2.txt`, 12-04 22:16 profile). A share of 0.08 at one multiple of draws added 3 more,
and repvit moved -22% -> -31%: too few for the tree, so convs draw twice (`DRAWS`)."""


def _group_loop_conv(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    c = _channels(rng, 16, 1024)
    n, hw = rng.choice((1, 1, 1, 2, 8)), rng.choice((7, 14, 28, 56, 8, 16, 32, 64))
    hw = _fit_spatial(n, c, hw)
    mod = nn.Conv2d(c, c * rng.choice(DEPTHWISE_MULTIPLIERS), 1, groups=c,
                    bias=rng.random() < 0.5)
    return mod, [(n, c, hw, hw)], False


def _conv(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    if rng.random() < GROUP_LOOP_SHARE:
        return _group_loop_conv(rng)
    if rng.random() < CONV3D_SHARE:
        return _conv3d(rng)
    if rng.random() < TRANSPOSED_SHARE:
        return _conv_transpose(rng)
    cin = _channels(rng, 3, 2048) if rng.random() > 0.05 else 3
    k = rng.choice((1, 1, 1, 3, 3, 3, 5, 7))
    stride = rng.choice((1, 1, 1, 2))
    depthwise = rng.random() < DEPTHWISE_SHARE
    cout = cin * rng.choice(DEPTHWISE_MULTIPLIERS) if depthwise else _channels(rng, 8, 2048)
    groups = cin if depthwise else 1
    if not depthwise and rng.random() < GROUPED_SHARE:
        width = rng.choice(GROUP_WIDTHS)
        groups = _log_uniform(rng, 2, min(256, 2048 // width))
        cin = cout = groups * width
        k = rng.choice((3, 3, 3, 1, 5))  # almost all are 3x3
    hw = _spatial(rng)
    if k == 1 and rng.random() < 0.25:
        hw = 1  # squeeze-excite 1x1 convs on 1x1 spatial inputs
    n = rng.choice((1, 1, 2, 8))
    per_pixel = 2 * k * k * cout * (cin // groups) / stride**2
    while hw > 1 and n * hw * hw * per_pixel > MAX_RANDOM_GFLOP * 1e9:
        hw //= 2
    hw = _fit_spatial(n, max(cin, cout), hw)
    mod = nn.Conv2d(cin, cout, k, stride, padding=k // 2, groups=groups, bias=rng.random() < 0.5)
    return mod, [(n, cin, max(hw, k // 2 + 1), max(hw, k // 2 + 1))], rng.random() < 0.3


class _PermutedLinear(nn.Module):
    """A linear over the channels of a channels-first tensor, read through a permute: CaiT's
    talking heads mix the heads of 1x4x196x196 attention maps this way. The leading dims merge
    into one transposed matrix (no copy), tall and, across heads, only 4 wide: 0.38 ms alone,
    priced at 0.15 by a model that had no such config (1 thread)."""

    def __init__(self, c: int, n: int, bias: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(c, n, bias=bias)

    def forward(self, x):
        return self.fc(x.permute(0, 2, 3, 1))


PERMUTED_LINEAR_SHARE = 0.12


def _permuted_linear(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    heads = rng.random() < 0.6
    c = rng.choice((2, 3, 4, 5, 6, 8, 12, 16)) if heads else _channels(rng, 16, 1024)
    n = c if heads and rng.random() < 0.7 else _channels(rng, 2, 1024)
    b = rng.choice((1, 1, 2, 8))
    side = _fit_spatial(b, max(c, n), rng.choice((49, 196, 197, 256) if heads  # attention maps
                                                  else (7, 14, 28, 56, 64)))   # feature maps
    while side > 1 and 2 * b * side * side * c * n > MAX_RANDOM_GFLOP * 1e9:
        side //= 2
    return _PermutedLinear(c, n, rng.random() < 0.8), [(b, c, side, side)], False


class _BatchedProduct(nn.Module):
    """A product of two activations, as models write it by hand: attention scores against a
    transposed key (LeViT, CaiT, GCViT, BLOOM through baddbmm), the scores times the values,
    einsum's bmm (XLNet), and Mamba's scan, a matrix times a vector at every step. Never drawn,
    no aten.matmul, bmm or baddbmm was timed at all: Mamba's 1x1536x16 by 1x16x1 took 52 us
    alone and was priced at 180 (4096 of them, 56% of its op time; hf:mamba +53% end to end, 1
    thread)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, a, b, *bias):
        if self.kind == "scores":  # q @ k^T: the key read transposed, never copied
            return torch.matmul(a, b.transpose(-2, -1))
        if self.kind == "bmm":
            return torch.bmm(a, b)
        if self.kind == "baddbmm":
            return torch.baddbmm(bias[0], a, b, beta=1.0, alpha=0.125)
        return torch.matmul(a, b)  # "matmul": broadcast over leading dims


BATCHED_PRODUCT_SHARE = 0.5
"""Of the matmul family's draws, the share that multiplies two activations (`_BatchedProduct`)
rather than running a linear layer."""


def _batched_product(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    kind = rng.choice(("scores", "scores", "matmul", "matvec", "bmm", "baddbmm"))
    if kind == "matvec":  # (batch, M, K) @ (batch, K, 1..2): Mamba's scan, attention pooling
        batch, m = rng.choice((1, 1, 2, 8)), _channels(rng, 64, 4096)
        k, n = rng.choice((4, 8, 16, 16, 32, 64)), rng.choice((1, 1, 2))
        return _BatchedProduct("matmul"), [(batch, m, k), (batch, k, n)], False
    if kind in ("bmm", "baddbmm"):
        batch = rng.choice((1, 4, 12, 16, 32, 64, 128))
        m, k, n = (rng.choice((16, 49, 64, 128, 197, 256, 512, 1024)) for _ in range(3))
        while 2 * batch * m * n * k > MAX_RANDOM_GFLOP * 1e9 and batch > 1:
            batch //= 2
        shapes = [(batch, m, k), (batch, k, n)]
        return _BatchedProduct(kind), shapes + [(batch, m, n)] * (kind == "baddbmm"), False
    b, heads = rng.choice((1, 1, 2, 8, 16, 64)), rng.choice((1, 2, 3, 4, 6, 8, 12, 16))
    seq = rng.choice((16, 49, 64, 128, 196, 197, 256, 512, 1024))
    dim = rng.choice((16, 32, 48, 64, 64, 80, 128))
    while b > 1 and 2 * b * heads * seq * seq * dim > MAX_RANDOM_GFLOP * 1e9:
        b //= 2
    if kind == "scores":  # (b, heads, seq, dim) @ (b, heads, seq, dim)^T
        return _BatchedProduct("scores"), [(b, heads, seq, dim)] * 2, False
    if rng.random() < 0.3:  # a 2-dim weight broadcast over a batch: Mamba's x_proj by dt
        return _BatchedProduct("matmul"), [(heads * dim, seq), (b, seq, dim)], False
    return _BatchedProduct("matmul"), [(b, heads, seq, seq), (b, heads, seq, dim)], False


def _product(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    """The matmul family's draw: a product of two activations or a linear layer."""
    if rng.random() < BATCHED_PRODUCT_SHARE:
        return _batched_product(rng)
    return _linear(rng)


def _linear(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    if rng.random() < PERMUTED_LINEAR_SHARE:
        return _permuted_linear(rng)
    if rng.random() < 0.15:  # weights far beyond the LLC: classifier heads, LLM MLPs
        k, n = _channels(rng, 4096, 16384), _channels(rng, 1000, 8192)
        n = min(n, (64 << 20) // k)  # at most 256 MiB of fp32 weights
        rows = rng.choice((1, 2, 8, 32))
        return nn.Linear(k, n, bias=rng.random() < 0.8), [(rows, k)], False
    k, n = _channels(rng, 16, 4096), _channels(rng, 16, 4096)
    rows = rng.choice((1, 8, 32, 128, 256, 512))
    shape = (rows, k) if rng.random() < 0.5 else (rng.choice((1, 2, 8)), rows, k)
    return nn.Linear(k, n, bias=rng.random() < 0.8), [shape], False


class _Attention(nn.Module):
    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


class _BiasedAttention(nn.Module):
    """Vision attention as TinyViT, LeViT and EfficientViT run it: q, k and v split from one
    packed projection (strided views, never copied) and a learned bias per head over every pair
    of tokens as the float mask, broadcast over the batch of windows. Never drawn, TinyViT's
    16x4x49x32 windows were priced at 0.35x their time alone and 1x5x196x32 at 0.48x
    (1 thread)."""

    def __init__(self, heads: int, seq: int) -> None:
        super().__init__()
        self.heads = heads
        self.register_buffer("bias", torch.zeros(heads, seq, seq))

    def forward(self, qkv):
        b, seq, _ = qkv.shape
        q, k, v = qkv.view(b, seq, self.heads, 3, -1).permute(3, 0, 2, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)


BIASED_ATTENTION_SHARE = 0.35


def _attention(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    if rng.random() < BIASED_ATTENTION_SHARE:
        b, heads = rng.choice((1, 1, 4, 16, 64)), rng.choice((2, 3, 4, 5, 6, 8, 10))
        seq, dim = rng.choice((16, 49, 49, 64, 144, 196, 197)), rng.choice((16, 32, 32, 64))
        return _BiasedAttention(heads, seq), [(b, seq, 3 * heads * dim)], False
    b, heads = rng.choice((1, 2, 8)), rng.choice((4, 8, 12, 16))
    seq, dim = rng.choice((16, 32, 64, 128, 197, 256, 512)), rng.choice((32, 64, 64, 80, 128))
    shape = (b, heads, seq, dim)
    return _Attention(rng.random() < 0.3), [shape, shape, shape], False


MAX_RNN_GFLOP = 2.0  # recurrent steps run one after another, far below matmul speed


def _rnn(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    kind = rng.choice(("lstm", "lstm", "gru", "rnn_tanh", "rnn_relu"))
    size, hidden = rng.choice((32, 64, 128, 256, 512)), rng.choice((32, 64, 128, 256, 512))
    steps, batch = rng.choice((4, 8, 16, 32, 64, 128)), rng.choice((1, 1, 4, 8))
    layers, bidirectional = rng.choice((1, 1, 2)), rng.random() < 0.3
    kw = {"num_layers": layers, "batch_first": rng.random() < 0.5, "bidirectional": bidirectional}
    if kind == "lstm":
        module = nn.LSTM(size, hidden, **kw)
    elif kind == "gru":
        module = nn.GRU(size, hidden, **kw)
    else:
        module = nn.RNN(size, hidden, nonlinearity=kind[4:], **kw)
    weights = sum(p.numel() for p in module.parameters() if p.dim() == 2)
    while steps > 1 and 2 * steps * batch * weights > MAX_RNN_GFLOP * 1e9:
        steps //= 2
    return module, [(batch, steps, size) if kw["batch_first"] else (steps, batch, size)], False


POOL_MAX_NUMEL = 16 << 20
"""A random pool's input at most (a CPU pools ~3.4 ns per window element at 1 thread, whatever
the caches hold, so a larger one teaches nothing new): with `MAX_RANDOM_NUMEL` two 8x-batch pools
of 120 random ones took 1.8 and 2.8 s a call, 19 of the 40 s of pool timing."""


def _pool(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    """Pools as classifiers, detectors and segmenters use them, including the stride-1 ones of
    HGNet's stem (2x2 after a one-pixel pad, ceil mode: 1x16x113x113 priced at 1.96 ms against
    3.45 ms alone, 1 thread) and YOLO's spatial pyramid (5x5, padded to keep the size)."""
    c, n = _channels(rng, 16, 1024), rng.choice((1, 8))
    hw = _fit_spatial(n, c, _spatial(rng) * 2 + rng.choice((0, 0, 1)), POOL_MAX_NUMEL)
    mod = rng.choice((nn.MaxPool2d(3, 2, 1), nn.MaxPool2d(2, 2), nn.AvgPool2d(2, 2),
                      nn.MaxPool2d(3, 2, ceil_mode=True), nn.MaxPool2d(3, 1, 1, ceil_mode=True),
                      nn.AvgPool2d(3, 1, 1), nn.AdaptiveAvgPool2d(1), nn.AdaptiveAvgPool2d(7),
                      nn.MaxPool2d(2, 1, ceil_mode=True), nn.MaxPool2d(5, 1, 2)))
    return mod, [(n, c, hw, hw)], rng.random() < 0.3


class _StandardizedWeight(nn.Module):
    """A conv weight standardised per output channel, as NFNet's and BiT's convs do on every
    forward: batch norm in training mode over a (1, out, fan_in) view of the weight."""

    def __init__(self, out: int, gain: bool) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(out)) if gain else None

    def forward(self, w):
        return F.batch_norm(w, None, None, weight=self.gain, training=True, momentum=0.0,
                            eps=1e-5)


STANDARDIZED_SHARE = 0.25
"""Share of norm draws that standardise a conv weight. Batch norm in training mode computes the
batch statistics, and at 1 thread ATen's kernel for a (1, C, K) view took 1.2-5.8x what the
norm model priced it at from inference-mode configs: dm_nfnet_f0's 57 standardisations ran 85 ms
alone (12-04 evening) and were priced at 16 ms, the model 12% under-predicted. With 0.15 and K
drawn to 4608 at most (9 x 512), 14 were timed in a 10-minute profile and the model priced
the fan-ins past them 3-4x low (resnetv2_50x1_bit's 1x256x1024 at 0.13 ms against 0.49 alone;
its 53 standardisations at 19.4 ms against 43.3): see `STANDARDIZED_MAX_NUMEL`."""
STANDARDIZED_MAX_NUMEL = 16 << 20
"""Largest standardised weight drawn (elements; ~30 ms at 1 thread, 1.85 ns an element here).
K runs to 9 x 2048, as BiT's wide 3x3 convs (resnetv2_50x3_bit's over 1536 channels: 13824,
21M elements); a draw past this halves its out channels. Where the norm model fits the
roofline residual (it chose it on every profile of 12-07), its price per element carries beyond
the largest draw. A resume of the 1-thread profile of 12-07 (AMD EPYC) with this sampler added 27
standardisations; with them the recorded standardised-conv set re-predicted at 3.1% MAPE, 5 of 5
within 10%, against 8.9% and 3 of 5 (nf_resnet50 -12.6% -> +1.6%, resnetv2_50x1_bit -15.8% ->
+0.4%); timm2's dm_nfnet_f0 -12.1% -> +6.1%; the held-out zoo and the other unseen sets moved by
0.05 point or less."""


def _norm_act(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    if rng.random() < STANDARDIZED_SHARE:
        out = _channels(rng, 16, 3072)
        fan_in = rng.choice((1, 3, 9)) * _channels(rng, 3, 2048)  # in/groups x kernel area
        while out > 16 and out * fan_in > STANDARDIZED_MAX_NUMEL:
            out //= 2
        return _StandardizedWeight(out, rng.random() < 0.5), [(1, out, fan_in)], False
    c, hw = _channels(rng, 16, 1024), _spatial(rng)
    if rng.random() < 0.2:  # diffusion U-Nets and detection heads; style transfer, GANs
        c = (c // 32) * 32 or 32
        norm = nn.GroupNorm(rng.choice((8, 16, 32)), c) if rng.random() < 0.6 else \
            nn.InstanceNorm2d(c, affine=rng.random() < 0.5)
        n = rng.choice((1, 1, 8))
        return nn.Sequential(norm, nn.SiLU()), [(n, c, *(2 * [_fit_spatial(n, c, hw * 2)]))], False
    if rng.random() < 0.5:
        act = rng.choice((nn.ReLU(), nn.ReLU6(), nn.SiLU(), nn.Hardswish(), nn.GELU(), nn.Sigmoid()))
        return nn.Sequential(nn.BatchNorm2d(c), act), [(rng.choice((1, 8)), c, hw, hw)], rng.random() < 0.3
    seq = rng.choice((16, 32, 50, 128, 197, 256))
    act = rng.choice((nn.GELU(), nn.ReLU(), nn.Tanh(), nn.Softmax(dim=-1)))
    return nn.Sequential(nn.LayerNorm(c), act), [(rng.choice((1, 8)), seq, c)], False


STRIDED_SHARE = 0.25
"""Of the random elementwise ops and reductions, the share drawn on a permuted view of their
first input, as models hand them over: ConvNeXt-V2's global response norm takes the L2 norm over
the spatial dims of an NHWC tensor seen as NCHW, XCiT normalises the transposed queries and adds
a transposed branch to its residual stream. Never drawn so, such ops were priced at 0.04-0.5x
their time (1 thread, the 14:53 profile of 12-03): the spatial L2 norm of 1x640x14x14 at 26 us
against 214 us timed alone (59 us on a contiguous input), an add with one transposed operand of
1x196x128 at 12 us against 26, gelu on 1x160x56x56 channels_last at 258 us against 520 (274 us
contiguous). Sums and means are not slower on such views; the trees learn which ops are from the
`contiguous` and `channels_last` features and `op_code`."""


def _viewed(rng: random.Random, shape: tuple[int, ...], image: bool
            ) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """(the shape to allocate, the permutation whose view of it has `shape`), the permutation
    None outside `STRIDED_SHARE`: an image (n, c, h, w) as a view of an NHWC tensor (channels_last
    strides), anything else with its last two dims transposed."""
    if rng.random() >= STRIDED_SHARE or len(shape) < 2:
        return shape, None
    if image and len(shape) == 4:
        n, c, h, w = shape
        return (n, h, w, c), (0, 3, 1, 2)
    perm = (*range(len(shape) - 2), len(shape) - 1, len(shape) - 2)  # its own inverse
    return tuple(shape[i] for i in perm), perm


def _view(x: torch.Tensor, perm: tuple[int, ...] | None) -> torch.Tensor:
    return x if perm is None else x.permute(*perm)


class _Reduce(nn.Module):
    def __init__(self, kind: str, dim: int | None = -1,
                 view: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.kind, self.dim, self.view = kind, dim, view

    def forward(self, x):
        x = _view(x, self.view)
        if self.kind == "softmax":
            return torch.softmax(x, dim=-1)
        if self.kind == "log_softmax":
            return torch.log_softmax(x, dim=-1)
        if self.kind == "spatial_mean":  # squeeze-and-excitation, global pooling by hand
            return x.mean((2, 3), keepdim=True)
        if self.kind == "spatial_l2norm":  # ConvNeXt-V2's global response norm
            return torch.linalg.vector_norm(x, 2, (2, 3), keepdim=True)
        if self.kind == "l2norm":  # F.normalize: cosine attention, XCiT, CLIP's embeddings
            return torch.linalg.vector_norm(x, 2, -1, keepdim=True)
        if self.kind == "amax":
            return x.amax(dim=-1)
        if self.kind == "sort":
            return torch.sort(x, dim=-1).values
        if self.kind == "argsort":
            return torch.argsort(x, dim=-1)
        if self.kind == "topk":
            return torch.topk(x, min(x.shape[-1], 100), dim=-1).values
        if self.kind == "cumsum":
            return x.cumsum(dim=self.dim)
        if self.kind == "std":
            return x.std() if self.dim is None else x.std(dim=self.dim)
        if self.kind == "argmax":
            return x.argmax(dim=self.dim)
        if self.kind == "max":
            return x.max(dim=1).values
        return x.sum(dim=-1)


REDUCE_TAIL = ("sort", "argsort", "topk", "cumsum", "std", "argmax", "max", "l2norm",
               "spatial_l2norm")
"""Reductions no classifier of a training zoo runs (detection post-processing, token pruning,
positional sums, L2 normalisation): never timed, they were predicted at 0.02-0.1x their time (sort
of 36 rows of 2940, topk 1000 of 100000, cumsum over 8x128x256, std; 1 thread)."""


def _reduce(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    """Reductions a model writes by hand: softmax over attention scores (b, heads, q, k),
    a spatial mean (squeeze-and-excitation), sums and maxima over the last dim. A training zoo
    of CNNs has almost none; without these the family had no model after a short profile."""
    kind = (rng.choice(("softmax", "softmax", "spatial_mean", "log_softmax", "amax", "sum"))
            if rng.random() < 0.6 else _deal(rng, REDUCE_TAIL))
    n = rng.choice((1, 1, 8))
    if kind in ("spatial_mean", "spatial_l2norm"):
        c = _channels(rng, 16, 2048)
        shape, view = _viewed(rng, (n, c, *(2 * [_fit_spatial(n, c, _spatial(rng))])), image=True)
        return _Reduce(kind, view=view), [shape], False
    if kind == "log_softmax":
        return _Reduce(kind), [(n, rng.choice((1000, 1000, 21843, 32000, 50257)))], False
    heads = rng.choice((1, 3, 4, 8, 12, 16))
    seq = rng.choice((16, 49, 64, 128, 197, 256, 512, 1024))
    while n * heads * seq * seq > MAX_RANDOM_NUMEL // 4 and seq > 16:
        seq //= 2
    dim: int | None = -1
    if kind in ("cumsum", "std", "argmax") and rng.random() < 0.4:
        dim = 2  # across rows
    elif kind in ("std", "argmax") and rng.random() < 0.3:
        dim = None  # the whole tensor: a std over 36x2940 took 0.08 ms, 0.16x what rows said
    shape, view = _viewed(rng, (n, heads, seq, seq), image=False)  # XCiT's transposed queries
    return _Reduce(kind, dim, view), [shape], False


class _Binary(nn.Module):
    def __init__(self, view: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.view = view

    def forward(self, a, b):
        a = _view(a, self.view)
        return a * torch.sigmoid(b) + a


ELTWISE_TAIL: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "exp": lambda a, b: torch.exp(a), "erf": lambda a, b: torch.erf(a),
    "tanh": lambda a, b: torch.tanh(a), "hardswish": lambda a, b: F.hardswish(a),
    "gelu": lambda a, b: F.gelu(a), "clamp": lambda a, b: a.clamp(-1, 1),
    "sqrt": lambda a, b: a.abs().sqrt(), "rsqrt": lambda a, b: torch.rsqrt(a.abs() + 1),
    "div": lambda a, b: a / b, "sub": lambda a, b: a - b, "pow": lambda a, b: a.pow(2),
    "maximum": lambda a, b: torch.maximum(a, b), "where": lambda a, b: torch.where(a > 0, a, b),
    "masked_fill": lambda a, b: a.masked_fill(b > 0, 0.0), "leaky_relu": lambda a, b: F.leaky_relu(a),
    "softplus": lambda a, b: F.softplus(a), "log": lambda a, b: torch.log(a.abs() + 1),
}
"""Elementwise ops beyond a CNN zoo's few (transformers, normalising flows, hand-written
activations), drawn on images and on token sequences: one model serves all of them, told apart
by `ops.op_code`; ops it never saw were priced at 0.04-0.74x (where, exp) or 21x (hardswish on
a sequence) their time (1 thread)."""


class _Tail(nn.Module):
    def __init__(self, name: str, view: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.name, self.view = name, view

    def forward(self, a, b):
        return ELTWISE_TAIL[self.name](_view(a, self.view), b)


def _tokens(rng: random.Random, c: int) -> tuple[int, int, int]:
    """A token sequence: (batch, tokens, channels)."""
    return rng.choice((1, 8)), rng.choice((16, 49, 128, 197, 512, 2940)), c


def _eltwise(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    c, hw = _channels(rng, 16, 1024), _spatial(rng)
    shape = (rng.choice((1, 8)), c, hw, hw)
    if rng.random() < 0.5:
        if rng.random() < 0.4:
            shape = _tokens(rng, c)
        other = shape if rng.random() < 0.7 else (*shape[:-1], 1)
        name = _deal(rng, sorted(ELTWISE_TAIL))
        first, view = _viewed(rng, shape, image=len(shape) == 4)
        return _Tail(name, view), [first, other], False
    if rng.random() < 0.3:  # a transformer's residual adds and gates
        shape = _tokens(rng, c)
        other = shape if rng.random() < 0.6 else (shape[0], 1, c)
        first, view = _viewed(rng, shape, image=False)
        return _Binary(view), [first, other], False
    other = shape if rng.random() < 0.6 else (shape[0], c, 1, 1)
    channels_last = rng.random() < 0.3
    first, view = _viewed(rng, shape, image=True) if not channels_last else (shape, None)
    return _Binary(view), [first, other], channels_last


class _Relayout(nn.Module):
    def __init__(self, dims: tuple[int, ...] | None) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x):
        if self.dims is None:
            return x.contiguous(memory_format=torch.channels_last)
        return x.permute(*self.dims).contiguous()


class _Rearrange(nn.Module):
    """Resampling and rearranging a feature map: FPN, U-Net and segmentation up- and
    down-sampling, super-resolution's pixel shuffle, padding, flips, channel concatenation."""

    def __init__(self, kind: str, channels: int) -> None:
        super().__init__()
        self.kind = kind
        # every other channel, made here: built in forward, its arange would be timed as well
        self.register_buffer("every_other", torch.arange(0, channels, 2))

    def forward(self, x):
        if self.kind == "nearest":
            return F.interpolate(x, scale_factor=2.0, mode="nearest")
        if self.kind == "bilinear":
            return F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
        if self.kind == "bilinear_down":
            return F.interpolate(x, scale_factor=0.5, mode="bilinear", align_corners=False)
        if self.kind == "bilinear_aligned":
            return F.interpolate(x, size=(2 * x.shape[-2] + 1,) * 2, mode="bilinear",
                                 align_corners=True)
        if self.kind == "pixel_shuffle":
            return F.pixel_shuffle(x, 2)
        if self.kind == "pad":
            return F.pad(x, (1, 1, 1, 1))
        if self.kind == "flip":
            return torch.flip(x, (-1,))
        if self.kind in NHWC_KINDS:  # Swin, MaxViT and their kin work on a dense NHWC map:
            n, c, h, w = x.shape  # the same memory read as (n, h, w, c), a free view
            return self._nhwc(x.reshape(n, h, w, c))
        if self.kind == "index_select":
            return x.index_select(1, self.every_other)
        return torch.cat([x, x], dim=1)

    def _nhwc(self, x):
        n, h, w, c = x.shape
        if self.kind == "roll":
            return torch.roll(x, (-3, -3), (1, 2))
        if self.kind == "pad_nhwc":  # Swin pads H and W up to whole windows, by 0 (a copy) or more
            return F.pad(x, (0, 0, 0, (7 - w % 7) % 7, 0, (7 - h % 7) % 7))
        if self.kind == "merge":  # Swin's patch merging: each 2x2 patch's four pixels side by
            return torch.cat([x[:, i::2, j::2] for j in (0, 1) for i in (0, 1)], -1)  # side
        s = next(s for s in (7, 8, 12, 10, 5, 4, 1) if h % s == 0)  # a window's side
        if self.kind == "windows":  # windows out of the map (Swin's partition, MaxViT's block)
            x = x.reshape(n, h // s, s, w // s, s, c).permute(0, 1, 3, 2, 4, 5)
            return x.reshape(-1, s * s, c)
        if self.kind == "unwindows":  # and back (Swin's window reverse)
            x = x.reshape(n, h // s, w // s, s, s, c).permute(0, 1, 3, 2, 4, 5)
            return x.reshape(n, h, w, c)
        # MaxViT's grid: an s x s grid of cells strided across the map, each a window
        x = x.reshape(n, s, h // s, s, w // s, c).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(-1, s * s, c)


NHWC_KINDS = ("roll", "pad_nhwc", "windows", "unwindows", "grid", "merge")
"""Rearrangements of a dense NHWC map, as window attention makes them. Swin-T's window partitions
and reverses (6-D permuted copies, channels innermost) were priced from image permutes that
gather: 1x8x8x7x7x96 at 132 us against 40 alone, its data ops at 1.27-1.76x their time alone
(8x3x224x224: 61.5 ms against 34.9); with these drawn 0.76-0.85x (26.5 ms), 1 thread. The cat of
its patch merging's four strided quarters was priced at 0.50-0.56x."""
REARRANGE_KINDS = ("nearest", "bilinear", "bilinear", "bilinear_down", "bilinear_aligned",
                   "pixel_shuffle", "pad", "flip", "index_select", "cat", *NHWC_KINDS)
"""Never timed before they were drawn here: up- and down-sampling was predicted at 0.02-0.58x
its time, pixel shuffle at 0.08x, Swin's roll of 1x56x56x96 at 6x (433 us against 72; 1 thread)."""


class _PositionBias(nn.Module):
    """Attention scores plus a relative-position bias looked up for every pair of tokens: Swin
    indexes a (offsets, heads) table with a flat map and permutes the result, LeViT, EfficientViT
    and TinyViT index a (heads, offsets) table with a (tokens, tokens) map. Never drawn, the
    gather was priced at 0.17x its time (EfficientViT-M0's 4x49 table by 49x49 offsets: 9.6 us
    against 56.7 alone; 1 thread)."""

    def __init__(self, heads: int, tokens: int, table_first: bool) -> None:
        super().__init__()
        side = math.isqrt(tokens)
        offsets = (2 * side - 1) ** 2 if table_first else tokens  # Swin's: every 2-d offset
        self.table_first, self.tokens = table_first, tokens
        self.register_buffer("table", torch.zeros((offsets, heads) if table_first
                                                  else (heads, offsets)))
        self.register_buffer("offsets", torch.zeros(tokens, tokens, dtype=torch.long))

    def forward(self, scores):
        if self.table_first:
            bias = self.table[self.offsets.view(-1)].view(self.tokens, self.tokens, -1)
            return scores + bias.permute(2, 0, 1)
        return scores + self.table[:, self.offsets]


class _GridSample(nn.Module):
    def forward(self, x, grid):
        return F.grid_sample(x, grid, mode="bilinear", align_corners=False)


class _RoiAlign(nn.Module):
    def __init__(self, size: int, scale: float) -> None:
        super().__init__()
        self.size, self.scale = size, scale

    def forward(self, x, rois):
        from torchvision.ops import roi_align

        return roi_align(x, rois, self.size, self.scale, sampling_ratio=2)


def _roi_align(rng: random.Random) -> tuple[nn.Module, list[tuple[int, ...]], bool]:
    """A two-stage detector's RoIAlign: up to 1000 proposals pooled to 7x7 for the box head, or
    up to 100 detections to 14x14 for the mask head, from one FPN level of an image resized to
    320-1067 pixels (the boxes: `ops._roi_inputs`)."""
    stride, side = rng.choice((4, 8, 16, 32)), rng.choice((320, 512, 800, 1067))
    size, c = rng.choice((7, 7, 14)), rng.choice((256, 256, 128))
    k = rng.choice((16, 50, 100, 150, 300, 500, 1000) if size == 7 else (8, 16, 50, 100))
    return _RoiAlign(size, 1 / stride), [(1, c, side // stride, side * 4 // 3 // stride), (k, 5)], False


def _nms(rng: random.Random) -> OpRecord:
    """Non-maximum suppression as detectors run it: N of 100-5000 candidate boxes (a region
    proposal network's 1000 per FPN level, one class's boxes), of which 5-100% survive (the
    replay's boxes are built to keep that many: `ops._nms_inputs`). Its output size is the
    number kept, which capture on fake tensors cannot know, so the record is written out."""
    n = rng.choice((100, 300, 1000, 2000, 3000, 5000))
    k = max(1, round(n * rng.choice((0.05, 0.2, 0.5, 0.8, 1.0))))
    boxes, scores = ((n, 4), (n,))
    specs = [TensorSpec(s, _contiguous_strides(s), "float32") for s in (boxes, scores)]
    kept = TensorSpec((k,), (1,), "int64")
    return OpRecord("torchvision.nms.default", (*specs, rng.choice((0.5, 0.7))), {}, (kept,), "nms")


Drawn = tuple[nn.Module, list[tuple[int, ...]], bool] | OpRecord
"""A generator's draw: a module, its input shapes and whether it runs channels_last; or, for an
op whose outputs capture cannot follow, the record itself."""


POW2_LAYOUT_SHARE = 0.4
"""Of the transposing copies, the share drawn with a power-of-two channel count, as nearly every
real network has. Their rows fall in a few cache sets, so they gather far slower: 1x1024x1024
transposed took 3.27 ms against 0.71 for 1x1024x1040 (1 thread). The copies drawn with
`_channels` alone were rarely powers of two, and XLNet's einsum copy of 1024x16x64 was priced at
0.9 ms against 4.6 ms timed alone (`ops._gather_stride_pow2` is the feature that tells them)."""


TOKEN_MAP_POW2_SHARE = 0.6
"""Of the token maps `_layout_copy` draws (a token sequence turned back into an NHWC map, made
NCHW: the copy ATen makes inside a conv on it, `ops.dense_input_split`), the share with a
power-of-two channel count. Hierarchical vision transformers (PVT, SegFormer, CoaT) do this at
every stage (56x56 down to 7x7 at 224 px), with 32-512 channels. At 256 channels on 56x56 the copy
took 4.4-5.2 ms and at 240 or 264 channels 0.57-0.61 ms (1 thread): its rows fall in a few cache
sets. A 10-minute profile held no NHWC-to-NCHW copy of 256 or more channels among its 28
four-dim transposing copies, priced pvt_v2_b0's at 0.89 ms, and pvt_v2_b0 came out -26% and -30%."""


def _layout_channels(rng: random.Random) -> int:
    if rng.random() < POW2_LAYOUT_SHARE:
        return 1 << rng.randint(4, 10)
    return _channels(rng, 16, 1024)


MAX_PERMUTE_NUMEL = 4 << 20


def _permute_copy(rng: random.Random) -> Drawn:
    """A copy of a 3- or 4-dim tensor into a random order of its dims that moves the innermost
    one, as einsum does to an operand whose contracted letters do not merge (XLNet's weight,
    1024x16x64 to 64x16x1024). Unlike a 2-D transpose, such a copy can read a line apart in
    several dims before it comes back to one (`ops._log_gather_footprint`)."""
    rank = rng.choice((3, 3, 4))
    shape = [1]
    while math.prod(shape) < 1 << 14:  # some dims heads-sized, the rest channels or tokens
        shape = [_layout_channels(rng) if rng.random() < 0.7 else rng.choice((2, 3, 4, 8, 12, 16))
                 for _ in range(rank)]
    while math.prod(shape) > MAX_PERMUTE_NUMEL:
        shape[shape.index(max(shape))] //= 2
    dims = list(range(rank))
    while dims[-1] == rank - 1:
        rng.shuffle(dims)
    return _Relayout(tuple(dims)), [tuple(shape)], False


def _layout_copy(rng: random.Random) -> Drawn:
    """Transposing copies: NCHW to NHWC and back, a token sequence to an image's channel-first
    layout (what a conv on a transposed sequence copies inside the kernel), attention heads
    split from tokens. The zoo's copies are nearly all contiguous reads; these are gathers.
    And bilinear grid sampling: a spatial transformer's warp of a feature map, and RAFT's
    look-up of 7x7 windows of its correlation volume, one small image per pixel. And the
    detectors' RoIAlign (a bilinear gather) and non-maximum suppression, where torchvision is
    installed."""
    n = rng.choice((1, 1, 8))
    kind = rng.choice(("image", "image", "image", "token map", "token map", "sequence",
                       "sequence", "heads", "grid", "roi", "nms", "bias", "permute",
                       *("rearrange",) * 8))  # 16 kinds dealt (REARRANGE_KINDS), 4+ of each
    if kind == "token map":  # TOKEN_MAP_POW2_SHARE
        c = 1 << rng.randint(5, 9) if rng.random() < TOKEN_MAP_POW2_SHARE else _channels(rng, 32, 512)
        hw = _fit_spatial(n, c, rng.choice((14, 28, 56, 56, 112)))
        return _Relayout((0, 1, 2, 3)), [(n, c, hw, hw)], True
    if kind == "bias":
        tokens, heads = rng.choice((16, 49, 49, 64, 144, 196)), rng.choice((2, 3, 4, 6, 8, 12, 16))
        table_first = rng.random() < 0.5
        return _PositionBias(heads, tokens, table_first), [(n, heads, tokens, tokens)], False
    if kind == "rearrange":
        c = _channels(rng, 16, 512) // 4 * 4 or 16
        hw = _fit_spatial(n, 4 * c, rng.choice((7, 10, 14, 20, 28, 32, 40, 56, 64, 80, 128)))
        kind = _deal(rng, REARRANGE_KINDS)  # NHWC kinds read their dense input as NHWC
        channels_last = rng.random() < 0.2 and kind not in NHWC_KINDS
        return _Rearrange(kind, c), [(n, c, hw, hw)], channels_last
    if kind in ("roi", "nms"):
        if importlib.util.find_spec("torchvision") is not None:
            return _roi_align(rng) if kind == "roi" else _nms(rng)
        kind = "image"
    if kind == "grid":
        if rng.random() < 0.5:
            c = _channels(rng, 16, 256)
            hw = _fit_spatial(n, c, _spatial(rng))
            return _GridSample(), [(n, c, hw, hw), (n, hw, hw, 2)], False
        pixels, side = rng.choice((256, 700, 1000, 2852, 5000)), rng.choice((4, 8, 16, 32, 46))
        window = rng.choice((5, 7, 9))
        return _GridSample(), [(pixels, 1, side, side), (pixels, window, window, 2)], False
    if kind == "permute":
        return _permute_copy(rng)
    if kind == "image":
        c = _layout_channels(rng)
        hw = _fit_spatial(n, c, _spatial(rng))
        dims = rng.choice(((0, 2, 3, 1), (0, 3, 1, 2), None, (0, 1, 2, 3)))
        # (0, 1, 2, 3): an NHWC map made NCHW, the copy ATen makes of a transposed token
        # sequence before a conv on it (pvt_v2's 1x256x56x56: 1.75 ms, where the contiguous
        # conv after it takes 0.48; 1 thread); "token map" draws more of them, at the channel
        # counts and map sizes of hierarchical vision transformers (TOKEN_MAP_POW2_SHARE)
        return _Relayout(dims), [(n, c, hw, hw)], dims == (0, 1, 2, 3)
    if kind == "sequence":
        c = _layout_channels(rng)
        hw = _fit_spatial(n, c, rng.choice((7, 14, 28, 56, 64, 128)))
        return _Relayout((0, 2, 1)), [(n, hw * hw, c)], False
    heads, dim = rng.choice((2, 4, 8, 12, 16)), rng.choice((32, 64))
    tokens = rng.choice((49, 64, 128, 197, 256, 784, 3136))
    return _Relayout((0, 2, 1, 3)), [(n, tokens, heads, dim)], False


GENERATORS: dict[str, Callable[[random.Random], Drawn]] = {
    "conv": _conv,
    "matmul": _product,
    "attention": _attention,
    "rnn": _rnn,
    "pool": _pool,
    "norm": _norm_act,
    "eltwise": _eltwise,
    "reduce": _reduce,
    "data": _layout_copy,
}
"""Random-config generators, one per op family (see `Drawn`)."""


DRAWS: dict[str, int] = {"eltwise": 4, "data": 4, "reduce": 2, "rnn": 2, "norm": 2, "conv": 2,
                         "pool": 3, "matmul": 3}
"""Random configs a family draws, as a multiple of the profile's count per family: the families
that share one model across many ops (told apart by `ops.op_code`) need several configs of each
op, and their ops are cheap to time. At one multiple (60 draws), a 10-minute profile held 1-4
configs of each tail elementwise op and the family's model, cross-validated, missed them by
34-93% (where, erf, div, masked_fill, softplus; 1 thread), against 4-11% for ops with 80 or more.
Recurrent layers have only random configs (no zoo model has one): 58 of them priced a GRU at
0.65-0.83x its time in two profiles. Norms draw twice: with 4 weight standardisations among the
1609 norm configs of a profile (one multiple), the model priced them at 0.26-0.67x their time
alone (nf_resnet50, 12-04 evening). Layout copies draw four times: a 10-minute profile held 65
transposing copies among 1138 data configs, 4 of them gathering 1 KiB or more apart, and priced
pvt_v2_b0's NHWC-to-NCHW copies at 0.21-0.31x their time alone (12-05). Pools draw three times:
at one multiple a 10-minute 1-thread profile held two dense 3x3 stride-1 max pools (Inception's
branch pools; half of googlenet's op time at batch 1), and priced googlenet's pools at 0.74-0.79x
their time alone at the profile's usual pace; 119 more random pools took them to 0.80-0.92x and
inception_v3's from 1.08-1.11x to 1.00-1.02x (`benchmarks/add_random.py`, `databases_vs_alone.py`;
12-06). Products draw three times, half of them products of two activations
(`BATCHED_PRODUCT_SHARE`), so that the linear layers keep a few more configs than before those
joined them."""


def draws(family: str, n: int) -> int:
    """How many random modules `family` draws when a profile asks `n` of each family."""
    return n * DRAWS.get(family, 1)


def random_records(family: str, n: int, *, seed: int = 0, device_type: str = "cpu",
                   dtype: str = "float32") -> list[OpRecord]:
    """Timed op records from `n` random modules of one family, captured like a real model (or
    written out, for an op capture cannot follow)."""
    from profilers.capture import capture

    rng = random.Random(f"{family}-{seed}")
    records: list[OpRecord] = []
    for _ in range(n):
        drawn = GENERATORS[family](rng)
        if isinstance(drawn, OpRecord):  # written out in float32 (boxes stay float32)
            args = tuple(replace(a, device=device_type) if isinstance(a, TensorSpec) else a
                         for a in drawn.args)
            outputs = tuple(replace(o, device=device_type) for o in drawn.outputs)
            records.extend(timed_records([replace(drawn, args=args, outputs=outputs)]))
            continue
        module, shapes, channels_last = drawn
        specs = [TensorSpec(s, _contiguous_strides(s), dtype, device_type) for s in shapes]
        try:
            ops = capture(module.eval(), specs, device_type=device_type, dtype=dtype,
                          channels_last=channels_last)
        except Exception:  # noqa: BLE001 - a random module the target cannot run is skipped
            continue
        records.extend(timed_records(ops))
    return records
