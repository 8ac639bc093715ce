"""Model families read from their real config.json (tests/fixtures/hf/corpus/), each figure worked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_cli
from kvplan.errors import SpecError
from kvplan.formats import KV_DTYPES
from kvplan.model import kv
from kvplan.model.params import is_moe_layer, param_breakdown
from kvplan.specs.hf.decilm import ffn_mult_to_intermediate_size
from kvplan.specs.hf.moe import read_moe
from kvplan.specs.hf.reader import Reader
from kvplan.specs.registry import load_model

CORPUS = Path(__file__).parent / "fixtures" / "hf" / "corpus"
BF16 = KV_DTYPES["bf16"]


def corpus(name: str):
    folder = CORPUS / name / "config.json"  # a config kept with its hf_quant_config.json
    return load_model(str(folder if folder.exists() else CORPUS / f"{name}.json"))


def kv_bytes_per_token(spec) -> int:
    return kv.model_bits_per_token(spec.layers, BF16) // 8


def test_nemotron_super_49b_kv_from_block_configs():
    spec = corpus("llama-3.3-nemotron-super-49b-v1")
    # 49 blocks with attention (n_heads_in_group 8: 64 / 8 = 8 KV heads), 31 with attention no_op:
    # 49 x 8 heads x 128 x 2 (K, V) x 2 B = 200,704 B/token (read as 80 x 64 heads it was 2,621,440)
    assert kv_bytes_per_token(spec) == 49 * 8 * 128 * 2 * 2 == 200_704
    assert sum(1 for x in spec.layers if type(x).__name__ == "NoCache") == 31


def test_nemotron_super_49b_params_from_ffn_mult():
    # ffn_mult -> int(2 x mult x 8192 / 3) rounded up to 256: 5.25 -> 28672, 2.625 -> 14336, 0.5 -> 2816
    assert ffn_mult_to_intermediate_size(5.25, 8192) == 28672
    assert ffn_mult_to_intermediate_size(2.625, 8192) == 14336
    assert ffn_mult_to_intermediate_size(0.5, 8192) == 2816  # int(2730.67) = 2730, up to 11 x 256
    total = param_breakdown(corpus("llama-3.3-nemotron-super-49b-v1")).total
    assert total == pytest.approx(49.87e9, rel=0.002)  # the model card: 49.9B


def growing_and_window_bytes(spec) -> tuple[int, int]:
    growing = kv.model_bits_per_token(spec.layers, BF16, growing_only=True) // 8
    return growing, kv_bytes_per_token(spec) - growing


def test_gemma4_global_layers_have_their_own_heads_and_width():
    spec = corpus("gemma-4-26b-a4b")
    # global (full): attention_k_eq_v -> num_global_key_value_heads 2 x global_head_dim 512 x 2 (K and V
    # are both cached: vLLM gemma4.py loads K's weights into V's slot) x 2 B = 4,096 B/token per layer, x 5
    # sliding (1024): 8 KV heads x 256 x 2 x 2 B = 8,192 B/token per layer, x 25
    assert growing_and_window_bytes(spec) == (5 * 2 * 512 * 2 * 2, 25 * 8 * 256 * 2 * 2) == (20_480, 204_800)
    dense = corpus("gemma-4-31b-it-nvfp4")
    # global 10 x 4 x 512 x 2 x 2 = 81,920; sliding 50 x 16 x 256 x 2 x 2 = 819,200
    assert growing_and_window_bytes(dense) == (81_920, 819_200)


def test_gemma4_moe_reads_top_k_experts_and_the_dense_mlp_beside_them():
    spec = corpus("gemma-4-26b-a4b")
    assert spec.moe is not None
    assert (spec.moe.num_experts, spec.moe.experts_per_token, spec.moe.expert_intermediate_size) == (
        128,
        8,
        704,
    )
    assert (spec.moe.shared_experts, spec.moe.shared_expert_intermediate_size) == (1, 2112)
    assert param_breakdown(spec).total == pytest.approx(25.2e9, rel=0.01)  # 26B with the vision tower
    assert corpus("gemma-4-31b-it-nvfp4").moe is None  # enable_moe_block false, num_experts null


def test_kv_shared_layers_reuse_the_last_earlier_layer_of_their_type(tmp_path: Path):
    # No real Gemma-3n config.json is in the corpus (none found in the code index): the rule is tested on
    # Gemma-4 26B's real config with num_kv_shared_layers set, as Gemma-3n E2B/E4B and Gemma-4 E2B set it.
    cfg = json.loads((CORPUS / "gemma-4-26b-a4b.json").read_text())
    cfg["text_config"]["num_kv_shared_layers"] = 10
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_model(str(path))
    # layers 20..29 share; full layers are 5, 11, 17, 23, 29: the last non-shared sliding layer is 19,
    # the last non-shared full one 17, so 23 and 29 read 17 (-6, -12) and the sliding ones read 19
    assert [getattr(x, "source", None) for x in spec.layers[20:]] == [-1, -2, -3, -6, -5, -6, -7, -8, -9, -12]
    # own caches: full 5, 11, 17 (3 x 4,096 B) and the other 17 of layers 0..19 sliding (17 x 8,192 B)
    assert growing_and_window_bytes(spec) == (3 * 4096, 17 * 8192)


@pytest.mark.parametrize(
    ("name", "moe_layers", "first_dense"),
    [("qwen3-coder-480b-a35b-instruct", 62, 0), ("mimo-v2-flash", 47, 1)],
)
def test_moe_fields_that_used_to_crash_plan_with_exit_0(name, moe_layers, first_dense):
    spec = corpus(name)
    assert spec.moe is not None
    assert sum(is_moe_layer(spec, i) for i in range(spec.num_layers)) == moe_layers
    assert spec.moe.first_dense_layers == first_dense
    assert spec.moe.shared_experts == 0  # Qwen3-Coder: shared_expert_intermediate_size 0; MiMo: null
    result = run_cli("estimate", "-m", str(CORPUS / f"{name}.json"), "-g", "8xH200", "--json")
    assert result.exit_code == 0, result.stderr


def test_minimax_m3_moe_layer_list_and_its_sparse_attention_refused_in_one_line():
    cfg = json.loads((CORPUS / "minimax-m3.json").read_text())
    moe = read_moe(Reader(cfg, Path("minimax-m3.json")), cfg)
    assert moe is not None and (moe["first_dense_layers"], moe["layer_step"]) == (3, 1)  # 60 - 3 = 57 MoE
    result = run_cli("estimate", "-m", str(CORPUS / "minimax-m3.json"), "--json")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert "sparse_attention_config.use_sparse_attention" in error and "\n" not in error


def test_mimo_v2_flash_hybrid_layer_pattern():
    spec = corpus("mimo-v2-flash")
    # 9 full layers (flag 0): 4 KV heads x (192 K + 128 V) x 2 B = 2,560 B/token each = 23,040
    # 39 sliding (flag 1, window 128): 8 x (192 + 128) x 2 B = 5,120 each = 199,680
    assert growing_and_window_bytes(spec) == (9 * 2560, 39 * 5120)
    assert {getattr(x, "window", None) for x in spec.layers} == {None, 128}


def test_moe_layer_freq_list_with_dense_layers_between_is_refused(tmp_path: Path):
    cfg = json.loads((CORPUS / "mimo-v2-flash.json").read_text())
    cfg["moe_layer_freq"][10] = 0
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="moe_layer_freq"):
        load_model(str(path))


@pytest.mark.parametrize("key", ["language_config", "llm_config"])
def test_language_model_nested_under_other_keys(tmp_path: Path, key: str):
    cfg = json.loads((CORPUS / "gemma-4-31b-it-nvfp4" / "config.json").read_text())
    cfg[key] = cfg.pop("text_config")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert growing_and_window_bytes(load_model(str(path))) == (81_920, 819_200)


@pytest.mark.parametrize(
    ("shipped", "config"),
    [("gemma-4", "gemma-4-26b-a4b"), ("llama-3.3-nemotron-super-49b", "llama-3.3-nemotron-super-49b-v1")],
)
def test_shipped_spec_equals_its_config_json(shipped, config):
    ship, read = load_model(shipped), corpus(config)
    assert [kv.layer_bits_per_token(x, BF16) for x in ship.layers] == [
        kv.layer_bits_per_token(x, BF16) for x in read.layers
    ]
    assert [kv.layer_entries(x, 1 << 40) for x in ship.layers] == [
        kv.layer_entries(x, 1 << 40) for x in read.layers
    ]
    assert param_breakdown(ship) == param_breakdown(read)
    assert (ship.moe, ship.max_context, ship.vocab_size) == (read.moe, read.max_context, read.vocab_size)


def test_llama_vision_cross_attention_holds_image_tokens_per_request():
    # 90B: 100 layers, cross_attention_layers every 5th from 3 (20 of them). A cross layer holds the
    # image tokens' K/V: 4 tiles x ((560 / 14)^2 + 1) = 6,404 tokens; 20 x 8 KV heads x 128 x 2 x 2 B
    # x 6,404 = 524,615,680 B per image, whatever the context. Self-attention: 80 x 8 x 128 x 2 x 2 B a token.
    path = str(CORPUS / "llama-3.2-90b-vision-instruct.json")
    # vLLM loaded MllamaForConditionalGeneration until 0.10.2 (its registry's _PREVIOUSLY_SUPPORTED_MODELS)
    args = [
        "estimate",
        "-m",
        path,
        "-g",
        "4xH100",
        "--max-model-len",
        "8192",
        "--engine-version",
        "0.10",
        "--json",
    ]
    one = run_cli(*args).json()
    assert one["kv_bytes_per_token"] == 80 * 8 * 128 * 2 * 2
    assert one["kv_bytes_per_request"] == 8192 * 327_680 + 524_615_680
    two = run_cli(*args, "--images-per-request", "2").json()
    assert two["kv_bytes_per_request"] - one["kv_bytes_per_request"] == 524_615_680
    assert not one["engine"]["supported"] and "cross-attention" in one["engine"]["reason"]
    assert any("--images-per-request" in a for a in one["assumptions"])
