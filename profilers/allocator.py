"""How the C allocator treats freed memory while hwlat times things.

glibc's malloc hands large freed blocks back to the kernel (munmap, heap trimming) and moves those
thresholds with the process's history, so every forward pass may page-fault its activations and
oneDNN's per-call weight reorders back in, or not, depending on what the process did before. On the
2-core dev VM the same model measured 139 ms in one process and 85 ms in another (mnasnet1_0,
batch 8, 1 thread), and wide_resnet50_2 at batch 1 220 vs 184 ms.

hwlat therefore fixes the policy before it times anything: freed memory is kept for reuse ("held"),
which is what a warm server sees with jemalloc or tcmalloc (PyTorch's CPU performance guide
recommends them) and what glibc converges to in a long-lived process. Set HWLAT_ALLOCATOR=system to
profile and measure under the C library's defaults instead; the policy is part of the CPU
fingerprint, so the two never share a device id.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

ENV = "HWLAT_ALLOCATOR"
HELD, SYSTEM = "held", "system"

# mallopt(3) parameters and the values used: blocks under 1 GiB come from the heap and the heap is
# never trimmed (the value is an int, so INT_MAX is the largest "never").
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 1 << 30
_TRIM_THRESHOLD = 2**31 - 1

_applied: str | None = None


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not hasattr(libc, "mallopt"):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc


def policy() -> str:
    """The policy hwlat times under in this process: "held" (glibc, default) or "system"."""
    if os.environ.get(ENV, HELD).strip().lower() == SYSTEM or _glibc() is None:
        return SYSTEM
    return HELD


def apply() -> str:
    """Put `policy()` in effect for this process (idempotent); returns the policy."""
    global _applied
    if _applied is None:
        wanted = policy()
        if wanted == HELD:
            libc = _glibc()
            ok = libc is not None and (
                libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) == 1
                and libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1
            )
            wanted = HELD if ok else SYSTEM
        _applied = wanted
    return _applied
