"""One op family's latency model: LightGBM on the registry's features, with quantile models.

Follows the scikit-learn estimator contract: `__init__` only stores parameters, `fit` returns
self, learned state ends in `_`, `predict` before `fit` raises NotFittedError. The target is
either log latency or the log residual over the roofline estimate (`roofline_residual`), which
DESIGN.md found to generalise better to real models' configs; `cross_validate` measures it.
Saved in LightGBM's own text format plus a JSON sidecar, never a pickle.

Trees fitted to log latency predict its conditional mean, exp of which is the op's median time;
a model's time is the sum of its ops' mean times, higher by about exp(sigma^2 / 2) where sigma is
the trees' log error. With `smear_folds`, `fit` measures that factor out of fold (`SMEAR_FOLDS`)
and the p50 it predicts is the median times it: the op's expected time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import lightgbm as lgb
import numpy as np

from predictor.features import OP_LEVEL, feature_matrix, feature_names, op_code_column
from profilers.errors import HwlatError, NotFittedError
from profilers.oprecord import OpRecord

TARGETS = ("log", "roofline_residual")
_RF_COLUMN = "rf_log_roofline_s"
_OP_LEVEL_FOLDS = 5

SMEAR_FOLDS = 5
"""Random folds over which `FamilyModel.fit` measures its smear: exp(mean + variance / 2) of the
out-of-fold log(measured / predicted), the mean of a lognormal error (Duan's smearing, in its
parametric form). Random folds, not grouped ones: a held-out op config of a new model is like
the sampled ones, while a whole held-out source (the random sampler, or one zoo model) is not,
and grouped folds put the factor at 1.02-1.84 and the unseen timm models at 20% MAPE. On the
AMD EPYC of 12-07 the factors came out 1.01-1.04 by family (1.08-1.13 for the few rnn
configs). Four profiles' recorded evaluations re-predicted at the profile's anchor (325
settings: the held-out zoo and the unseen sets, 1 and 2 threads): MAPE 4.1% -> 3.9% over 117 at
1 thread on one profile, 4.5% -> 4.0% over 78 on another, 5.3% -> 4.9% over 78 at 2 threads,
6.4% -> 6.5% over 52 on a third (benchmarks/RESULTS.md, 2026-12-07 later afternoon). The trees
had priced the unseen timm and transformers sets low (a median 0.94-0.97x their measured
time), where few of their ops were timed exactly; with 3 folds the factors came out higher
(to 1.13 for pools: trees fitted on two thirds of the configs err more than on all). On the
quickstart's 3-minute profile (62-867 configs a family) its trees err more and the factors came
out 1.02-1.20: its 4 models, already over, went 9.4% -> 12.6% (one run, 2 threads)."""
SMEAR_MIN_ROWS = 30  # fewer training configs: no smear (1.0), too few to measure it
SMEAR_CLIP = 1.0  # out-of-fold log errors are winsorised here (a factor e) before the smear


class FamilyModel:
    def __init__(self, family: str, *, target: str = "roofline_residual",
                 quantiles: tuple[float, float] = (0.1, 0.9), n_estimators: int = 300,
                 learning_rate: float = 0.05, num_leaves: int = 31, min_child_samples: int = 3,
                 seed: int = 0, smear_folds: int = 0) -> None:
        self.family = family
        self.target = target
        self.quantiles = quantiles
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.seed = seed
        self.smear_folds = smear_folds

    # ------------------------------------------------------------------------------- fitting

    def _tree_params(self) -> dict:
        """The constructor's booster parameters (what a fold's model or a saved one is built
        with)."""
        return {"n_estimators": self.n_estimators, "learning_rate": self.learning_rate,
                "num_leaves": self.num_leaves, "min_child_samples": self.min_child_samples,
                "seed": self.seed}

    def _params(self, objective: str, alpha: float | None = None) -> dict:
        params = {"objective": objective, "learning_rate": self.learning_rate,
                  "num_leaves": self.num_leaves, "min_data_in_leaf": self.min_child_samples,
                  "min_data_in_bin": 1, "seed": self.seed, "deterministic": True,
                  "num_threads": 1, "verbosity": -1}
        if alpha is not None:
            params["alpha"] = alpha
        return params

    def _base(self, x: np.ndarray) -> np.ndarray:
        """What the booster's output is added to, in log seconds."""
        if self.target == "log":
            return np.zeros(len(x))
        return x[:, self.feature_names_.index(_RF_COLUMN)]

    def fit(self, records: Sequence[OpRecord], latencies_s: Sequence[float],
            peaks: dict | None, threads: int | None = None) -> FamilyModel:
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")
        self.feature_names_ = feature_names(self.family)
        x = feature_matrix(records, self.family, peaks, threads)
        return self.fit_matrix(x, np.asarray(latencies_s, dtype=np.float64), peaks, threads)

    def fit_matrix(self, x: np.ndarray, latencies_s: np.ndarray, peaks: dict | None,
                   threads: int | None = None) -> FamilyModel:
        """`fit` on a precomputed `feature_matrix` (cross-validation reuses one matrix); `peaks`
        and `threads` are kept for `predict` on records."""
        if len(x) == 0 or np.any(~np.isfinite(latencies_s)) or np.any(latencies_s <= 0):
            raise HwlatError(f"{self.family}: training needs positive latencies, got "
                             f"{len(x)} rows")
        self.feature_names_ = feature_names(self.family)
        self.peaks_, self.threads_ = peaks, threads
        log_latency = np.log(latencies_s)
        filled = self._fill_op_level(x, log_latency)
        y = log_latency - self._base(filled)
        data = lgb.Dataset(filled, y, feature_name=self.feature_names_, free_raw_data=False,
                           params={"verbosity": -1, "min_data_in_bin": 1})
        self.booster_ = lgb.train(self._params("regression"), data, self.n_estimators)
        self.quantile_boosters_ = [
            lgb.train(self._params("quantile", q), data, self.n_estimators)
            for q in self.quantiles]
        self.n_train_ = len(x)
        self.smear_ = self._smear(x, latencies_s, peaks) if self.smear_folds else 1.0
        return self

    def _smear(self, x: np.ndarray, latencies_s: np.ndarray, peaks: dict | None) -> float:
        """exp(mean + variance / 2) of the out-of-fold log(measured / predicted) over
        `smear_folds` random folds (`SMEAR_FOLDS` says why); 1.0 under `SMEAR_MIN_ROWS`."""
        if len(x) < max(SMEAR_MIN_ROWS, self.smear_folds):
            return 1.0
        folds = cv_folds(len(x), None, self.smear_folds, self.seed)  # none empty: n >= folds
        rows, p50 = out_of_fold(self.family, x, latencies_s, peaks, folds, target=self.target,
                                **self._tree_params())
        # winsorised at a factor e: one config timed far off (a noisy timing, an op the trees
        # cannot place) would otherwise set the factor of its whole family
        r = np.clip(np.log(latencies_s[rows] / p50), -SMEAR_CLIP, SMEAR_CLIP)
        return float(np.exp(r.mean() + r.var() / 2))

    def _fill_op_level(self, x: np.ndarray, log_latency: np.ndarray | None = None) -> np.ndarray:
        """`x` with its `OP_LEVEL` column filled (a copy; unchanged for families without one).

        Fitting (`log_latency` given) keeps per op code the sum and count of log(latency /
        roofline) and gives each row the mean over the op's rows in the other folds (NaN where
        it has none); prediction gives each row its op's mean over all training rows (NaN for
        an op never trained on)."""
        if OP_LEVEL not in self.feature_names_:
            return x
        x = np.array(x, dtype=np.float64, copy=True)
        codes = x[:, self.feature_names_.index(op_code_column(self.family))]
        col = self.feature_names_.index(OP_LEVEL)
        if log_latency is not None:
            ratio = log_latency - x[:, self.feature_names_.index(_RF_COLUMN)]
            # out of fold: a row's own latency, even left out of a mean over all the op's rows,
            # is readable from that mean's small shifts, and the trees learned to read it
            fold = np.arange(len(x)) % _OP_LEVEL_FOLDS
            self.op_levels_ = {}
            for code in np.unique(codes[np.isfinite(codes)]):
                mine = codes == code
                self.op_levels_[str(int(code))] = [float(ratio[mine].sum()), int(mine.sum())]
                for k in range(_OP_LEVEL_FOLDS):
                    others = mine & (fold != k)
                    x[mine & (fold == k), col] = ratio[others].mean() if others.any() else np.nan
            return x
        levels = {float(code): total / n for code, (total, n) in self.op_levels_.items()}
        x[:, col] = [levels.get(code, np.nan) for code in codes]  # a NaN code matches none
        return x

    # ---------------------------------------------------------------------------- prediction

    def _check_fitted(self) -> None:
        if not hasattr(self, "booster_"):
            raise NotFittedError(f"FamilyModel({self.family!r}) is not fitted; call fit() or "
                                 "load() first")

    def predict(self, records: Sequence[OpRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(p50, lo, hi) in seconds, one entry per record."""
        self._check_fitted()
        return self.predict_matrix(feature_matrix(records, self.family, self.peaks_,
                                                  self.threads_))

    def predict_matrix(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(p50, lo, hi) in seconds: p50 the trees' median times the smear (the op's expected
        time), lo and hi the quantile models' as they are (quantiles of its time)."""
        self._check_fitted()
        if len(x) == 0:
            empty = np.empty(0)
            return empty, empty, empty
        x = self._fill_op_level(x)
        base = self._base(x)
        # One thread: OpenMP workers that spin after a call would steal the cores that
        # `hwlat evaluate` times models on right afterwards.
        p50 = np.exp(base + self.booster_.predict(x, num_threads=1)) * self.smear_
        bounds = [np.exp(base + b.predict(x, num_threads=1)) for b in self.quantile_boosters_]
        lo = np.minimum(bounds[0], p50) if bounds else p50
        hi = np.maximum(bounds[-1], p50) if bounds else p50
        return p50, lo, hi

    # ------------------------------------------------------------------------------- storage

    def _files(self, directory: Path) -> list[Path]:
        names = ["p50", *(f"q{round(q * 100):02d}" for q in self.quantiles)]
        return [directory / f"{self.family}.{n}.txt" for n in names]

    def save(self, directory: str | Path) -> Path:
        """Boosters as LightGBM text files plus `<family>.json`; returns the sidecar path."""
        self._check_fitted()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        files = self._files(directory)
        for booster, path in zip([self.booster_, *self.quantile_boosters_], files, strict=True):
            booster.save_model(str(path))
        sidecar = directory / f"{self.family}.json"
        sidecar.write_text(json.dumps({
            "family": self.family, "target": self.target, "quantiles": list(self.quantiles),
            "params": {**self._tree_params(), "smear_folds": self.smear_folds},
            "feature_names": self.feature_names_, "peaks": self.peaks_, "threads": self.threads_,
            "n_train": self.n_train_, "smear": self.smear_, "files": [p.name for p in files],
            "op_levels": getattr(self, "op_levels_", None),
        }, indent=1, sort_keys=True))
        return sidecar

    @classmethod
    def load(cls, directory: str | Path, family: str) -> FamilyModel:
        directory = Path(directory)
        meta = json.loads((directory / f"{family}.json").read_text())
        model = cls(family, target=meta["target"], quantiles=tuple(meta["quantiles"]),
                    **meta["params"])
        boosters = [lgb.Booster(model_file=str(directory / name)) for name in meta["files"]]
        model.booster_, model.quantile_boosters_ = boosters[0], boosters[1:]
        model.feature_names_, model.peaks_ = meta["feature_names"], meta["peaks"]
        model.threads_ = meta.get("threads")
        if meta.get("op_levels") is not None:
            model.op_levels_ = meta["op_levels"]
        model.n_train_ = meta["n_train"]
        model.smear_ = float(meta["smear"])
        return model


# ------------------------------------------------------------------------ model selection


def cv_folds(n: int, groups: Sequence[str] | None, k: int = 3, seed: int = 0) -> list[np.ndarray]:
    """Test-index folds: whole groups when there are at least `k` of them, else random rows."""
    rng = np.random.default_rng(seed)
    if groups is not None and len(set(groups)) >= k:
        names = sorted(set(groups))
        rng.shuffle(names)
        fold_of = {g: i % k for i, g in enumerate(names)}
        labels = np.array([fold_of[g] for g in groups])
    else:
        labels = rng.permutation(n) % k
    return [np.flatnonzero(labels == i) for i in range(k)]


def cross_validate(family: str, x: np.ndarray, latencies_s: np.ndarray, peaks: dict | None,
                   groups: Sequence[str] | None, *, target: str, k: int = 3,
                   **params: object) -> float:
    """Held-out MAPE (fraction) of the median model, over grouped folds."""
    rows, p50 = out_of_fold(family, x, latencies_s, peaks, cv_folds(len(x), groups, k),
                            target=target, **params)
    return float(np.mean(np.abs(p50 / latencies_s[rows] - 1))) if len(rows) else float("nan")


def out_of_fold(family: str, x: np.ndarray, latencies_s: np.ndarray, peaks: dict | None,
                folds: Sequence[np.ndarray], *, target: str,
                **params: object) -> tuple[np.ndarray, np.ndarray]:
    """(rows, p50): each fold's rows predicted by a median model (no quantiles, no smear) fitted
    on the other folds; folds with nothing to fit or test are skipped."""
    rows, predicted = [], []
    for test in folds:
        train = np.setdiff1d(np.arange(len(x)), test)
        if len(train) == 0 or len(test) == 0:
            continue
        model = FamilyModel(family, target=target, quantiles=(), **params)
        predicted.append(model.fit_matrix(x[train], latencies_s[train], peaks)
                         .predict_matrix(x[test])[0])
        rows.append(test)
    if not rows:
        return np.empty(0, dtype=int), np.empty(0)
    return np.concatenate(rows), np.concatenate(predicted)
