"""Replaying captured ops on real tensors: recorded output specs, valid integer inputs."""

from __future__ import annotations

import os

import pytest
import torch
import torchvision

from profilers import ops, sampling
from profilers.capture import record_real
from profilers.opbench import ReplayError, check_replay, materialize, op_callable
from profilers.oprecord import OpRecord, TensorSpec


def distinct(records: list[OpRecord]) -> list[OpRecord]:
    return list({r.key: r for r in records}.values())


def replay_all(records: list[OpRecord]) -> int:
    n = 0
    for rec in distinct(records):
        if ops.lookup(rec.op) is None or not ops.lookup(rec.op).replayable:
            continue
        check_replay(rec)
        n += 1
    return n


@pytest.fixture(scope="module")
def resnet_records() -> list[OpRecord]:
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    return record_real(model, [torch.randn(1, 3, 32, 32)])


def test_resnet18_ops_replay_with_recorded_outputs(resnet_records):
    assert replay_all(resnet_records) >= 8
    assert {"aten.conv2d.default", "aten.max_pool2d.default"} <= {r.op for r in resnet_records}


def test_channels_last_strides_are_preserved():
    model = torchvision.models.resnet18().eval().to(memory_format=torch.channels_last)
    x = torch.randn(1, 3, 32, 32).to(memory_format=torch.channels_last)
    records = record_real(model, [x])
    # at 1x1 spatial size NCHW and NHWC strides coincide; look at the others
    convs = [r for r in distinct(records)
             if r.op == "aten.conv2d.default" and r.inputs[0].shape[2] * r.inputs[0].shape[3] > 1]
    assert len(convs) >= 5 and all(r.inputs[0].memory_format == "channels_last" for r in convs)
    args, _ = materialize(convs[0])
    assert args[0].stride() == convs[0].inputs[0].stride
    assert args[0].is_contiguous(memory_format=torch.channels_last)
    assert replay_all(records) >= 8


def test_max_pools_replay_on_activation_like_inputs():
    """Max pooling is timed on ReLU outputs whose channels differ in sparsity, as in a model:
    never negative, some channels nearly all zero and some nearly all positive."""
    pool = torch.nn.MaxPool2d(3, 1, 1, ceil_mode=True)
    for x in (torch.randn(2, 64, 12, 12), torch.randn(64, 12, 12),  # batched and unbatched
              torch.randn(2, 64, 12, 12).to(memory_format=torch.channels_last)):
        (rec,) = [r for r in record_real(pool, [x]) if "max_pool" in r.op]
        args, _ = materialize(rec, seed=3)
        got = args[0]
        assert got.stride() == x.stride() and got.min() >= 0
        channels = got.movedim(-3, 0).reshape(64, -1)
        positive = (channels > 0).float().mean(dim=1)
        assert (positive < 0.1).sum() >= 8 and (positive > 0.9).sum() >= 8
        assert torch.equal(got, materialize(rec, seed=3)[0][0])  # seeded
    (avg,) = record_real(torch.nn.AvgPool2d(2), [torch.randn(1, 8, 4, 4)])
    assert materialize(avg)[0][0].min() < 0  # other ops keep standard-normal inputs


def test_grid_sampler_replays_on_a_grid_inside_the_image():
    """A standard-normal grid points mostly outside [-1, 1], where nothing is read; RAFT's and a
    spatial transformer's grids cover the image, so that is what the timing gets."""
    x, grid = torch.randn(3, 2, 8, 8), torch.rand(3, 5, 5, 2) * 2 - 1
    (rec,) = [r for r in record_real(sampling._GridSample(), [x, grid])
              if "grid_sampler" in r.op]
    assert ops.lookup(rec.op).family == "data" and ops.flops_of(rec) == 8 * 3 * 2 * 5 * 5
    args, _ = materialize(rec, seed=1)
    assert args[1].shape == grid.shape and args[1].abs().max() <= 1 and args[1].std() > 0.4
    check_replay(rec)


def test_roi_align_replays_on_boxes_inside_its_feature_map():
    """A detector's RoIAlign reads the map under each box: the replay's boxes are image
    coordinates (1 / spatial_scale) of regions `ROI_CELLS` cells a side, inside the map."""
    x, rois = torch.randn(2, 4, 10, 12), torch.zeros(6, 5)
    (rec,) = [r for r in record_real(sampling._RoiAlign(7, 1 / 8), [x, rois]) if "roi" in r.op]
    assert rec.op == "torchvision.roi_align.default" and ops.lookup(rec.op).family == "data"
    assert ops.flops_of(rec) == 8 * 4 * 6 * 4 * 7 * 7  # sampling ratio 2: 2x2 bilinear samples
    args, _ = materialize(rec, seed=1)
    boxes = args[1]
    assert set(boxes[:, 0].tolist()) <= {0.0, 1.0}
    cells = boxes[:, 1:] / 8
    assert cells.min() >= 0 and (cells[:, 2] <= 12).all() and (cells[:, 3] <= 10).all()
    sides = cells[:, 2:] - cells[:, :2]  # ROI_CELLS, clipped to the 12x10 map
    assert sides.min() >= ops.ROI_CELLS[0] - 1e-4 and sides[:, 1].max() <= 9 + 1e-4
    check_replay(rec)


def test_nms_replays_to_the_count_the_model_kept():
    """How long suppression takes depends on how many boxes survive: the replay's boxes are
    built so that exactly the recorded K of N do."""
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [0, 0, 9, 10.0]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])

    class Suppress(torch.nn.Module):
        def forward(self, b, s):
            return torchvision.ops.nms(b, s, 0.5)

    (rec,) = [r for r in record_real(Suppress(), [boxes, scores]) if "nms" in r.op]
    assert rec.outputs[0].shape == (2,)
    assert ops.flops_of(rec) == ops.NMS_IOU_FLOPS * 2 * (4 - 1) + 4 * 2
    args, _ = materialize(rec, seed=2)
    assert torchvision.ops.nms(*args).shape == (2,)
    check_replay(rec)


def test_transformer_encoder_fast_path_replays():
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    records = record_real(model, [torch.randn(2, 8, 32)])
    assert "aten._transformer_encoder_layer_fwd.default" in {r.op for r in records}
    assert replay_all(records) >= 1


def test_bert_tiny_replays_with_valid_embedding_indices():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(
        "bert", hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128)
    model = transformers.AutoModel.from_config(config).eval()
    records = record_real(model, [torch.randint(0, 1000, (1, 16), dtype=torch.int64)])
    assert replay_all(records) >= 10
    embeddings = [r for r in records if r.op == "aten.embedding.default"]
    assert embeddings
    for rec in embeddings:
        args, kwargs = materialize(rec, seed=1)
        b = ops.bind(rec.op, args, kwargs)
        rows = b["weight"].shape[0]
        assert 0 <= int(b["indices"].min()) and int(b["indices"].max()) < rows
    word = max(embeddings, key=lambda r: r.inputs[0].shape[0])
    idx = ops.bind(word.op, *materialize(word))["indices"]
    assert idx.unique().numel() > 1  # drawn over the table, not a constant


def test_materialize_keeps_offsets_broadcasts_and_dtypes():
    base = TensorSpec((2, 3), (0, 1), "float16", storage_offset=5)
    rec = OpRecord("aten.add.Tensor", (base, TensorSpec((2, 3), (3, 1), "float16")),
                   outputs=(TensorSpec((2, 3), (3, 1), "float16"),))
    args, _ = materialize(rec)
    assert args[0].stride() == (0, 1) and args[0].storage_offset() == 5
    assert args[0].dtype == torch.float16
    assert torch.equal(args[0][0], args[0][1])
    check_replay(rec)


def test_index_with_valid_indices_replays():
    rec = OpRecord("aten.index.Tensor", (TensorSpec((169, 2), (2, 1), "float32"),
                                        [TensorSpec((2401,), (1,), "int64")]),
                   outputs=(TensorSpec((2401, 2), (2, 1), "float32"),))
    check_replay(rec)
    args, _ = materialize(rec)
    assert int(args[1][0].max()) < 169


def test_mismatched_outputs_and_unreplayable_ops_raise():
    rec = OpRecord("aten.relu.default", (TensorSpec((4, 4), (4, 1), "float32"),),
                   outputs=(TensorSpec((4, 5), (5, 1), "float32"),))
    with pytest.raises(ReplayError):
        check_replay(rec)
    nonzero = OpRecord("aten.nonzero.default", (TensorSpec((8,), (1,), "float32"),),
                       outputs=(TensorSpec((3, 1), (1, 1), "int64"),))
    with pytest.raises(ReplayError):
        op_callable(nonzero)
    with pytest.raises(ReplayError):
        check_replay(OpRecord("aten.no_such_op.default", (), outputs=()))


def test_replayed_conv_can_be_timed(resnet_records):
    timer = pytest.importorskip("profilers.timer")
    conv = next(r for r in resnet_records if r.op == "aten.conv2d.default")
    m = timer.measure(op_callable(conv), warmup=1, min_reps=3, max_reps=10, max_time_s=0.5)
    assert 3 <= m.n <= 10
    assert all(s > 0 for s in m.samples_s) and m.median_s > 0
