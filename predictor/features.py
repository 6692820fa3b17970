"""Feature rows for the learned models: the op registry's features plus a roofline estimate.

Training and prediction both call `feature_matrix`, so a model can never see a feature computed
differently from the ones it was fitted on (nn-Meter's builder and predictor drifted apart).
The registry (`profilers.ops`) owns the per-family features; this module only adds what needs the
device: the roofline estimate from the device's measured peaks, and log transforms of it; and it
hands the registry the device's thread count, on which ATen's choice of kernel can depend
(`ops.conv_path_features`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from profilers import ops
from profilers.oprecord import OpRecord

# Used only when a device row has no measured peaks; the fallback scale fitted on the device's
# measurements (see model_store) absorbs how wrong these are.
NOMINAL_PEAKS = {"gflops": {"float32": 100.0}, "gbps": 20.0}
_MIN_S = 1e-9  # floor so logs stay finite for ops that move no bytes and do no FLOPs

DEVICE_FEATURES = ("rf_log_roofline_s", "rf_log_compute_s", "rf_log_memory_s",
                   "rf_compute_bound")


def peaks_or_nominal(peaks: dict | None) -> dict:
    """The device's measured peaks (nominal ones when it has none), under both key spellings.

    `measure_peaks` writes "gflops"; an earlier `profilers.ops` read "peak_gflops". Both are
    accepted and filled, so peaks stored by either version work.
    """
    gflops = (peaks or {}).get("gflops") or (peaks or {}).get("peak_gflops")
    gbps = (peaks or {}).get("gbps")
    reorder = (peaks or {}).get("reorder_gbps")
    if not gflops or not gbps:
        gflops, gbps, reorder = NOMINAL_PEAKS["gflops"], NOMINAL_PEAKS["gbps"], None
    if "float32" not in gflops:
        gflops = {**gflops, "float32": max(gflops.values())}
    return {"gflops": gflops, "peak_gflops": gflops, "gbps": float(gbps),
            "reorder_gbps": reorder}


def roofline_s(record: OpRecord, peaks: dict | None) -> float:
    """The roofline time of one op, never below 1 ns (so logs stay finite)."""
    return max(ops.roofline_s(record, peaks_or_nominal(peaks)), _MIN_S)


OP_LEVEL = "op_level"
"""How slow an op runs beside its roofline on this device: the mean over the family model's
training rows of the same op (`op_code`) of log(latency / roofline estimate), left NaN here and
filled by `FamilyModel` (out of fold in training, so a row never sees its own latency). With only
`op_code` to tell them apart, an op with a few configs was priced like its neighbours in CRC
order: softplus at 0.24x its time, division at 2.1x, masked_fill at 0.32x (median over their 7-8
configs, cross-validated; 1 thread)."""

OP_LEVEL_FAMILIES = ("eltwise", "reduce")
"""Where `OP_LEVEL` is a feature. 5-fold CV over the configs of three 10-minute profiles (1 thread
twice, 2 threads), without -> with it: eltwise 8.5/8.2/13.4% -> 7.3/7.2/13.2% MAPE, reductions
16.5/20.6/22.0% -> 14.0/18.1/21.4%; data movement (cat, layout copies, RoIAlign, NMS: one
op's level says little of another shape's) 14.3/16.5/19.8% -> 16.3/17.0/19.3%, so not there."""


def op_code_column(family: str) -> str:
    return f"{family}.op_code"


def feature_names(family: str) -> list[str]:
    """Column order of a family's feature matrix: the registry's, then the device features (and
    `OP_LEVEL` in `OP_LEVEL_FAMILIES`)."""
    names = [*ops.feature_names(family), *DEVICE_FEATURES]
    return [*names, OP_LEVEL] if family in OP_LEVEL_FAMILIES else names


SERIAL_BYTES = ("reorder_bytes",)
"""Path features counting bytes moved before the kernel starts, in series with it (oneDNN's
per-call weight reorder, `ops.conv_path_features`). The roofline the models learn a residual over
adds them at the rate the profile measured that reorder at (`serial_gbps`): overlapped with
nothing, they are not under the max of compute and memory time. Trees do not extrapolate from a
raw feature, and a profile holds few batch-1 convs with big weights (the 21:21 1-thread profile
of 12-06: two over 16 MB). On it, wide_resnet50_2's 1024->1024 3x3 convs on 1x1024x7x7 (37.7 MB
of weights, 16.2 ms alone) were priced at 10.9 ms without the term and 13.8 with it; its conv
sums at 1x224 and 1x160 went from 0.84x and 0.86x its convs alone to 0.89x and 0.95x
(`benchmarks/databases_vs_alone.py`; benchmarks/RESULTS.md, 2026-12-06 midnight). That Xeon
reordered at about its copy bandwidth; the AMD EPYC of 12-07 at 7.7-8.1 GB/s against copies at
20.9 (1 thread), and priced at the copy's rate those convs came to 0.72x their time alone, at the
measured rate 0.92x (2026-12-07 night)."""


def serial_gbps(peaks: dict) -> float:
    """The rate `SERIAL_BYTES` move at: oneDNN's measured weight reorder
    (`fingerprint.measure_reorder_gbps`), else (older profiles, a torch without it) the copy's."""
    return peaks.get("reorder_gbps") or peaks["gbps"]


def serial_bytes(values: dict, family: str) -> float:
    """The `SERIAL_BYTES` of one feature vector (0 where unknown or not on the family)."""
    total = (values.get(f"{family}.{name}", math.nan) for name in SERIAL_BYTES)
    return sum(v for v in total if math.isfinite(v))


def feature_row(record: OpRecord, family: str, peaks: dict | None,
                threads: int | None = None) -> list[float]:
    peaks = peaks_or_nominal(peaks)
    values = ops.features(record, peaks, threads)
    row = [float(values.get(name, math.nan)) for name in ops.feature_names(family)]
    compute_s, memory_s = ops.roofline_parts(record, peaks)
    serial_s = serial_bytes(values, family) / (serial_gbps(peaks) * 1e9)
    row += [math.log(max(compute_s, memory_s, _MIN_S) + serial_s), math.log(max(compute_s, _MIN_S)),
            math.log(max(memory_s, _MIN_S)), float(compute_s >= memory_s)]
    if family in OP_LEVEL_FAMILIES:
        row.append(math.nan)  # OP_LEVEL: the family model's to fill
    return row


def feature_matrix(records: Sequence[OpRecord], family: str, peaks: dict | None,
                   threads: int | None = None) -> np.ndarray:
    """One row per record in `feature_names(family)` order; missing features are NaN.

    `threads`: the device's thread count (None for a GPU, or where unknown)."""
    width = len(feature_names(family))
    if not records:
        return np.empty((0, width))
    return np.array([feature_row(r, family, peaks, threads) for r in records], dtype=np.float64)
