from __future__ import annotations

import pytest

from helpers import run_cli


@pytest.fixture
def cli():
    return run_cli
