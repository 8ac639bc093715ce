from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.plan.plan import Plan, PlanRequest, estimate
from kvplan.specs.registry import load_gpu, load_model

REPO = Path(__file__).resolve().parent.parent


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


def run_cli(*args: str) -> CliResult:
    runner = CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1"})
    result = runner.invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return CliResult(result.exit_code, result.stdout, result.stderr)


def plan(model: str, gpu: str = "H100", **kw) -> Plan:
    return estimate(PlanRequest(model=load_model(model), gpu=load_gpu(gpu), **kw))
