import subprocess
import sys
import time
from pathlib import Path

import pytest

from profilers import contention
from profilers.contention import Meter, contended


def _stat(busy: dict[int, int], idle: int = 1000) -> str:
    """A /proc/stat with per-CPU lines: `busy` ticks split over user, system and steal."""
    total = sum(busy.values())
    lines = [f"cpu  {total} 0 0 {idle * len(busy)} 0 0 0 0 0 0"]
    for cpu, ticks in sorted(busy.items()):
        user, system = ticks // 2, ticks // 4
        lines.append(f"cpu{cpu} {user} 0 {system} {idle} 7 0 0 {ticks - user - system} 0 0")
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
    state["write"] = lambda busy: stat.write_text(_stat(busy))
    state["clock"] = lambda: state["now"]
    return state


def test_others_are_the_busy_ticks_of_our_cpus_beyond_our_own_cpu_time(fake):
    fake["write"]({0: 1000, 1: 2000, 2: 0})
    meter = Meter(clock=fake["clock"])
    # 2 s: 300 + 150 busy ticks on our CPUs (4.5 s of CPU), 3.5 s of it ours; CPU 2 is not ours
    fake["write"]({0: 1300, 1: 2150, 2: 10_000})
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


def test_contended_means_more_than_a_little_plus_a_quarter_of_the_free_cores():
    assert not contended(0.1, 2, 2)  # the system's own background
    assert contended(0.5, 2, 2)  # a neighbour sharing our threads' cores
    assert contended(1.0, 1, 2) and not contended(0.35, 1, 2)  # a neighbour on the free core
    assert not contended(14.0, 4, 64) and contended(16.0, 4, 64)  # a big server's background
    assert not contended(None, 2, 2) and not contended(0.9, 2, None)  # unknown: no reading


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
    assert use is not None and use.cpus >= 1
    assert use.others_cores > 0.6
