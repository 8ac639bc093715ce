"""Sparse (DSA) and token-compressed (DeepSeek-V4) attention from real config.json files.

Every figure is worked by hand in a comment; sources: vLLM deepseek_v2.py (DeepseekV32IndexerCache),
v1/attention/backends/mla/flashmla_sparse.py (fp8_ds_mla) and sparse_swa.py (V4 584 B entries);
SGLang model_executor/pool_configurator.py (DSA cell size, DSV4PoolConfigurator); README, The formulas: DeepSeek-V4.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import run_cli
from kvplan.formats import KV_DTYPES
from kvplan.model import kv
from kvplan.specs.models import CompressedLatent
from kvplan.specs.registry import load_model

CORPUS = Path(__file__).parent / "fixtures" / "hf" / "corpus"
BF16, FP8 = KV_DTYPES["bf16"], KV_DTYPES["fp8"]
M = 1_048_576  # "1M" as kvplan reads it, and V4's max_position_embeddings


def per_token_bytes(spec, fmt) -> int:
    return kv.model_bits_per_token(spec.layers, fmt) // 8


def test_the_layouts_per_token_and_entry():
    assert kv.indexer_bytes(128) == 128 + 4  # 128 fp8 + one fp32 scale per 128 values
    assert kv.fp8_ds_mla_bytes(512, 64) == 512 + 4 * 4 + 64 * 2 == 656
    assert kv.v4_fp8_entry_bytes(512, 64) == 448 + 64 * 2 + 8 == 584


def test_deepseek_v32_bytes_per_token():
    spec = load_model("deepseek-v3.2")
    # bf16: 61 x (576 x 2 + 132) = 61 x 1,284 = 78,324
    assert per_token_bytes(spec, BF16) == 61 * (1152 + 132) == 78_324
    # fp8 -> fp8_ds_mla: 61 x (656 + 132) = 61 x 788 = 48,068
    assert per_token_bytes(spec, FP8) == 61 * (656 + 132) == 48_068
    # the latent and the indexer key are replicated on TP (README, How the engines size their KV cache): the same on each of 8 ranks
    assert kv.model_bits_per_token(spec.layers, FP8, tp=8) // 8 == 48_068


@pytest.mark.parametrize("config", ["deepseek-v3.2-exp.json", "deepseek-v3.2-nvfp4/config.json"])
def test_shipped_v32_spec_is_what_the_config_gives(config):
    from_config = load_model(str(CORPUS / config))
    shipped = load_model("deepseek-v3.2")
    assert [x.model_dump() for x in from_config.layers] == [x.model_dump() for x in shipped.layers]
    assert from_config.architecture == shipped.architecture == "DeepseekV32ForCausalLM"
    assert from_config.max_context == shipped.max_context


@pytest.mark.parametrize("config", ["deepseek-v4-flash.json", "deepseek-v4-flash-nvfp4/config.json"])
def test_shipped_v4_flash_spec_is_what_the_config_gives(config):
    from_config = load_model(str(CORPUS / config))
    shipped = load_model("deepseek-v4-flash")
    assert [x.model_dump() for x in from_config.layers] == [x.model_dump() for x in shipped.layers]
    assert from_config.max_context == shipped.max_context == M
    assert any("MTP" in note for note in from_config.notes)  # the 44th compress_ratios entry


def test_vllm_log_lines_for_v32_on_8x_h200():
    # block 64 (FlashMLA sparse); 40 GiB = 42,949,672,960 B pinned per GPU
    # bf16: block = 64 x 78,324 = 5,012,736 B -> 8,568 blocks -> 548,352 tokens;
    #       a 163,840-token request holds 2,560 blocks: 8,568 / 2,560 = 3.35x
    out = run_cli(
        "estimate", "-m", "deepseek-v3.2", "--gpus", "8xH200", "--kv-cache-memory", "40GiB", "--json"
    )
    e = out.json()["engine"]
    assert e["num_blocks"] == 42_949_672_960 // (64 * 78_324) == 8568
    assert e["log_lines"] == [
        "Available KV cache memory: 40.00 GiB",
        "GPU KV cache size: 548,352 tokens, Maximum concurrency for 163,840 tokens per request: 3.35x",
    ]
    # fp8_ds_mla: block = 64 x 48,068 = 3,076,352 B -> 13,961 blocks -> 893,504 tokens; 13,961 / 2,560 = 5.45x
    out = run_cli(
        "estimate", "-m", "deepseek-v3.2", "--gpus", "8xH200", "--kv-cache-memory", "40GiB",
        "--kv-cache-dtype", "fp8", "--json",
    )  # fmt: skip
    e = out.json()["engine"]
    assert e["num_blocks"] == 42_949_672_960 // (64 * 48_068) == 13961
    assert e["log_lines"][1] == (
        "GPU KV cache size: 893,504 tokens, Maximum concurrency for 163,840 tokens per request: 5.45x"
    )


def test_sglang_cell_size_adds_the_indexer():
    # SGLang: cell = 61 x (656 + 132) = 48,068 B per token; 40 GiB // 48,068 = 893,519 tokens (page 1)
    out = run_cli(
        "estimate", "-m", "deepseek-v3.2", "--gpus", "8xH200", "--kv-cache-memory", "40GiB",
        "--kv-cache-dtype", "fp8", "--engine", "sglang", "--json",
    )  # fmt: skip
    assert out.json()["engine"]["kv_cache_tokens"] == 42_949_672_960 // 48_068 == 893_519


def test_glm5_figures_from_its_config():
    glm51 = load_model(str(CORPUS / "glm-5.1.json"))
    # 78 layers, latent 512 + 64, indexer 128: bf16 78 x 1,284 = 100,152; fp8 78 x 788 = 61,464
    assert per_token_bytes(glm51, BF16) == 78 * 1284 == 100_152
    assert per_token_bytes(glm51, FP8) == 78 * 788 == 61_464
    glm52 = load_model(str(CORPUS / "glm-5.2.json"))
    # indexer_types: 21 'full' (layers 0-2, then every 4th from 6 to 74), 57 'shared' keep no key:
    # bf16 78 x 1,152 + 21 x 132 = 89,856 + 2,772 = 92,628
    assert sum(1 for x in glm52.layers if x.index_head_dim) == 21
    assert per_token_bytes(glm52, BF16) == 92_628
    # the engines' allocation for shared-indexer layers is not established: one line, kvplan plans on
    out = run_cli(
        "estimate", "-m", str(CORPUS / "glm-5.2.json"), "--gpus", "16xH200", "-tp", "8", "-pp", "2",
        "--max-model-len", "128K", "--json",
    )  # fmt: skip
    j = out.json()
    assert j["engine"]["supported"] is False and "indexer_types 'shared'" in j["engine"]["reason"]
    assert j["kv_bytes_per_token"] == 92_628


def _v4_request_bytes(entry: int) -> int:
    window = 43 * 128 * entry  # every layer keeps its last 128 tokens
    csa = 21 * (M // 4) * (entry + 132)  # layers 2, 4, ..., 42: one entry per 4 tokens + indexer key
    hca = 20 * (M // 128) * entry  # layers 3, 5, ..., 41: one entry per 128 tokens
    return window + csa + hca


def test_v4_flash_request_at_1m_tokens_layer_by_layer():
    spec = load_model("deepseek-v4-flash")
    kinds = [(x.ratio, bool(x.index_head_dim)) for x in spec.layers if isinstance(x, CompressedLatent)]
    assert kinds.count((0, False)) == 2 and kinds.count((4, True)) == 21 and kinds.count((128, False)) == 20
    # bf16 entry 512 x 2 = 1,024 B:
    #   window 43 x 128 x 1,024            =     5,636,096
    #   CSA 21 x 262,144 x (1,024 + 132)   = 6,363,807,744
    #   HCA 20 x 8,192 x 1,024             =   167,772,160
    assert kv.sequence_bytes(spec.layers, BF16, M) == _v4_request_bytes(1024) == 6_537_216_000
    # fp8 entry 584 B:
    #   window 43 x 128 x 584              =     3,214,336
    #   CSA 21 x 262,144 x (584 + 132)     = 3,941,597,184
    #   HCA 20 x 8,192 x 584               =    95,682,560
    assert kv.sequence_bytes(spec.layers, FP8, M) == _v4_request_bytes(584) == 4_040_494_080


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_v4_flash_plans_in_gigabytes_and_the_engines_say_why_not(engine):
    out = run_cli(
        "estimate", "-m", "deepseek-v4-flash", "--gpus", "8xH200", "--max-model-len", "1M",
        "--kv-cache-dtype", "fp8", "--engine", engine, "--json",
    )  # fmt: skip
    j = out.json()
    assert j["kv_bytes_per_request"] == 4_040_494_080  # not 11 MB: a sliding window only
    # growth per token: 21 x 716 / 4 + 20 x 584 / 128 = 3,759 + 91.25 = 3,850.25 B
    assert j["kv_bytes_per_token_growing"] == 3850.25
    assert j["kv_bytes_per_sequence_windowed_cap"] == 43 * 128 * 584
    assert j["engine"]["supported"] is False
    assert "DeepSeek-V4" in j["engine"]["reason"] and "\n" not in j["engine"]["reason"]


def test_compare_table_shows_sparse_and_compressed_models():
    j = run_cli(
        "compare", "table", "--models", "deepseek-v3.2,deepseek-v4-flash", "--gpus", "8xH200",
        "--max-model-len", "128K", "--variants", "shipped,fp8", "--format", "json",
    ).json()  # fmt: skip
    rows = {(r["model"], r["variant"]): r for r in j["rows"]}
    assert rows[("deepseek-v3.2", "shipped")]["kv_bytes_per_token"] == 78_324
    assert rows[("deepseek-v3.2", "fp8")]["kv_bytes_per_token"] == 48_068
    # V4-Flash at 131,072 tokens, bf16: 5,636,096 + 21 x 32,768 x 1,156 + 20 x 1,024 x 1,024 = 822,083,584
    assert rows[("deepseek-v4-flash", "shipped")]["kv_bytes_per_request"] == 822_083_584
