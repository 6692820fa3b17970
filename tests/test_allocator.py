"""The allocator policy hwlat times under: applied once, visible in the fingerprint."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from profilers import allocator
from profilers.fingerprint import fingerprint

GLIBC = allocator._glibc() is not None


def _minor_faults_per_alloc(policy_env: str) -> float:
    """Median page faults of one allocate-touch-free of a 64 MiB tensor, in a fresh process.

    The first few allocations fault even when held: torch asks for 64-byte aligned memory, and
    glibc's memalign splits the freed block so that a new one may come from the top of the heap
    until the free chunks have coalesced (on the dev VM, 1 to 5 of the first 8; on a CI machine,
    7 of 20 after 3 warm-ups). Ten warm-ups and the median measure the steady state instead.
    """
    code = (
        "import resource, statistics, torch\n"
        "from profilers import allocator\n"
        "allocator.apply()\n"
        "for _ in range(10): torch.ones(16 << 20)\n"
        "faults = []\n"
        "for _ in range(20):\n"
        "    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    torch.ones(16 << 20)\n"
        "    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)\n"
        "print(statistics.median(faults))\n"
    )
    env = {**os.environ, allocator.ENV: policy_env}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    return float(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="the held policy needs glibc")
def test_held_policy_reuses_freed_memory_instead_of_faulting_it_back_in():
    held = _minor_faults_per_alloc("held")
    system = _minor_faults_per_alloc("system")
    # 64 MiB (16384 pages) is above glibc's largest dynamic mmap threshold: by default it is
    # mapped, faulted in page by page and unmapped on every allocation; held, it is reused
    assert system > 4000
    assert held < system / 4


def test_policy_follows_the_environment(monkeypatch):
    monkeypatch.setenv(allocator.ENV, "system")
    assert allocator.policy() == allocator.SYSTEM
    monkeypatch.setenv(allocator.ENV, "held")
    assert allocator.policy() == (allocator.HELD if GLIBC else allocator.SYSTEM)


def test_fingerprint_carries_the_policy_and_it_changes_the_id():
    fp = fingerprint("cpu", threads=1)
    assert fp.allocator == allocator.apply()
    assert fp.to_json()["allocator"] == fp.allocator
    other = allocator.SYSTEM if fp.allocator == allocator.HELD else allocator.HELD
    twin = type(fp).from_json({**fp.to_json(), "allocator": other})
    assert twin.device_id != fp.device_id
    # fingerprints stored before the policy existed read back as "system" with their old id
    legacy = {k: v for k, v in fp.to_json().items() if k != "allocator"}
    assert type(fp).from_json(legacy).allocator == allocator.SYSTEM


def test_apply_is_idempotent_and_sticks_to_the_first_answer(monkeypatch):
    first = allocator.apply()
    monkeypatch.setenv(allocator.ENV, "system" if first == allocator.HELD else "held")
    assert allocator.apply() == first
