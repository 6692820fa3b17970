"""Move a device's profile between databases: a versioned, gzipped JSON-lines file.

Line 1 is the header (`"format": "hwlat-profile"`, `"version"`, the device row); then one object a
line: runs, configs, measurements (every raw sample), model measurements; the last line is an
`end` record with the counts, so a truncated file is refused instead of half-imported. Runs,
measurements and model measurements carry uuids, and configs their `OpRecord.key`, so import
merges idempotently: importing the same file twice adds nothing, and files from different
machines never collide. An import is one transaction: it adds everything or nothing.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernels_db.store import (
    KernelDB,
    decode_samples,
    encode_samples,
    library_versions,
    sample_stats,
)
from profilers import ops
from profilers.errors import DatabaseError

FORMAT_NAME = "hwlat-profile"
FORMAT_VERSION = 2
# Format 1 files come from hwlat versions that timed max pooling on standard-normal inputs (see
# `kernels_db.schema._V2_RETIME_MAX_POOLS`): their max-pool measurements are not imported.
RETIMED_MAX_POOLS_FROM = 2
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class ExportSummary:
    path: Path
    device_id: str
    n_runs: int
    n_configs: int
    n_measurements: int
    n_model_measurements: int


@dataclass
class ImportSummary:
    device_id: str
    device_created: bool = False
    runs_added: int = 0
    configs_added: int = 0
    measurements_added: int = 0
    measurements_skipped: int = 0  # already in the database
    measurements_stale: int = 0  # max pools timed on noise by an older hwlat, to be re-timed
    model_measurements_added: int = 0
    model_measurements_skipped: int = 0
    notes: list[str] = field(default_factory=list)  # e.g. an alias dropped because it was taken

    @property
    def added_anything(self) -> bool:
        return bool(self.runs_added or self.configs_added or self.measurements_added
                    or self.model_measurements_added or self.device_created)


# ------------------------------------------------------------------------------------ export


def export_device(db: KernelDB, device_id_or_name: str, path: str | os.PathLike) -> ExportSummary:
    """Write one device's whole profile to `path` (gzipped JSON lines), atomically."""
    device = db.get_device(device_id_or_name)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    counts = {"run": 0, "config": 0, "measurement": 0, "model_measurement": 0}
    try:
        with db.snapshot() as conn, gzip.open(tmp, "wt", encoding="utf-8") as f:
            _write(f, _header(device))
            for record in _export_records(conn, device.id):
                counts[record["type"]] += 1
                _write(f, record)
            _write(f, {"type": "end", "counts": counts})
        os.replace(tmp, path)
    except OSError as e:
        why = e.strerror or str(e)  # the error names the temporary file; say the user's path
        raise DatabaseError(f"cannot write export {path}: {why}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return ExportSummary(path, device.id, counts["run"], counts["config"], counts["measurement"],
                         counts["model_measurement"])


def _write(f: io.TextIOBase, record: dict) -> None:
    f.write(json.dumps(record, separators=(",", ":")) + "\n")


def _header(device: Any) -> dict:
    return {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "exported_at": time.time(),
        "versions": library_versions(),
        "device": {"id": device.id, "name": device.name, "kind": device.kind,
                   "threads": device.threads, "fingerprint": device.fingerprint,
                   "peaks": device.peaks, "created_at": device.created_at},
    }


def _export_records(conn: Any, device_id: str) -> Iterator[dict]:
    for r in conn.execute("SELECT * FROM runs WHERE device_id = ? ORDER BY started_at",
                          (device_id,)):
        yield {"type": "run", "id": r["id"], "started_at": r["started_at"],
               "finished_at": r["finished_at"], "status": r["status"], "budget_s": r["budget_s"],
               "pid": r["pid"], "host": r["host"], "versions": json.loads(r["versions_json"]),
               "settings": json.loads(r["settings_json"])}
    for r in conn.execute("SELECT * FROM op_configs WHERE device_id = ? ORDER BY id",
                          (device_id,)):
        yield {"type": "config", "key": r["key"], "op": r["op"], "family": r["family"],
               "dtype": r["dtype"], "source": r["source"], "priority": r["priority"],
               "record_json": r["record_json"], "skip_reason": r["skip_reason"],
               "skip_run_id": r["skip_run_id"], "created_at": r["created_at"]}
    for r in conn.execute("SELECT m.*, c.key FROM measurements m JOIN op_configs c"
                          " ON c.id = m.config_id WHERE c.device_id = ? ORDER BY m.id",
                          (device_id,)):
        yield {"type": "measurement", "uid": r["uid"], "key": r["key"], "run_id": r["run_id"],
               "noisy": bool(r["noisy"]), "flushed": bool(r["flushed"]),
               "threads": r["threads"], "created_at": r["created_at"],
               "telemetry": _maybe_json(r["telemetry_json"]),
               "samples_s": decode_samples(r["samples"])}
    for r in conn.execute("SELECT * FROM model_measurements WHERE device_id = ? ORDER BY id",
                          (device_id,)):
        yield {"type": "model_measurement", "uid": r["uid"], "run_id": r["run_id"],
               "model": r["model"], "family": r["family"], "kind": r["kind"],
               "settings": json.loads(r["settings_json"]), "stats": _maybe_json(r["stats_json"]),
               "created_at": r["created_at"], "samples_s": decode_samples(r["samples"])}


def _maybe_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# ------------------------------------------------------------------------------------ import


def import_file(db: KernelDB, path: str | os.PathLike) -> ImportSummary:
    """Merge an export into `db` in one transaction; returns what was new."""
    path = Path(path)
    lines = _read_lines(path)
    header = _parse_header(path, next(lines, None))
    importer = _Importer(db, path, header["device"], header["version"])
    with db.transaction() as conn:
        importer.begin(conn)
        ended = False
        for lineno, line in lines:
            if ended:
                raise _malformed(path, lineno, "data after the end record")
            ended = importer.line(conn, lineno, line)
        if not ended:
            raise DatabaseError(f"{path} is truncated (no end record); export it again")
    return importer.summary


def _read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a gzipped or plain export; read errors become DatabaseError."""
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == _GZIP_MAGIC
        opener = gzip.open if gzipped else open
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    yield lineno, line
    except FileNotFoundError:
        raise DatabaseError(f"no such file: {path}") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DatabaseError(f"{path} is not a readable hwlat profile export ({e})") from None


def _parse_header(path: Path, first: tuple[int, str] | None) -> dict:
    not_ours = f"{path} is not an hwlat profile export (expected \"format\": \"{FORMAT_NAME}\")"
    if first is None:
        raise DatabaseError(f"{path} is empty, not an hwlat profile export")
    try:
        header = json.loads(first[1])
    except json.JSONDecodeError:
        raise DatabaseError(not_ours) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise DatabaseError(not_ours)
    version = header.get("version")
    if not isinstance(version, int) or version < 1:
        raise DatabaseError(f"{path} has an invalid format version {version!r}")
    if version > FORMAT_VERSION:
        raise DatabaseError(f"{path} was written by a newer hwlat (format version {version} > "
                            f"{FORMAT_VERSION}); upgrade hwlat to import it")
    if not isinstance(header.get("device"), dict) or "id" not in header["device"]:
        raise DatabaseError(f"{path} has no device in its header; export it again")
    return header


def _is_max_pool(op: str) -> bool:
    parts = op.split(".")
    return len(parts) > 1 and parts[1] in ops.MAX_POOLS


def _malformed(path: Path, lineno: int, why: str) -> DatabaseError:
    return DatabaseError(f"{path} is malformed at line {lineno} ({why}); nothing was imported")


class _Importer:
    """The state of one import: key -> config id, known runs, counts."""

    def __init__(self, db: KernelDB, path: Path, device: dict, version: int) -> None:
        self.db, self.path, self.device, self.version = db, path, device, version
        self.summary = ImportSummary(device_id=device["id"])
        self.config_ids: dict[str, int] = {}
        self.run_ids: set[str] = set()
        self.max_pool_keys: set[str] = set()

    def begin(self, conn: Any) -> None:
        self._merge_device(conn)
        known = conn.execute("SELECT key, id, op FROM op_configs WHERE device_id = ?",
                             (self.device["id"],)).fetchall()
        self.config_ids = {r["key"]: r["id"] for r in known}
        self.max_pool_keys = {r["key"] for r in known if _is_max_pool(r["op"])}
        self.run_ids = {r[0] for r in conn.execute("SELECT id FROM runs")}

    def line(self, conn: Any, lineno: int, text: str) -> bool:
        """Import one line; True for the end record."""
        try:
            record = json.loads(text)
            kind = record["type"]
            if kind == "end":
                return True
            handler = {"run": self._run, "config": self._config,
                       "measurement": self._measurement,
                       "model_measurement": self._model_measurement}.get(kind)
            if handler is None:
                raise ValueError(f"unknown record type {kind!r}")
            handler(conn, record)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError,
                sqlite3.IntegrityError) as e:
            raise _malformed(self.path, lineno, f"{type(e).__name__}: {e}") from None
        return False

    def _merge_device(self, conn: Any) -> None:
        """Keep a known device's own fingerprint; fill in its alias and peaks if it has none."""
        d, s = self.device, self.summary
        local = conn.execute("SELECT * FROM devices WHERE id = ?", (d["id"],)).fetchone()
        name = d.get("name")
        if name and conn.execute("SELECT 1 FROM devices WHERE (name = ? OR id = ?) AND id != ?",
                                 (name, name, d["id"])).fetchone():
            s.notes.append(f"alias '{name}' is taken by another device here; not imported")
            name = None
        peaks = None if d.get("peaks") is None else json.dumps(d["peaks"], sort_keys=True)
        if local is None:
            now = time.time()
            conn.execute(
                "INSERT INTO devices (id, name, kind, threads, fingerprint_json, peaks_json,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (d["id"], name, d["kind"], d.get("threads"),
                 json.dumps(d.get("fingerprint", {}), sort_keys=True), peaks,
                 d.get("created_at", now), now))
            s.device_created = True
            return
        conn.execute("UPDATE devices SET name = COALESCE(name, ?),"
                     " peaks_json = COALESCE(peaks_json, ?) WHERE id = ?", (name, peaks, d["id"]))

    def _run(self, conn: Any, r: dict) -> None:
        if r["id"] in self.run_ids:
            return
        # A run from another database cannot be alive here.
        status = "interrupted" if r["status"] == "running" else r["status"]
        conn.execute(
            "INSERT INTO runs (id, device_id, started_at, finished_at, status, budget_s, pid,"
            " host, versions_json, settings_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r["id"], self.device["id"], r["started_at"], r.get("finished_at"), status,
             r.get("budget_s"), r.get("pid"), r.get("host"),
             json.dumps(r.get("versions", {}), sort_keys=True),
             json.dumps(r.get("settings", {}), sort_keys=True)))
        self.run_ids.add(r["id"])
        self.summary.runs_added += 1

    def _config(self, conn: Any, r: dict) -> None:
        if r["key"] in self.config_ids:
            return
        if not isinstance(r["record_json"], str):
            raise TypeError("record_json must be a JSON string")
        cur = conn.execute(
            "INSERT INTO op_configs (device_id, key, op, family, dtype, source, priority,"
            " record_json, skip_reason, skip_run_id, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self.device["id"], r["key"], r["op"], r["family"], r["dtype"], r["source"],
             int(r["priority"]), r["record_json"], r.get("skip_reason"),
             self._run_ref(r.get("skip_run_id")), r["created_at"]))
        self.config_ids[r["key"]] = cur.lastrowid
        if _is_max_pool(r["op"]):
            self.max_pool_keys.add(r["key"])
        self.summary.configs_added += 1

    def _run_ref(self, run_id: str | None) -> str | None:
        if run_id is not None and run_id not in self.run_ids:
            raise ValueError(f"a record refers to run {run_id}, missing from the file")
        return run_id

    def _samples(self, r: dict) -> list[float]:
        samples = [float(x) for x in r["samples_s"]]
        if not samples:
            raise ValueError("a measurement without samples")
        return samples

    def _measurement(self, conn: Any, r: dict) -> None:
        if r["key"] not in self.config_ids:
            raise ValueError(f"measurement of config {r['key']} missing from the file")
        samples = self._samples(r)
        if self.version < RETIMED_MAX_POOLS_FROM and r["key"] in self.max_pool_keys:
            if not self.summary.measurements_stale:
                self.summary.notes.append(
                    "max-pool timings of this older export were taken on random inputs and are "
                    "not imported; `hwlat profile` times those configs again")
            self.summary.measurements_stale += 1
            return
        median_s, iqr_s = sample_stats(samples)
        telemetry = r.get("telemetry")
        cur = conn.execute(
            "INSERT OR IGNORE INTO measurements (uid, config_id, run_id, n, median_s, iqr_s,"
            " noisy, flushed, threads, samples, created_at, telemetry_json)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (str(r["uid"]), self.config_ids[r["key"]], self._run_ref(r.get("run_id")),
             len(samples), median_s, iqr_s, int(bool(r["noisy"])), int(bool(r["flushed"])),
             r.get("threads"), encode_samples(samples), r["created_at"],
             None if telemetry is None else json.dumps(telemetry, sort_keys=True)))
        if cur.rowcount:
            self.summary.measurements_added += 1
        else:
            self.summary.measurements_skipped += 1

    def _model_measurement(self, conn: Any, r: dict) -> None:
        samples = self._samples(r)
        stats = r.get("stats")
        cur = conn.execute(
            "INSERT OR IGNORE INTO model_measurements (uid, device_id, run_id, model, family,"
            " kind, settings_json, samples, n, median_s, stats_json, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (str(r["uid"]), self.device["id"], self._run_ref(r.get("run_id")), r["model"],
             r["family"], r["kind"], json.dumps(r["settings"], sort_keys=True),
             encode_samples(samples), len(samples), sample_stats(samples)[0],
             None if stats is None else json.dumps(stats, sort_keys=True), r["created_at"]))
        if cur.rowcount:
            self.summary.model_measurements_added += 1
        else:
            self.summary.model_measurements_skipped += 1
