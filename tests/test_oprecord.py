"""OpRecord: exact JSON round trip, stable keys, memory formats read from strides."""

from __future__ import annotations

import torch

from profilers.oprecord import OpRecord, TensorSpec, decode, encode


def spec(*shape, channels_last=False, dtype="float32"):
    t = torch.empty(shape, dtype=getattr(torch, dtype))
    if channels_last:
        t = t.to(memory_format=torch.channels_last)
    return TensorSpec.of(t)


def conv() -> OpRecord:
    return OpRecord("aten.conv2d.default",
                    (spec(1, 8, 14, 14), spec(16, 8, 3, 3), None, [1, 1], [1, 1], [1, 1], 1),
                    {}, (spec(1, 16, 14, 14),), "layer1.conv")


def test_json_round_trip_is_exact_and_key_ignores_the_module():
    r = conv()
    back = OpRecord.from_json(r.to_json())
    assert back == r and back.key == r.key
    moved = OpRecord(r.op, r.args, r.kwargs, r.outputs, "elsewhere")
    assert moved.key == r.key


def test_key_changes_with_shape_strides_and_dtype():
    r = conv()
    wider = OpRecord(r.op, (spec(1, 8, 15, 15),) + r.args[1:], {}, r.outputs)
    cl = OpRecord(r.op, (spec(1, 8, 14, 14, channels_last=True),) + r.args[1:], {}, r.outputs)
    half = OpRecord(r.op, (spec(1, 8, 14, 14, dtype="float16"),) + r.args[1:], {}, r.outputs)
    assert len({r.key, wider.key, cl.key, half.key}) == 4
    assert half.dtype == "float16" and r.dtype == "float32"


def test_memory_format_and_sizes():
    assert spec(2, 3, 4, 5).memory_format == "contiguous"
    assert spec(2, 3, 4, 5, channels_last=True).memory_format == "channels_last"
    assert TensorSpec.of(torch.empty(4, 6).t()).memory_format == "strided"
    assert spec(2, 3, dtype="bfloat16").nbytes == 12


def test_torch_values_encode_and_decode():
    values = [torch.float16, torch.channels_last, torch.device("cpu"), float("inf"), {"a": 1}]
    assert decode(encode(values)) == values


def _conv_at(batch: int, cout: int = 16):
    from profilers.capture import capture
    from profilers.specs import InputSpec

    module = torch.nn.Sequential(torch.nn.Conv2d(8, cout, 3, padding=1), torch.nn.ReLU())
    return capture(module.eval(), [InputSpec((batch, 8, 12, 12))])


def test_batch_key_is_shared_across_batch_sizes_only():
    conv2, relu2 = _conv_at(2)
    conv8, relu8 = _conv_at(8)
    assert conv2.batch_key == (conv8.batch_key[0], 2) and conv8.batch_key[1] == 8
    assert relu2.batch_key[0] == relu8.batch_key[0] != conv2.batch_key[0]
    assert conv2.key != conv8.key  # the batch stays part of what is timed
    assert _conv_at(2, cout=24)[0].batch_key[0] != conv2.batch_key[0]
    # an op whose output does not keep the batch has none
    t = TensorSpec((4, 6), (6, 1), "float32")
    total = OpRecord("aten.sum.default", (t,), {}, (TensorSpec((), (), "float32"),))
    assert total.batch_key is None
