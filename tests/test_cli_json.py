"""--json everywhere: compare's --json is --format json, and a failure under --json is a
kvplan.error/1 object on stdout as well as the usual one-line message on stderr."""

from __future__ import annotations

import json

import pytest

from helpers import run_cli
from kvplan import errors
from kvplan.errors import InfeasibleError, UsageError


@pytest.mark.parametrize(
    "args",
    [
        ["compare", "table", "--models", "llama3-8b,deepseek-v2-lite", "--variants", "shipped,gqa4+int8"],
        ["compare", "ladder", "--model", "llama3-8b", "-g", "2xH100"],
    ],
)
def test_compare_json_is_format_json(args):
    with_format = run_cli(*args, "--format", "json")
    with_json = run_cli(*args, "--json")
    assert with_json.exit_code == with_format.exit_code == 0
    assert with_json.stdout == with_format.stdout
    assert json.loads(with_json.stdout)["schema"] == "kvplan.compare/1"


def test_compare_plot_json_gives_the_curves():
    r = run_cli("compare", "plot", "--models", "llama3-8b", "--json")
    assert r.exit_code == 0, r.stderr
    j = r.json()
    assert j["kind"] == "plot" and j["chart"] is None
    (series,) = j["series"]
    assert series["label"] == "llama3-8b" and len(series["max_concurrency"]) == len(j["contexts"])


def _error_object(r) -> dict:
    err = json.loads(r.stdout)
    assert set(err) == {"schema", "error", "error_type", "exit_code", "figures"}
    assert err["schema"] == "kvplan.error/1" and err["exit_code"] == r.exit_code
    # stderr keeps the one-line message, the same text
    assert r.stderr == f"error: {err['error']}\n"
    assert len(r.stderr.strip().splitlines()) == 1
    return err


@pytest.mark.parametrize(
    ("args", "error_type", "exit_code"),
    [
        (["estimate", "-m", "llama3-70b", "-g", "H100", "--max-model-len", "8K"], InfeasibleError, 3),
        (["estimate", "-m", "no-such-model"], UsageError, 2),
        (
            ["solve", "-m", "llama3-70b", "-u", "10", "--max-model-len", "128K", "--max-gpus", "8"],
            InfeasibleError,
            3,
        ),
        (
            ["solve", "-m", "llama3.1-405b", "-u", "5000", "--max-model-len", "128K", "--max-gpus", "2"],
            InfeasibleError,
            3,
        ),
        (["compare", "ladder", "--avg-context", "16K"], UsageError, 2),
        (
            ["compare", "table", "--models", "llama2-7b", "--variants", "gqa5", "--format", "json"],
            UsageError,
            2,
        ),
        (["check-log", "/no/such/file.log"], UsageError, 2),
    ],
)
def test_json_failure_is_an_error_object(args, error_type, exit_code):
    r = run_cli(*args, "--json")
    assert r.exit_code == exit_code
    err = _error_object(r)
    # the most specific type the library raised, within the family the exit code stands for
    assert issubclass(getattr(errors, err["error_type"]), error_type)
    assert isinstance(err["figures"], dict)


def test_failure_without_json_prints_nothing_on_stdout():
    r = run_cli("estimate", "-m", "llama3-70b", "-g", "H100", "--max-model-len", "8K")
    assert r.exit_code == 3 and r.stdout == "" and r.stderr.startswith("error: ")


def test_solve_without_an_answer_is_no_answer():
    r = run_cli(
        "solve", "-m", "llama3.1-405b", "-u", "5000", "--max-model-len", "128K", "--max-gpus", "2", "--json"
    )
    assert r.exit_code == 3
    assert _error_object(r)["error_type"] == "NoAnswer"
