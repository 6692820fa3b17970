"""predictor.e2e, predictor.correction, predictor.baselines.

Real op lists (captured from small torchvision models and random modules) against a tiny
database whose latencies follow a known formula; whole-model "measurements" follow a known
correction, so the fit can be checked against it.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from kernels_db.store import KernelDB, at_profile_pace, profile_pace_s
from predictor import e2e
from predictor.baselines import FlopsLinear, RooflineScaled
from predictor.correction import Correction, ModelRow, fit_correction
from predictor.e2e import Predictor
from predictor.features import roofline_s
from profilers import ops, sampling, zoo
from profilers.capture import capture_spec
from profilers.errors import NotFittedError, UnmodelledOpError
from profilers.oprecord import OpRecord, TensorSpec

PEAKS = {"gflops": {"float32": 50.0}, "gbps": 10.0}
SMALL_INPUT = ["1x3x32x32"]


def synthetic_s(record: OpRecord) -> float:
    return 1.7 * roofline_s(record, PEAKS) + 4e-6


@pytest.fixture(scope="module")
def training_records():
    records = []
    for family, n in (("conv", 40), ("matmul", 15), ("eltwise", 15), ("norm", 10), ("pool", 10)):
        records += sampling.random_records(family, n, seed=5)
    return list({r.key: r for r in records}.values())


@pytest.fixture(scope="module")
def resnet():
    return capture_spec("torchvision:resnet18", inputs=SMALL_INPUT)


def add_measured(db: KernelDB, records, scale: float = 1.0) -> None:
    db.add_configs("dev1", [(r.key, r.op, ops.family_of(r.op), r.dtype, "random", r.to_json())
                            for r in records])
    ids = db.config_ids("dev1")
    for r in records:
        db.add_measurement(ids[r.key], None, [scale * synthetic_s(r)] * 3, flushed=True,
                           threads=1, noisy=False)


@pytest.fixture(scope="module")
def db_path(tmp_path_factory, training_records):
    path = tmp_path_factory.mktemp("db") / "k.db"
    with KernelDB.open(path) as db:
        db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, name="box",
                         peaks=PEAKS)
        add_measured(db, training_records)
    return path


@pytest.fixture(scope="module")
def predictor(db_path, tmp_path_factory):
    with KernelDB.open(db_path) as db:
        return Predictor.for_device(db, "box", cache_dir=tmp_path_factory.mktemp("cache"))


def unknown_op(n: int) -> OpRecord:
    t = TensorSpec((1, n), (n, 1), "float32")
    return OpRecord("aten.hwlat_test_not_registered.default", (t,), {}, (t,), "head")


# ------------------------------------------------------------------------------ per op


def test_json_contract_and_per_family_sums_to_p50(predictor, resnet):
    p = predictor.predict_captured(resnet)
    data = json.loads(json.dumps(p.to_json()))
    for key in ("latency_ms", "interval_ms", "device", "n_ops", "unmodelled", "per_family"):
        assert key in data
    assert data["device"] == "dev1" and data["n_ops"] == len(resnet.ops)
    lo, hi = data["interval_ms"]
    assert lo <= data["latency_ms"]["p50"] <= hi
    assert sum(p.per_family.values()) == pytest.approx(p.p50_ms)
    assert len(p.top_ops) == 10 and p.top_ops[0]["ms"] >= p.top_ops[-1]["ms"]
    assert p.flops == pytest.approx(sum(ops.flops_of(r) for r in resnet.ops))
    free = [r for r in resnet.ops if ops.is_free(r)]
    assert p.n_timed_ops == len(resnet.ops) - len(free)


def test_weight_reload_term_counts_every_weight_read_at_the_copy_bandwidth(db_path, tmp_path,
                                                                           resnet):
    params = sum(r.weight_bytes for r in resnet.ops)  # resnet18: 11.7M parameters + BN buffers
    assert params == pytest.approx(46.8e6, rel=0.01)
    with KernelDB.open(db_path) as db:
        pred = Predictor.for_device(db, "box", cache_dir=tmp_path)
    pred.correction = Correction(a=1.0, c_weights=2.0)
    p = pred.predict_captured(resnet)
    assert p.weights_ms == pytest.approx(params / (PEAKS["gbps"] * 1e9) * 1e3)
    assert p.per_family["weight_reload"] == pytest.approx(2.0 * p.weights_ms)
    assert sum(p.per_family.values()) == pytest.approx(p.p50_ms)


def test_large_op_traffic_counts_only_ops_over_the_flush_size(db_path, tmp_path, resnet):
    with KernelDB.open(db_path) as db:
        pred = Predictor.for_device(db, "box", cache_dir=tmp_path)
    pred.correction = Correction(a=1.0, c_large_traffic=3.0)
    p = pred.predict_captured(resnet)
    sizes = [ops.bytes_of(r) for r in resnet.ops if not ops.is_free(r)]
    large = [b for b in sizes if b > 1 << 20]  # no L2 in this fingerprint: the 1 MiB floor
    assert large and len(large) < len(sizes)  # resnet18's late convs, not its activations
    assert p.large_traffic_ms == pytest.approx(sum(large) / (PEAKS["gbps"] * 1e9) * 1e3)
    assert 0 < p.large_traffic_ms < p.traffic_ms
    assert p.per_family["large_op_traffic"] == pytest.approx(3.0 * p.large_traffic_ms)
    assert sum(p.per_family.values()) == pytest.approx(p.p50_ms)


def test_traffic_terms_leave_out_the_weights_of_ops_over_the_llc(db_path, tmp_path):
    """Timed alone, a linear whose weights exceed the LLC streams them from DRAM already: only
    its activations count as extra traffic, in both traffic terms (alexnet's 151 MB fc6 put it
    at +54% before). An op
    whose weights fit keeps all its bytes, and so does a gather over the LLC: it reads a few
    rows of its table, not the table."""
    def linear(n_in: int, n_out: int, module: str) -> OpRecord:
        x = TensorSpec((8, n_in), (n_in, 1), "float32")
        w = TensorSpec((n_out, n_in), (n_in, 1), "float32")
        y = TensorSpec((8, n_out), (n_out, 1), "float32")
        return OpRecord("aten.linear.default", (x, w), {}, (y,), module, weight_bytes=w.nbytes)

    big, mid = linear(9216, 4096, "fc6"), linear(1024, 512, "fc")  # 151 MB and 2.1 MB
    table = TensorSpec((50257, 768), (768, 1), "float32")  # 154 MB
    rows = TensorSpec((16, 1024), (1024, 1), "int64")  # 50 MB of rows read and written
    gather = OpRecord("aten.embedding.default", (table, rows), {},
                      (TensorSpec((16, 1024, 768), (786432, 768, 1), "float32"),), "wte",
                      weight_bytes=table.nbytes)
    with KernelDB.open(db_path) as db:
        pred = Predictor.for_device(db, "box", cache_dir=tmp_path)
    pred.correction = Correction(a=1.0, c_large_traffic=1.0)
    llc = 32 << 20  # the fingerprint has no cache sizes
    assert ops.bytes_of(big) > llc > ops.bytes_of(mid) > 1 << 20
    assert table.nbytes > ops.bytes_of(gather) > llc
    p = pred.predict_ops([big, mid, gather])
    expected = ops.bytes_of(big) - big.weight_bytes + ops.bytes_of(mid) + ops.bytes_of(gather)
    assert p.large_traffic_ms == pytest.approx(expected / (PEAKS["gbps"] * 1e9) * 1e3)
    assert p.traffic_ms == pytest.approx(p.large_traffic_ms)  # all three are over 1 MiB


def test_the_llc_the_profile_measured_overrides_what_lscpu_says(tmp_path, training_records):
    """A VM's share of a shared LLC is what its read sweep finds (the Xeon of 12-05: 64 MiB of
    a 480 MiB L3): an op beyond that streams its weights already when timed alone, so they leave
    the weight re-read term; on a GPU the sweep is not used."""
    x = TensorSpec((8, 2048), (2048, 1), "float32")
    w = TensorSpec((2048, 2048), (2048, 1), "float32")  # 16.8 MB of weights
    y = TensorSpec((8, 2048), (2048, 1), "float32")
    fc = OpRecord("aten.linear.default", (x, w), {}, (y,), "fc", weight_bytes=w.nbytes)
    weights_ms = {}
    for name, kind, peaks in (("lscpu", "cpu", PEAKS), ("swept", "cpu", {**PEAKS, "llc_bytes": 8 << 20}),
                              ("gpu", "cuda", {**PEAKS, "llc_bytes": 8 << 20})):
        with KernelDB.open(tmp_path / f"{name}.db") as db:
            db.upsert_device({"caches": {"l3": 480 << 20}}, device_id="dev1", kind=kind,
                             threads=1, name="box", peaks=peaks)
            add_measured(db, training_records)
            pred = Predictor.for_device(db, "box", cache_dir=tmp_path / name)
        weights_ms[name] = pred.predict_ops([fc]).weights_ms
    assert weights_ms["lscpu"] == pytest.approx(w.nbytes / (PEAKS["gbps"] * 1e9) * 1e3)
    assert weights_ms["swept"] == 0.0 and weights_ms["gpu"] == weights_ms["lscpu"]


def test_ops_over_the_llc_are_floored_at_the_streaming_and_copy_bandwidths(
        tmp_path, training_records):
    """A model's prediction never beats memory for an op larger than the LLC: its weights at the
    measured weight-streaming bandwidth (a matrix-vector product's), the rest at the copy's. A
    device profiled before the stream was measured, and a GPU (whose stream no profile re-times),
    keep the copy's floor for all bytes."""
    x = TensorSpec((1, 9216), (9216, 1), "float32")
    w = TensorSpec((4096, 9216), (9216, 1), "float32")  # alexnet's fc6: 151 MB
    y = TensorSpec((1, 4096), (4096, 1), "float32")
    fc6 = OpRecord("aten.linear.default", (x, w), {}, (y,), "fc6", weight_bytes=w.nbytes)
    rest = ops.bytes_of(fc6) - w.nbytes
    floors = {}
    for name, kind, peaks in (("stream", "cpu", {**PEAKS, "stream_gbps": 2.5}),
                              ("copy only", "cpu", PEAKS),
                              ("gpu", "cuda", {**PEAKS, "stream_gbps": 2.5})):
        path = tmp_path / f"{name}.db"
        with KernelDB.open(path) as db:
            db.upsert_device({"t": 1}, device_id="dev1", kind=kind, threads=1, name="box",
                             peaks=peaks)
            add_measured(db, training_records)
            pred = Predictor.for_device(db, "box", cache_dir=tmp_path / name)
        floors[name] = pred.estimate(fc6).p50_s
    assert floors["stream"] == pytest.approx(w.nbytes / 2.5e9 + rest / 10e9)
    # the copy's floor (15 ms) is under what this database's model says (1.7x its roofline)
    assert ops.bytes_of(fc6) / 10e9 < floors["copy only"] < floors["stream"]
    assert floors["gpu"] < floors["stream"]  # on the stream it could not be below it


def test_an_op_bound_by_its_cold_weights_is_floored_at_their_stream_time(tmp_path,
                                                                         training_records):
    """Inside a model an op within the LLC reads its weights from DRAM, and no faster than the
    measured stream: a batch-1 linear whose estimate (weights in cache) is under that takes the
    stream time, and its weights leave the fitted weight re-read term, which would price them a
    second time. An op whose estimate is longer keeps it and stays in the term; without a
    measured stream the copy's bandwidth is the floor, under every estimate of this database."""
    def linear(batch: int, n: int, module: str) -> OpRecord:
        x, y = (TensorSpec((batch, n), (n, 1), "float32") for _ in range(2))
        w = TensorSpec((n, n), (n, 1), "float32")
        return OpRecord("aten.linear.default", (x, w), {}, (y,), module, weight_bytes=w.nbytes)

    fc, small = linear(1, 2048, "fc"), linear(512, 64, "head")  # 16.8 MB, 16 KB of weights
    got = {}
    for name, peaks in (("stream", {**PEAKS, "stream_gbps": 2.5}), ("copy only", PEAKS)):
        with KernelDB.open(tmp_path / f"{name}.db") as db:
            db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, name="box",
                             peaks=peaks)
            add_measured(db, training_records)
            pred = Predictor.for_device(db, "box", cache_dir=tmp_path / name)
        pred.correction = Correction(a=1.0, c_weights=1.0)
        got[name] = (pred.predict_ops([fc, small]), pred.estimate(fc).p50_s,
                     pred.estimate(small).p50_s)
    p, fc_alone, small_alone = got["stream"]
    cold = fc.weight_bytes / 2.5e9
    assert fc_alone < cold  # the database prices it with its weights in cache
    assert small_alone > small.weight_bytes / 2.5e9  # its activations take longer
    assert p.sum_ops_ms == pytest.approx((cold + small_alone) * 1e3)
    assert p.weights_ms == pytest.approx(small.weight_bytes / 10e9 * 1e3)
    assert p.top_ops[0]["ms"] == pytest.approx(cold * 1e3)
    assert any(n.startswith("1 op (fc) priced at reading its weights from memory at the "
                            "measured 2.5 GB/s") for n in p.notes)
    p, fc_alone, small_alone = got["copy only"]
    assert not any("weights from memory" in n for n in p.notes)
    assert p.sum_ops_ms == pytest.approx((fc_alone + small_alone) * 1e3)
    assert p.weights_ms == pytest.approx((fc.weight_bytes + small.weight_bytes) / 10e9 * 1e3)


def test_a_batched_linear_is_floored_at_the_batched_rate_wherever_its_weights_fit(
        tmp_path, training_records):
    """A linear at several rows reads evicted weights slower than a matrix-vector product
    streams them (`fingerprint.measure_batched_gbps`): alexnet's fc7 at batch 8 took 15.75 ms
    inside the model and 8.09 alone on the Xeon. It is floored at the batched rate, also where
    its bytes exceed the measured LLC (the cache may still have held them alone); one row, or
    a profile from before the rate was measured, keeps the stream's floor."""
    def linear(batch: int, module: str) -> OpRecord:
        x, y = (TensorSpec((batch, 2048), (2048, 1), "float32") for _ in range(2))
        w = TensorSpec((2048, 2048), (2048, 1), "float32")  # 16.8 MB
        return OpRecord("aten.linear.default", (x, w), {}, (y,), module, weight_bytes=w.nbytes)

    fc1, fc8 = linear(1, "fc1"), linear(8, "fc8")
    stream = {**PEAKS, "stream_gbps": 2.5}
    got, predictors = {}, {}
    for name, peaks in (("batched", {**stream, "batched_gbps": 1.0}), ("stream only", stream),
                        ("batched, small llc", {**stream, "batched_gbps": 1.0,
                                                "llc_bytes": 8 << 20})):
        with KernelDB.open(tmp_path / f"{name}.db") as db:
            db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, name="box",
                             peaks=peaks)
            add_measured(db, training_records)
            pred = predictors[name] = Predictor.for_device(db, "box", cache_dir=tmp_path / name)
        pred.correction = Correction(a=1.0)
        got[name] = pred.predict_ops([fc1, fc8])
    w = fc8.weight_bytes
    assert got["batched"].sum_ops_ms == pytest.approx((w / 2.5e9 + w / 1.0e9) * 1e3)
    assert any("at the measured 1.0 GB/s (linears at several rows) and 2.5 GB/s: " in n
               for n in got["batched"].notes)
    assert got["stream only"].sum_ops_ms == pytest.approx(2 * w / 2.5e9 * 1e3)
    # beyond the swept LLC the one-row linear keeps its memory floor, the batched one is raised
    assert got["batched, small llc"].top_ops[0]["ms"] == pytest.approx(w / 1.0e9 * 1e3)
    # a floored op is an in-model time: `a` scales the others only, in total and breakdown
    # (fc1 is over this LLC, so not floored at the stream but scaled)
    pred = predictors["batched, small llc"]
    pred.correction = Correction(a=0.5)
    p = pred.predict_ops([fc1, fc8])
    fc1_ms = pred.estimate(fc1).p50_s * 1e3
    assert fc1_ms > w / 2.5e9 * 1e3  # its memory floor: weights at the stream, the rest copied
    assert p.floored_ms == pytest.approx(w / 1.0e9 * 1e3)
    assert p.p50_ms == pytest.approx(p.floored_ms + 0.5 * fc1_ms)
    assert [o["ms"] for o in p.top_ops] == pytest.approx([p.floored_ms, 0.5 * fc1_ms])
    assert p.per_family["matmul"] == pytest.approx(p.p50_ms)


def test_a_config_measured_at_two_batch_sizes_is_interpolated_between_them(tmp_path,
                                                                            training_records):
    def conv_at(batch):
        return [r for r in capture_spec("torchvision:resnet18", inputs=[f"{batch}x3x32x32"]).ops
                if r.op == "aten.conv2d.default"][3]

    c1, c4, c8, c16 = conv_at(1), conv_at(4), conv_at(8), conv_at(16)
    path = tmp_path / "k.db"
    with KernelDB.open(path) as db:
        db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, peaks=PEAKS)
        add_measured(db, training_records + [c1, c8])
        pred = Predictor.for_device(db, "dev1", cache_dir=tmp_path / "c")
    pred.estimate_ops([c4, c16])
    t1, t8 = synthetic_s(c1), synthetic_s(c8)
    assert pred.estimate(c4).source == "interpolated"
    assert pred.estimate(c4).p50_s == pytest.approx(t1 + (t8 - t1) * 3 / 7)
    assert pred.estimate(c16).source == "model"  # beyond the measured range: not extrapolated


def test_exact_measured_config_wins_over_the_model(db_path, tmp_path, resnet):
    conv = max((r for r in resnet.ops if ops.family_of(r.op) == "conv"), key=synthetic_s)
    with KernelDB.open(db_path) as src, KernelDB.open(tmp_path / "k.db") as db:
        db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, peaks=PEAKS)
        add_measured(db, [OpRecord.from_json(m.record) for m in src.configs("dev1")])
        add_measured(db, [conv], scale=10.0)  # far from anything the model would say
        p = Predictor.for_device(db, "dev1", cache_dir=tmp_path / "c").predict_captured(resnet)
    top = p.top_ops[0]
    assert top["source"] == "measured" and top["module"] == conv.module
    assert top["ms"] == pytest.approx(10.0 * synthetic_s(conv) * 1e3)
    assert 0 < p.measured_share < 1


def test_unmodelled_ops_get_a_positive_fallback_and_are_listed(predictor, resnet):
    ops_list = [*resnet.ops, unknown_op(4096), unknown_op(4096)]
    p = predictor.predict_ops(ops_list, spec="x")
    base = predictor.predict_ops(resnet.ops, spec="x")
    [entry] = [u for u in p.unmodelled if u["op"] == "aten.hwlat_test_not_registered.default"]
    assert entry["count"] == 2 and entry["estimated_ms"] > 0 and entry["reason"]
    assert 0 < entry["share"] < 1
    assert p.sum_ops_ms > base.sum_ops_ms and p.n_timed_ops == base.n_timed_ops + 2
    with pytest.raises(UnmodelledOpError, match="hwlat_test_not_registered"):
        predictor.predict_ops(ops_list, strict=True)


def test_ops_recorded_from_a_real_run_are_noted(predictor, resnet):
    plain = predictor.predict_captured(resnet)
    ran = predictor.predict_captured(dataclasses.replace(resnet, ran=True))
    extra = [n for n in ran.notes if n not in plain.notes]
    assert ran.p50_ms == plain.p50_ms
    assert len(extra) == 1 and "recorded from one real run" in extra[0]
    built = predictor.predict_captured(dataclasses.replace(resnet, note="built some way"))
    assert [n for n in built.notes if n not in plain.notes] == ["built some way"]


def test_ops_of_a_kind_never_timed_are_noted_with_their_share(predictor, resnet):
    t = TensorSpec((8, 64, 56, 56), (200704, 3136, 56, 1), "float32")
    atan = OpRecord("aten.atan.default", (t,), {}, (t,), "head")  # an eltwise op none drew
    p = predictor.predict_ops([*resnet.ops, atan], spec="x")
    assert predictor.estimate(atan).source == "model"  # the eltwise model prices it
    [note] = [n for n in p.notes if "never timed" in n]
    share = predictor.estimate(atan).p50_s / (p.sum_ops_ms / 1e3)
    assert f"aten.atan.default ({share:.0%} of the op time)" in note
    assert "conv2d" not in note  # timed kinds are not listed
    assert not [n for n in predictor.predict_ops(resnet.ops, spec="x").notes
                if "aten.atan" in n]


def test_family_without_a_model_falls_back_with_a_reason(predictor):
    attention = sampling.random_records("attention", 2, seed=1)
    assert attention and "attention" not in predictor.models.models
    p = predictor.predict_ops(attention)
    assert p.unmodelled and all("no attention model" in u["reason"] for u in p.unmodelled
                                if u["family"] == "attention")
    assert p.p50_ms > 0


def test_predict_many_matches_one_by_one(db_path, tmp_path):
    specs = ["torchvision:squeezenet1_1", "torchvision:resnet18"]
    with KernelDB.open(db_path) as db:
        many = Predictor.for_device(db, "dev1", cache_dir=tmp_path).predict_many(specs)
        single = [Predictor.for_device(db, "dev1", cache_dir=tmp_path).predict_spec(s)
                  for s in specs]
    for a, b in zip(many, single, strict=True):
        assert a.spec == b.spec and a.n_ops == b.n_ops
        assert a.p50_ms == pytest.approx(b.p50_ms, rel=1e-9)
        assert a.interval_ms == pytest.approx(b.interval_ms, rel=1e-9)


# --------------------------------------------------------------------------- correction


def _rows(a: float, overhead_s: float, noise: float = 0.0) -> list[ModelRow]:
    rng = np.random.default_rng(0)
    rows = []
    for i, (s, n) in enumerate([(0.004, 60), (0.020, 150), (0.001, 200), (0.050, 90),
                                (0.010, 400), (0.002, 30)]):
        y = (a * s + overhead_s * n) * math.exp(noise * rng.standard_normal())
        rows.append(ModelRow(f"m{i}", f"fam{i % 3}", ("1x3x224x224",), y, s, n, 1e9 * s,
                             s / 3, 1.0))
    return rows


def test_correction_recovers_known_scale_and_overhead():
    c = fit_correction(_rows(1.1, 5e-6))
    assert c.a == pytest.approx(1.1, rel=1e-6) and c.overhead_s == pytest.approx(5e-6, rel=1e-6)
    assert c.n_models == 6 and abs(c.resid_lo) < 1e-9 and abs(c.resid_hi) < 1e-9
    assert c.cv["lofo_mape"] < c.cv["plain_sum_mape"]


def test_correction_band_reflects_residual_noise_and_identity_without_data():
    c = fit_correction(_rows(1.0, 2e-6, noise=0.05))
    assert c.resid_lo < 0 < c.resid_hi
    assert fit_correction([]) == Correction()
    assert Correction().apply(0.01, 100) == 0.01


def test_for_device_fits_the_correction_once_and_then_reads_its_cache(tmp_path, db_path,
                                                                     resnet, monkeypatch):
    with KernelDB.open(db_path) as src, KernelDB.open(tmp_path / "k.db") as db:
        db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, peaks=PEAKS)
        add_measured(db, [OpRecord.from_json(m.record) for m in src.configs("dev1")])
        for spec in ("torchvision:resnet18", "torchvision:squeezenet1_1"):
            ops_list = capture_spec(spec, inputs=SMALL_INPUT).ops
            timed = [r for r in ops_list if not ops.is_free(r)]
            total = 1.2 * sum(map(synthetic_s, timed)) + 3e-6 * len(timed)
            db.add_model_measurement("dev1", spec, spec.split(":")[1], {
                "inputs": SMALL_INPUT, "batch": 1, "dtype": "float32", "threads": 1,
                "device": "cpu"}, [total] * 5)
        first = Predictor.for_device(db, "dev1", cache_dir=tmp_path / "c")
        assert first.correction.n_models == 2 and first.correction.a > 0
        monkeypatch.setattr(e2e, "capture_spec", _no_capture)
        again = Predictor.for_device(db, "dev1", cache_dir=tmp_path / "c")
    assert again.correction == first.correction
    assert len(again.cached_model_rows()) == 2


def _no_capture(*args, **kwargs):
    raise AssertionError("the cached correction should be used")


# ---------------------------------------------------------------------------- baselines


def test_flops_linear_recovers_a_and_b():
    rows = [ModelRow("m", "f", (), 2e-12 * f + 1e-3, 0.0, 1, f, 1.0, 0.0)
            for f in (1e9, 4e9, 2e10)]
    base = FlopsLinear().fit(rows)
    assert base.a_ == pytest.approx(2e-12) and base.b_ == pytest.approx(1e-3)
    assert base.predict_flops(1e10) == pytest.approx(0.021)


def test_roofline_baseline_scale_and_not_fitted(resnet):
    rows = [ModelRow("m", "f", (), 3 * r, 0.0, 1, 0.0, r, 0.0) for r in (0.001, 0.01)]
    base = RooflineScaled(PEAKS)
    with pytest.raises(NotFittedError):
        base.predict_ops(resnet.ops)
    assert base.fit(rows).scale_ == pytest.approx(3.0)
    expected = 3 * sum(roofline_s(r, PEAKS) for r in resnet.ops if not ops.is_free(r))
    assert base.predict_ops(resnet.ops) == pytest.approx(expected * 1e3)
    with pytest.raises(NotFittedError):
        FlopsLinear().fit([])


def test_a_setting_timed_in_two_passes_is_one_row_at_the_faster(tmp_path, db_path):
    with KernelDB.open(db_path) as src, KernelDB.open(tmp_path / "k.db") as db:
        db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, peaks=PEAKS)
        add_measured(db, [OpRecord.from_json(m.record) for m in src.configs("dev1")])
        settings = {"inputs": SMALL_INPUT, "batch": 1, "dtype": "float32", "threads": 1,
                    "device": "cpu"}
        for total in (0.010, 0.012):
            db.add_model_measurement("dev1", "torchvision:resnet18", "resnet", settings,
                                     [total] * 5)
        db.add_model_measurement("dev1", "torchvision:squeezenet1_1", "squeezenet", settings,
                                 [0.005] * 5)
        predictor = Predictor.for_device(db, "dev1", cache_dir=tmp_path / "c")
        rows = predictor.model_rows(db)
    assert [(r.spec, round(r.measured_s, 6)) for r in rows] == [
        ("torchvision:resnet18", 0.010), ("torchvision:squeezenet1_1", 0.005)]
    assert predictor.correction.n_models == 2


def test_the_fit_takes_each_timing_at_the_profiles_pace(tmp_path, db_path):
    """A timing beside a probe 1.15x its median (a slow spell too mild to leave out) is brought
    to the profile's pace before the faster of a setting's timings is taken; one without a
    probe (an older profile) keeps its time."""
    with KernelDB.open(db_path) as src, KernelDB.open(tmp_path / "k.db") as db:
        db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, peaks=PEAKS)
        add_measured(db, [OpRecord.from_json(m.record) for m in src.configs("dev1")])
        settings = {"inputs": SMALL_INPUT, "batch": 1, "dtype": "float32", "threads": 1,
                    "device": "cpu"}
        for total, pace_s in ((0.012, 0.006), (0.0115, 0.0069)):
            db.add_model_measurement("dev1", "torchvision:resnet18", "resnet", settings,
                                     [total] * 5, stats={"pace_s": pace_s})
        db.add_model_measurement("dev1", "torchvision:squeezenet1_1", "squeezenet", settings,
                                 [0.005] * 5, stats={"pace_s": 0.006})
        db.add_model_measurement("dev1", "torchvision:mobilenet_v2", "mobilenet", settings,
                                 [0.007] * 5)
        timings = db.model_measurements("dev1", kind="e2e")
        predictor = Predictor.for_device(db, "dev1", cache_dir=tmp_path / "c")
        rows = {r.spec: r.measured_s for r in predictor.model_rows(db)}
    assert profile_pace_s(timings) == pytest.approx(0.006)  # the median of the three probed
    slowed = 0.0115 * (0.006 / 0.0069) ** e2e.TARGET_PACE_EXPONENT
    assert rows["torchvision:resnet18"] == pytest.approx(slowed)
    assert slowed < 0.0115  # below both timings as taken: the slower-paced one is the faster now
    assert rows["torchvision:squeezenet1_1"] == pytest.approx(0.005)
    assert rows["torchvision:mobilenet_v2"] == pytest.approx(0.007)
    assert at_profile_pace(timings[0], None, 0.75) == timings[0].median_s  # never probed


BUSY = {"others_cores": 1.5, "cpus": 2, "window_s": 1.0}  # at 1 thread: the free core and ours


def test_timings_beside_other_work_are_left_out_of_the_fit_while_enough_others_remain(tmp_path,
                                                                                     db_path):
    with KernelDB.open(db_path) as src, KernelDB.open(tmp_path / "k.db") as db:
        db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, peaks=PEAKS)
        add_measured(db, [OpRecord.from_json(m.record) for m in src.configs("dev1")])
        settings = {"inputs": SMALL_INPUT, "batch": 1, "dtype": "float32", "threads": 1,
                    "device": "cpu"}
        db.add_model_measurement("dev1", "torchvision:resnet18", "resnet", settings,
                                 [0.008] * 5, stats=BUSY)  # faster, but beside other work
        db.add_model_measurement("dev1", "torchvision:resnet18", "resnet", settings, [0.010] * 5,
                                 stats={"others_cores": 0.02, "cpus": 2, "window_s": 1.0})
        db.add_model_measurement("dev1", "torchvision:squeezenet1_1", "squeezenet", settings,
                                 [0.005] * 5)
        db.add_model_measurement("dev1", "torchvision:squeezenet1_1", "squeezenet",
                                 {**settings, "inputs": ["1x3x96x96"]}, [0.009] * 5, stats=BUSY)
        predictor = Predictor.for_device(db, "dev1", cache_dir=tmp_path / "c")
    rows = predictor.cached_model_rows()
    assert [(r.spec, r.inputs, round(r.measured_s, 6)) for r in rows] == [
        ("torchvision:resnet18", tuple(SMALL_INPUT), 0.010),
        ("torchvision:squeezenet1_1", tuple(SMALL_INPUT), 0.005)]
    assert ("1 setting was timed only while other processes used the CPUs or the machine ran "
            "slow, and is left out" in predictor.correction.note)


def test_a_fit_mostly_of_timings_beside_other_work_keeps_them(tmp_path):
    from types import SimpleNamespace

    settings = {"inputs": SMALL_INPUT, "batch": 1, "dtype": "float32", "threads": 1,
                "device": "cpu"}
    with KernelDB.open(tmp_path / "k.db") as db:
        db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, peaks=PEAKS)
        for spec, stats in (("torchvision:resnet18", BUSY), ("torchvision:resnet34", BUSY),
                            ("torchvision:squeezenet1_1", None)):
            db.add_model_measurement("dev1", spec, "f", settings, [0.01] * 3, stats=stats)
        holder = SimpleNamespace(device=SimpleNamespace(id="dev1"))
        passes = Predictor.e2e_passes(holder, db)
    assert len(passes) == 3 and holder.contended_settings == 2 and holder.contended_in_fit


def test_settings_stored_under_a_moved_checkout_still_fit_and_lost_ones_are_named(tmp_path,
                                                                                   db_path):
    """The zoo's file models are stored by absolute path: a database profiled in another checkout
    (or imported from another machine) keeps its end-to-end rows; a model that cannot be loaded
    here is left out of the fit, and the correction's note says so."""
    with KernelDB.open(db_path) as src, KernelDB.open(tmp_path / "k.db") as db:
        db.upsert_device({"t": 1}, device_id="dev1", kind="cpu", threads=1, peaks=PEAKS)
        add_measured(db, [OpRecord.from_json(m.record) for m in src.configs("dev1")])
        settings = {"inputs": ["1x8x512"], "batch": 1, "dtype": "float32", "threads": 1,
                    "device": "cpu"}
        for spec, total in (("/elsewhere/data/models.py:transformer_encoder", 0.004),
                            (zoo.resolve_spec("models.py:transformer_encoder"), 0.005),
                            ("/elsewhere/mine.py:net", 0.001)):
            db.add_model_measurement("dev1", spec, "transformer", settings, [total] * 5)
        db.add_model_measurement("dev1", "torchvision:squeezenet1_1", "squeezenet",
                                 {**settings, "inputs": SMALL_INPUT}, [0.005] * 5)
        predictor = Predictor.for_device(db, "dev1", cache_dir=tmp_path / "c")
    rows = predictor.cached_model_rows()
    encoder = [r for r in rows if r.spec.endswith("models.py:transformer_encoder")]
    assert len(rows) == 2 and [round(r.measured_s, 6) for r in encoder] == [0.004]
    assert predictor.correction.n_models == 2
    assert "1 measured settings could not be captured here" in predictor.correction.note
    assert "/elsewhere/mine.py:net 1x8x512 (" in predictor.correction.note


def test_an_einsum_that_copies_its_weight_is_predicted_as_the_copies_plus_the_bmm(predictor):
    import torch

    from profilers.capture import record_real

    class OutProjection(torch.nn.Module):  # XLNet's: the einsum copies its weight each call
        def __init__(self) -> None:
            super().__init__()
            self.o = torch.nn.Parameter(torch.randn(32, 4, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.einsum("ibnd,hnd->ibh", x, self.o)

    record = record_real(OutProjection().eval(), [torch.randn(16, 1, 4, 8)])[0]
    parts = ops.split_hidden_work(record)
    predictor.estimate_ops([record])
    got = predictor.estimate(record)
    assert got.family == "matmul"
    assert got.p50_s == pytest.approx(sum(predictor.estimate(p).p50_s for p in parts))
    assert got.p50_s > predictor.estimate(parts[-1]).p50_s > 0


def test_a_strided_conv_is_predicted_as_its_hidden_copy_plus_the_dense_conv(predictor):
    """ATen copies a conv input that is neither contiguous nor channels_last before the kernel
    runs; the conv model only knows dense inputs, so the copy is predicted on its own."""
    import torch

    from profilers.capture import record_real

    conv = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16).eval()
    x = torch.randn(1, 64, 16).transpose(1, 2).view(1, 16, 8, 8)
    record = next(r for r in record_real(conv, [x]) if ops.family_of(r.op) == "conv")
    copy, dense = ops.dense_input_split(record)
    predictor.estimate_ops([record])
    predictor.estimate_ops([copy, dense])
    got, parts = predictor.estimate(record), [predictor.estimate(p) for p in (copy, dense)]
    assert got.p50_s == pytest.approx(parts[0].p50_s + parts[1].p50_s)
    assert got.family == "conv" and parts[0].family == "data"
    assert got.p50_s > parts[1].p50_s > 0


def test_a_mask_whose_exp_is_subnormal_before_a_softmax_is_noted(predictor, resnet):
    scores = TensorSpec((4, 3, 49, 49), (7203, 2401, 49, 1), "float32")
    where = TensorSpec((4, 1, 49, 49), (2401, 2401, 49, 1), "bool")

    def fill(value: float) -> OpRecord:
        return OpRecord("aten.masked_fill.Scalar", (scores, where, value), {}, (scores,), "attn")

    softmax = OpRecord("aten._softmax.default", (scores, -1, False), {}, (scores,), "attn")

    def noted(ops: list) -> list[str]:
        return [n for n in predictor.predict_ops([*resnet.ops, *ops], spec="x").notes
                if "fills a mask" in n]

    # Swin's -100: exp(-100) = 3.7e-44 is below float32's smallest normal
    [note] = noted([fill(-100.0), softmax])
    assert note.startswith("subnormals likely: attn fills a mask with -100 "
                           "(aten.masked_fill.Scalar)")
    assert noted([fill(float("-inf")), softmax]) == []  # exp gives exact zeros
    assert noted([fill(-1e4), softmax]) == []  # ... and so does anything under ln 2^-149
    assert noted([fill(-100.0)]) == []  # no softmax: a fused attention kernel, or no logits
    assert noted([softmax, fill(-100.0)]) == []  # the softmax must come after the mask


def test_counted_subnormals_are_priced_at_the_devices_cost(predictor, resnet):
    import copy
    import dataclasses

    from profilers.subnormals import SubnormalUses

    uses = SubnormalUses(0.02, {"matmul": 1e6}, {"eltwise": 1e4})
    base = predictor.predict_captured(resnet)
    unpriced = predictor.predict_captured(resnet, subnormals=uses)  # no cost measured on dev1
    assert unpriced.p50_ms == base.p50_ms and unpriced.subnormal_ms is None
    assert any("not priced" in n and "hwlat profile" in n for n in unpriced.notes)
    priced = copy.copy(predictor)
    priced.device = dataclasses.replace(
        predictor.device, peaks={**predictor.device.peaks,
                                 "subnormal": {"reuse_ns": 2.0, "block_ns": 100.0}})
    p = priced.predict_captured(resnet, subnormals=uses)
    assert p.subnormal_ms == pytest.approx(3.0)  # 1e6 x 2 ns + 1e4 x 100 ns
    assert p.p50_ms == pytest.approx(base.p50_ms + 3.0)
    assert p.per_family["subnormal_slow_path"] == pytest.approx(3.0)
    assert sum(p.per_family.values()) == pytest.approx(p.p50_ms)
    lo, hi = Predictor.SUBNORMAL_BAND
    assert p.interval_ms == pytest.approx([base.interval_ms[0] + 3.0 * lo,
                                           base.interval_ms[1] + 3.0 * hi])
    assert any(n.startswith("2% of the values") and "adds 3 ms, most in its matmul ops" in n
               for n in p.notes)
    none = priced.predict_captured(resnet, subnormals=SubnormalUses(0.0))
    assert none.p50_ms == base.p50_ms and none.subnormal_ms is None
    # a batched matmul whose subnormals lie in one thread's half of its batch waits on it
    two = copy.copy(predictor)
    two.device = dataclasses.replace(
        predictor.device, peaks={**predictor.device.peaks, "subnormal": {
            "reuse_ns": 2.0, "block_ns": 100.0, "threads": 2}})
    crowded = dataclasses.replace(uses, per_matrix=[("matmul", (0.0, 0.0, 5e5, 5e5))])
    p = two.predict_captured(resnet, subnormals=crowded)
    assert p.subnormal_ms == pytest.approx(3.0 + 2.0)  # 2 x 1e6 on one thread, less 1e6
    assert any("adds 5 ms (2 ms of it waiting on one thread" in n for n in p.notes)


def test_predict_spec_with_values_counts_them_in_a_real_forward(predictor):
    p = predictor.predict_spec("torchvision:resnet18", inputs=SMALL_INPUT, values=True)
    assert p.subnormal_ms is None  # random weights and inputs: no subnormal at all
    assert p.p50_ms == predictor.predict_spec("torchvision:resnet18", inputs=SMALL_INPUT).p50_ms


def test_a_value_pass_that_cannot_run_is_a_note_not_a_failure(predictor, monkeypatch):
    from profilers import subnormals
    from profilers.errors import SpecError

    def too_large(*a, **kw):
        raise SpecError("x: its weights take 26.4 GB")

    monkeypatch.setattr(subnormals, "uses_at_batch_one", too_large)
    p = predictor.predict_spec("torchvision:resnet18", inputs=SMALL_INPUT, values=True)
    assert p.p50_ms > 0 and p.subnormal_ms is None
    assert any("not counted" in n and "26.4 GB" in n for n in p.notes)
