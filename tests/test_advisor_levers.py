"""advisor.levers, advisor.rank, advisor.diagnose and the accuracy helpers of advisor.verify."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from advisor import levers as lv
from advisor.diagnose import Diagnosis, _verdict
from advisor.rank import LeverResult, fastest_meeting, pareto, rank
from advisor.verify import fidelity, spearman
from kernels_db.store import KernelDB
from profilers import ops
from profilers.capture import capture
from profilers.specs import InputSpec, load_model

IMAGE = ["1x3x64x64"]
FINGERPRINT = {"kind": "cpu", "model": "Test CPU", "cores": {"physical": 2},
               "isa": ["avx2", "avx512_bf16"], "caches": {"l2": 1 << 20}}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("db") / "k.db"
    with KernelDB.open(path) as kdb:
        kdb.upsert_device({**FINGERPRINT, "threads": 1}, device_id="cpu-test-t1", kind="cpu",
                          threads=1)
        kdb.upsert_device({**FINGERPRINT, "threads": 2}, device_id="cpu-test-t2", kind="cpu",
                          threads=2)
        kdb.upsert_device({**FINGERPRINT, "model": "Other", "threads": 2},
                          device_id="cpu-other-t2", kind="cpu", threads=2)
        for dev in ("cpu-test-t2", "cpu-other-t2"):
            kdb.add_configs(dev, [("k1", "aten.relu.default", "eltwise", "float32", "random",
                                   {})])
            kdb.add_measurement(kdb.config_ids(dev)["k1"], None, [1e-5] * 3, flushed=True,
                                threads=2, noisy=False)
    kdb = KernelDB.open(path, readonly=True)
    yield kdb
    kdb.close()


@pytest.fixture(scope="module")
def ctx(db):
    loaded = load_model("torchvision:resnet18", inputs=IMAGE)
    base = capture(loaded.model, list(loaded.inputs))
    return lv.LeverContext("torchvision:resnet18", loaded, list(loaded.inputs), "float32",
                           db.get_device("cpu-test-t1"), db,
                           base_flops=sum(ops.flops_of(r) for r in base))


def variant_ops(ctx, v: lv.Variant):
    inputs = v.inputs or ctx.inputs
    if v.batch:
        inputs = [inputs[0].with_batch(v.batch)]
    return capture(v.model(ctx.model), list(inputs), dtype=v.dtype or "float32",
                   channels_last=v.channels_last)


def total_flops(records) -> float:
    return sum(ops.flops_of(r) for r in records)


# -------------------------------------------------------------------------------- levers


def test_registry_entries_are_complete():
    for name, lever in lv.LEVERS.items():
        assert lever.name == name and lever.risk and lever.effort
        assert 0 <= lever.risk_level <= 3 and 0 <= lever.effort_level <= 3


def test_model_levers_move_flops_the_expected_way(ctx):
    base = ctx.base_flops
    pruned = [total_flops(variant_ops(ctx, v)) for v in lv.prune_variants(ctx)]
    assert all(f < base for f in pruned) and pruned == sorted(pruned, reverse=True)
    smaller = [total_flops(variant_ops(ctx, v)) for v in lv.input_size_variants(ctx)]
    assert all(f < base for f in smaller)
    batched = [total_flops(variant_ops(ctx, v)) for v in lv.batch_variants(ctx)]
    assert batched[0] == pytest.approx(2 * base, rel=0.01) and batched == sorted(batched)


def test_precision_and_layout_levers_keep_flops_and_change_the_ops(ctx):
    (bf16,) = lv.precision_variants(ctx)
    records = variant_ops(ctx, bf16)
    assert total_flops(records) == pytest.approx(ctx.base_flops)
    assert {r.dtype for r in records if r.op == "aten.conv2d.default"} == {"bfloat16"}
    (cl,) = lv.channels_last_variants(ctx)
    conv = next(r for r in variant_ops(ctx, cl) if r.op == "aten.conv2d.default")
    assert conv.inputs[0].stride[1] == 1  # NHWC: channels are innermost


def test_int8_lever_quantizes_linear_layers(ctx):
    (v,) = lv.int8_variants(ctx)
    model = v.model(ctx.model)
    assert any("quantized" in type(m).__module__ for m in model.modules())
    assert isinstance(ctx.model.fc, nn.Linear)  # the baseline is untouched
    assert any(r.op.startswith("quantized.") for r in variant_ops(ctx, v))


def test_thread_lever_uses_the_same_hardware_only(ctx):
    (v,) = lv.thread_variants(ctx)
    assert v.device_id == "cpu-test-t2" and v.threads == 2


def test_levers_that_do_not_apply_say_why(ctx):
    no_rate = lv.batching_variants(ctx)
    assert isinstance(no_rate, str) and "--rate" in no_rate
    assert "no smaller member" in lv.smaller_variants(ctx)  # resnet18 is the smallest resnet


def test_smaller_family_members_have_fewer_flops(db):
    loaded = load_model("torchvision:mobilenet_v3_large", inputs=IMAGE)
    flops = total_flops(capture(loaded.model, list(loaded.inputs)))
    c = lv.LeverContext("torchvision:mobilenet_v3_large", loaded, list(loaded.inputs),
                        "float32", db.get_device("cpu-test-t1"), db, base_flops=flops)
    specs = [v.spec for v in lv.smaller_variants(c)]
    assert "torchvision:mobilenet_v3_small" in specs
    assert "torchvision:mobilenet_v3_large" not in specs


def test_dynamic_batching_grid_under_load(ctx):
    loaded = lv.LeverContext(**{**ctx.__dict__, "rate": 50.0})
    grid = lv.batching_variants(loaded)
    assert len(grid) == len(lv.BATCH_SIZES) * len(lv.WINDOW_MS)
    assert all(v.serving["max_batch"] > 1 for v in grid)
    assert isinstance(lv.batch_variants(loaded), str)


def test_resize_wrapper_feeds_the_smaller_input():
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(tuple(x.shape))
            return x.sum()

    lv.ResizeInputs(Probe(), (1, 3, 16, 16))(torch.randn(1, 3, 32, 32))
    lv.ResizeInputs(Probe(), (1, 8))(torch.zeros(1, 32, dtype=torch.int64))
    assert seen == [(1, 3, 16, 16), (1, 8)]

    class Pair(nn.Module):  # two frames (RAFT) or ids plus their mask: resized together
        def forward(self, a, b, other):
            seen.append((tuple(a.shape), tuple(b.shape), tuple(other.shape)))
            return a.sum()

    lv.ResizeInputs(Pair(), (1, 3, 16, 16))(torch.randn(1, 3, 32, 32), torch.randn(1, 3, 32, 32),
                                            torch.randn(1, 5))
    assert seen[-1] == ((1, 3, 16, 16), (1, 3, 16, 16), (1, 5))


def test_input_size_changes_every_input_shaped_like_the_first(ctx):
    frames = [InputSpec((1, 3, 64, 64)), InputSpec((1, 3, 64, 64)), InputSpec((3,))]
    pair = lv.LeverContext(**{**ctx.__dict__, "inputs": frames})
    smaller = lv.input_size_variants(pair)[0]
    assert smaller.inputs[0].shape == smaller.inputs[1].shape != frames[0].shape
    assert smaller.inputs[2] == frames[2]


# ---------------------------------------------------------------------------------- rank


def result(label, target, *, risk=0, effort=0, hi=None, rejected=None, speedup=None):
    return LeverResult(label, label, {}, target * 0.9, target, [target * 0.8, hi or target],
                       speedup if speedup is not None else 30.0 / target, 20.0, risk, "r",
                       effort, "e", rejected=rejected)


def test_rank_prefers_sure_budget_hits_then_penalizes_risk():
    sure = result("cast", 15.0, risk=1, effort=1)
    risky = result("prune", 12.0, risk=3, effort=2)
    borderline = result("resize", 10.0, hi=25.0)
    miss = result("threads", 25.0)
    slower = result("batch", 60.0)
    ranked = rank([slower, miss, borderline, risky, sure])
    # 2.0x / 1.25 = 1.6 beats 2.5x / 1.65 = 1.52; the borderline one comes after both.
    assert [r.label for r in ranked] == ["cast", "prune", "resize", "threads", "batch"]
    assert slower.slower and not miss.slower


def test_fastest_meeting_budget_never_picks_a_rejected_lever():
    fast_bad = result("prune 75%", 8.0, rejected="below floor")
    ok = result("cast", 15.0)
    assert fastest_meeting([fast_bad, ok, result("x", 25.0)]) is ok
    assert rank([fast_bad, ok])[-1] is fast_bad
    assert fastest_meeting([result("x", 25.0)]) is None


def test_fastest_uses_the_measured_latency_when_verified():
    a, b = result("a", 10.0), result("b", 12.0)
    a.measured_ms = {"target": 22.0}
    assert fastest_meeting([a, b]) is b


def test_pareto_over_latency_and_risk():
    a = result("safe", 15.0, risk=0)
    b = result("risky fast", 9.0, risk=3)
    c = result("dominated", 16.0, risk=1)
    assert [r.label for r in pareto([a, b, c])] == ["risky fast", "safe"]


# ------------------------------------------------------------------------------ diagnose


def diagnosis(**kw) -> Diagnosis:
    base = dict(bottleneck="", why="", family_share={"conv": 0.8}, compute_bound_share=0.9,
                roofline_efficiency=0.5, intensity_flops_per_byte=30.0,
                ridge_flops_per_byte=5.0)
    return Diagnosis(**{**base, **kw})


def test_verdicts_follow_the_design_table():
    assert _verdict(diagnosis())[0] == "compute"
    assert _verdict(diagnosis(compute_bound_share=0.2))[0] == "memory bandwidth"
    busy = {"utilization": 0.9, "queue_ms": 5.0, "compute_ms": 4.0, "percentile": "p95"}
    assert _verdict(diagnosis(queue=busy))[0] == "queueing"
    idle = diagnosis(roofline_efficiency=0.01, family_share={"op_overhead": 0.5})
    assert _verdict(idle)[0] == "overhead"
    gpu = diagnosis(transfer={"h2d_ms": 3.0, "share": 0.5})
    assert _verdict(gpu)[0] == "data transfer"
    assert "prune" in diagnosis(bottleneck="compute").first_fix


# ------------------------------------------------------------------------------ accuracy


def test_fidelity_top1_and_cosine():
    logits = [torch.tensor([[0.1, 0.9]]), torch.tensor([[0.8, 0.2]])]
    assert fidelity(logits, logits) == ("top1_agreement", 1.0)
    flipped = [torch.tensor([[0.9, 0.1]]), torch.tensor([[0.8, 0.2]])]
    assert fidelity(logits, flipped) == ("top1_agreement", 0.5)
    maps = [torch.ones(1, 4, 2)]
    metric, value = fidelity(maps, [2 * torch.ones(1, 4, 2)])
    assert metric == "cosine_similarity" and value == pytest.approx(1.0)


def test_spearman():
    assert spearman([1.0, 2.0, 3.0], [10.0, 20.0, 30.0]) == pytest.approx(1.0)
    assert spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert spearman([1.0, 2.0], [1.0, 2.0]) is None


def test_subnormals_are_counted_where_a_cpu_prices_them_and_say_why_not_elsewhere(tmp_path):
    import dataclasses

    from advisor.engine import count_subnormals
    from kernels_db.store import DeviceRow
    from profilers.specs import load_model, parse_input_spec

    (tmp_path / "under.py").write_text(
        "import torch\n"
        "class Under(torch.nn.Module):\n"
        "    def __init__(self, low):\n"
        "        super().__init__()\n"
        "        self.fc, self.low = torch.nn.Linear(64, 64), low\n"
        "    def forward(self, x):\n"  # exp(-100) = 3.7e-44: subnormal; exp(-10) is not
        "        return self.fc(torch.exp(x.abs() * 0 - self.low))\n"
        "def make():\n"
        "    return Under(100)\n"
        "def normal():\n"
        "    return Under(10)\n")
    under, normal = (load_model(f"{tmp_path / 'under.py'}:{name}",
                                inputs=[parse_input_spec("2x64")]) for name in ("make", "normal"))
    fields = {f.name: None for f in dataclasses.fields(DeviceRow)}
    cpu = DeviceRow(**{**fields, "id": "d", "kind": "cpu",
                       "peaks": {"subnormal": {"reuse_ns": 2.0, "block_ns": 100.0}}})
    found = count_subnormals(under, list(under.inputs), "float32", cpu)
    assert found.counted and found.uses is not None
    assert found.uses.share > 0.1
    assert found.uses.reuse.get("matmul", 0) == 64 * 64  # each input used by 64 outputs
    none = count_subnormals(normal, list(normal.inputs), "float32", cpu)
    assert none.counted and none.uses is None and "computes no subnormal" in none.why
    for device, dtype, why in ((dataclasses.replace(cpu, peaks={}), "float32", "no measured"),
                               (dataclasses.replace(cpu, kind="cuda"), "float32", "CPUs"),
                               (cpu, "bfloat16", "float32, not bfloat16")):
        skipped = count_subnormals(under, list(under.inputs), dtype, device)
        assert skipped.uses is None and not skipped.counted and why in skipped.why
    # the lever offers itself only where the values were counted and cost something
    ctx = lv.LeverContext("x", under, list(under.inputs), "float32", cpu, None,
                          subnormals=found.uses)
    (flush,) = lv.flush_variants(ctx)
    assert flush.flush_denormal and flush.changes_model  # fidelity is checked
    assert lv.flush_variants(dataclasses.replace(ctx, subnormals=None,
                                                 subnormals_why=none.why)) == none.why
