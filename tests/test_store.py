"""The kernel database: schema, refusal of bad files, claims under concurrency, exact samples."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kernels_db import KernelDB, default_db_path, schema
from profilers.contention import CpuUse
from profilers.errors import DatabaseError, DeviceError

REPO = Path(__file__).resolve().parents[1]
DEVICE = "cpu-test"


def _db(tmp_path: Path, n_configs: int = 0) -> KernelDB:
    db = KernelDB(tmp_path / "kernels.db")
    db.upsert_device({"cpu": "test"}, device_id=DEVICE, kind="cpu", threads=1)
    if n_configs:
        db.add_configs(DEVICE, _items(n_configs))
    return db


def _items(n: int, source: str = "random", start: int = 0) -> list[tuple]:
    return [(f"key{i:04d}", "aten.add.Tensor", "eltwise", "float32", source,
             {"op": "aten.add.Tensor", "i": i}) for i in range(start, start + n)]


def _python(snippet: str, *args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(snippet), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


# ------------------------------------------------------------------------- schema and files


def test_schema_created_and_reopened(tmp_path):
    path = tmp_path / "sub" / "dir" / "kernels.db"  # parent directories are created
    with KernelDB(path) as db:
        assert db.schema_version == schema.SCHEMA_VERSION
        db.upsert_device({"cpu": "x"}, device_id="d1", kind="cpu", threads=2, name="box")
        assert db.add_configs("d1", _items(3)) == 3
    with KernelDB(path) as db:
        assert db._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db._conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert db.get_device("box").threads == 2
        assert len(db.config_ids("d1")) == 3
    with KernelDB(path, readonly=True) as db:
        assert db.get_device("d1").name == "box"
        with pytest.raises(DatabaseError, match="read-only"):
            db.add_configs("d1", _items(1, start=10))


def test_readonly_missing_file(tmp_path):
    with pytest.raises(DatabaseError, match="no kernel database"):
        KernelDB(tmp_path / "absent.db", readonly=True)
    assert not (tmp_path / "absent.db").exists()


def test_newer_schema_is_refused_and_untouched(tmp_path):
    path = tmp_path / "kernels.db"
    _db(tmp_path, 5).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 1}")
    conn.close()
    before = path.read_bytes()
    for readonly in (False, True):
        with pytest.raises(DatabaseError, match=r"newer hwlat \(schema \d+ > \d+\); upgrade"):
            KernelDB(path, readonly=readonly)
    assert path.read_bytes() == before


def test_random_bytes_are_refused_and_untouched(tmp_path):
    path = tmp_path / "kernels.db"
    path.write_bytes(os.urandom(8192))
    before = path.read_bytes()
    with pytest.raises(DatabaseError, match="not a valid hwlat database .*move it away"):
        KernelDB(path)
    assert path.read_bytes() == before


@pytest.mark.parametrize("damage", ["truncated", "overwritten page"])
def test_damaged_db_is_refused_and_untouched(tmp_path, damage):
    path = tmp_path / "kernels.db"
    with _db(tmp_path) as db:  # enough rows for many pages
        db.add_configs(DEVICE, [(f"k{i}", "aten.mm", "matmul", "float32", "random",
                                 {"pad": "x" * 400, "i": i}) for i in range(400)])
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:  # garbage in the middle of a b-tree page: only the integrity check notices
        data[5 * 4096: 5 * 4096 + 200] = bytes(range(200))
    path.write_bytes(bytes(data))
    for readonly in (False, True):
        with pytest.raises(DatabaseError, match="not a valid hwlat database .*move it away"):
            KernelDB(path, readonly=readonly)
    assert path.read_bytes() == data


def test_foreign_sqlite_is_refused_and_untouched(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO photos (name) VALUES ('cat.jpg')")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(DatabaseError, match="another program"):
        KernelDB(path)
    assert path.read_bytes() == before


def test_upgrade_drops_max_pool_timings_taken_on_noise(tmp_path, monkeypatch):
    # a schema-1 file, as hwlat wrote it while max pools were timed on standard-normal inputs
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:1])
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 1)
    items = [("pool", "aten.max_pool2d.default", "pool", "float32", "zoo", {}),
             ("idx", "aten.max_pool2d_with_indices.default", "pool", "float32", "random", {}),
             ("avg", "aten.avg_pool2d.default", "pool", "float32", "zoo", {}),
             ("conv", "aten.conv2d.default", "conv", "float32", "zoo", {})]
    with _db(tmp_path) as db:
        db.add_configs(DEVICE, items)
        for config_id in db.config_ids(DEVICE).values():
            db.add_measurement(config_id, None, [1e-3, 2e-3], flushed=True, threads=1,
                               noisy=False)
    monkeypatch.undo()
    with KernelDB(tmp_path / "kernels.db") as db:
        assert db.schema_version == schema.SCHEMA_VERSION
        assert sorted(m.key for m in db.measured(DEVICE)) == ["avg", "conv"]
        assert len(db.config_ids(DEVICE)) == 4  # the configs stay, to be timed again


def test_migrations_run_in_one_transaction(tmp_path, monkeypatch):
    _db(tmp_path, 3).close()
    path = tmp_path / "kernels.db"

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE devices ADD COLUMN notes TEXT")
        raise RuntimeError("migration bug")

    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS, broken])
    monkeypatch.setattr(schema, "SCHEMA_VERSION", len(schema.MIGRATIONS))
    with pytest.raises(RuntimeError, match="migration bug"):
        KernelDB(path)
    with sqlite3.connect(path) as conn:  # nothing of the failed upgrade is left
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(schema.MIGRATIONS) - 1
        columns = [r[1] for r in conn.execute("PRAGMA table_info(devices)")]
        assert "notes" not in columns
    conn.close()

    fixed = "ALTER TABLE devices ADD COLUMN notes TEXT;\nCREATE INDEX devices_kind ON devices (kind);"
    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS[:-1], fixed])
    with KernelDB(path) as db:
        assert db.schema_version == len(schema.MIGRATIONS)
        assert len(db.config_ids(DEVICE)) == 3
        assert "notes" in [r[1] for r in db._conn.execute("PRAGMA table_info(devices)")]


def test_default_db_path(monkeypatch, tmp_path):
    monkeypatch.setenv("HWLAT_DB", str(tmp_path / "x.db"))
    assert default_db_path() == tmp_path / "x.db"
    monkeypatch.delenv("HWLAT_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_db_path() == tmp_path / "data" / "hwlat" / "kernels.db"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_db_path() == tmp_path / "home" / ".local" / "share" / "hwlat" / "kernels.db"
    with KernelDB.open() as db:  # honours the default and creates its directory
        assert db.path == default_db_path() and db.path.exists()


# ------------------------------------------------------------------------------------ devices


def test_unknown_device_lists_known_ones(tmp_path):
    with KernelDB(tmp_path / "k.db") as db:
        with pytest.raises(DeviceError, match="no device is profiled"):
            db.get_device("nope")
        db.upsert_device({}, device_id="a1b2c3d4", kind="cpu", threads=2, name="laptop")
        db.upsert_device({}, device_id="ffee0011", kind="cuda", threads=None)
        with pytest.raises(DeviceError) as err:
            db.get_device("x")
        assert str(err.value) == (
            "unknown device 'x'; known: a1b2c3d4 (laptop), ffee0011. Run `hwlat devices` to "
            "list them or `hwlat profile` to add this machine.")
        assert db.get_device("a1b2").id == "a1b2c3d4"  # unique id prefix
        with pytest.raises(DeviceError, match="already used"):
            db.upsert_device({}, device_id="ffee0011", kind="cuda", threads=None, name="laptop")
        assert db.rename_device("ffee0011", "gpu").name == "gpu"
        db.set_peaks("gpu", {"flops_per_s": 1e12})
        refreshed = db.upsert_device({"v": 2}, device_id="ffee0011", kind="cuda", threads=None)
        assert (refreshed.name, refreshed.peaks, refreshed.fingerprint) == (
            "gpu", {"flops_per_s": 1e12}, {"v": 2})


def test_list_devices_counts(tmp_path):
    with _db(tmp_path, 4) as db:
        ids = db.config_ids(DEVICE)
        run = db.start_run(DEVICE, budget_s=5.0, settings={"threads": 1})
        db.add_measurement(ids["key0000"], run, [1.0, 2.0], flushed=True, threads=1, noisy=False)
        db.add_measurement(ids["key0000"], run, [3.0], flushed=True, threads=1, noisy=True)
        db.add_measurement(ids["key0001"], run, [4.0] * 5, flushed=True, threads=1, noisy=False)
        db.add_model_measurement(DEVICE, "torchvision:resnet18", "cnn", {"batch": 1}, [0.04])
        [summary] = db.list_devices()
        assert (summary.n_configs, summary.n_measured, summary.n_samples, summary.n_models) == (
            4, 2, 8, 1)
        assert summary.last_profiled is not None


# ----------------------------------------------------------------------------- measurements


def test_samples_round_trip_exactly(tmp_path):
    samples = [1 / 3, 1e-9, 5e-324, 2.2250738585072014e-308, 123456.789, 0.1 + 0.2, 7.0]
    with _db(tmp_path, 1) as db:
        cid = db.config_ids(DEVICE)["key0000"]
        db.add_measurement(cid, None, samples, flushed=False, threads=1, noisy=False,
                           telemetry={"temp_c": 51})
        db.add_model_measurement(DEVICE, "timm:resnet18", "cnn", {"kind": "bench"}, samples,
                                 stats={"p95_s": 0.2})
    with KernelDB(tmp_path / "kernels.db", readonly=True) as db:
        assert db.samples(cid) == samples
        [model] = db.model_measurements(DEVICE, kind="bench")
        assert list(model.samples_s) == samples and model.stats == {"p95_s": 0.2}
        assert model.settings == {"kind": "bench"}
        assert json.loads(model.settings_key) == dict.fromkeys(
            ["device", "dtype", "inputs", "threads"])
        assert not model.contended  # no reading
        assert db.model_measurements(DEVICE, kind="e2e") == []


def test_a_model_timing_is_contended_by_its_stored_reading_and_thread_count(tmp_path):
    with _db(tmp_path, 1) as db:
        for threads, others in ((2, 0.9), (1, 0.3), (2, 0.05)):
            db.add_model_measurement(DEVICE, "torchvision:resnet18", "cnn", {"threads": threads},
                                     [0.04], stats={"others_cores": others, "cpus": 2,
                                                    "window_s": 1.0})
        assert [m.contended for m in db.model_measurements(DEVICE)] == [True, False, False]


def test_measured_pools_measurements_at_the_fastest_median(tmp_path):
    with _db(tmp_path, 3) as db:
        ids = db.config_ids(DEVICE)
        db.add_measurement(ids["key0000"], None, [1.0, 2.0, 3.0], flushed=True, threads=1,
                           noisy=False)
        db.add_measurement(ids["key0000"], None, [10.0, 11.0], flushed=True, threads=2,
                           noisy=True)
        db.add_measurement(ids["key0001"], None, [5.0, 7.0], flushed=True, threads=1, noisy=False)
        by_key = {m.key: m for m in db.measured(DEVICE)}
        assert set(by_key) == {"key0000", "key0001"}
        assert (by_key["key0000"].median_s, by_key["key0000"].n) == (2.0, 5)
        assert by_key["key0000"].noisy and by_key["key0000"].threads == 2
        assert (by_key["key0001"].median_s, by_key["key0001"].iqr_s) == (6.0, 1.0)
        assert db.samples(ids["key0000"]) == [1.0, 2.0, 3.0, 10.0, 11.0]
        assert db.measured(DEVICE, family="matmul") == []


def test_state_token_changes_on_writes(tmp_path):
    with _db(tmp_path) as db:
        tokens = [db.state_token(DEVICE)]
        db.add_configs(DEVICE, _items(2))
        tokens.append(db.state_token(DEVICE))
        assert db.add_configs(DEVICE, _items(2)) == 0  # nothing new: token unchanged
        assert db.state_token(DEVICE) == tokens[-1]
        db.add_measurement(db.config_ids(DEVICE)["key0000"], None, [1.0], flushed=True,
                           threads=1, noisy=False)
        tokens.append(db.state_token(DEVICE))
        db.add_model_measurement(DEVICE, "hf:bert", "transformer", {}, [0.5])
        tokens.append(db.state_token(DEVICE))
        db.add_model_measurement(DEVICE, "hf:bert", "transformer", {"kind": "bench"}, [0.5])
        assert db.state_token(DEVICE) == tokens[-1]  # a `hwlat bench` timing retrains nothing
        db.set_peaks(DEVICE, {"gbps": 10.0, "stream_gbps": 8.0})  # the memory floor reads them
        tokens.append(db.state_token(DEVICE))
        mid = db.add_measurement(db.config_ids(DEVICE)["key0001"], None, [1.0], flushed=True,
                                 threads=1, noisy=False)
        tokens.append(db.state_token(DEVICE))
        db.annotate_cpu_use([mid], CpuUse(0.0, 2, 0.5), threads=1)  # no pace: nothing to train
        assert db.state_token(DEVICE) == tokens[-1]
        db.annotate_cpu_use([mid], CpuUse(0.0, 2, 0.5), threads=1, pace_s=0.002)
        tokens.append(db.state_token(DEVICE))  # its window paced after it was stored
        assert len(set(tokens)) == 7


def test_failed_transaction_rolls_back(tmp_path):
    with _db(tmp_path) as db:
        with pytest.raises(KeyError), db.transaction():
            db.add_configs(DEVICE, _items(3))
            raise KeyError("boom")
        assert db.config_ids(DEVICE) == {}


# ------------------------------------------------------------------------------------ claims


def test_claims_follow_priority_and_exclude_live_runs(tmp_path):
    with _db(tmp_path) as db:
        db.add_configs(DEVICE, _items(3, source="random"))
        db.add_configs(DEVICE, _items(2, source="zoo", start=10))
        run_a = db.start_run(DEVICE, budget_s=None, settings={})
        run_b = db.start_run(DEVICE, budget_s=None, settings={})
        first = db.claim_unmeasured(DEVICE, run_a, 3)
        assert [c.source for c in first] == ["zoo", "zoo", "random"]
        rest = db.claim_unmeasured(DEVICE, run_b, 10)  # run_a is alive: its claims hold
        assert {c.key for c in rest}.isdisjoint({c.key for c in first}) and len(rest) == 2
        db.finish_run(run_b, "done")  # unmeasured claims go back
        run_c = db.start_run(DEVICE, budget_s=None, settings={})
        assert {c.key for c in db.claim_unmeasured(DEVICE, run_c, 10)} == {c.key for c in rest}
        # Stale claims (older than the TTL) are taken over even from a live run.
        run_d = db.start_run(DEVICE, budget_s=None, settings={})
        taken = db.claim_unmeasured(DEVICE, run_d, 10, claim_ttl_s=0.0)
        assert len(taken) == 5
        with pytest.raises(DatabaseError, match="not running"):
            db.claim_unmeasured(DEVICE, run_b, 1)


def test_failed_configs_and_filters(tmp_path):
    with _db(tmp_path) as db:
        db.add_configs(DEVICE, _items(3, source="zoo") + _items(3, source="random", start=3))
        run = db.start_run(DEVICE, budget_s=None, settings={})
        [bad] = db.claim_unmeasured(DEVICE, run, 1)
        assert bad.record == {"op": "aten.add.Tensor", "i": 0}
        db.mark_failed(bad.id, run, "RuntimeError: not implemented for this device")
        good = db.claim_unmeasured(DEVICE, run, 10, max_priority=0)  # zoo only
        assert [c.key for c in good] == ["key0001", "key0002"]
        db.add_measurement(good[0].id, run, [1e-5], flushed=True, threads=1, noisy=False)
        assert db.zoo_coverage(DEVICE) == (1, 3)
        assert db.untimed(DEVICE) == {"zoo": 1, "random": 3}  # the failed one is not waiting
        db.finish_run(run, "done")
        again = db.start_run(DEVICE, budget_s=None, settings={})
        left = db.claim_unmeasured(DEVICE, again, 10, sources=["zoo", "random"])
        assert bad.key not in {c.key for c in left} and len(left) == 4


def test_a_second_timing_claims_measured_configs_until_they_have_two(tmp_path):
    with _db(tmp_path) as db:
        db.add_configs(DEVICE, _items(3, source="zoo"))
        run = db.start_run(DEVICE, budget_s=None, settings={})
        first = db.claim_unmeasured(DEVICE, run, 2)
        for c in first:
            db.add_measurement(c.id, run, [1e-5], flushed=True, threads=1, noisy=False)
        assert [c.key for c in db.claim_unmeasured(DEVICE, run, 10)] == ["key0002"]
        db.release_claims(run)
        second = db.claim_unmeasured(DEVICE, run, 10, below=2)
        assert [c.key for c in second] == ["key0000", "key0001", "key0002"]
        db.add_measurement(second[0].id, run, [3e-5], flushed=True, threads=1, noisy=False)
        db.release_claims(run)
        assert [c.key for c in db.claim_unmeasured(DEVICE, run, 10, below=2)] == ["key0001",
                                                                                   "key0002"]
        assert {m.key: m.median_s for m in db.measured(DEVICE)}["key0000"] == 1e-5


def test_a_paced_second_timing_claims_configs_timed_before_the_pace_probe(tmp_path):
    with _db(tmp_path) as db:
        db.add_configs(DEVICE, _items(4, source="zoo"))
        old = db.start_run(DEVICE, budget_s=None, settings={})
        configs = db.claim_unmeasured(DEVICE, old, 10)
        paced = {"pace_s": 0.003}
        for c, telemetry in zip(configs, ([None, None], [None], [paced, paced], [paced, None]),
                                strict=True):
            for t in telemetry:  # key0000: twice unpaced, key0001 once, key0002 twice paced
                db.add_measurement(c.id, old, [1e-5], flushed=True, threads=1, noisy=False,
                                   telemetry=t)
        db.finish_run(old, "done")
        run = db.start_run(DEVICE, budget_s=None, settings={})
        assert [c.key for c in db.claim_unmeasured(DEVICE, run, 10, below=2)] == ["key0001"]
        db.release_claims(run)
        again = db.claim_unmeasured(DEVICE, run, 10, below=2, paced=True)
        assert [c.key for c in again] == ["key0000", "key0001", "key0003"]
        for c in again:  # timed now, its window not closed yet: not claimed a third time
            db.add_measurement(c.id, run, [1e-5], flushed=True, threads=1, noisy=False)
        db.release_claims(run)
        assert db.claim_unmeasured(DEVICE, run, 10, below=2, paced=True) == []
        db.finish_run(run, "done")
        later = db.start_run(DEVICE, budget_s=None, settings={})
        assert [c.key for c in db.claim_unmeasured(DEVICE, later, 10, below=2, paced=True)] == [
            "key0000", "key0001", "key0003"]


def test_a_paced_second_timing_waits_for_a_concurrent_runs_pace(tmp_path):
    with _db(tmp_path) as db:
        db.add_configs(DEVICE, _items(2, source="zoo"))
        first = db.start_run(DEVICE, budget_s=None, settings={})
        second = db.start_run(DEVICE, budget_s=None, settings={})
        paced = {"pace_s": 0.003}
        configs = db.claim_unmeasured(DEVICE, first, 10)
        for c in configs:  # timed twice by the first run, its last window not closed yet
            db.add_measurement(c.id, first, [1e-5], flushed=True, threads=1, noisy=False,
                               telemetry=paced)
            db.add_measurement(c.id, first, [1e-5], flushed=True, threads=1, noisy=False)
        db.release_claims(first)
        assert db.claim_unmeasured(DEVICE, second, 10, below=2, paced=True) == []
        db.finish_run(first, "done")  # its window never closed: timings of an unpaced profile
        assert [c.key for c in db.claim_unmeasured(DEVICE, second, 10, below=2, paced=True)] == [
            "key0000", "key0001"]


def test_claims_of_another_host_wait_for_the_ttl(tmp_path):
    with _db(tmp_path, 4) as db:
        remote = db.start_run(DEVICE, budget_s=None, settings={})
        db._conn.execute("UPDATE runs SET host = 'elsewhere', pid = 999999999 WHERE id = ?",
                         (remote,))
        assert len(db.claim_unmeasured(DEVICE, remote, 4)) == 4
        local = db.start_run(DEVICE, budget_s=None, settings={})
        assert db.claim_unmeasured(DEVICE, local, 4) == []  # its pid can't be checked here
        assert db.get_run(remote).status == "running"
        assert len(db.claim_unmeasured(DEVICE, local, 4, claim_ttl_s=0.0)) == 4


_WORKER = """
    import json, os, sys, time
    from pathlib import Path
    from kernels_db import KernelDB
    db_path, device, go, ready = sys.argv[1:5]
    with KernelDB(db_path) as db:
        run = db.start_run(device, budget_s=None, settings={"pid": os.getpid()})
        Path(ready).touch()
        while not Path(go).exists():
            time.sleep(0.005)
        written = {}
        while batch := db.claim_unmeasured(device, run, 5):
            for cfg in batch:
                k = 1 + cfg.id % 4
                samples = [cfg.id * 1e-6 + j * 1e-9 for j in range(k)]
                db.add_measurement(cfg.id, run, samples, flushed=True, threads=1, noisy=False)
                written[cfg.key] = k
                time.sleep(0.002)
        db.finish_run(run)
    print(json.dumps(written))
"""


def test_concurrent_writers_split_the_work(tmp_path):
    _db(tmp_path, 200).close()
    db_path, go = tmp_path / "kernels.db", tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    procs = [_python(_WORKER, str(db_path), DEVICE, str(go), str(r)) for r in ready]
    deadline = time.monotonic() + 30
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outputs]
    written = [json.loads(out) for out, _ in outputs]

    assert all(written), "both processes should have measured some configs"
    assert set(written[0]).isdisjoint(written[1])  # no config measured twice
    with KernelDB(db_path, readonly=True) as db:
        ids = db.config_ids(DEVICE)
        assert set(written[0]) | set(written[1]) == set(ids)
        counts = db._conn.execute(
            "SELECT COUNT(*), SUM(n) FROM measurements GROUP BY config_id").fetchall()
        assert len(counts) == 200 and all(c[0] == 1 for c in counts)
        total = sum(written[0].values()) + sum(written[1].values())
        assert sum(c[1] for c in counts) == total
        for key, cid in ids.items():
            k = written[0].get(key) or written[1][key]
            assert db.samples(cid) == [cid * 1e-6 + j * 1e-9 for j in range(k)]
        assert db._conn.execute("SELECT COUNT(*) FROM claims").fetchone()[0] == 0
        assert {r.status for r in db.runs(DEVICE)} == {"done"}


_KILLED = """
    import json, sys, time
    from kernels_db import KernelDB
    db = KernelDB(sys.argv[1])
    run = db.start_run(sys.argv[2], budget_s=None, settings={})
    batch = db.claim_unmeasured(sys.argv[2], run, 20)
    for cfg in batch[:5]:
        db.add_measurement(cfg.id, run, [0.25, 0.5], flushed=True, threads=1, noisy=False)
    print(json.dumps({"run": run, "claimed": [c.key for c in batch]}), flush=True)
    time.sleep(120)
"""


def test_claims_after_sigkill_are_taken_over(tmp_path):
    _db(tmp_path, 200).close()
    db_path = tmp_path / "kernels.db"
    proc = _python(_KILLED, str(db_path), DEVICE)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        child = json.loads(line)
        with KernelDB(db_path) as db:
            probe = db.start_run(DEVICE, budget_s=None, settings={})
            others = db.claim_unmeasured(DEVICE, probe, 1000)  # the child is alive
            assert len(others) == 180 and not {c.key for c in others} & set(child["claimed"])
            db.finish_run(probe, "done")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    with KernelDB(db_path) as db:
        assert db.get_run(child["run"]).status == "interrupted"
        run = db.start_run(DEVICE, budget_s=None, settings={})
        taken = {c.key for c in db.claim_unmeasured(DEVICE, run, 1000)}
        assert len(taken) == 195 and set(child["claimed"][5:]) <= taken
        measured = {m.key: m for m in db.measured(DEVICE)}
        assert set(measured) == set(child["claimed"][:5])  # the killed run's work is kept
        assert all(db.samples(m.config_id) == [0.25, 0.5] for m in measured.values())
        row = db._conn.execute("SELECT status FROM runs WHERE id = ?", (child["run"],)).fetchone()
        assert row["status"] == "interrupted"  # reaped for good, not only reported
