"""Issue 24, round four: spec files, GPU files and flags that were accepted and planned wrong.

Each test fails on the code before the fix (a fuzz pass's findings): YAML keys given twice and YAML 1.1
base-60 numbers, a stated total_params of 1,000 for an 8B model, an MoE config with no MoE layer, GPU
figures a billion times off, flags for parts the model lacks, KV dtypes no engine serves in solve's launch
commands, names that break the terminal, and comparisons that named flags the user never gave.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.errors import SpecError
from kvplan.specs.io import load_yaml_text
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parent.parent
QWEN = (REPO / "model_specs" / "models" / "qwen3-8b.yaml").read_text()
H100 = (REPO / "model_specs" / "gpus" / "h100-sxm.yaml").read_text()


def _spec(tmp_path, text: str, name: str = "spec.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _estimate(*args: str):
    return run_cli("estimate", *args, "--max-model-len", "8K")


def test_a_yaml_key_given_twice_is_refused_naming_its_line():
    with pytest.raises(
        SpecError, match=r"s.yaml: line 3, column 1: malformed YAML \(the key 'b' is given twice\)"
    ):
        load_yaml_text("a: 1\nb: 2\nb: 3\n", "s.yaml")
    # a merge key may still be overridden by the mapping's own key
    assert load_yaml_text("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n", "m.yaml")["c"] == {"x": 3, "y": 2}


def test_yaml_base_60_and_leading_zero_octal_stay_text():
    got = load_yaml_text("a: 1:00\nb: 010\nc: 0x10\nd: 12\ne: 1.5\nf: 1_000\n", "n.yaml")
    assert got == {"a": "1:00", "b": "010", "c": 16, "d": 12, "e": 1.5, "f": 1000}


def test_spec_with_base_60_layer_count_is_refused(tmp_path):
    r = _estimate("-m", _spec(tmp_path, QWEN.replace("num_layers: 36", "num_layers: 1:00")))
    assert r.exit_code == 2 and "num_layers: expected an integer, got '1:00'" in r.stderr


def test_stated_params_far_from_the_architecture_are_refused(tmp_path):
    r = _estimate("-m", _spec(tmp_path, QWEN.replace("total_params: 8190735360", "total_params: 1000")))
    assert r.exit_code == 2
    assert "total_params: 1,000 is far from the 8,190,726,144 the architecture holds" in r.stderr
    r = _estimate("-m", _spec(tmp_path, QWEN + "active_params: 99999999999\n", "a.yaml"))
    assert r.exit_code == 2 and "active_params: 99,999,999,999 is above the total, 8,190,735,360" in r.stderr


def test_first_k_dense_replace_past_the_last_layer_is_refused(tmp_path):
    import json

    cfg = json.loads(
        (REPO / "tests" / "fixtures" / "hf" / "corpus" / "deepseek-v3.2-nvfp4" / "config.json").read_text()
    )
    cfg["first_k_dense_replace"] = 1000
    folder = tmp_path / "dsv3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    r = run_cli("estimate", "-m", str(folder), "--max-model-len", "4K")
    assert (
        r.exit_code == 2 and "first_k_dense_replace: 1000 leaves no MoE layer among the 61 layers" in r.stderr
    )


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        (
            "bf16_dense_flops: 989.4e+12",
            "bf16_dense_flops: 1.0",
            "bf16_dense_flops: 1 is not a GPU's figure; give FLOPS",
        ),
        (
            "hbm_bytes_per_s: 3350.0e+9",
            "hbm_bytes_per_s: 3350",
            "hbm_bytes_per_s: 3350 is not a GPU's figure",
        ),
    ],
)
def test_gpu_figures_a_unit_slip_away_are_refused(tmp_path, old, new, says):
    assert old in H100, old
    r = _estimate("-m", "qwen3-8b", "-g", _spec(tmp_path, H100.replace(old, new), "gpu.yaml"))
    assert r.exit_code == 2 and says in r.stderr


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--moe-imbalance", "1.3"), "--moe-imbalance: qwen3-8b has no routed experts; drop the flag"),
        (
            ("--mamba-ssm-cache-dtype", "float32"),
            "--mamba-ssm-cache-dtype: qwen3-8b has no Mamba/linear-attention",
        ),
        (("--images-per-request", "5"), "--images-per-request: qwen3-8b has no cross-attention to images"),
        (
            ("--kv-cache-dtype", "fp8", "--kv-quant-zero-point"),
            "--kv-quant-zero-point: fp8 is a floating-point",
        ),
        (("--kv-quant-scale-bits", "8"), "--kv-quant-scale-bits: bf16 is not quantized"),
    ],
)
def test_flags_for_parts_the_model_lacks_are_refused(flags, says):
    r = _estimate("-m", "qwen3-8b", *flags)
    assert r.exit_code == 2 and says in r.stderr, r.stderr


def test_expert_parallel_still_plans_an_moe_model():
    r = run_cli(
        "estimate",
        "-m",
        "qwen3-235b-a22b",
        "-g",
        "8xH200",
        "--enable-expert-parallel",
        "--max-model-len",
        "8K",
    )
    assert r.exit_code == 0, r.stderr


def test_network_below_one_gigabit_is_refused():
    r = _estimate("-m", "qwen3-8b", "-g", "2x8xH100", "-tp", "8", "-pp", "2", "--network-gbps", "0.0001")
    assert r.exit_code == 2 and "--network-gbps must be 1 to 100,000 Gb/s per GPU, got 0.0001" in r.stderr


def test_prefill_names_pipeline_hops_in_its_communication_term():
    def prefill_line(*gpus: str) -> str:
        out = run_cli("estimate", "-m", "qwen3-8b", *gpus, "--max-model-len", "8K").stdout
        return " ".join(out.split("prefill of one", 1)[1].split("\n\n", 1)[0].split())

    hops = prefill_line("-g", "2x8xH100", "-tp", "8", "-pp", "2", "--network-gbps", "1")
    assert "all-reduce + PP hops 557.3" in hops
    assert "PP hops" not in prefill_line("-g", "2xH100") and "all-reduce" in prefill_line("-g", "2xH100")


def test_solve_refuses_a_kv_dtype_no_engine_serves_and_a_gpu_named_twice():
    r = run_cli(
        "solve", "-m", "qwen3-8b", "--users", "100", "--max-model-len", "8K", "--kv-cache-dtype", "int2"
    )
    assert r.exit_code == 2 and "--kv-cache-dtype int2: neither vLLM nor SGLang serves" in r.stderr
    r = run_cli("solve", "-m", "qwen3-8b", "--users", "100", "--max-model-len", "8K", "-g", "H100,h100-sxm")
    assert r.exit_code == 2 and "--gpus: H100-SXM named twice" in r.stderr


@pytest.mark.parametrize("name", ["a\\nb\\x1b[31mred", "", "   "])
def test_a_name_that_would_break_the_output_is_refused(tmp_path, name):
    r = _estimate("-m", _spec(tmp_path, QWEN.replace("name: qwen3-8b", f'name: "{name}"', 1)))
    assert r.exit_code == 2 and "is not a printable name" in r.stderr


def test_compare_names_the_flag_given_and_refuses_repeats():
    r = run_cli("compare", "ladder", "-m", "qwen3-8b", "--max-model-len", "1")
    assert r.exit_code == 2 and r.stderr.startswith(
        "error: --max-model-len 1: the ladder needs at least 4 tokens"
    )
    r = run_cli("compare", "ladder", "-m", "qwen3-8b", "--avg-context", "1", "--max-model-len", "8K")
    assert r.exit_code == 2 and r.stderr.startswith("error: --avg-context 1: the shared prefix defaults")
    r = run_cli("compare", "table", "-m", "qwen3-8b,qwen3-8b")
    assert r.exit_code == 2 and "--models: qwen3-8b given twice" in r.stderr
    r = run_cli("compare", "table", "-m", "qwen3-8b,,llama3-8b")
    assert r.exit_code == 2 and "an empty name between commas" in r.stderr
    r = run_cli("compare", "table", "-m", "qwen3-8b", "-f", "csv", "--json")
    assert r.exit_code == 2 and "give one of --json and --format csv" in r.stderr


def test_compare_plot_with_nothing_that_fits_says_why():
    r = run_cli("compare", "plot", "-m", "qwen3-8b", "-g", "1xT4")
    assert r.exit_code == 3
    assert r.stderr.startswith(
        "error: nothing to plot: no model and variant fits 1x T4 at any context (qwen3-8b: "
    )
    assert "weights need 15.26 GiB per GPU" in r.stderr


def test_check_log_says_when_gpus_names_more_than_the_log_ran_on():
    log = str(REPO / "tests" / "fixtures" / "logs" / "vllm_v011_llama31_8b_h100.log")
    d = run_cli("check-log", log, "-g", "8xH100", "--json").json()
    assert d["notes"][0] == (
        "--gpus 8xH100 names 8 GPUs but the log ran on 1 (TP x PP x DP as it logs them); checked on 1"
    )
