"""Which device a prediction is for: named, this machine, the only one, or a clear error."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kernels_db.store import KernelDB
from predictor.devices import choose_device, require_this_machine, with_threads
from profilers.errors import DeviceError
from profilers.fingerprint import DeviceFingerprint, fingerprint


def add(db: KernelDB, fp: DeviceFingerprint, name: str | None = None, *,
        profiled: bool = True) -> None:
    """A device; `profiled`: with one timed op config, as `hwlat profile` leaves it."""
    db.upsert_device(fp.to_json(), device_id=fp.device_id, kind=fp.kind, threads=fp.threads,
                     name=name)
    if profiled:
        db.add_configs(fp.device_id, [("k", "aten.relu.default", "eltwise", "float32", "random",
                                       {"op": "aten.relu.default"})])
        db.add_measurement(db.config_ids(fp.device_id)["k"], None, [1e-5], flushed=True,
                           threads=fp.threads, noisy=False)


@pytest.fixture
def here():
    return fingerprint("cpu", 1)


def other(fp: DeviceFingerprint) -> DeviceFingerprint:
    return replace(fp, model="Some Other CPU", cores={"physical": 64, "logical": 128})


def test_named_device_and_thread_siblings(tmp_path, here):
    with KernelDB(tmp_path / "k.db") as db:
        add(db, here, "box")
        add(db, replace(here, threads=2))
        assert choose_device(db, "box").id == here.device_id
        assert choose_device(db, "box", threads=2).threads == 2
        with pytest.raises(DeviceError, match="--threads 4"):
            with_threads(db, db.get_device("box"), 4)


def test_defaults_to_this_machine_then_to_the_only_device(tmp_path, here):
    with KernelDB(tmp_path / "k.db") as db:
        add(db, other(here), "remote")
        assert choose_device(db, None, threads=1).name == "remote"  # the only one
        add(db, here)
        assert choose_device(db, None, threads=1).id == here.device_id  # this machine wins


def test_a_device_with_only_whole_model_timings_is_never_the_default(tmp_path, here):
    with KernelDB(tmp_path / "k.db") as db:
        add(db, replace(here, threads=2), profiled=False)  # what `hwlat bench` leaves
        with pytest.raises(DeviceError, match="no device is profiled.*whole-model timings"):
            choose_device(db, None, threads=2)
        add(db, here)  # this machine profiled at 1 thread: the default when --threads is not given
        assert choose_device(db, None).id == here.device_id
        assert choose_device(db, None, threads=1).id == here.device_id
        add(db, other(here), "remote")
        assert choose_device(db, None).id == here.device_id  # this machine's profile still wins
        with pytest.raises(DeviceError, match="several devices") as info:
            choose_device(db, None, threads=2)  # no profile at 2 threads, and two to choose from
        assert replace(here, threads=2).device_id not in str(info.value)


def test_several_foreign_devices_need_a_choice(tmp_path, here):
    with KernelDB(tmp_path / "k.db") as db:
        add(db, other(here), "a")
        add(db, replace(other(here), model="Third CPU"), "b")
        with pytest.raises(DeviceError, match="--device"):
            choose_device(db, None, threads=1)
        with pytest.raises(DeviceError, match="known"):
            choose_device(db, "nope")


def test_measuring_needs_the_device_itself(tmp_path, here):
    with KernelDB(tmp_path / "k.db") as db:
        add(db, here)
        add(db, other(here), "remote")
        require_this_machine(db.get_device(here.device_id))
        with pytest.raises(DeviceError, match="not this machine"):
            require_this_machine(db.get_device("remote"))


def test_device_kind_picks_this_machines_profile_of_that_kind(tmp_path, here):
    with KernelDB(tmp_path / "k.db") as db:
        add(db, other(here), "remote")
        with pytest.raises(DeviceError, match="this machine's CPU is not profiled.*remote"):
            choose_device(db, "cpu")  # never the remote box, though it is the only profile
        add(db, here)
        assert choose_device(db, "cpu", threads=1).id == here.device_id  # as `hwlat profile`
        assert choose_device(db, "CPU").id == here.device_id
        with pytest.raises(DeviceError, match="(?i)gpu|cuda"):  # no GPU here, or none profiled
            choose_device(db, "cuda:0")
        with pytest.raises(DeviceError, match="unknown device 'tpu'"):
            choose_device(db, "tpu")


def test_a_fingerprint_this_version_cannot_read_is_not_this_machine(tmp_path, here):
    with KernelDB(tmp_path / "k.db") as db:
        db.upsert_device({}, device_id="cpu-imported-t4", kind="cpu", threads=4)  # as imported
        db.add_configs("cpu-imported-t4", [("k", "aten.relu.default", "eltwise", "float32",
                                           "random", {"op": "aten.relu.default"})])
        db.add_measurement(db.config_ids("cpu-imported-t4")["k"], None, [1e-5], flushed=True,
                           threads=4, noisy=False)
        add(db, other(here), "remote")
        with pytest.raises(DeviceError, match="several devices"):
            choose_device(db, None)  # one line, not a KeyError from the empty fingerprint
