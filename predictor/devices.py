"""Which profiled device a prediction is for: named, this machine, or the only one there is."""

from __future__ import annotations

from dataclasses import replace

from kernels_db.store import DeviceRow, KernelDB
from profilers.clocks import parse_device
from profilers.errors import DeviceError
from profilers.fingerprint import DeviceFingerprint, fingerprint


def _known(db: KernelDB, rows=None) -> str:
    rows = db.list_devices() if rows is None else rows
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
    """`--device` if given: an id, a unique id prefix or an alias; or `cpu`, `cuda`, `cuda:N` as
    `hwlat profile` takes them, for this machine's profile of that kind. Else this machine's
    profile (at `threads`; without it at torch's default count, else at the one count it was
    profiled at); else the only profiled device in the db. A device that has only whole-model
    timings (`hwlat bench` stores those) is not a profile and is never the default."""
    if device and _is_kind(device) and not _exact(db, device):
        return _this_machine(db, device, threads)
    if device:
        row = db.get_device(device)
        return with_threads(db, row, threads) if threads else row
    rows = db.list_devices()
    profiled = [r for r in rows if r.n_measured]
    mine = _profiles_of_this_machine(db, profiled, kind, threads)
    if mine:
        return mine
    if len(profiled) == 1:
        row = db.get_device(profiled[0].id)
        return with_threads(db, row, threads) if threads else row
    if not profiled:
        unprofiled = f" ({_known(db)} only {'has' if len(rows) == 1 else 'have'} whole-model " \
                     f"timings)" if rows else ""
        raise DeviceError(f"no device is profiled in this database{unprofiled}; run `hwlat "
                          f"profile` on the target machine (or `hwlat db import FILE`)")
    raise DeviceError(f"several devices are profiled and this machine is not one of them; pass "
                      f"--device with one of: {_known(db, profiled)}")


def _is_kind(device: str) -> bool:
    try:
        parse_device(device)
    except DeviceError:
        return False
    return True


def _exact(db: KernelDB, device: str) -> bool:
    """A device whose id or alias is exactly `device` (a kind such as `cuda` is not a prefix)."""
    return any(device in (r.id, r.name) for r in db.list_devices())


def _this_machine(db: KernelDB, device: str, threads: int | None) -> DeviceRow:
    """`--device cpu|cuda[:N]`: this machine's profile of that kind, never another machine's."""
    profiled = [r for r in db.list_devices() if r.n_measured]
    mine = _profiles_of_this_machine(db, profiled, device, threads)
    if mine:
        return mine
    kind = parse_device(device)[0].upper()
    at = f" at {threads} threads" if threads else ""
    raise DeviceError(f"this machine's {kind} is not profiled{at} in this database; run `hwlat "
                      f"profile --device {device}` here, or pass --device with one of: "
                      f"{_known(db, profiled)}")


def _profiles_of_this_machine(db: KernelDB, profiled: list, kind: str,
                              threads: int | None) -> DeviceRow | None:
    """This machine's profile at `threads`, or (without `threads`) at the default count, else
    at the one other count it was profiled at; None where there is none."""
    here = fingerprint(kind, threads)  # a DeviceError (one line) where this machine has no GPU
    if any(r.id == here.device_id for r in profiled):
        return db.get_device(here.device_id)
    if threads is None:
        siblings = [r for r in profiled if _same_hardware(db.get_device(r.id), here)]
        if len(siblings) == 1:
            return db.get_device(siblings[0].id)
    return None


def _same_hardware(row: DeviceRow, here: DeviceFingerprint) -> bool:
    """`row` is `here` at another thread count (False for a fingerprint this version cannot
    read, e.g. one imported without it)."""
    if row.kind != "cpu" or here.kind != "cpu":
        return False
    try:
        theirs = DeviceFingerprint.from_json(row.fingerprint)
    except (KeyError, TypeError, ValueError):
        return False
    return replace(theirs, threads=here.threads).device_id == here.device_id


def require_this_machine(row: DeviceRow) -> None:
    """Measuring for real only makes sense on the device itself."""
    here = this_machine_id(row.kind if row.kind == "cpu" else "cuda", row.threads)
    if here != row.id:
        raise DeviceError(f"device {row.label} is not this machine ({here}); run this on the "
                          f"device itself, or profile this machine with `hwlat profile`")
