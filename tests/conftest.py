"""Test isolation: no test reads or writes the user's database, model cache or journals."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_dirs(tmp_path_factory):
    saved = {k: os.environ.get(k) for k in ("XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
                                            "HWLAT_DB")}
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    os.environ["XDG_DATA_HOME"] = str(tmp_path_factory.mktemp("data"))
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    os.environ.pop("HWLAT_DB", None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
