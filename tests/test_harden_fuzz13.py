"""Session 13 hardening: architectures an engine release no longer loads, and the parts of a model kvplan
left out (each test failing on the code before)."""

from __future__ import annotations

import json

import pytest

from kvplan.model.params import param_breakdown
from kvplan.specs.matrices import vision_matrices
from kvplan.specs.registry import load_model
from tests.helpers import REPO, draft_for, run_cli

CORPUS = REPO / "tests" / "fixtures" / "hf" / "corpus"
MLLAMA_11B = str(CORPUS / "llama-3.2-11b-vision.json")
MLLAMA_90B = str(CORPUS / "llama-3.2-90b-vision-instruct.json")


@pytest.mark.parametrize(
    ("version", "refused"), [("0.10", False), ("0.10.2", False), ("0.11", True), (None, True)]
)
def test_vllm_refuses_an_architecture_its_release_no_longer_loads(version, refused):
    # vllm/model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS: "MllamaForConditionalGeneration":
    # "0.10.2" ("supported in vLLM until v0.10.2"); kvplan planned it for vLLM 0.33 as if it loaded
    args = ["estimate", "-m", MLLAMA_11B, "-g", "1xH100", "--max-model-len", "8K"]
    r = run_cli(*args, *(["--engine-version", version] if version else []), "--json")
    if not refused:
        assert r.exit_code == 0
        return
    assert r.exit_code == 2 and r.stdout.strip().startswith("{")
    msg = json.loads(r.stdout)["error"]
    assert (
        "MllamaForConditionalGeneration" in msg and "until v0.10.2" in msg and "--engine-version 0.10" in msg
    )
    # solve and simulate refuse it alike; SGLang (srt/models/mllama.py) still plans it
    for cmd in (["solve", "-m", MLLAMA_11B, "--users", "4", "--max-model-len", "8K"],
                ["simulate", "-m", MLLAMA_11B, "-g", "1xH100", "--max-model-len", "8K", "--num-prompts", "2",
                 "--input-len", "100", "--output-len", "4"]):  # fmt: skip
        bad = run_cli(*cmd)
        assert bad.exit_code == 2 and "until v0.10.2" in bad.stderr and "Traceback" not in bad.stderr
    assert run_cli(*args, "--engine", "sglang", "--json").exit_code == 0


def test_llama_vision_counts_its_vision_tower_and_projector():
    # P5: the Mllama vision encoder and projector were left out (the 11B came out at 9.78B, no note).
    # From vision_config (transformers modeling_mllama.py MllamaVisionModel): hidden 1280, MLP 5120, 32 + 8
    # layers, patch 14, image 560 -> 1,601 positions with the class token, 4 tiles, 8 aspect ratios.
    h, inter, layers, pos = 1280, 5120, 40, 1601
    per_layer = (
        4 * h * h + (h * inter + inter) + (inter * h + h) + 2 * 2 * h
    )  # q/k/v/o, fc1, fc2, 2 LayerNorms
    embeds = (
        3 * 14 * 14 * h + h + pos * h + 9 * 4 * pos * h + 2 * (9 * 4 * h)
    )  # conv, class, pos, tile, pre/post
    gates = 3 + 2 * 8  # position, pre- and post-tile gates; two a global layer
    encoder = layers * per_layer + embeds + gates + 2 * 2 * h  # + layernorm_pre / _post
    assert encoder == 863_567_379
    for path, text_hidden in ((MLLAMA_11B, 4096), (MLLAMA_90B, 8192)):
        spec = load_model(path)
        vision = sum(m.params for m in vision_matrices(spec.vision_tower))
        assert vision == encoder + 7680 * text_hidden + text_hidden  # + multi_modal_projector with its bias
        b = param_breakdown(spec)
        assert b.active == b.total - vision  # the tower runs per image, not per generated token
    total = param_breakdown(load_model(MLLAMA_11B)).total
    assert total == 10_670_186_003  # Meta's model card: 10.6B; it was 9,775,157,248
    # vLLM 0.6's log for this model on one GPU: "Loading model weights took 19.9073 GB" (GiB; vllm-project/vllm
    # issue #8879); kvplan's bf16 weights are within 0.3% (they were 18.21 GiB, -8.5%)
    d = run_cli("estimate", "-m", MLLAMA_11B, "-g", "1xH100", "--max-model-len", "8K", "--engine-version", "0.10",
                "--json").json()  # fmt: skip
    weights = d["weight_bytes_per_gpu"] / 2**30
    assert abs(weights / 19.9073 - 1) < 0.003


def _edited(tmp_path, name: str, edit) -> str:
    cfg = json.loads((CORPUS / name).read_text())
    edit(cfg)
    out = tmp_path / name
    out.write_text(json.dumps(cfg))
    return str(out)


def test_lfm2_full_attn_idxs_builds_the_layer_types(tmp_path):
    # R5: Lfm2Config builds layer_types from full_attn_idxs when they are absent (configuration_lfm2.py);
    # kvplan made all 16 layers attention (32,768 B of KV a token instead of 12,288, the conv states dropped)
    def edit(cfg):
        t = cfg["text_config"]
        attn = [i for i, k in enumerate(t.pop("layer_types")) if k == "full_attention"]
        t["full_attn_idxs"] = attn

    fixture = load_model(str(CORPUS / "lfm2.5-vl-1.6b.json"))
    edited = load_model(_edited(tmp_path, "lfm2.5-vl-1.6b.json", edit))
    assert edited.layers == fixture.layers
    assert sum(1 for x in edited.layers if type(x).__name__ == "RecurrentState") == 10
    assert param_breakdown(edited) == param_breakdown(fixture)


def test_llama4_without_intermediate_size_mlp_takes_the_config_default(tmp_path):
    # R6: Llama4TextConfig's default intermediate_size_mlp is 16384; without the key the dense layers took the
    # experts' 8,192 (24 dense layers x 3 x 5,120 x 8,192 = 3.02B missing; active 14.16B against 17.18B)
    name = "llama-4-maverick-17b-128e-instruct.json"
    edited = load_model(_edited(tmp_path, name, lambda c: c["text_config"].pop("intermediate_size_mlp")))
    fixture = load_model(str(CORPUS / name))
    assert edited.intermediate_size == fixture.intermediate_size == 16384
    assert param_breakdown(edited).active == param_breakdown(fixture).active
    assert round(param_breakdown(edited).active / 1e9, 2) == 17.18


def test_solve_no_answer_carries_its_figures():
    # N10: the README defines `figures` as the numbers computed before the failure; solve's NoAnswer gave {}
    users = run_cli("solve", "-m", "llama3-8b", "--users", "100000000", "--max-model-len", "8K", "--max-gpus", "8",
                    "--json")  # fmt: skip
    d = users.json()
    assert users.exit_code == 3 and d["error_type"] == "NoAnswer"
    f = d["figures"]
    assert f["max_model_len_tokens"] == 8192 and f"at most {f['max_users']:,} users" in d["error"]
    assert f["layout"] in d["error"]
    tpot = run_cli(
        "solve", "-m", "llama3-8b", "--max-model-len", "8K", "--users", "10", "--tpot-ms", "0.5", "--json"
    )
    f = tpot.json()["figures"]
    assert (
        f"reaches {f['fastest_tpot_ms']:.1f} ms" in tpot.json()["error"]
        and f["weights_step_ms"] < f["fastest_tpot_ms"]
    )
    weights = run_cli("solve", "-m", "llama3-70b", "-g", "H100", "--users", "10", "--max-model-len", "8K",
                      "--max-gpus", "1", "--json").json()  # fmt: skip
    assert weights["figures"] == {"weights_min_gpus": 2, "weights_min_layout": "TP 2 x PP 1"}
    rate = run_cli("solve", "-m", "llama3-8b", "--request-rate", "1000", "--ttft-ms", "100", "--tpot-ms", "20",
                   "--max-gpus", "2", "--input-len", "1000", "--output-len", "100", "--max-model-len", "4K",
                   "--json").json()  # fmt: skip
    f = rate["figures"]
    assert f["gpus"] == 2 and f["request_rate_per_s"] == 1000 and f["ttft_p90_ms"] > 100
    assert f"TTFT p90 {f['ttft_p90_ms']:,.0f} ms" in rate["error"]


def test_solve_max_context_plans_the_server_its_launch_line_starts():
    # N8: the search planned vLLM's default --max-num-seqs (1,024 sizes the sampler's profiling run) while the
    # launch line it prints caps at 100, so it answered 27,152 tokens where that line serves 27,904
    d = run_cli("solve", "-m", "llama3.1-70b", "--max-context", "-g", "8xH100", "--users", "100", "--top", "1",
                "--json").json()  # fmt: skip
    best = d["answers"][0]
    assert "--max-num-seqs 100" in best["vllm_flags"]
    length = best["max_model_len"]
    launched = run_cli("estimate", "-m", "llama3.1-70b", "-g", "8xH100", "-tp", "8", "--max-model-len", str(length),
                       "--kv-cache-dtype", "fp8", "--max-num-seqs", "100", "--json").json()  # fmt: skip
    longer = run_cli("estimate", "-m", "llama3.1-70b", "-g", "8xH100", "-tp", "8", "--max-model-len",
                     str(length + 16), "--kv-cache-dtype", "fp8", "--max-num-seqs", "100", "--json").json()  # fmt: skip
    assert launched["max_concurrency_per_replica"] == 100 > longer["max_concurrency_per_replica"]
    assert length == 27_904


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "qwen3-next-80b-a3b", "-g", "4xH100", "-pp", "2", "-tp", "2", "--max-model-len", "8K",
         "--speculative-config", '{"method":"eagle","num_speculative_tokens":2}', "--acceptance-length", "2",
         "--speculative-draft-config", str(REPO / "tests/fixtures/draft/eagle-llama3-8b.json")],
        ["-m", "gpt-oss-120b", "-g", "8xH100", "-pp", "2", "-tp", "4", "--max-model-len", "32K"],
    ],
)  # fmt: skip
def test_preallocation_never_holds_more_than_paging_at_max_model_len(args, tmp_path):
    # R2: "preallocating max-model-len (no paging)" held 260 (427) against the headline's 118 (426): it divided the
    # whole KV budget, before the null block, the draft's own group and the engine's caps. A request reserved at
    # max-model-len each holds at most what paged blocks hold at max-model-len.
    if "--speculative-draft-config" in args:  # an EAGLE head at the target's width (helpers.draft_for)
        args = [draft_for(args[1], tmp_path) if a.endswith("eagle-llama3-8b.json") else a for a in args]
    d = run_cli("estimate", *args, "--avg-context", "4K", "--json").json()
    head = d["max_concurrency_per_replica"]
    frag = d["fragmentation"]
    # held to the headline where vLLM's count of the draft's own group binds (118, not kvplan's 194 or 260);
    # where the pool's bytes alone bind, preallocation keeps no null block and may hold one more (427 vs 426)
    draft = "--speculative-config" in args
    assert (
        frag["prealloc_max_concurrency_per_replica"] == head
        if draft
        else head <= frag["prealloc_max_concurrency_per_replica"] <= head + 1
    )
    assert (
        frag["paged_max_concurrency_per_replica"] == d["avg_context"]["max_concurrency_per_replica"] >= head
    )
    # the factor line is the engine's own, (blocks) / (blocks a full-length request holds)
    det = d["engine"]["details"]
    assert head == (min(det["num_blocks_per_stage"]) - 1) // det["held_blocks_per_request"]


@pytest.mark.parametrize(("version", "block", "raised"), [("0.11", 32, 544), ("0.11", 64, 544), ("0.18", 128, 544),
                                                          ("0.11", 256, 544), ("0.19", 64, 576), ("0.19", 16, 544), ("0.19", 256, 768)])  # fmt: skip
def test_hybrid_attention_block_follows_the_release_alignment(version, block, raised):
    # Q4: qwen3-next at TP 2: state page 3 x 4,096 x 2 + 16 x 128 x 128 x 2 = 548,864 B, attention 1,024 B a token.
    # vLLM 0.10-0.18 (models/config.py HybridAttentionMambaModelConfig): 16 x cdiv(548,864, 16 x 1,024) = 544
    # whatever --block-size below it; from 0.19 (_align_hybrid_block_size) the alignment is the block size:
    # 64 x cdiv(548,864, 64 x 1,024) = 576. kvplan applied the later rule to every release.
    d = run_cli("estimate", "-m", "qwen3-next-80b-a3b", "-g", "2xH200", "-tp", "2", "--max-model-len", "32K",
                "--engine-version", version, "--block-size", str(block), "--json").json()  # fmt: skip
    lines = d["engine"]["log_lines"]
    assert d["settings"]["block_size"] == raised
    # the lines vLLM logs, reproduced
    assert f"Setting attention block size to {raised} tokens" in lines[0]
    pad = 100 * (raised * 1024 - 548_864) / 548_864
    assert f"Padding mamba page size by {pad:.2f}%" in lines[1]


def test_sglang_radix_off_sizes_the_state_pool_by_the_running_cap():
    # Q3 (rest): model_runner_kv_cache_mixin.py handle_max_mamba_cache: with --disable-radix-cache and
    # --max-running-requests, max_mamba_cache_size = max_running_requests (one slot a running request), the KV
    # pool the rest. qwen3-next on 2x H200: R = 55,378,970,165 B left, 38,633,472 B of state a request, 12,288 B a
    # token: (R - 64 x 38,633,472) // 12,288 = 4,305,536 tokens; kvplan kept the 679-slot ratio split (2,371,976)
    args = [
        "estimate",
        "-m",
        "qwen3-next-80b-a3b",
        "-g",
        "2xH200",
        "--max-model-len",
        "4K",
        "--engine",
        "sglang",
    ]
    d = run_cli(*args, "--no-enable-prefix-caching", "--max-running-requests", "64", "--json").json()
    det = d["engine"]["details"]
    assert det["mamba_cache_slots"] == 64 and d["engine"]["kv_cache_tokens"] == 4_305_536
    assert d["max_concurrency_per_replica"] == 64
    # the radix cache on: the ratio split, 3 slots a request, whatever the cap
    on = run_cli(*args, "--max-running-requests", "64", "--json").json()
    assert (
        on["engine"]["details"]["mamba_cache_slots"] == 679 and on["engine"]["kv_cache_tokens"] == 2_371_976
    )


def test_vllm_before_mla_refuses_an_mla_model():
    # S1: vLLM before 0.7.1 cached DeepSeek-V2/V3 as full K/V (config.py get_head_size pads 192 to 256; blocks of
    # 16): a real 0.6.4 log (vllm-project/vllm PR #10927, DeepSeek-V2-Lite-Chat on H100) shows 5,373 blocks and
    # 10.49x; kvplan planned the latent in blocks of 64 and printed 165.56x
    r = run_cli(
        "estimate", "-m", "deepseek-v2-lite", "-g", "H100", "--engine-version", "0.6", "--max-model-len", "8K"
    )
    assert r.exit_code == 2 and "MLA came in vLLM 0.7.1" in r.stderr and "--engine-version 0.7" in r.stderr
    assert run_cli("estimate", "-m", "deepseek-v2-lite", "-g", "H100", "--engine-version", "0.7",
                   "--max-model-len", "8K").exit_code == 0  # fmt: skip


def _edited_log(tmp_path, blocks: int, factor: str) -> str:
    text = (REPO / "tests/fixtures/logs/vllm_v07_llama2_7b_l40s.log").read_text()
    import re

    text = re.sub(r"# CUDA blocks: \d+", f"# CUDA blocks: {blocks}", text)
    text = re.sub(r"per request: [\d.]+x", f"per request: {factor}x", text)
    out = tmp_path / "edited.log"
    out.write_text(text)
    return str(out)


def test_v0_check_log_checks_the_blocks_against_the_logged_kv_memory(tmp_path):
    # S2: the arithmetic "given the log's KV memory" was handed the log's block count and so always matched. vLLM 0.7
    # (worker.py determine_num_available_blocks): 26.29 GiB // (16 x 32 layers x 2 x 32 heads x 128 x 2 B) = 3,365
    # blocks, 3,365 x 16 / 4,096 = 13.14x
    def arithmetic(log: str) -> dict[str, tuple]:
        r = run_cli("check-log", log, "--gpus", "L40S", "--json")
        assert r.exit_code == 0, r.stderr
        return {row["quantity"]: (row["log"], row["kvplan"], row["cause"]) for row in r.json()["arithmetic"]}

    real = arithmetic(str(REPO / "tests/fixtures/logs/vllm_v07_llama2_7b_l40s.log"))
    assert real["GPU blocks"] == (3365, 3365, "matches") and real["maximum concurrency"][:2] == (13.14, 13.14)
    edited = arithmetic(
        _edited_log(tmp_path, 4000, "15.62")
    )  # it had printed 4,000 / 4,000 "given to kvplan"
    assert edited["GPU blocks"][:2] == (4000, 3365) and edited["GPU blocks"][2].startswith(
        "page size differs"
    )
    assert edited["maximum concurrency"][:2] == (15.62, 13.14)
    # S3: blocks that would not fit the card are no longer fed to estimate as --num-gpu-blocks-override
    doubled = run_cli("check-log", _edited_log(tmp_path, 6730, "26.29"), "--gpus", "L40S", "--json")
    assert "--num-gpu-blocks-override" not in doubled.stderr + doubled.stdout
    rows = {row["quantity"]: row for row in doubled.json()["arithmetic"]}
    assert (rows["GPU blocks"]["log"], rows["GPU blocks"]["kvplan"]) == (6730, 3365)


def test_vllm_064_memory_profiling_line_is_read():
    # S9: vLLM 0.6.4 printed its profile as key=value pairs; this line is verbatim from vllm-project/vllm PR #10927
    from kvplan.logs.logparse import parse

    # the engine line of a real vLLM V0 log (0.7.2), so that the text reads as vLLM's
    head = (REPO / "tests/fixtures/logs/vllm_v07_llama2_7b_l40s.log").read_text().splitlines()[0]
    line = (
        head
        + "\n"
        + (
            "INFO 12-06 07:43:16 worker.py:235] Memory profiling results: duration=1.09 seconds, total_gpu_memory=79.10GiB, "
            "initial_memory_usage=34.44GiB, peak_torch_memory=30.56GiB, memory_usage_post_profile=34.81GiB, "
            "non_torch_memory=5.21GiB, kv_cache_size=35.42GiB, gpu_memory_utilization=0.90."
        )
    )
    f = parse(line + "\n").facts
    assert f["available_kv_bytes"] == round(35.42 * 2**30)
    assert f["non_torch_bytes"] == round(5.21 * 2**30) and f["total_gpu_memory_bytes"] == round(79.10 * 2**30)
    assert f["gpu_memory_utilization"] == 0.90


def test_solve_refuses_an_average_context_beyond_the_limit_and_names_num_prompts():
    # S10: solve clamped --avg-context 100000 to --max-model-len 8192 silently; estimate refuses it
    r = run_cli(
        "solve", "-m", "llama3-8b", "--max-model-len", "8K", "--avg-context", "100000", "--users", "300"
    )
    assert r.exit_code == 2 and "--avg-context must be between 1 and --max-model-len (8,192)" in r.stderr
    # S11: a rate too slow to simulate named only a trace solve was not given
    r = run_cli("solve", "-m", "llama3-8b", "--max-model-len", "8K", "--request-rate", "0.001", "--ttft-ms", "500",
                "--tpot-ms", "30")  # fmt: skip
    assert r.exit_code == 2 and "--num-prompts" in r.stderr


@pytest.mark.parametrize(
    ("name", "nested", "key"),
    [("deepseek-v3.1-nvfp4.json", None, k) for k in ("kv_lora_rank", "first_k_dense_replace", "n_routed_experts",
                                                     "q_lora_rank", "n_shared_experts", "intermediate_size",
                                                     "moe_intermediate_size")]
    + [("llama-4-scout-17b-16e-instruct.json", "text_config", k)
       for k in ("attention_chunk_size", "num_key_value_heads", "num_local_experts")]
    # S5/S6: DeepSeek-V4 without q_lora_rank, o_groups or o_lora_rank lost every attention weight (4.60B), without
    # head_dim or num_key_value_heads it was refused for values the file does not hold (DeepseekV4Config's defaults)
    + [("deepseek-v4-flash.json", None, k) for k in ("q_lora_rank", "o_groups", "o_lora_rank", "head_dim",
                                                     "num_key_value_heads", "qk_rope_head_dim", "index_head_dim")],
)  # fmt: skip
def test_an_absent_key_takes_its_config_class_default(tmp_path, name, nested, key):
    # S4/S7: without kv_lora_rank DeepSeek-V3 lost MLA (40.9x the KV), without n_routed_experts it became a 37B dense
    # model, Llama 4 without attention_chunk_size lost its chunked layers (max 14 requests, not 47). Each dropped
    # key's value in these files equals its class default (DeepseekV3Config, Llama4TextConfig), so the model is the same.
    def edit(cfg):
        (cfg[nested] if nested else cfg).pop(key)

    base = load_model(str(CORPUS / name))
    edited = load_model(_edited(tmp_path, name, edit))
    assert edited.layers == base.layers and param_breakdown(edited) == param_breakdown(base)
    assert any(f"{key} " in n and "defaults" in n for n in edited.notes)


def test_gemma3_absent_head_keys_take_gemma3_defaults_not_the_llama_rule(tmp_path):
    # S8: Gemma3TextConfig defaults head_dim 256 and num_key_value_heads 4; kvplan fell back to hidden / heads (168)
    # and every attention head (32)
    name = "gemma-3-27b-it.json"
    no_dim = load_model(_edited(tmp_path, name, lambda c: c["text_config"].pop("head_dim")))
    assert {t.head_dim for t in no_dim.layer_types.values()} == {256}
    no_kv = load_model(_edited(tmp_path, name, lambda c: c["text_config"].pop("num_key_value_heads")))
    assert {t.num_kv_heads for t in no_kv.layer_types.values()} == {4}


@pytest.mark.parametrize(
    ("outer", "inner", "said"),
    [(None, False, "text_config.tie_word_embeddings false"), (False, True, "at the top level"),
     (False, None, "at the top level")],
)  # fmt: skip
def test_gemma3_is_tied_whatever_the_file_says(tmp_path, outer, inner, said):
    # S8: vLLM's Gemma models assert tie_word_embeddings (gemma3.py Gemma3ForCausalLM) and Gemma 3's wrapper builds
    # the language model from text_config; kvplan had counted a 1.41B LM head (+2.62 GiB) the engine never builds
    def edit(cfg):
        for where, value in ((cfg, outer), (cfg["text_config"], inner)):
            if value is not None:
                where["tie_word_embeddings"] = value

    name = "gemma-3-27b-it.json"
    edited = load_model(_edited(tmp_path, name, edit))
    assert param_breakdown(edited).lm_head == 0
    assert param_breakdown(edited) == param_breakdown(load_model(str(CORPUS / name)))
    assert any(said in n and "tie_word_embeddings" in n for n in edited.notes)
