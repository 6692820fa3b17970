"""Subnormal floats: how many one forward pass uses, and what each use costs on this CPU.

Op timings run on random inputs, which hold no subnormal value, and a capture on fake tensors
has no values at all; but a model whose activations underflow (Swin's -100 mask before a
softmax, random weights that shrink activations layer by layer) runs its CPU's slow path for
them. On the 2-vCPU Intel Xeon of 2026-12-05 that took swin_t at 1x3x160x160 from 66 ms to
169 ms and hf:mobilevit from 62 ms to 853 ms (1 thread); an AMD EPYC VM nearly did not pay it.

What a use costs depends on how the kernel meets the value. Timed alone on that Xeon (1 thread,
1%, 10% and 50% of the inputs subnormal; `benchmarks/subnormal_cost.py`):
- A matmul or convolution pays per multiply-add that reads one: a subnormal input element costs
  about as many slow steps as the op reuses it (`reuse`: the op's FLOPs / 2 / the input's
  elements; N for the activations of a linear layer). Per reuse: 2.1-2.3 ns (linear
  196x384 by 384x384), 2.4-2.9 ns (bmm), 2.1-2.3 ns (3x3 conv), the same at every share. A 1x1
  convolution paid per vector instead (34 ns at 1%, 4.5 ns at 50%). A multiply-add whose other
  operand is an exact zero pays nothing, so a matrix product's uses are counted exactly: its
  multiply-adds that take the slow path (`_slow_products`), which normal values whose product
  underflows take too.
- An elementwise op, a norm or a softmax pays per vector instruction that holds one: per block
  of 16 float32 values (64 bytes) holding a subnormal, read or written, 12-136 ns (add, mul,
  silu, gelu), saturating once every block holds one.
- A copy, a view or a concatenation does no arithmetic and paid nothing (1.0x).
Inside swin_t at 1 thread (2026-12-06, two runs; each op's in-model time with its inputs as
computed and with their subnormals zeroed: `benchmarks/subnormal_inmodel.py`), its linear layers
paid 2.60-2.64 ns per use and its attention matmuls 2.65-2.81 (224 px) and 2.67-2.94 (160 px,
whose zero-padded stage-3 values leave 0.37x the uses of 224 px in the same bmm), against
2.44-2.62 from `measure_cost` in the same minutes. In random-weight hf:mobilevit (12-06) the
linear layers paid 2.2-3.6 ns per use, counting the products of its shrunken normal values that
underflow (`_slow_products`; without them 4.0 on 12-05), and the convolutions 2.6 (12-05).

Threads share the slow path as the kernel shares the work. A linear layer's threads all read
every row, so its subnormals spread evenly; a batched matmul gives each thread a contiguous part
of its batch of matrices, and Swin's mask crowds its subnormals into the border windows, 11 of
15 in one half of stage 1's: at 2 threads and batch 1 that bmm paid 1.43-1.67x what it paid at
batch 8, where the images split evenly (`benchmarks/subnormal_placement.py`). So a batched
matmul's uses are kept per matrix too, and the busiest thread's excess is priced (`crowding`).
Inside swin_t at 2 threads its linears paid 1.30-1.35 ns per use (probe 1.28-1.32) and its
attention matmuls 1.6-1.7x the probe at 224 px, of which `crowding` accounts for 1.43-1.48x.

So a device's cost is two numbers measured on it (`measure_cost`): ns per reuse in the matmul
families and ns per block elsewhere, spread evenly over its threads; and a model's uses are two
counts per family from one real forward pass (`count_uses`), with the batched matmuls' uses per
matrix. Their product is what `predictor.e2e` adds to a CPU prediction.
"""

from __future__ import annotations

import math
import statistics
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from profilers import ops, pace
from profilers.timer import measure

BLOCK = 16  # float32 values per 64-byte vector register: what one instruction reads or writes
# families whose kernels multiply-add each input element many times (`reuse`)
REUSE_FAMILIES = ("conv", "matmul", "attention", "rnn")
# families that move values without arithmetic, and ops that do nothing: no slow path
FREE_FAMILIES = ("data", "free")
# ops computing matrix products A @ B: the positions of A and B in their arguments, and whether
# B is given transposed (a linear layer's weight, out x in)
PRODUCTS = {"aten.mm": (0, 1, False), "aten.bmm": (0, 1, False), "aten.matmul": (0, 1, False),
            "aten.addmm": (1, 2, False), "aten.baddbmm": (1, 2, False),
            "aten.linear": (0, 1, True)}
# ops whose CPU kernel hands each thread a contiguous part of a batch of matrices (a matmul of
# two operands with 3 or more dims runs as a bmm over their leading dims), so that where the
# subnormals lie in the batch decides how long the busiest thread runs the slow path
BATCHED_MATMULS = ("aten.bmm", "aten.baddbmm", "aten.matmul")


@dataclass
class SubnormalUses:
    """The subnormal values one forward pass uses: per op family, the multiply-adds on the slow
    path (`REUSE_FAMILIES`: a matrix product's counted by `_slow_products`, which include
    products of normal values that underflow; a convolution's as each subnormal input times its
    reuse), and 16-value blocks holding one, read or written (the others)."""

    share: float = 0.0  # of the float32 values its ops write
    reuse: dict[str, float] = field(default_factory=dict)
    blocks: dict[str, float] = field(default_factory=dict)
    # each batched matmul reading subnormals (`BATCHED_MATMULS`): its family and its reuses per
    # matrix of the batch, as counted; the batch runs `copies` times that (`scaled`)
    per_matrix: list[tuple[str, tuple[float, ...]]] = field(default_factory=list)
    copies: int = 1

    @property
    def any(self) -> bool:
        """Whether anything takes the slow path (`share` counts subnormal values written only:
        products of normal values can underflow into a sum that the bias makes normal)."""
        return bool(self.reuse or self.blocks)

    def scaled(self, k: int) -> SubnormalUses:
        """The uses of `k` times the work (a batch of k where this counted one)."""
        return SubnormalUses(self.share, {f: v * k for f, v in self.reuse.items()},
                             {f: v * k for f, v in self.blocks.items()}, self.per_matrix,
                             self.copies * k)


def crowding(per_matrix: Sequence[float], copies: int, threads: int) -> float:
    """The reuses a batched matmul's busiest thread runs beyond an even share, counted as the
    `threads` would pay them together: `threads` x the busiest of `threads` contiguous parts
    of the batch (`per_matrix` repeated `copies` times; so the Xeon split swin_t's bmms), less
    the total. Swin's shifted-window mask leaves its subnormals in the border windows, 11 of
    15 in the second half of stage 1's: 1.47x an even split at 2 threads and batch 1, and
    none at batch 8, where the images split 4 and 4 (`benchmarks/subnormal_placement.py`)."""
    total = sum(per_matrix) * copies
    if threads <= 1 or not total or copies % threads == 0:  # whole copies each: even
        return 0.0
    n = len(per_matrix) * copies
    part = -(-n // threads)  # ceil(n / threads) matrices a thread
    busiest = max(sum(per_matrix[i % len(per_matrix)] for i in range(start, min(start + part, n)))
                  for start in range(0, n, part))
    return max(threads * busiest - total, 0.0)


def price(uses: SubnormalUses, cost: dict) -> dict[str, float]:
    """Seconds of slow path per family: `uses` at a device's measured `cost` (`measure_cost`,
    timed spread evenly over its `threads`), with the wait where a batched matmul's are not
    (`crowded_s`)."""
    out = crowded_s(uses, cost)
    for counts, ns in ((uses.reuse, cost["reuse_ns"]), (uses.blocks, cost["block_ns"])):
        for family, n in counts.items():
            if n > 0:
                out[family] = out.get(family, 0.0) + n * ns * 1e-9
    return out


def crowded_s(uses: SubnormalUses, cost: dict) -> dict[str, float]:
    """Seconds per family that batched matmuls wait on their busiest thread (`crowding`)."""
    out: dict[str, float] = {}
    for family, profile in uses.per_matrix:
        if n := crowding(profile, uses.copies, int(cost.get("threads") or 1)):
            out[family] = out.get(family, 0.0) + n * cost["reuse_ns"] * 1e-9
    return out


def _subnormal(t: torch.Tensor) -> torch.Tensor:
    return (t != 0) & (t.abs() < torch.finfo(t.dtype).tiny)


def _floats(value: Any) -> list[torch.Tensor]:
    """The float32 CPU tensors in `value`: the cost is measured in float32 only (PyTorch's CPU
    kernels mostly widen 16-bit floats to float32, where a float16 subnormal is normal; a
    bfloat16 one is not, and goes uncounted)."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    return [t for t in items if isinstance(t, torch.Tensor) and t.dtype == torch.float32
            and t.numel() and t.device.type == "cpu"]


# Which multiply-adds take the slow path, timed on the 2-vCPU Intel Xeon (2026-12-06, 1 thread: a
# 64x256 by 256x256 linear, plain against subnormals flushed, ~3 ns a slow one). A subnormal
# operand pays, whatever the sum it adds to, until the operands' exponents (a subnormal's counted
# as -127) sum below -159: 2^-140 x 2^-32 paid, x 2^-33 did not, so its partner must reach 2^-32
# (`_PARTNER`); two subnormals never pay. Two normal operands pay where their product is under the
# smallest normal (`_TINY`), down to about 2^-158 (`_FLOOR`: 1e-20 x 1e-27 paid, x 1e-28 did
# not). In hf:mobilevit's linears (random weights, 1 thread) every such product paid, 2.7-3.6 ns
# against `measure_cost`'s 2.8-3.6, in their order of k or shuffled; a product added to a sum
# 1e22 times larger did not (after 128 products of 1e-20), which no model here computes.
_TINY = 2.0 ** -126
_PARTNER = 2.0 ** -32
_FLOOR = 2.0 ** -158


def _slow_products(a: torch.Tensor, b: torch.Tensor, tiny: bool) -> torch.Tensor:
    """The multiply-adds of `a @ b` (broadcast as torch.matmul does) on the slow path, per
    matrix of the batch: a subnormal with a partner of 2^-32 or more, and normal operands whose
    product underflows (`_tiny_products`). A subnormal times an exact zero costs nothing:
    swin_t at 160 px pads its stage-3 tokens with zeros, so half the rows of those blocks'
    attention values are zero, 0.37x the uses of 224 px in the same bmm, which paid 1.13 ms of
    slow path against 3.0-3.2 at 224 (2 threads). In hf:mobilevit with random weights linears
    whose inputs held almost no subnormal paid 20-26 ms each for the products of their shrunken
    activations and weights, and its q @ k^T, both operands all subnormal, paid nothing.
    `tiny`: whether the operands' ranges allow an underflowing product of normals
    (`_underflow_possible`); where they do not, the exact count is skipped."""
    a = a[None] if a.dim() == 1 else a
    b = b[:, None] if b.dim() == 1 else b
    f64 = torch.float64
    subnormal = ((_subnormal(a).sum(-2, dtype=f64) * (b.abs() >= _PARTNER).sum(-1, dtype=f64))
                 .sum(-1) + (_subnormal(b).sum(-1, dtype=f64)
                             * (a.abs() >= _PARTNER).sum(-2, dtype=f64)).sum(-1))
    return subnormal + _tiny_products(a, b) if tiny else subnormal


def _normal(t: torch.Tensor) -> torch.Tensor:
    """|t| in float64 with its subnormals set to zero."""
    t = t.abs().double()
    return t.masked_fill(t < _TINY, 0.0)


def _tiny_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per matrix of the batch, the multiply-adds of normal operands whose product lies in
    [_FLOOR, _TINY)."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    na, nb = _normal(a), _normal(b)
    k = a.shape[-1]
    if b.dim() == 2:  # one matrix for every row of a's batch: a single product, row by row
        rows = _rows_tiny(na.reshape(1, -1, k), nb[None]).reshape(a.shape[:-1])
        return rows.sum(-1)
    na = na.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    nb = nb.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    return _rows_tiny(na, nb).sum(-1).reshape(batch)


def _rows_tiny(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per matrix and row of `a` (B x M x K), its multiply-adds with `b` (B x K x N) whose
    product lies in [_FLOOR, _TINY): for each a[m, k], the b[k, n] between _FLOOR / a[m, k] and
    _TINY / a[m, k], found in b's sorted rows. A zero a[m, k] finds none."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    ranked = b.sort(dim=-1).values.reshape(-1, n).contiguous()  # per (matrix, k): N sorted
    each = a.transpose(-1, -2).reshape(-1, m).contiguous()  # per (matrix, k): M values
    count = torch.searchsorted(ranked, _TINY / each) - torch.searchsorted(ranked, _FLOOR / each)
    return count.reshape(-1, k, m).sum(1, dtype=torch.float64)


def product_uses(name: str, args: tuple, *, tiny: bool | None = None
                 ) -> tuple[torch.Tensor, bool]:
    """A matrix product's (`PRODUCTS`, by op name) multiply-adds on the slow path, per matrix of
    its batch (`_slow_products`; `tiny`: whether products of normals can underflow, None: from
    the operands' ranges), and whether its kernel splits that batch over threads
    (`BATCHED_MATMULS`: both operands 3-D or more)."""
    i, j, transposed = PRODUCTS[name]
    a, b = args[i], args[j].t() if transposed else args[j]
    if tiny is None:
        tiny = _underflow_possible(_span(a), _span(b))
    return (_slow_products(a, b, tiny),
            name in BATCHED_MATMULS and a.dim() >= 3 and b.dim() >= 3)


def _span(t: torch.Tensor) -> tuple[float, float]:
    """The smallest normal and the largest magnitude in `t` (inf, 0 where it has no normal)."""
    size = t.abs()
    return (float(torch.where(size >= _TINY, size, math.inf).min()), float(size.max()))


def _underflow_possible(span_a: tuple[float, float], span_b: tuple[float, float]) -> bool:
    """Whether two normal values, one in each `_span`, can multiply to [_FLOOR, _TINY): most
    products of most models cannot, and skip the exact count."""
    (low_a, high_a), (low_b, high_b) = span_a, span_b
    return low_a * low_b < _TINY and high_a * high_b >= _FLOOR


def _pointwise_input(func: Any, args: tuple) -> torch.Tensor | None:
    """The input of a 1x1, ungrouped convolution, whose kernel pays the slow path per vector of
    16 channels holding a subnormal, every value of it (`_channel_vectors`): timed alone on the
    Xeon, 34 ns per reuse at 1% subnormal and 4.5 at 50% (12-05); inside hf:mobilevit (12-06, 1
    thread) two 1x1 convs whose inputs were 14% and 28% subnormal paid 37.5 and 24.8 ms, priced
    7.0 and 7.3 per subnormal, 21.4 and 16.6 per 16 values in memory order, 44.9 and 25.4 per 16
    channels. Other convolutions pay per value (a 3x3: 2.2-2.4 ns at every share)."""
    if str(func.overloadpacket) not in ("aten.conv2d", "aten.convolution") or len(args) < 2:
        return None
    weight = args[1]
    groups = args[8] if str(func.overloadpacket) == "aten.convolution" else (
        args[6] if len(args) > 6 else 1)
    if (isinstance(weight, torch.Tensor) and weight.dim() == 4
            and tuple(weight.shape[-2:]) == (1, 1) and groups == 1):
        return args[0]
    return None


def _channel_vectors(t: torch.Tensor) -> int:
    """The values of `t` (N x C x ...) in vectors of 16 channels at one position that hold a
    subnormal: what a 1x1 convolution's kernel (channels innermost) computes slowly."""
    mask = _subnormal(t).movedim(1, -1) if t.dim() > 2 else _subnormal(t)
    return min(t.numel(), _blocks(mask) * BLOCK)


def _blocks(mask: torch.Tensor) -> int:
    """16-value blocks of `mask`, in row-major order, holding at least one True."""
    flat = mask.contiguous().reshape(-1)
    pad = (-flat.numel()) % BLOCK
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return int(flat.reshape(-1, BLOCK).any(1).sum())


def _passes_through(func: Any, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> bool:
    """Whether an op handed an input back as its output without writing it (dropout at
    inference: swin_t's 48 held 229,532 subnormal values and paid 0.05 ms for them all); an
    in-place op (relu_, add_) hands its input back too, written."""
    if func._schema.is_mutable:
        return False
    starts = {t.data_ptr() for t in ins}
    return bool(outs) and all(t.data_ptr() in starts for t in outs)


class _Counter:
    """A dispatch mode's body: counts each non-view op's subnormal inputs and outputs. An op's
    output keeps its count for the ops that read it (a view is counted where it is read)."""

    def __init__(self) -> None:
        self.uses = SubnormalUses()
        self.written = [0, 0]  # subnormal, all float32 values written
        self._seen: dict[int, tuple[weakref.ref, tuple[int, int]]] = {}  # id(tensor) ->
        self._spans: dict[int, tuple[weakref.ref, tuple[float, float]]] = {}  # -> `_span`

    def _count(self, t: torch.Tensor, written: bool = False) -> tuple[int, int]:
        """(subnormal values, 16-value blocks holding one) of `t`: counted afresh where an op
        has just `written` it (in place too), else as counted when it was written."""
        seen = self._seen.get(id(t))
        if written or seen is None or seen[0]() is not t:  # a new tensor may reuse a dead id
            mask = _subnormal(t)
            sub = int(mask.sum())
            seen = self._seen[id(t)] = (weakref.ref(t), (sub, _blocks(mask) if sub else 0))
            self._spans.pop(id(t), None)
        return seen[1]

    def _tiny_possible(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        """Whether two normal values of `a` and `b` can multiply to under the smallest normal
        (`_tiny_products`), from each tensor's range, kept while it is unchanged (a weight's
        for the whole pass): most products of most models cannot, and cost one look."""
        spans = []
        for t in (a, b):
            seen = self._spans.get(id(t))
            if seen is None or seen[0]() is not t:
                seen = self._spans[id(t)] = (weakref.ref(t), _span(t))
            spans.append(seen[1])
        return _underflow_possible(*spans)

    def record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if getattr(func, "is_view", False):  # an alias of values already counted
            return
        outs = _floats(out)
        ins = [t for a in (*args, *kwargs.values()) for t in _floats(a)]
        if _passes_through(func, ins, outs):
            return
        read = [self._count(t) for t in ins]  # before an in-place op's output is counted
        for t in outs:
            self.written[0] += self._count(t, written=True)[0]
            self.written[1] += t.numel()
        family = ops.family_of(str(func))
        if family in FREE_FAMILIES:
            return
        if family in REUSE_FAMILIES:
            name = str(func.overloadpacket)
            tiny = False  # a matrix product's normal values may underflow too
            if name in PRODUCTS:
                a, b = (args[k] for k in PRODUCTS[name][:2])
                tiny = (any(a is t for t in ins) and any(b is t for t in ins)
                        and self._tiny_possible(a, b))
            if tiny or any(sub for sub, _ in read):
                self._reuses(func, args, kwargs, out, family, ins, read, tiny)
            return
        n = sum(blocks for _, blocks in read) + sum(self._count(t)[1] for t in outs)
        if n:
            self.uses.blocks[family] = self.uses.blocks.get(family, 0.0) + n

    def _reuses(self, func: Any, args: tuple, kwargs: dict, out: Any, family: str,
                ins: list[torch.Tensor], read: list[tuple[int, int]], tiny: bool) -> None:
        """Count an op's multiply-adds on the slow path: exactly for a matrix product
        (`PRODUCTS`: `_slow_products`, per matrix of a batched one), else as
        each subnormal input times the op's FLOPs / 2 / the input's elements."""
        name = str(func.overloadpacket)
        profile = None
        if name in PRODUCTS:
            per, batched = product_uses(name, args, tiny=tiny)
            profile = per.flatten() if batched else None
            # a bias or an added matrix: each subnormal value read once
            i, j, _ = PRODUCTS[name]
            n = float(per.sum()) + sum(sub for t, (sub, _) in zip(ins, read, strict=True)
                                       if t is not args[i] and t is not args[j])
        else:
            from profilers.capture import _output_specs
            from profilers.oprecord import OpRecord

            flops = ops.flops_of(OpRecord.of_call(func, args, kwargs, _output_specs(out), ""))
            pointwise = _pointwise_input(func, args)
            n = sum((_channel_vectors(t) if t is pointwise else sub)
                    * max(1.0, flops / 2 / t.numel())
                    for t, (sub, _) in zip(ins, read, strict=True) if sub)
        if n:
            self.uses.reuse[family] = self.uses.reuse.get(family, 0.0) + n
        if profile is not None and float(profile.sum()):
            self.uses.per_matrix.append((family, tuple(profile.tolist())))


def count_uses(model: torch.nn.Module, args: Sequence[Any]) -> SubnormalUses:
    """The subnormal values `model(*args)` uses, from one real forward pass (inference mode)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counter = _Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            counter.record(func, args, kwargs or {}, out)
            return out

    with torch.inference_mode(), Count():
        model(*args)
    sub, total = counter.written
    counter.uses.share = sub / total if total else 0.0
    return counter.uses


def uses_of_spec(spec: str, inputs: list[str] | None = None, *, batch: int | None = None,
                 dtype: str = "float32", device: str = "cpu",
                 threads: int | None = None) -> SubnormalUses:
    """`count_uses` of a model spec built for real (its own weights, random inputs)."""
    from profilers.modelbench import prepare
    from profilers.timer import thread_count

    with thread_count(threads):
        model, args = prepare(spec, inputs, batch=batch, dtype=dtype, device=device)
        return count_uses(model, args)


def uses_of_spec_isolated(spec: str, inputs: list[str] | None = None, *,
                          threads: int | None = None, **kw: Any) -> SubnormalUses:
    """`uses_of_spec` in a fresh child process, like the timings it explains."""
    from profilers.modelbench import _in_child

    return _in_child(uses_of_spec, spec, inputs, threads, **kw)


def uses_at_batch_one(spec: str, inputs: Sequence[Any], *, dtype: str = "float32"
                      ) -> SubnormalUses:
    """`uses_of_spec` at `inputs` (InputSpecs), run at batch 1 and scaled to their batch: a
    sample's values do not depend on the others' at inference, and swin_t at 224 px counts in
    2.6 s at batch 1 and 6.6 s at batch 8."""
    from profilers.specs import batch_of, with_batch

    lead = batch_of(list(inputs))
    if lead > 1:
        return uses_of_spec(spec, [str(i) for i in with_batch(list(inputs), 1)],
                            dtype=dtype).scaled(lead)
    return uses_of_spec(spec, [str(i) for i in inputs] or None, dtype=dtype)


# ------------------------------------------------------------------ what a use costs here

COST_SHARE = 0.1  # of the inputs made subnormal: where every kernel above was still linear in it


def _with_subnormals(shape: tuple[int, ...], share: float, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(shape, generator=gen)
    pick = torch.rand(shape, generator=gen) < share
    return torch.where(pick, torch.sign(x) * 3e-39, x)


def _median_s(fn: Callable[[], Any], budget_s: float) -> float:
    """The median of `fn`'s timings within `budget_s` (`profilers.timer.measure`)."""
    return measure(fn, warmup=2, min_reps=5, max_reps=51, max_time_s=budget_s).median_s


def measure_cost(threads: int | None = None, budget_s: float = 1.5) -> dict:
    """ns of slow path per reuse of a subnormal input in a matmul (a 196x384 by 384x384 linear,
    10% of its activations subnormal, against none) and per 16-value block holding a subnormal
    in an elementwise op (silu and add on 1x64x56x56, the median of the two), on this CPU at
    `threads`. A cost under the timing noise comes out 0."""
    from profilers.timer import thread_count

    gen = torch.Generator().manual_seed(0)
    share_s = budget_s / 6
    with thread_count(threads) as used, torch.inference_mode():
        w = torch.randn(384, 384, generator=gen) * 0.05
        plain, sub = (_with_subnormals((196, 384), s, gen) for s in (0.0, COST_SHARE))
        extra = (_median_s(lambda: torch.nn.functional.linear(sub, w), share_s)
                 - _median_s(lambda: torch.nn.functional.linear(plain, w), share_s))
        reuse_ns = max(extra, 0.0) / (int(_subnormal(sub).sum()) * w.shape[0]) * 1e9
        block = []
        for fn in (torch.nn.functional.silu, lambda x: x + 1.0):
            plain, sub = (_with_subnormals((1, 64, 56, 56), s, gen) for s in (0.0, COST_SHARE))
            extra = (_median_s(lambda f=fn, x=sub: f(x), share_s)
                     - _median_s(lambda f=fn, x=plain: f(x), share_s))
            uses = _blocks(_subnormal(sub)) + _blocks(_subnormal(fn(sub)))
            block.append(max(extra, 0.0) / uses * 1e9)
        run = pace.probe()
        pace_ms = min(run(), run()) * 1e3  # the machine's pace meanwhile (profilers.pace)
    return {"reuse_ns": round(reuse_ns, 3), "block_ns": round(statistics.median(block), 2),
            "threads": used, "share": COST_SHARE, "pace_ms": round(pace_ms, 4)}
