"""Decode and prefill speed: the memory-bound step model and its inputs."""

from __future__ import annotations

import pytest

from helpers import plan, run_cli
from kvplan import speed
from kvplan.specs.registry import load_gpu


def test_experts_touched():
    # 1 - (1 - k/E)^batch: one token touches k of E experts; many tokens touch nearly all
    assert speed.experts_touched(1, 32, 4) == pytest.approx(4 / 32)
    assert speed.experts_touched(8, 32, 4) == pytest.approx(1 - (28 / 32) ** 8)
    assert speed.experts_touched(512, 32, 4) > 0.999
    assert speed.experts_touched(7, 0, 0) == 1.0  # dense


def test_dense_step_is_bytes_over_bandwidth_plus_overhead():
    p = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192, kv_cache_memory_bytes=40 * 2**30)
    d = p.decode
    bw = load_gpu("H100").hbm_bytes_per_s * speed.DEFAULT_EFFICIENCY
    assert d.bandwidth_bytes_per_s == bw and not d.measured and "assumed" in d.bandwidth_source
    one = d.batch_1
    inputs = d.inputs
    # the input embedding is gathered by row, not streamed; everything else is read once per step
    assert one.weight_bytes_read == p.weight_bytes_per_gpu - inputs.embedding_bytes
    assert one.kv_bytes_read == p.kv_bytes_per_request_per_gpu == 8192 * 32 * 8 * 256 * 2  # seed 003: 1 GiB
    expected = (one.weight_bytes_read + one.kv_bytes_read) / bw * 1e3 + 0.2
    assert one.tpot_ms == pytest.approx(expected)
    assert one.communication_ms == 0  # TP 1
    full = d.at_max_concurrency
    assert full.batch == p.max_concurrency_per_replica
    assert full.kv_bytes_read == full.batch * p.kv_bytes_per_request_per_gpu
    assert full.tokens_per_s == pytest.approx(full.batch / full.tpot_ms * 1e3)


def test_moe_reads_only_the_experts_it_routes_to():
    p = plan("gpt-oss-20b", "H100", num_gpus=1, max_model_len=8192)
    inputs = p.decode.inputs
    assert inputs.num_experts == 32 and inputs.experts_per_token == 4
    one = p.decode.batch_1
    unread = inputs.expert_bytes * (1 - 4 / 32)
    assert one.weight_bytes_read == pytest.approx(
        inputs.weight_bytes - inputs.embedding_bytes - unread, abs=1
    )
    assert p.decode.at_max_concurrency.weight_bytes_read > one.weight_bytes_read


def test_tensor_and_pipeline_parallel_costs():
    tp8 = plan("llama3-70b", "H100", num_gpus=8, max_model_len=8192)
    assert tp8.decode.batch_1.communication_ms > 0  # 2 all-reduces per layer
    pp2 = plan("llama3-70b", "H100", num_gpus=8, tp=4, pp=2, max_model_len=8192)
    # a token crosses both stages one after the other
    one = pp2.decode.batch_1
    assert one.memory_ms == pytest.approx(
        2 * (one.weight_bytes_read + one.kv_bytes_read) / pp2.decode.bandwidth_bytes_per_s * 1e3
    )


def test_prefill_from_flops():
    p = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192)
    # 2 x active params x T + causal attention 2 x T^2 x layers x heads x head_dim, at 50% of 989.4 TFLOP/s
    flops = 2 * p.params_active * 8192 + 2 * 8192**2 * 32 * 32 * 128
    assert p.prefill.ms == pytest.approx(flops / (989.4e12 * 0.5) * 1e3)
    assert p.prefill.peak_dtype == "bf16"
    assert plan("deepseek-v3", "H200", num_gpus=8, max_model_len=8192).prefill.peak_dtype == "fp8"


def test_estimate_prints_speed_with_its_assumption():
    r = run_cli("estimate", "-m", "llama3-8b", "-g", "1xH100", "--context", "8K")
    assert "Decode speed per replica (estimated)" in r.stdout
    assert "assumed efficiency (not measured)" in r.stdout
    assert "prefill of one 8,192-token prompt" in r.stdout
