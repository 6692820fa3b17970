"""Who is this device? A stable identity for a CPU box or an NVIDIA GPU, and its peaks.

A kernel-database profile belongs to a `device_id`. The id hashes only what identifies the
hardware and how it is used (model, cores, ISA, caches, GPU, timing threads), never library
versions: upgrading torch keeps the id, while the versions are still recorded next to every
measurement. Threads are part of a CPU id because a profile at 1 thread predicts nothing about
2 threads.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from profilers import allocator
from profilers.clocks import parse_device
from profilers.errors import DeviceError
from profilers.timer import CacheFlusher, Measurement, default_threads, measure, thread_count

CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
"""CPU flags of native bf16 arithmetic (x86 and aarch64); without one, bf16 is emulated."""

# CPU features that change which kernels torch/oneDNN/MKL pick (x86 flags and aarch64 Features)
ISA_FEATURES = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "asimdhp",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
)
TORCH_CAPABILITY_PREFIX = "torch:"  # marks the one software-chosen ISA entry (not hashed)
_CACHE_NAMES = {
    ("1", "Data"): "l1d",
    ("1", "Instruction"): "l1i",
    ("2", "Unified"): "l2",
    ("3", "Unified"): "l3",
}
NO_GPU_MESSAGE = (
    "no NVIDIA GPU visible on this machine; run on the GPU machine (check nvidia-smi and "
    "CUDA_VISIBLE_DEVICES) or use device 'cpu'"
)


@dataclass(frozen=True, eq=True)
class DeviceFingerprint:
    """The hardware identity of a device plus the software versions measured on it."""

    kind: str  # "cpu" | "cuda"
    model: str  # CPU model name or GPU name
    cores: dict  # {"physical": int, "logical": int} of the host (plus "sm" on GPUs)
    threads: int  # torch intra-op threads used for timing
    isa: tuple[str, ...]  # CPU feature flags, or the GPU's compute capability "sm_90"
    caches: dict  # bytes per instance: l1d, l1i, l2, l3 (GPU: l2)
    versions: dict  # library versions; recorded, not part of the id
    gpu: dict | None = None  # NVML/torch facts about the GPU
    allocator: str = allocator.SYSTEM  # profilers.allocator policy the timings were taken under

    @property
    def device_id(self) -> str:
        """A slug a human can read plus a short hash of the identifying fields."""
        digest = hashlib.sha256(json.dumps(self._identity(), sort_keys=True).encode()).hexdigest()[
            :8
        ]
        if self.kind == "cpu":
            return (
                f"cpu-{_slug(self.model)}-{self.cores.get('physical', 0)}c-t{self.threads}-{digest}"
            )
        return f"cuda-{_slug(self.model)}-{digest}"

    def _identity(self) -> dict:
        isa = [f for f in self.isa if not f.startswith(TORCH_CAPABILITY_PREFIX)]
        ident = {
            "kind": self.kind,
            "model": self.model,
            "cores": self.cores,
            "isa": isa,
            "caches": self.caches,
        }
        if self.kind == "cpu":
            ident["threads"] = self.threads
            if self.allocator != allocator.SYSTEM:  # older fingerprints keep their id
                ident["allocator"] = self.allocator
        if self.gpu is not None:
            ident["gpu"] = {k: self.gpu.get(k) for k in ("name", "memory_total_bytes", "sm_count")}
        return ident

    @property
    def l2_bytes(self) -> int | None:
        """L2 per core on CPUs, the whole L2 on GPUs: the natural cache-flush size."""
        return self.caches.get("l2")

    def __hash__(self) -> int:
        return hash((self.device_id, json.dumps(self.versions, sort_keys=True)))

    def to_json(self) -> dict:
        d = asdict(self)
        d["isa"] = list(self.isa)
        d["device_id"] = self.device_id
        return d

    @classmethod
    def from_json(cls, d: dict) -> DeviceFingerprint:
        return cls(
            kind=d["kind"],
            model=d["model"],
            cores=dict(d["cores"]),
            threads=int(d["threads"]),
            isa=tuple(d["isa"]),
            caches=dict(d["caches"]),
            versions=dict(d["versions"]),
            gpu=dict(d["gpu"]) if d.get("gpu") is not None else None,
            allocator=d.get("allocator", allocator.SYSTEM),
        )


def _slug(text: str) -> str:
    text = re.sub(r"\((r|tm|c)\)", " ", text.lower())
    text = re.sub(r"@.*$", " ", text)  # "@ 2.10GHz": the base clock is not the name
    text = re.sub(r"\b(cpu|processor|core)\b", " ", text)
    words = re.findall(r"[a-z0-9]+", text)
    return "-".join(words)[:40].strip("-") or "unknown"


def fingerprint(device: str = "cpu", threads: int | None = None) -> DeviceFingerprint:
    """The fingerprint of `device` on this machine, timing at `threads` (default: torch's)."""
    kind, index = parse_device(device)
    threads = threads or default_threads()
    if kind == "cpu":
        return _cpu_fingerprint(threads)
    return _cuda_fingerprint(index, threads)


def _cpu_fingerprint(threads: int) -> DeviceFingerprint:
    info = _cpuinfo()
    capability = torch.backends.cpu.get_cpu_capability()
    isa = tuple(f for f in ISA_FEATURES if f in info["flags"])
    return DeviceFingerprint(
        kind="cpu",
        model=info["model"],
        cores=_core_counts(),
        threads=threads,
        isa=isa + (f"{TORCH_CAPABILITY_PREFIX}{capability.lower()}",),
        caches=cpu_caches(),
        versions=library_versions(cuda=False),
        allocator=allocator.apply(),
    )


def _cpuinfo() -> dict:
    """Model name and feature flags from /proc/cpuinfo (platform module where there is none)."""
    model, flags = "", set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return {"model": model or platform.processor() or platform.machine(), "flags": flags}


def _core_counts() -> dict:
    """Logical CPUs this process may run on, and the physical cores under them."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    logical = len(allowed) or os.cpu_count() or 1
    cores = set()
    for cpu in allowed:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((_read(topo / "physical_package_id"), _read(topo / "core_id")))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return {"physical": len(cores) or logical, "logical": logical}


def _read(path: Path) -> str:
    return path.read_text().strip()


def cpu_caches() -> dict:
    """Bytes per cache instance (l1d, l1i, l2, l3) from sysfs, else from `lscpu -C`."""
    caches = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            name = _CACHE_NAMES.get((_read(index / "level"), _read(index / "type")))
            size = _parse_size(_read(index / "size"))
        except (OSError, ValueError):
            continue
        if name:
            caches[name] = size
    return caches or _lscpu_caches()


def _parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)\s*([KMG]?)i?B?", text.strip(), re.IGNORECASE)
    if not match:
        raise ValueError(f"unreadable cache size {text!r}")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2).upper()]
    return int(match.group(1)) * scale


def _lscpu_caches() -> dict:
    try:
        out = subprocess.run(
            ["lscpu", "-C=NAME,ONE-SIZE", "-B"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    caches = {}
    for line in out.splitlines()[1:]:
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            caches[parts[0].lower()] = int(parts[1])
    return caches


def library_versions(cuda: bool) -> dict:
    """Versions of everything that changes kernel choice or our own numbers."""
    config = torch.__config__.show()
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "mkl": _search(r"Math Kernel Library Version ([\d.]+)", config)
        if torch.backends.mkl.is_available()
        else None,
        "onednn": _search(r"(?:MKL-DNN|oneDNN) (v[\d.]+)", config)
        if torch.backends.mkldnn.is_available()
        else None,
        "cuda": torch.version.cuda,
        "cudnn": _cudnn_version(config, runtime=cuda),
    }
    for dist in ("numpy", "lightgbm", "hwlat"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def _cudnn_version(config: str, runtime: bool) -> str | None:
    """The loaded cuDNN on GPU machines; the build-time one elsewhere (no CUDA library loads)."""
    if not runtime:
        return _search(r"CUDNN_VERSION=([\d.]+)", config)
    number = torch.backends.cudnn.version()  # 92400 for 9.24.0, but 8902 for 8.9.2
    if number is None:
        return None
    major_scale = 10000 if number >= 10000 else 1000
    return f"{number // major_scale}.{number % major_scale // 100}.{number % 100}"


def _search(pattern: str, text: str) -> str | None:
    match = re.search(pattern, text)
    return match.group(1) if match else None


def _cuda_fingerprint(index: int, threads: int) -> DeviceFingerprint:
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        raise DeviceError(NO_GPU_MESSAGE)
    props = torch.cuda.get_device_properties(index)
    gpu = {
        "name": props.name,
        "memory_total_bytes": int(props.total_memory),
        "sm_count": int(props.multi_processor_count),
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        "compute_capability": f"{props.major}.{props.minor}",
    }
    gpu.update(_nvml_facts(props))
    return DeviceFingerprint(
        kind="cuda",
        model=gpu["name"],
        cores={**_core_counts(), "sm": gpu["sm_count"]},
        threads=threads,
        isa=(f"sm_{props.major}{props.minor}",),
        caches={"l2": gpu["l2_bytes"]} if gpu["l2_bytes"] else {},
        versions=library_versions(cuda=True),
        allocator=allocator.apply(),
        gpu=gpu,
    )


def _nvml_facts(props: Any) -> dict:
    """Driver, clocks and power limit from NVML; None for what NVML cannot tell."""
    facts = dict.fromkeys(
        ("driver_version", "cuda_version", "max_sm_clock_mhz", "max_mem_clock_mhz", "power_limit_w")
    )
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = _nvml_handle(pynvml, props)
    except Exception:  # no NVML library, or no handle for this GPU: torch's facts suffice
        return facts
    queries = {
        "driver_version": lambda: _text(pynvml.nvmlSystemGetDriverVersion()),
        "cuda_version": lambda: _cuda_version_text(pynvml.nvmlSystemGetCudaDriverVersion()),
        "max_sm_clock_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "max_mem_clock_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(
            handle, pynvml.NVML_CLOCK_MEM
        ),
        "power_limit_w": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
    }
    for key, query in queries.items():
        try:
            facts[key] = query()
        except pynvml.NVMLError:
            pass
    return facts


def _nvml_handle(pynvml: Any, props: Any) -> Any:
    # torch and NVML may number GPUs differently (CUDA_VISIBLE_DEVICES): match by UUID or PCI id
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        raise LookupError("torch exposes neither the GPU's UUID nor its PCI bus id")
    domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
    return pynvml.nvmlDeviceGetHandleByPciBusId(f"{domain:08x}:{bus:02x}:{device:02x}.0")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _cuda_version_text(value: int) -> str:
    return f"{value // 1000}.{value % 1000 // 10}"


def measure_peaks(
    device: str = "cpu",
    threads: int | None = None,
    dtypes: tuple[str, ...] = ("float32",),
    budget_s: float = 5.0,
) -> dict:
    """Achievable matmul GFLOP/s per dtype, copy GB/s (read + write), weight-streaming GB/s, the
    rate a batched product reads evicted weights (`measure_batched_gbps`, ~2 s whatever the
    budget: each timing follows a write far beyond the LLC) and the rate oneDNN reorders a conv's
    evicted weights (`measure_reorder_gbps`, ~1 s more), as medians.

    Matrix sizes grow until one matmul is long enough to time well within the budget; the copy
    and the stream are far beyond the last-level cache so they measure memory, not cache,
    bandwidth. The stream is a matrix-vector product (a batch-1 linear layer) reading its weights
    once: how fast an op larger than the LLC streams them, which a copy can overstate. On the
    2-vCPU dev VM at 2 threads a copy moved 24.5-31.7 GB/s and the stream 18.5-19.0 in three
    profiles of 12-04 (1 thread: 19.6-21.4 and 18.4-21.9). The predictor floors the weights of an
    op beyond the LLC at the stream (`Predictor._memory_floor_s`); one stream timed in a slow
    spell read 12.4 GB/s (12-03), so every profile run times it again (`measure_stream_gbps`)
    and keeps the fastest.
    """
    from profilers.subnormals import measure_cost

    kind, index = parse_device(device)
    if kind == "cuda" and (not torch.cuda.is_available() or index >= torch.cuda.device_count()):
        raise DeviceError(NO_GPU_MESSAGE)
    dev = "cpu" if kind == "cpu" else f"cuda:{index}"
    supported = [d for d in dtypes if _dtype_supported(d, dev)]
    share_s = budget_s * 0.75 / max(len(supported), 1)
    with thread_count(threads if kind == "cpu" else None) as used_threads:
        matmuls = {d: _matmul_gflops(getattr(torch, d), dev, share_s) for d in supported}
        copy_gbps, copy = _copy_gbps(dev, budget_s * 0.125)
        stream_gbps, stream = _stream_gbps(dev, budget_s * 0.125)
        batched_gbps = measure_batched_gbps(dev, None, budget_s * 0.125)
        reorder_gbps = measure_reorder_gbps(dev, None, budget_s * 0.125)
        llc_bytes = llc_from_sweep(_read_sweep(dev, budget_s * 0.125)) if kind == "cpu" else None
        # what a subnormal value costs this CPU (GPUs compute them at full speed): ~0.2 s more
        subnormal = measure_cost(None) if kind == "cpu" else None
    noise = {d: round(m.noise, 3) for d, (_, m) in matmuls.items()}
    return {
        "device": dev,
        "threads": used_threads,
        "gflops": {d: gflops for d, (gflops, _) in matmuls.items()},
        "skipped_dtypes": [d for d in dtypes if d not in supported],
        "gbps": copy_gbps,
        "stream_gbps": stream_gbps,
        "batched_gbps": batched_gbps,  # cold weights read by a linear at several rows (a CPU's)
        "reorder_gbps": reorder_gbps,  # oneDNN's per-call conv weight reorder (a CPU's)
        "llc_bytes": llc_bytes,  # the largest read still served faster than memory (a CPU's)
        "subnormal": subnormal,  # profilers.subnormals.measure_cost (a CPU's)
        # IQR/median of each measurement
        "noise": {**noise, "copy": round(copy.noise, 3), "stream": round(stream.noise, 3)},
        "method": "median of timed square matmuls (2*n^3 flops); "
        "median of a tensor copy far beyond L3 (read + write bytes); "
        "median of a matrix-vector product with weights far beyond L3 (weight bytes); "
        "median of a product at BATCHED_ROWS rows with its weights evicted (weight bytes); "
        "median of oneDNN's reorder of REORDER_WEIGHTS evicted conv weights (read + write bytes); "
        "the largest buffer a sum still reads at LLC_SPEEDUP x the speed beyond L3",
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _dtype_supported(name: str, dev: str) -> bool:
    """Whether a dtype has native matmul support (emulated bf16 would understate the peak)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    if dev != "cpu":
        return dtype != torch.bfloat16 or torch.cuda.is_bf16_supported()
    flags = _cpuinfo()["flags"]
    if dtype == torch.bfloat16:
        return bool(flags & CPU_BF16_FLAGS)
    if dtype == torch.float16:
        return bool(flags & {"avx512_fp16", "amx_fp16", "asimdhp"})
    return dtype in (torch.float32, torch.float64)


def _matmul_gflops(dtype: torch.dtype, dev: str, share_s: float) -> tuple[float, Measurement]:
    started = time.perf_counter()
    n = _matmul_size(dtype, dev, target_s=min(max(share_s / 20, 2e-3), 0.1))
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    left_s = share_s - (time.perf_counter() - started)  # sizing came out of the same share
    m = measure(
        lambda: torch.mm(a, b), warmup=1, min_reps=3, max_reps=50, max_time_s=left_s, device=dev
    )
    return 2.0 * n**3 / m.median_s / 1e9, m


def _matmul_size(dtype: torch.dtype, dev: str, target_s: float) -> int:
    """Grow n (multiples of 64) until one n x n matmul takes about `target_s`."""
    n, limit = 256, (4096 if dev == "cpu" else 16384)
    while True:
        a = torch.randn(n, n, device=dev).to(dtype)
        m = measure(lambda a=a: torch.mm(a, a), warmup=1, min_reps=1, max_reps=1, device=dev)
        if m.median_s >= target_s or n >= limit:
            return n
        scale = min((target_s / max(m.median_s, 1e-9)) ** (1 / 3), 4.0)
        n = min(limit, max(n + 64, int(n * scale) // 64 * 64))


def _beyond_llc_bytes(dev: str) -> int:
    l3 = cpu_caches().get("l3", 0) if dev == "cpu" else 0
    return min(max(256 << 20, 4 * l3), 1 << 30)


def _copy_gbps(dev: str, share_s: float) -> tuple[float, Measurement]:
    nbytes = _beyond_llc_bytes(dev)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    m = measure(
        lambda: dst.copy_(src), warmup=1, min_reps=3, max_reps=30, max_time_s=share_s, device=dev
    )
    return 2.0 * nbytes / m.median_s / 1e9, m


def measure_stream_gbps(device: str = "cpu", threads: int | None = None,
                        budget_s: float = 0.6) -> float | None:
    """The weight-streaming GB/s of `measure_peaks`, timed once more (None on a GPU, whose
    peaks do not use it)."""
    kind, _ = parse_device(device)
    if kind != "cpu":
        return None
    with thread_count(threads):
        return _stream_gbps("cpu", budget_s)[0]


LLC_SPEEDUP = 1.4
"""How much faster than memory a read must be to count as served by the cache (`llc_from_sweep`).
On the 2-vCPU Intel Xeon of 12-05 (lscpu: 480 MiB of L3) a sum read 100-115 GB/s up to 1 MiB,
26.5-29 GB/s from 4 to 64 MiB and 13.7-14.6 GB/s from 96 MiB on: what a VM gets of a shared LLC
is not what lscpu says. Its ops beyond that took their weights from memory inside a model
(efficientnet_v2_s' 1x1 convs with 1.5 MB of weights: 0.35 ms in the model, 0.196 ms alone)."""


def _read_sweep(dev: str, share_s: float) -> list[tuple[int, float]]:
    """(bytes, GB/s) of summing the first 1 MiB, 1.5 MiB, 2 MiB, 3 MiB, ... of one buffer far
    beyond the LLC, up to the first size that reads under `LLC_SPEEDUP` x the whole buffer's
    speed, and then the whole buffer. Each the median of a few reads after one that brings it
    into cache."""
    beyond = _beyond_llc_bytes(dev)
    buffer = torch.ones(beyond // 4, dtype=torch.float32, device=dev)

    def gbps(nbytes: int) -> float:
        x = buffer[: nbytes // 4]
        m = measure(lambda: x.sum(), warmup=1, min_reps=3, max_reps=9, max_time_s=share_s / 12,
                    device=dev)
        return nbytes / m.median_s / 1e9

    memory = gbps(beyond)
    points, n = [], 1 << 20
    while n < beyond:
        for nbytes in (n, n * 3 // 2):
            points.append((nbytes, gbps(nbytes)))
            if points[-1][1] < LLC_SPEEDUP * memory:
                return [*points, (beyond, memory)]
        n *= 2
    return [*points, (beyond, memory)]


def llc_from_sweep(points: list[tuple[int, float]]) -> int | None:
    """The largest size of a read sweep (bytes, GB/s; ascending, the last beyond the LLC) up to
    which every read ran at least `LLC_SPEEDUP` x the last one's speed; None if even the first
    did not (no cache level measurably faster than memory)."""
    memory = points[-1][1]
    found = None
    for nbytes, gbps in points[:-1]:
        if gbps < LLC_SPEEDUP * memory:
            break
        found = nbytes
    return found


def measure_llc_bytes(device: str = "cpu", threads: int | None = None,
                      budget_s: float = 0.6) -> int | None:
    """The LLC of `measure_peaks`, measured on its own (None on a GPU, whose predictor does not
    read it, or where no cache level reads measurably faster than memory)."""
    kind, _ = parse_device(device)
    if kind != "cpu":
        return None
    with thread_count(threads):
        return llc_from_sweep(_read_sweep("cpu", budget_s))


BATCHED_ROWS = 8
"""The rows of the batched product `measure_batched_gbps` times: where reading cold weights costs a
linear the most. On the 2-vCPU Intel Xeon of 12-06 (1 thread, a 1 GiB write between timings)
a linear's time with its weights evicted over its time with them cached was, at 1, 2, 4, 8, 16,
32, 64, 128 and 256 rows: 1.21, 1.14, 1.87, 1.66, 1.28, 1.17, 1.09, 1.05, 1.01 (4096 x 1000
weights) and 1.30, 1.31, 1.99, 1.77, 1.57, 1.39, 1.21, 1.09, 1.03 (768 x 3072); the cold weights
read at 4.2-5.5 GB/s from 4 to 16 rows, against 13.7 for a matrix-vector product
(benchmarks/RESULTS.md, 2026-12-06 evening)."""


def measure_batched_gbps(device: str = "cpu", threads: int | None = None,
                         budget_s: float = 1.5) -> float | None:
    """Weight bytes per second of a linear layer at `BATCHED_ROWS` rows whose 16 MiB of weights
    were evicted from every cache level before each timing (a write far beyond the LLC): how fast
    a batched linear inside a model reads weights the rest of the forward pass evicted. The
    blocked product reads them in panels, slower than a matrix-vector product streams them
    (`_stream_gbps`). None on a GPU, whose predictor does not read it."""
    kind, _ = parse_device(device)
    if kind != "cpu":
        return None
    with thread_count(threads):
        k, n = 4096, 1024
        weight = torch.ones(n, k, dtype=torch.float32)
        x = torch.ones(BATCHED_ROWS, k, dtype=torch.float32)
        m = measure(lambda: torch.nn.functional.linear(x, weight),
                    flush=CacheFlusher(_beyond_llc_bytes("cpu")), warmup=1, min_reps=5,
                    max_reps=15, max_time_s=budget_s)
        return weight.numel() * 4 / m.median_s / 1e9


REORDER_WEIGHTS = (1024, 1024, 3, 3)
"""The conv weights `measure_reorder_gbps` reorders (37.7 MB, wide_resnet50_2's 3x3 convs of
layer 4), for an input of 1 x 1024 x 7 x 7. Eager PyTorch keeps a conv's weights plain, and every
call of a conv oneDNN runs reorders them into its blocked layout first (`ops.conv_path_features`:
reorder_bytes). That reorder moves 16 x 16 blocks, not a stream: on the 2-vCPU AMD EPYC of 12-07
(1 thread, its copies at 20.9 GB/s) it took 9.7-9.8 ms for these weights timed in a loop (7.7
GB/s, read + write; 7.8 for 151 MB, 10.0 for 9.4 MB), and 6.1-8.1 GB/s with them evicted as
this times it; wide_resnet50_2's 1024 -> 1024 convs on 1x1024x7x7 were priced at 0.67-0.72x
their time alone with the reorder at the copy's rate. On the Xeon of
12-06 it ran at about the copy's (0.20 ms per MB against 0.19)."""


def measure_reorder_gbps(device: str = "cpu", threads: int | None = None,
                         budget_s: float = 1.0) -> float | None:
    """Bytes per second (read + write, as `ops.conv_path_features` counts reorder_bytes) at which
    oneDNN reorders `REORDER_WEIGHTS` plain conv weights, evicted from every cache level before
    each timing (a write far beyond the LLC) as a forward pass evicts them, into the blocked
    layout a conv on 1 x 1024 x 7 x 7 runs with. None on a GPU, or where this torch has no oneDNN
    reorder to time (the predictor then takes the copy's bandwidth)."""
    kind, _ = parse_device(device)
    if kind != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    cout, cin, kh, kw = REORDER_WEIGHTS
    try:
        reorder = torch._C._nn.mkldnn_reorder_conv2d_weight
        with thread_count(threads), torch.inference_mode():
            weight = torch.ones(REORDER_WEIGHTS, dtype=torch.float32).to_mkldnn()
            m = measure(lambda: reorder(weight, [kh // 2, kw // 2], [1, 1], [1, 1], 1,
                                        [1, cin, 7, 7]),
                        flush=CacheFlusher(_beyond_llc_bytes("cpu")), warmup=1, min_reps=3,
                        max_reps=9, max_time_s=budget_s)
    except (AttributeError, NotImplementedError, RuntimeError):  # an internal op: may go
        return None
    return 2.0 * cout * cin * kh * kw * 4 / m.median_s / 1e9


def _stream_gbps(dev: str, share_s: float) -> tuple[float, Measurement]:
    """Weight bytes per second of a 1 x 4096 input through a linear layer far beyond the LLC."""
    k = 4096
    weight = torch.ones(_beyond_llc_bytes(dev) // 4 // k, k, dtype=torch.float32, device=dev)
    x = torch.ones(1, k, dtype=torch.float32, device=dev)
    m = measure(lambda: torch.nn.functional.linear(x, weight), warmup=1, min_reps=3,
                max_reps=30, max_time_s=share_s, device=dev)
    return weight.numel() * 4 / m.median_s / 1e9, m
