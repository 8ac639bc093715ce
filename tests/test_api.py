"""The Python API (kvplan/api.py): each function gives what the CLI's --json gives for the same inputs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import kvplan
from helpers import REPO, run_cli
from kvplan import check_log, compare, estimate, solve
from kvplan.errors import NoAnswer, UsageError, WeightsDoNotFit

LOG = Path(__file__).resolve().parent / "fixtures" / "logs" / "vllm_v011_llama31_8b_h100.log"


def test_estimate_matches_cli():
    plan = estimate(
        model="llama3-70b", gpus="8xH100", max_model_len="8K", kv_cache_dtype="fp8", engine="vllm"
    )
    cli = run_cli(
        "estimate",
        "-m",
        "llama3-70b",
        "-g",
        "8xH100",
        "--max-model-len",
        "8K",
        "--kv-cache-dtype",
        "fp8",
        "--json",
    )
    assert cli.exit_code == 0
    assert plan.to_dict() == cli.json()


def test_estimate_takes_numbers_and_sizes():
    by_text = estimate("llama3-8b", max_model_len="8K", kv_cache_memory="20GiB")
    by_number = estimate("llama3-8b", max_model_len=8192, kv_cache_memory=20 * 2**30)
    assert by_text.to_dict() == by_number.to_dict()
    assert by_text.kv_pool_tokens > 0


def test_solve_matches_cli():
    got = solve("llama3-70b", 100, max_model_len="8K", gpus="H100,H200,B200", price="2.5,3.8,6")
    cli = run_cli(
        "solve", "-m", "llama3-70b", "--users", "100", "--max-model-len", "8K",
        "-g", "H100,H200,B200", "--price", "2.5,3.8,6", "--json",
    )  # fmt: skip
    assert got.to_dict() == cli.json()
    fixed = solve("llama3-8b", 1, max_context=True, gpus="8xH200")
    assert (
        fixed.to_dict()
        == run_cli("solve", "-m", "llama3-8b", "-u", "1", "--max-context", "-g", "8xH200", "--json").json()
    )


def test_compare_matches_cli():
    got = compare(
        models=["llama3-70b", "deepseek-v3"], variants="shipped,gqa8+int8", gpus="8xH100", max_model_len="32K"
    )
    cli = run_cli(
        "compare", "table", "-m", "llama3-70b,deepseek-v3", "--variants", "shipped,gqa8+int8",
        "-g", "8xH100", "--context", "32K", "--json",
    )  # fmt: skip
    assert got.to_dict() == cli.json()


def test_check_log_matches_cli():
    got = check_log(str(LOG), gpus="H100")
    assert got.to_dict() == run_cli("check-log", str(LOG), "-g", "H100", "--json").json()
    by_text = check_log(log_text=LOG.read_text(encoding="utf-8"), gpus="H100")
    assert by_text.to_dict() == got.to_dict()


def test_errors_are_kvplans_types():
    with pytest.raises(UsageError, match="--gpus"):
        estimate("llama3-8b", gpus="NoSuchGpu")
    with pytest.raises(UsageError, match="unknown argument"):
        estimate("llama3-8b", max_model_length="8K")
    with pytest.raises(WeightsDoNotFit):
        estimate("llama3.1-405b", gpus="H100")
    with pytest.raises(NoAnswer):
        solve("llama3-70b", 500, max_model_len="8K", tpot_ms=5)
    with pytest.raises(UsageError):
        check_log()


def test_import_is_cheap_and_the_names_stay_functions():
    code = (
        "import sys, kvplan; heavy = [m for m in ('typer', 'rich', 'click', 'pydantic', 'yaml') if m in sys.modules];"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    import importlib

    importlib.import_module("kvplan.search.solve")
    importlib.import_module("kvplan.search.compare")
    assert callable(kvplan.solve) and kvplan.solve.__module__ == "kvplan.api"
    assert kvplan.compare.__module__ == "kvplan.api"
    assert kvplan.estimate.__doc__ and "8K" in kvplan.estimate.__doc__


def test_version():
    result = run_cli("--version")
    assert result.exit_code == 0
    assert result.stdout == f"kvplan {kvplan.__version__}\n"
    from importlib.metadata import version

    assert version("kvplan") == kvplan.__version__


def test_results_print_short():
    """Issue 24: a Plan printed as a 52,000-character repr (the whole profile inside)."""
    import kvplan

    plan = kvplan.estimate(model="qwen3-8b", gpus="H200")
    text = repr(plan)
    assert len(text) < 600 and text == str(plan)
    assert text.startswith("qwen3-8b on 1x H200") and "max concurrent requests" in text
    solved = kvplan.solve("qwen3-8b", 10, max_model_len="8K")
    assert len(repr(solved)) < 1500 and repr(solved).startswith("solve qwen3-8b for 10 users")
    table = kvplan.compare(models="qwen3-8b,llama3-70b")
    assert len(repr(table)) < 600 and "llama3-70b / shipped" in repr(table)
    log = kvplan.check_log(str(REPO / "tests/fixtures/logs/vllm_v011_llama31_8b_h100.log"), gpus="H100")
    assert len(repr(log)) < 1200 and "KV cache tokens: log 443,264" in repr(log)


def test_solve_for_a_request_rate_and_max_rate_from_python():
    """`solve --request-rate` / `--max-rate` from Python (issue 22): the CLI's answer, a short repr."""
    import json

    from helpers import run_cli

    got = kvplan.solve(
        "llama3-8b", request_rate=5, ttft_ms=500, tpot_ms=50, max_model_len="8K", num_prompts=200
    )
    cli = run_cli("solve", "-m", "llama3-8b", "--request-rate", "5", "--ttft-ms", "500", "--tpot-ms", "50",
                  "--max-model-len", "8K", "--num-prompts", "200", "--json").json()  # fmt: skip
    d = got.to_dict()
    assert d["mode"] == cli["mode"] == "min-gpus-at-rate" and d["request_rate"] == 5
    assert d["answer"]["num_gpus"] == cli["answer"]["num_gpus"]
    assert d["ttft_ms"] == cli["ttft_ms"] and json.dumps(d["tpot_ms"]) == json.dumps(cli["tpot_ms"])
    assert repr(got).startswith("min-gpus-at-rate: ") and "\n" not in repr(got) and len(repr(got)) < 300
    top = kvplan.solve("llama3-8b", max_rate=True, gpus="1xH100", ttft_ms=500, tpot_ms=50,
                       max_model_len="8K", num_prompts=200)  # fmt: skip
    assert top.mode == "max-rate" and top.request_rate > 5
    for bad in ({"users": 10}, {"ttft_ms": None}):
        kw = {"request_rate": 5, "ttft_ms": 500, "tpot_ms": 50, "max_model_len": "8K", **bad}
        with pytest.raises(UsageError):
            kvplan.solve("llama3-8b", **kw)
    with pytest.raises(UsageError, match="solve: ttft_ms: only with request_rate or max_rate"):
        kvplan.solve("llama3-8b", users=10, ttft_ms=500, max_model_len="8K")
