"""The CLI at the boundary: JSON numbers, exit codes, one-line errors, listings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, run_cli
from kvplan.units import GiB

REQUIRED_MODELS = [
    "llama2-7b",
    "llama2-70b",
    "llama3-8b",
    "llama3-70b",
    "llama3.1-405b",
    "mistral-7b-v0.3",
    "mixtral-8x7b",
    "qwen2.5-72b",
    "qwen3-8b",
    "qwen3-32b",
    "qwen3-235b-a22b",
    "deepseek-v2-lite",
    "deepseek-v3",
    "kimi-k2",
    "gemma2-27b",
    "gemma3-27b",
    "gpt-oss-20b",
    "gpt-oss-120b",
    "llama4-scout",
    "gpt3-175b",
]
REQUIRED_GPUS = [
    "A100-40GB",
    "A100-80GB",
    "A100-40GB-PCIe",
    "A100-80GB-PCIe",
    "H100-SXM",
    "H100-PCIe",
    "H100-NVL",
    "H200",
    "H20",
    "B200",
    "L40S",
    "L4",
    "MI300X",
    "MI325X",
    "MI355X",
]
JSON_KEYS = [
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_gpu",
    "weight_bytes_per_gpu",
    "kv_budget_bytes_per_gpu",
    "kv_pool_tokens",
    "max_concurrency",
]


def assert_one_line_error(result, code: int, *needles: str) -> None:
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    text = " ".join(result.stderr.split())
    for needle in needles:
        assert needle in text, text


def test_estimate_json_has_the_documented_keys():
    r = run_cli("estimate", "--model", "llama3-70b", "--gpus", "8xH100", "--json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    for key in JSON_KEYS:
        assert isinstance(out[key], (int, float)), key
    assert out["schema"] == "kvplan.plan/1"
    assert out["kv_bytes_per_token"] == 327680
    assert out["cluster"] == {
        "num_gpus": 8,
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": 1,
        "data_parallel_size": 1,
        # issue 23: plain TP reads as EP 1, one attention group of TP GPUs (a dense model: no experts)
        "expert_parallel_size": 1,
        "attention_tp_size": 8,
        "attention_dp_size": 1,
        "routed_experts_per_gpu": None,
        "expert_tp_size": None,
    }
    assert out["settings"]["max_model_len"] == 8192  # the model's maximum by default


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_readme_documents_every_json_key(engine):
    r = run_cli(
        "estimate",
        "--model",
        "gemma3-27b",
        "--gpus",
        "2xH100",
        "--avg-context",
        "4K",
        "--max-model-len",
        "32K",
        "--shared-prefix-tokens",
        "1024",
        "--engine",
        engine,
        "--json",
    )
    readme = (REPO / "README.md").read_text()

    def walk(obj, prefix=""):
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield f"{prefix}{k}"
                if k not in ("explain", "stages"):
                    yield from walk(v, f"{prefix}{k}.")

    missing = [k for k in walk(r.json()) if f"`{k}`" not in readme]
    assert not missing, f"README lacks JSON keys: {missing}"


def test_human_output_shows_units_and_assumptions():
    r = run_cli("estimate", "--model", "llama3-70b", "--gpus", "8xH100", "--max-model-len", "8K")
    assert r.exit_code == 0
    assert "GiB" in r.stdout and "KiB" in r.stdout and "tokens" in r.stdout
    assert "estimated" in r.stdout and "Assumptions" in r.stdout
    assert " GB " not in r.stdout.replace("80 GB HBM3", "")  # memory sizes are GiB, not GB


def test_explain_traces_numbers_to_formulas():
    r = run_cli(
        "estimate", "--model", "deepseek-v3", "--gpus", "8xH200", "--max-model-len", "8K", "--explain"
    )
    assert r.exit_code == 0
    assert "Where each number comes from" in r.stdout
    assert "formula: sum over layers" in r.stdout and "README, The formulas" in r.stdout
    explain = run_cli(
        "estimate", "--model", "deepseek-v3", "--gpus", "8xH200", "--max-model-len", "8K", "--json"
    ).json()["explain"]
    by_name = {e["quantity"]: e for e in explain}
    assert by_name["KV bytes per token"]["value"] == "68.62 KiB"
    assert "kv_lora_rank + qk_rope_head_dim" in by_name["KV bytes per token"]["formula"]
    assert {
        "weights per GPU",
        "KV budget per GPU",
        "blocks per GPU",
        "KV pool tokens",
        "max concurrency",
    } <= set(by_name)


@pytest.mark.parametrize("name", ["llama3-70b", "LLAMA3-70B", "meta-llama/Meta-Llama-3-70B", "Llama-3-70B"])
def test_names_aliases_and_hf_ids_resolve_case_insensitively(name):
    r = run_cli("estimate", "--model", name, "--gpus", "8xh100", "--json")
    assert r.exit_code == 0 and r.json()["model"]["name"] == "llama3-70b"


@pytest.mark.parametrize(
    ("gpus", "cluster"),
    [
        ("8xH100", (8, 8, 1, 1)),
        ("2x8xH100", (16, 8, 2, 1)),
        ("h100", (8, 8, 1, 1)),  # bare GPU name: TP from -tp
        ("16xH100", (16, 8, 2, 1)),
    ],
)
def test_gpus_flag_forms(gpus, cluster):
    extra = ["-tp", "8"] if gpus == "h100" else []
    r = run_cli("estimate", "--model", "llama3-70b", "--gpus", gpus, "--json", *extra)
    assert r.exit_code == 0, r.stderr
    c = r.json()["cluster"]
    assert (
        c["num_gpus"],
        c["tensor_parallel_size"],
        c["pipeline_parallel_size"],
        c["data_parallel_size"],
    ) == cluster


def test_bare_h100_is_the_80gb_sxm_part():
    r = run_cli("estimate", "--model", "llama3-8b", "--gpus", "H100", "--json")
    assert r.json()["gpu"]["name"] == "H100-SXM"


@pytest.mark.parametrize(
    ("text", "expected"), [("51.02GiB", int(51.02 * GiB)), ("40GB", 40 * 10**9), ("2147483648", 2 * GiB)]
)
def test_kv_cache_memory_units(text, expected):
    r = run_cli("estimate", "--model", "llama3-8b", "--gpus", "H100", "--kv-cache-memory", text, "--json")
    assert r.json()["kv_budget_bytes_per_gpu"] == expected


def test_vllm_flag_names_are_accepted():
    r = run_cli(
        "estimate",
        "-m",
        "llama3-8b",
        "--gpus",
        "2xH100",
        "-tp",
        "2",
        "-pp",
        "1",
        "--context",
        "4096",
        "--gpu-memory-utilization",
        "0.8",
        "--kv-cache-dtype",
        "fp8",
        "--block-size",
        "32",
        "--no-enable-prefix-caching",
        "--max-num-batched-tokens",
        "4096",
        "--max-num-seqs",
        "128",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    s = r.json()["settings"]
    assert (s["block_size"], s["kv_cache_dtype"], s["gpu_memory_utilization"], s["max_num_seqs"]) == (
        32,
        "fp8",
        0.8,
        128,
    )


def test_unknown_model_names_close_matches():
    assert_one_line_error(
        run_cli("estimate", "--model", "llama3-7b"), 2, "unknown model 'llama3-7b'", "llama3-70b", "llama3-8b"
    )


def test_unknown_gpu_names_close_matches():
    assert_one_line_error(
        run_cli("estimate", "--model", "llama3-8b", "--gpus", "8xH10"), 2, "unknown GPU 'H10'", "H100"
    )


def test_infeasible_exit_code_and_numbers():
    assert_one_line_error(
        run_cli("estimate", "--model", "llama3.1-405b", "--gpus", "8xH100"), 3, "weights need", "GiB per GPU"
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization must be in (0, 1]"),
        (["--gpus", "8xH100", "-tp", "3"], "does not divide"),
        (["--max-model-len", "lots"], "--max-model-len"),
        (["--kv-cache-dtype", "int3"], "unknown dtype 'int3'"),
        (["--kv-cache-memory", "12 parsecs"], "--kv-cache-memory"),
    ],
)
def test_bad_flags_are_usage_errors(args, needle):
    assert_one_line_error(run_cli("estimate", "--model", "llama3-8b", *args), 2, needle)


def test_context_above_maximum_is_infeasible():
    assert_one_line_error(
        run_cli("estimate", "--model", "llama3-8b", "--max-model-len", "16K"), 3, "maximum context of 8,192"
    )


def test_malformed_yaml_names_file_and_line(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nlayer_types: {attn: [\n")
    assert_one_line_error(run_cli("estimate", "--model", str(bad)), 2, str(bad), "line", "malformed YAML")


def test_invalid_yaml_gives_one_line_per_problem(tmp_path: Path):
    spec = (REPO / "model_specs/models/llama3-8b.yaml").read_text()
    spec = spec.replace("num_layers: 32\n", "").replace("hidden_size: 4096", "hidden_size: lots")
    spec = spec.replace("head_dim: 128}", "head_dim: 128, heads: 3}")
    path = tmp_path / "broken.yaml"
    path.write_text(spec)
    r = run_cli("estimate", "--model", str(path))
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if str(path) in line]
    joined = "\n".join(lines)
    assert "num_layers: required field is missing" in joined
    assert "hidden_size" in joined
    assert "layer_types.attn.full.heads: unknown field" in joined
    assert len(lines) >= 3


def test_missing_spec_file():
    assert_one_line_error(
        run_cli("estimate", "--model", "/nonexistent/spec.yaml"), 2, "/nonexistent/spec.yaml: file not found"
    )


def test_models_and_gpus_listings():
    r = run_cli("models", "--json")
    names = {m["name"] for m in r.json()}
    assert set(REQUIRED_MODELS) <= names
    assert all(m["sources"] for m in r.json())
    g = run_cli("gpus", "--json").json()
    assert set(REQUIRED_GPUS) <= {x["name"] for x in g}
    assert run_cli("models").exit_code == 0 and "deepseek-v3" in run_cli("models").stdout
    assert "MI300X" in run_cli("gpus").stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "--model", "llama3-70b", "--gpus", "8xH100", "--json"],
        ["compare", "table", "--format", "json"],
        ["compare", "ladder"],
        ["compare", "plot", "--models", "llama3-8b"],  # the terminal curve needs no matplotlib
    ],
)
def test_planning_never_imports_torch_or_triton(argv):
    code = (
        "import sys; from kvplan.cli import app\n"
        f"try:\n    app({argv!r})\n"
        "except SystemExit as e: assert not e.code, e.code\n"
        "heavy = [m for m in ('torch', 'triton', 'numpy', 'matplotlib') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_console_script_runs():
    r = subprocess.run(
        [sys.executable, "-m", "kvplan.cli", "estimate", "--model", "llama3-8b", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"]["name"] == "llama3-8b"  # the module really ran the command
    m = subprocess.run([sys.executable, "-m", "kvplan", "models", "--json"], capture_output=True, text=True)
    assert m.returncode == 0 and any(x["name"] == "llama3-8b" for x in json.loads(m.stdout))


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (
            lambda s: s.replace("layer_pattern: [attn]", "layer_pattern: [attn, local]"),
            "layer_pattern names 'local'",
        ),
        (lambda s: s.replace("{kind: full,", "{kind: fancy,"), "layer_types.attn"),
        (
            lambda s: s.replace("layer_pattern: [attn]", "layer_pattern: [attn]\nweight_dtype: int3"),
            "weight_dtype 'int3'",
        ),
        (lambda s: s.replace("sources:", "sources: []\nold_sources:"), "sources"),
    ],
)
def test_spec_validation_errors_name_the_field(tmp_path: Path, edit, needle):
    path = tmp_path / "spec.yaml"
    path.write_text(edit((REPO / "model_specs/models/llama3-8b.yaml").read_text()))
    r = run_cli("estimate", "--model", str(path))
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    assert str(path) in r.stderr and needle in " ".join(r.stderr.split())


def test_gpu_spec_file_and_pipeline_beyond_layers(tmp_path: Path):
    gpu = tmp_path / "mygpu.yaml"
    gpu.write_text(
        (REPO / "model_specs/gpus/h100-sxm.yaml").read_text().replace("name: H100-SXM", "name: MyGPU")
    )
    r = run_cli("estimate", "--model", "llama3-8b", "--gpus", f"2x{gpu}", "--json")
    assert r.exit_code == 0 and r.json()["gpu"]["name"] == "MyGPU"
    assert_one_line_error(
        run_cli("estimate", "--model", "llama3-8b", "--gpus", "H100", "-pp", "40"),
        3,
        "PP 40 exceeds the 32 layers",
    )
