"""The kernel database: one SQLite file holding the profiles of one or more devices.

It stores what users paid for with profiling time, so it is careful: WAL journal and a busy
timeout so several processes can write at once, every write inside one `BEGIN IMMEDIATE`
transaction, foreign keys on, raw samples kept exactly. A file that is corrupt, foreign or from a
newer hwlat raises `DatabaseError` and is never written to.

Concurrent `hwlat profile` runs split the work through `claims`: `claim_unmeasured` atomically
hands each run configs nobody has measured or is measuring; a claim dies with its run (finished,
or its pid gone from this host) or after `claim_ttl_s`, and the next run takes it over.

All times are seconds; timestamps are Unix seconds (`time.time()`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import sqlite3
import statistics
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from kernels_db import schema
from profilers import pace
from profilers.contention import CpuUse, contended
from profilers.errors import DatabaseError, DeviceError

BUSY_TIMEOUT_S = 30.0
CLAIM_TTL_S = 3600.0
# Lower is profiled first: configs seen in real models before synthetic ones; perturbed and
# random ones share a priority and are queued in turn (kernels_db.build.plan says why).
SOURCE_PRIORITY = {"zoo": 0, "user": 0, "perturb": 1, "random": 1, "adaptive": 3}
DEFAULT_PRIORITY = 5
RUN_STATUSES = ("running", "done", "interrupted", "failed")
MODEL_KINDS = ("e2e", "bench", "load")
MODEL_SETTINGS_KEY = ("inputs", "dtype", "threads", "device")
_SQLITE_MAGIC = b"SQLite format 3\x00"


def default_db_path() -> Path:
    """`$HWLAT_DB`, else `$XDG_DATA_HOME/hwlat/kernels.db`, else `~/.local/share/hwlat/kernels.db`."""
    if os.environ.get("HWLAT_DB"):
        return Path(os.environ["HWLAT_DB"]).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home).expanduser() / "hwlat" / "kernels.db"


# ---------------------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class DeviceRow:
    id: str
    name: str | None
    kind: str
    threads: int | None
    fingerprint: dict
    peaks: dict | None
    created_at: float

    @property
    def label(self) -> str:
        """"id (name)" or "id"."""
        return f"{self.id} ({self.name})" if self.name else self.id


@dataclass(frozen=True)
class DeviceSummary:
    id: str
    name: str | None
    kind: str
    threads: int | None
    n_configs: int
    n_measured: int  # configs with at least one measurement
    n_samples: int
    n_models: int  # model-level measurements
    last_profiled: float | None  # newest measurement timestamp
    created_at: float

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RunRow:
    id: str
    device_id: str
    started_at: float
    finished_at: float | None
    status: str  # effective: a 'running' run whose pid died on this host reads 'interrupted'
    budget_s: float | None
    pid: int | None
    host: str | None
    versions: dict
    settings: dict


@dataclass(frozen=True)
class ConfigRow:
    id: int
    device_id: str
    key: str
    op: str
    family: str
    dtype: str
    source: str
    priority: int
    record_json: str

    @property
    def record(self) -> dict:
        """The stored `OpRecord.to_json()`; `OpRecord.from_json(row.record)` rebuilds it."""
        return json.loads(self.record_json)


@dataclass(frozen=True)
class MeasuredConfig:
    """A measured config: its fastest timing's median and IQR (`_pooled`); `n` counts all."""

    config_id: int
    key: str
    op: str
    family: str
    dtype: str
    source: str
    record_json: str
    median_s: float
    iqr_s: float
    n: int
    noisy: bool  # any of its measurements was flagged noisy
    threads: int | None  # of its newest measurement
    flushed: bool  # of its newest measurement
    pace_s: float | None = None  # the machine's pace over its fastest timing (None: not probed)

    @property
    def record(self) -> Any:
        """The captured OpRecord as JSON data (`OpRecord.from_json(row.record)`)."""
        return json.loads(self.record_json)


@dataclass(frozen=True)
class ModelMeasurement:
    id: int
    uid: str
    device_id: str
    run_id: str | None
    model: str
    family: str
    kind: str
    settings: dict
    samples_s: tuple[float, ...]
    median_s: float
    stats: dict | None
    created_at: float

    @property
    def settings_key(self) -> str:
        """What makes two model timings comparable: inputs, dtype, threads, device."""
        return settings_key(self.settings)

    @property
    def cpu_use(self) -> CpuUse | None:
        """Other processes' CPU use while it was timed (None: not read, or an older timing)."""
        return CpuUse.from_stats(self.stats)

    @property
    def others_cores(self) -> float | None:
        return self.cpu_use.others_cores if self.cpu_use else None

    @property
    def contended(self) -> bool:
        """Other processes used enough of the CPUs to have slowed it (profilers.contention)."""
        return contended(self.cpu_use, self.settings.get("threads"))

    @property
    def pace_s(self) -> float | None:
        """The machine's pace while it was timed (profilers.pace; None: not probed)."""
        return (self.stats or {}).get("pace_s")

    @property
    def chain_s(self) -> float | None:
        """The chain probe's time then (profilers.pace.chain_probe; None: not probed)."""
        return (self.stats or {}).get("chain_s")

    def to_json(self) -> dict:
        return asdict(self)


def slow_spell_ids(timings: Sequence[ModelMeasurement]) -> set[int]:
    """Ids of one device's end-to-end `timings` taken in a slow spell of the machine: their
    pace (`profilers.pace`) well over its usual over all of them."""
    return pace.slow_ids({m.id: m.pace_s for m in timings})


def quiet_ids(timings: Sequence[ModelMeasurement]) -> set[int]:
    """Ids of one device's end-to-end `timings` taken undisturbed: neither beside other work
    (`contended`) nor in a slow spell (`slow_spell_ids`)."""
    slow = slow_spell_ids(timings)
    return {m.id for m in timings if not m.contended and m.id not in slow}


def profile_pace_s(timings: Sequence[ModelMeasurement], probe: str = "pace_s") -> float | None:
    """A probe's median (`probe`: "pace_s", or "chain_s" for the chain probe) over the undisturbed
    ones of a device's end-to-end `timings` (`quiet_ids`; None: none probed): the pace the
    correction's targets are brought to (`at_profile_pace`) and the pace anchor of
    `predictor.evaluate` sets the probe now against."""
    quiet = quiet_ids(timings)
    then = [t for m in timings if (t := getattr(m, probe)) and m.id in quiet]
    return statistics.median(then) if then else None


def at_profile_pace(m: ModelMeasurement, then_s: float | None, exponent: float) -> float:
    """`m`'s median brought to the profile's pace `then_s` (`profile_pace_s`): times (then / the
    pace beside it) to `exponent`; as timed where either is unknown."""
    return m.median_s * (then_s / m.pace_s) ** exponent if then_s and m.pace_s else m.median_s


# ------------------------------------------------------------------------------------- helpers


def settings_key(settings: dict) -> str:
    """What makes two model timings comparable: inputs, dtype, threads, device."""
    return _dumps({k: settings.get(k) for k in MODEL_SETTINGS_KEY})


def encode_samples(samples_s: Sequence[float]) -> bytes:
    """Little-endian float64 bytes: exact and independent of the writer's byte order."""
    return np.asarray(samples_s, dtype="<f8").tobytes()


def decode_samples(blob: bytes) -> list[float]:
    return np.frombuffer(blob, dtype="<f8").tolist()


def sample_stats(samples_s: Sequence[float]) -> tuple[float, float]:
    """(median, interquartile range) of raw samples."""
    arr = np.asarray(samples_s, dtype=np.float64)
    q1, median, q3 = np.percentile(arr, [25, 50, 75])
    return float(median), float(q3 - q1)


def library_versions(dists: Sequence[str] = ("hwlat", "torch", "numpy")) -> dict[str, str]:
    """Versions a measurement depends on, read from metadata so torch is not imported."""
    versions = {"python": sys.version.split()[0]}
    for dist in dists:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return versions


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    except OSError:
        return False
    return True


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# --------------------------------------------------------------------------------------- store


class KernelDB:
    """A kernel database file. Use as a context manager, or call `close()`.

    One instance per thread. Writes may be grouped: `with db.transaction(): ...` makes every
    call inside it one atomic, single-fsync transaction.
    """

    def __init__(self, path: str | os.PathLike, *, readonly: bool = False) -> None:
        self.path = Path(path).expanduser()
        self.readonly = readonly
        self._depth = 0
        self._host = socket.gethostname()
        if self._has_content():
            self._validate_existing()
        elif readonly:
            raise DatabaseError(
                f"no kernel database at {self.path}; run `hwlat profile` to create one "
                "or pass --db PATH")
        self._conn = self._connect()
        if not readonly:
            try:
                self._upgrade()
            except BaseException:
                self.close()
                raise

    @classmethod
    def open(cls, path: str | os.PathLike | None = None, *, readonly: bool = False) -> KernelDB:
        """The database at `path`, or at `default_db_path()` when None."""
        return cls(default_db_path() if path is None else path, readonly=readonly)

    def __enter__(self) -> KernelDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if getattr(self, "_conn", None) is not None:
            self._conn.close()
            self._conn = None

    # ------------------------------------------------------------------------ open and check

    def _has_content(self) -> bool:
        return self.path.exists() and self.path.stat().st_size > 0

    def _invalid(self, why: str) -> DatabaseError:
        return DatabaseError(
            f"{self.path} is not a valid hwlat database ({why}); move it away or pass --db PATH")

    def _validate_existing(self) -> None:
        """Reject a foreign, corrupt or newer file through a read-only connection.

        Read-only, so not even a WAL checkpoint can write to a file we refuse (SQLite may leave
        an empty `-wal`/`-shm` pair beside it, as any read-only reader does).
        """
        try:
            with open(self.path, "rb") as f:
                magic = f.read(16)
        except OSError as e:
            raise DatabaseError(f"cannot read kernel database {self.path}: {e}") from None
        if magic != _SQLITE_MAGIC:
            raise self._invalid("not an SQLite file")
        try:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                   timeout=BUSY_TIMEOUT_S)
        except sqlite3.Error as e:
            raise self._invalid(str(e)) from None
        try:
            self._check_identity(conn)
            problems = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
            if problems != ["ok"]:
                first = " ".join(" ".join(problems[:2]).split())  # one line for the CLI
                raise self._invalid(f"integrity check: {first[:200]}")
        except sqlite3.Error as e:
            raise self._invalid(str(e)) from None
        finally:
            conn.close()

    def _check_identity(self, conn: sqlite3.Connection) -> int:
        """The schema version of an hwlat file (0 if empty); raise for foreign or newer ones."""
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables and version == 0:
            return 0
        fmt = None
        if "hwlat_meta" in tables:
            row = conn.execute("SELECT value FROM hwlat_meta WHERE key='format'").fetchone()
            fmt = row[0] if row else None
        if fmt != schema.FORMAT_NAME:
            raise self._invalid("an SQLite file of another program")
        if version > schema.SCHEMA_VERSION:
            raise DatabaseError(
                f"database {self.path} was written by a newer hwlat (schema {version} > "
                f"{schema.SCHEMA_VERSION}); upgrade hwlat, or pass --db PATH to use another file")
        if version < schema.SCHEMA_VERSION and self.readonly:
            raise DatabaseError(
                f"database {self.path} has an older schema ({version} < {schema.SCHEMA_VERSION}); "
                "any hwlat command that writes to it (e.g. `hwlat profile`) upgrades it")
        return version

    def _connect(self) -> sqlite3.Connection:
        try:
            if self.readonly:
                conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                       timeout=BUSY_TIMEOUT_S, isolation_level=None)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            if not self.readonly:
                conn.execute("PRAGMA journal_mode = WAL")
        except (sqlite3.Error, OSError) as e:
            raise DatabaseError(f"cannot open kernel database {self.path}: {e}") from None
        conn.row_factory = sqlite3.Row
        return conn

    def _upgrade(self) -> None:
        """Create or migrate the schema; re-checked under the write lock (another process may
        have created or upgraded the file since `_validate_existing`)."""
        with self.transaction() as conn:
            version = self._check_identity(conn)
            if version < schema.SCHEMA_VERSION:
                schema.apply_migrations(conn, version)

    @property
    def schema_version(self) -> int:
        return self._conn.execute("PRAGMA user_version").fetchone()[0]

    # -------------------------------------------------------------------------- transactions

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE); nested uses join the outer one."""
        if self._conn is None:
            raise DatabaseError(f"kernel database {self.path} is closed")
        if self._depth:
            self._depth += 1
            try:
                yield self._conn
            finally:
                self._depth -= 1
            return
        if self.readonly:
            raise DatabaseError(f"kernel database {self.path} was opened read-only")
        with self._sqlite_errors():
            self._conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            with self._sqlite_errors():
                yield self._conn
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        else:
            with self._sqlite_errors():
                self._conn.execute("COMMIT")
        finally:
            self._depth = 0

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A consistent read view across several queries (joins an open transaction)."""
        if self._conn is None:
            raise DatabaseError(f"kernel database {self.path} is closed")
        if self._depth or self._conn.in_transaction:
            yield self._conn
            return
        with self._sqlite_errors():
            self._conn.execute("BEGIN")
        try:
            with self._sqlite_errors():
                yield self._conn
        finally:
            if self._conn.in_transaction:
                self._conn.execute("COMMIT")

    @contextmanager
    def _sqlite_errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                raise DatabaseError(
                    f"kernel database {self.path} stayed locked by another process for "
                    f"{BUSY_TIMEOUT_S:.0f} s; retry when it finishes") from None
            raise DatabaseError(f"kernel database {self.path}: {e}") from None
        except sqlite3.Error as e:
            raise DatabaseError(f"kernel database {self.path}: {e}") from None

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._sqlite_errors():
            return self._conn.execute(sql, params).fetchall()

    # ------------------------------------------------------------------------------- devices

    def upsert_device(self, fingerprint_json: dict, *, device_id: str, kind: str,
                      threads: int | None, name: str | None = None,
                      peaks: dict | None = None) -> DeviceRow:
        """Add a device or refresh its fingerprint; `name` and `peaks` change only when given."""
        now = time.time()
        with self.transaction() as conn:
            if name is not None:
                self._check_name_free(name, device_id)
            conn.execute(
                "INSERT INTO devices (id, name, kind, threads, fingerprint_json, peaks_json,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET kind = excluded.kind,"
                " threads = excluded.threads, fingerprint_json = excluded.fingerprint_json,"
                " name = COALESCE(excluded.name, devices.name),"
                " peaks_json = COALESCE(excluded.peaks_json, devices.peaks_json),"
                " updated_at = excluded.updated_at",
                (device_id, name, kind, threads, _dumps(fingerprint_json),
                 None if peaks is None else _dumps(peaks), now, now))
        return self.get_device(device_id)

    def _check_name_free(self, name: str, device_id: str) -> None:
        row = self._conn.execute(
            "SELECT id FROM devices WHERE (name = ? OR id = ?) AND id != ?",
            (name, name, device_id)).fetchone()
        if row:
            raise DeviceError(f"device name '{name}' is already used by device {row['id']}; "
                              "pick another name")

    def get_device(self, id_or_name: str) -> DeviceRow:
        """The device with this id, alias, or unique id prefix (>= 4 characters)."""
        rows = self._query("SELECT * FROM devices WHERE id = ? OR name = ?",
                           (id_or_name, id_or_name))
        if not rows and len(id_or_name) >= 4:
            rows = self._query("SELECT * FROM devices WHERE substr(id, 1, ?) = ?",
                               (len(id_or_name), id_or_name))
        if len(rows) == 1:
            return _device_row(rows[0])
        if len(rows) > 1:
            ids = ", ".join(sorted(r["id"] for r in rows))
            raise DeviceError(f"device '{id_or_name}' is ambiguous: {ids}; give more of the id")
        raise DeviceError(self._unknown_device_message(id_or_name))

    def _unknown_device_message(self, id_or_name: str) -> str:
        known = [_device_row(r).label for r in self._query("SELECT * FROM devices ORDER BY id")]
        if not known:
            return (f"unknown device '{id_or_name}'; no device is profiled in {self.path}. "
                    "Run `hwlat profile` to add this machine.")
        shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
        return (f"unknown device '{id_or_name}'; known: {shown}. Run `hwlat devices` to list "
                "them or `hwlat profile` to add this machine.")

    def list_devices(self) -> list[DeviceSummary]:
        return [_device_summary(r) for r in self._query(_SUMMARY_SQL + " ORDER BY d.id")]

    def device_summary(self, id_or_name: str) -> DeviceSummary:
        device = self.get_device(id_or_name)
        return _device_summary(self._query(_SUMMARY_SQL + " WHERE d.id = ?", (device.id,))[0])

    def set_peaks(self, device_id: str, peaks: dict) -> None:
        device = self.get_device(device_id)
        with self.transaction() as conn:
            conn.execute("UPDATE devices SET peaks_json = ?, updated_at = ? WHERE id = ?",
                         (_dumps(peaks), time.time(), device.id))

    def rename_device(self, id_or_name: str, name: str | None) -> DeviceRow:
        """Set (or with None, clear) a device's alias."""
        device = self.get_device(id_or_name)
        with self.transaction() as conn:
            if name is not None:
                self._check_name_free(name, device.id)
            conn.execute("UPDATE devices SET name = ?, updated_at = ? WHERE id = ?",
                         (name, time.time(), device.id))
        return self.get_device(device.id)

    # ---------------------------------------------------------------------------------- runs

    def start_run(self, device_id: str, *, budget_s: float | None, settings: dict,
                  versions: dict | None = None) -> str:
        """A new 'running' run owned by this process; returns its uuid."""
        run_id = uuid.uuid4().hex
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO runs (id, device_id, started_at, status, budget_s, pid, host,"
                " versions_json, settings_json) VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?)",
                (run_id, device_id, time.time(), budget_s, os.getpid(), self._host,
                 _dumps(library_versions() if versions is None else versions), _dumps(settings)))
        return run_id

    def finish_run(self, run_id: str, status: str = "done") -> None:
        """Close a run and release the claims it did not measure."""
        if status not in RUN_STATUSES or status == "running":
            raise ValueError(f"finish_run status must be one of done/interrupted/failed: {status}")
        with self.transaction() as conn:
            updated = conn.execute("UPDATE runs SET status = ?, finished_at = ? WHERE id = ?",
                                   (status, time.time(), run_id)).rowcount
            if not updated:
                raise DatabaseError(f"unknown run {run_id} in {self.path}")
            conn.execute("DELETE FROM claims WHERE run_id = ?", (run_id,))

    def get_run(self, run_id: str) -> RunRow:
        rows = self._query("SELECT * FROM runs WHERE id = ?", (run_id,))
        if not rows:
            raise DatabaseError(f"unknown run {run_id} in {self.path}")
        return self._run_row(rows[0])

    def runs(self, device_id: str) -> list[RunRow]:
        rows = self._query("SELECT * FROM runs WHERE device_id = ? ORDER BY started_at",
                           (device_id,))
        return [self._run_row(r) for r in rows]

    def run_measured(self, run_id: str) -> bool:
        """Whether a run stored any op measurement."""
        return bool(self._query("SELECT EXISTS (SELECT 1 FROM measurements WHERE run_id = ?)"
                                " AS x", (run_id,))[0]["x"])

    def _run_row(self, r: sqlite3.Row) -> RunRow:
        return RunRow(id=r["id"], device_id=r["device_id"], started_at=r["started_at"],
                      finished_at=r["finished_at"], status=self._effective_status(r),
                      budget_s=r["budget_s"], pid=r["pid"], host=r["host"],
                      versions=_loads(r["versions_json"]), settings=_loads(r["settings_json"]))

    def _effective_status(self, r: sqlite3.Row) -> str:
        if r["status"] == "running" and self._run_is_dead(r["host"], r["pid"]):
            return "interrupted"
        return r["status"]

    def _run_is_dead(self, host: str | None, pid: int | None) -> bool:
        """Only provable on this host; elsewhere the claim TTL has to decide."""
        return host == self._host and pid is not None and not pid_alive(pid)

    def _reap_dead_runs(self, conn: sqlite3.Connection) -> None:
        """Mark this host's 'running' runs whose process is gone as interrupted; free claims."""
        rows = conn.execute("SELECT id, host, pid FROM runs WHERE status = 'running' AND host = ?",
                            (self._host,)).fetchall()
        dead = [r["id"] for r in rows if self._run_is_dead(r["host"], r["pid"])]
        for run_id in dead:
            conn.execute("UPDATE runs SET status = 'interrupted', finished_at = ? WHERE id = ?",
                         (time.time(), run_id))
            conn.execute("DELETE FROM claims WHERE run_id = ?", (run_id,))

    # ------------------------------------------------------------------------------- configs

    def add_configs(self, device_id: str, items: Iterable[Sequence[Any]], *,
                    priority: int | None = None) -> int:
        """Insert configs `(key, op, family, dtype, source, record_json[, priority])`; returns how
        many were new. Existing keys are kept, but take the lower priority of the two.

        `record_json` may be a JSON string or a dict (e.g. `OpRecord.to_json()`). Priority comes
        from the item, else `priority`, else the source (`SOURCE_PRIORITY`).
        """
        rows = [self._config_params(device_id, item, priority) for item in items]
        with self.transaction() as conn:
            before = self._count_configs(conn, device_id)
            conn.executemany(
                "INSERT INTO op_configs (device_id, key, op, family, dtype, source, priority,"
                " record_json, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (device_id, key) DO UPDATE SET priority = excluded.priority"
                " WHERE excluded.priority < op_configs.priority", rows)
            return self._count_configs(conn, device_id) - before

    @staticmethod
    def _config_params(device_id: str, item: Sequence[Any], priority: int | None) -> tuple:
        key, op, family, dtype, source, record = item[:6]
        if len(item) > 6:
            priority = item[6]
        if priority is None:
            priority = SOURCE_PRIORITY.get(source, DEFAULT_PRIORITY)
        record_json = record if isinstance(record, str) else _dumps(record)
        return (device_id, key, op, family, dtype, source, int(priority), record_json, time.time())

    @staticmethod
    def _count_configs(conn: sqlite3.Connection, device_id: str) -> int:
        return conn.execute("SELECT COUNT(*) FROM op_configs WHERE device_id = ?",
                            (device_id,)).fetchone()[0]

    def config_ids(self, device_id: str) -> dict[str, int]:
        rows = self._query("SELECT key, id FROM op_configs WHERE device_id = ?", (device_id,))
        return {r["key"]: r["id"] for r in rows}

    def configs(self, device_id: str, *, source: str | None = None) -> list[ConfigRow]:
        sql, params = "SELECT * FROM op_configs WHERE device_id = ?", [device_id]
        if source is not None:
            sql, params = sql + " AND source = ?", params + [source]
        return [_config_row(r) for r in self._query(sql + " ORDER BY priority, id", params)]

    def mark_failed(self, config_id: int, run_id: str | None, reason: str) -> None:
        """Record that a config cannot run on its device, so no run claims it again."""
        with self.transaction() as conn:
            conn.execute("UPDATE op_configs SET skip_reason = ?, skip_run_id = ? WHERE id = ?",
                         (reason, run_id, config_id))
            conn.execute("DELETE FROM claims WHERE config_id = ?", (config_id,))

    def zoo_coverage(self, device_id: str) -> tuple[int, int]:
        """(measured, total) configs of source 'zoo': how much of the real models is covered."""
        row = self._query(
            "SELECT COUNT(*) AS total, COALESCE(SUM(EXISTS (SELECT 1 FROM measurements m"
            " WHERE m.config_id = c.id)), 0) AS measured FROM op_configs c"
            " WHERE c.device_id = ? AND c.source = 'zoo'", (device_id,))[0]
        return row["measured"], row["total"]

    def untimed(self, device_id: str) -> dict[str, int]:
        """Configs not measured yet (nor found unable to run), per source: what a resumed
        profile would still time."""
        rows = self._query(
            "SELECT source, COUNT(*) AS n FROM op_configs c WHERE c.device_id = ?"
            " AND c.skip_reason IS NULL AND NOT EXISTS"
            " (SELECT 1 FROM measurements m WHERE m.config_id = c.id) GROUP BY source",
            (device_id,))
        return {r["source"]: r["n"] for r in rows}

    def claim_unmeasured(self, device_id: str, run_id: str, limit: int, *,
                         sources: Sequence[str] | None = None, max_priority: int | None = None,
                         order: str = "priority", below: int = 1, contended: bool = False,
                         earlier_than: str | None = None, paced: bool = False,
                         claim_ttl_s: float = CLAIM_TTL_S) -> list[ConfigRow]:
        """Atomically claim up to `limit` configs with fewer than `below` measurements (1: none
        yet; 2: a second timing) and no live claim; with `contended`, instead those timed once,
        beside other work (`annotate_cpu_use`), for a second timing (by a run other than
        `earlier_than`, if given). With `paced` (and `below` > 1), also those with fewer than
        `below` timings that have a pace beside them and none by `run_id`: a profile made before
        the pace probe gets its timings paired (`paced_pairs`) over its next two runs, not never.

        Live claims are those of 'running' runs whose process still exists (provable on this host
        only) and younger than `claim_ttl_s`; all others are taken over. `order` is 'priority'
        (lowest first, then insertion order) or 'random'. `sources` and `max_priority` restrict
        which configs are eligible.
        """
        order_sql = {"priority": "c.priority, c.id", "random": "random()"}.get(order)
        if order_sql is None:
            raise ValueError(f"order must be 'priority' or 'random', not {order!r}")
        if contended:
            timings = (" AND (SELECT COUNT(*) FROM measurements m WHERE m.config_id = c.id) = 1"
                       " AND EXISTS (SELECT 1 FROM measurements m WHERE m.config_id = c.id AND"
                       " json_extract(m.telemetry_json, '$.cpu_use.contended') = 1"
                       + (" AND m.run_id IS NOT ?)" if earlier_than else ")"))
        elif below <= 1:
            timings = " AND NOT EXISTS (SELECT 1 FROM measurements m WHERE m.config_id = c.id)"
        elif not paced:
            timings = " AND (SELECT COUNT(*) FROM measurements m WHERE m.config_id = c.id) < ?"
        else:  # a running run's timings are paced when their metering window closes, so they
            # count as paced: this run's own, and a concurrent run's (two runs sharing a database
            # timed a zoo config a third time when only this run's counted)
            timings = (" AND ((SELECT COUNT(*) FROM measurements m WHERE m.config_id = c.id) < ?"
                       " OR ((SELECT COUNT(*) FROM measurements m WHERE m.config_id = c.id AND"
                       " (json_extract(m.telemetry_json, '$.pace_s') > 0 OR m.run_id IN"
                       " (SELECT id FROM runs WHERE status = 'running'))) < ? AND NOT EXISTS"
                       " (SELECT 1 FROM measurements m WHERE m.config_id = c.id"
                       " AND m.run_id = ?)))")
        sql = ("SELECT c.* FROM op_configs c WHERE c.device_id = ? AND c.skip_reason IS NULL"
               + timings + " AND NOT EXISTS (SELECT 1 FROM claims k WHERE k.config_id = c.id)")
        params: list[Any] = [device_id] + ([int(below)] if below > 1 and not contended else [])
        params += [int(below), run_id] if below > 1 and paced and not contended else []
        params += [earlier_than] if contended and earlier_than else []
        if sources is not None:
            sql += f" AND c.source IN ({','.join('?' * len(sources))})"
            params += list(sources)
        if max_priority is not None:
            sql, params = sql + " AND c.priority <= ?", params + [int(max_priority)]
        with self.transaction() as conn:
            self._require_running(conn, run_id)
            self._reap_dead_runs(conn)
            conn.execute("DELETE FROM claims WHERE claimed_at < ? OR run_id IN"
                         " (SELECT id FROM runs WHERE status != 'running')",
                         (time.time() - claim_ttl_s,))
            rows = conn.execute(f"{sql} ORDER BY {order_sql} LIMIT ?",
                                (*params, int(limit))).fetchall()
            now = time.time()
            conn.executemany("INSERT INTO claims (config_id, run_id, claimed_at) VALUES (?, ?, ?)",
                             [(r["id"], run_id, now) for r in rows])
        return [_config_row(r) for r in rows]

    def release_claims(self, run_id: str) -> None:
        """Give back a run's unmeasured claims without finishing it."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM claims WHERE run_id = ?", (run_id,))

    def _require_running(self, conn: sqlite3.Connection, run_id: str) -> None:
        row = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None or row["status"] != "running":
            state = "unknown" if row is None else row["status"]
            raise DatabaseError(f"run {run_id} is {state}, not running; start a new run")

    # -------------------------------------------------------------------------- measurements

    def add_measurement(self, config_id: int, run_id: str | None, samples_s: Sequence[float], *,
                        flushed: bool, threads: int | None, noisy: bool,
                        telemetry: dict | None = None) -> int:
        """Store every raw sample of one timing of a config and drop its claim; returns the id."""
        if len(samples_s) == 0:
            raise ValueError("a measurement needs at least one sample")
        median_s, iqr_s = sample_stats(samples_s)
        with self.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO measurements (uid, config_id, run_id, n, median_s, iqr_s, noisy,"
                " flushed, threads, samples, created_at, telemetry_json)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (uuid.uuid4().hex, config_id, run_id, len(samples_s), median_s, iqr_s,
                 int(bool(noisy)), int(bool(flushed)), threads, encode_samples(samples_s),
                 time.time(), None if telemetry is None else _dumps(telemetry)))
            conn.execute("DELETE FROM claims WHERE config_id = ?", (config_id,))
            return cur.lastrowid

    def annotate_cpu_use(self, measurement_ids: Sequence[int], use: CpuUse | None,
                         threads: int | None, *, pace_s: float | None = None) -> None:
        """Record in these op timings' telemetry what other processes used of the CPUs while
        they ran (one reading over all of them; None: not read, a window too short) and whether
        that was enough to slow them (`CpuUse.contended`); `claim_unmeasured(contended=True)` and
        `run_contention` read it back. `pace_s`: the machine's pace over them
        (`profilers.pace`), read by `measured`."""
        paths, values = [], []
        if use is not None:
            paths.append("'$.cpu_use', json(?)")
            values.append(_dumps({**use.to_stats(), "contended": use.contended(threads)}))
        if pace_s is not None:
            paths.append("'$.pace_s', ?")
            values.append(float(pace_s))
        if not paths:
            return
        with self.transaction() as conn:
            conn.executemany(
                "UPDATE measurements SET telemetry_json = json_set(coalesce(telemetry_json, '{}'),"
                f" {', '.join(paths)}) WHERE id = ?", [(*values, mid) for mid in measurement_ids])

    def run_contention(self, run_id: str) -> tuple[int, float | None]:
        """(how many of the run's op timings ran beside other work, the most cores others
        took during one of them; None where none was metered)."""
        row = self._query(
            "SELECT coalesce(sum(json_extract(telemetry_json, '$.cpu_use.contended')), 0) AS n,"
            " max(json_extract(telemetry_json, '$.cpu_use.others_cores')) AS most"
            " FROM measurements WHERE run_id = ?", (run_id,))[0]
        return int(row["n"]), row["most"]

    def measured(self, device_id: str, *, family: str | None = None,
                 op: str | None = None) -> list[MeasuredConfig]:
        """Every measured config of the device, several timings of one config as one (`_pooled`)."""
        return [_pooled(rows) for rows in self._timings(device_id, family, op)]

    def measured_at_usual_pace(self, device_id: str) -> list[MeasuredConfig]:
        """`measured`, each timing brought to the device's usual pace (`at_usual_pace`): what the
        op models are trained on and the predictor takes for a config profiled exactly."""
        groups = self._timings(device_id)
        return at_usual_pace([_pooled(rows) for rows in groups],
                             pace_exponents(_paced_pairs(groups)))

    def paced_pairs(self, device_id: str) -> dict[str, list[tuple[float, float]]]:
        """Per op family, over the configs timed twice or more with a pace beside each: (log of
        the last timing's pace / the first's, log of its median / the first's)."""
        return _paced_pairs(self._timings(device_id))

    def _timings(self, device_id: str, family: str | None = None,
                 op: str | None = None) -> list[list[sqlite3.Row]]:
        """Every timing of the device's configs, one list per config in the order timed."""
        sql = ("SELECT c.id AS config_id, c.key, c.op, c.family, c.dtype, c.source, c.record_json,"
               " m.id AS mid, m.n, m.median_s, m.iqr_s, m.noisy, m.threads, m.flushed,"
               " json_extract(m.telemetry_json, '$.pace_s') AS pace_s"
               " FROM op_configs c JOIN measurements m ON m.config_id = c.id"
               " WHERE c.device_id = ?")
        params: list[Any] = [device_id]
        for column, value in (("family", family), ("op", op)):
            if value is not None:
                sql, params = sql + f" AND c.{column} = ?", params + [value]
        groups: dict[int, list[sqlite3.Row]] = {}
        for r in self._query(sql + " ORDER BY c.id, m.id", params):
            groups.setdefault(r["config_id"], []).append(r)
        return list(groups.values())

    def samples(self, config_id: int) -> list[float]:
        """Every raw sample of a config, in measurement order."""
        rows = self._query("SELECT samples FROM measurements WHERE config_id = ? ORDER BY id",
                           (config_id,))
        return [s for r in rows for s in decode_samples(r["samples"])]

    # --------------------------------------------------------------------- model measurements

    def add_model_measurement(self, device_id: str, model: str, family: str, settings: dict,
                              samples_s: Sequence[float], run_id: str | None = None,
                              stats: dict | None = None) -> int:
        """Store a whole-model timing; `settings['kind']` is 'e2e' (default), 'bench' or 'load'."""
        if len(samples_s) == 0:
            raise ValueError("a model measurement needs at least one sample")
        settings = {"kind": "e2e", **settings}
        if settings["kind"] not in MODEL_KINDS:
            raise ValueError(f"settings['kind'] must be one of {MODEL_KINDS}: {settings['kind']}")
        median_s, _ = sample_stats(samples_s)
        with self.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO model_measurements (uid, device_id, run_id, model, family, kind,"
                " settings_json, samples, n, median_s, stats_json, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (uuid.uuid4().hex, device_id, run_id, model, family, settings["kind"],
                 _dumps(settings), encode_samples(samples_s), len(samples_s), median_s,
                 None if stats is None else _dumps(stats), time.time()))
            return cur.lastrowid

    def model_measurements(self, device_id: str, kind: str | None = None) -> list[ModelMeasurement]:
        sql, params = "SELECT * FROM model_measurements WHERE device_id = ?", [device_id]
        if kind is not None:
            sql, params = sql + " AND kind = ?", params + [kind]
        return [_model_row(r) for r in self._query(sql + " ORDER BY id", params)]

    # ---------------------------------------------------------------------------------- misc

    def state_token(self, device_id: str) -> str:
        """Changes whenever the device's configs, measurements, end-to-end model measurements
        (the correction's fit) or peaks change (the predictor's memory floor reads the peaks),
        and when a profile paces its last window of op timings (`annotate_cpu_use`, after they
        were stored: models trained in between would keep them unpaced; `PACED_TAIL`).
        `hwlat bench` timings are not in it: nothing trained reads them."""
        row = self._query(
            "SELECT (SELECT COUNT(*) || '.' || COALESCE(MAX(id), 0) || '.' ||"
            "        COALESCE(SUM(priority), 0) FROM op_configs WHERE device_id = :d),"
            " (SELECT COUNT(*) || '.' || COALESCE(MAX(m.id), 0) FROM measurements m"
            "        JOIN op_configs c ON c.id = m.config_id WHERE c.device_id = :d) || '.' ||"
            " (SELECT COUNT(*) FROM measurements m CROSS JOIN op_configs c ON c.id = m.config_id"
            "        WHERE m.id > (SELECT MAX(id) FROM measurements) - :tail"
            "        AND c.device_id = :d AND json_extract(m.telemetry_json, '$.pace_s') > 0),"
            " (SELECT COUNT(*) || '.' || COALESCE(MAX(id), 0) FROM model_measurements"
            "        WHERE device_id = :d AND kind = 'e2e'),"
            " (SELECT COALESCE(peaks_json, '') FROM devices WHERE id = :d)",
            {"d": device_id, "tail": PACED_TAIL})[0]
        peaks = hashlib.sha256((row[3] or "").encode()).hexdigest()[:8]
        return f"{device_id}:{row[0]}:{row[1]}:{row[2]}:{peaks}:{POOLING}"


# ------------------------------------------------------------------------------ row builders

_SUMMARY_SQL = """
SELECT d.*,
  (SELECT COUNT(*) FROM op_configs c WHERE c.device_id = d.id) AS n_configs,
  (SELECT COUNT(DISTINCT m.config_id) FROM measurements m JOIN op_configs c ON c.id = m.config_id
     WHERE c.device_id = d.id) AS n_measured,
  (SELECT COALESCE(SUM(m.n), 0) FROM measurements m JOIN op_configs c ON c.id = m.config_id
     WHERE c.device_id = d.id) AS n_samples,
  (SELECT COUNT(*) FROM model_measurements mm WHERE mm.device_id = d.id) AS n_models,
  (SELECT MAX(m.created_at) FROM measurements m JOIN op_configs c ON c.id = m.config_id
     WHERE c.device_id = d.id) AS last_profiled
FROM devices d"""


def _device_row(r: sqlite3.Row) -> DeviceRow:
    return DeviceRow(id=r["id"], name=r["name"], kind=r["kind"], threads=r["threads"],
                     fingerprint=_loads(r["fingerprint_json"]), peaks=_loads(r["peaks_json"]),
                     created_at=r["created_at"])


def _device_summary(r: sqlite3.Row) -> DeviceSummary:
    return DeviceSummary(id=r["id"], name=r["name"], kind=r["kind"], threads=r["threads"],
                         n_configs=r["n_configs"], n_measured=r["n_measured"],
                         n_samples=r["n_samples"], n_models=r["n_models"],
                         last_profiled=r["last_profiled"], created_at=r["created_at"])


def _config_row(r: sqlite3.Row) -> ConfigRow:
    return ConfigRow(id=r["id"], device_id=r["device_id"], key=r["key"], op=r["op"],
                     family=r["family"], dtype=r["dtype"], source=r["source"],
                     priority=r["priority"], record_json=r["record_json"])


POOLING = "fastest"  # how several timings of one config combine (`_pooled`); in the state token


def _pooled(rows: list[sqlite3.Row]) -> MeasuredConfig:
    """One config's measurements as one: the fastest measurement's median and IQR, and the
    sample count of all. Interference from other work on a shared machine only ever slows a timing
    down, so the fastest of several timings is the closest to the device undisturbed (and a
    timing taken in a slow spell is noisy: it takes more samples, and would dominate a median of
    pooled samples)."""
    first, last = rows[0], rows[-1]
    fastest = min(rows, key=lambda r: r["median_s"])
    return MeasuredConfig(
        config_id=first["config_id"], key=first["key"], op=first["op"], family=first["family"],
        dtype=first["dtype"], source=first["source"], record_json=first["record_json"],
        median_s=fastest["median_s"], iqr_s=fastest["iqr_s"], n=sum(r["n"] for r in rows),
        noisy=any(r["noisy"] for r in rows),
        threads=last["threads"], flushed=bool(last["flushed"]), pace_s=fastest["pace_s"])


def _paced_pairs(groups: Sequence[list[sqlite3.Row]]) -> dict[str, list[tuple[float, float]]]:
    """`KernelDB.paced_pairs` from `KernelDB._timings`: each config's first and last timing with
    a pace beside it."""
    pairs: dict[str, list[tuple[float, float]]] = {}
    for rows in groups:
        paced = [r for r in rows if (r["pace_s"] or 0) > 0 and r["median_s"] > 0]
        if len(paced) >= 2:
            first, last = paced[0], paced[-1]
            pairs.setdefault(first["family"], []).append(
                (math.log(last["pace_s"] / first["pace_s"]),
                 math.log(last["median_s"] / first["median_s"])))
    return pairs


PACE_MIN_PAIRS = 30  # configs timed twice beside a probe that a family's exponent needs
PACED_TAIL = 512
"""The latest timings whose paces `KernelDB.state_token` counts (0.3 ms, in the order of the
primary key; all 23k of a database took 20 ms): a metering window holds a few dozen."""
PACE_MAX_EXPONENT = 1.5


def pace_exponents(pairs: dict[str, Sequence[tuple[float, float]]]) -> dict[str, float]:
    """How far each op family's timings follow the pace probe on this device: the slope, through
    the origin, of log(second timing / first) on log(pace beside the second / beside the first)
    over the configs timed twice (`pairs`: family -> those log ratios). A family with fewer than
    `PACE_MIN_PAIRS` gets the slope of all pairs; with fewer than that in all, 0 (not moved).
    Measured on a 10-minute 1-thread profile of the Xeon of 12-06 (2524 zoo configs timed twice,
    the probe 2.05-4.20 ms): convs 0.83 (r = 0.86), pools 0.97, norms 0.67, elementwise 0.61,
    data movement 0.37; the 90th percentile of a pair's |log ratio| went from 0.50 to 0.25-0.30."""
    def slope(xy: Sequence[tuple[float, float]]) -> float:
        sxx = sum(x * x for x, _ in xy)
        k = sum(x * y for x, y in xy) / sxx if sxx > 0 else 0.0
        return min(max(k, 0.0), PACE_MAX_EXPONENT)

    everything = [xy for family in pairs.values() for xy in family]
    pooled = slope(everything) if len(everything) >= PACE_MIN_PAIRS else 0.0
    return {f: slope(xy) if len(xy) >= PACE_MIN_PAIRS else pooled for f, xy in pairs.items()} | {
        "*": pooled}


def at_usual_pace(rows: Sequence[MeasuredConfig],
                  exponents: dict[str, float]) -> list[MeasuredConfig]:
    """The configs with each timing brought to the device's usual pace (`pace.usual_pace` of the
    paces beside them): its median times (usual pace / the pace of its metering window) to its
    family's exponent (`pace_exponents`; "*": any other family's). A 2-vCPU VM flaps between
    speeds ~1.5x apart, and a config timed in the slow one was a point 1.5x high in its model's
    training set: the 2824 configs of one 12-06 profile timed twice came out a median 1.18x
    apart, 1.63x at the 90th percentile. Configs timed without a probe beside them (older
    profiles, GPUs) keep their median, and all of them where fewer than `pace.MIN_PACES` were."""
    usual = pace.usual_pace(r.pace_s for r in rows)
    if usual is None:
        return list(rows)
    return [replace(r, median_s=r.median_s * to_usual_pace(r.pace_s, usual, r.family, exponents))
            if r.pace_s else r for r in rows]


def to_usual_pace(pace_s: float, usual_s: float, family: str,
                  exponents: dict[str, float]) -> float:
    """What a timing of `family` taken at `pace_s` is multiplied by to read at `usual_s`:
    (usual / pace) to the family's exponent (`pace_exponents`; "*": any other family's)."""
    return (usual_s / pace_s) ** exponents.get(family, exponents.get("*", 0.0))


def _model_row(r: sqlite3.Row) -> ModelMeasurement:
    return ModelMeasurement(
        id=r["id"], uid=r["uid"], device_id=r["device_id"], run_id=r["run_id"], model=r["model"],
        family=r["family"], kind=r["kind"], settings=_loads(r["settings_json"]),
        samples_s=tuple(decode_samples(r["samples"])), median_s=r["median_s"],
        stats=_loads(r["stats_json"]), created_at=r["created_at"])
