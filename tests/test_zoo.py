"""The shipped reference zoo: settings expand to concrete cases; held-out families stay out."""

from __future__ import annotations

import pytest

from profilers import zoo
from profilers.errors import SpecError


def test_training_cases_cover_batches_resolutions_and_sequences():
    cases = zoo.training_cases()
    resnet = [c for c in cases if c.spec == "torchvision:resnet18"]
    assert {c.inputs for c in resnet} == {("1x3x224x224",), ("1x3x160x160",),
                                          ("8x3x224x224",), ("8x3x160x160",)}
    vit = [c for c in cases if c.spec == "torchvision:vit_b_32"]
    assert {c.inputs[0] for c in vit} == {"1x3x224x224", "8x3x224x224"}  # fixed resolution
    bert = [c for c in cases if c.spec == "hf:bert"]
    assert ("int64:8x32",) in {c.inputs for c in bert} and all(c.family == "bert" for c in bert)


def test_batches_filter_and_batch_property():
    cases = zoo.training_cases(batches=[8])
    assert cases and all(c.batch == 8 for c in cases)


def test_file_specs_resolve_to_the_data_directory():
    spec = zoo.resolve_spec("models.py:transformer_encoder")
    assert spec.endswith("data/models.py:transformer_encoder")
    assert zoo.resolve_spec("torchvision:resnet18") == "torchvision:resnet18"


def test_a_stored_zoo_file_spec_is_found_again_after_the_checkout_moves(tmp_path):
    here = zoo.resolve_spec("models.py:transformer_encoder")
    assert zoo.locate("/gone/checkout/data/models.py:transformer_encoder") == here
    assert zoo.locate(here) == here
    # a user's own file, or a factory the zoo does not ship, is not redirected to the zoo's
    for spec in ("/gone/checkout/data/models.py:my_net", "/gone/mine/models.py:transformer_encoder",
                 "torchvision:resnet18"):
        assert zoo.locate(spec) == spec


def test_held_out_families_are_never_trained_on():
    unseen = zoo.heldout_entries(only_unseen_families=True)
    assert unseen and not {e["family"] for e in unseen} & zoo.training_families()
    assert len(zoo.heldout_entries()) > len(unseen)


def test_added_models_take_their_default_inputs_and_the_zoo_family_their_name_starts_with(
        tmp_path, monkeypatch) -> None:
    (tmp_path / "net.py").write_text(
        "import torch.nn as nn\n"
        "def build():\n"
        "    return {'model': nn.Conv2d(3, 8, 3), 'inputs': ['1x3x32x32']}\n"
        "def bare():\n"
        "    return nn.Conv2d(3, 8, 3)\n")
    monkeypatch.chdir(tmp_path)
    mine = zoo.added_cases("net.py:build", batches=(1, 4))
    assert [c.inputs for c in mine] == [("1x3x32x32",), ("4x3x32x32",)]
    assert mine[0].spec == f"{tmp_path / 'net.py'}:build"  # absolute: found from anywhere
    timm = zoo.added_cases("timm:mobilenetv3_large_100", batches=(8,))
    assert timm[0].family == "mobilenet_v3" and timm[0].inputs == ("8x3x224x224",)
    assert zoo.added_cases("torchvision:efficientnet_v2_s")[0].family == "efficientnet_v2"
    with pytest.raises(SpecError, match="no default inputs to profile it with"):
        zoo.added_cases("net.py:bare")
