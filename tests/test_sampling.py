"""Sampling: perturbations stay valid ops, random configs are real dispatched ops, dedupe order."""

from __future__ import annotations

import random

import pytest

from profilers import sampling
from profilers.capture import capture_spec
from profilers.ops import lookup
from profilers.specs import parse_input_spec


@pytest.fixture(scope="module")
def squeezenet_ops():
    captured = capture_spec("torchvision:squeezenet1_1", inputs=[parse_input_spec("1x3x64x64")])
    return list(sampling.timed_records(captured.ops))


def test_timed_records_drop_free_ops(squeezenet_ops):
    assert squeezenet_ops and all(not lookup(r.op).free for r in squeezenet_ops)


def test_perturbations_change_a_size_and_rederive_outputs(squeezenet_ops):
    perturbed = sampling.perturbations(squeezenet_ops, 30, seed=1)
    assert len(perturbed) >= 20
    originals = {r.key for r in squeezenet_ops}
    assert sum(p.key not in originals for p in perturbed) >= 0.8 * len(perturbed)
    for p in perturbed:
        again = sampling.outputs_of(p.op, p.args, p.kwargs)
        assert again == p.outputs  # consistent with what the op really returns


def test_inconsistent_perturbation_is_rejected():
    conv = next(r for r in sampling.random_records("conv", 5, seed=3) if r.op.endswith("conv2d.default"))
    args = list(conv.args)
    args[1] = args[1].__class__((7, 5, 3, 3), (45, 9, 3, 1), "float32")  # wrong in-channels
    assert sampling.outputs_of(conv.op, tuple(args), conv.kwargs) is None


@pytest.mark.parametrize("family", sorted(sampling.GENERATORS))
def test_random_configs_are_timed_ops_of_their_family(family):
    records = sampling.random_records(family, 4, seed=0)
    assert records
    assert any(lookup(r.op).family == family for r in records)


def test_dedupe_keeps_the_first_source(squeezenet_ops):
    r = squeezenet_ops[0]
    kept = sampling.dedupe([sampling.Sample(r, "zoo", 0), sampling.Sample(r, "random", 2)])
    assert [s.source for s in kept] == ["zoo"]


def test_perturb_is_seeded(squeezenet_ops):
    a = [sampling.perturb(r, random.Random(5)) for r in squeezenet_ops[:10]]
    b = [sampling.perturb(r, random.Random(5)) for r in squeezenet_ops[:10]]
    assert a == b
