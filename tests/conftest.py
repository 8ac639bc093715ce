from __future__ import annotations

import sys

import pytest

from helpers import run_cli


@pytest.fixture(autouse=True)
def _isolated_data_dir(tmp_path_factory, monkeypatch):
    """No test reads or writes the user's own calibrations."""
    monkeypatch.setenv("KVPLAN_DATA_DIR", str(tmp_path_factory.mktemp("kvplan-data")))


@pytest.fixture(autouse=True)
def _no_hugging_face_hub(tmp_path_factory, monkeypatch):
    """No test reaches the network or the user's Hugging Face cache: offline, an empty cache.
    The library reads these at import, so an already imported one is pointed there too."""
    cache = tmp_path_factory.mktemp("hf-cache")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    if "huggingface_hub.constants" in sys.modules:
        constants = sys.modules["huggingface_hub.constants"]
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))


@pytest.fixture
def cli():
    return run_cli
