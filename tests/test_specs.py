"""Model and input specs: parsing, every spec kind, meta builds and their fallback, errors."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from profilers import specs
from profilers.errors import SpecError
from profilers.specs import (
    InputSpec,
    family_of,
    list_torchvision_classification,
    load_model,
    parse_input_spec,
    with_batch,
)


@pytest.mark.parametrize("text, shape, dtype", [
    ("1x3x224x224", (1, 3, 224, 224), "float32"),
    ("int64:1x128", (1, 128), "int64"),
    ("float16:2X8", (2, 8), "float16"),
    (" 7 ", (7,), "float32"),
])
def test_parse_input_spec_good(text: str, shape: tuple, dtype: str) -> None:
    spec = parse_input_spec(text)
    assert spec == InputSpec(shape, dtype)
    assert parse_input_spec(str(spec)) == spec


@pytest.mark.parametrize("text", ["", "1x", "axb", "1x0x3", "-1x3", "int65:1x2", "sqrt:1x2", "1.5x2"])
def test_parse_input_spec_bad(text: str) -> None:
    with pytest.raises(SpecError, match="bad input spec") as err:
        parse_input_spec(text)
    assert "\n" not in str(err.value)


def test_input_spec_helpers() -> None:
    spec = parse_input_spec("int64:1x128")
    assert spec.with_batch(4) == InputSpec((4, 128), "int64")
    ts = parse_input_spec("2x3x4x5").tensor_spec("cuda")
    assert (ts.shape, ts.stride, ts.dtype, ts.device) == ((2, 3, 4, 5), (60, 20, 5, 1), "float32", "cuda")
    ids = spec.make(vocab=7)
    assert ids.dtype == torch.int64 and ids.shape == (1, 128)
    assert 0 <= int(ids.min()) and int(ids.max()) < 7
    assert int(spec.make().max()) < 1000  # unknown vocabulary
    x = parse_input_spec("2x3").make()
    assert x.dtype == torch.float32 and x.std() > 0
    with pytest.raises(SpecError):
        spec.with_batch(0)


@pytest.mark.parametrize("name, family", [
    ("resnet18", "resnet"), ("efficientnet_b0", "efficientnet"), ("vit_b_16", "vit"),
    ("mobilenet_v3_small", "mobilenet"), ("mobilenetv3_small_050", "mobilenet"),
    ("convnextv2_atto", "convnext"), ("wide_resnet50_2", "wide_resnet"), ("densenet121", "densenet"),
    ("regnet_y_400mf", "regnet"), ("squeezenet1_0", "squeezenet"), ("resnet18.a1_in1k", "resnet"),
    ("tf_efficientnet_b0", "efficientnet"), ("alexnet", "alexnet"),
])
def test_family_of(name: str, family: str) -> None:
    assert family_of(name) == family


def test_torchvision_meta_and_cpu() -> None:
    meta = load_model("torchvision:resnet18", meta=True)
    assert meta.built_on == "meta" and meta.family == "resnet"
    assert meta.inputs == [InputSpec((1, 3, 224, 224))]
    assert next(meta.model.parameters()).device.type == "meta"
    assert not meta.model.training
    real = load_model("torchvision:squeezenet1_0", inputs=["1x3x64x64"], batch=2)
    assert real.built_on == "cpu" and real.inputs == [InputSpec((2, 3, 64, 64))]
    out = real.model(*real.make_inputs())
    assert out.shape == (2, 1000)


def test_torchvision_listing() -> None:
    names = list_torchvision_classification()
    assert "resnet18" in names and "vit_b_16" in names
    assert "fasterrcnn_resnet50_fpn" not in names


@pytest.mark.parametrize("name, family, inputs", [
    ("deeplabv3_mobilenet_v3_large", "deeplab", [(1, 3, 520, 520)]),
    ("r3d_18", "r3d", [(1, 3, 16, 112, 112)]),
    ("swin3d_t", "swin3d", [(1, 3, 32, 224, 224)]),
    ("raft_small", "raft", [(1, 3, 368, 496), (1, 3, 368, 496)]),
])
def test_torchvision_segmentation_video_and_flow(name, family, inputs) -> None:
    # default inputs come from the weights' metadata (resize size, crop size, clip length)
    loaded = load_model(f"torchvision:{name}", meta=True, batch=2)
    assert loaded.family == family and loaded.built_on == "meta"
    assert loaded.inputs == [InputSpec((2, *shape[1:])) for shape in inputs]


def test_torchvision_detection_takes_a_batch_and_keeps_the_most_boxes() -> None:
    # a typical COCO photo by default; the model resizes it itself
    meta = load_model("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn", meta=True, batch=2)
    assert meta.family == "fasterrcnn" and meta.inputs == [InputSpec((2, 3, 480, 640))]
    assert "score threshold 0" in meta.note
    loaded = load_model("torchvision:ssdlite320_mobilenet_v3_large", inputs=["2x3x64x80"])
    with torch.inference_mode():
        out = loaded.model(*loaded.make_inputs())
    assert [len(o["boxes"]) for o in out] == [300, 300]  # detections_per_img, on random weights
    rcnn = load_model("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn", inputs=["1x3x64x80"])
    detector = rcnn.model.detector
    for name in specs.R_CNN_BOX_REGRESSIONS:  # its boxes are its anchors, not degenerate ones
        assert all(not p.any() for p in detector.get_submodule(name).parameters())
    with torch.inference_mode():
        (found,) = rcnn.model(*rcnn.make_inputs())
    sides = found["boxes"][:, 2:] - found["boxes"][:, :2]
    assert len(found["boxes"]) == 100 and sides.min() > 1


def test_torchvision_video_model_runs_on_its_inputs() -> None:
    loaded = load_model("torchvision:r3d_18", inputs=["1x3x4x32x32"])
    assert loaded.model(*loaded.make_inputs()).shape == (1, 400)


def test_timm_small_model() -> None:
    loaded = load_model("timm:mobilenetv3_small_050", meta=True)
    assert loaded.family == "mobilenet" and loaded.built_on == "meta"
    assert loaded.inputs == [InputSpec((1, 3, 224, 224))]


@pytest.mark.parametrize("model_type, vocab", [("bert", 30522), ("gpt2", 50257)])
def test_hf_builds_from_config_on_meta(model_type: str, vocab: int) -> None:
    loaded = load_model(f"hf:{model_type}", meta=True, batch=2)
    assert loaded.built_on == "meta" and loaded.family == model_type
    assert loaded.vocab == vocab
    assert loaded.inputs == [InputSpec((2, 128), "int64")]


@pytest.mark.parametrize("model_type, names, inputs", [
    ("vit", ("pixel_values",), [InputSpec((2, 3, 224, 224))]),
    ("mobilevit", ("pixel_values",), [InputSpec((2, 3, 256, 256))]),
    ("wav2vec2", ("input_values",), [InputSpec((2, 16000))]),
    ("whisper", ("input_features", "decoder_input_ids"),
     [InputSpec((2, 80, 3000)), InputSpec((2, 128), "int64")]),
    ("t5", ("input_ids", "decoder_input_ids"), [InputSpec((2, 128), "int64")]),
    ("clip", ("input_ids", "pixel_values"), [InputSpec((2, 77), "int64"),
                                             InputSpec((2, 3, 224, 224))]),
    # an encoder-decoder whose decoder takes learned queries, not token ids: no int64 input
    ("table-transformer", ("pixel_values",), [InputSpec((2, 3, 224, 224))]),
])
def test_hf_inputs_follow_the_models_main_input(model_type: str, names: tuple,
                                                inputs: list) -> None:
    """Vision, audio and encoder-decoder models get the inputs their forward takes, shaped
    from their config (image size, mel bins, position limit)."""
    loaded = load_model(f"hf:{model_type}", meta=True, batch=2)
    assert loaded.model.names == names
    assert loaded.inputs == inputs


def test_hf_vision_and_seq2seq_models_run_and_capture() -> None:
    """An image model and an encoder-decoder given only its token ids run for real and capture
    to the ops that carry their time."""
    from profilers.capture import capture
    from profilers.ops import record_family

    for spec, inputs, shape, family in (("hf:vit", None, (1, 197, 768), "conv"),
                                        ("hf:t5", ["int64:1x8"], (1, 8, 512), "matmul")):
        loaded = load_model(spec, inputs=inputs)
        with torch.inference_mode():
            out = loaded.model(*loaded.make_inputs())
        assert tuple(out.shape) == shape
        families = {record_family(r) for r in capture(loaded.model, loaded.inputs)}
        assert {family, "matmul"} <= families


def test_hf_model_whose_input_has_no_default_shape_asks_for_it() -> None:
    with pytest.raises(SpecError, match="takes input_features, decoder_input_ids.*--input"):
        load_model("hf:speech_to_text", meta=True)
    loaded = load_model("hf:speech_to_text", meta=True, inputs=["1x300x80", "int64:1x16"])
    assert [str(i) for i in loaded.inputs] == ["1x300x80", "int64:1x16"]


def _write(tmp_path, body: str):
    path = tmp_path / "user_models.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_file_factory_module_and_dict(tmp_path) -> None:
    path = _write(tmp_path, """
        import torch
        from torch import nn

        def plain():
            return nn.Sequential(nn.Linear(8, 4), nn.ReLU())

        def bundle():
            return {"model": nn.Linear(8, 2), "inputs": [torch.zeros(3, 8), "int64:3x5"],
                    "preprocess": lambda x: x * 2, "postprocess": None}

        def needs_values():
            n = int(torch.tensor(4).item())  # fails on meta
            return nn.Linear(n, n)
    """)
    with pytest.raises(SpecError, match="no default inputs"):
        load_model(f"{path}:plain")
    plain = load_model(f"{path}:plain", inputs=["2x8"], meta=True)
    assert isinstance(plain.model, nn.Sequential) and plain.built_on == "meta"
    bundle = load_model(f"{path}:bundle")
    assert bundle.inputs == [InputSpec((3, 8)), InputSpec((3, 5), "int64")]
    assert bundle.preprocess(3) == 6 and bundle.postprocess is None
    fallback = load_model(f"{path}:needs_values", inputs=["1x4"], meta=True)
    assert fallback.built_on == "cpu"
    assert next(fallback.model.parameters()).device.type == "cpu"
    with pytest.raises(SpecError, match="did you mean: plain"):
        load_model(f"{path}:plainn")


def test_pt2_archive(tmp_path) -> None:
    program = torch.export.export(nn.Sequential(nn.Linear(6, 3)).eval(), (torch.randn(2, 6),))
    path = tmp_path / "tiny.pt2"
    torch.export.save(program, str(path))
    loaded = load_model(str(path), meta=True)
    assert loaded.built_on == "cpu" and loaded.family == "tiny"
    assert loaded.inputs == [InputSpec((2, 6))]
    assert loaded.model(*loaded.make_inputs()).shape == (2, 3)


@pytest.mark.parametrize("spec, message", [
    ("torchvision:resnet1", "did you mean: resnet18"),
    ("torchvision:quantized_resnet18", "predict torchvision:resnet18"),
    ("timm:resnet_18", "did you mean: resnet18"),
    ("hf:bertt", "did you mean: bert"),
    ("foo:bar", "use torchvision:NAME"),
    ("resnet18", "use torchvision:NAME"),
    ("/no/such/file.py:make", "does not exist"),
    ("/no/such/model.pt2", "does not exist"),
])
def test_unknown_specs(spec: str, message: str) -> None:
    with pytest.raises(SpecError, match=message) as err:
        load_model(spec, meta=True)
    assert "\n" not in str(err.value)


def test_a_model_too_large_for_memory_is_refused_before_it_is_built(monkeypatch) -> None:
    import profilers.specs as specs

    monkeypatch.setattr(specs, "_available_bytes", lambda: 40 << 20)  # resnet18: 46.8 MB
    message = r"weights take 47 MB \(12M parameters\) and this machine has 42 MB available"
    with pytest.raises(SpecError, match=message) as err:
        load_model("torchvision:resnet18")
    assert "\n" not in str(err.value)
    assert load_model("torchvision:resnet18", meta=True).built_on == "meta"  # capture needs none
    monkeypatch.setattr(specs, "_available_bytes", lambda: 1 << 30)
    assert load_model("torchvision:resnet18").built_on == "cpu"


def test_with_batch_sets_every_input_that_shares_the_first_dimension() -> None:
    frames = [InputSpec((1, 3, 8, 8)), InputSpec((1, 3, 8, 8)), InputSpec((7,))]
    assert [i.shape for i in with_batch(frames, 4)] == [(4, 3, 8, 8), (4, 3, 8, 8), (7,)]
    with pytest.raises(SpecError, match="no batch dimension"):
        with_batch([InputSpec(())], 2)
