"""A prefill chunk riding in a decode step of an MoE model streams the routed experts its tokens touch
beyond the decodes' (step_model.moe_prefill_stream_seconds), in the simulator's steps and in the served
TPOT estimate and the decode fit use."""

from __future__ import annotations

import math

import pytest

import kvplan
from kvplan.simulator.step import Step
from kvplan.simulator.steptime import PlanSteps, step_seconds
from kvplan.speed.prefill import chunk_seconds
from kvplan.speed.step_model import coefficients, experts_touched, moe_prefill_stream_seconds


@pytest.fixture(scope="module")
def deepseek():
    return kvplan.estimate("deepseek-v3", gpus="8xH200", max_model_len="8K")


def test_the_extra_stream_is_the_experts_the_prompt_touches_beyond_the_decodes(deepseek):
    inp = deepseek.decode.inputs
    c = coefficients()
    s = inp.stages[0]
    e = s.experts
    per_expert = e.gate_up.weight_bytes + e.down.weight_bytes
    k, n = e.experts_per_token, e.num_experts
    for batch, tokens in ((1, 2048), (8, 256), (64, 16)):
        frac = experts_touched(batch + tokens, n, k) - experts_touched(batch, n, k)
        want = s.moe_layers * e.held * frac * per_expert / (c.gemm_efficiency * inp.hbm_bytes_per_s)
        # the grouped GEMM's bytes are rounded to whole bytes per projection
        assert moe_prefill_stream_seconds(inp, batch, tokens) == pytest.approx(want, rel=1e-6)
    # a 2048-token chunk beside one decode touches every expert: about all 58 MoE layers' experts
    # (655 GB fp8 / 8 GPUs at 4.8 TB/s x the fitted efficiency): tens of ms
    assert 0.01 < moe_prefill_stream_seconds(inp, 1, 2048) < 0.03
    assert moe_prefill_stream_seconds(inp, 512, 2048) < 1e-4  # 512 decodes already touch them all
    assert moe_prefill_stream_seconds(inp, 1, 0) == 0.0


def test_dense_models_pay_nothing_more():
    plan = kvplan.estimate("llama3-70b", gpus="8xH100", max_model_len="8K")
    assert moe_prefill_stream_seconds(plan.decode.inputs, 1, 4096) == 0.0


def test_a_simulated_step_pays_it_once_for_all_its_chunks(deepseek):
    inp = deepseek.decode.inputs
    steps = PlanSteps(deepseek.decode.step, 70272, inp, deepseek.prefill.work)

    class R:
        num_tokens = 1000

    decodes = [R()] * 4
    step = Step(decodes=decodes, prefills=[(None, 0, 1024), (None, 0, 1024)])
    plain = steps.decode_seconds(4, 1000) + 2 * chunk_seconds(inp, deepseek.prefill.work, 1024, 0)
    extra = moe_prefill_stream_seconds(inp, 4, 2048)
    assert extra > 0.005
    assert step_seconds(steps, step) == pytest.approx(plain + extra)
    with_decode_batch = chunk_seconds(inp, deepseek.prefill.work, 2048, 0, decode_batch=4)
    assert with_decode_batch == pytest.approx(chunk_seconds(inp, deepseek.prefill.work, 2048, 0) + extra)


def test_prefill_under_dp_attention_runs_a_prompts_attention_on_one_rank():
    """SGLang --enable-dp-attention --dp-size 8 on TP 8: a prompt's attention runs on one GPU (8x the
    attention time of TP 8), its attention GEMMs too; with --moe-a2a-backend deepep the MoE layers'
    all-reduce becomes a dispatch and combine."""
    common = {
        "gpus": "8xH200",
        "engine": "sglang",
        "max_model_len": "8K",
        "input_len": 4096,
        "output_len": 512,
    }
    tp = kvplan.estimate("deepseek-v3", **common).prefill.terms
    dpa = kvplan.estimate(
        "deepseek-v3", enable_dp_attention=True, data_parallel_size=8, **common
    ).prefill.terms
    a2a = kvplan.estimate(
        "deepseek-v3", enable_dp_attention=True, data_parallel_size=8, moe_a2a_backend="deepep", **common
    ).prefill.terms
    assert dpa.attention_ms == pytest.approx(8 * tp.attention_ms)
    assert 1.5 * tp.gemm_ms < dpa.gemm_ms < 8 * tp.gemm_ms  # attention GEMMs on 1 GPU, MLP/MoE on 8
    assert dpa.communication_ms < tp.communication_ms  # no attention all-reduce on one GPU
    assert a2a.communication_ms > dpa.communication_ms and a2a.gemm_ms == dpa.gemm_ms


def test_served_tpot_under_dp_attention_counts_the_ranks_own_prompts():
    from kvplan.speed.prefill import served_tpot_ms

    # 64 requests over 8 attention-DP ranks: a request's steps carry its rank's 7 other prompts
    assert served_tpot_ms(20.0, 64, 100.0, 1000, ranks=8) == pytest.approx(20.0 + 7 * 100.0 / 1000)
    assert served_tpot_ms(20.0, 64, 100.0, 1000) == pytest.approx(20.0 + 63 * 100.0 / 1000)
    plan = kvplan.estimate(
        "deepseek-v3", gpus="8xH200", engine="sglang", max_model_len="8K", input_len=4096, output_len=512,
        enable_dp_attention=True, data_parallel_size=8,
    )  # fmt: skip
    s = plan.decode.served
    assert s.tpot_ms == pytest.approx(s.step_ms + (math.ceil(s.batch / 8) - 1) * s.chunk_ms / 512)


def test_a_prefill_pays_the_fused_moes_activation_buffers_by_hand(deepseek):
    # DeepSeek-V3 at TP 8: per token-expert pair one GPU writes and reads gate_up's output (2 x 2048 / 8
    # = 512 values), the activation's (256) and down's (hidden 7,168), bf16: 2 x 2 x 7,936 = 31,744 bytes;
    # 8 pairs a token, 58 MoE layers (vLLM fused_experts_impl: intermediate_cache1/2/3)
    inp = deepseek.decode.inputs
    s, c = inp.stages[0], coefficients()
    assert (s.experts.gate_up.n, s.experts.down.k, s.experts.down.n, s.moe_layers) == (512, 256, 7168, 58)
    from kvplan.speed.prefill import prefill_time

    t = prefill_time(inp, deepseek.prefill.work, 4096, served=False)
    want = 58 * 4096 * 8 * 31_744 / (c.gemm_efficiency * inp.hbm_bytes_per_s)
    assert t.moe_activation_ms == pytest.approx(want * 1e3, rel=1e-9)
    assert t.total_ms == pytest.approx(
        t.gemm_ms + t.attention_ms + t.communication_ms + t.launch_ms + t.moe_activation_ms, rel=1e-9
    )
    # a chunk riding in a decode step pays it too; a dense model pays nothing
    with_acts = chunk_seconds(inp, deepseek.prefill.work, 4096)
    assert with_acts > want
    dense = kvplan.estimate("llama3-70b", gpus="8xH100", max_model_len="8K")
    assert prefill_time(dense.decode.inputs, dense.prefill.work, 4096).moe_activation_ms == 0.0


def test_the_routed_experts_gemms_run_at_moe_gemm_eff_of_a_dense_gemms_rate(deepseek):
    """prefill_fit.yaml's moe_gemm_eff (the MoE term's second form): the routed experts' part of a
    prefill's GEMM FLOPs and of its weight stream runs at that share of a dense GEMM's rate; the
    attention projections, shared experts and head do not. DeepSeek-V3 fp8 on 8x H200: 8 of 256 experts
    per token in 58 layers, each 3 x 7,168 x 2,048 split over 8 GPUs, is 2.55e9 of the 4.6e9 parameters a
    token passes through on one GPU; the routed experts are 81.8 GB of the 83.8 GB each GPU streams."""
    import dataclasses

    from kvplan.speed.prefill import _routed_per_gpu, prefill_coefficients, prefill_time

    inp, work, c = deepseek.decode.inputs, deepseek.prefill.work, coefficients()
    routed_params, routed_bytes = _routed_per_gpu(inp)
    assert routed_params == pytest.approx(58 * 8 * 3 * 7168 * 2048 / 8)
    assert routed_bytes == pytest.approx(58 * 256 * 3 * 7168 * 2048 / 8, rel=1e-3)  # fp8, block scales
    base = dataclasses.replace(prefill_coefficients(), moe_gemm_eff=1.0)
    half = dataclasses.replace(base, moe_gemm_eff=0.5)
    bw = c.gemm_efficiency * inp.hbm_bytes_per_s
    # 1,000 tokens stream-bound either way: the stream's routed part takes twice as long
    t1, t2 = prefill_time(inp, work, 1000, p=base), prefill_time(inp, work, 1000, p=half)
    assert not t1.compute_bound and not t2.compute_bound
    assert (t2.gemm_ms - t1.gemm_ms) / 1e3 == pytest.approx(routed_bytes / bw, rel=1e-6)
    # 64K tokens compute-bound: the routed FLOPs take twice as long, the dense ones do not
    n = 65536
    big1, big2 = prefill_time(inp, work, n, p=base), prefill_time(inp, work, n, p=half)
    assert big1.compute_bound and big2.compute_bound
    routed_s = 2.0 * n * routed_params / (work.gemm_peak_flops_per_s * base.gemm_mfu)
    assert (big2.gemm_ms - big1.gemm_ms) / 1e3 == pytest.approx(routed_s, rel=1e-6)
    # a chunk beside one decode: its routed FLOPs and the experts it adds to the step's stream, both
    # at half the rate
    chunk = 512
    extra = chunk_seconds(inp, work, chunk, p=half, decode_batch=1) - chunk_seconds(
        inp, work, chunk, p=base, decode_batch=1
    )
    want = 2.0 * chunk * routed_params / (
        work.gemm_peak_flops_per_s * base.gemm_mfu
    ) + moe_prefill_stream_seconds(inp, 1, chunk)
    assert extra == pytest.approx(want, rel=1e-6)
    # a dense model has no routed experts: the coefficient moves nothing
    dense = kvplan.estimate("llama3-70b", gpus="8xH100", max_model_len="8K")
    a = prefill_time(dense.decode.inputs, dense.prefill.work, 4096, p=base)
    b = prefill_time(dense.decode.inputs, dense.prefill.work, 4096, p=half)
    assert a.total_ms == b.total_ms


def test_the_plan_states_the_routed_experts_rate_only_for_a_model_with_routed_experts(monkeypatch):
    """Prefill.moe_gemm_eff is the coefficient for a model with routed experts and 1 for a dense one; the
    prefill line and the assumptions name it only where it is not 1 (assumed 1 today, so nowhere)."""
    import dataclasses

    from kvplan.speed import plan_speed
    from kvplan.speed.prefill import prefill_coefficients

    shipped = prefill_coefficients()
    moe = kvplan.estimate("deepseek-v3", gpus="8xH200", max_model_len="8K")
    assert moe.prefill.moe_gemm_eff == shipped.moe_gemm_eff == 1.0
    assert moe.prefill.gemm_words == "GEMMs at 50% of fp8 peak"
    monkeypatch.setattr(
        plan_speed, "prefill_coefficients", lambda: dataclasses.replace(shipped, moe_gemm_eff=0.12)
    )
    moe = kvplan.estimate("deepseek-v3", gpus="8xH200", max_model_len="8K")
    dense = kvplan.estimate("llama3-70b", gpus="8xH100", max_model_len="8K")
    assert moe.prefill.moe_gemm_eff == 0.12 and dense.prefill.moe_gemm_eff == 1.0
    assert moe.prefill.gemm_words == "GEMMs at 50% of fp8 peak, the routed experts' at 12% of that rate"
    assert any("the routed experts' at 12% of that rate" in a for a in moe.assumptions)
    assert not any("routed experts' at" in a for a in dense.assumptions)
