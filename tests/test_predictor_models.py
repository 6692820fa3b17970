"""predictor.features, predictor.family_model, predictor.model_store.

Op configs are real (captured from small random modules by profilers.sampling); their latencies
are synthetic, from a known formula over the roofline, so the tests can check that the models
recover it and that caching/retraining follows the database state.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from kernels_db.store import KernelDB
from predictor import model_store
from predictor.family_model import SMEAR_FOLDS, FamilyModel, cross_validate, cv_folds
from predictor.features import feature_matrix, feature_names, feature_row, roofline_s
from profilers import ops, sampling
from profilers.errors import NotFittedError

PEAKS = {"gflops": {"float32": 50.0}, "gbps": 10.0}
SMALL = {"n_estimators": 60}


def synthetic_s(record) -> float:
    """1.7x the roofline plus 4 us launch cost: what a device might really look like."""
    return 1.7 * roofline_s(record, PEAKS) + 4e-6


@pytest.fixture(scope="module")
def convs():
    records = {r.key: r for r in sampling.random_records("conv", 120, seed=3)}
    return list(records.values())


@pytest.fixture(scope="module")
def eltwise():
    records = {r.key: r for r in sampling.random_records("eltwise", 12, seed=3)}
    return list(records.values())


def make_db(path, records, source="random") -> KernelDB:
    db = KernelDB.open(path)
    db.upsert_device({"test": True}, device_id="dev1", kind="cpu", threads=1, name="box",
                     peaks=PEAKS)
    add_measured(db, records, source)
    return db


def add_measured(db: KernelDB, records, source="random", scale=1.0) -> None:
    db.add_configs("dev1", [(r.key, r.op, ops.family_of(r.op), r.dtype, source, r.to_json())
                            for r in records])
    ids = db.config_ids("dev1")
    for r in records:
        t = scale * synthetic_s(r)
        db.add_measurement(ids[r.key], None, [t * 0.98, t, t * 1.03], flushed=True, threads=1,
                           noisy=False)


# ------------------------------------------------------------------------------- features


def test_feature_matrix_is_the_registry_features_plus_device_columns(convs):
    x = feature_matrix(convs, "conv", PEAKS)
    names = feature_names("conv")
    assert x.shape == (len(convs), len(names))
    assert names[: len(ops.feature_names("conv"))] == ops.feature_names("conv")
    # one code path: the batch matrix is exactly the per-record rows
    assert np.array_equal(x, np.array([feature_row(r, "conv", PEAKS) for r in convs]),
                          equal_nan=True)
    rf = x[:, names.index("rf_log_roofline_s")]
    assert np.allclose(np.exp(rf), [roofline_s(r, PEAKS) for r in convs])


def test_the_roofline_column_adds_onednns_weight_reorder_in_series(convs):
    """Where the thread count says oneDNN runs a conv, its weights' reorder (read and written
    once a call) is added to the roofline at the measured reorder rate, else the copy bandwidth;
    on ATen's own path, nothing."""
    names = feature_names("conv")
    x = feature_matrix(convs, "conv", PEAKS, threads=1)
    reorder = x[:, names.index("conv.reorder_bytes")]
    native = x[:, names.index("conv.native_path")]
    assert set(native) == {0.0, 1.0}  # the sample holds both paths
    weights = np.array([ops.bound(r)["weight"].numel * ops.bound(r)["weight"].itemsize
                        for r in convs])
    assert np.array_equal(reorder, np.where(native == 1.0, 0.0, 2.0 * weights))
    expected = [roofline_s(r, PEAKS) + b / (PEAKS["gbps"] * 1e9)
                for r, b in zip(convs, reorder, strict=True)]
    assert np.allclose(np.exp(x[:, names.index("rf_log_roofline_s")]), expected)
    # a profile that timed the reorder itself (fingerprint.measure_reorder_gbps) prices it so
    slow = {**PEAKS, "reorder_gbps": PEAKS["gbps"] / 3}
    x = feature_matrix(convs, "conv", slow, threads=1)
    expected = [roofline_s(r, PEAKS) + b / (slow["reorder_gbps"] * 1e9)
                for r, b in zip(convs, reorder, strict=True)]
    assert np.allclose(np.exp(x[:, names.index("rf_log_roofline_s")]), expected)


def test_roofline_accepts_both_peak_spellings_and_missing_peaks(convs):
    r = convs[0]
    as_ops = {"peak_gflops": PEAKS["gflops"], "gbps": PEAKS["gbps"]}
    assert roofline_s(r, as_ops) == pytest.approx(roofline_s(r, PEAKS))
    assert roofline_s(r, PEAKS) == pytest.approx(ops.roofline_s(r, PEAKS))
    assert roofline_s(r, None) > 0  # nominal peaks, still a positive estimate


# --------------------------------------------------------------------------- family model


def test_predict_before_fit_raises_not_fitted(convs):
    with pytest.raises(NotFittedError):
        FamilyModel("conv").predict(convs[:2])
    model = FamilyModel("conv", n_estimators=7)
    assert model.n_estimators == 7 and not hasattr(model, "booster_")  # __init__ only stores


def test_fit_returns_self_and_recovers_formula_on_held_out_configs(convs):
    train, test = convs[::2] + convs[1::4], convs[3::4]
    y = [synthetic_s(r) for r in train]
    model = FamilyModel("conv", target="roofline_residual", n_estimators=150)
    assert model.fit(train, y, PEAKS) is model
    p50, lo, hi = model.predict(test)
    truth = np.array([synthetic_s(r) for r in test])
    error = np.abs(p50 / truth - 1)
    # where the roofline is under 1 us the fixed 4 us dominates the residual target, and one such
    # held-out config (a depthwise 3x3 on 1x100x2x2) is extrapolated to 5x: the rest are recovered
    sizable = np.array([roofline_s(r, PEAKS) >= 1e-6 for r in test])
    assert np.median(error) < 0.05 and np.mean(error[sizable]) < 0.15
    assert np.all(lo <= p50) and np.all(p50 <= hi)
    # prediction goes through the same feature code as training
    assert np.array_equal(p50, model.predict_matrix(feature_matrix(test, "conv", PEAKS))[0])


def test_save_load_round_trip_gives_identical_predictions(tmp_path, convs):
    model = FamilyModel("conv", **SMALL).fit(convs, [synthetic_s(r) for r in convs], PEAKS)
    sidecar = model.save(tmp_path)
    meta = json.loads(sidecar.read_text())
    assert meta["feature_names"] == feature_names("conv") and meta["target"] == model.target
    assert all((tmp_path / f).read_text().startswith("tree") for f in meta["files"])
    loaded = FamilyModel.load(tmp_path, "conv")
    for a, b in zip(model.predict(convs), loaded.predict(convs), strict=True):
        assert np.array_equal(a, b)


def test_the_smear_makes_p50_the_ops_expected_time_under_a_lognormal_error():
    """Timings scattered by a lognormal factor (sigma 0.3, the trees' out-of-fold log error on
    the AMD EPYC of 12-07 was 0.10-0.29 by family): the trees predict the median, a sum of ops
    needs the mean, exp(sigma^2 / 2) = 1.046x higher. Measured out of fold, the smear puts the
    predictions of unseen configs at their times on average, where the
    trees' medians alone fall short (the mean of time / prediction over unseen configs, what a
    sum of many ops adds up); without `smear_folds` nothing changes."""
    records = list({r.key: r for r in sampling.random_records("conv", 1000, seed=5)}.values())
    rng = np.random.default_rng(0)
    times = np.array([synthetic_s(r) for r in records]) * np.exp(rng.normal(0, 0.3, len(records)))
    train, test = np.arange(len(records)) % 4 != 0, np.arange(len(records)) % 4 == 0
    fit = [r for r, keep in zip(records, train, strict=True) if keep]
    held = [r for r, keep in zip(records, test, strict=True) if keep]
    plain = FamilyModel("conv", **SMALL).fit(fit, times[train], PEAKS)
    smeared = FamilyModel("conv", smear_folds=SMEAR_FOLDS, **SMALL).fit(fit, times[train], PEAKS)
    assert plain.smear_ == 1.0
    assert 1.02 < smeared.smear_ < 1.15
    short = np.mean(times[test] / plain.predict(held)[0])
    assert short > 1.03  # the medians alone price the held-out configs low
    assert abs(np.mean(times[test] / smeared.predict(held)[0]) - 1) < (short - 1) / 2
    p50, lo, hi = smeared.predict(held)
    assert np.all(lo <= p50) and np.all(p50 <= hi)
    plain_hi = plain.predict(held)[2]
    above = plain_hi > p50  # the quantile models are quantiles of the time: not smeared
    assert above.any() and np.array_equal(hi[above], plain_hi[above])


def test_a_saved_smear_is_loaded(tmp_path, convs):
    model = FamilyModel("conv", smear_folds=SMEAR_FOLDS, **SMALL).fit(
        convs, [synthetic_s(r) * (1.3 if i % 3 else 0.8) for i, r in enumerate(convs)], PEAKS)
    assert model.smear_ != 1.0
    model.save(tmp_path)
    loaded = FamilyModel.load(tmp_path, "conv")
    assert loaded.smear_ == model.smear_
    assert np.array_equal(loaded.predict(convs)[0], model.predict(convs)[0])


def _unary(op: str, shape: tuple[int, ...]):
    from profilers.oprecord import OpRecord, TensorSpec, _contiguous_strides

    x = TensorSpec(shape, _contiguous_strides(shape), "float32")
    return OpRecord(op, (x,), {}, (x,))


def test_op_level_prices_an_op_with_few_configs_by_its_own_speed(tmp_path):
    """relu at the roofline, exp 6x slower: 60 relu configs and 6 exp ones; without the op's
    level the model priced exp's held-out sizes like relu's (as softplus at 0.24x its time)."""
    sizes = [(1, c, hw, hw) for c in (16, 24, 32, 48, 64, 96, 128, 192, 256, 384)
             for hw in (7, 14, 28, 56, 112, 20)]
    relu = [_unary("aten.relu.default", s) for s in sizes]
    exp = [_unary("aten.exp.default", s) for s in sizes[::10]]
    slow = {"aten.relu.default": 1.0, "aten.exp.default": 6.0}
    train = relu + exp

    def truth(r):
        return slow[r.op] * roofline_s(r, PEAKS)

    model = FamilyModel("eltwise", n_estimators=150).fit(train, [truth(r) for r in train], PEAKS)
    held_out = [_unary("aten.exp.default", (1, c, 40, 40)) for c in (40, 80, 160)]
    p50, _, _ = model.predict(held_out)
    assert np.all(np.abs(p50 / np.array([truth(r) for r in held_out]) - 1) < 0.25)
    # the column: each op's mean log(latency / roofline); unseen ops (tanh) get NaN
    x = feature_matrix([held_out[0], _unary("aten.tanh.default", (1, 8, 4, 4))], "eltwise", PEAKS)
    filled = model._fill_op_level(x)[:, feature_names("eltwise").index("op_level")]
    assert filled[0] == pytest.approx(np.log(6.0), abs=1e-6) and np.isnan(filled[1])
    model.save(tmp_path)
    assert np.array_equal(FamilyModel.load(tmp_path, "eltwise").predict(held_out)[0], p50)


def test_op_level_in_training_never_holds_the_rows_own_latency():
    """Out of fold: a row's value is the mean of other folds' rows of its op, so changing a row's
    latency leaves its own value alone (a leave-one-out mean let the trees read it back)."""
    recs = [_unary("aten.exp.default", (1, c, 8, 8)) for c in range(8, 48, 2)]
    y = np.array([roofline_s(r, PEAKS) for r in recs])
    model = FamilyModel("eltwise", n_estimators=5)
    model.feature_names_ = feature_names("eltwise")
    x = feature_matrix(recs, "eltwise", PEAKS)
    col = model.feature_names_.index("op_level")
    before = model._fill_op_level(x, np.log(y))[:, col]
    y2 = y.copy()
    y2[3] *= 10
    after = model._fill_op_level(x, np.log(y2))[:, col]
    assert after[3] == before[3]
    assert np.all(np.isfinite(before)) and not np.allclose(after, before)


def test_grouped_folds_keep_groups_together():
    groups = ["zoo"] * 4 + ["perturb"] * 3 + ["random"] * 5
    folds = cv_folds(len(groups), groups, k=3)
    assert sorted(np.concatenate(folds).tolist()) == list(range(12))
    for fold in folds:
        assert len({groups[i] for i in fold}) == 1


def test_cross_validate_reports_a_finite_error_for_each_target(convs):
    x = feature_matrix(convs, "conv", PEAKS)
    y = np.array([synthetic_s(r) for r in convs])
    errors = {t: cross_validate("conv", x, y, PEAKS, None, target=t, n_estimators=60)
              for t in ("log", "roofline_residual")}
    assert all(0 <= e < 1 for e in errors.values())


def test_the_data_family_learns_the_residual_whatever_its_cv_says():
    """Its ops have little in common, and a rare one's time must scale with its size."""
    records = list({r.key: r for r in sampling.random_records("data", 60, seed=3)}.values())
    x = feature_matrix(records, "data", PEAKS)
    y = np.array([synthetic_s(r) for r in records])
    groups = ["random"] * len(records)
    chosen, cv = model_store._choose_target("data", x, y, PEAKS, groups, "auto", SMALL)
    assert chosen == "roofline_residual" and set(cv) == {"roofline_residual"}
    assert model_store._choose_target("data", x, y, PEAKS, groups, "log", SMALL)[0] == "log"


# ---------------------------------------------------------------------------- model store


def test_trains_every_family_with_enough_rows_and_writes_a_sidecar(tmp_path, convs, eltwise):
    db = make_db(tmp_path / "k.db", convs + eltwise[:5])
    dm = model_store.load_or_train(db, "box", directory=tmp_path / "m", params=SMALL)
    assert dm.retrained and set(dm.models) == {"conv"}  # 5 eltwise configs: too few
    meta = json.loads((tmp_path / "m" / model_store.SIDECAR).read_text())
    assert meta["device_id"] == "dev1" and meta["state_token"] == db.state_token("dev1")
    assert meta["families"]["conv"]["n_train"] == len(convs)
    assert set(meta["families"]["conv"]["cv_mape"]) == {"log", "roofline_residual"}
    assert {"lightgbm", "torch"} <= set(meta["versions"])
    assert dm.roofline_ratios["q10"] <= dm.roofline_ratios["q50"] <= dm.roofline_ratios["q90"]


def test_reloads_when_unchanged_and_retrains_when_the_database_changed(tmp_path, convs, eltwise):
    db = make_db(tmp_path / "k.db", convs)
    first = model_store.load_or_train(db, "dev1", directory=tmp_path / "m", params=SMALL)
    again = model_store.load_or_train(db, "dev1", directory=tmp_path / "m", params=SMALL)
    assert first.retrained and not again.retrained
    # the device's thread count reaches the features (which kernel ATen picks) and is kept
    assert again.threads == again.models["conv"].threads_ == 1
    assert np.array_equal(first.models["conv"].predict(convs)[0],
                          again.models["conv"].predict(convs)[0])
    add_measured(db, eltwise)
    changed = model_store.load_or_train(db, "dev1", directory=tmp_path / "m", params=SMALL)
    assert changed.retrained and "eltwise" in changed.models


def test_older_sidecar_loads_unless_its_feature_names_differ(tmp_path, convs):
    db = make_db(tmp_path / "k.db", convs)
    model_store.load_or_train(db, "dev1", directory=tmp_path / "m", params=SMALL)
    path = tmp_path / "m" / model_store.SIDECAR
    meta = json.loads(path.read_text())
    meta["versions"] = {"hwlat": "0.0.1", "lightgbm": "4.0.0"}
    path.write_text(json.dumps(meta))
    assert not model_store.load_or_train(db, "dev1", directory=tmp_path / "m").retrained
    meta["families"]["conv"]["feature_names"] = meta["families"]["conv"]["feature_names"][:-1]
    path.write_text(json.dumps(meta))
    assert model_store.load_or_train(db, "dev1", directory=tmp_path / "m",
                                     params=SMALL).retrained


def test_default_cache_dir_is_per_device_and_database(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    a = model_store.default_cache_dir("dev1", tmp_path / "a.db")
    b = model_store.default_cache_dir("dev1", tmp_path / "b.db")
    assert a.parent == tmp_path / "hwlat" / "models" and a != b
    assert a.name.startswith("dev1-")


@pytest.mark.parametrize(("log_cv", "residual_cv", "chosen"), [
    (0.145, 0.150, "roofline_residual"),  # within noise: the residual extrapolates better
    (0.214, 0.299, "log"),  # clearly better
    (0.300, 0.250, "roofline_residual")])
def test_log_target_must_win_clearly(monkeypatch, log_cv, residual_cv, chosen) -> None:
    cv = {"log": log_cv, "roofline_residual": residual_cv}
    monkeypatch.setattr(model_store, "cross_validate", lambda *a, target, **kw: cv[target])
    x, y = np.zeros((model_store.CV_MIN_ROWS, 3)), np.ones(model_store.CV_MIN_ROWS)
    got, scores = model_store._choose_target("conv", x, y, None, ["g"] * len(x), "auto", {})
    assert got == chosen and scores == cv
