"""GPU telemetry against a fake NVML module, so it runs on any machine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from profilers import telemetry
from profilers.errors import DeviceError
from profilers.telemetry import GpuTelemetry, compare, decode_reasons, read_telemetry


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """The subset of pynvml that telemetry uses, with settable answers."""

    NVMLError = FakeNVMLError
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, reasons: int = 0, sm_mhz: int = 1980, fail_init: bool = False) -> None:
        self.reasons = reasons
        self.sm_mhz = sm_mhz
        self.fail_init = fail_init
        self.init_calls = 0

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.fail_init:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        if index != 0:
            raise FakeNVMLError("Invalid Argument")
        return "gpu0"

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return {1: self.sm_mhz, 2: 2619}[clock]

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return {1: 1980, 2: 2619}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=3, memory=1)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=141 << 30, used=1 << 30, free=140 << 30)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 41

    def nvmlDeviceGetPowerUsage(self, handle):
        return 123_456  # milliwatts

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000


class OldDriverNVML(FakeNVML):
    """Only the pre-12.2 'throttle' name; power readings unsupported on this board."""

    def __getattribute__(self, name):
        if name == "nvmlDeviceGetCurrentClocksEventReasons":
            raise AttributeError(name)
        return super().__getattribute__(name)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self.reasons

    def nvmlDeviceGetPowerUsage(self, handle):
        raise FakeNVMLError("Not Supported")


def test_decode_reason_bits():
    assert decode_reasons(0) == []
    assert decode_reasons(0x1) == ["gpu_idle"]
    assert decode_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_reasons(0x2 | 0x10000) == ["applications_clocks_setting", "unknown_0x10000"]


def test_read_telemetry_fills_every_field():
    t = read_telemetry(0, nvml=FakeNVML(reasons=0x1))
    assert t.sm_clock_mhz == 1980 and t.mem_clock_mhz == 2619 and t.max_sm_clock_mhz == 1980
    assert t.throttle_reasons == ["gpu_idle"] and not t.throttled
    assert t.gpu_util_pct == 3
    assert t.mem_used_bytes == 1 << 30 and t.mem_total_bytes == 141 << 30
    assert t.temperature_c == 41
    assert t.power_w == pytest.approx(123.456) and t.power_limit_w == 700.0
    assert t.to_json()["throttle_reasons"] == ["gpu_idle"]


@pytest.mark.parametrize(
    ("mask", "throttled"),
    [(0x0, False), (0x1, False), (0x2, False), (0x10, False), (0x100, False),
     (0x4, True), (0x8, True), (0x20, True), (0x40, True), (0x80, True), (0x1 | 0x20, True)],
)  # fmt: skip
def test_throttled_only_for_real_limits(mask, throttled):
    assert read_telemetry(0, nvml=FakeNVML(reasons=mask)).throttled is throttled


def test_missing_functions_and_unsupported_queries_become_none():
    t = read_telemetry(0, nvml=OldDriverNVML(reasons=0x20))
    assert t.throttle_reasons == ["sw_thermal_slowdown"] and t.throttled
    assert t.power_w is None and t.power_limit_w == 700.0
    bare = SimpleNamespace(
        NVMLError=FakeNVMLError, nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: "h"
    )
    empty = read_telemetry(0, nvml=bare)
    assert empty == GpuTelemetry()
    assert not empty.throttled and compare(empty, empty) == []


def test_init_happens_once_and_failures_are_device_errors():
    nvml = FakeNVML()
    read_telemetry(0, nvml=nvml)
    read_telemetry(0, nvml=nvml)
    assert nvml.init_calls == 1
    with pytest.raises(DeviceError, match="NVML is unavailable"):
        read_telemetry(0, nvml=FakeNVML(fail_init=True))
    with pytest.raises(DeviceError, match="index 3"):
        read_telemetry(3, nvml=nvml)


def test_compare_warns_about_a_thermal_clock_drop():
    before = read_telemetry(0, nvml=FakeNVML())
    after = read_telemetry(0, nvml=FakeNVML(reasons=0x40, sm_mhz=1410))
    assert compare(before, after) == [
        "SM clock dropped from 1980 to 1410 MHz during the run (thermal throttling)"
    ]


def test_compare_is_quiet_for_a_steady_gpu_and_an_idle_ramp_down():
    before = read_telemetry(0, nvml=FakeNVML())
    assert compare(before, before) == []
    idle_after = read_telemetry(0, nvml=FakeNVML(reasons=0x1, sm_mhz=345))
    assert compare(before, idle_after) == []


def test_compare_reports_throttling_and_a_busy_gpu():
    busy = GpuTelemetry(sm_clock_mhz=1980, gpu_util_pct=87)
    capped = GpuTelemetry(sm_clock_mhz=1960, throttle_reasons=["sw_power_cap"])
    warnings = compare(busy, capped)
    assert warnings[0] == "GPU started throttling during the run (power cap)"
    assert "87% busy before the run" in warnings[1]
    already = compare(capped, capped)
    assert already == ["GPU was already throttled before the run (power cap)"]


def test_default_nvml_is_pynvml(monkeypatch):
    sentinel = FakeNVML()
    monkeypatch.setattr(telemetry, "_pynvml", lambda: sentinel)
    assert read_telemetry().sm_clock_mhz == 1980
    assert sentinel.init_calls == 1
