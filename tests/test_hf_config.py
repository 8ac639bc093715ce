"""Reading Hugging Face config.json files offline: same numbers as the shipped specs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_cli
from kvplan.formats import KV_DTYPES
from kvplan.model import kv
from kvplan.model.params import param_breakdown
from kvplan.specs.matrices import vision_matrices
from kvplan.specs.registry import load_model

FIXTURES = Path(__file__).parent / "fixtures" / "hf" / "synthetic"  # trimmed configs (README there)
BF16 = KV_DTYPES["bf16"]


def kv_figures(spec) -> tuple[int, int, int]:
    layers = spec.layers
    return (
        sum(kv.layer_bits_per_token(x, BF16) for x in layers) // 8,
        sum(kv.layer_bits_per_token(x, BF16) for x in layers if kv.is_growing(x)) // 8,
        sum(
            kv.layer_bits_per_token(x, BF16) * kv.layer_entries(x, 1 << 40)
            for x in layers
            if not kv.is_growing(x)
        )
        // 8,
    )


@pytest.mark.parametrize(
    "name",
    [
        "llama3-70b",
        "qwen3-32b",
        "qwen2.5-72b",
        "gemma3-27b",
        "gemma2-27b",
        "gpt-oss-20b",
        "llama4-scout",
        "deepseek-v3",
    ],
)
def test_config_json_matches_the_shipped_spec(name):
    from_config = load_model(str(FIXTURES / f"{name}.json"))
    shipped = load_model(name)
    assert kv_figures(from_config) == kv_figures(shipped)
    assert [type(x).__name__ for x in from_config.layers] == [type(x).__name__ for x in shipped.layers]
    # the text model's: this fixture has no vision_config, the shipped gemma3-27b counts the SigLIP tower vLLM loads
    tower = sum(m.params for m in vision_matrices(shipped.vision_tower)) if shipped.vision_tower else 0
    assert param_breakdown(from_config).total == pytest.approx(
        param_breakdown(shipped).total - tower, rel=0.01
    )
    assert from_config.max_context == shipped.max_context
    assert from_config.tie_word_embeddings == shipped.tie_word_embeddings


def test_quantization_config_sets_weight_dtypes():
    ds = load_model(str(FIXTURES / "deepseek-v3.json"))
    assert ds.weight_formats["attention"] == ds.expert_weight_dtype == "fp8-b128-s32"
    assert (ds.weight_formats["embedding"], ds.weight_formats["lm_head"]) == ("bf16", "bf16")
    oss = load_model(str(FIXTURES / "gpt-oss-20b.json"))
    assert (oss.weight_dtype, oss.expert_weight_dtype) == ("bf16", "mxfp4")


def test_mistral_v01_sliding_window_applies_to_every_layer():
    spec = load_model(str(FIXTURES / "mistral-7b-v0.1.json"))
    assert all(getattr(x, "window", None) == 4096 for x in spec.layers)
    assert kv.sequence_bytes(spec.layers, BF16, 32768) == 32 * 4096 * 4096


def test_explicit_head_dim_wins_over_hidden_over_heads():
    spec = load_model(str(FIXTURES / "qwen3-32b.json"))
    assert spec.layers[0].head_dim == 128  # hidden_size / heads would be 80


def test_kv_size_never_comes_from_the_name(tmp_path: Path):
    cfg = json.loads((FIXTURES / "llama3-70b.json").read_text())
    cfg.update(
        {"num_key_value_heads": 2, "num_hidden_layers": 10, "_name_or_path": "meta-llama/Meta-Llama-3-70B"}
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_model(str(path))
    assert kv_figures(spec)[0] == 10 * 2 * 2 * 128 * 2
    # a directory holding config.json works too
    assert load_model(str(tmp_path)).num_layers == 10


def test_estimate_from_config_json_equals_estimate_from_name():
    a = run_cli(
        "estimate",
        "--model",
        str(FIXTURES / "deepseek-v3.json"),
        "--gpus",
        "8xH200",
        "--max-model-len",
        "32K",
        "--weight-dtype",  # the config's per-matrix formats (bf16 embedding/head) are tested in test_quant
        "fp8",
        "--json",
    )
    b = run_cli(
        "estimate", "--model", "deepseek-v3", "--gpus", "8xH200", "--max-model-len", "32K",
        "--weight-dtype", "fp8", "--json",
    )  # fmt: skip
    assert a.exit_code == 0 and b.exit_code == 0
    for key in ("kv_bytes_per_token", "kv_bytes_per_token_per_gpu", "num_blocks_per_gpu", "max_concurrency"):
        assert a.json()[key] == pytest.approx(b.json()[key], rel=0.002), key


def test_config_problems_one_line_each(tmp_path: Path):
    cfg = json.loads((FIXTURES / "llama3-70b.json").read_text())
    del cfg["num_hidden_layers"]
    cfg["num_key_value_heads"] = "eight"
    cfg["vocab_size"] = 0
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = run_cli("estimate", "--model", str(path))
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    text = r.stderr
    assert f"{path}: num_hidden_layers: required field is missing" in text
    assert f"{path}: num_key_value_heads: expected an integer, got 'eight'" in text
    assert f"{path}: vocab_size: must be >= 1, got 0" in text


def test_malformed_json(tmp_path: Path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 4096,,}')
    r = run_cli("estimate", "--model", str(path))
    assert r.exit_code == 2 and "malformed JSON" in r.stderr and "line 1" in r.stderr


def test_unsupported_layer_type_says_what_to_do(tmp_path: Path):
    cfg = json.loads((FIXTURES / "llama3-70b.json").read_text())
    cfg["layer_types"] = ["retention", "full_attention"] * 40  # a mixer kvplan does not know
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = run_cli("estimate", "--model", str(path))
    assert r.exit_code == 2 and "layer_types[0]" in r.stderr and "YAML spec" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # a known state mixer without its fields is refused field by field, never planned as attention
    cfg["layer_types"] = ["linear_attention", "full_attention"] * 40
    path.write_text(json.dumps(cfg))
    r = run_cli("estimate", "--model", str(path))
    assert r.exit_code == 2 and "linear_num_key_heads: required field is missing" in r.stderr
