"""The op registry: exact FLOP and byte counts, families, coverage of the reference ops."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from profilers import ops
from profilers.capture import record_real
from profilers.errors import HwlatError
from profilers.oprecord import OpRecord, TensorSpec

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "reference_ops.json"


def spec(*shape: int, dtype: str = "float32", stride: tuple[int, ...] | None = None) -> TensorSpec:
    if stride is None:
        stride = torch.empty(shape, device="meta").stride()
    return TensorSpec(tuple(shape), tuple(stride), dtype)


def conv(x: TensorSpec, w: TensorSpec, out: TensorSpec, *, stride=(1, 1), padding=(0, 0),
         groups=1, transposed=False) -> OpRecord:
    return OpRecord("aten.convolution.default",
                    (x, w, None, list(stride), list(padding), [1, 1], transposed, [0, 0], groups),
                    outputs=(out,))


def torch_flops(fn, *args, **kwargs) -> int:
    """PyTorch's own flop counter on a real call, to check our conventions match it."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    return counter.get_total_flops()


def test_conv_flops_exact_and_match_torch():
    rec = conv(spec(1, 3, 8, 8), spec(4, 3, 3, 3), spec(1, 4, 8, 8), padding=(1, 1))
    assert ops.flops_of(rec) == 2 * 4 * 3 * 3 * 3 * 8 * 8 == 13824
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    assert ops.flops_of(rec) == torch_flops(F.conv2d, x, w, padding=1)


def test_grouped_and_strided_depthwise_conv_flops():
    grouped = conv(spec(2, 8, 8, 8), spec(8, 2, 3, 3), spec(2, 8, 8, 8), padding=(1, 1), groups=4)
    assert ops.flops_of(grouped) == 2 * 2 * (8 * 2 * 9) * 64
    assert ops.flops_of(grouped) == torch_flops(
        F.conv2d, torch.randn(2, 8, 8, 8), torch.randn(8, 2, 3, 3), padding=1, groups=4)
    dw = conv(spec(1, 8, 8, 8), spec(8, 1, 3, 3), spec(1, 8, 4, 4), stride=(2, 2),
              padding=(1, 1), groups=8)
    assert ops.flops_of(dw) == 2 * (8 * 9) * 16 == 2304
    f = ops.features(dw)
    assert (f["conv.depthwise"], f["conv.stride_h"], f["conv.Hout"], f["conv.groups"]) == (1, 2, 4, 8)
    assert (f["conv.Cin_align"], f["conv.Cout_align"]) == (8, 8)
    odd = ops.features(conv(spec(1, 72, 8, 8), spec(144, 72, 1, 1), spec(1, 144, 8, 8)))
    assert (odd["conv.Cin_align"], odd["conv.Cout_align"]) == (8, 16)  # blocks of 8 and 16
    wide = ops.features(conv(spec(1, 3, 8, 8), spec(1024, 3, 1, 1), spec(1, 1024, 8, 8)))
    assert (wide["conv.Cin_align"], wide["conv.Cout_align"]) == (1, 64)  # capped


def test_transposed_conv_flops_use_input_positions():
    rec = conv(spec(1, 4, 4, 4), spec(4, 2, 2, 2), spec(1, 2, 8, 8), stride=(2, 2), transposed=True)
    assert ops.flops_of(rec) == 2 * (4 * 2 * 2 * 2) * 16 == 1024
    assert ops.flops_of(rec) == torch_flops(
        F.conv_transpose2d, torch.randn(1, 4, 4, 4), torch.randn(4, 2, 2, 2), stride=2)
    assert ops.features(rec)["conv.transposed"] == 1.0


def _ran_native(x: torch.Tensor, w: torch.Tensor, threads: int, **kw) -> bool:
    """Whether ATen ran the conv on its own kernels (slow_conv*), from the profiler's events."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        conv_fn = F.conv3d if w.dim() == 5 else F.conv2d
        with torch.no_grad(), torch.profiler.profile() as prof:
            conv_fn(x, w, **kw)
    finally:
        torch.set_num_threads(before)
    names = {e.name for e in prof.events()}
    assert any("mkldnn_convolution" in n or "slow_conv" in n for n in names), names
    return any("slow_conv" in n for n in names)


@pytest.mark.parametrize(("x", "w", "kw"), [
    ((1, 24, 28, 28), (48, 24, 1, 1), {}),  # 1x1: native at 1 thread, small enough at 2
    ((1, 64, 56, 56), (64, 64, 1, 1), {}),  # 1x1, large: native only at 1 thread
    ((8, 64, 14, 14), (64, 64, 1, 1), {}),  # batch 8: oneDNN at 2 threads
    ((1, 256, 7, 7), (256, 256, 3, 3), {"padding": 1}),  # small 3x3: native
    ((1, 512, 7, 7), (512, 512, 3, 3), {"padding": 1}),  # 25088 input elements: oneDNN
    ((1, 32, 14, 14), (64, 32, 3, 3), {"stride": 2, "padding": 1}),
    ((1, 16, 4, 14, 14), (16, 16, 3, 3, 3), {"padding": 1}),  # small conv3d: slow_conv3d
    ((1, 3, 8, 28, 28), (8, 3, 3, 7, 7), {"padding": (1, 3, 3)}),  # 7x7 kernel: oneDNN
])
def test_conv_native_path_is_the_kernel_aten_runs(x, w, kw):
    xt, wt = torch.randn(x), torch.randn(w)
    out = (F.conv3d if len(w) == 5 else F.conv2d)(xt, wt, **kw)
    nd = len(w) - 2
    rec = OpRecord("aten.convolution.default",
                   (spec(*x), spec(*w), None, list(ops._pair(kw.get("stride", 1), nd)),
                    list(ops._pair(kw.get("padding", 0), nd, 0)), [1] * nd, False, [0] * nd, 1),
                   outputs=(spec(*out.shape),))
    threads_before = torch.get_num_threads()
    for threads in (1, 2):
        native = ops.features(rec, threads=threads)["conv.native_path"]
        assert native == float(_ran_native(xt, wt, threads, **kw)), threads
        reorder = ops.features(rec, threads=threads)["conv.reorder_bytes"]
        assert reorder == (0.0 if native else 2.0 * math.prod(w) * 4), threads
    assert torch.get_num_threads() == threads_before  # asking ATen changes nothing
    assert math.isnan(ops.features(rec)["conv.native_path"])  # no thread count: unknown
    assert math.isnan(ops.features(rec)["conv.reorder_bytes"])
    on_gpu = replace(rec, args=(replace(rec.args[0], device="cuda"), *rec.args[1:]))
    assert math.isnan(ops.features(on_gpu, threads=1)["conv.native_path"])


@pytest.mark.parametrize(("side", "channels_last", "expected"), [
    (62, False, 1.0), (64, False, 1.0), (66, False, 0.0), (160, False, 0.0), (160, True, 1.0)])
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_upsample_kernel_path_is_the_kernel_aten_runs(side, channels_last, expected, mode):
    x = torch.randn(1, 16, side // 2, side // 2)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    kw = {} if mode == "nearest" else {"align_corners": False}
    with torch.profiler.profile() as prof:
        F.interpolate(x, size=(side, side), mode=mode, **kw)
    names = {e.name for e in prof.events()}
    # the channels-last kernel copies a contiguous input to channels-last first
    assert ("aten::contiguous" in names) == (expected == 1.0 and not channels_last)
    class Up(torch.nn.Module):
        def forward(self, t):
            return F.interpolate(t, size=(side, side), mode=mode, **kw)

    [up] = [r for r in record_real(Up(), [x]) if "upsample" in r.op]
    assert ops.features(up)["data.kernel_path"] == expected


def test_addmm_bmm_linear_flops():
    addmm = OpRecord("aten.addmm.default", (spec(5), spec(3, 7), spec(7, 5)), outputs=(spec(3, 5),))
    assert ops.flops_of(addmm) == 2 * 3 * 7 * 5 == 210
    assert ops.flops_of(addmm) == torch_flops(torch.addmm, torch.randn(5), torch.randn(3, 7),
                                              torch.randn(7, 5))
    bmm = OpRecord("aten.bmm.default", (spec(4, 3, 7), spec(4, 7, 5)), outputs=(spec(4, 3, 5),))
    assert ops.flops_of(bmm) == 2 * 4 * 3 * 7 * 5 == 840
    linear = OpRecord("aten.linear.default", (spec(2, 3, 7), spec(5, 7), spec(5)),
                      outputs=(spec(2, 3, 5),))
    assert ops.flops_of(linear) == 2 * 6 * 7 * 5
    f = ops.features(bmm)
    assert (f["matmul.batch"], f["matmul.M"], f["matmul.N"], f["matmul.K"]) == (4, 3, 5, 7)
    f = ops.features(OpRecord("aten.mm.default", (spec(3, 96), spec(96, 40)),
                              outputs=(spec(3, 40),)))
    assert (f["matmul.N_align"], f["matmul.K_align"]) == (8, 32)


def test_einsum_flops_match_the_equivalent_bmm():
    rec = OpRecord("aten.einsum.default", ("b i d, b j d -> b i j", [spec(4, 3, 7), spec(4, 5, 7)]),
                   outputs=(spec(4, 3, 5),))
    assert ops.flops_of(rec) == 2 * 4 * 3 * 7 * 5


def test_sdpa_flops_and_features():
    q, k, v = spec(2, 4, 8, 16), spec(2, 4, 10, 16), spec(2, 4, 10, 16)
    rec = OpRecord("aten._scaled_dot_product_flash_attention_for_cpu.default", (q, k, v, 0.0, True),
                   outputs=(spec(2, 4, 8, 16), spec(2, 4, 8)))
    assert ops.flops_of(rec) == 2 * 2 * 4 * 8 * 10 * (16 + 16) == 40960
    f = ops.features(rec)
    assert (f["attention.heads"], f["attention.Lq"], f["attention.Lk"], f["attention.causal"]) == (
        4, 8, 10, 1)


def test_add_bytes_exact_with_broadcast():
    rec = OpRecord("aten.add.Tensor", (spec(2, 3), spec(3)), outputs=(spec(2, 3),))
    assert ops.bytes_of(rec) == 24 + 12 + 24
    expanded = OpRecord("aten.add.Tensor", (spec(2, 3), spec(2, 3, stride=(0, 1))),
                        outputs=(spec(2, 3),))
    assert ops.bytes_of(expanded) == 24 + 12 + 24  # a stride-0 input is read once
    half = OpRecord("aten.add.Tensor", (spec(2, 3, dtype="float16"),) * 2,
                    outputs=(spec(2, 3, dtype="float16"),))
    assert ops.bytes_of(half) == 36 and ops.flops_of(half) == 6


def test_views_are_free_and_move_no_bytes():
    for rec in (OpRecord("aten.view.default", (spec(2, 6), [3, 4]), outputs=(spec(3, 4),)),
                OpRecord("aten.permute.default", (spec(2, 3, 4), [2, 0, 1]),
                         outputs=(spec(4, 2, 3, stride=(1, 12, 4)),))):
        assert ops.lookup(rec.op).free and ops.is_free(rec)
        assert ops.bytes_of(rec) == 0 and ops.flops_of(rec) == 0
        assert ops.record_family(rec) == "free"
        assert list(ops.features(rec)) == ops.feature_names("free")


def test_reshape_is_free_only_when_it_is_a_view():
    view = OpRecord("aten.reshape.default", (spec(2, 6), [3, 4]), outputs=(spec(3, 4),))
    copy = OpRecord("aten.reshape.default", (spec(6, 2, stride=(1, 6)), [12]), outputs=(spec(12),))
    assert ops.record_family(view) == "free" and ops.bytes_of(view) == 0
    assert ops.record_family(copy) == "data" and ops.bytes_of(copy) == 96
    eval_dropout = OpRecord("aten.dropout.default", (spec(4), 0.5, False), outputs=(spec(4),))
    assert ops.is_free(eval_dropout)


def test_reshape_as_is_a_reshape():
    view = OpRecord("aten.reshape_as.default", (spec(2, 6), spec(3, 4)), outputs=(spec(3, 4),))
    copy = OpRecord("aten.reshape_as.default", (spec(6, 2, stride=(1, 6)), spec(12)),
                    outputs=(spec(12),))
    assert ops.record_family(view) == "free"
    assert ops.record_family(copy) == "data"


@pytest.mark.parametrize("cls,gates", [(torch.nn.LSTM, 4), (torch.nn.GRU, 3), (torch.nn.RNN, 1)])
def test_recurrent_layers_count_their_gate_matmuls(cls, gates):
    """2 flops per weight per token per layer and direction; shapes read batch_first right."""
    layer = cls(24, 16, num_layers=2, batch_first=True, bidirectional=True).eval()
    records = [r for r in record_real(layer, [torch.randn(3, 5, 24)])
               if ops.record_family(r) == "rnn"]
    assert len(records) == 1
    weights = (gates * 16 * 24 + gates * 16 * 16) * 2 + (gates * 16 * 32 + gates * 16 * 16) * 2
    assert ops.flops_of(records[0]) == 2 * 15 * weights
    f = ops.features(records[0])
    assert list(f) == ops.feature_names("rnn")
    assert (f["rnn.steps"], f["rnn.batch"], f["rnn.hidden"], f["rnn.gates"]) == (5, 3, 16, gates)
    assert (f["rnn.layers"], f["rnn.bidirectional"]) == (2, 1)
    assert f["rnn.serial_steps"] == 5 * 2 * 2  # steps x layers x directions, one after another


def test_packed_recurrent_layers_are_modelled_not_replayed():
    info = ops.lookup("aten.lstm.data")
    assert info.family == "rnn" and not info.replayable


def test_every_reference_op_is_registered():
    ref = json.loads(REFERENCE.read_text())
    seen = set(ref["ops"]) | set(ref["ops_no_grad"])
    assert len(seen) > 50
    missing = sorted(op for op in seen if ops.lookup(op) is None)
    assert missing == []
    for op in seen:
        assert ops.family_of(op) in ops.FAMILIES


def test_user_override_takes_effect():
    old = ops.REGISTRY["aten.add"]
    rec = OpRecord("aten.add.Tensor", (spec(2, 3), spec(2, 3)), outputs=(spec(2, 3),))
    with pytest.raises(HwlatError):
        ops.register("aten.add", old)
    try:
        ops.register("aten.add.Tensor", ops.OpInfo("eltwise", flops=lambda r: 42.0), override=True)
        assert ops.flops_of(rec) == 42.0
        assert ops.flops_of(OpRecord("aten.add_.Tensor", rec.args, outputs=rec.outputs)) == 6
    finally:
        del ops.REGISTRY["aten.add.Tensor"]
    assert ops.flops_of(rec) == 6


def test_unknown_op_is_never_free():
    rec = OpRecord("aten.my_custom_op.default", (spec(4, 4),), outputs=(spec(4, 4),))
    assert ops.lookup(rec.op) is None
    assert ops.family_of(rec.op) == ops.UNKNOWN == ops.record_family(rec)
    assert not ops.is_free(rec)
    assert ops.bytes_of(rec) == 128 and ops.flops_of(rec) == 16  # the stated fallback
    assert ops.roofline_s(rec, {"gflops": {"float32": 1.0}, "gbps": 1.0}) > 0
    assert list(ops.features(rec)) == ops.feature_names(ops.UNKNOWN)


def test_roofline_uses_dtype_peak_with_float32_fallback():
    rec = OpRecord("aten.mm.default", (spec(64, 64), spec(64, 64)), outputs=(spec(64, 64),))
    peaks = {"gflops": {"float32": 100.0, "float16": 400.0}, "gbps": 10.0}
    flops, nbytes = 2 * 64**3, 3 * 64 * 64 * 4
    assert ops.roofline_s(rec, peaks) == pytest.approx(max(flops / 100e9, nbytes / 10e9))
    bf16 = OpRecord("aten.mm.default", (spec(64, 64, dtype="bfloat16"),) * 2,
                    outputs=(spec(64, 64, dtype="bfloat16"),))
    assert ops.roofline_s(bf16, peaks) == pytest.approx(max(flops / 100e9, nbytes / 2 / 10e9))


def test_feature_names_are_stable_and_complete_on_real_records():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10),
        torch.nn.Softmax(-1)).eval()
    records = record_real(model, [torch.randn(1, 3, 8, 8)])
    families = set()
    for rec in records:
        family = ops.record_family(rec)
        families.add(family)
        f = ops.features(rec, {"gflops": {"float32": 50.0}, "gbps": 20.0})
        assert list(f) == ops.feature_names(family)
        assert f["roofline_s"] > 0 or family == "free"
        assert all(not math.isnan(f[n]) for n in ops.feature_names(family)[:11])
    assert {"conv", "norm", "eltwise", "pool", "matmul", "reduce"} <= families
    assert ops.feature_names("conv") == ops.feature_names("conv")
    with pytest.raises(HwlatError):
        ops.feature_names("nope")


def _seq_to_image_conv(channels_last_weight: bool = False) -> OpRecord:
    """The depthwise conv of a transformer's MLP run on its transposed token sequence."""
    conv = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16).eval()
    if channels_last_weight:
        conv = conv.to(memory_format=torch.channels_last)
    x = torch.randn(1, 64, 16).transpose(1, 2).view(1, 16, 8, 8)
    return next(r for r in record_real(conv, [x]) if ops.family_of(r.op) == "conv")


def test_a_conv_on_a_strided_input_splits_into_the_hidden_copy_and_the_dense_conv() -> None:
    conv = _seq_to_image_conv()
    assert conv.inputs[0].memory_format == "strided"
    copy, dense = ops.dense_input_split(conv)
    assert copy.op == "aten.contiguous.default" and copy.inputs == [conv.inputs[0]]
    assert copy.outputs[0].memory_format == "contiguous"
    assert dense.inputs[0] == copy.outputs[0] and dense.inputs[1:] == conv.inputs[1:]
    assert dense.op == conv.op and dense.outputs == conv.outputs
    assert ops.dense_input_split(dense) is None  # nothing left to copy
    assert not ops.is_free(copy)
    # a channels_last weight makes ATen copy into channels_last instead
    copy_cl, dense_cl = ops.dense_input_split(_seq_to_image_conv(channels_last_weight=True))
    assert dense_cl.inputs[0].memory_format == "channels_last"
    # what ATen does for real: the copy's output is what the conv computes on
    x = torch.randn(1, 64, 16).transpose(1, 2).view(1, 16, 8, 8)
    assert torch.equal(x.contiguous(), ops.resolve_overload(copy.op)(x, **copy.kwargs))


def test_gather_stride_says_how_far_apart_a_copy_reads() -> None:
    def spec(shape, stride):
        return TensorSpec(shape, stride, "float32")

    out = spec((1, 128, 56, 56), (401408, 3136, 56, 1))
    plain = OpRecord("aten.clone.default", (spec(out.shape, out.stride),), {}, (out,))
    transposed = OpRecord("aten.contiguous.default", (spec(out.shape, (128, 1, 7168, 128)),),
                          {}, (out,))
    reshaped = OpRecord("aten.cat.default", ([spec((1, 64), (64, 1))],), {},
                        (spec((2, 32), (32, 1)),))
    assert ops.generic_features(plain)["log_gather_stride"] == 0.0
    assert ops.generic_features(transposed)["log_gather_stride"] == 7.0
    assert math.isnan(ops.generic_features(reshaped)["log_gather_stride"])
    assert ops.generic_features(plain)["gather_stride_pow2"] == 2.0  # 4-byte elements
    assert ops.generic_features(transposed)["gather_stride_pow2"] == 9.0  # 128 x 4 bytes


def test_a_gather_across_power_of_two_rows_is_told_from_one_across_odd_rows() -> None:
    """Transposing 1x1024x1024 took 3.27 ms and 1x1024x1040 0.71 ms at 1 thread: rows 4096
    bytes apart share cache sets. Same shapes otherwise, so only this feature separates them."""
    def transpose(c: int) -> OpRecord:
        out = TensorSpec((1, c, 1024), (c * 1024, 1024, 1), "float32")
        return OpRecord("aten.contiguous.default", (TensorSpec(out.shape, (c * 1024, 1, c),
                                                                "float32"),), {}, (out,))
    pow2, odd = (ops.generic_features(transpose(c)) for c in (1024, 1040))
    assert pow2["gather_stride_pow2"] == 12.0 and odd["gather_stride_pow2"] == 6.0
    assert pow2["log_gather_stride"] == pytest.approx(odd["log_gather_stride"], abs=0.05)


def test_the_gather_footprint_tells_a_reversal_of_three_dims_from_a_2d_transpose() -> None:
    """XLNet's weight copy (1024x16x64 to 64x16x1024) passes over 16384 lines before it reads
    one again, a 2-D transpose of the same 1M floats over 1024; their gather strides agree."""
    def copy(shape, in_stride) -> OpRecord:
        out = TensorSpec(shape, tuple(math.prod(shape[i + 1:]) for i in range(len(shape))),
                         "float32")
        return OpRecord("aten.contiguous.default", (TensorSpec(shape, in_stride, "float32"),),
                        {}, (out,))
    reversal = ops.generic_features(copy((64, 16, 1024), (1, 64, 1024)))
    transpose = ops.generic_features(copy((1024, 1024), (1, 1024)))
    plain = ops.generic_features(copy((1024, 1024), (1024, 1)))
    assert reversal["log_gather_footprint"] == 20.0  # 16384 lines of 64 bytes
    assert transpose["log_gather_footprint"] == 16.0
    assert plain["log_gather_footprint"] == 6.0
    assert reversal["log_gather_stride"] == transpose["log_gather_stride"]
    assert reversal["gather_stride_pow2"] == transpose["gather_stride_pow2"]


def test_an_einsum_that_copies_an_operand_splits_into_atens_copies_and_its_bmm() -> None:
    """XLNet's output projection "ibnd,hnd->ibh" copies its weight on every call (8.1 ms against
    3.0 for the input projection of the same sizes, 1 thread); the input projection copies
    nothing and stays one op."""
    class Projections(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.o = torch.nn.Parameter(torch.randn(64, 4, 16))

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            heads = torch.einsum("ibh,hnd->ibnd", h, self.o)
            return torch.einsum("ibnd,hnd->ibh", heads, self.o)

    into, out_of = [r for r in record_real(Projections().eval(), [torch.randn(8, 1, 64)])
                    if ops.split_op_name(r.op)[1] == "einsum"]
    assert ops.einsum_split(into) is None and ops.split_hidden_work(into) is None
    parts = ops.split_hidden_work(out_of)
    assert parts == ops.einsum_split(out_of)
    assert [ops.record_family(p) for p in parts] == ["data", "data", "matmul"]
    weight_copy = parts[1]
    assert weight_copy.op == "aten.contiguous.default" and weight_copy.inputs[0].numel == 64 * 64
    assert weight_copy.outputs[0].memory_format == "contiguous"
    assert ops.generic_features(weight_copy)["log_gather_stride"] == 6.0  # reads the weight across h
    bmm = parts[2]
    assert bmm.op == "aten.bmm.default" and ops.flops_of(bmm) == ops.flops_of(out_of)
    assert all(p.module == out_of.module for p in parts)


def test_gates_masks_and_weight_norm_are_modelled_not_fallbacks() -> None:
    class Block(torch.nn.Module):  # the pieces of wav2vec2's positional conv and gated units
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.utils.parametrizations.weight_norm(
                torch.nn.Conv1d(8, 16, 3, padding=1), dim=2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.glu(self.conv(x), dim=1)
            return y.masked_fill((y > 0) & (y < 1), 0.0)

    records = record_real(Block().eval(), [torch.randn(2, 8, 10)])
    by_op = {ops.split_op_name(r.op)[1]: r for r in records}
    assert {"glu", "__and__", "_weight_norm"} <= set(by_op), sorted(by_op)
    assert not [r.op for r in records if ops.record_family(r) == ops.UNKNOWN]
    glu = by_op["glu"]
    assert ops.family_of(glu.op) == "eltwise" and ops.flops_of(glu) == 5 * 2 * 8 * 10
    assert ops.family_of(by_op["__and__"].op) == "eltwise"
    assert ops.family_of(by_op["_weight_norm"].op) == "reduce"


def test_a_layer_norm_on_transposed_tokens_splits_into_the_copy_aten_makes_and_the_norm() -> None:
    """XCiT's layer norms run on transposed tokens: 47 us, against 28 us on contiguous ones
    plus 16 us for the copy ATen's CPU kernel makes first (1 thread)."""
    norm = torch.nn.LayerNorm(16).eval()
    x = torch.randn(1, 16, 64).transpose(1, 2)
    record = next(r for r in record_real(norm, [x]) if ops.family_of(r.op) == "norm")
    assert record.inputs[0].memory_format == "strided"
    copy, dense = ops.dense_input_split(record)
    assert copy.op == "aten.contiguous.default"
    assert dense.inputs[0].memory_format == "contiguous" and dense.op == record.op
    assert ops.dense_input_split(dense) is None
    contiguous = next(r for r in record_real(norm, [x.contiguous()])
                      if ops.family_of(r.op) == "norm")
    assert ops.dense_input_split(contiguous) is None


_REORDER_SCRIPT = """
import torch, torch.nn.functional as F
torch.set_num_threads(1)
x, w = torch.randn({x}), torch.randn({w})
for _ in range(3):
    F.conv2d(x, w, padding=1)
"""


@pytest.mark.parametrize(("x", "w", "native"), [
    ((1, 512, 7, 7), (512, 512, 3, 3), False), ((1, 256, 7, 7), (256, 256, 3, 3), True)])
def test_onednn_convs_reorder_their_weights_every_call(x, w, native):
    """What `reorder_bytes` counts: oneDNN reorders plain weights to its blocked format on every
    eager call (ONEDNN_VERBOSE lists each reorder with its dims); the native path does not."""
    run = subprocess.run([sys.executable, "-c", _REORDER_SCRIPT.format(x=x, w=w)],
                         env={**os.environ, "ONEDNN_VERBOSE": "1"}, capture_output=True,
                         text=True, timeout=120, check=True)
    dims = "x".join(map(str, w))
    reorders = [ln for ln in run.stdout.splitlines() if ",reorder," in ln and f",{dims}," in ln]
    assert len(reorders) == (0 if native else 3), run.stdout[-2000:]
