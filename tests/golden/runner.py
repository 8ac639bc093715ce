"""Run one golden case in-process, with a pinned width and an empty data directory."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from typer.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent.parent


def run(args: list[str]) -> dict:
    from kvplan.cli import app

    old = os.getcwd()
    with tempfile.TemporaryDirectory() as data:
        runner = CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1", "KVPLAN_DATA_DIR": data})
        os.chdir(REPO)
        try:
            result = runner.invoke(app, args)
        finally:
            os.chdir(old)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise RuntimeError(f"{args}: {result.exception!r}") from result.exception
    return {"args": args, "exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr}
