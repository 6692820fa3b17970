import subprocess
import sys
import time
from pathlib import Path

import pytest

from profilers import contention
from profilers.contention import CpuUse, Meter, contended


def _stat(busy: dict[int, int], idle: int = 1000) -> str:
    """A /proc/stat with per-CPU lines: `busy` ticks split over user, nice, system, irq, softirq
    and steal; idle, iowait and guest time (already inside user) move with `idle`."""
    total = sum(busy.values())
    lines = [f"cpu  {total} 0 0 {idle * len(busy)} 0 0 0 0 0 0"]
    for cpu, ticks in sorted(busy.items()):
        user, nice, system, irq, softirq = (ticks // 2, ticks // 10, ticks // 8, ticks // 20,
                                            ticks // 20)
        steal = ticks - user - nice - system - irq - softirq
        lines.append(f"cpu{cpu} {user} {nice} {system} {idle} {idle // 3} {irq} {softirq} {steal} "
                     f"{user // 4} {nice // 2}")
    return "\n".join(lines + ["intr 12345 0 0", "ctxt 999", "btime 1"]) + "\n"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake /proc/stat on CPUs {0, 1} of {0, 1, 2}, 100 ticks a second, and a fake clock and
    own CPU time the test moves on."""
    stat = tmp_path / "stat"
    state = {"now": 100.0, "own": 5.0}
    monkeypatch.setattr(contention, "PROC_STAT", str(stat))
    monkeypatch.setattr(contention, "_allowed_cpus", lambda: {0, 1})
    monkeypatch.setattr(contention, "_ticks_per_s", lambda: 100)
    monkeypatch.setattr(contention, "_own_cpu_s", lambda: state["own"])
    state["write"] = lambda busy, idle=1000: stat.write_text(_stat(busy, idle))
    state["clock"] = lambda: state["now"]
    return state


def test_others_are_the_busy_ticks_of_our_cpus_beyond_our_own_cpu_time(fake):
    fake["write"]({0: 1000, 1: 2000, 2: 0})
    meter = Meter(clock=fake["clock"])
    # 2 s: 300 + 150 busy ticks on our CPUs (4.5 s of CPU), 3.5 s of it ours; CPU 2 is not ours;
    # idle, iowait and guest ticks move too and must not count
    fake["write"]({0: 1300, 1: 2150, 2: 10_000}, idle=1400)
    fake["now"] += 2.0
    fake["own"] += 3.5
    use = meter.stop()
    assert use.others_cores == pytest.approx(0.5) and use.cpus == 2
    assert use.window_s == pytest.approx(2.0)


def test_more_own_time_than_busy_ticks_is_no_contention_not_a_negative_one(fake):
    fake["write"]({0: 1000, 1: 1000, 2: 0})
    meter = Meter(clock=fake["clock"])
    fake["write"]({0: 1100, 1: 1100, 2: 0})  # 2 s of busy ticks; our threads counted 2.05 s
    fake["now"] += 1.0
    fake["own"] += 2.05
    assert meter.stop().others_cores == 0.0


def test_a_window_shorter_than_the_ticks_can_tell_or_an_unreadable_stat_is_unknown(fake):
    fake["write"]({0: 1000, 1: 1000, 2: 0})
    meter = Meter(clock=fake["clock"])
    fake["now"] += contention.MIN_WINDOW_S / 2
    assert meter.stop() is None
    Path(contention.PROC_STAT).unlink()
    assert Meter(clock=fake["clock"]).stop() is None


def test_a_stat_missing_one_of_our_cpus_is_unknown(fake):
    fake["write"]({0: 1000, 2: 0})  # CPU 1 offline: the reading would cover half the machine
    meter = Meter(clock=fake["clock"])
    fake["now"] += 1.0
    assert meter.stop() is None


def test_contended_means_more_than_a_little_plus_a_quarter_of_the_free_cores_and_tick_noise():
    def busy(others, threads, cpus=2, window_s=1e9):  # a window so long the ticks do not matter
        return contended(CpuUse(others, cpus, window_s), threads)

    assert not busy(0.1, 2)  # the system's own background
    assert busy(0.5, 2)  # a neighbour sharing our threads' cores
    assert busy(1.0, 1) and not busy(0.35, 1)  # a neighbour on the free core
    assert not busy(14.0, 4, 64) and busy(16.0, 4, 64)  # a big server's background
    assert not contended(None, 2)  # unknown: no reading
    # 64 CPUs read over 0.25 s: the ticks' rounding alone can make 0.3 cores of "others"
    assert contention.tick_noise_cores(64, 0.25) == pytest.approx(3 * (64 / 6) ** 0.5 / 100 / 0.25)
    assert not busy(0.45, 64, 64, 0.25) and busy(0.45, 64, 64, 10.0)


def test_a_reading_round_trips_through_stored_stats_and_older_stats_have_none():
    use = CpuUse(0.7, 2, 1.5)
    assert CpuUse.from_stats(use.to_stats()) == use
    assert CpuUse.from_stats(None) is None and CpuUse.from_stats({"p95_s": 0.2}) is None


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux's /proc/stat")
def test_a_busy_process_beside_us_is_seen_as_others(tmp_path):
    """Real accounting: a child process spinning on a core while we wait is another process."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # started and spinning
        meter = Meter()
        time.sleep(0.6)
        use = meter.stop()
    finally:
        spin.kill()
        spin.wait()
    if use is None:
        pytest.skip("/proc/stat has no per-CPU lines for this process's CPUs (a sandbox)")
    assert use.cpus >= 1 and use.others_cores > 0.6
