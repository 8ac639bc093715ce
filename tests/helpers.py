from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

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


def load_benchmark(name: str) -> ModuleType:
    """A script of benchmarks/ as a module (they import each other by name: the folder goes on the path)."""
    folder = REPO / "benchmarks"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def draft_for(model: str, folder: Path) -> str:
    """The EAGLE draft fixture (tests/fixtures/draft/eagle-llama3-8b.json) at `model`'s hidden size and vocabulary,
    as an EAGLE head for that target must be (it runs on the target's hidden states); its attention keeps the
    fixture's 8 KV heads of 128, so its KV pages differ from most targets' and form a KV-cache group of their own."""
    import json

    spec = load_model(model)
    cfg = json.loads((REPO / "tests" / "fixtures" / "draft" / "eagle-llama3-8b.json").read_text())
    cfg.update(hidden_size=spec.hidden_size, vocab_size=spec.vocab_size, head_dim=128)
    path = folder / f"eagle-for-{spec.name}.json"
    path.write_text(json.dumps(cfg))
    return str(path)
