from __future__ import annotations

import pytest

from helpers import run_cli


@pytest.fixture(autouse=True)
def _isolated_data_dir(tmp_path_factory, monkeypatch):
    """No test reads or writes the user's own calibrations."""
    monkeypatch.setenv("KVPLAN_DATA_DIR", str(tmp_path_factory.mktemp("kvplan-data")))


@pytest.fixture
def cli():
    return run_cli
