"""The code stays lint-clean and formatted (ruff, configured in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from helpers import REPO

RUFF = shutil.which("ruff")


@pytest.mark.skipif(RUFF is None, reason="ruff is not installed (it is in the test extra)")
@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff(args):
    r = subprocess.run([RUFF, *args], cwd=REPO, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


MYPY = shutil.which("mypy")


@pytest.mark.skipif(MYPY is None, reason="mypy is not installed (it is in the test extra)")
def test_mypy_is_clean_on_the_package():
    # configured in pyproject.toml ([tool.mypy]: files = kvplan)
    r = subprocess.run([MYPY], cwd=REPO, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
