"""Decode and prefill speed: the memory-bound step model and its inputs."""

from __future__ import annotations

import pytest

from helpers import plan, run_cli
from kvplan.specs.registry import load_gpu
from kvplan.speed import step_model
from kvplan.speed.prefill import prefill_coefficients, prefill_time


def test_experts_touched():
    # 1 - (1 - k/E)^batch: one token touches k of E experts; many tokens touch nearly all
    assert step_model.experts_touched(1, 32, 4) == pytest.approx(4 / 32)
    assert step_model.experts_touched(8, 32, 4) == pytest.approx(1 - (28 / 32) ** 8)
    assert step_model.experts_touched(512, 32, 4) > 0.999
    assert step_model.experts_touched(7, 0, 0) == 1.0  # dense


def test_dense_step_adds_its_terms():
    p = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192, kv_cache_memory_bytes=40 * 2**30)
    d = p.decode
    c = step_model.coefficients()
    assert not d.measured and step_model.FITTED in d.bandwidth_source
    one = d.batch_1
    # every weight GEMM: (bytes + half) / (efficiency x datasheet); 32 layers x 4 fused GEMMs + LM head
    gemms = d.inputs.stages[0].gemms
    assert sum(g.count for g in gemms) == 32 * 4 + 1
    bw = load_gpu("H100").hbm_bytes_per_s * c.gemm_efficiency
    weights_s = sum(g.count * (g.weight_bytes + c.gemm_half_bytes) / bw for g in gemms)
    assert one.weights_ms == pytest.approx(weights_s * 1e3)
    # the input embedding is gathered by row, not streamed
    assert one.weight_bytes_read == sum(g.count * g.weight_bytes for g in gemms)
    assert one.weight_bytes_read < p.weight_bytes_per_gpu
    assert (
        one.kv_bytes_read == p.kv_bytes_per_request_per_gpu == 8192 * 32 * 8 * 256 * 2
    )  # README, The formulas: 1 GiB
    assert one.launch_ms == pytest.approx(32 * c.launch_per_layer_s * 1e3)
    assert one.communication_ms == 0 and one.pp_hop_ms == 0 and one.moe_ms == 0  # TP 1, PP 1, dense
    total = one.weights_ms + one.attention_ms + one.launch_ms + one.overhead_ms
    assert one.tpot_ms == pytest.approx(total)
    assert set(one.sources.values()) == {step_model.FITTED, step_model.CURVE}
    assert one.sources["attention"] == step_model.CURVE
    full = d.at_max_concurrency
    assert full.batch == p.max_concurrency_per_replica
    assert full.kv_bytes_read == full.batch * p.kv_bytes_per_request_per_gpu
    assert full.tokens_per_s == pytest.approx(full.batch / full.tpot_ms * 1e3)


def test_the_step_runs_at_the_mean_decode_context():
    p = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192, input_len=2000, output_len=1000)
    assert p.decode.context_tokens == 2500  # input + output / 2
    assert p.decode.batch_1.kv_bytes_read == 2512 * 128 * 1024  # whole 16-token blocks, 128 KiB a token
    at_max = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192)
    assert at_max.decode.context_tokens == 8192
    assert p.decode.batch_1.tpot_ms < at_max.decode.batch_1.tpot_ms


def test_moe_reads_only_the_experts_it_routes_to():
    p = plan("gpt-oss-20b", "H100", num_gpus=1, max_model_len=8192)
    e = p.decode.inputs.stages[0].experts
    assert e is not None and e.num_experts == 32 and e.experts_per_token == 4
    one = p.decode.batch_1
    assert one.moe_ms > 0
    full = p.decode.at_max_concurrency
    assert full.weight_bytes_read > one.weight_bytes_read  # more experts touched


def test_tensor_and_pipeline_parallel_costs():
    c = step_model.coefficients()
    tp8 = plan("llama3-70b", "H100", num_gpus=8, max_model_len=8192)
    one = tp8.decode.batch_1
    # 2 all-reduces per layer, each latency + 2 (tp - 1) / tp x 16 KiB / NVLink one way (900 GB/s both ways)
    per = c.allreduce_latency_s + 2 * 8192 * 2 * 7 / 8 / 450e9
    assert one.communication_ms == pytest.approx(2 * 80 * per * 1e3)
    assert not tp8.decode.inputs.tp_link.inter_node
    # a token crosses both stages one after the other: PP does not make one request faster
    pp2 = plan("llama3-70b", "H100", num_gpus=8, tp=4, pp=2, max_model_len=8192)
    tp4 = plan("llama3-70b", "H100", num_gpus=4, tp=4, pp=1, max_model_len=8192, kv_cache_memory_bytes=2**30)
    assert pp2.decode.batch_1.pp_hop_ms > 0
    assert pp2.decode.batch_1.tpot_ms > tp4.decode.batch_1.tpot_ms
    # across nodes the hop takes the network's latency (TP 8 x PP 2 on 2 nodes of 8)
    two = plan("llama3-70b", "H100", num_gpus=16, nodes=2, tp=8, pp=2, max_model_len=8192)
    assert two.decode.inputs.pp_links[0].inter_node
    assert two.decode.batch_1.pp_hop_ms == pytest.approx((c.network_latency_s + 8192 * 2 / 50e9) * 1e3)


class _Profile:
    """A calibration profile with measured parts (the interface calibrate.Profile will have)."""

    class fit:  # noqa: N801 - the attribute name of calibrate.Profile
        @staticmethod
        def bandwidth(nbytes: float) -> float:
            return 2.0e12

    launch_seconds = 5e-6  # measured, but never a layer's launch term
    gemm_as_engine_runs = True  # GEMM points timed as CUDA-graph replays

    def gemm_seconds(self, dtype: str, batch: int, k: int, n: int) -> float | None:
        return 1e-5 if dtype == "bf16" else None

    def allreduce_seconds(self, nbytes: int, world_size: int) -> float | None:
        return None


def test_a_profile_replaces_the_terms_it_measured():
    base = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192)
    p = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192, calibration=_Profile())
    one = p.decode.batch_1
    assert p.decode.measured
    assert one.sources["weights"] == one.sources["attention"] == step_model.MEASURED
    # a profile's launch floor is one trivial kernel, not a layer's small ops: the fitted cost stays
    assert one.sources["overhead"] == one.sources["launch"] == step_model.FITTED
    assert one.weights_ms == pytest.approx(129 * 1e-5 * 1e3)  # 129 GEMMs at the measured 10 us
    assert one.attention_ms == pytest.approx(one.kv_bytes_read / 2.0e12 * 1e3)
    assert one.launch_ms == pytest.approx(32 * step_model.coefficients().launch_per_layer_s * 1e3)
    assert base.decode.batch_1.sources["weights"] == step_model.FITTED
    assert "measured on this machine" in p.decode.bandwidth_source
    j = p.to_dict()["decode"]
    assert j["batch_1"]["sources"]["weights"] == step_model.MEASURED and "weights_ms" in j["batch_1"]


def test_prefill_terms_from_flops():
    c, pc = step_model.coefficients(), prefill_coefficients()
    p = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192)
    t = p.prefill.terms
    # GEMMs: 2 x active params x T at gemm_mfu of 989.4 TFLOP/s (bf16), at least one weight stream; the
    # active GEMM parameters leave out the input embedding (a gather) and the LM head (128,256 x 4,096
    # each, untied), which runs on the prompt's last token only
    vocab_x_hidden = 128256 * 4096
    assert p.params_active == 8_030_261_248
    assert p.prefill.work.active_params == p.params_active - 2 * vocab_x_hidden == 6_979_588_096
    assert p.prefill.work.head_params == vocab_x_hidden
    gemm = 2 * (6_979_588_096 * 8192 + vocab_x_hidden) / (989.4e12 * pc.gemm_mfu)
    assert t.compute_bound and t.gemm_ms == pytest.approx(gemm * 1e3)
    # causal attention: 2 x 2 x T x T / 2 x 32 layers x 32 heads x 128 at attention_mfu of the bf16 peak
    attention = 4 * 8192 * 4096 * 32 * 32 * 128 / (989.4e12 * pc.attention_mfu)
    assert t.attention_ms == pytest.approx(attention * 1e3)
    assert t.communication_ms == 0  # TP 1
    assert t.launch_ms == pytest.approx(32 * c.launch_per_layer_s * 1e3)
    assert t.overhead_ms == pytest.approx(pc.ttft_overhead_s * 1e3)
    assert p.prefill.ms == pytest.approx(t.gemm_ms + t.attention_ms + t.launch_ms + t.overhead_ms)
    assert p.prefill.peak_dtype == "bf16"
    # fp8 weights on an fp8 GPU run their GEMMs at the fp8 peak; TP all-reduces the prompt's activations
    ds = plan("deepseek-v3", "H200", num_gpus=8, max_model_len=8192).prefill
    assert ds.peak_dtype == "fp8" and ds.terms.communication_ms > 0
    # a short prompt is bound by streaming the weights once, not by its FLOPs
    short = prefill_time(p.decode.inputs, p.prefill.work, 16, served=False)
    assert not short.compute_bound and short.gemm_ms == pytest.approx(
        p.prefill.work.weight_bytes_per_gpu / (c.gemm_efficiency * 3.35e12) * 1e3
    )
    # a chunk after cached tokens pays attention over them: the same FLOPs as the difference
    whole = prefill_time(p.decode.inputs, p.prefill.work, 8192, served=False)
    half = prefill_time(p.decode.inputs, p.prefill.work, 4096, served=False)
    rest = prefill_time(p.decode.inputs, p.prefill.work, 4096, cached_tokens=4096, served=False)
    assert half.attention_ms + rest.attention_ms == pytest.approx(whole.attention_ms)


def test_prefill_flops_count_the_architecture_not_a_stated_active_figure():
    """gpt-oss-20b states 3.6B active, which counts the LM head and not the input embedding (24 layers of
    attention, 4 of 32 experts and the 201,088 x 2,880 unembedding): the prompt's per-token GEMMs are the
    architecture's attention, routers and top-4 experts, 3.03B, and the head runs once per prompt. A
    tied model (Gemma 2) charges its embedding matrix as the head."""
    g = plan("gpt-oss-20b", "H200", num_gpus=1, max_model_len=8192)
    assert g.params_active == 3_600_000_000
    assert g.prefill.work.active_params == 3_028_150_080
    assert g.prefill.work.head_params == 201088 * 2880
    tied = plan("gemma2-27b", "H100", num_gpus=8, max_model_len=8192)
    assert tied.prefill.work.head_params == 256000 * 4608
    # two prompts in one pass pay the head twice, and the per-token GEMMs for both prompts' tokens
    one = prefill_time(g.decode.inputs, g.prefill.work, 4096, served=False)
    two = prefill_time(g.decode.inputs, g.prefill.work, 4096, served=False, prompts=2)
    per_token = 2 * 3_028_150_080 * 4096 / (989.4e12 * prefill_coefficients().gemm_mfu)
    head = 2 * 201088 * 2880 / (989.4e12 * prefill_coefficients().gemm_mfu)
    assert one.gemm_ms == pytest.approx((per_token + head) * 1e3)
    assert two.gemm_ms == pytest.approx(2 * (per_token + head) * 1e3)


def test_estimate_prints_speed_with_its_assumption():
    r = run_cli("estimate", "-m", "llama3-8b", "-g", "1xH100", "--context", "8K")
    assert "Decode speed per replica (estimated)" in r.stdout
    assert "fitted to published runs" in " ".join(r.stdout.split())
    assert "prefill of one 8,192-token prompt" in r.stdout
