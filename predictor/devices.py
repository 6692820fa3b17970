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
    """`--device` if given (an id or alias; or `cpu`, `cuda`, `cuda:N` as `hwlat profile` takes
    them: this machine's device of that kind); else this machine if profiled (at `threads`, else
    at the one thread count it was profiled at); else the only profiled device in the db.
    A device that has only whole-model timings (`hwlat bench` stores those) is not a profile and
    is never the default."""
    if device:
        try:
            row = db.get_device(device)
        except DeviceError as unknown:
            try:
                parse_device(device)
            except DeviceError:
                raise unknown from None
            return _default(db, threads, device, only_kind=True)
        return with_threads(db, row, threads) if threads else row
    return _default(db, threads, kind, only_kind=False)


def _default(db: KernelDB, threads: int | None, kind: str, *, only_kind: bool) -> DeviceRow:
    rows = db.list_devices()
    profiled = [r for r in rows if r.n_measured
                and (not only_kind or r.kind == parse_device(kind)[0])]
    try:
        here = fingerprint(kind, threads)
    except DeviceError:  # e.g. `--device cuda` on a machine without one: a GPU profiled elsewhere
        here = None
    if here and any(r.id == here.device_id for r in profiled):
        return db.get_device(here.device_id)
    if here and threads is None:  # this machine profiled at one other thread count: that one
        siblings = [r for r in profiled if _same_hardware(db.get_device(r.id), here)]
        if len(siblings) == 1:
            return db.get_device(siblings[0].id)
    if len(profiled) == 1:
        row = db.get_device(profiled[0].id)
        return with_threads(db, row, threads) if threads else row
    what = f"{parse_device(kind)[0].upper()} device" if only_kind else "device"
    if not profiled:
        unprofiled = f" ({_known(db)} only {'has' if len(rows) == 1 else 'have'} whole-model " \
                     f"timings)" if rows and not only_kind else ""
        raise DeviceError(f"no {what} is profiled in this database{unprofiled}; run `hwlat "
                          f"profile` on the target machine (or `hwlat db import FILE`)")
    raise DeviceError(f"several {what}s are profiled and this machine is not one of them; pass "
                      f"--device with one of: {_known(db, profiled)}")


def _same_hardware(row: DeviceRow, here: DeviceFingerprint) -> bool:
    """`row` is `here` at another thread count."""
    if row.kind != "cpu" or here.kind != "cpu":
        return False
    return replace(DeviceFingerprint.from_json(row.fingerprint),
                   threads=here.threads).device_id == here.device_id


def require_this_machine(row: DeviceRow) -> None:
    """Measuring for real only makes sense on the device itself."""
    here = this_machine_id(row.kind if row.kind == "cpu" else "cuda", row.threads)
    if here != row.id:
        raise DeviceError(f"device {row.label} is not this machine ({here}); run this on the "
                          f"device itself, or profile this machine with `hwlat profile`")
