"""The composed plan: layouts, budgets, blocks, concurrency, infeasible verdicts."""

from __future__ import annotations

import math

import pytest

from helpers import plan
from kvplan.errors import InfeasibleError, UsageError
from kvplan.formats import KV_DTYPES
from kvplan.model import kv
from kvplan.specs.registry import load_model
from kvplan.units import GiB, KiB


def test_pool_tokens_and_concurrency_from_blocks():
    p = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192, kv_cache_memory_bytes=40 * GiB)
    block = 16 * 128 * KiB
    assert p.block_bytes_per_gpu == block
    assert p.num_blocks_per_gpu == 40 * GiB // block
    assert p.kv_pool_tokens == p.num_blocks_per_gpu * 16
    assert p.concurrency_factor == pytest.approx(p.num_blocks_per_gpu / 512)
    assert p.max_concurrency == (p.num_blocks_per_gpu - 1) // 512


def test_block_rounding_charges_a_partial_block():
    p = plan("llama3.1-8b", "H100", num_gpus=1, max_model_len=8200, kv_cache_memory_bytes=40 * GiB)
    assert p.blocks_per_request == 513
    assert p.kv_bytes_per_request_per_gpu == 513 * 16 * 128 * KiB


def test_budget_is_utilization_minus_weights_minus_reserve():
    p = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192)
    # README, How the engines size their KV cache: vLLM's default utilization is 0.92 from 0.20 on, 0.9 before
    assert p.settings.gpu_memory_utilization == 0.92
    assert p.requested_bytes_per_gpu == math.ceil(p.memory_bytes_per_gpu * 0.92)
    old = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192, engine_version="0.18")
    assert old.requested_bytes_per_gpu == math.ceil(p.memory_bytes_per_gpu * 0.9)
    assert (
        p.kv_budget_bytes_per_gpu
        == p.requested_bytes_per_gpu - p.weight_bytes_per_gpu - p.reserve_bytes_per_gpu
    )
    assert p.reserve.estimated is True
    given = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192, reserve_bytes=3 * GiB)
    assert given.reserve_bytes_per_gpu == 3 * GiB and given.reserve.estimated is False


def test_kv_cache_memory_replaces_the_budget():
    p = plan("llama3-70b", "H100", num_gpus=8, max_model_len=8192, kv_cache_memory_bytes=int(51.02 * GiB))
    assert p.kv_budget_bytes_per_gpu == int(51.02 * GiB)
    assert p.kv_budget_source == "--kv-cache-memory"


def test_pipeline_stages_hold_their_own_layers():
    p = plan("llama3-70b", "H100", num_gpus=16, nodes=2, max_model_len=8192)
    assert (p.cluster.tensor_parallel_size, p.cluster.pipeline_parallel_size) == (8, 2)
    assert [s.num_layers for s in p.stages] == [40, 40]
    assert p.kv_bytes_per_token_per_gpu == 40 * 1 * 256 * 2
    assert p.num_blocks_per_gpu == min(s.num_blocks for s in p.stages)


def test_uneven_pipeline_split_like_vllm():
    from kvplan.model.parallel import stage_ranges

    assert [len(r) for r in stage_ranges(61, 4)] == [15, 15, 16, 15]
    assert [len(r) for r in stage_ranges(126, 4)] == [31, 32, 32, 31]


def test_data_parallel_replicas_multiply_concurrency():
    p = plan("llama3-8b", "H100", num_gpus=8, tp=2, max_model_len=8192)
    assert p.cluster.data_parallel_size == 4
    assert p.max_concurrency == 4 * p.max_concurrency_per_replica


def test_mla_per_gpu_kv_is_not_split_by_tp():
    p = plan("deepseek-v3", "H200", num_gpus=8, max_model_len=8192)
    assert p.kv_bytes_per_token_per_gpu == p.kv_bytes_per_token == 70272


def test_tp_above_kv_heads_replicates():
    p = plan("qwen3-235b-a22b", "H200", num_gpus=8, max_model_len=8192)
    assert p.kv_bytes_per_token_per_gpu == 94 * 1 * 256 * 2  # 4 KV heads on 8 ranks: one each


def test_hybrid_model_concurrency_counts_windows():
    spec = load_model("gpt-oss-120b")
    p = plan("gpt-oss-120b", "H200", num_gpus=1, max_model_len=131072, kv_cache_memory_bytes=40 * GiB)
    full = 18 * 16 * 2048 * math.ceil(131072 / 16)
    sliding = 18 * 16 * 2048 * 9
    assert p.kv_bytes_per_request_per_gpu == full + sliding
    assert p.max_concurrency == ((40 * GiB // (36 * 16 * 2048)) - 1) * (36 * 16 * 2048) // (full + sliding)
    assert p.kv_bytes_per_token_growing == 18 * 2048
    assert p.kv_bytes_per_sequence_windowed_cap == kv.sequence_bytes(
        [x for x in spec.layers if not kv.is_growing(x)], KV_DTYPES["bf16"], 10**9
    )


def test_max_num_seqs_caps_concurrency():
    p = plan("llama3-8b", "H100", num_gpus=1, max_model_len=1024, max_num_seqs=256)
    assert p.max_concurrency == 256 and p.limited_by == "max_num_seqs"


def test_avg_context_concurrency():
    p = plan(
        "llama3-8b",
        "H100",
        num_gpus=1,
        max_model_len=8192,
        avg_context_tokens=2048,
        kv_cache_memory_bytes=40 * GiB,
    )
    assert p.avg_context.max_concurrency == (p.num_blocks_per_gpu - 1) // 128


def test_prefix_sharing_counts_full_blocks_only():
    p = plan(
        "llama3-8b",
        "H100",
        num_gpus=1,
        max_model_len=4096,
        shared_prefix_tokens=100,
        kv_cache_memory_bytes=40 * GiB,
    )
    assert p.prefix_caching.shared_blocks == 6
    assert p.prefix_caching.shared_tokens_cached == 96
    assert p.prefix_caching.prefill_tokens_saved_per_request == 96
    n = p.num_blocks_per_gpu
    assert p.prefix_caching.max_concurrency == math.floor((n - 1 - 6) / (256 - 6))


def test_weights_that_do_not_fit_are_infeasible_with_numbers():
    with pytest.raises(InfeasibleError, match=r"weights need 131\.\d\d GiB per GPU"):
        plan("llama3-70b", "H100", num_gpus=1, max_model_len=8192)


def test_context_above_model_maximum():
    with pytest.raises(InfeasibleError, match="maximum context of 8,192"):
        plan("llama3-70b", "H100", num_gpus=8, max_model_len=16384)


def test_context_that_no_request_fits_names_the_largest_that_does():
    with pytest.raises(InfeasibleError, match=r"largest --max-model-len that fits is ([\d,]+)") as info:
        plan("llama3.1-70b", "H100", num_gpus=2, max_model_len=131072, kv_cache_memory_bytes=2 * GiB)
    fit = int(info.value.args[0].split("fits is ")[1].split(";")[0].replace(",", ""))
    ok = plan("llama3.1-70b", "H100", num_gpus=2, max_model_len=fit, kv_cache_memory_bytes=2 * GiB)
    assert ok.max_concurrency >= 1
    with pytest.raises(InfeasibleError):
        plan("llama3.1-70b", "H100", num_gpus=2, max_model_len=fit + 16, kv_cache_memory_bytes=2 * GiB)


def test_tp_that_does_not_divide_heads():
    with pytest.raises(InfeasibleError, match="valid TP sizes: 1, 2, 4, 8, 16, 32$"):
        plan("llama3-8b", "H100", num_gpus=3, tp=3, max_model_len=8192)


@pytest.mark.parametrize(
    "kw",
    [
        {"gpu_memory_utilization": 0.0},
        {"gpu_memory_utilization": 1.01},
        {"block_size": 0},
        {"prefix_hit_rate": 1.5},
        {"shared_prefix_tokens": 10_000},
        {"shared_prefix_tokens": 64, "enable_prefix_caching": False},
        {"avg_context_tokens": 10_000},
    ],
)
def test_impossible_flags_are_usage_errors(kw):
    with pytest.raises(UsageError):
        plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192, **kw)


def test_given_kv_memory_cannot_exceed_the_card():
    with pytest.raises(InfeasibleError, match="exceed H100-SXM's 79.19 GiB"):
        plan("llama3-70b", "H100", num_gpus=8, max_model_len=8192, kv_cache_memory_bytes=70 * GiB)
