"""Model and input specs: turn `torchvision:resnet18` or `int64:1x128` into a module and inputs.

A model spec names where a model comes from (torchvision, timm, a transformers config, a Python
file with a factory, a torch.export archive). `load_model` builds it in eval mode with default
inputs for its kind, a `family` (used to hold whole families out of evaluation) and, for
token models, the vocabulary size. With `meta=True` the module is built on the meta device (no
weight init, fast) - enough for capture, which replaces every parameter with a fake anyway.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import os
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from profilers.errors import NoDefaultInputs, SpecError
from profilers.oprecord import TensorSpec, _contiguous_strides, dtype_from_name

_DEFAULT_IMAGE = (1, 3, 224, 224)
_DEFAULT_TOKENS = (1, 128)
_UNKNOWN_VOCAB = 1000


# ---------------------------------------------------------------- input specs


@dataclass(frozen=True)
class InputSpec:
    """One model input: a shape and a dtype name; the text form is `1x3x224x224`/`int64:1x128`."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        return dims if self.dtype == "float32" else f"{self.dtype}:{dims}"

    @property
    def is_floating(self) -> bool:
        return dtype_from_name(self.dtype).is_floating_point

    def with_batch(self, n: int) -> InputSpec:
        if n < 1:
            raise SpecError(f"batch must be at least 1, got {n}")
        if not self.shape:
            raise SpecError(f"input {self} is a scalar; it has no batch dimension to set")
        return replace(self, shape=(n, *self.shape[1:]))

    def tensor_spec(self, device_type: str = "cpu") -> TensorSpec:
        return TensorSpec(self.shape, _contiguous_strides(self.shape), self.dtype, device_type)

    def make(self, device: str = "cpu", vocab: int | None = None) -> torch.Tensor:
        """A real tensor: normal values for floats, random ids in [0, vocab) for integers."""
        dtype = dtype_from_name(self.dtype)
        if dtype.is_floating_point:
            return torch.randn(self.shape, dtype=dtype, device=device)
        if dtype == torch.bool:
            return torch.ones(self.shape, dtype=dtype, device=device)
        return torch.randint(0, vocab or _UNKNOWN_VOCAB, self.shape, dtype=dtype, device=device)

    @classmethod
    def of(cls, t: torch.Tensor) -> InputSpec:
        return cls(tuple(int(s) for s in t.shape), str(t.dtype).removeprefix("torch."))


def with_batch(inputs: list[InputSpec], n: int) -> list[InputSpec]:
    """The inputs at batch `n`: every one whose first dimension is the first input's, since a
    model's inputs go together (RAFT's two frames, CLIP's pixels and token ids)."""
    if not inputs:
        return []
    first = inputs[0].with_batch(n)  # a scalar first input raises: it has no batch dimension
    lead = inputs[0].shape[0]
    return [first, *(i.with_batch(n) if i.shape and i.shape[0] == lead else i
                     for i in inputs[1:])]


def batch_of(inputs: list[InputSpec]) -> int:
    """The batch `with_batch` changes: the first input's first dimension (1 for a scalar)."""
    return inputs[0].shape[0] if inputs and inputs[0].shape else 1


def parse_input_spec(text: str) -> InputSpec:
    """`1x3x224x224` (float32) or `int64:1x128` as an InputSpec; SpecError on anything else."""
    hint = "expected e.g. 1x3x224x224 or int64:1x128"
    dtype, sep, dims = text.strip().rpartition(":")
    dtype = dtype if sep else "float32"
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise SpecError(f"bad input spec {text!r}: unknown dtype {dtype!r}; {hint}")
    parts = dims.lower().split("x")
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise SpecError(f"bad input spec {text!r}: dimensions must be positive integers; {hint}")
    return InputSpec(tuple(int(p) for p in parts), dtype)


def _as_input_spec(value: InputSpec | str | torch.Tensor) -> InputSpec:
    if isinstance(value, InputSpec):
        return value
    if isinstance(value, str):
        return parse_input_spec(value)
    if isinstance(value, torch.Tensor):
        return InputSpec.of(value)
    raise SpecError(f"an input must be a tensor or an input spec string, got {type(value).__name__}")


# ---------------------------------------------------------------- model specs


@dataclass
class LoadedModel:
    """A model ready to call as `model(*inputs)`, in eval mode, with what is known about it."""

    spec: str
    model: nn.Module
    inputs: list[InputSpec]
    vocab: int | None = None
    preprocess: Callable | None = None
    postprocess: Callable | None = None
    family: str = ""
    built_on: str = "cpu"  # "meta" when built without weights; capture needs no more
    raw_input: Any = None  # what `preprocess` takes, when the factory gives a sample of it
    note: str = ""  # how it was built, when that bears on its latency (a prediction says it)

    def make_inputs(self, device: str = "cpu") -> list[torch.Tensor]:
        return [s.make(device, self.vocab) for s in self.inputs]


@dataclass
class _Built:
    model: nn.Module
    inputs: list[InputSpec]
    family: str
    vocab: int | None = None
    preprocess: Callable | None = None
    postprocess: Callable | None = None
    raw_input: Any = None
    input_names: tuple[str, ...] = ()  # what the inputs are, for the error when none is known
    note: str = ""


def load_model(
    spec: str,
    *,
    inputs: list[InputSpec | str] | None = None,
    batch: int | None = None,
    meta: bool = False,
) -> LoadedModel:
    """Build the model a spec names, in eval mode; `batch` overrides every input's first dim."""
    builder, can_meta = _builder_for(spec)
    if can_meta and not meta and not _is_file_spec(spec):  # a factory may load a checkpoint
        _check_fits(spec, builder)
    built, built_on = _build(builder, meta and can_meta)
    chosen = [_as_input_spec(i) for i in inputs] if inputs else built.inputs
    if not chosen:
        takes = f" (it takes {', '.join(built.input_names)})" if built.input_names else ""
        raise NoDefaultInputs(f"{spec}: no default inputs for this model{takes}; pass them with "
                              "--input")
    if batch is not None:
        chosen = with_batch(chosen, batch)
    return LoadedModel(spec, _eval(built.model), chosen, built.vocab, built.preprocess,
                       built.postprocess, built.family, built_on, built.raw_input, built.note)


def _eval(model: nn.Module) -> nn.Module:
    try:
        return model.eval()
    except NotImplementedError:  # an exported program keeps the mode it was exported in
        return model


MEMORY_SHARE = 0.5
"""A model whose weights take more than this share of the memory available is not built for real:
`hf:llama`'s default config (26.4 GB in float32) got `hwlat advise` killed. Half, because the
advisor copies a model for some levers (a cast, channels_last) while the original is kept."""


def _available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, capped by a cgroup v2 memory limit; None where unknown."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max" and available is not None:
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return available


def _size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _check_fits(spec: str, builder: Callable[[], _Built]) -> None:
    """A one-line SpecError when the model's weights would not fit in memory (counted on meta)."""
    available = _available_bytes()
    if available is None:
        return
    try:
        with torch.device("meta"):
            model = builder().model
    except Exception:  # noqa: BLE001 - the real build reports its own error
        return
    need = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    if need > MEMORY_SHARE * available:
        params = sum(p.numel() for p in model.parameters())
        raise SpecError(f"{spec}: its weights take {_size(need)} ({params / 1e6:,.0f}M "
                        f"parameters) and this machine has {_size(available)} available (half "
                        "is the most hwlat builds); `hwlat predict` builds most models without "
                        "weights, the commands that run a model need them")


def _build(builder: Callable[[], _Built], meta: bool) -> tuple[_Built, str]:
    """Build on meta when asked; a constructor that needs real values (.item()) falls back."""
    if meta:
        try:
            with torch.device("meta"):
                return builder(), "meta"
        except Exception:  # noqa: BLE001 - a real build fails again with its own error if bad
            pass
    return builder(), "cpu"


def _is_file_spec(spec: str) -> bool:
    path, sep, _ = spec.rpartition(":")
    return bool(sep) and path.endswith(".py")


def _builder_for(spec: str) -> tuple[Callable[[], _Built], bool]:
    """The function that builds a spec, and whether it can build on meta."""
    kind, sep, name = spec.partition(":")
    if spec.endswith(".pt2"):
        return (lambda: _build_pt2(Path(spec))), False  # loaded with its weights, not built
    if sep and kind == "torchvision":
        return (lambda: _build_torchvision(name)), True
    if sep and kind == "timm":
        return (lambda: _build_timm(name)), True
    if sep and kind == "hf":
        return (lambda: _build_hf(name)), True
    path, sep, factory = spec.rpartition(":")
    if sep and path.endswith(".py"):
        return (lambda: _build_file(Path(path), factory)), True
    raise SpecError(
        f"unknown model spec {spec!r}; use torchvision:NAME, timm:NAME, hf:MODEL_TYPE, "
        "path/to/file.py:FACTORY or model.pt2")


def family_of(name: str) -> str:
    """The architecture family in a model name: resnet18 -> resnet, mobilenetv3_small -> mobilenet."""
    name = name.lower().split(".")[0].removeprefix("tf_")
    if name.startswith("wide_resnet"):
        return "wide_resnet"
    match = re.match(r"[a-z]+?(?=v?\d|_|$)", name)
    return match.group(0) if match else name


def _unknown(kind: str, name: str, known: list[str], what_to_do: str) -> SpecError:
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
    did_you_mean = f"; did you mean: {', '.join(close)}" if close else ""
    return SpecError(f"unknown {kind} model {name!r}{did_you_mean}; {what_to_do}")


def list_torchvision_classification() -> list[str]:
    torchvision = _require("torchvision", "torchvision")

    return sorted(torchvision.models.list_models(module=torchvision.models))


TORCHVISION_TASKS = ("segmentation", "video", "optical_flow", "detection")
"""torchvision's model modules besides classification that `torchvision:NAME` builds: each takes
tensors of a fixed shape (`_torchvision_task_inputs`). Quantized models are refused: they run int8
kernels the profile does not time.

A detection model takes a list of images (`_ImageList` hands it the batch as one) and how much
its heads and non-maximum suppression do depends on the scores its weights give. It is built with
a score threshold of 0, so it keeps the most boxes it can (`detections_per_img`, 100 for the
R-CNNs and 300 for RetinaNet): the same count for any weights and image, and the most work those
stages do. With the default threshold, random weights kept 0 or 100 boxes by seed (Keypoint
R-CNN 1.55 s or 3.33 s at 2 threads here). Its forward reads values, so capture runs it once
(`capture.capture_spec`)."""
_DETECTION_IMAGE = (1, 3, 480, 640)  # a typical COCO photo; the model resizes it itself
_RAFT_IMAGE = (1, 3, 368, 496)  # RAFT's FlyingChairs training crop; any multiple of 8 works


def _torchvision_task(name: str) -> str | None:
    """The TORCHVISION_TASKS module a model name is in, else None."""
    torchvision = _require("torchvision", "torchvision")

    for task in TORCHVISION_TASKS:
        if name in torchvision.models.list_models(module=getattr(torchvision.models, task)):
            return task
    return None


def _torchvision_task_inputs(name: str, task: str) -> list[InputSpec]:
    """Default inputs from the model's own weights metadata: segmentation at its resize size
    (520x520), video clips of the documented clip length at the crop size (16x112x112 for r3d,
    32x224x224 for swin3d), optical flow as two frames."""
    from torchvision.models import get_model_weights

    if task == "optical_flow":
        return [InputSpec(_RAFT_IMAGE), InputSpec(_RAFT_IMAGE)]
    if task == "detection":
        return [InputSpec(_DETECTION_IMAGE)]
    weights = get_model_weights(name).DEFAULT
    transforms = weights.transforms()
    if task == "segmentation":
        side = transforms.resize_size[0]
        return [InputSpec((1, 3, side, side))]
    clip = re.search(r"clip_len=(\d+)", weights.meta.get("_docs", ""))
    height, width = transforms.crop_size
    return [InputSpec((1, 3, int(clip.group(1)) if clip else 16, height, width))]


class _ImageList(nn.Module):
    """A detection model called on a batch tensor: it takes a list of images, one per row."""

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        self.detector = detector

    def forward(self, images: torch.Tensor) -> Any:
        return self.detector(list(images.unbind(0)))


R_CNN_BOX_REGRESSIONS = ("rpn.head.bbox_pred", "roi_heads.box_predictor.bbox_pred")


def _anchor_boxes(detector: nn.Module) -> nn.Module:
    """An R-CNN whose box regressions are zero, so its proposals and detections are its anchors.

    Random regression weights make degenerate boxes (a median width of 0.1 feature cells in
    Mask R-CNN), so 949 of its 1000 proposals went to the finest FPN level, where RoIAlign reads
    the largest map. With anchors (5-35 cells a side) they spread 391/379/198/32 over the four
    levels, as the proposals of a trained model, of all sizes, do. The other detectors' heads do
    not read under their boxes.
    """
    with torch.no_grad():
        for name in R_CNN_BOX_REGRESSIONS:
            try:
                layer = detector.get_submodule(name)
            except AttributeError:
                continue
            for p in layer.parameters():
                p.zero_()
    return detector


def _build_torchvision(name: str) -> _Built:
    torchvision = _require("torchvision", "torchvision")

    classification = list_torchvision_classification()
    task = None if name in classification else _torchvision_task(name)
    if name not in classification and task is None:
        if name in torchvision.models.list_models(module=torchvision.models.quantization):
            raise SpecError(f"torchvision:{name} is a quantized model: the profile times float "
                            f"kernels; predict torchvision:{name.removeprefix('quantized_')} and "
                            "ask `hwlat advise` about int8")
        raise _unknown("torchvision", name, sorted(torchvision.models.list_models()),
                       "see torchvision.models.list_models()")
    kwargs: dict[str, Any] = {}
    if task in ("segmentation", "detection"):
        kwargs["weights_backbone"] = None  # no download
    if task == "detection":  # the most boxes it can keep (TORCHVISION_TASKS)
        kwargs["box_score_thresh" if "rcnn" in name else "score_thresh"] = 0.0
    with warnings.catch_warnings():  # e.g. GoogLeNet's note on its future default init
        warnings.simplefilter("ignore", (FutureWarning, UserWarning))
        model = torchvision.models.get_model(name, weights=None, **kwargs)
    if task is None:
        return _Built(model, [InputSpec(_DEFAULT_IMAGE)], family_of(name))
    note = ""
    if task == "detection":
        model = _ImageList(_anchor_boxes(model))
        note = ("built with score threshold 0, so its heads and non-maximum suppression run on "
                "the most boxes it keeps: the slow end for real images")
    # video and detection names carry their family before the underscore (r3d_18, swin3d_t,
    # fasterrcnn_resnet50_fpn, ssdlite320_mobilenet_v3_large)
    family = name.split("_")[0] if task in ("video", "detection") else family_of(name)
    return _Built(model, _torchvision_task_inputs(name, task), family, note=note)


def _require(module: str, kind: str):
    """An optional model-zoo package, or a one-line SpecError saying how to get it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise SpecError(f"{kind}: specs need the {module} package; install it with "
                        f"pip install 'hwlat[zoo]'") from None


def _build_timm(name: str) -> _Built:
    timm = _require("timm", "timm")

    if not timm.is_model(name):
        raise _unknown("timm", name, timm.list_models(), "see timm.list_models()")
    model = timm.create_model(name, pretrained=False)
    size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size", _DEFAULT_IMAGE[1:])
    return _Built(model, [InputSpec((1, *size))], family_of(name))


class HFTensorForward(nn.Module):
    """Call a transformers model with positional tensors and return a tensor, not a ModelOutput.

    `names` are the keyword arguments the tensors go to, in order (`input_ids`, `pixel_values`,
    `decoder_input_ids`, ...). An encoder-decoder given only token ids decodes those same ids,
    as BART does on its own."""

    def __init__(self, model: nn.Module, names: tuple[str, ...] = ("input_ids",)) -> None:
        super().__init__()
        self.model = model
        self.names = tuple(names)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        if len(inputs) > len(self.names):
            raise TypeError(f"this model takes {len(self.names)} input(s) "
                            f"({', '.join(self.names)}), not {len(inputs)}")
        kwargs = dict(zip(self.names[:len(inputs)], inputs, strict=True))
        if "decoder_input_ids" in self.names and "decoder_input_ids" not in kwargs \
                and "input_ids" in kwargs:
            kwargs["decoder_input_ids"] = kwargs["input_ids"]
        out = self.model(**kwargs)
        for name in ("last_hidden_state", "logits"):
            value = getattr(out, name, None)
            if isinstance(value, torch.Tensor):
                return value
        return out[0]


_AUDIO_SAMPLES = 16000  # one second of 16 kHz audio for `input_values` models (wav2vec2, hubert)


def _hf_inputs(model: nn.Module, config: Any) -> tuple[tuple[str, ...], list[InputSpec]]:
    """The keyword names a transformers model is called with and a default input for each.

    The main input is the model's own `main_input_name`; a model that also takes images beside
    text (CLIP-like) gets both; an encoder-decoder gets decoder token ids (a text one decodes its
    input ids, so its one default input stays the token ids). Shapes come from the config."""
    main = getattr(model, "main_input_name", "input_ids")
    text_cfg = getattr(config, "text_config", None) or config
    vision_cfg = getattr(config, "vision_config", None) or config
    names = [main]
    if main == "input_ids" and getattr(config, "vision_config", None) is not None:
        names.append("pixel_values")
    # DETR-like detectors are encoder-decoders that decode learned queries, not token ids (their
    # forward takes **kwargs, so decoder_input_ids would be dropped unseen)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False)) \
        and "decoder_input_ids" in inspect.signature(model.forward).parameters
    if encoder_decoder and main != "input_ids":
        names.append("decoder_input_ids")
    specs = []
    for name in names:
        if name in ("input_ids", "decoder_input_ids"):
            limit = min((v for v in (getattr(text_cfg, "max_position_embeddings", None),
                                     getattr(text_cfg, "max_target_positions", None))
                         if isinstance(v, int) and v > 0), default=_DEFAULT_TOKENS[1])
            specs.append(InputSpec((1, min(_DEFAULT_TOKENS[1], limit)), "int64"))
        elif name == "pixel_values":
            size = getattr(vision_cfg, "image_size", None) or _DEFAULT_IMAGE[2]
            h, w = (size, size) if isinstance(size, int) else tuple(size)[:2]
            specs.append(InputSpec((1, getattr(vision_cfg, "num_channels", 3), h, w)))
        elif name == "input_values":
            specs.append(InputSpec((1, _AUDIO_SAMPLES)))
        elif name == "input_features" and getattr(config, "num_mel_bins", None) \
                and getattr(config, "max_source_positions", None):
            # Whisper-like: a log-mel spectrogram of the full window the encoder requires
            specs.append(InputSpec((1, config.num_mel_bins, 2 * config.max_source_positions)))
        else:
            specs.append(None)
    if encoder_decoder and main == "input_ids":
        names.append("decoder_input_ids")
    return tuple(names), specs if all(specs) else []


def _build_hf(model_type: str) -> _Built:
    # Specs never download: a config's defaults are all hf: uses.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    transformers = _require("transformers", "hf")

    known = sorted(transformers.CONFIG_MAPPING.keys())
    if model_type not in known:
        raise _unknown("hf", model_type, known, "hf: takes a transformers model_type such as bert")
    config = transformers.AutoConfig.for_model(model_type)
    try:
        model = transformers.AutoModel.from_config(config)
    except (ValueError, KeyError) as e:
        raise SpecError(f"hf:{model_type} has no plain AutoModel: {_one_line(e)}") from e
    except Exception as e:  # noqa: BLE001 - a transformers bug for this type, not the user's
        raise SpecError(f"transformers {transformers.__version__} could not build hf:{model_type} "
                        f"from its default config: {_one_line(e)}") from e
    names, inputs = _hf_inputs(model, config)
    vocab = getattr(getattr(config, "text_config", None) or config, "vocab_size", None)
    # no default inputs (an input this module cannot shape): load_model asks for --input
    return _Built(HFTensorForward(model, names), inputs, model_type, vocab=vocab,
                  input_names=names)


def _build_file(path: Path, factory: str) -> _Built:
    if not path.is_file():
        raise SpecError(f"model file {path} does not exist; give path/to/file.py:FACTORY")
    module = _import_file(path)
    fn = getattr(module, factory, None)
    if not callable(fn):
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise _unknown(f"{path.name}", factory, names, f"define {factory}() in {path}")
    try:
        made = fn()
    except SpecError:
        raise
    except Exception as e:
        raise SpecError(f"{path.name}:{factory}() failed: {_one_line(e)}") from e
    return _from_factory_result(made, f"{path.name}:{factory}", family_of(factory))


def _import_file(path: Path) -> Any:
    name = f"_hwlat_user_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SpecError(f"cannot import {path}; is it a Python file?")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise SpecError(f"importing {path} failed: {_one_line(e)}") from e
    return module


def _from_factory_result(made: Any, where: str, family: str) -> _Built:
    if isinstance(made, nn.Module):
        return _Built(made, [], family)
    if not isinstance(made, dict) or not isinstance(made.get("model"), nn.Module):
        raise SpecError(f"{where} must return an nn.Module or a dict with 'model' (an nn.Module), "
                        f"'inputs' and optionally 'preprocess'/'postprocess'; got {type(made).__name__}")
    inputs = [_as_input_spec(i) for i in made.get("inputs") or []]
    return _Built(made["model"], inputs, made.get("family", family), made.get("vocab"),
                  made.get("preprocess"), made.get("postprocess"),
                  made.get("raw_input", made.get("sample")))


def _build_pt2(path: Path) -> _Built:
    if not path.is_file():
        raise SpecError(f"exported model {path} does not exist; save one with torch.export.save")
    try:
        program = torch.export.load(str(path))
    except Exception as e:
        raise SpecError(f"cannot load {path} as a torch.export archive: {_one_line(e)}") from e
    return _Built(program.module(), _exported_inputs(program), family_of(path.stem))


def _exported_inputs(program: Any) -> list[InputSpec]:
    """The user inputs an exported program was traced with, from its placeholders' metadata."""
    names = set(program.graph_signature.user_inputs)
    specs = []
    for node in program.graph.nodes:
        value = node.meta.get("val")
        if node.op == "placeholder" and node.name in names and isinstance(value, torch.Tensor):
            specs.append(InputSpec.of(value))
    return specs


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")
