"""Issue 24: findings of the eleventh fuzz pass (P-series: parameter counts and weight bytes of real configs,
checked by hand), each test failing on the code before."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import plan

CORPUS = Path(__file__).parent / "fixtures" / "hf" / "corpus"


@pytest.mark.parametrize(
    ("model", "total", "active", "weights_gb"),
    [
        # published: 284B total / 13B active, and 1.6T / 49B (the model cards)
        (str(CORPUS / "deepseek-v4-flash.json"), 283.81e9, 13.28e9, 155.06),
        (str(CORPUS / "deepseek-v4-pro.json"), 1571.74e9, 48.52e9, 848.43),
        ("deepseek-v4-flash", 283.81e9, 13.28e9, 155.02),
    ],
)
def test_deepseek_v4_counts_its_attention_and_its_fp4_experts(model, total, active, weights_gb):
    # P1: expert_dtype fp4 was ignored (experts at fp8: Flash 280.4 GB for ~155); P2: compressed-MLA layers counted
    # no attention weights (wq_a, wq_b, wkv, wo_a, wo_b): Flash active 8.68B for 13B
    p = plan(model, "H200", num_gpus=16 if "pro" in model else 8, max_model_len=8192)
    assert p.params_total == pytest.approx(total, rel=1e-3)
    assert p.params_active == pytest.approx(active, rel=1e-3)
    assert p.weight_bytes_total / 1e9 == pytest.approx(weights_gb, rel=1e-3)
    assert p.settings.weight_formats["routed_experts"] == "mxfp4"


def test_deepseek_v4_flash_fits_two_h200():
    # P1: at fp8 experts the weights needed 130.56 GiB a GPU on 2x H200 and were refused
    p = plan(str(CORPUS / "deepseek-v4-flash.json"), "H200", num_gpus=2, max_model_len=8192)
    assert p.weight_bytes_per_gpu / 2**30 < 75


def test_an_nvfp4_re_export_keeps_its_experts_format():
    # the NVFP4 re-export's config.json keeps expert_dtype fp4; its quantization config (NVFP4 experts) rules
    p = plan(str(CORPUS / "deepseek-v4-flash-nvfp4"), "H200", num_gpus=8, max_model_len=8192)
    assert p.settings.weight_formats["routed_experts"].startswith("nvfp4")


def test_llama4_maverick_dense_layers_take_intermediate_size_mlp():
    # P3: the 24 dense layers were sized with intermediate_size 8,192 (the experts') instead of
    # intermediate_size_mlp 16,384: active 14.16B for the published 17B
    p = plan(str(CORPUS / "llama-4-maverick-17b-128e-instruct.json"), "H200", num_gpus=8, max_model_len=8192)
    assert p.params_total == 400_711_848_960 and p.params_active == 17_184_691_200


def test_lfm2_derives_its_mlp_width_and_ties_its_embeddings():
    # P4: block_auto_adjust_ff_dim (2/3 of 12,288, rounded up to 256 = 8,192) was ignored and the absent tie key
    # read as untied: 1.707B parameters for LFM2's 1.17B
    p = plan(str(CORPUS / "lfm2.5-vl-1.6b.json"), "H100", max_model_len=8192)
    assert p.params_total == 1_170_339_840


def test_quantized_weight_labels_keep_the_embedding_and_head_in_the_model_dtype():
    # P7: with --weight-dtype int4 the labels said the embedding and LM head were int4; the bytes keep bf16
    p = plan("llama3-70b", "H100", num_gpus=2, max_model_len=8192, weight_dtype="int4")
    formats = p.settings.weight_formats
    assert (formats["embedding"], formats["lm_head"], formats["attention"]) == ("bf16", "bf16", "int4")
