"""Latency statistics: percentiles, the sample counts they need, bootstrap intervals, noise.

One record, `LatencyStats`, keeps every raw sample (seconds) and derives everything else lazily,
so a caller can always go back to the data. Two rules the rest of hwlat relies on:

* Percentiles use one definition everywhere: numpy's default "linear" method (Hyndman & Fan
  type 7): sort the n samples, take position h = (n - 1) * q, interpolate linearly between the
  samples at floor(h) and ceil(h).
* A percentile is only reported when the sample count supports it (`min_samples_for`). Otherwise
  it is `None` and listed under `insufficient`, never shown as a number: a "p99" of 200 samples
  is mostly the largest two samples and says little about the true p99.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from profilers.errors import BenchError

# The percentiles every latency report shows, by name.
QUANTILES: dict[str, float] = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99}

# Above this IQR/median the samples are too spread to compare runs by their median: the same
# threshold torch.utils.benchmark uses for its "interquartile range is X% of the median" warning.
NOISE_WARN_RATIO = 0.10

# Bootstrap resamples are drawn in chunks so memory stays bounded for long runs.
_BOOT_CHUNK_VALUES = 2_000_000


def percentile(samples: Iterable[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of `samples`, numpy "linear" (type 7) definition."""
    values = np.asarray(list(samples), dtype=np.float64)
    if values.size == 0:
        raise BenchError("no samples to take a percentile of")
    if not 0.0 <= q <= 1.0:
        raise BenchError(f"quantile must be within [0, 1], got {q}")
    return float(np.quantile(values, q, method="linear"))


def min_samples_for(q: float, confidence: float = 0.95) -> int:
    """The fewest samples for which the q-quantile is supported by the data.

    Rule: the smallest n such that, with probability `confidence`, at least two of the n samples
    lie above the true q-quantile, i.e. P(Binomial(n, 1 - q) >= 2) >= confidence. Equivalently,
    it is the smallest n for which a distribution-free one-sided `confidence` upper bound on the
    q-quantile is an order statistic below the sample maximum (X(n-1)). With fewer samples the
    estimate and any interval around it rest on the single largest sample, i.e. on one outlier.

    At 95%: p50 -> 8, p90 -> 46, p95 -> 93, p99 -> 473, p99.9 -> 4742 (the issue's "p99 needs
    roughly 460+" is this tail-mass argument; a weaker one-sample rule, 1 - q^n >= 0.99, gives 459).
    """
    if not 0.0 < q < 1.0:
        raise BenchError(f"quantile must be within (0, 1), got {q}")
    if not 0.0 < confidence < 1.0:
        raise BenchError(f"confidence must be within (0, 1), got {confidence}")
    tail = 1.0 - q
    n = 2
    # P(B <= 1) = q^n + n * tail * q^(n-1) decreases monotonically in n; the loop is short
    # (under 5k steps even for p99.9).
    while q**n + n * tail * q ** (n - 1) > 1.0 - confidence:
        n += 1
    return n


@dataclass(frozen=True)
class LatencyStats:
    """Raw latency samples in seconds; percentiles, intervals and noise derived on demand."""

    samples_s: tuple[float, ...]

    @classmethod
    def of(cls, samples_s: Iterable[float]) -> LatencyStats:
        return cls(tuple(float(s) for s in samples_s))

    @property
    def n(self) -> int:
        return len(self.samples_s)

    @cached_property
    def _sorted(self) -> np.ndarray:
        return np.sort(np.asarray(self.samples_s, dtype=np.float64))

    def quantile(self, q: float) -> float:
        """The q-quantile in seconds, whether or not the sample count supports it."""
        if self.n == 0:
            raise BenchError("no samples were collected")
        return float(np.quantile(self._sorted, q, method="linear"))

    @cached_property
    def p50(self) -> float:
        return self.quantile(0.50)

    @cached_property
    def p90(self) -> float:
        return self.quantile(0.90)

    @cached_property
    def p95(self) -> float:
        return self.quantile(0.95)

    @cached_property
    def p99(self) -> float:
        return self.quantile(0.99)

    @cached_property
    def max(self) -> float:
        return self.quantile(1.0)

    @cached_property
    def mean(self) -> float:
        return float(self._sorted.mean()) if self.n else math.nan

    @cached_property
    def iqr(self) -> float:
        return self.quantile(0.75) - self.quantile(0.25)

    def supported(self, q: float, confidence: float = 0.95) -> bool:
        """Whether there are enough samples to report the q-quantile (see `min_samples_for`)."""
        return self.n >= min_samples_for(q, confidence)

    def ci(self, q: float, level: float = 0.95, n_boot: int = 1000,
           seed: int = 0) -> tuple[float, float]:
        """Percentile-bootstrap `level` interval for the q-quantile, in seconds.

        Resamples the samples with replacement `n_boot` times (seeded, so reports are
        reproducible) and takes the central `level` mass of the resampled quantiles.
        """
        return self.cis([q], level=level, n_boot=n_boot, seed=seed)[0]

    def cis(self, qs: list[float], level: float = 0.95, n_boot: int = 1000,
            seed: int = 0) -> list[tuple[float, float]]:
        """`ci` for several quantiles from one set of resamples (same seed, same result)."""
        if self.n == 0:
            raise BenchError("no samples were collected")
        rng = np.random.default_rng(seed)
        data = self._sorted
        chunk = max(1, _BOOT_CHUNK_VALUES // self.n)
        estimates = []
        for start in range(0, n_boot, chunk):
            rows = min(chunk, n_boot - start)
            idx = rng.integers(0, self.n, size=(rows, self.n))
            # shape (len(qs), rows)
            estimates.append(np.quantile(data[idx], qs, axis=1, method="linear"))
        boot = np.concatenate(estimates, axis=1)
        alpha = (1.0 - level) / 2.0
        bounds = np.quantile(boot, [alpha, 1.0 - alpha], axis=1, method="linear")
        return [(float(lo), float(hi)) for lo, hi in zip(bounds[0], bounds[1], strict=True)]

    @cached_property
    def noise(self) -> float:
        """IQR / median: the spread of the samples relative to their centre."""
        median = self.p50
        return self.iqr / median if median > 0 else math.inf

    @cached_property
    def noise_warning(self) -> str | None:
        """A one-line warning when the samples are too spread to trust small differences."""
        if self.n < 4 or self.noise <= NOISE_WARN_RATIO:
            return None
        return (f"interquartile range is {self.noise * 100:.1f}% of the median; "
                "results are noisy (check for other load on the machine)")

    def summary_ms(self, confidence: float = 0.95, n_boot: int = 1000,
                   seed: int = 0) -> dict[str, Any]:
        """JSON-ready summary in milliseconds; unsupported percentiles are `None`, never numbers.

        Keys: n, mean, p50, p90, p95, p99, max, ci95 (name -> [lo, hi] or None), insufficient
        (names of percentiles the sample count cannot support), noise, noise_warning.
        """
        if self.n == 0:
            return {"n": 0, "mean": None, **{name: None for name in QUANTILES}, "max": None,
                    "ci95": {name: None for name in QUANTILES},
                    "insufficient": list(QUANTILES), "noise": None, "noise_warning": None}
        out: dict[str, Any] = {"n": self.n, "mean": self.mean * 1e3}
        supported = {name: q for name, q in QUANTILES.items() if self.supported(q, confidence)}
        bounds = self.cis(list(supported.values()), level=confidence, n_boot=n_boot,
                          seed=seed) if supported else []
        ci_by_name = dict(zip(supported, bounds, strict=True))
        ci: dict[str, list[float] | None] = {}
        insufficient = []
        for name, q in QUANTILES.items():
            if name in supported:
                out[name] = self.quantile(q) * 1e3
                lo, hi = ci_by_name[name]
                ci[name] = [lo * 1e3, hi * 1e3]
            else:
                out[name] = None
                ci[name] = None
                insufficient.append(name)
        out["max"] = self.max * 1e3
        out["ci95"] = ci
        out["insufficient"] = insufficient
        out["noise"] = self.noise if math.isfinite(self.noise) else None
        out["noise_warning"] = self.noise_warning
        return out


def format_ms(summary: Mapping[str, Any], name: str) -> str:
    """One cell of a latency table: '12.34 [12.1, 12.6]', or 'insufficient' (too few samples)."""
    value = summary.get(name)
    if value is None:
        if name in summary.get("insufficient", ()) and summary.get("n", 0) > 0:
            return "insufficient"
        return "-"
    interval = summary.get("ci95", {}).get(name)
    if interval is None:
        return f"{value:.3f}"
    return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"


def insufficient_note(summaries: Iterable[Mapping[str, Any]]) -> str | None:
    """A caption line explaining the 'insufficient' cells, e.g. 'p99 needs >= 473 samples'."""
    names = sorted({name for s in summaries for name in s.get("insufficient", ())
                    if s.get("n", 0) > 0}, key=lambda name: QUANTILES[name])
    if not names:
        return None
    needs = ", ".join(f"{name} needs >= {min_samples_for(QUANTILES[name])}" for name in names)
    return f"insufficient: too few samples ({needs})"


def plot_distributions(path: str, named: Mapping[str, LatencyStats], title: str) -> None:
    """Write a PNG (or any matplotlib format by suffix) with one ECDF panel per distribution.

    Log-x ECDFs show the whole tail; supported p50/p95/p99 are marked, unsupported ones are not.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(name, stats) for name, stats in named.items() if stats.n > 0]
    if not panels:
        raise BenchError("nothing to plot: no samples were collected")
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.4 * len(panels)), squeeze=False)
    for ax, (name, stats) in zip(axes[:, 0], panels, strict=True):
        _plot_ecdf(ax, name, stats)
    fig.suptitle(title)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as exc:
        raise BenchError(f"cannot write plot {path}: {exc}") from exc
    finally:
        plt.close(fig)


def _plot_ecdf(ax: Any, name: str, stats: LatencyStats) -> None:
    # Clamp to a positive floor: log axes cannot show zero (e.g. an idle queue).
    values_ms = np.maximum(stats._sorted * 1e3, 1e-6)
    ecdf = np.arange(1, stats.n + 1) / stats.n
    ax.step(values_ms, ecdf, where="post", color="tab:blue")
    for label, q, color in (("p50", 0.50, "tab:green"), ("p95", 0.95, "tab:orange"),
                            ("p99", 0.99, "tab:red")):
        if stats.supported(q):
            x = max(stats.quantile(q) * 1e3, 1e-6)
            ax.axvline(x, color=color, linestyle="--", label=f"{label} {x:.3g} ms")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"{name} latency (ms)")
    ax.set_ylabel("fraction <=")
    ax.set_title(f"{name} (n={stats.n})", fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower right")


def _ranks(v: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions)."""
    order = np.argsort(v, kind="mergesort")
    ranks = np.empty(len(v))
    ranks[order] = np.arange(len(v), dtype=float)
    for value in np.unique(v):
        ties = v == value
        ranks[ties] = ranks[ties].mean()
    return ranks


def spearman(x: Iterable[float], y: Iterable[float]) -> float:
    """Spearman rank correlation; nan for fewer than two points or a constant side."""
    rx, ry = _ranks(np.asarray(list(x), float)), _ranks(np.asarray(list(y), float))
    if len(rx) < 2 or rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])
