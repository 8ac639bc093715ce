"""The README's worked example and the per-token figures it and the formulas quote, reproduced by kvplan."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import plan, run_cli
from kvplan.formats import KV_DTYPES
from kvplan.model import kv
from kvplan.specs.registry import load_model
from kvplan.units import GiB, KiB, MiB

BF16 = KV_DTYPES["bf16"]
FP16 = KV_DTYPES["fp16"]


def per_token_bytes(model: str) -> int:
    spec = load_model(model)
    return kv.sequence_bytes(spec.layers, FP16, 1)


# README, The formulas: the per-token table
@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("llama2-7b", 512 * KiB),
        ("llama3-70b", 320 * KiB),
        ("llama3-8b", 128 * KiB),
        ("mistral-7b-v0.3", 128 * KiB),
        ("gpt3-175b", int(4.5 * MiB)),
    ],
)
def test_per_token_table(model, expected):
    assert per_token_bytes(model) == expected


def test_deepseek_v3_about_69_kib():
    got = per_token_bytes("deepseek-v3")
    assert got == 61 * (512 + 64) * 2  # 70,272 bytes
    assert round(got / KiB) == 69


# README, The formulas: Llama-3 70B per sequence at 4K/8K/32K/128K (formula, any context)
@pytest.mark.parametrize(("tokens", "gib"), [(4096, 1.25), (8192, 2.5), (32768, 10), (131072, 40)])
def test_llama3_70b_per_sequence(tokens, gib):
    spec = load_model("llama3-70b")
    assert kv.sequence_bytes(spec.layers, FP16, tokens) == gib * GiB


# README, The formulas: Llama 2-70B, 4096 tokens, GQA vs the same model as MHA (64 KV heads)
def test_gqa_vs_mha_llama2_70b():
    spec = load_model("llama2-70b")
    assert kv.sequence_bytes(spec.layers, FP16, 4096) == 1.25 * GiB
    mha_layer = spec.layer_types["attn"].model_copy(update={"num_kv_heads": 64})
    mha = spec.model_copy(update={"layer_types": {"attn": mha_layer}})
    mha.__dict__.pop("layers", None)  # drop the cached expansion of the copied spec
    assert kv.sequence_bytes(mha.layers, FP16, 4096) == 10 * GiB


# DeepSeek-V2, arXiv:2405.04434: DeepSeek-V3 70 KB, Llama-3.1-405B 516 KB, Qwen2.5-72B 327 KB (decimal KB, truncated)
@pytest.mark.parametrize(("model", "kb"), [("deepseek-v3", 70), ("llama3.1-405b", 516), ("qwen2.5-72b", 327)])
def test_mla_comparison(model, kb):
    assert per_token_bytes(model) // 1000 == kb


def test_mla_ratio_5_to_7x():
    mla = per_token_bytes("deepseek-v3")
    # "about 5-7x": 327,680 / 70,272 = 4.66 and 516,096 / 70,272 = 7.34
    assert round(per_token_bytes("qwen2.5-72b") / mla) == 5
    assert round(per_token_bytes("llama3.1-405b") / mla) == 7


# README, The formulas: 32 layers x 8 KV heads x 128 x 8192 tokens x bf16 = 1,073,741,824 bytes; 128K -> 16 GiB
def test_one_gib():
    spec = load_model("llama3-8b")
    assert kv.sequence_bytes(spec.layers, BF16, 8192) == 1073741824
    assert kv.sequence_bytes(spec.layers, BF16, 131072) == 16 * GiB


# README, A worked example: Llama-3 70B on 8xH100, ~50 GB (the example's 400 "GiB" over 8 GPUs) left for KV per GPU
EXAMPLE_KV = "50GiB"


def walkthrough(*extra: str, model: str = "llama3-70b", context: str = "8192") -> dict:
    r = run_cli(
        "estimate",
        "--model",
        model,
        "--gpus",
        "8xH100",
        "--max-model-len",
        context,
        "--kv-cache-memory",
        EXAMPLE_KV,
        "--json",
        *extra,
    )
    assert r.exit_code == 0, r.stderr
    return r.json()


def test_step1_weights_per_gpu():
    p = plan("llama3-70b", "H100", num_gpus=8, max_model_len=8192)
    # "70B x 2 byte = 140 GB, 17.5 GB per GPU" (70.55B parameters in fact)
    assert p.weight_bytes_per_gpu == pytest.approx(17.5e9, rel=0.015)


def test_step5_160_users_at_8k():
    out = walkthrough()
    assert out["kv_bytes_per_token"] == 320 * KiB
    assert out["kv_bytes_per_token_per_gpu"] == 40 * KiB
    assert out["concurrency_factor"] == pytest.approx(160.0)  # 400 GiB / 2.5 GiB
    assert out["max_concurrency"] in (159, 160)  # one block is the engine's null block


def test_step5_40_users_at_32k_and_320_at_4k():
    # Llama 3 70B stops at 8K; Llama 3.1 70B has the same layers and a 128K context.
    assert walkthrough(model="llama3.1-70b", context="32K")["concurrency_factor"] == pytest.approx(40.0)
    assert walkthrough(context="4096")["concurrency_factor"] == pytest.approx(320.0)


def test_step6_int8_kv_doubles_to_320():
    out = walkthrough("--kv-cache-dtype", "int8")
    assert out["kv_bytes_per_token"] == 160 * KiB
    assert out["concurrency_factor"] == pytest.approx(320.0)


def test_step7_prefix_caching_50pct_gives_1_5_to_2x():
    out = walkthrough("--shared-prefix-tokens", "6144", "--prefix-hit-rate", "0.5")
    gain = out["prefix_caching"]["max_concurrency"] / out["max_concurrency"]
    assert 1.5 <= gain <= 2.0
    assert out["prefix_caching"]["gain"] == pytest.approx(gain)


def test_walkthrough_without_assumed_budget_lands_near_160():
    r = run_cli("estimate", "--model", "llama3-70b", "--gpus", "8xH100", "--max-model-len", "8K", "--json")
    out = r.json()
    # the example's "~50 GB for KV per GPU" is itself an estimate; kvplan's own reserve estimate
    # must land in the same place
    assert 45 * GiB <= out["kv_budget_bytes_per_gpu"] <= 55 * GiB
    assert 145 <= out["max_concurrency"] <= 175
    # the figures the README's worked example quotes (M8: it said 53.7 GiB and 171 after they had moved)
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    quoted = f"kvplan's own budget ({out['kv_budget_bytes_per_gpu'] / GiB:.2f} GiB per GPU with vLLM's 0.92"
    assert quoted in " ".join(readme.split())
    assert f"gives {out['max_concurrency']} at 8K" in " ".join(readme.split())


def test_15_4_prealloc_vs_paged():
    # 4K max length, users average 1K: preallocation reserves 4x what is used; paging does not
    out = walkthrough("--avg-context", "1024", context="4096")
    frag = out["fragmentation"]
    assert frag["prealloc_utilization"] == pytest.approx(0.25)
    assert frag["paged_utilization"] == 1.0  # 1024 is a multiple of the block size
    assert frag["paged_max_concurrency_per_replica"] >= 4 * frag["prealloc_max_concurrency_per_replica"] - 8
