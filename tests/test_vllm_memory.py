"""vLLM's startup memory profile by release (kvplan/engines/vllm_memory.py) against real logs and the
released wheels' source: the sampler's peak, non-torch memory, CUDA graphs, MXFP4 padding, and the
embedding/LM head a quantized checkpoint keeps in bf16."""

from __future__ import annotations

import pytest

from helpers import REPO, plan, run_cli
from kvplan.engines import vllm_memory as vm
from kvplan.logs.logparse import parse
from kvplan.specs.registry import load_gpu
from kvplan.units import GiB, MiB

LOGS = REPO / "tests" / "fixtures" / "logs" / "real"


@pytest.mark.parametrize(
    ("version", "rows", "v2", "flashinfer", "name", "per_logit"),
    [
        ((0, 10), 1024, False, None, "PyTorch sort", 38.5),  # pip install: no FlashInfer
        ((0, 10), 1024, False, True, "FlashInfer", 14.0),  # the Docker image has it
        ((0, 16), 1024, False, None, "PyTorch sort", 38.5),  # 0.11.1-0.20: off unless asked (PR #26859)
        ((0, 17), 1024, False, None, "Triton top-k/p", 14.0),  # topk_topp_triton.py from 0.17, >= 8 rows
        ((0, 17), 4, False, None, "PyTorch sort", 38.5),  # below 8 rows the sort stays
        ((0, 21), 1024, False, None, "FlashInfer", 14.0),  # on by default from 0.21 (PR #40376)
        ((0, 23), 1024, True, None, "runner V2", 2.0),  # its dummy run samples the bf16 logits only
        ((0, 33), 1024, True, None, "runner V2 warm-up", 16.0),
    ],
)
def test_sampler_path_by_release(version, rows, v2, flashinfer, name, per_logit):
    path = vm.sampler_path(version, rows, runner_v2=v2, flashinfer=flashinfer)
    assert (path.name, path.bytes_per_logit) == (name, per_logit)


def test_model_runner_v2_defaults_by_architecture():
    assert vm.runner_v2((0, 21), "Qwen3ForCausalLM", False, False)[0] is False
    assert vm.runner_v2((0, 22), "Qwen3ForCausalLM", False, False)[0] is True
    assert vm.runner_v2((0, 22), "LlamaForCausalLM", False, False)[0] is False
    assert vm.runner_v2((0, 23), "LlamaForCausalLM", False, False)[0] is True
    assert vm.runner_v2((0, 25), "Qwen3MoeForCausalLM", True, False)[0] is False  # MoE not listed
    assert vm.runner_v2((0, 25), "GemmaForCausalLM", False, False)[0] is True  # every non-MoE model
    assert vm.runner_v2((0, 29), "Qwen3MoeForCausalLM", True, True)[0] is True


def test_the_profilers_own_breakdown_is_read_and_matched():
    # vLLM 0.10.2 prints "Actual usage is 74.28 GiB for weight, 5.58 GiB for peak activation, 1.38 GiB
    # for non-torch memory, and 2.37 GiB for CUDAGraph memory" (Qwen3-Next-80B on 2x H200)
    f = parse((LOGS / "vllm_0.10.2_qwen3-next-80b-a3b_h200_tp2.log").read_text()).facts
    assert f["activation_bytes"] == round(5.58 * GiB)
    assert f["non_torch_bytes"] == round(1.38 * GiB)
    assert f["cuda_graph_bytes"] == round(2.37 * GiB)
    assert f["sampler"] == "native" and f["total_gpu_memory_bytes"] == round(139.81 * GiB)
    # kvplan's peak: the sampler over min(1024 sequences, 8192 tokens) rows of the 151,936-token
    # vocabulary at 38.5 B a logit = 5.58 GiB, plus the forward's 8,192 x 2,048 bf16 hidden states
    p = plan("qwen3-next-80b-a3b", "H200", num_gpus=2, engine_version="0.10", max_model_len=8192)
    assert p.reserve.sampler_bytes == round(1024 * 151936 * 38.5)
    assert p.reserve.profile_peak_bytes == p.reserve.sampler_bytes + 8192 * 2048 * 2
    assert p.reserve.profile_peak_bytes == pytest.approx(5.58 * GiB, rel=0.01)


def test_sampler_peak_on_a_log_it_was_fitted_to():
    # vLLM 0.11.2, Llama-3-8B on one H200: one of the three logs SORT_BYTES was fitted to (FITTED in
    # benchmarks/log_predictions.py), so this checks the arithmetic in sample, not a held-out figure: requested
    # 0.9 x 139.80 = 125.82 GiB - 14.96 GiB weights - 105.97 GiB KV = 4.89 GiB of non-KV memory; kvplan:
    # 1,024 x 128,256 x 38.5 B = 4.71 GiB sampler (> 0.91 GiB forward) + 0.07 GiB non-torch
    p = plan("llama3-8b", "H200", num_gpus=1, engine_version="0.11", max_model_len=1024)
    assert p.reserve_bytes_per_gpu == pytest.approx(4.89 * GiB, rel=0.02)


def test_non_torch_memory_by_card_and_tp():
    h100, a100 = load_gpu("H100"), load_gpu("A100-80GB")
    assert vm.non_torch_bytes((0, 12), h100, 1, 1) == vm.NON_TORCH_BYTES
    # NVLS buffers grow with TP on Hopper SXM; symmetric-memory all-reduce from 0.11 (64 MiB at TP 2)
    assert (
        vm.non_torch_bytes((0, 10), h100, 8, 1)
        == vm.NON_TORCH_BYTES + 16 * MiB + 8 * vm.NCCL_NVLS_BYTES_PER_RANK
    )
    assert vm.non_torch_bytes((0, 12), h100, 2, 1) == vm.NON_TORCH_BYTES + 16 * MiB + 64 * MiB + 2 * int(
        0.28 * GiB
    )
    # A100's NVSwitch has no NVLS and its compute capability no symmetric-memory table
    assert vm.non_torch_bytes((0, 12), a100, 2, 1) == vm.NON_TORCH_BYTES + 16 * MiB + vm.NCCL_OTHER_BYTES


def test_gpt_oss_mxfp4_experts_load_padded_as_real_logs_show():
    # vLLM 0.10.1.1 on 4x A100-80GB logs "Model loading took 17.2217 GiB": Marlin pads the expert
    # intermediate 2880/4 = 720 -> 768 and hidden 2880 -> 3072 (mxfp4.py), +13.8% on the experts:
    # kvplan 17.13 GiB (15.1 GiB stored); the 0.09 GiB left is the rotary cache and Marlin workspaces
    p = plan("gpt-oss-120b", "A100-80GB", num_gpus=4, engine_version="0.10", max_model_len=8192)
    assert p.weight_bytes_per_gpu == pytest.approx(17.2217 * GiB, rel=0.01)
    assert any("MXFP4 experts load 13.8% larger" in a for a in p.assumptions)
    # one H100: Marlin until 0.11 (64-66 GiB in real logs), Triton without padding from 0.12
    m = plan("gpt-oss-120b", "H100", num_gpus=1, engine_version="0.10", max_model_len=1024, max_num_seqs=16)
    t = plan("gpt-oss-120b", "H100", num_gpus=1, engine_version="0.12", max_model_len=1024, max_num_seqs=16)
    assert 64 * GiB < m.weight_bytes_per_gpu < 66 * GiB
    assert t.weight_bytes_per_gpu < 61 * GiB


def test_awq_keeps_embedding_and_head_in_bf16():
    # vLLM 0.16.0, Llama-3-70B-Instruct-AWQ at TP 2 on L40S logs "Model loading took 18.55 GiB"
    p = plan("llama3-70b", "L40S", num_gpus=2, weight_dtype="int4", engine_version="0.16", max_model_len=1024)
    assert p.weight_bytes_per_gpu == pytest.approx(18.55 * GiB, rel=0.02)


def test_install_dependent_sampler_is_stated_and_settable():
    p = plan("llama3-8b", "H100", num_gpus=1, engine_version="0.10", max_model_len=1024)
    assert any("--env VLLM_USE_FLASHINFER_SAMPLER=1" in a for a in p.assumptions)
    env = (("VLLM_USE_FLASHINFER_SAMPLER", "1"),)
    q = plan("llama3-8b", "H100", num_gpus=1, engine_version="0.10", max_model_len=1024, env=env)
    assert q.reserve.sampler_path == "FlashInfer, 14 B/logit"
    assert q.settings.engine_env == {"VLLM_USE_FLASHINFER_SAMPLER": "1"}  # stated in --json
    assert q.reserve.sampler_bytes == round(1024 * 128256 * 14)


def test_pooling_models_profile_no_sampler(tmp_path):
    # vLLM 0.12.0 serving Qwen3-Embedding-8B (architecture Qwen3ForCausalLM) logs "Found pooling
    # configuration" and "Resolved `--runner auto` to `--runner pooling`": a sentence-transformers
    # modules.json in the model folder decides it (vllm/config/model.py _get_default_runner_type)
    import json
    import shutil

    folder = tmp_path / "Qwen3-Embedding-8B"
    folder.mkdir()
    shutil.copy(
        REPO / "tests" / "fixtures" / "hf" / "corpus" / "qwen3-embedding-8b.json", folder / "config.json"
    )
    generate = plan(
        str(folder / "config.json"), "H100", num_gpus=1, engine_version="0.12", max_model_len=8192
    )
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    pooling = plan(str(folder / "config.json"), "H100", num_gpus=1, engine_version="0.12", max_model_len=8192)
    # generate: 1,024 x 151,665 x 38.5 B = 5.57 GiB of sampler; pooling: none, only the forward pass
    assert generate.reserve.sampler_bytes == round(1024 * 151665 * 38.5)
    assert pooling.reserve.sampler_bytes == 0 and pooling.reserve.sampler_path == "none (a pooling model)"
    assert any("--runner auto resolves to pooling" in a for a in pooling.assumptions)
    # the same by flag; the real log's 56.24 GiB of KV memory is then within 2.1%
    flagged = plan(str(folder / "config.json"), "H100", num_gpus=1, engine_version="0.12", max_model_len=8192,
                   runner="pooling")  # fmt: skip
    assert flagged.engine.available_kv_bytes == pooling.engine.available_kv_bytes
    assert abs(flagged.engine.available_kv_bytes / (56.24 * GiB) - 1) < 0.021
    (folder / "modules.json").write_text("{not json")
    with pytest.raises(Exception, match="modules.json: line 1, column 2: malformed JSON"):
        plan(str(folder / "config.json"), "H100", num_gpus=1, max_model_len=8192)


def test_vision_language_models_warn_that_the_encoder_profile_is_not_counted():
    # four real Qwen3-VL-30B-A3B logs (vLLM 0.11-0.12, H100) hold 3.6-4.1 GiB a GPU less KV memory than
    # kvplan's estimate: the vision encoder's profiling run, which kvplan does not model, says so
    vl = plan(str(REPO / "tests/fixtures/hf/corpus/qwen3-vl-30b-a3b-instruct.json"), "H100", num_gpus=2,
              max_model_len=8192)  # fmt: skip
    warning = next(a for a in vl.assumptions if a.startswith("WARNING: kvplan does not count vLLM's profile"))
    assert "vision tower's weights" not in warning  # counted now (kvplan/model/params.py vision_matrices)
    text = plan(str(REPO / "tests/fixtures/hf/corpus/qwen3-coder-30b-a3b-instruct.json"), "H100", num_gpus=2,
                max_model_len=8192)  # fmt: skip
    assert not any("vision encoder" in a for a in text.assumptions)


VL_FOLDER = REPO / "tests/fixtures/hf/corpus/qwen3-vl-30b-a3b-instruct"  # config.json + Qwen3-VL processors


def test_vision_encoder_outputs_held_through_the_profile():
    # vLLM 0.11-0.12 profile_run keeps the dummy encoder outputs of the largest item, padded to the
    # encoder budget, through the dummy forward and the sampler (gpu_model_runner.py). Qwen3-VL's
    # video processor allows longest_edge 25,165,824 pixels: / (2 x 32 x 32) = 12,288 rows x 12.5
    # (qwen3_vl.py get_max_video_tokens) = 153,600 tokens, the budget the real logs print ("Encoder
    # cache will be initialized with a budget of 153600 tokens"); width 2,048 x (1 + 3 deepstack) = 8,192.
    # Also alive: the unpadded output (the loop variable) and the dummy pixel_values, 12,288 x 4 patches
    # of 3 x 2 x 16 x 16 float32 values
    # the 0.12.0 TP 2 log: the user typed max_model_len 65536 and max_num_seqs 64 (non-default args)
    p = plan(str(VL_FOLDER / "config.json"), "H100", num_gpus=2, engine_version="0.12", max_model_len=65536,
             max_num_seqs=64)  # fmt: skip
    padded, unpadded, pixels = (
        153600 * 8192 * 2,
        12288 * 8192 * 2,
        12288 * 4 * 1536 * 4,
    )  # 2.34, 0.19, 0.28 GiB
    assert p.reserve.encoder_cache_bytes == padded + unpadded + pixels
    assert p.reserve.profile_peak_bytes > p.reserve.encoder_cache_bytes
    assert not any("vision" in a and a.startswith("WARNING") for a in p.assumptions)
    # logged "Available KV cache memory: 38.15 GiB"; kvplan 38.09 GiB (41.24 GiB with neither the
    # encoder's held tensors nor the load buffers below: +8.1%)
    assert p.engine.available_kv_bytes / (38.15 * GiB) - 1 == pytest.approx(-0.002, abs=0.005)


@pytest.mark.parametrize(
    ("version", "held"),
    [
        # 0.10.2 caches the outputs as the encoder returns them: 16,384 rows, and the pixels
        ((0, 10), 16384 * 8192 * 2 + 16384 * 4 * 1536 * 4),
        # 0.11.0 pads to the encoder budget max(max_num_batched_tokens 32,768, 16,384) and keeps the
        # unpadded output too
        ((0, 11), 32768 * 8192 * 2 + 16384 * 8192 * 2 + 16384 * 4 * 1536 * 4),
        # 0.12.0 pads to the item's own tokens: an image's are its rows, so nothing is padded
        ((0, 12), 16384 * 8192 * 2 + 16384 * 4 * 1536 * 4),
    ],
)
def test_dummy_encoder_tensors_by_release(tmp_path, version, held):
    # an image-only folder (the real preprocessor_config.json: longest_edge 16,777,216 / 32^2 = 16,384)
    import shutil

    for name in ("config.json", "preprocessor_config.json"):
        shutil.copy(VL_FOLDER / name, tmp_path / name)
    from kvplan.specs.registry import load_model

    tower = load_model(str(tmp_path / "config.json")).vision_tower
    assert tower is not None and (tower.max_item_tokens, tower.max_item_rows) == (16384, 16384)
    assert vm.dummy_encoder_bytes(version, tower, 32768, 2) == held


def test_vision_model_load_buffers_against_the_logged_weights():
    # vLLM allocates with a Qwen3-VL model, beside its parameters: the M-RoPE cos/sin cache over 4 x
    # 262,144 positions x 128 rotary dims in bf16 (mrope.py: 0.25 GiB) and three deepstack input
    # buffers of max_num_batched_tokens 8,192 x hidden 2,048 (qwen3_vl_moe.py: 0.09 GiB), both inside
    # "Model loading took"; every GPU holds them whatever the TP
    tp1 = plan(str(VL_FOLDER / "config.json"), "H100", num_gpus=1, engine_version="0.11", max_model_len=65536,
               max_num_seqs=256)  # fmt: skip
    # before 0.10 kvplan's vLLM rules were not re-read from the wheels: the parameters alone
    params = plan(str(VL_FOLDER / "config.json"), "H100", num_gpus=1, engine_version="0.9",
                  max_model_len=65536, max_num_seqs=256)  # fmt: skip
    buffers = 4 * 262144 * 128 * 2 + 3 * 8192 * 2048 * 2
    assert tp1.weight_bytes_per_gpu - params.weight_bytes_per_gpu == buffers
    assert any("M-RoPE cos/sin cache" in a and "3 deepstack" in a for a in tp1.assumptions)
    tp2 = plan(str(VL_FOLDER / "config.json"), "H100", num_gpus=2, engine_version="0.12", max_model_len=65536,
               max_num_seqs=64)  # fmt: skip
    # the real logs: "Model loading took 58.2294 GiB" (0.11.0rc2, TP 1), "29.3114 GiB" (0.12.0, TP 2)
    for p, tp, logged in ((tp1, 1, 58.2294), (tp2, 2, 29.3114)):
        assert p.weight_bytes_per_gpu / GiB == pytest.approx(logged, abs=0.035), tp
    # the TP 1 log: "Available KV cache memory: 8.77 GiB" (kvplan 9.56 GiB, +9.0%, without the load
    # buffers and the encoder's unpadded output and pixels)
    assert tp1.engine.available_kv_bytes / (8.77 * GiB) - 1 == pytest.approx(-0.003, abs=0.01)


def test_a_refusal_resting_on_the_assumed_sampler_path_says_so():
    # gpt-oss-120b (201,088-token vocabulary) on one H100 at 32K, vLLM 0.10.2: served in published runs
    # (GPUStack performance lab, the vllm-openai image), refused by kvplan on the PyTorch-sort sampler
    # it assumes for a pip install; the refusal names that assumption and the flag that changes it
    args = (
        "estimate",
        "-m",
        "gpt-oss-120b",
        "-g",
        "H100",
        "--max-model-len",
        "32768",
        "--engine-version",
        "0.10.2",
    )
    refused = run_cli(*args)
    assert refused.exit_code != 0 and len(refused.stderr.strip().splitlines()) == 1
    assert "PyTorch sort" in refused.stderr and "VLLM_USE_FLASHINFER_SAMPLER=1" in refused.stderr
    planned = run_cli(*args, "--env", "VLLM_USE_FLASHINFER_SAMPLER=1", "--json")
    assert planned.exit_code == 0 and planned.json()["kv_budget_bytes_per_gpu"] > 0
