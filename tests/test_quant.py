"""Weight bytes of quantized checkpoints, worked by hand from the real configs in the corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_cli
from kvplan.errors import SpecError
from kvplan.formats import weight_format
from kvplan.model.weights import matrix_stage_weights
from kvplan.specs.matrices import weight_matrices
from kvplan.specs.registry import load_model

CORPUS = Path(__file__).resolve().parent / "fixtures" / "hf" / "corpus"


def _total_bytes(spec) -> int:
    return sum(s.bytes_per_gpu for s in matrix_stage_weights(spec, tp=1, pp=1))


def test_format_bits_per_matrix():
    # int4 group 32, bf16 scale: 4 + 16/32 = 4.5 bits; a 256x256 matrix = 65536 x 4.5 = 294912 bits
    assert weight_format("int4-g32-s16").matrix_bits(256, 256) == 294912
    # block fp8: 256x256 = 4 blocks of 128x128, one fp32 each: 65536 x 8 + 4 x 32
    assert weight_format("fp8").matrix_bits(256, 256) == 65536 * 8 + 4 * 32
    # NVFP4: 4 bits + an fp8 scale per 16 + one fp32 per tensor
    assert weight_format("nvfp4").matrix_bits(256, 256) == 65536 * 4 + 4096 * 8 + 32
    # per-channel int8, fp32 scale per row; bnb nf4 double quant
    assert weight_format("int8-ch-s32").matrix_bits(256, 256) == 65536 * 8 + 256 * 32
    assert weight_format("nf4-g64-s8-q16384").matrix_bits(256, 256) == 65536 * 4 + 1024 * 8 + 4 * 32


def test_kimi_k25_int4_experts_rest_bf16():
    spec = load_model(str(CORPUS / "kimi-k2.5.json"))
    # ignore: lm_head, re:.*self_attn.*, re:.*shared_experts.*, re:.*mlp\.(gate|up|gate_up|down)_proj.*
    assert spec.weight_formats == {
        "embedding": "bf16", "lm_head": "bf16", "attention": "bf16", "dense_mlp": "bf16",
        "routed_experts": "int4-g32-s16", "shared_experts": "bf16",
    }  # fmt: skip
    # experts: 60 MoE layers x 384 experts x 3 x 7168 x 2048 = 1,014,686,023,680 params x 4.5 bits
    experts = 60 * 384 * 3 * 7168 * 2048
    assert experts == 1_014_686_023_680
    others = sum(m.params for m in weight_matrices(spec)) - experts  # all at bf16, 2 bytes
    expected = experts * 9 // 16 + others * 2
    assert _total_bytes(spec) == expected
    # ~595 GB published for moonshotai/Kimi-K2.5 (int4 experts); not ~2 TB as bf16
    assert 585e9 < expected < 600e9


def test_kimi_k25_estimate_json_weights_near_checkpoint():
    r = run_cli("estimate", "-m", str(CORPUS / "kimi-k2.5.json"), "-g", "8xH200", "--json")
    assert r.exit_code == 0
    d = r.json()
    assert 585e9 < d["weight_bytes_total"] < 600e9
    assert d["settings"]["weight_formats"]["routed_experts"] == "int4-g32-s16"


def test_gpt_oss_mxfp4_experts_only():
    spec = load_model(str(CORPUS / "gpt-oss-120b.json"))
    assert spec.weight_formats["routed_experts"] == "mxfp4"
    assert spec.weight_formats["attention"] == "bf16"
    # mxfp4: 4 + 8/32 = 4.25 bits per expert weight
    experts = sum(m.params for m in weight_matrices(spec) if m.component == "routed_experts")
    others = sum(m.params for m in weight_matrices(spec)) - experts
    assert _total_bytes(spec) == experts * 17 // 32 + others * 2
    # openai/gpt-oss-120b checkpoint: 65.2 GB on the model card's "fits one 80 GB GPU"
    assert 60e9 < _total_bytes(spec) < 66e9


def test_block_fp8_qwen3_keeps_head_and_embedding():
    spec = load_model(str(CORPUS / "qwen3-30b-a3b-fp8.json"))
    assert spec.weight_formats["attention"] == spec.expert_weight_dtype == "fp8-b128-s32"
    assert spec.weight_formats["lm_head"] == spec.weight_formats["embedding"] == "bf16"
    # each matrix: rows x cols bytes + ceil(rows/128) x ceil(cols/128) fp32 scales
    expected = 0
    for m in weight_matrices(spec):
        if m.component in ("attention", "routed_experts"):
            expected += (m.rows * m.cols + -(-m.rows // 128) * -(-m.cols // 128) * 4) * m.count
        else:
            expected += m.params * 2
    assert _total_bytes(spec) == expected


def test_modelopt_fp8_per_tensor_and_unknown_method_warns(tmp_path: Path):
    spec = load_model(str(CORPUS / "qwen3-32b-fp8-static-pertensor.json"))
    assert spec.weight_formats["attention"] == "fp8-t32" and spec.weight_formats["lm_head"] == "bf16"
    cfg = json.loads((CORPUS / "qwen3-32b-fp8-static-pertensor.json").read_text())
    cfg["quantization_config"] = {"quant_method": "hqq", "nbits": 4}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_model(str(path))
    assert any(n.startswith("WARNING") and "quant_method 'hqq'" in n for n in spec.notes)
    r = run_cli("estimate", "-m", str(path), "-g", "H200", "--json")
    assert any("quant_method 'hqq'" in a for a in r.json()["assumptions"])


def test_bad_quantization_config_is_one_line(tmp_path: Path):
    cfg = json.loads((CORPUS / "kimi-k2.5.json").read_text())
    cfg["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = "four"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match=r"config_groups\.group_0\.weights\.num_bits"):
        load_model(str(path))


def test_modelopt_hf_quant_config_beside_config_json():
    # deepseek-v3.2-nvfp4/hf_quant_config.json excludes q_a/q_b/kv_a/kv_b of every layer, not o_proj
    spec = load_model(str(CORPUS / "deepseek-v3.2-nvfp4"))
    assert spec.weight_formats["attention"] == "nvfp4"  # o_proj, the largest attention matrix
    assert spec.weight_formats["attention.kv_b_proj"] == "bf16"
    assert spec.expert_weight_dtype == "nvfp4" and spec.weight_formats["lm_head"] == "bf16"
