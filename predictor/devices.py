"""Which profiled device a prediction is for: named, this machine, or the only one there is."""

from __future__ import annotations

from dataclasses import replace

from kernels_db.store import DeviceRow, KernelDB
from profilers.errors import DeviceError
from profilers.fingerprint import DeviceFingerprint, fingerprint


def _known(db: KernelDB) -> str:
    rows = db.list_devices()
    return ", ".join(f"{r.id} ({r.name})" if r.name else r.id for r in rows) or "none"


def with_threads(db: KernelDB, row: DeviceRow, threads: int) -> DeviceRow:
    """The same hardware profiled at another thread count, or a DeviceError saying how to get it."""
    if row.kind != "cpu" or row.threads == threads:
        return row
    sibling = replace(DeviceFingerprint.from_json(row.fingerprint), threads=threads).device_id
    try:
        return db.get_device(sibling)
    except DeviceError:
        raise DeviceError(
            f"device {row.label} was profiled at {row.threads} threads, not {threads}; run "
            f"`hwlat profile --threads {threads}` on that machine") from None


def this_machine_id(kind: str = "cpu", threads: int | None = None) -> str:
    return fingerprint(kind, threads).device_id


def choose_device(db: KernelDB, device: str | None, *, threads: int | None = None,
                  kind: str = "cpu") -> DeviceRow:
    """`--device` if given; else this machine if profiled; else the only device in the db."""
    if device:
        row = db.get_device(device)
        return with_threads(db, row, threads) if threads else row
    rows = db.list_devices()
    here = this_machine_id(kind, threads)
    if any(r.id == here for r in rows):
        return db.get_device(here)
    if len(rows) == 1:
        row = db.get_device(rows[0].id)
        return with_threads(db, row, threads) if threads else row
    if not rows:
        raise DeviceError("no device is profiled in this database; run `hwlat profile` on the "
                          "target machine (or `hwlat db import FILE`)")
    raise DeviceError(f"several devices are profiled and this machine is not one of them; pass "
                      f"--device with one of: {_known(db)}")


def require_this_machine(row: DeviceRow) -> None:
    """Measuring for real only makes sense on the device itself."""
    here = this_machine_id(row.kind if row.kind == "cpu" else "cuda", row.threads)
    if here != row.id:
        raise DeviceError(f"device {row.label} is not this machine ({here}); run this on the "
                          f"device itself, or profile this machine with `hwlat profile`")
