"""Golden cases built by hand from the engines' rules (README, How the engines size their KV cache).

Each expected figure is worked out in the comment beside it from the rule, not read back
from kvplan: page bytes per layer, blocks, tokens, concurrency, log lines.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from helpers import REPO, plan, run_cli
from kvplan.engines.sglang import memory_settings as sglang_memory_settings
from kvplan.errors import UsageError
from kvplan.plan.plan import PlanRequest, estimate
from kvplan.specs.registry import load_gpu, load_model
from kvplan.units import GiB

HF = REPO / "tests" / "fixtures" / "hf" / "synthetic"  # trimmed configs (README there)


def lines(p) -> list[str]:
    return p.engine.log_lines


# --- vLLM -----------------------------------------------------------------------------------


def test_vllm_dense_gqa():
    # Llama-3-8B: 32 layers, 8 KV heads x 128, bf16; page = 16 x 8 x (128 + 128) x 2 = 65,536 B
    # block = 32 layers x 65,536 = 2 MiB; 40 GiB / 2 MiB = 20,480 blocks; x 16 = 327,680 tokens
    # 8,192 tokens = 512 blocks -> 20,480 / 512 = 40.00x
    p = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192, kv_cache_memory_bytes=40 * GiB)
    assert p.engine_num_blocks == 20480
    assert p.engine_kv_cache_tokens == 327680
    assert p.engine_max_concurrency == pytest.approx(40.0)
    assert lines(p) == [
        "Available KV cache memory: 40.00 GiB",
        "GPU KV cache size: 327,680 tokens, Maximum concurrency for 8,192 tokens per request: 40.00x",
    ]
    # kvplan's whole requests keep vLLM's null block aside: (20,480 - 1) // 512 = 39
    assert p.max_concurrency == 39
    assert p.engine.differences == [
        "vLLM's printed concurrency does not subtract the null block; kvplan's does"
    ]


def test_vllm_mha():
    # Llama-2-7B: 32 layers, 32 KV heads x 128; page = 16 x 32 x 256 x 2 = 262,144 B; block 8 MiB
    # 30 GiB / 8 MiB = 3,840 blocks = 61,440 tokens; 4,096 tokens = 256 blocks -> 15.00x
    p = plan("llama2-7b", "H100", num_gpus=1, max_model_len=4096, kv_cache_memory_bytes=30 * GiB)
    assert (p.engine_num_blocks, p.engine_kv_cache_tokens) == (3840, 61440)
    assert p.engine_max_concurrency == pytest.approx(15.0)


def test_vllm_mla_tp8_replicates_the_latent_and_uses_flashmla_blocks():
    # DeepSeek-V3 on 8xH200: FlashMLA (Hopper) block size 64; the 576-wide latent is on every rank
    # page = 64 x 576 x 2 = 73,728 B; block = 61 layers x 73,728 = 4,497,408 B
    # 50 GiB = 53,687,091,200 B // 4,497,408 = 11,937 blocks = 763,968 tokens
    # 32,768 tokens = 512 blocks -> 11,937 / 512 = 23.31x
    p = plan("deepseek-v3", "H200", num_gpus=8, max_model_len=32768, kv_cache_memory_bytes=50 * GiB)
    assert p.settings.block_size == 64
    assert p.kv_bytes_per_token_per_gpu == 70272  # 61 x 576 x 2: not divided by TP
    assert p.engine.details.block_bytes_per_stage == [4497408]
    assert (p.engine_num_blocks, p.engine_kv_cache_tokens) == (11937, 763968)
    assert lines(p)[-1].endswith("Maximum concurrency for 32,768 tokens per request: 23.31x")
    # Blackwell's CUTLASS MLA needs 128; an Ampere card keeps 16
    assert plan("deepseek-v3", "B200", num_gpus=8, max_model_len=32768).settings.block_size == 128


def test_vllm_fp8_is_one_byte_with_no_in_block_scales():
    # Llama-3-70B TP 8: 1 KV head per rank; fp8 page = 16 x 1 x 256 x 1 = 4,096 B; block = 80 x 4,096
    # 50 GiB / 327,680 B = 163,840 blocks = 2,621,440 tokens; 8,192 tokens = 512 blocks -> 320.00x
    p = plan(
        "llama3-70b",
        "H100",
        num_gpus=8,
        max_model_len=8192,
        kv_cache_dtype="fp8",
        kv_cache_memory_bytes=50 * GiB,
    )
    assert (p.engine_num_blocks, p.engine_kv_cache_tokens) == (163840, 2621440)
    assert p.engine_max_concurrency == pytest.approx(320.0)


def test_vllm_tp_above_kv_heads_replicates_heads():
    # Llama-3-8B at TP 16: max(1, 8 // 16) = 1 KV head per rank; page = 16 x 1 x 256 x 2 = 8,192 B
    # block = 32 x 8,192 = 256 KiB; 10 GiB / 256 KiB = 40,960 blocks = 655,360 tokens
    p = plan(
        "llama3-8b",
        "H100",
        num_gpus=16,
        nodes=2,
        tp=16,
        pp=1,
        max_model_len=8192,
        kv_cache_memory_bytes=10 * GiB,
    )
    assert p.engine.details.block_bytes_per_stage == [262144]
    assert (p.engine_num_blocks, p.engine_kv_cache_tokens) == (40960, 655360)


def test_vllm_pipeline_stages_hold_their_own_layers_and_the_minimum_wins():
    # Llama-3-70B TP 8 x PP 2: 40 layers per stage; block = 40 x 8,192 = 327,680 B
    # 50 GiB / 327,680 = 163,840 blocks on each stage
    p = plan(
        "llama3-70b",
        "H100",
        num_gpus=16,
        nodes=2,
        tp=8,
        pp=2,
        max_model_len=8192,
        kv_cache_memory_bytes=50 * GiB,
    )
    assert p.engine.details.block_bytes_per_stage == [327680, 327680]
    assert p.engine_num_blocks == 163840
    # computed budgets differ per stage when the stages' weights differ: the engine takes the minimum
    q = plan("llama3-8b", "H100", num_gpus=2, tp=1, pp=2, max_model_len=8192)
    per_stage = q.engine.details.num_blocks_per_stage
    budgets = [s.kv_budget_bytes_per_gpu for s in q.stages]
    assert per_stage == [b // (16 * 16 * 8 * 256 * 2) for b in budgets]
    assert q.engine_num_blocks == min(per_stage)


def test_vllm_hybrid_sliding_window_groups_and_admission_charge():
    # gpt-oss-20b: 12 sliding(128) + 12 full layers, 8 KV heads x 64: page = 16 x 8 x 128 x 2 = 32,768 B
    # two groups of 12 -> block = 12 x 32,768 = 393,216 B; 30 GiB / 393,216 = 81,920 blocks
    # tokens = 81,920 // 2 groups x 16 = 655,360
    # per request at 32K: sliding ceil(min(127 + 8,192, 32,768) / 16) + 1 = 521, full 2,048 -> 2,569
    # 81,920 / 2,569 = 31.89x
    p = plan("gpt-oss-20b", "H100", num_gpus=1, max_model_len=32768, kv_cache_memory_bytes=30 * GiB)
    groups = p.engine.details.groups
    assert [(g.kind, g.num_layers) for g in groups] == [("sliding(128)", 12), ("full", 12)]
    assert [g.blocks_per_request for g in groups] == [521, 2048]
    assert (p.engine_num_blocks, p.engine_kv_cache_tokens) == (81920, 655360)
    assert lines(p)[-1].endswith("Maximum concurrency for 32,768 tokens per request: 31.89x")
    # kvplan counts what a full-length request holds (ceil(127/16) + 1 = 9 sliding blocks)
    assert p.engine.details.held_blocks_per_request == 2048 + 9
    assert any("admission" in d for d in p.engine.differences)
    # a smaller --max-num-batched-tokens lowers the sliding charge: ceil((127 + 2,048) / 16) + 1 = 137
    q = plan(
        "gpt-oss-20b",
        "H100",
        num_gpus=1,
        max_model_len=32768,
        kv_cache_memory_bytes=30 * GiB,
        max_num_batched_tokens=2048,
    )
    assert q.engine.details.blocks_per_request == 2048 + 137
    # gpt-oss-120b: 18 + 18
    big = plan("gpt-oss-120b", "H200", num_gpus=1, max_model_len=32768)
    assert [g.num_layers for g in big.engine.details.groups] == [18, 18]


def test_vllm_disable_hybrid_manager_treats_windows_as_full():
    # one group of 24 full layers: block = 24 x 32,768 = 786,432; 30 GiB -> 40,960 blocks; 2,048 per request
    p = plan(
        "gpt-oss-20b",
        "H100",
        num_gpus=1,
        max_model_len=32768,
        kv_cache_memory_bytes=30 * GiB,
        disable_hybrid_kv_cache_manager=True,
    )
    assert (p.engine_num_blocks, p.engine_kv_cache_tokens) == (40960, 655360)
    assert p.engine_max_concurrency == pytest.approx(20.0)


def test_vllm_padding_layers_when_group_sizes_differ():
    # Gemma-3-27B: 52 sliding + 10 full; 52 >= 1.5 x 10 so groups hold 10 layers: 6 sliding groups
    # (60 slots, 8 padding layers: 8 / 52 = 15.38%) + 1 full group
    p = plan("gemma3-27b", "H100", num_gpus=1, max_model_len=32768)
    groups = p.engine.details.groups
    assert len(groups) == 7 and all(g.slots == 10 for g in groups)
    assert sorted(g.num_layers for g in groups) == [8, 8, 9, 9, 9, 9, 10]
    assert lines(p)[0] == "Add 8 padding layers, may waste at most 15.38% KV cache memory"
    # block = 10 slots x page (16 x 16 heads x 256 x 2 = 131,072 B); tokens = blocks // 7 x 16
    assert p.engine.details.block_bytes_per_stage == [10 * 131072]
    assert p.engine_kv_cache_tokens == p.engine_num_blocks // 7 * 16


def test_vllm_block_size_64():
    # block = 32 x (64 x 8 x 256 x 2) = 8 MiB; 40 GiB -> 5,120 blocks = 327,680 tokens
    # 8,200 tokens need ceil(8,200 / 64) = 129 blocks -> 39.69x (block 16: 513 blocks -> 39.92x)
    p = plan(
        "llama3.1-8b", "H100", num_gpus=1, max_model_len=8200, block_size=64, kv_cache_memory_bytes=40 * GiB
    )
    assert (p.engine_num_blocks, p.engine_kv_cache_tokens) == (5120, 327680)
    assert lines(p)[-1].endswith("Maximum concurrency for 8,200 tokens per request: 39.69x")
    q = plan("llama3.1-8b", "H100", num_gpus=1, max_model_len=8200, kv_cache_memory_bytes=40 * GiB)
    assert lines(q)[-1].endswith("39.92x")


def test_vllm_num_gpu_blocks_override():
    # 10,000 blocks of 2 MiB: 160,000 tokens; 10,000 / 512 = 19.53x; 19.53 GiB of KV
    p = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192, num_gpu_blocks_override=10000)
    assert (p.engine_num_blocks, p.engine_kv_cache_tokens) == (10000, 160000)
    assert p.kv_budget_source == "--num-gpu-blocks-override"
    assert p.num_blocks_per_gpu == 10000
    assert lines(p)[0] == "Available KV cache memory: 19.53 GiB"
    assert p.max_concurrency == (10000 - 1) // 512


def test_vllm_release_conventions():
    # 0.21-0.25 printed int(C x L): 20,480 / 513 x 8,200 = 327,360; before 0.33, two lines
    p = plan(
        "llama3.1-8b",
        "H100",
        num_gpus=1,
        max_model_len=8200,
        kv_cache_memory_bytes=40 * GiB,
        engine_version="0.22",
    )
    assert p.engine_kv_cache_tokens == int(20480 / 513 * 8200) == 327360
    assert lines(p)[1:] == [
        "GPU KV cache size: 327,360 tokens",
        "Maximum concurrency for 8,200 tokens per request: 39.92x",
    ]
    # CUDA graphs enter the estimated reserve from 0.20 on (the 0.20.0 wheel's vllm/envs.py defaults
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS to 1), in 0.18-0.19 only when set, never with --enforce-eager
    assert plan("llama3-8b", num_gpus=1, engine_version="0.19").reserve.cuda_graph_bytes == 0
    env = (("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1"),)
    assert plan("llama3-8b", num_gpus=1, engine_version="0.19", env=env).reserve.cuda_graph_bytes > 0
    assert plan("llama3-8b", num_gpus=1, engine_version="0.17", env=env).reserve.cuda_graph_bytes == 0
    assert plan("llama3-8b", num_gpus=1, engine_version="0.20").reserve.cuda_graph_bytes > 0
    assert plan("llama3-8b", num_gpus=1, enforce_eager=True).reserve.cuda_graph_bytes == 0


def test_hf_config_models_get_the_same_engine_numbers():
    for name, fixture, kw in [
        ("llama3-70b", "llama3-70b.json", {"num_gpus": 8, "max_model_len": 8192}),
        ("gpt-oss-20b", "gpt-oss-20b.json", {"num_gpus": 1, "max_model_len": 32768}),
        ("deepseek-v3", "deepseek-v3.json", {"num_gpus": 8, "max_model_len": 32768}),
    ]:
        gpu = "H200" if name == "deepseek-v3" else "H100"
        shipped = plan(name, gpu, kv_cache_memory_bytes=40 * GiB, **kw)
        from_hf = plan(str(HF / fixture), gpu, kv_cache_memory_bytes=40 * GiB, **kw)
        assert from_hf.engine.log_lines == shipped.engine.log_lines, name
        assert from_hf.engine.details.groups == shipped.engine.details.groups, name


def test_int4_kv_has_no_engine_figures_but_kvplan_still_plans():
    p = plan("llama3-8b", num_gpus=1, max_model_len=8192, kv_cache_dtype="int4")
    assert p.engine.supported is False and "int4" in p.engine.reason
    assert p.engine_kv_cache_tokens is None and p.max_concurrency > 0


# --- SGLang ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "tp", "expected"),
    [
        # H100 81,089 MiB, TP 1: reserve 512 + 8,192 x 1.5 + 256 x 2 + 1/8 x 1,024 = 13,440 MiB -> 0.834
        ("H100", 1, 0.834),
        # TP 8: 512 + 12,288 + 512 x 2 + 1,024 = 14,848 MiB -> (81,089 - 14,848) / 81,089 = 0.817
        ("H100", 8, 0.817),
        # H200 143,156 MiB, TP 8: 14,848 MiB -> 0.896
        ("H200", 8, 0.896),
    ],
)
def test_sglang_default_mem_fraction_static(gpu, tp, expected):
    mem = sglang_memory_settings(load_gpu(gpu).memory_bytes, tp, 1)
    assert mem.mem_fraction_static == expected
    p = plan("llama3-8b", gpu, num_gpus=tp, tp=tp, max_model_len=8192, engine="sglang")
    assert p.settings.mem_fraction_static == expected


def test_sglang_budget_cell_size_and_log_line():
    # available = (memory - in use at startup) x mem_fraction_static - weights
    p = plan(
        "llama3-8b",
        "H100",
        num_gpus=1,
        max_model_len=8192,
        engine="sglang",
        mem_fraction_static=0.8,
        reserve_bytes=1 * GiB,
    )
    mem = load_gpu("H100").memory_bytes
    available = int((mem - GiB) * 0.8) - p.weight_bytes_per_gpu
    assert p.kv_budget_bytes_per_gpu == available
    cell = 8 * 128 * 32 * 2 * 2  # heads x head_dim x layers x (K, V) x bytes = 131,072
    tokens = available // cell
    assert p.engine_kv_cache_tokens == tokens
    k_gb = (tokens + 1) * 8 * 128 * 32 * 2 / GiB  # SGLang allocates size + page_size slots
    assert lines(p) == [
        f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, K size: {k_gb:.2f} GB, V size: {k_gb:.2f} GB"
    ]
    assert p.kv_pool_tokens == tokens  # page size 1: kvplan's pool is SGLang's pool


def test_sglang_page_floor_and_mla():
    # 40 GiB + 100 KiB over a 131,072 B cell = 327,680 tokens (+0.78), a multiple of 64 already
    p = plan(
        "llama3-8b",
        "H100",
        num_gpus=1,
        max_model_len=8192,
        engine="sglang",
        kv_cache_memory_bytes=40 * GiB + 100 * 1024,
        block_size=64,
    )
    assert p.engine_kv_cache_tokens == 327680
    # 327,679 slots' worth of memory floors to 327,616 at page size 64
    q = plan(
        "llama3-8b",
        "H100",
        num_gpus=1,
        max_model_len=8192,
        engine="sglang",
        kv_cache_memory_bytes=327679 * 131072,
        block_size=64,
    )
    assert q.engine_kv_cache_tokens == 327616
    # MLA cell = (512 + 64) x 61 layers x 2 B = 70,272 B, not split by TP; 50 GiB // 70,272 = 763,989
    m = plan(
        "deepseek-v3",
        "H200",
        num_gpus=8,
        max_model_len=32768,
        engine="sglang",
        kv_cache_memory_bytes=50 * GiB,
    )
    assert m.engine_kv_cache_tokens == 50 * GiB // 70272 == 763989
    kv_gb = (763989 + 1) * 576 * 61 * 2 / GiB
    assert lines(m) == [
        f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: 763989, KV size: {kv_gb:.2f} GB"
    ]


def test_sglang_swa_pool_ratio(tmp_path):
    # a gpt-oss-20b-shaped model whose architecture SGLang pools hybridly (gpt-oss itself is exempt)
    data = yaml.safe_load((REPO / "model_specs" / "models" / "gpt-oss-20b.yaml").read_text())
    data.update(name="swa-test", architecture="MiMoForCausalLM", hf_id=None)
    path = tmp_path / "swa.yaml"
    path.write_text(yaml.safe_dump(data))
    # cell = 24 layers x 8 x 128 x 2 = 49,152 B; 30 GiB -> 655,360 tokens per layer; x 24 = 15,728,640
    # full = int(15,728,640 / (0.8 x 12 + 12)) = 728,177; swa = int(728,177 x 0.8) = 582,541
    p = plan(
        str(path), "H100", num_gpus=1, max_model_len=32768, engine="sglang", kv_cache_memory_bytes=30 * GiB
    )
    assert p.engine.details.hybrid_swa is True
    assert p.engine_kv_cache_tokens == 728177
    assert p.engine.details.swa_kv_cache_tokens == 582541
    assert lines(p)[0] == "Use sliding window memory pool. full_layer_tokens=728177, swa_layer_tokens=582541"
    # gpt-oss: SGLang disables the hybrid pool, one pool of 655,360 tokens
    g = plan(
        "gpt-oss-20b",
        "H100",
        num_gpus=1,
        max_model_len=32768,
        engine="sglang",
        kv_cache_memory_bytes=30 * GiB,
    )
    assert g.engine.details.hybrid_swa is False and g.engine_kv_cache_tokens == 655360


def test_engine_flags_belong_to_their_engine():
    with pytest.raises(UsageError, match="--mem-fraction-static is a sglang flag"):
        plan("llama3-8b", num_gpus=1, mem_fraction_static=0.8)
    with pytest.raises(UsageError, match="--gpu-memory-utilization is a vllm flag"):
        plan("llama3-8b", num_gpus=1, engine="sglang", gpu_memory_utilization=0.9)
    with pytest.raises(UsageError, match="--engine must be one of"):
        estimate(PlanRequest(model=load_model("llama3-8b"), gpu=load_gpu("H100"), engine="trtllm"))
    with pytest.raises(UsageError, match="not both"):
        plan("llama3-8b", num_gpus=1, num_gpu_blocks_override=100, kv_cache_memory_bytes=GiB)


def test_cli_prints_engine_lines_and_json_keys():
    r = run_cli(
        "estimate", "-m", "llama3-8b", "-g", "1xH100", "--max-model-len", "8K", "--kv-cache-memory", "40GiB"
    )
    assert r.exit_code == 0
    assert (
        "GPU KV cache size: 327,680 tokens, Maximum concurrency for 8,192 tokens per request: 40.00x"
        in r.stdout
    )
    j = run_cli(
        "estimate",
        "-m",
        "llama3-8b",
        "-g",
        "1xH100",
        "--context",
        "8K",
        "--engine",
        "sglang",
        "--kv-cache-memory",
        "40GiB",
        "--json",
    ).json()
    assert (j["engine_kv_cache_tokens"], j["engine_num_blocks"]) == (327680, 327680)
    assert j["engine_max_concurrency"] == pytest.approx(40.0)
    bad = run_cli("estimate", "-m", "llama3-8b", "--engine", "sglang", "--gpu-memory-utilization", "0.9")
    assert bad.exit_code == 2 and "vllm flag" in bad.stderr


# --- kvplan's non-KV estimate against real, published vLLM logs --------------------------


@pytest.mark.parametrize(
    ("model", "gpu", "kw", "logged_gib", "source"),
    [
        # vLLM PR 10511 sanity check (v0.6.5, `vllm serve meta-llama/Meta-Llama-3-8B`):
        # available_kv_cache_memory 53.29GiB (weights 14.96, non-torch 1.79, activations 1.26)
        ("llama3-8b", "H100", {"num_gpus": 1, "engine_version": "0.6"}, 53.29, "vllm PR 10511, TP 1"),
        # same post, -tp 2: 71.29 - 7.48 weights - 3.58 non-torch - 1.26 activations = 58.97 GiB
        ("llama3-8b", "H100", {"num_gpus": 2, "engine_version": "0.6"}, 58.97, "vllm PR 10511, TP 2"),
        # myoceane.fr gpt-oss-20b on A100 80GB, vLLM 0.19.0, --gpu-memory-utilization 0.65,
        # --max-model-len 131072: "Available KV cache memory: 36.56 GiB"
        (
            "gpt-oss-20b",
            "A100-80GB",
            {
                "num_gpus": 1,
                "engine_version": "0.19",
                "gpu_memory_utilization": 0.65,
                "max_model_len": 131072,
            },
            36.56,
            "myoceane.fr, A100",
        ),
    ],
)
def test_estimated_kv_memory_lands_within_two_percent_of_real_logs(model, gpu, kw, logged_gib, source):
    p = plan(model, gpu, **kw)
    assert p.reserve.estimated
    # the A100 log: 2,048 batched tokens (vLLM's A100 default), Marlin-padded MXFP4 experts and the
    # Triton sampler of 0.17+ (14 B a logit): kvplan 37.04 GiB, +1.3%
    rel = 0.02
    assert p.kv_budget_bytes_per_gpu / GiB == pytest.approx(logged_gib, rel=rel), source


def test_engines_that_keep_every_token_of_windowed_layers_cost_them_in_full():
    # SGLang has no windowed pool for Gemma 2: every layer holds all 8,192 tokens of a request
    g = plan(
        "gemma2-27b", "H100", num_gpus=1, max_model_len=8192, engine="sglang", kv_cache_memory_bytes=20 * GiB
    )
    assert g.max_concurrency == g.engine_kv_cache_tokens // 8192
    assert any("keeps every token" in a for a in g.assumptions)
    # vLLM's hybrid manager drops out-of-window blocks, so kvplan counts only the window there...
    v = plan("gemma2-27b", "H100", num_gpus=1, max_model_len=8192, kv_cache_memory_bytes=20 * GiB)
    # ...and with the manager disabled, whole requests = (blocks - 1 null) // 512 blocks per request
    d = plan(
        "gemma2-27b",
        "H100",
        num_gpus=1,
        max_model_len=8192,
        kv_cache_memory_bytes=20 * GiB,
        disable_hybrid_kv_cache_manager=True,
    )
    assert d.max_concurrency == (d.engine_num_blocks - 1) // 512 < v.max_concurrency


def test_sglang_against_a_published_log():
    # vLLM issue 21348: Qwen3-235B-A22B-FP8 on 4xH100, SGLang --tp 4 --mem-fraction-static 0.93 logged
    # "KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB"
    p = plan(
        "qwen3-235b-a22b",
        "H100",
        num_gpus=4,
        max_model_len=40960,
        engine="sglang",
        mem_fraction_static=0.93,
        weight_dtype="fp8",
    )
    # kvplan: 388,753 (+5.8%). Its startup memory (1.05 GiB at TP 4 on H100) is measured directly in the
    # real logs ("Load weight begin. avail mem"); this log prints none, so the 1 GiB it implies beyond that
    # (FP8 scales in the weights, or NCCL) cannot be told apart
    assert p.engine_kv_cache_tokens == pytest.approx(367404, rel=0.06)
    # the K-size arithmetic, exactly: (367,404 + 1 padding slot) x 1 KV head per rank x 128 x 94 layers x 2 B
    exact = plan(
        "qwen3-235b-a22b",
        "H100",
        num_gpus=4,
        max_model_len=40960,
        engine="sglang",
        kv_cache_memory_bytes=367404 * 94 * 256 * 2,
        weight_dtype="fp8",
    )
    assert exact.engine_kv_cache_tokens == 367404
    assert lines(exact) == [
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB"
    ]


QWQ_LOG = Path(__file__).parent / "fixtures" / "logs" / "real" / "sglang_0.4.3.post4_qwq-32b_l4_tp4.log"


@pytest.mark.parametrize(
    ("release", "gpu_mib", "tp", "fraction"),
    [
        # server_args.py 0.4.0-0.4.6.post1: by TP size
        ((0, 4, 3, 4), 23034, 1, 0.88),
        ((0, 4, 3, 4), 23034, 2, 0.87),
        ((0, 4, 3, 4), 23034, 4, 0.85),
        ((0, 4, 3, 4), 81559, 8, 0.81),
        ((0, 4, 0, 0), 81559, 16, 0.79),
        # 0.4.6: over 81,920 MiB (H200 143,771 MiB): (143,771 - 13,312) / 143,771
        ((0, 4, 6, 0), 143771, 8, (143771 - 13312) / 143771),
        # 0.4.6.post2-0.4.7: over 96 GiB: min(0.88 + 48 GiB x 0.12 / card, (card - 18 GiB) / card) = 0.9210...
        ((0, 4, 6, 2), 143771, 1, min(0.88 + 49152 * 0.12 / 143771, (143771 - 18432) / 143771)),
        ((0, 4, 7, 0), 183359, 8, 0.79),  # B200: over 180,000 MiB
        # 0.4.7.post1-0.5.2: H100 TP 8 reserves (9.5 + 8 / 2) GiB: round((81,559 - 13,824) / 81,559, 3)
        ((0, 5, 2, -1), 81559, 8, 0.831),  # the Grok-2 log (0.5.2rc2) prints mem_fraction_static=0.831
        ((0, 4, 7, 1), 23034, 4, round((23034 - (2.8 + 0.4) * 1024) / 23034, 3)),
    ],
)
def test_sglang_default_fraction_by_release(release, gpu_mib, tp, fraction):
    from kvplan.engines.sglang_memory import legacy_fraction

    assert legacy_fraction(release, gpu_mib, tp, 1)[0] == pytest.approx(fraction)


def test_sglang_release_parsing():
    from kvplan.engines.sglang_memory import parse_release

    assert parse_release("0.4.3.post4") == (0, 4, 3, 4)
    assert parse_release("v0.5.2rc2") == (0, 5, 2, -1)
    assert parse_release("0.4") == (0, 4, 0, 0)
    assert parse_release(None) is None and parse_release("latest") is None


def test_sglang_reproduces_the_qwq_l4_log():
    # sglang_0.4.3.post4_qwq-32b_l4_tp4.log: mem_fraction_static=0.85 (SGLang's TP-4 default),
    # "Load weight begin. avail mem=21.63 GB", "Load weight end ... avail mem=6.09 GB, mem usage=15.54 GB",
    # "KV Cache is allocated. #tokens: 46611, K size: 1.42 GB, V size: 1.42 GB"
    # SGLang: rest = 6.09 - 21.63 x (1 - 0.85) = 2.8455 GiB; / (2 KV heads x 128 x 2 x 64 layers x 2 B = 65,536 B)
    # = 46,620 tokens (the logged 46,611, the GB figures being rounded)
    assert int((6.09 - 21.63 * (1 - 0.85)) * GiB // 65536) == pytest.approx(46611, abs=20)
    text = QWQ_LOG.read_text()
    assert "mem_fraction_static=0.85" in text and "#tokens: 46611" in text
    p = plan(
        str(Path(__file__).parent / "fixtures" / "hf" / "corpus" / "qwen2.5-32b-instruct.json"),
        "L4",
        num_gpus=4,
        engine="sglang",
        engine_version="0.4.3.post4",
    )
    assert p.settings.engine_defaults.mem_fraction_static == 0.85
    assert "0.4.0-0.4.6.post1" in (p.settings.engine_defaults.mem_fraction_static_source or "")
    assert p.settings.engine_defaults.cuda_graph_max_bs == 80  # the log's cuda_graph_max_bs=80
    # startup: 22.03 GiB (L4) - 21.63 free = 0.40 GiB = CUDA context 0.35 + NCCL 0.05
    assert p.reserve_bytes_per_gpu == pytest.approx(22.03 * GiB - 21.63 * GiB, abs=0.01 * GiB)
    # kvplan: (22.03 - 0.40) x 0.85 - 15.26 GiB weights - 0.2 GiB load = 2.93 GiB, 48,044 tokens (+3.1%);
    # the load took 15.54 GiB against 15.26 GiB of parameters
    assert p.engine_kv_cache_tokens == pytest.approx(46611, rel=0.04)
    # before this rule (0.5.3's default 0.811 and 2.25 GiB at startup): 0.79 GiB (-72%)


def test_vllm_rocm_mi300x_log_follows_cuda_block_rules(tmp_path):
    # The one public ROCm startup log found (vllm_0.23.0_gemma-3-4b-it_mi300x_tp1.log: vLLM 0.23.0 on an
    # MI300X, ROCM_ATTN backend): CUDA's block rules reproduce it, so nothing AMD-specific is modelled here.
    # Gemma-3-4B's text dims (google/gemma-3-4b-it config.json; its file is not in the index, so they are
    # written over the corpus Gemma-3-27B config): 34 layers, every 6th full, 4 KV heads x 256, window 1024.
    import json

    cfg = json.loads((REPO / "tests" / "fixtures" / "hf" / "corpus" / "gemma-3-27b-it.json").read_text())
    cfg["text_config"].update(
        hidden_size=2560,
        intermediate_size=10240,
        num_hidden_layers=34,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=256,
        query_pre_attn_scalar=256,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)],
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    # page = 16 x 4 x (256 + 256) x 2 = 65,536 B; 29 sliding + 1 padding layer + 5 full = 7 groups of 5
    # ("Add 1 padding layers, may waste at most 3.45%" = 1/29); blocks per request at 8,192: full 512,
    # sliding ceil(min(1023 + 8192, 8192) / 16) + 1 = 513 each -> 512 + 6 x 513 = 3,590
    # 533,588 blocks x 5 x 65,536 B = 162.84 GiB as logged; 533,588 / 3,590 = 148.63x; int(C x 8,192) = 1,217,591
    p = plan(
        str(tmp_path),
        "MI300X",
        num_gpus=1,
        max_model_len=8192,
        engine_version="0.23",
        kv_cache_memory_bytes=533588 * 5 * 65536,
    )
    assert lines(p) == [
        "Add 1 padding layers, may waste at most 3.45% KV cache memory",
        "Available KV cache memory: 162.84 GiB",
        "GPU KV cache size: 1,217,591 tokens",
        "Maximum concurrency for 8,192 tokens per request: 148.63x",
    ]
    log = (
        REPO / "tests" / "fixtures" / "logs" / "real" / "vllm_0.23.0_gemma-3-4b-it_mi300x_tp1.log"
    ).read_text()
    assert all(line in log for line in lines(p))
    assert {g.block_size for g in p.engine.details.groups} == {16}
