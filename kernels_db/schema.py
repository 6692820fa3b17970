"""The kernel database schema and its migrations.

`MIGRATIONS[i]` takes a database from schema version `i` to `i + 1`; `SCHEMA_VERSION` is their
count. A migration is an SQL script or a callable taking the connection. All pending migrations run
in one transaction (see `store.KernelDB`), so a failed upgrade leaves the file as it was. The
version lives in `PRAGMA user_version`; the `hwlat_meta` row `format = hwlat-kernels` marks the
file as ours, so a foreign SQLite file is never mistaken for an empty kernel database.

Append new migrations; never edit a released one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

FORMAT_NAME = "hwlat-kernels"

_V1 = """
CREATE TABLE hwlat_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO hwlat_meta (key, value) VALUES ('format', 'hwlat-kernels');

CREATE TABLE devices (
    id               TEXT PRIMARY KEY,
    name             TEXT UNIQUE,             -- user alias, NULL if none
    kind             TEXT NOT NULL,           -- 'cpu', 'cuda', ...
    threads          INTEGER,
    fingerprint_json TEXT NOT NULL,
    peaks_json       TEXT,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL
);

-- Run ids are uuid4 hex, not integers, so exports from different machines merge without clashes.
CREATE TABLE runs (
    id            TEXT PRIMARY KEY,
    device_id     TEXT NOT NULL REFERENCES devices(id) ON DELETE CASCADE,
    started_at    REAL NOT NULL,
    finished_at   REAL,
    status        TEXT NOT NULL CHECK (status IN ('running', 'done', 'interrupted', 'failed')),
    budget_s      REAL,
    pid           INTEGER,
    host          TEXT,
    versions_json TEXT NOT NULL DEFAULT '{}',
    settings_json TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX runs_device ON runs (device_id);

CREATE TABLE op_configs (
    id          INTEGER PRIMARY KEY,
    device_id   TEXT NOT NULL REFERENCES devices(id) ON DELETE CASCADE,
    key         TEXT NOT NULL,
    op          TEXT NOT NULL,
    family      TEXT NOT NULL,
    dtype       TEXT NOT NULL,
    source      TEXT NOT NULL,                -- 'zoo', 'adaptive', 'perturb', 'random', ...
    priority    INTEGER NOT NULL DEFAULT 5,   -- lower is profiled first
    record_json TEXT NOT NULL,
    skip_reason TEXT,                         -- set when the config cannot run on the device
    skip_run_id TEXT REFERENCES runs(id) ON DELETE SET NULL,
    created_at  REAL NOT NULL,
    UNIQUE (device_id, key)
);
CREATE INDEX op_configs_order ON op_configs (device_id, priority, id);

-- Raw samples are little-endian float64 bytes: exact round trip, 8 bytes a sample.
CREATE TABLE measurements (
    id             INTEGER PRIMARY KEY,
    uid            TEXT NOT NULL UNIQUE,      -- uuid4 hex, dedupes imports
    config_id      INTEGER NOT NULL REFERENCES op_configs(id) ON DELETE CASCADE,
    run_id         TEXT REFERENCES runs(id) ON DELETE SET NULL,
    n              INTEGER NOT NULL,
    median_s       REAL NOT NULL,
    iqr_s          REAL NOT NULL,
    noisy          INTEGER NOT NULL,
    flushed        INTEGER NOT NULL,
    threads        INTEGER,
    samples        BLOB NOT NULL,
    created_at     REAL NOT NULL,
    telemetry_json TEXT
);
CREATE INDEX measurements_config ON measurements (config_id);

CREATE TABLE claims (
    config_id  INTEGER PRIMARY KEY REFERENCES op_configs(id) ON DELETE CASCADE,
    run_id     TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    claimed_at REAL NOT NULL
);
CREATE INDEX claims_run ON claims (run_id);

CREATE TABLE model_measurements (
    id            INTEGER PRIMARY KEY,
    uid           TEXT NOT NULL UNIQUE,
    device_id     TEXT NOT NULL REFERENCES devices(id) ON DELETE CASCADE,
    run_id        TEXT REFERENCES runs(id) ON DELETE SET NULL,
    model         TEXT NOT NULL,
    family        TEXT NOT NULL,
    kind          TEXT NOT NULL CHECK (kind IN ('e2e', 'bench', 'load')),
    settings_json TEXT NOT NULL,
    samples       BLOB NOT NULL,
    n             INTEGER NOT NULL,
    median_s      REAL NOT NULL,
    stats_json    TEXT,
    created_at    REAL NOT NULL
);
CREATE INDEX model_measurements_device ON model_measurements (device_id, kind);
"""

# Max pooling used to be timed on standard-normal inputs, which ran a median 1.31x as slow as on
# the activations it sees inside a model (see `profilers.ops._activation_inputs`). Those timings
# measured the wrong thing: they are dropped, their configs stay and the next `hwlat profile`
# times them again.
_V2_RETIME_MAX_POOLS = """
DELETE FROM measurements WHERE config_id IN (
    SELECT id FROM op_configs
    WHERE op LIKE 'aten.max\\_pool%' ESCAPE '\\'
       OR op LIKE 'aten.adaptive\\_max\\_pool%' ESCAPE '\\'
       OR op LIKE 'aten.mkldnn\\_max\\_pool%' ESCAPE '\\'
);
"""

Migration = str | Callable[[sqlite3.Connection], None]

MIGRATIONS: list[Migration] = [_V1, _V2_RETIME_MAX_POOLS]
SCHEMA_VERSION = len(MIGRATIONS)


def split_statements(script: str) -> list[str]:
    """An SQL script as single statements, so it can run inside our transaction.

    `executescript` would commit first, breaking the all-or-nothing upgrade.
    """
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    if current.strip():
        raise ValueError(f"incomplete SQL statement in migration: {current.strip()[:60]!r}")
    return statements


def apply_migrations(conn: sqlite3.Connection, from_version: int) -> None:
    """Run migrations `from_version..SCHEMA_VERSION-1`; the caller holds the write transaction."""
    for migration in MIGRATIONS[from_version:]:
        if callable(migration):
            migration(conn)
        else:
            for statement in split_statements(migration):
                conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
