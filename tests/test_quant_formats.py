"""AWQ, GPTQ and bitsandbytes weights, and a checkpoint's model.safetensors.index.json total.

The model is a real config (tests/fixtures/hf/corpus/qwen3-32b.json, Qwen/Qwen3-32B's config.json, copied
whole; corpus/SOURCES.tsv); the quantization
blocks are written in each tool's documented field names (AutoAWQ `bits`/`group_size`/`zero_point`,
GPTQ `bits`/`group_size`/`sym`, transformers BitsAndBytesConfig `load_in_4bit`/`bnb_4bit_quant_type`/
`bnb_4bit_use_double_quant`), with the values their defaults use. No real AWQ/GPTQ/bitsandbytes
config.json was found in the public code index (looked for: "quant_method": "awq").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import REPO, run_cli
from kvplan.formats import weight_format
from kvplan.specs.registry import load_model

BASE = REPO / "tests" / "fixtures" / "hf" / "corpus" / "qwen3-32b.json"


def _with_quant(tmp_path: Path, quant: dict) -> Path:
    cfg = json.loads(BASE.read_text())
    cfg["quantization_config"] = quant
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def _plan(path: Path) -> dict:
    r = run_cli("estimate", "-m", str(path), "-g", "H100", "--max-model-len", "4096", "--json")
    assert r.exit_code == 0, r.stderr
    return r.json()


def test_awq_int4_group_128_with_zero_points(tmp_path: Path):
    path = _with_quant(tmp_path, {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True})
    spec = load_model(str(path))
    # AutoAWQ: 4-bit values, an fp16 scale and a 4-bit zero per 128 weights: 4 + 16/128 + 4/128 = 4.15625 bits
    assert spec.weight_formats["attention"] == "int4-g128-s16-z4"
    assert weight_format("int4-g128-s16-z4").bits_per_value == pytest.approx(4.15625)
    # the embedding and LM head stay at 16 bits
    assert spec.weight_formats["embedding"] == spec.weight_formats["lm_head"] == "bf16"
    p = _plan(path)
    # Qwen3-32B: 2 x 151,936 x 5,120 embedding + head in bf16 = 3,111,649,280 B; the rest at ~4.156 bits
    head_bytes = 2 * 151_936 * 5_120 * 2
    rest = (p["params_total"] - 2 * 151_936 * 5_120) * 4.15625 / 8
    assert p["weight_bytes_total"] == pytest.approx(head_bytes + rest, rel=0.002)


def test_gptq_stores_zeros_even_when_symmetric(tmp_path: Path):
    path = _with_quant(tmp_path, {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True})
    assert load_model(str(path)).weight_formats["attention"] == "int4-g128-s16-z4"
    path = _with_quant(tmp_path, {"quant_method": "gptq", "bits": 8, "group_size": -1, "sym": True})
    assert load_model(str(path)).weight_formats["dense_mlp"] == "int8-ch-s16-z8"  # one scale per channel


def test_bitsandbytes_nf4_double_quant_and_int8(tmp_path: Path):
    nf4 = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
           "bnb_4bit_use_double_quant": True}  # fmt: skip
    spec = load_model(str(_with_quant(tmp_path, nf4)))
    # 4 bits + an 8-bit absmax per 64 + an fp32 per 256 blocks of 64: 4 + 8/64 + 32/16,384 bits
    assert spec.weight_formats["attention"] == "nf4-g64-s8-q16384"
    assert weight_format("nf4-g64-s8-q16384").bits_per_value == pytest.approx(4 + 8 / 64 + 32 / 16384)
    int8 = load_model(str(_with_quant(tmp_path, {"quant_method": "bitsandbytes", "load_in_8bit": True})))
    assert int8.weight_formats["attention"] == "int8-ch-s32"
    bad = _with_quant(
        tmp_path, {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "x"}
    )
    r = run_cli("estimate", "-m", str(bad), "-g", "H100")
    assert r.exit_code == 2 and "bnb_4bit_quant_type" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_safetensors_index_total_is_the_weight_bytes(tmp_path: Path):
    # a synthetic index file (written here, not copied): only metadata.total_size is read
    path = _with_quant(tmp_path, {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True})
    own = _plan(path)["weight_bytes_total"]
    total = int(own * 1.10)  # 10% more than kvplan's own count
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}}))
    p = _plan(path)
    assert p["weight_bytes_checkpoint"] == total
    assert p["weight_bytes_total"] == pytest.approx(total, rel=0.001)
    assert any("total_size" in a or "safetensors" in a for a in p["assumptions"])
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": "many"}}))
    r = run_cli("estimate", "-m", str(path), "-g", "H100", "--json")
    assert r.exit_code == 2 and "metadata.total_size" in r.stderr


def test_unknown_quant_method_is_said_on_stderr(tmp_path: Path):
    path = _with_quant(tmp_path, {"quant_method": "hqq", "nbits": 4})
    r = run_cli("estimate", "-m", str(path), "-g", "H100", "--max-model-len", "4096", "--json")
    assert r.exit_code == 0
    assert any(line.startswith("warning: ") and "hqq" in line for line in r.stderr.splitlines())


def test_module_matcher_segments_and_layers():
    """Issue 24: literal names as a segment trie and wildcards grouped by layer match as the single
    regex did (whole dotted segments; `layers.6*` also names layer 61)."""
    from kvplan.specs.hf.quant import Matcher

    m = Matcher(
        ("lm_head", "model.layers.0.self_attn.kv_b_proj", "model.layers.6*", "mlp.gate", "*.indexer*")
    )
    yes = [
        "lm_head",
        "model.lm_head",
        "model.layers.0.self_attn.kv_b_proj",
        "language_model.model.layers.0.self_attn.kv_b_proj.weight",
        "model.layers.6.mlp.up_proj",
        "model.layers.61.mlp.up_proj",
        "model.layers.3.mlp.gate",
        "model.layers.2.self_attn.indexer.wk",
    ]
    no = [
        "lm_head_x",
        "model.layers.10.self_attn.kv_b_proj",
        "model.layers.0.self_attn.kv_b_proj_x",
        "model.layers.5.mlp.up_proj",
        "model.layers.3.mlp.gate_proj",
        "model.layers.3.mlp.gatex",
    ]
    assert [n for n in yes if not m.any([n])] == []
    assert [n for n in no if m.any([n])] == []
