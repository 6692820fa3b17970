"""Real structured channel pruning (L1 norm) that keeps every tensor shape consistent.

Only channels internal to a block are pruned, never a block's output channels, so residual
additions and the next block still see the shapes they expect:
* ResNet BasicBlock: conv1's outputs (bn1, conv2's inputs);
* ResNet Bottleneck: conv1's and conv2's outputs (bn1/bn2, the next conv's inputs), groups=1;
* inverted residuals (MobileNetV2-style `conv` or V3/EfficientNet-style `block` sequences with an
  expansion 1x1 conv, a depthwise conv, an optional squeeze-excite and a 1x1 projection): the
  expanded channels through all of them;
* `nn.Sequential` chains (VGG features, MLP heads): the outputs of a Conv2d/Linear followed, with
  only per-channel modules (activations, dropout, BatchNorm, pooling) in between, by another
  layer of the same kind.
A channel's importance is the L1 norm of the weights that produce it; the highest are kept.
The model is modified in place on a deep copy; the original is untouched.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from profilers.errors import AdvisorError

# Modules that act per channel/element and may sit between two pruned layers.
_PASSTHROUGH = (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid,
                nn.Tanh, nn.Dropout, nn.Identity, nn.LeakyReLU, nn.Mish, nn.MaxPool2d,
                nn.AvgPool2d, nn.BatchNorm2d)


@dataclass(frozen=True)
class PruneReport:
    """What was pruned: channels before/after per site, and the module paths touched."""

    ratio: float
    sites: tuple[tuple[str, int, int], ...]  # (module path, channels before, after)

    @property
    def channels_before(self) -> int:
        return sum(s[1] for s in self.sites)

    @property
    def channels_after(self) -> int:
        return sum(s[2] for s in self.sites)


def keep_count(channels: int, ratio: float) -> int:
    """Channels kept when pruning `ratio` of them: at least 1, rounded to a multiple of 8 when
    the layer is wide enough (vector units handle multiples of 8 best)."""
    kept = channels * (1.0 - ratio)
    if channels >= 32:
        return max(8, int(round(kept / 8.0)) * 8)
    return max(1, int(round(kept)))


def l1_keep(weight: torch.Tensor, keep: int) -> torch.Tensor:
    """Indices (sorted) of the `keep` output channels with the largest L1 norm."""
    scores = weight.detach().float().abs().reshape(weight.shape[0], -1).sum(dim=1)
    return torch.sort(torch.topk(scores, keep).indices).values


def prune_model(model: nn.Module, ratio: float) -> tuple[nn.Module, PruneReport]:
    """A pruned deep copy of `model` with `ratio` of each prunable site's channels removed."""
    if not 0.0 < ratio < 1.0:
        raise AdvisorError(f"pruning ratio must be within (0, 1), got {ratio}")
    pruned = copy.deepcopy(model)
    sites = []
    for path, module in list(pruned.named_modules()):
        for label, before, after in _prune_module(module, ratio):
            sites.append((f"{path}.{label}" if path else label, before, after))
    if not sites:
        raise AdvisorError(
            f"no prunable block in {type(model).__name__}: structured pruning supports ResNet "
            "blocks, inverted residuals and Linear MLPs in nn.Sequential")
    return pruned, PruneReport(ratio, tuple(sites))


def prunable_sites(model: nn.Module) -> int:
    """How many sites `prune_model` would prune (0: the lever does not apply)."""
    return sum(1 for _, m in model.named_modules() if _site_kind(m) is not None)


def _prune_module(module: nn.Module, ratio: float) -> Iterator[tuple[str, int, int]]:
    kind = _site_kind(module)
    if kind == "basic":
        yield _prune_chain(ratio, "conv1", module.conv1, [module.bn1], [], module.conv2)
    elif kind == "bottleneck":
        yield _prune_chain(ratio, "conv1", module.conv1, [module.bn1], [], module.conv2)
        yield _prune_chain(ratio, "conv2", module.conv2, [module.bn2], [], module.conv3)
    elif kind == "inverted":
        yield _prune_inverted(module, ratio)
    elif kind == "mlp":
        yield from _prune_mlp(module, ratio)


def _site_kind(module: nn.Module) -> str | None:
    names = {n for n, _ in module.named_children()}
    if {"conv1", "bn1", "conv2", "bn2", "conv3", "bn3"} <= names:
        return "bottleneck" if module.conv2.groups == 1 else None
    if {"conv1", "bn1", "conv2", "bn2"} <= names and isinstance(module.conv1, nn.Conv2d):
        return "basic" if module.conv2.groups == 1 else None
    if _inverted_layers(module) is not None:
        return "inverted"
    if isinstance(module, nn.Sequential) and _mlp_pairs(module):
        return "mlp"
    return None


def _conv_bn(block: nn.Module) -> tuple[nn.Conv2d, nn.BatchNorm2d | None] | None:
    """(conv, bn) of a Conv2dNormActivation-like sequence or a bare conv."""
    if isinstance(block, nn.Conv2d):
        return block, None
    if isinstance(block, nn.Sequential) and len(block) >= 1 and isinstance(block[0], nn.Conv2d):
        bn = block[1] if len(block) > 1 and isinstance(block[1], nn.BatchNorm2d) else None
        return block[0], bn
    return None


def _inverted_layers(module: nn.Module):
    """(expand, dw, se or None, project) of an inverted residual with an expansion, else None."""
    seq = getattr(module, "conv", None) if hasattr(module, "use_res_connect") else None
    seq = seq if seq is not None else getattr(module, "block", None)
    if not isinstance(seq, nn.Sequential) or len(seq) < 3:
        return None
    parts = list(seq)
    expand, dw = _conv_bn(parts[0]), _conv_bn(parts[1])
    if expand is None or dw is None:
        return None
    if expand[0].kernel_size != (1, 1) or expand[0].groups != 1:
        return None
    if dw[0].groups != dw[0].in_channels or dw[0].in_channels != expand[0].out_channels:
        return None
    rest = parts[2:]
    se = rest.pop(0) if rest and hasattr(rest[0], "fc1") and hasattr(rest[0], "fc2") else None
    project = _conv_bn(rest[0]) if rest and isinstance(rest[0], (nn.Sequential, nn.Conv2d)) \
        else None
    if project is None or project[0].groups != 1:
        return None
    return expand, dw, se, project


def _prune_inverted(module: nn.Module, ratio: float) -> tuple[str, int, int]:
    (expand, ebn), (dw, dbn), se, (project, _) = _inverted_layers(module)
    channels = expand.out_channels
    keep = l1_keep(expand.weight, keep_count(channels, ratio))
    _select_out(expand, keep)
    _select_bn(ebn, keep)
    _select_depthwise(dw, keep)
    _select_bn(dbn, keep)
    if se is not None:
        _select_in(se.fc1, keep)
        _select_out(se.fc2, keep)
    _select_in(project, keep)
    return "expand", channels, len(keep)


def _prune_chain(ratio: float, label: str, producer: nn.Conv2d, bns: list, _: list,
                 consumer: nn.Conv2d) -> tuple[str, int, int]:
    channels = producer.out_channels
    keep = l1_keep(producer.weight, keep_count(channels, ratio))
    _select_out(producer, keep)
    for bn in bns:
        _select_bn(bn, keep)
    _select_in(consumer, keep)
    return label, channels, len(keep)


def _chainable(layer: nn.Module) -> bool:
    return isinstance(layer, nn.Linear) or (isinstance(layer, nn.Conv2d) and layer.groups == 1)


def _mlp_pairs(seq: nn.Sequential) -> list[tuple[int, int]]:
    """(i, j) index pairs of same-kind layers in `seq` with only pass-through modules between."""
    pairs, layers = [], list(seq)
    for i, first in enumerate(layers):
        if not _chainable(first):
            continue
        for j in range(i + 1, len(layers)):
            if _chainable(layers[j]):
                if type(layers[j]) is type(first):
                    pairs.append((i, j))
                break
            if not isinstance(layers[j], _PASSTHROUGH):
                break
    return pairs


def _prune_mlp(seq: nn.Sequential, ratio: float) -> Iterator[tuple[str, int, int]]:
    for i, j in _mlp_pairs(seq):
        first, second = seq[i], seq[j]
        channels = first.weight.shape[0]
        keep = l1_keep(first.weight, keep_count(channels, ratio))
        _select_out(first, keep)
        for k in range(i + 1, j):
            if isinstance(seq[k], nn.BatchNorm2d):
                _select_bn(seq[k], keep)
        _select_in(second, keep)
        yield str(i), channels, len(keep)


# ------------------------------------------------------------- in-place layer surgery


def _select_out(layer: nn.Conv2d | nn.Linear, keep: torch.Tensor) -> None:
    layer.weight = nn.Parameter(layer.weight.data[keep].clone())
    if layer.bias is not None:
        layer.bias = nn.Parameter(layer.bias.data[keep].clone())
    if isinstance(layer, nn.Linear):
        layer.out_features = len(keep)
    else:
        layer.out_channels = len(keep)


def _select_in(layer: nn.Conv2d | nn.Linear, keep: torch.Tensor) -> None:
    layer.weight = nn.Parameter(layer.weight.data[:, keep].clone())
    if isinstance(layer, nn.Linear):
        layer.in_features = len(keep)
    else:
        layer.in_channels = len(keep)


def _select_depthwise(conv: nn.Conv2d, keep: torch.Tensor) -> None:
    _select_out(conv, keep)
    conv.in_channels = conv.groups = len(keep)


def _select_bn(bn: nn.BatchNorm2d | None, keep: torch.Tensor) -> None:
    if bn is None:
        return
    bn.weight = nn.Parameter(bn.weight.data[keep].clone())
    bn.bias = nn.Parameter(bn.bias.data[keep].clone())
    bn.running_mean = bn.running_mean[keep].clone()
    bn.running_var = bn.running_var[keep].clone()
    bn.num_features = len(keep)
