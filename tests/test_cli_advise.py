"""`hwlat advise` through click's CliRunner, on a small database of this machine.

The database holds this machine's real fingerprint (so --verify may measure here) and op
latencies that follow a known formula (1.7 x roofline + 4 us): predictions are deterministic and
the test does not depend on how busy the machine is. Verification measures for real.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from hwlat.cli import cli
from hwlat.commands.advise import advise
from kernels_db.store import KernelDB
from predictor.features import roofline_s
from profilers import ops, sampling
from profilers.capture import capture_spec
from profilers.fingerprint import CPU_BF16_FLAGS, fingerprint

PEAKS = {"gflops": {"float32": 50.0, "bfloat16": 80.0}, "gbps": 10.0,
         "subnormal": {"reuse_ns": 2.5, "block_ns": 20.0, "threads": 1}}
SMALL = "1x3x64x64"

if "advise" not in cli.commands:  # until hwlat/commands/__init__.py registers it
    cli.add_command(advise)


def synthetic_s(record) -> float:
    return 1.7 * roofline_s(record, PEAKS) + 4e-6


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("advise")
    fp = fingerprint("cpu", 1)
    records = []
    for family, n in (("conv", 40), ("matmul", 15), ("eltwise", 15), ("norm", 10),
                      ("pool", 10)):
        records += sampling.random_records(family, n, seed=5)
    records += capture_spec("torchvision:resnet18", inputs=[SMALL]).ops
    records = list({r.key: r for r in records}.values())
    path = root / "k.db"
    with KernelDB.open(path) as db:
        db.upsert_device(fp.to_json(), device_id=fp.device_id, kind="cpu", threads=1,
                         peaks=PEAKS)
        db.add_configs(fp.device_id, [(r.key, r.op, ops.family_of(r.op), r.dtype, "random",
                                       r.to_json()) for r in records])
        ids = db.config_ids(fp.device_id)
        for r in records:
            db.add_measurement(ids[r.key], None, [synthetic_s(r)] * 3, flushed=True, threads=1,
                               noisy=False)
        total = sum(synthetic_s(r) for r in capture_spec("torchvision:resnet18",
                                                         inputs=[SMALL]).ops
                    if not ops.is_free(r, ops.lookup(r.op)))
        spread = np.linspace(0.97, 1.2, 40)
        db.add_model_measurement(fp.device_id, "torchvision:resnet18", "resnet",
                                 {"inputs": [SMALL], "batch": 1, "dtype": "float32",
                                  "threads": 1, "device": "cpu", "kind": "e2e"},
                                 list(total * spread))
    return {"db": str(path), "device": fp.device_id, "cache": str(root / "cache"),
            "bf16": bool(CPU_BF16_FLAGS & set(fp.isa))}


def run(env, *args):
    runner = CliRunner()
    return runner.invoke(cli, ["--db", env["db"], "advise", "torchvision:resnet18",
                               "--device", env["device"], "--input", SMALL, *args],
                         env={"XDG_CACHE_HOME": env["cache"]})


def run_json(env, *args) -> dict:
    result = run(env, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_advise_json_ranks_levers_with_predictions(env):
    out = run_json(env, "--p95", "1000")
    assert out["device"] == env["device"]
    levers = out["levers"]
    assert {"prune", "input_size"} <= {r["lever"] for r in levers}
    if env["bf16"]:  # the precision lever is offered only where bf16 is native
        precision = [r for r in levers if r["lever"] == "precision"]
        # ... and says its prediction rests on float32 timings alone
        assert any("no bfloat16 op was profiled" in n for r in precision for n in r["notes"])
    else:
        assert "no native bf16" in out["not_applicable"]["precision"]
    for r in levers:
        p = r["predicted_ms"]
        assert p["interval"][0] <= p["p95"] <= p["interval"][1]
        assert "risk" in r and "effort" in r and "why" in r
    assert out["diagnosis"]["bottleneck"] in ("compute", "memory bandwidth", "overhead")
    assert out["fastest_meeting_budget"] is not None
    ranked_speed = [r["speedup"] for r in levers if r["meets_budget"] and not r["slower"]]
    assert ranked_speed  # budget is generous: every faster lever meets it
    batch = [r for r in levers if r["lever"] == "batch"]
    assert batch and all(r["slower"] for r in batch)  # one request's wait grows with the batch
    assert "p95/p50" in out["spread"]["basis"]


def test_pruning_is_predicted_faster(env):
    out = run_json(env, "--p95", "1000", "--lever", "prune")
    speedups = {r["params"]["ratio"]: r["speedup"] for r in out["levers"]}
    assert 1.0 < speedups[0.25] < speedups[0.5] < speedups[0.75]


def test_rate_uses_the_simulator_and_batching(env):
    base = run_json(env, "--p95", "1000", "--lever", "prune")["baseline"]["predicted_ms"]["p50"]
    rate = 0.8 / (base / 1e3)  # 80% busy at batch 1
    out = run_json(env, "--p99", "1000", "--rate", f"{rate:.1f}", "--lever",
                   "dynamic_batching")
    assert out["simulation"]["baseline"]["requests"] > 1000
    (best,) = out["levers"]
    assert best["simulated"]["max_batch"] > 1
    assert best["predicted_ms"]["p99"] < out["baseline"]["predicted_ms"]["p99"]


def test_a_rate_beyond_capacity_has_no_finite_percentile(env):
    base = run_json(env, "--p95", "1000", "--lever", "prune")["baseline"]["predicted_ms"]["p50"]
    rate = 1.1 / (base / 1e3)  # 110% busy at batch 1: the queue only grows
    out = run_json(env, "--p95", "1000", "--rate", f"{rate:.1f}", "--lever", "dynamic_batching",
                   "--lever", "prune")
    baseline = out["baseline"]
    assert baseline["predicted_ms"]["p95"] is None and not baseline["meets_budget"]
    assert any(n.startswith("unstable:") for n in baseline["notes"])
    batching = [r for r in out["levers"] if r["lever"] == "dynamic_batching"]
    # batches of 4 serve more than 1.1x the batch-1 rate here: a steady, finite percentile
    assert batching and batching[0]["predicted_ms"]["p95"] is not None
    assert batching[0]["speedup"] is None or batching[0]["speedup"] > 1  # inf: from unbounded
    text = run(env, "--p95", "1000", "--rate", f"{rate:.1f}", "--lever", "prune")
    assert text.exit_code == 0 and "unbounded" in text.stdout


def test_verify_measures_and_never_recommends_below_the_floor(env):
    out = run_json(env, "--p95", "1000", "--lever", "prune", "--accuracy-floor", "0.999",
                   "--verify", "1")
    verified = [r for r in out["levers"] if "measured_ms" in r or "rejected" in r]
    assert verified
    assert out["baseline"]["measured_ms"]["p50"] > 0
    for r in verified:
        if "measured_ms" in r:
            assert r["measured_ms"]["p50"] > 0 and "value" in r["accuracy"]
    rejected = {r["label"] for r in out["levers"] if r.get("rejected")}
    assert out["fastest_meeting_budget"] not in rejected
    assert not rejected & set(out["pareto"])


def test_human_output_has_the_table(env):
    result = run(env, "--p95", "1000", "--lever", "prune")
    assert result.exit_code == 0, result.output
    assert "bottleneck:" in result.stdout and "prune 50%" in result.stdout
    assert "1. prune" in result.stdout


def test_verified_fidelity_is_not_called_accuracy(env):
    result = run(env, "--p95", "1000", "--lever", "prune", "--verify", "1")
    assert result.exit_code == 0, result.output
    assert "top1_agreement" in result.stdout and "not task accuracy" in result.stdout


def test_bad_usage_and_domain_errors(env):
    assert run(env).exit_code == 2  # no budget
    assert run(env, "--p95", "5", "--p99", "6").exit_code == 2
    assert run(env, "--p95", "5", "--max-batch", "4").exit_code == 2  # needs --rate
    bad = CliRunner().invoke(cli, ["--db", env["db"], "advise", "torchvision:resnet18",
                                   "--device", "nope", "--p95", "5"])
    assert bad.exit_code == 1 and "unknown device" in bad.output
    unknown = run(env, "--p95", "5", "--lever", "magic")
    assert unknown.exit_code == 1 and "unknown lever" in unknown.output


def test_eval_function_scores_and_rejects_below_the_floor(env, tmp_path):
    # The score tells the unpruned model (11.7M parameters) from a pruned one, so a pass or a
    # rejection shows the function was called on each variant, not once on the baseline.
    script = tmp_path / "score.py"
    script.write_text("def score(model):\n"
                      "    n = sum(p.numel() for p in model.parameters())\n"
                      "    return 1.0 if n > 11_000_000 else 0.5\n")
    out = run_json(env, "--p95", "1000", "--lever", "prune", "--eval", f"{script}:score",
                   "--accuracy-floor", "0.4", "--verify", "1")
    verified = [r for r in out["levers"] if "accuracy" in r]  # --verify 1: the top lever
    assert verified and out["baseline"]["accuracy"] == {"metric": "eval", "value": 1.0}
    for r in verified:
        assert r["accuracy"]["metric"] == "eval" and r["accuracy"]["value"] == 0.5
        assert r["accuracy"]["passes"] and "rejected" not in r
    strict = run_json(env, "--p95", "1000", "--lever", "prune", "--eval",
                      f"{script}:score", "--accuracy-floor", "0.6", "--verify", "1")
    rejected = [r for r in strict["levers"] if r.get("rejected")]
    assert len(rejected) == 2  # a rejected lever is replaced by the next, up to 2k tried
    assert all(r["accuracy"]["value"] == 0.5 for r in rejected)
    assert strict["fastest_meeting_budget"] not in {r["label"] for r in rejected}
    missing = run(env, "--p95", "5", "--eval", f"{tmp_path}/nope.py:score")
    assert missing.exit_code == 1 and "does not exist" in missing.output


def test_accuracy_floor_without_verify_is_bad_usage(env):
    result = run(env, "--p95", "10", "--accuracy-floor", "0.9")
    assert result.exit_code == 2 and "--verify" in result.output


def test_a_lever_past_capacity_is_explained_not_divided_by():
    from advisor.engine import _why
    from advisor.rank import LeverResult, rank

    inf = float("inf")
    past = LeverResult("threads", "1 thread", {}, inf, inf, [inf, inf], 0.0, 50.0, 0, "", 0, "")
    fixes = LeverResult("dynamic_batching", "batch <= 4", {}, 9.0, 20.0, [18.0, 22.0], inf, 50.0,
                        0, "", 1, "")
    assert "grows without bound" in _why(past, None)  # the baseline kept up; this lever cannot
    assert "cannot" in _why(fixes, None)  # ... and this one keeps up where the baseline did not
    assert rank([past, fixes]) == [fixes, past]


UNDER = """
import torch

class Under(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 256)

    def forward(self, x):  # exp(-100) = 3.7e-44, subnormal: every input of the linear layer is
        return self.fc(torch.exp(x * 0 - 100))

def make():
    return Under()
"""


def test_flushing_subnormals_is_a_lever_priced_and_verified(env, tmp_path):
    (tmp_path / "under.py").write_text(UNDER)
    result = CliRunner().invoke(
        cli, ["--db", env["db"], "advise", f"{tmp_path / 'under.py'}:make", "--device",
              env["device"], "--input", "1x256", "--p95", "1000", "--lever", "flush_subnormals",
              "--lever", "batch", "--verify", "1", "--json"],
        env={"XDG_CACHE_HOME": env["cache"]})
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["diagnosis"]["bottleneck"] == "subnormal values"
    assert out["diagnosis"]["first_fix"] == ["flush_subnormals"]
    assert any(n.startswith("the baseline includes") for n in out["notes"])
    flush, *batches = out["levers"]  # ranked first: the others wait for a batch
    assert flush["lever"] == "flush_subnormals" and {b["lever"] for b in batches} == {"batch"}
    # 256 x 256 uses at 2.5 ns: 0.16 ms of slow path on a few microseconds of ops
    assert flush["speedup"] > 3
    # measured against the baseline timed again in a fresh process, not the advising one's
    measured = flush["measured_ms"]
    assert measured["speedup"] == pytest.approx(measured["baseline_target"] / measured["target"])
    assert measured["baseline_target"] != out["baseline"]["measured_ms"]["target"]
    assert any(n.startswith("timed in a fresh process") for n in flush["notes"])
    assert flush["accuracy"]["value"] == 1.0  # the same top-1 on every sample


def test_each_lever_pays_the_slow_path_of_the_values_it_computes(env, tmp_path, monkeypatch):
    from advisor.engine import AdviceRequest, _Advisor
    from advisor.levers import Variant

    monkeypatch.setenv("XDG_CACHE_HOME", env["cache"])
    (tmp_path / "under.py").write_text(UNDER)
    request = AdviceRequest(f"{tmp_path / 'under.py'}:make", env["device"], 1000.0,
                            inputs=["1x256"], levers=("flush_subnormals",))
    with KernelDB.open(env["db"], readonly=True) as db:
        advisor = _Advisor(db, request, None)
        base = advisor.run().prediction
        # the linear's 256 inputs each used by 256 outputs; the exp writes 16 blocks of 16
        assert base.subnormal_ms == pytest.approx(256 * 256 * 2.5e-6 + 16 * 20e-6)
        batch8 = advisor.predict_call(Variant("batch", "batch 8", {"batch": 8}, batch=8))[3]
        assert batch8.subnormal_ms == pytest.approx(8 * base.subnormal_ms)
        flushed = advisor.predict_call(Variant("flush_subnormals", "flush", {},
                                               flush_denormal=True))[3]
        assert flushed.subnormal_ms is None
        assert flushed.p50_ms == pytest.approx(base.p50_ms - base.subnormal_ms)
        # another precision is not priced, and its lever says so
        bf16 = Variant("precision", "bf16", {"dtype": "bfloat16"}, dtype="bfloat16")
        assert advisor.predict_call(bf16)[3].subnormal_ms is None
        assert any("not priced in bfloat16" in n for n in bf16.notes)


def test_flushing_subnormals_holds_inside_the_accuracy_pass_only():
    from advisor.verify import flushing_subnormals

    tiny = torch.tensor([-100.0])
    assert torch.exp(tiny).item() > 0  # 3.7e-44: subnormal
    with flushing_subnormals():
        assert torch.exp(tiny).item() == 0.0 and torch.get_num_threads() == 1
    assert torch.exp(tiny).item() > 0
