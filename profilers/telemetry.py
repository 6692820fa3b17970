"""NVIDIA GPU telemetry through NVML: clocks, throttling, utilisation, memory, power.

A GPU that throttles mid-profile times its kernels slower than it will run them in production,
so profilers read telemetry before and after a run and `compare` turns the difference into
warnings. The NVML module is injectable (`nvml=`), so this is tested with a fake one; every
query NVML does not support on a device becomes a None field instead of a crash.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from profilers.errors import DeviceError

# NVML clocks-event (formerly "throttle") reason bits; the values are part of NVML's ABI
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# idle, application clocks, sync boost and display clocks lower clocks by request, not by limit
THROTTLING = {
    "sw_power_cap": "power cap",
    "hw_slowdown": "hardware slowdown",
    "sw_thermal_slowdown": "thermal throttling",
    "hw_thermal_slowdown": "thermal throttling",
    "hw_power_brake_slowdown": "power brake",
}
CLOCK_DROP_WARN = 0.05  # relative SM-clock drop during a run worth a warning
BUSY_BEFORE_PCT = 10  # utilisation before our run that suggests another process on the GPU

_initialized: list[Any] = []  # NVML modules (or fakes) already nvmlInit()-ed in this process


@dataclass
class GpuTelemetry:
    """One snapshot of a GPU's state; None where NVML could not tell."""

    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    throttle_reasons: list[str] = field(default_factory=list)
    gpu_util_pct: int | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None

    @property
    def throttling_reasons(self) -> list[str]:
        """The reasons that are a limit being hit, not a requested clock change."""
        return [r for r in self.throttle_reasons if r in THROTTLING]

    @property
    def throttled(self) -> bool:
        return bool(self.throttling_reasons)

    def to_json(self) -> dict:
        return asdict(self)


def decode_reasons(mask: int) -> list[str]:
    """Names of the set bits of an NVML clocks-event reason mask; unknown bits kept as hex."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"unknown_{unknown:#x}")
    return names


def read_telemetry(index: int = 0, nvml: Any = None) -> GpuTelemetry:
    """A snapshot of GPU `index` (NVML numbering); `nvml` defaults to the pynvml module."""
    nvml = nvml if nvml is not None else _pynvml()
    _ensure_init(nvml)
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except _nvml_error(nvml) as exc:
        raise DeviceError(f"no NVIDIA GPU with NVML index {index}: {exc}") from None

    def ask(query: Callable[[], Any]) -> Any:
        try:
            return query()
        except (_nvml_error(nvml), AttributeError):  # unsupported here, or an older NVML
            return None

    sm_const, mem_const = getattr(nvml, "NVML_CLOCK_SM", 1), getattr(nvml, "NVML_CLOCK_MEM", 2)
    memory = ask(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    power_mw = ask(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    limit_mw = ask(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    mask = ask(lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
    if mask is None:  # renamed in NVML 12.2; older drivers only know the throttle name
        mask = ask(lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
    return GpuTelemetry(
        sm_clock_mhz=ask(lambda: nvml.nvmlDeviceGetClockInfo(handle, sm_const)),
        mem_clock_mhz=ask(lambda: nvml.nvmlDeviceGetClockInfo(handle, mem_const)),
        max_sm_clock_mhz=ask(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, sm_const)),
        throttle_reasons=decode_reasons(mask) if mask is not None else [],
        gpu_util_pct=ask(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
        mem_used_bytes=memory.used if memory is not None else None,
        mem_total_bytes=memory.total if memory is not None else None,
        temperature_c=ask(
            lambda: nvml.nvmlDeviceGetTemperature(handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
        ),
        power_w=power_mw / 1000.0 if power_mw is not None else None,
        power_limit_w=limit_mw / 1000.0 if limit_mw is not None else None,
    )


def _pynvml() -> Any:
    import pynvml  # lazily: CPU-only code paths never load the NVML library

    return pynvml


def _nvml_error(nvml: Any) -> type[BaseException]:
    return getattr(nvml, "NVMLError", Exception)


def _ensure_init(nvml: Any) -> None:
    if any(done is nvml for done in _initialized):
        return
    try:
        nvml.nvmlInit()
    except _nvml_error(nvml) as exc:
        raise DeviceError(
            f"cannot read GPU telemetry: NVML is unavailable ({exc}); is the NVIDIA driver loaded?"
        ) from None
    _initialized.append(nvml)


def compare(before: GpuTelemetry, after: GpuTelemetry) -> list[str]:
    """Warnings about what changed on the GPU between two snapshots around a run."""
    warnings = []
    why = _reasons_text(after)
    if before.throttled:
        warnings.append(f"GPU was already throttled before the run ({_reasons_text(before)})")
    # clocks fall by request when the GPU goes idle after the run: not a warning
    idle_after = "gpu_idle" in after.throttle_reasons and not after.throttled
    dropped = not idle_after and _clock_dropped(before.sm_clock_mhz, after.sm_clock_mhz)
    if dropped:
        suffix = f" ({why})" if why else ""
        warnings.append(
            f"SM clock dropped from {before.sm_clock_mhz} to {after.sm_clock_mhz} MHz "
            f"during the run{suffix}"
        )
    elif after.throttled and not before.throttled:
        warnings.append(f"GPU started throttling during the run ({why})")
    if before.gpu_util_pct is not None and before.gpu_util_pct >= BUSY_BEFORE_PCT:
        warnings.append(
            f"GPU was {before.gpu_util_pct}% busy before the run; another process may be "
            "using it and skew the timings"
        )
    return warnings


def _clock_dropped(before_mhz: int | None, after_mhz: int | None) -> bool:
    if not before_mhz or after_mhz is None:
        return False
    return (before_mhz - after_mhz) / before_mhz > CLOCK_DROP_WARN


def _reasons_text(snapshot: GpuTelemetry) -> str:
    labels = [THROTTLING[r] for r in snapshot.throttling_reasons]
    return ", ".join(dict.fromkeys(labels))  # dedupe, keep order
