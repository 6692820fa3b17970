"""advisor.pruning: real structured pruning keeps models runnable with fewer channels and FLOPs."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

from advisor.pruning import keep_count, l1_keep, prunable_sites, prune_model
from profilers import ops
from profilers.capture import capture
from profilers.errors import AdvisorError
from profilers.specs import InputSpec

SMALL = InputSpec((1, 3, 64, 64))


def flops(model: nn.Module, inputs: list[InputSpec]) -> float:
    return sum(ops.flops_of(r) for r in capture(model, inputs))


def channels(model: nn.Module) -> int:
    return sum(m.out_channels for m in model.modules() if isinstance(m, nn.Conv2d))


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small",
                                  "vgg11_bn"])
def test_pruned_torchvision_models_run_with_fewer_channels_and_flops(name):
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=10).eval()
    before_channels, before_flops = channels(model), flops(model, [SMALL])
    pruned, report = prune_model(model, 0.5)
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        assert pruned(x).shape == model(x).shape == (2, 10)
    assert channels(model) == before_channels  # the original is untouched
    assert channels(pruned) < before_channels
    assert report.channels_after < report.channels_before
    assert flops(pruned, [SMALL]) < 0.8 * before_flops


def test_more_pruning_removes_more_flops():
    model = torchvision.models.resnet18(num_classes=10).eval()
    counts = [flops(prune_model(model, r)[0], [SMALL]) for r in (0.25, 0.5, 0.75)]
    assert counts[0] > counts[1] > counts[2]


def test_residual_outputs_keep_their_width():
    model = torchvision.models.resnet18(num_classes=10).eval()
    pruned, _ = prune_model(model, 0.5)
    for (name, a), (_, b) in zip(model.named_modules(), pruned.named_modules(), strict=True):
        if name.endswith("conv2") or name.endswith("downsample.0"):
            assert b.out_channels == a.out_channels  # block outputs feed the residual sum
        if name.endswith("conv1") and "layer" in name:
            assert b.out_channels == a.out_channels // 2


def test_l1_keeps_the_channels_with_the_largest_weights():
    conv = nn.Conv2d(2, 4, 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([1.0, -5.0, 0.1, 3.0]).view(4, 1, 1, 1).expand(4, 2, 1, 1))
    assert l1_keep(conv.weight, 2).tolist() == [1, 3]


def test_batchnorm_statistics_follow_the_kept_channels():
    model = torchvision.models.resnet18(num_classes=10).eval()
    block = model.layer1[0]
    with torch.no_grad():
        block.bn1.running_mean.copy_(torch.arange(64.0))
    keep = l1_keep(block.conv1.weight, keep_count(64, 0.5))
    pruned, _ = prune_model(model, 0.5)
    assert pruned.layer1[0].bn1.running_mean.tolist() == [float(i) for i in keep]


def test_mlp_hidden_units_are_pruned():
    mlp = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 5)).eval()
    pruned, report = prune_model(mlp, 0.5)
    assert pruned[0].out_features == pruned[3].in_features == 32
    assert pruned(torch.randn(3, 16)).shape == (3, 5)
    assert report.sites == (("0", 64, 32),)


def test_keep_count_rounds_wide_layers_to_multiples_of_8():
    assert keep_count(64, 0.25) == 48
    assert keep_count(100, 0.5) == 48
    assert keep_count(10, 0.5) == 5
    assert keep_count(4, 0.9) == 1


def test_unprunable_models_and_bad_ratios_are_domain_errors():
    single = nn.Sequential(nn.Linear(4, 2))
    assert prunable_sites(single) == 0
    with pytest.raises(AdvisorError, match="no prunable block"):
        prune_model(single, 0.5)
    with pytest.raises(AdvisorError, match="ratio"):
        prune_model(torchvision.models.resnet18(), 1.0)
