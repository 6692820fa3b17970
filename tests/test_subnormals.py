"""profilers.subnormals: counting the subnormal values a forward pass uses, and pricing them."""

from __future__ import annotations

import math

import pytest
import torch

from profilers.specs import parse_input_spec
from profilers.subnormals import (
    SubnormalUses,
    count_uses,
    crowding,
    measure_cost,
    price,
    uses_of_spec,
)

TINY = 1e-39  # below float32's smallest normal, 1.18e-38


class Shrink(torch.nn.Module):
    """x * 1e-39 (an elementwise op writing subnormals), a view, a dropout handing its input
    back, then a 8 -> 4 linear reading them (each input value multiplied into 4 outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        y = self.drop((x * TINY).view(-1, 8))
        return self.fc(y)


def test_uses_count_reuse_in_a_matmul_and_blocks_elsewhere():
    model = Shrink().eval()
    x = torch.randn(3, 8) + 5.0  # no zeros: every product is subnormal
    uses = count_uses(model, [x])
    # the mul writes 24 subnormals, in 2 blocks of 16; the linear reads them 4 times each
    assert uses.blocks == {"eltwise": 2}
    assert list(uses.reuse) == ["matmul"] and uses.reuse["matmul"] == pytest.approx(24 * 4)
    # written: mul 24 (all subnormal), linear 12 (normal: the bias); views and the dropout's
    # pass-through are not counted again
    assert uses.share == pytest.approx(24 / 36)


def test_a_model_without_subnormals_uses_none():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    uses = count_uses(model, [torch.randn(2, 8)])
    assert uses == SubnormalUses(0.0, {}, {})


def test_price_and_scaled():
    uses = SubnormalUses(0.02, {"matmul": 1e6, "conv": 5e5}, {"eltwise": 1000})
    cost = {"reuse_ns": 2.0, "block_ns": 100.0}
    assert price(uses, cost) == pytest.approx({"matmul": 2e-3, "conv": 1e-3, "eltwise": 1e-4})
    assert price(uses.scaled(8), cost)["matmul"] == pytest.approx(16e-3)


class Attend(torch.nn.Module):
    def forward(self, p, v):
        return p.matmul(v)


def attention_operands() -> tuple[torch.Tensor, torch.Tensor]:
    """2 windows x 2 heads of 4x4 probabilities, subnormal in the second window only: column 0
    (whose partners, row 0 of the values, are nonzero) and column 3 (row 3: zero padding)."""
    p = torch.rand(2, 2, 4, 4) + 0.5
    p[1, :, :, 0] = TINY
    p[1, :, :, 3] = TINY
    v = torch.rand(2, 2, 4, 5) + 0.5
    v[..., 3, :] = 0.0
    return p, v


def test_a_batched_matmul_counts_uses_with_a_nonzero_partner_per_matrix():
    uses = count_uses(Attend(), attention_operands())
    # per matrix of the bmm's batch (window-major, then head): column 0's 4 subnormals each
    # meet 5 nonzero values; column 3's meet zeros and cost nothing
    assert uses.per_matrix == [("matmul", (0.0, 0.0, 20.0, 20.0))]
    assert uses.reuse == {"matmul": 40.0}
    # a matmul against a 2-D matrix runs as one mm, whose threads all read every row: no split
    p, v = attention_operands()
    flat = count_uses(Attend(), [p.flatten(0, 1), v[0, 0]])
    assert flat.per_matrix == [] and flat.reuse == {"matmul": 40.0}


def test_a_linear_counts_only_the_weights_a_subnormal_meets():
    fc = torch.nn.Linear(4, 3).eval()
    with torch.no_grad():
        fc.weight.copy_(torch.rand(3, 4) + 0.5)
        fc.weight[:, 2] = 0.0  # input feature 2 meets only zeros
        fc.weight[1, 0] = 0.0  # feature 0 meets 2 nonzero weights of 3
    x = torch.rand(5, 4) + 0.5
    x[:, 0] = TINY
    x[:, 2] = TINY
    uses = count_uses(fc, [x])
    assert uses.reuse == {"matmul": 5 * 2} and uses.per_matrix == []


def test_normal_values_whose_products_underflow_are_counted_down_to_2_to_the_minus_158():
    fc = torch.nn.Linear(4, 3, bias=False).eval()
    with torch.no_grad():  # products with 1e-20: 1e-40 (subnormal), 1e-48 (far below), 1e-20
        fc.weight.copy_(torch.tensor([[1e-20] * 4, [1e-28] * 4, [1.0] * 4]))
    uses = count_uses(fc, [torch.full((2, 4), 1e-20)])  # no subnormal input at all
    assert uses.reuse == {"matmul": 2 * 4}  # each row's 4 products with the first weight row
    normal = count_uses(fc, [torch.full((2, 4), 1.0)])
    assert normal.reuse == {} and not normal.any
    # a bias that makes every output normal: no subnormal written, the products still slow
    biased = torch.nn.Linear(4, 3).eval()
    with torch.no_grad():
        biased.weight.copy_(fc.weight)
        biased.bias.fill_(1.0)
    written = count_uses(biased, [torch.full((2, 4), 1e-20)])
    assert written.share == 0.0 and written.reuse == {"matmul": 2 * 4} and written.any


def test_a_subnormal_pays_with_partners_of_2_to_the_minus_32_or_more_and_never_with_one():
    partners = torch.tensor([2.0 ** -32, 2.0 ** -33, 0.5, 2.0 ** -140])  # the last subnormal
    x = torch.full((1, 1), 2.0 ** -140)
    uses = count_uses(Attend(), [x, partners[None]])
    assert uses.reuse == {"matmul": 2}  # 2^-32 and 0.5; not 2^-33, not another subnormal
    q = torch.full((1, 2, 3, 4), TINY)  # attention scores of all-subnormal queries and keys
    assert count_uses(Attend(), [q, q.transpose(-1, -2)]).reuse == {}


def test_a_pointwise_conv_pays_for_every_channel_vector_holding_a_subnormal():
    x = torch.rand(1, 16, 2, 2) + 0.5
    x[0, 0] = TINY  # channel 0 at all 4 positions: each position's 16 channels hold one
    pointwise = torch.nn.Conv2d(16, 8, 1, bias=False).eval()
    assert count_uses(pointwise, [x]).reuse == {"conv": 4 * 16 * 8}  # 4 vectors, 8 outputs
    # a 3x3 conv pays per subnormal value, each reused by 8 outputs x 9 taps (over 4 positions
    # of a padded 2x2 map: FLOPs / 2 / the input's values)
    spatial = torch.nn.Conv2d(16, 8, 3, padding=1, bias=False).eval()
    assert count_uses(spatial, [x]).reuse == {"conv": pytest.approx(4 * 8 * 9)}


def test_crowding_follows_the_parts_threads_take_of_a_batch():
    profile = (0.0, 0.0, 20.0, 20.0)  # all in the second half
    assert crowding(profile, 1, 1) == 0.0  # one thread runs it all anyway
    assert crowding(profile, 1, 2) == 40.0  # 2 x 40 on the busiest thread, less 40 spread
    assert crowding(profile, 2, 2) == 0.0  # two images: one each, evenly
    assert crowding(profile, 1, 4) == 40.0  # parts of 1: 4 x 20 - 40
    assert crowding((5.0, 0.0, 0.0), 1, 2) == 5.0  # parts of 2 and 1 (ceil): 2 x 5 - 5
    uses = count_uses(Attend(), attention_operands())
    cost = {"reuse_ns": 2.0, "block_ns": 100.0, "threads": 2}
    assert price(uses, cost) == {"matmul": pytest.approx((40 + 40) * 2e-9)}
    assert price(uses.scaled(2), cost) == {"matmul": pytest.approx(80 * 2e-9)}


def test_a_spec_is_counted_with_its_weights_and_at_batch_one_scaled(tmp_path):
    from profilers.subnormals import uses_at_batch_one

    (tmp_path / "under.py").write_text(
        "import torch\n"
        "class Under(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(64, 2)\n"
        "    def forward(self, x):\n"  # exp(-100) = 3.7e-44: subnormal
        "        return self.fc(torch.exp(x.abs() * 0 - 100))\n"
        "def make():\n"
        "    return Under()\n")
    spec = f"{tmp_path / 'under.py'}:make"
    one = uses_of_spec(spec, ["1x64"], threads=1)
    assert one.reuse == {"matmul": pytest.approx(64 * 2)}
    assert one.blocks == {"eltwise": 4}  # exp writes 64 subnormals: 4 blocks
    four = uses_at_batch_one(spec, [parse_input_spec("4x64")])
    assert four.reuse == {"matmul": pytest.approx(4 * 64 * 2)} and four.blocks == {"eltwise": 16}
    assert uses_of_spec("torchvision:resnet18", ["1x3x32x32"], threads=1).share == 0.0


def test_measure_cost_gives_both_costs():
    cost = measure_cost(threads=1, budget_s=0.3)
    assert set(cost) == {"reuse_ns", "block_ns", "threads", "share", "pace_ms"}
    assert cost["threads"] == 1
    assert all(math.isfinite(cost[k]) and cost[k] >= 0 for k in ("reuse_ns", "block_ns"))


def test_an_in_place_op_is_counted_where_a_pass_through_is_not():
    class InPlace(torch.nn.Module):
        def forward(self, x):
            y = x * TINY  # 16 subnormals written: 1 block
            return torch.nn.functional.dropout(y, 0.5, training=False).add_(TINY)

    uses = count_uses(InPlace().eval(), [torch.rand(1, 16) + 1.0])
    # mul writes 1 block; add_ reads 1 and writes 1 (x * 1e-39 + 1e-39 is still subnormal)
    assert uses.blocks == {"eltwise": 3}
