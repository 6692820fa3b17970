"""Diagnosis before levers: where the time goes and what bounds it (DESIGN.md's table).

| symptom                                   | bottleneck        | first fix                         |
| compute near its ceiling, queue growing   | compute           | pruning, smaller model, quantize  |
| device idle, latency high                 | transfer/overhead | batch inputs, fewer/fused ops     |
| spiky p99 under load                      | queueing          | dynamic batching, more workers    |
| high memory traffic, slow steps           | memory bandwidth  | lower precision, smaller batches  |
| CPU slow path on subnormal values         | subnormal values  | flush subnormals to zero          |

Signals: the predicted share of time per op family; the roofline position of every timed op on
the device's measured peaks (compute- vs memory-bound, weighted by roofline time); how much of
the predicted time the roofline explains (low: the device idles between small ops); with a
request rate, the simulated queue against the compute time; on GPUs, the host-to-device copy of
the inputs when the profile has a copy bandwidth; on CPUs, the slow path priced for the subnormal
values the model computes (`Predictor.add_subnormals`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from predictor.e2e import CORRECTION_TERMS, SUBNORMAL_TERM, Prediction
from predictor.features import peaks_or_nominal
from profilers import ops
from profilers.oprecord import OpRecord

FIRST_FIX = {
    "compute": ["prune", "smaller_model", "int8_dynamic", "precision"],
    "memory bandwidth": ["precision", "int8_dynamic", "channels_last", "input_size"],
    "queueing": ["dynamic_batching", "threads", "prune", "precision"],
    "data transfer": ["batch", "dynamic_batching", "input_size"],
    "overhead": ["batch", "dynamic_batching", "channels_last", "threads"],
    "subnormal values": ["flush_subnormals"],
}
# Below this share of the predicted time explained by the roofline, the device mostly waits
# between ops (dispatch overhead, small ops) rather than computing or moving data.
IDLE_EFFICIENCY = 0.05
QUEUE_UTILIZATION = 0.8
# From this share of the predicted time on the slow path for subnormal values, it bounds the model
# before its ops do (swin_t at 1x3x160x160 and 2 threads on the Xeon: 51 of 145 ms, 35%)
SUBNORMAL_SHARE = 0.25


@dataclass
class Diagnosis:
    bottleneck: str
    why: str
    family_share: dict[str, float]  # share of the predicted p50, by op family
    compute_bound_share: float  # of the ops' roofline time, in compute-bound ops
    roofline_efficiency: float  # roofline time / predicted time
    intensity_flops_per_byte: float
    ridge_flops_per_byte: float
    queue: dict | None = None
    transfer: dict | None = None

    @property
    def first_fix(self) -> list[str]:
        return FIRST_FIX[self.bottleneck]

    def to_json(self) -> dict:
        return {**asdict(self), "first_fix": self.first_fix}


def diagnose(prediction: Prediction, records: Sequence[OpRecord], peaks: dict | None, *,
             device_kind: str = "cpu", input_bytes: float = 0.0,
             queue: dict | None = None) -> Diagnosis:
    """The dominant bottleneck of a predicted model, and why, from the signals above.

    `queue`, with a rate: {"utilization", "queue_ms", "compute_ms", "percentile"} from the
    simulator, and optionally "rate" and "capacity_rps" (beyond it: no steady queue at all).
    """
    peaks = peaks_or_nominal(peaks)
    roof_s = bound_compute_s = flops = moved = 0.0
    for record in records:
        info = ops.lookup(record.op)
        if info is not None and ops.is_free(record, info):
            continue
        c, m = ops.roofline_parts(record, peaks)
        roof_s += max(c, m)
        bound_compute_s += c if c >= m else 0.0
        flops += ops.flops_of(record, info or ops.fallback_info())
        moved += ops.bytes_of(record, info or ops.fallback_info())
    total_ms = prediction.p50_ms
    shares = {k: v / total_ms for k, v in prediction.per_family.items()} if total_ms > 0 else {}
    ridge = peaks["gflops"].get(records[0].dtype if records else "float32",
                                peaks["gflops"]["float32"]) / peaks["gbps"]
    d = Diagnosis(
        bottleneck="compute", why="", family_share=shares,
        compute_bound_share=bound_compute_s / roof_s if roof_s > 0 else 0.0,
        roofline_efficiency=roof_s * 1e3 / total_ms if total_ms > 0 else 0.0,
        intensity_flops_per_byte=flops / moved if moved > 0 else 0.0,
        ridge_flops_per_byte=ridge, queue=queue,
        transfer=_transfer(device_kind, input_bytes, peaks, total_ms))
    d.bottleneck, d.why = _verdict(d)
    return d


def _transfer(kind: str, input_bytes: float, peaks: dict, total_ms: float) -> dict | None:
    if kind == "cpu":
        return None
    gbps = peaks.get("h2d_gbps")
    if not gbps:
        return {"h2d_ms": None, "share": None,
                "note": "the profile has no host-to-device bandwidth; measure it with hwlat bench"}
    h2d_ms = input_bytes / (gbps * 1e9) * 1e3
    return {"h2d_ms": h2d_ms, "share": h2d_ms / (h2d_ms + total_ms)}


def _top_family(d: Diagnosis) -> str:
    timed = {k: v for k, v in d.family_share.items()
             if k not in CORRECTION_TERMS and k != SUBNORMAL_TERM}
    if not timed:
        return "no op family"
    name = max(timed, key=timed.get)
    return f"{name} ops take {timed[name]:.0%} of the predicted time"


def _verdict(d: Diagnosis) -> tuple[str, str]:
    q = d.queue
    if q and q.get("capacity_rps") is not None and q["rate"] >= q["capacity_rps"]:
        return "queueing", (
            f"{q['rate']:g} req/s is more than the deployment can serve "
            f"({q['capacity_rps']:.1f} req/s predicted): the queue grows without bound")
    if q and (q["utilization"] >= QUEUE_UTILIZATION or q["queue_ms"] > q["compute_ms"]):
        return "queueing", (
            f"at this rate the worker is {q['utilization']:.0%} busy and simulated queue "
            f"{q['percentile']} is {q['queue_ms']:.1f} ms vs {q['compute_ms']:.1f} ms compute")
    t = d.transfer
    if t and t.get("share") and t["share"] > 0.3:
        return "data transfer", (f"copying the inputs to the device takes {t['share']:.0%} of "
                                 "the request")
    slow = d.family_share.get(SUBNORMAL_TERM, 0.0)
    if slow >= SUBNORMAL_SHARE:
        return "subnormal values", (f"the CPU's slow path on the subnormal values the model "
                                    f"computes takes {slow:.0%} of the predicted time")
    overhead = d.family_share.get("op_overhead", 0.0)
    if d.roofline_efficiency < IDLE_EFFICIENCY and overhead > 0.3:
        return "overhead", (f"the roofline explains only {d.roofline_efficiency:.0%} of the "
                            f"time and per-op overhead {overhead:.0%}: the device idles "
                            "between many small ops")
    position = (f"arithmetic intensity {d.intensity_flops_per_byte:.0f} FLOP/B vs ridge "
                f"{d.ridge_flops_per_byte:.0f} FLOP/B; {_top_family(d)}")
    if d.compute_bound_share >= 0.5:
        return "compute", (f"{d.compute_bound_share:.0%} of the roofline time is in "
                           f"compute-bound ops ({position})")
    return "memory bandwidth", (f"{1 - d.compute_bound_share:.0%} of the roofline time is in "
                                f"memory-bound ops ({position})")
