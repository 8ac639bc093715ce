"""Issue 23: expert parallelism and DP attention, memory side.

Hand-computed from the engines' rules (cited in kvplan/engines/vllm.py vllm_sharding and
kvplan/engines/sglang.py sglang_sharding); the one real log with expert parallelism is
tests/fixtures/logs/real/vllm_0.10.2_qwen3-235b-a22b-instruct-2507-fp8_l40s_tp8.log (16/128 local experts).
"""

from __future__ import annotations

import math

import pytest

import kvplan
from kvplan.errors import UsageError
from kvplan.model.parallel import Sharding
from kvplan.model.weights import sharded_stage_weights
from kvplan.specs.matrices import weight_matrices
from kvplan.specs.registry import load_model
from kvplan.speed import step_model
from kvplan.units import MiB

BASE = {"gpus": "8xH200", "max_model_len": "32K", "calibration": False}


def plan(model: str = "deepseek-v3", **flags):
    return kvplan.estimate(model, **{**BASE, **flags})


# --- vLLM ------------------------------------------------------------------------------------------


def test_vllm_ep_at_tp_size_moves_no_bytes():
    # 256 experts over EP 8: 32 whole experts a GPU hold as many bytes as 1/8 of each of 256
    tp, ep = plan(), plan(enable_expert_parallel=True)
    assert ep.weight_bytes_per_gpu == tp.weight_bytes_per_gpu
    assert ep.cluster.expert_parallel_size == 8 and ep.cluster.routed_experts_per_gpu == 32
    assert ep.cluster.expert_tp_size == 1
    assert tp.cluster.expert_parallel_size == 1 and tp.cluster.routed_experts_per_gpu == 256
    assert any("EP size = TP x DP = 8" in a for a in ep.assumptions)
    # the prefill line says what it follows under this layout and what it does not credit; a plain plan
    # says nothing of it
    assert any("prefill (TTFT) under this layout" in a and "not credited" in a for a in ep.assumptions)
    assert not any("prefill (TTFT) under this layout" in a for a in tp.assumptions)


def test_vllm_redundant_experts_add_whole_experts_per_gpu():
    # 256 + 32 redundant over EP 8: 36 a GPU (4 more); + 64: 40 (8 more): twice the extra bytes
    base = plan(enable_expert_parallel=True)
    r32 = plan(enable_expert_parallel=True, enable_eplb=True, num_redundant_experts=32)
    r64 = plan(enable_expert_parallel=True, enable_eplb=True, num_redundant_experts=64)
    assert r32.cluster.routed_experts_per_gpu == 36 and r64.cluster.routed_experts_per_gpu == 40
    d32 = r32.weight_bytes_per_gpu - base.weight_bytes_per_gpu
    d64 = r64.weight_bytes_per_gpu - base.weight_bytes_per_gpu
    assert d32 > 0 and abs(d64 - 2 * d32) <= 2
    assert r32.kv_budget_bytes_per_gpu < base.kv_budget_bytes_per_gpu


def test_vllm_uneven_ep_takes_the_fullest_gpu():
    # 256 experts over EP 24 (TP 8 x DP 3): 10 or 11 a rank; the fullest holds 11 (without EPLB: vLLM's EPLB
    # takes only an even split, fused_moe/layer.py)
    p = plan(gpus="24xH200", tensor_parallel_size=8, data_parallel_size=3, enable_expert_parallel=True)
    assert p.cluster.expert_parallel_size == 24 and p.cluster.routed_experts_per_gpu == 11


def test_vllm_data_parallel_spreads_the_experts_over_tp_x_dp():
    tp8 = plan()
    dp2 = plan(gpus="16xH200", tensor_parallel_size=8, data_parallel_size=2)
    ep16 = plan(gpus="16xH200", tensor_parallel_size=8, data_parallel_size=2, enable_expert_parallel=True)
    assert (dp2.cluster.num_gpus, dp2.cluster.data_parallel_size) == (16, 2)
    assert dp2.cluster.expert_tp_size == 16 and ep16.cluster.routed_experts_per_gpu == 16
    # sliced over 16 or 16 whole experts of 256: the same bytes, half the routed experts' TP-8 share
    assert abs(dp2.weight_bytes_per_gpu - ep16.weight_bytes_per_gpu) <= 1
    assert dp2.weight_bytes_per_gpu < tp8.weight_bytes_per_gpu
    # each DP engine core keeps its own KV at TP 8: per-GPU KV per token unchanged, more of it left
    assert dp2.kv_bytes_per_token_per_gpu == tp8.kv_bytes_per_token_per_gpu
    assert dp2.kv_pool_tokens > tp8.kv_pool_tokens
    assert dp2.max_concurrency == 2 * dp2.max_concurrency_per_replica


def test_vllm_data_parallel_on_a_bare_gpu_name_and_its_default_tp():
    assert plan(gpus="H200", tensor_parallel_size=8, data_parallel_size=2).cluster.num_gpus == 16
    p = plan(gpus="8xH200", data_parallel_size=2, max_model_len="4K")
    assert (p.cluster.tensor_parallel_size, p.cluster.data_parallel_size) == (4, 2)


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        ({"num_redundant_experts": 8}, "--num-redundant-experts needs --enable-expert-parallel"),
        ({"data_parallel_size": 3}, "--data-parallel-size 3"),
        ({"data_parallel_size": 0}, "--data-parallel-size must be >= 1"),
        ({"enable_dp_attention": True}, "--enable-dp-attention is a sglang flag"),
        ({"ep_size": 8}, "--ep-size is a sglang flag"),
    ],
)
def test_vllm_refuses_bad_combinations_naming_the_flag(flags, names):
    with pytest.raises(UsageError, match=names):
        plan(tensor_parallel_size=8, **flags)


def test_dense_model_ep_changes_nothing_and_redundant_is_refused():
    plain = plan("llama-3.1-8b", gpus="H100")
    ep = plan("llama-3.1-8b", gpus="H100", enable_expert_parallel=True)
    assert ep.weight_bytes_per_gpu == plain.weight_bytes_per_gpu and ep.cluster.expert_parallel_size == 1
    with pytest.raises(UsageError, match="no routed experts"):
        plan(
            "llama-3.1-8b",
            gpus="H100",
            enable_expert_parallel=True,
            enable_eplb=True,
            num_redundant_experts=1,
        )


# --- SGLang ----------------------------------------------------------------------------------------


def _attention_and_embedding_bytes(name: str) -> tuple[int, int]:
    spec = load_model(name)
    from kvplan.formats import weight_format
    from kvplan.model.weights import matrix_format_name

    attn = 0
    for m in weight_matrices(spec):
        if m.component == "attention" and m.layer is not None and not m.replicated:
            attn += weight_format(matrix_format_name(spec, m)).matrix_bits(m.rows, m.cols) * m.count
    # an fp8 checkpoint keeps its embedding in the model dtype, bf16 (kvplan/model/weights.py stage_weights)
    return attn // 8, spec.vocab_size * spec.hidden_size * 2


def test_sglang_dp_attention_on_mla_multiplies_the_pool_by_dp():
    plain = plan(engine="sglang", ep_size=8)
    dpa = plan(engine="sglang", ep_size=8, enable_dp_attention=True, data_parallel_size=8)
    c = dpa.cluster
    assert (c.attention_dp_size, c.attention_tp_size, c.expert_parallel_size) == (8, 1, 8)
    # an MLA latent is whole on every GPU either way: the same bytes per token per GPU
    assert dpa.kv_bytes_per_token_per_gpu == plain.kv_bytes_per_token_per_gpu
    # each rank logs its own pool; the replica holds 8 of them, each with its own requests
    per_rank = dpa.engine.kv_cache_tokens
    assert dpa.kv_pool_tokens == 8 * per_rank
    assert dpa.max_concurrency_per_replica == 8 * math.floor(per_rank / 32768)
    assert dpa.max_concurrency_per_replica > plain.max_concurrency_per_replica


def test_sglang_dp_attention_replicates_attention_and_embedding():
    # attention over tp / dp = 1 GPU instead of 8, the embedding whole: + 7/8 of each, by hand
    attn, emb = _attention_and_embedding_bytes("deepseek-v3")
    plain = plan(engine="sglang", ep_size=8)
    dpa = plan(engine="sglang", ep_size=8, enable_dp_attention=True, data_parallel_size=8)
    extra = dpa.weight_bytes_per_gpu - plain.weight_bytes_per_gpu
    expected = (attn - math.ceil(attn / 8)) + (emb - math.ceil(emb / 8))
    assert abs(extra - expected) <= 16
    assert any("attention TP size = tp / dp = 1" in a for a in dpa.assumptions)


def test_sglang_dp_attention_reserve_in_the_default_fraction():
    # server_args.py 0.5.3+ on H200 (143,155 MiB, chunk 8192, graph bs 512 at TP 8): 512 + 8192 x 1.5
    # + 512 x 2 + 8 / 8 x 1024 = 14,848; DP 8: + 512 x 8 x 3 + 512 x 8 x 1.5 (bs > 300) = 33,280 MiB
    dpa = plan(engine="sglang", enable_dp_attention=True, data_parallel_size=8)
    gpu_mib = dpa.memory_bytes_per_gpu / MiB
    assert dpa.settings.mem_fraction_static == round((gpu_mib - 33280) / gpu_mib, 3)
    assert plan(engine="sglang").settings.mem_fraction_static == round((gpu_mib - 14848) / gpu_mib, 3)
    # and the chunk it then divides by dp, with the warning SGLang prints
    assert dpa.settings.chunked_prefill_size == 8192 // 8
    assert dpa.engine.log_lines[0].startswith(
        "DP attention is enabled. The chunked prefill size is adjusted to 1024"
    )


def test_sglang_dp_attention_on_gqa_splits_kv_heads_over_attention_tp():
    # Qwen3-235B-A22B: 4 KV heads. TP 8: max(1, 4 // 8) = 1 a GPU; DP 4 -> attention TP 2: 2 a GPU
    plain = plan("qwen3-235b-a22b", engine="sglang")
    dp4 = plan("qwen3-235b-a22b", engine="sglang", enable_dp_attention=True, data_parallel_size=4)
    assert dp4.cluster.attention_tp_size == 2
    assert dp4.kv_bytes_per_token_per_gpu == 2 * plain.kv_bytes_per_token_per_gpu


def test_sglang_ep_size_and_a2a_backend():
    ep4 = plan(engine="sglang", ep_size=4)
    assert (ep4.cluster.routed_experts_per_gpu, ep4.cluster.expert_tp_size) == (64, 2)
    deepep = plan(engine="sglang", moe_a2a_backend="deepep")
    assert deepep.cluster.expert_parallel_size == 8
    assert any(
        "--moe-a2a-backend deepep: SGLang sets --ep-size to --tp-size 8" in a for a in deepep.assumptions
    )
    red = plan(engine="sglang", ep_size=8, num_redundant_experts=32)
    assert red.cluster.routed_experts_per_gpu == 36


def test_dp_attention_off_at_dp_size_1():
    p = plan(engine="sglang", enable_dp_attention=True)
    assert (
        p.cluster.attention_dp_size == 1
        and p.weight_bytes_per_gpu == plan(engine="sglang").weight_bytes_per_gpu
    )


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        ({"enable_dp_attention": True, "data_parallel_size": 3}, "--dp-size 3 must divide --tp-size 8"),
        ({"ep_size": 3}, "--ep-size 3 must divide --tp-size 8"),
        ({"ep_size": 8, "num_redundant_experts": 4}, r"--ep-size 8 must divide the 260 routed experts"),
        ({"num_redundant_experts": 8}, "--ep-num-redundant-experts needs --ep-size > 1"),
        ({"moe_a2a_backend": "nccl"}, "--moe-a2a-backend must be"),
        ({"enable_expert_parallel": True}, "--enable-expert-parallel is a vllm flag"),
    ],
)
def test_sglang_refuses_bad_combinations_naming_the_flag(flags, names):
    with pytest.raises(UsageError, match=names):
        plan(engine="sglang", **flags)


def test_sglang_ep_on_a_dense_model_is_refused():
    with pytest.raises(UsageError, match="--ep-size 8: llama3.1-8b has no routed experts"):
        plan("llama-3.1-8b", engine="sglang", ep_size=8)


# --- the pieces ------------------------------------------------------------------------------------


def test_plain_sharding_leaves_the_stages_alone():
    spec = load_model("deepseek-v3")
    p = plan()
    from kvplan.model.weights import StageWeights

    stages = [StageWeights(0, range(61), p.weight_bytes_per_gpu, 10, 5)]
    plain = Sharding(8, 8, 1, 1, 8, 256, 256)
    assert sharded_stage_weights(spec, stages, plain, None) is stages


def test_header_names_ep_and_attention_dp_only_when_on():
    from kvplan.plan.plan import plan_header

    assert "EP" not in plan_header(plan())[0]
    dpa = plan(engine="sglang", ep_size=8, enable_dp_attention=True, data_parallel_size=8)
    assert "(TP 8, PP 1, DP 1, EP 8, attention DP 8 x TP 1)" in plan_header(dpa)[0]


def test_real_vllm_ep_log_local_experts():
    # vllm_0.10.2_qwen3-235b-a22b-instruct-2507-fp8_l40s_tp8.log: "Local/global number of experts: 16/128"
    # and 27.7183 GiB of weights per GPU at TP 8 with --enable-expert-parallel
    from helpers import REPO

    text = (
        REPO / "tests/fixtures/logs/real/vllm_0.10.2_qwen3-235b-a22b-instruct-2507-fp8_l40s_tp8.log"
    ).read_text()
    assert "Local/global number of experts: 16/128" in text
    p = plan(
        "qwen3-235b-a22b", gpus="8xL40S", weight_dtype="fp8", enable_expert_parallel=True, max_model_len="32K"
    )
    assert p.cluster.routed_experts_per_gpu == 16
    assert abs(p.weight_bytes_per_gpu / 2**30 - 27.7183) / 27.7183 < 0.03


DSV4_DPA_LOG = "sglang_0.5.11.dev20260512_deepseek-v4-flash-fp8_mi300x_tp4_dp4attn.log"


def test_real_sglang_dp_attention_log_figures():
    # sgl-project/sglang#25118 (SOURCES.tsv): DeepSeek-V4-Flash-FP8 on 4x MI300X, --tp 4 --dp 4
    # --enable-dp-attention, SGLang 0.5.11.dev20260512+g339e36e. The run died creating DeepSeek-V4's pools,
    # so it has no pool line; what it logged per rank is asserted here.
    from helpers import REPO
    from kvplan.logs.logparse import parse

    log = parse((REPO / "tests/fixtures/logs/real" / DSV4_DPA_LOG).read_text())
    assert log.engine == "sglang" and "version" not in log.facts  # "sglang is using nccl==2.27.7" is not it
    assert log.facts["tensor_parallel_size"] == 4 and log.facts["data_parallel_size"] == 4
    assert log.facts["mem_fraction_static"] == 0.88 and log.facts["chunked_prefill_size"] == 2048
    assert log.facts["weights_bytes"] == round(73.43 * 2**30)  # "Load weight end ... mem usage=73.43 GB"
    assert log.facts["available_kv_bytes"] == round(87.26 * 2**30)  # "DSv4 memory calculation"
    assert log.facts["free_at_start_bytes"] == round(182.61 * 2**30)  # the lowest "Load weight begin"


def test_real_sglang_dp_attention_log_weights_gap():
    # kvplan against that log (not matched; recorded so a change shows): the FP8 checkpoint (experts in fp8;
    # the shipped spec's are the official FP4) gives weights per GPU 70.30 GiB vs the logged 73.43 (66.01 before
    # V4's attention projections were counted: fuzz P2); its startup memory is 0.40 GiB by kvplan's estimate,
    # 191.98 - 182.61 = 9.37 GiB logged: AITER's custom all-reduce and NCCL on ROCm
    p = plan(
        "deepseek-v4-flash",
        gpus="4xMI300X",
        engine="sglang",
        data_parallel_size=4,
        enable_dp_attention=True,
        mem_fraction_static=0.88,
        kv_cache_dtype="fp8_e4m3",
        block_size=256,
        weight_dtype="fp8",
    )
    assert abs(p.weight_bytes_per_gpu / 2**30 - 70.30) < 0.01
    assert 73.43 - p.weight_bytes_per_gpu / 2**30 > 3


# --- the decode step under EP and DP attention (issue 23, speed) ------------------------------------


def _inputs(parallel: step_model.ExpertParallel, hidden: int = 7168) -> step_model.DecodeInputs:
    stage = step_model.Stage(1, 1, (), 0, None, 1.0)
    link = step_model.Link(False, 450e9, 10e-6, "NVLink4")
    return step_model.DecodeInputs((stage,), hidden, 8, 4.8e12, 989e12, 1979e12, link, (), parallel=parallel)


def test_all_to_all_by_hand():
    # 8 requests x 2 DP engine cores over EP 16: 1 token a GPU, top-8, 7168 x 2 B, 15/16 leave the GPU
    link = step_model.Link(False, 450e9, 10e-6, "NVLink4")
    inp = _inputs(step_model.ExpertParallel(ep=16, group_tokens=2, all_to_all=True, link=link))
    c = step_model.coefficients()
    out = 1 * 8 * 7168 * 2 * 15 / 16
    assert step_model.all_to_all_seconds(8, 8, inp, c) == pytest.approx(2 * (10e-6 + out / 450e9))
    # half the peers on another node: that half over a 50 GB/s network with 25 us a message, concurrently
    net = step_model.Link(True, 50e9, 25e-6, "network 400G")
    inp = _inputs(step_model.ExpertParallel(16, 0, 1, 2, True, link, net, 0.5))
    assert step_model.all_to_all_seconds(8, 8, inp, c) == pytest.approx(2 * (25e-6 + out * 0.5 / 50e9))
    # imbalance 1.5: the busiest rank moves 1.5 x the bytes; no all-to-all: nothing
    inp = _inputs(step_model.ExpertParallel(16, 0, 1, 2, True, link, imbalance=1.5))
    assert step_model.all_to_all_seconds(8, 8, inp, c) == pytest.approx(2 * (10e-6 + 1.5 * out / 450e9))
    assert step_model.all_to_all_seconds(8, 8, _inputs(step_model.ExpertParallel(ep=16)), c) == 0


def test_experts_a_gpu_streams_under_ep_by_hand():
    # 32 whole experts of 256 on this GPU, top-8: one token touches 32 x 8/256 = 1 of them (expected);
    # 40 tokens: 32 x (1 - (1 - 8/256)^40); imbalance 2 doubles that, capped at the 32 it holds
    g = step_model.Gemm(7168, 4096, 7168 * 4096, "fp8", True)
    d = step_model.Gemm(2048, 7168, 2048 * 7168, "fp8", True)
    e = step_model.Experts(256, 8, g, d, local=32)
    c = step_model.coefficients()
    one_expert = g.weight_bytes + d.weight_bytes
    _, nbytes, _ = step_model._moe_seconds(e, 1, _inputs(step_model.ExpertParallel(ep=8)), c, None)
    assert nbytes == pytest.approx(one_expert, abs=2)
    touched = 32 * (1 - (1 - 8 / 256) ** 40)
    _, nbytes, _ = step_model._moe_seconds(e, 40, _inputs(step_model.ExpertParallel(ep=8)), c, None)
    assert nbytes == pytest.approx(touched * one_expert, rel=1e-6)
    _, nbytes, _ = step_model._moe_seconds(
        e, 40, _inputs(step_model.ExpertParallel(ep=8, imbalance=2)), c, None
    )
    assert nbytes == pytest.approx(min(32, 2 * touched) * one_expert, rel=1e-6)
    # vLLM's DP engine cores share the MoE group: 20 requests x 2 cores route as 40 tokens
    _, nbytes, _ = step_model._moe_seconds(
        e, 20, _inputs(step_model.ExpertParallel(ep=8, group_tokens=2)), c, None
    )
    assert nbytes == pytest.approx(touched * one_expert, rel=1e-6)


def test_vllm_ep_inside_one_engine_core_keeps_the_all_reduce():
    # vLLM runs all-to-all kernels only at DP > 1 (use_all2all_kernels); at TP 8 x DP 1 whole experts
    # stream the same bytes as slices of all of them, behind the same all-reduce
    tp, ep = plan().decode.batch_1, plan(enable_expert_parallel=True).decode.batch_1
    assert ep.all_to_all_ms == 0 and "all_to_all" not in ep.sources
    assert ep.communication_ms == pytest.approx(tp.communication_ms)
    assert ep.tpot_ms == pytest.approx(tp.tpot_ms, rel=1e-3)
    assert any("use_all2all_kernels" in a for a in plan(enable_expert_parallel=True).assumptions)


def test_vllm_ep_across_dp_engine_cores_pays_the_all_to_all():
    flags = {"gpus": "16xH200", "tensor_parallel_size": 8, "data_parallel_size": 2}
    ep, no_ep = plan(**flags, enable_expert_parallel=True), plan(**flags)
    one = ep.decode.batch_1
    assert one.all_to_all_ms > 0 and no_ep.decode.batch_1.all_to_all_ms == 0
    # 16 GPUs over two nodes of 8: 8/15 of each GPU's peers are on the other node, over --network
    assert ep.decode.inputs.parallel.remote_share == pytest.approx(8 / 15)
    assert (
        "network 400G" in one.sources["all_to_all"] and "dispatch and a combine" in one.sources["all_to_all"]
    )
    # the MoE layers' all-reduce is gone: only the attention all-reduce and the dense layers' MLP remain
    assert one.communication_ms < no_ep.decode.batch_1.communication_ms
    assert "all-to-all" in ep.decode.bandwidth_source
    # a faster network makes it cheaper
    fast = plan(**flags, enable_expert_parallel=True, network="800G").decode.batch_1
    assert fast.all_to_all_ms < one.all_to_all_ms


def test_moe_imbalance_slows_the_expert_work_and_is_stated():
    flags = {
        "gpus": "16xH200",
        "tensor_parallel_size": 8,
        "data_parallel_size": 2,
        "enable_expert_parallel": True,
    }
    even, skew = plan(**flags), plan(**flags, moe_imbalance=1.5)
    assert skew.decode.batch_1.moe_ms > even.decode.batch_1.moe_ms
    assert skew.decode.batch_1.all_to_all_ms > even.decode.batch_1.all_to_all_ms
    assert any("assumed perfectly balanced, the default (--moe-imbalance)" in a for a in even.assumptions)
    assert any("carries 1.5 x the mean" in a for a in skew.assumptions)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"moe_imbalance": 1.2}, "--moe-imbalance needs expert parallelism"),
        ({"moe_imbalance": 0.5, "enable_expert_parallel": True}, "--moe-imbalance must be between 1"),
        (
            {"moe_imbalance": float("nan"), "enable_expert_parallel": True},
            "--moe-imbalance must be between 1",
        ),
    ],
)
def test_moe_imbalance_refusals(flags, message):
    with pytest.raises(UsageError, match=message):
        plan(**flags)


def test_sglang_dp_attention_runs_each_rank_on_its_own_requests():
    base = {"engine": "sglang"}
    dp = plan(**base, enable_dp_attention=True, data_parallel_size=8)
    full = dp.decode.at_max_concurrency
    # the step is the replica's: every rank's requests; attention runs one rank's share
    assert full.batch == dp.max_concurrency_per_replica
    assert full.attention_batch == math.ceil(full.batch / 8)
    assert dp.decode.batch_1.attention_batch == 1
    # attention weights sliced over attention TP 1: each GPU streams all of them (8x the TP-8 slice)
    plain = plan(**base).decode.batch_1
    assert dp.decode.batch_1.weights_ms > plain.weights_ms
    att = [g for g in dp.decode.inputs.stages[0].gemms if g.per_rank]
    assert att and all(g.per_rank for g in att)
    assert any("DP attention: each of the 8 attention-DP ranks runs batch / 8" in a for a in dp.assumptions)
    # with DeepEP the MoE layers dispatch all-to-all within the node
    deepep = plan(**base, enable_dp_attention=True, data_parallel_size=8, moe_a2a_backend="deepep")
    one = deepep.decode.batch_1
    assert one.all_to_all_ms > 0 and "NVLink" in one.sources["all_to_all"]
    assert one.communication_ms < dp.decode.batch_1.communication_ms
    # --ep-size without an all-to-all backend keeps the all-reduce
    ep_only = plan(**base, ep_size=8)
    assert ep_only.decode.batch_1.all_to_all_ms == 0
    assert any("without an all-to-all --moe-a2a-backend" in a for a in ep_only.assumptions)
