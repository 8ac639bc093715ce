"""What vLLM's startup memory profile charges beside the weights and the KV cache, by release.

vLLM v1 (vllm/v1/worker/gpu_worker.py, determine_available_memory) sizes the KV cache as
    requested - (weights + torch peak increase during profile_run + non-torch increase)
    [- its CUDA graph estimate, from 0.20 on].
profile_run runs the model over max_num_batched_tokens tokens, then the sampler over
min(max_num_seqs, max_num_batched_tokens) rows of logits; the two run one after the other, so the torch
peak is the larger of the two (the forward's hidden states stay alive during the sampler).

The rules below were read in the released wheels 0.10.0 to 0.33.0 (`pip download vllm==X`), each
file named where it is used. Pure functions; nothing here imports vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.engines.base import Version
from kvplan.model.parallel import has_nvls
from kvplan.specs.models import GpuSpec, VisionTower
from kvplan.units import GiB, MiB

# Bytes alive per logit (one row of the vocabulary for one sequence) at the sampler's peak, by path
# (vllm/v1/sample/sampler.py, vllm/v1/sample/ops/topk_topp_sampler.py; the dummy run sets temperature
# 0.5, top_p 0.9 and top_k vocab-1, so the full top-k/top-p path runs):
# - PyTorch sort: bf16 logits 2 + fp32 copy 4 + sorted values 4 + int64 indices 8 + the sort's own
#   index array 8 and CUB scratch (~12). Fitted by hand to three real logs, all 1024 sequences: two
#   print the profiler's peak (vLLM 0.10.2 Qwen3-Next-80B on 2x H200: 5.58 GiB; 0.10.2 Qwen3-4B: 5.59
#   GiB), one gives it as its non-KV remainder (0.11.2 Llama-3-8B on H200: 4.89 GiB less non-torch):
#   38.5 B. benchmarks/log_predictions.py refits it leave one source out (FITTED, REPEATS_RULE). Replaying that path on an H200 measured
#   38.0 B at four (rows, vocab) shapes (benchmarks/sampler_peak.py; benchmarks/results/h200/).
# - Triton top-k/top-p (topk_topp_triton.py, from 0.17) and FlashInfer's sampler: 2 + 4 + softmax 4 +
#   exponential noise 4 = 14 B (derived from the source, not measured).
# - Model runner V2 (vllm/v1/worker/gpu/model_runner.py) up to 0.32: its dummy run adds no request, so
#   the sampler only sees the bf16 logits: 2 B. In 0.33 a warm-up pass with every sampling parameter
#   and 5 logprobs: ~16 B (estimated from the source).
SORT_BYTES = 38.5
FUSED_BYTES = 14.0
RUNNER_V2_BYTES = 2.0
RUNNER_V2_WARMUP_BYTES = 16.0

FLASHINFER_SAMPLER_ENV = "VLLM_USE_FLASHINFER_SAMPLER"
RUNNER_V2_ENV = "VLLM_USE_V2_MODEL_RUNNER"
CUDA_GRAPH_ENV = "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"

# Model runner V2's default by release (vllm/config/vllm.py use_v2_model_runner): opt-in from 0.12;
# by architecture from 0.22; every non-MoE model plus these MoE ones from 0.25; every model from 0.29.
RUNNER_V2_ARCHITECTURES: tuple[tuple[Version, frozenset[str]], ...] = (
    ((0, 22), frozenset({"Qwen3ForCausalLM"})),
    ((0, 23), frozenset({"LlamaForCausalLM", "MistralForCausalLM"})),
    ((0, 24), frozenset({"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"})),
    ((0, 27), frozenset({"KimiK3ForCausalLM"})),
    ((0, 28), frozenset({"DeepseekV4ForCausalLM"})),
)
RUNNER_V2_NON_MOE = (0, 25)
RUNNER_V2_ALL = (0, 29)


# vllm/config/model.py _get_default_runner_type: a sentence-transformers pooling config makes a pooling
# model; else the registry, else the architecture's suffix (_SUFFIX_TO_DEFAULTS: *ForCausalLM,
# *ForConditionalGeneration, *LMHeadModel, *ChatModel generate; classifiers, reward and *Model pooling).
GENERATE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "ChatModel")
POOLING_SUFFIXES = (
    "Classification",
    "RewardModel",
    "RewardModeling",
    "EmbeddingModel",
    "ForTextEncoding",
    "Model",
)


def resolve_runner(runner: str, architecture: str | None, pooling_config: bool) -> tuple[str, str | None]:
    """(generate | pooling, why) for vLLM's --runner."""
    if runner != "auto":
        return runner, None
    if pooling_config:
        return (
            "pooling",
            "--runner auto resolves to pooling: the model folder has a sentence-transformers pooling config",
        )
    arch = architecture or ""
    if arch and not arch.endswith(GENERATE_SUFFIXES) and arch.endswith(POOLING_SUFFIXES):
        return "pooling", f"--runner auto resolves to pooling for the {arch} architecture"
    return "generate", None


@dataclass(frozen=True)
class SamplerPath:
    name: str
    bytes_per_logit: float


def runner_v2(version: Version, architecture: str | None, moe: bool, hybrid: bool) -> tuple[bool, str]:
    """Whether vLLM runs this model with model runner V2 by default, and why."""
    if version < (0, 22):
        return False, "model runner V2 is opt-in before 0.22"
    if version >= RUNNER_V2_ALL:
        return True, "model runner V2 is the default for every model from 0.29"
    if version >= RUNNER_V2_NON_MOE and not moe and not hybrid:
        return True, "model runner V2 is the default for non-MoE models from 0.25"
    listed = set().union(*(archs for since, archs in RUNNER_V2_ARCHITECTURES if version >= since))
    if architecture in listed:
        return True, f"model runner V2 is the default for {architecture} in this release"
    return False, "this release keeps the V1 model runner for this architecture"


def sampler_path(version: Version, num_reqs: int, *, runner_v2: bool, flashinfer: bool | None) -> SamplerPath:
    """Which top-k/top-p path vLLM's profiling sampler takes. `flashinfer`: the user's
    VLLM_USE_FLASHINFER_SAMPLER (None: the release's default)."""
    if runner_v2:
        if version >= (0, 33):
            return SamplerPath("runner V2 warm-up", RUNNER_V2_WARMUP_BYTES)  # 0.33's sampler warm-up pass
        return SamplerPath("runner V2", RUNNER_V2_BYTES)  # its dummy run samples the bf16 logits only
    triton = version >= (0, 30) or (version >= (0, 17) and num_reqs >= 8)
    fused = SamplerPath("Triton top-k/p" if triton else "FlashInfer", FUSED_BYTES)
    if version >= (0, 22):
        # a second dummy call with a seeded generator forces the native path (Triton where it applies)
        return fused if triton else SamplerPath("PyTorch sort", SORT_BYTES)
    if flashinfer is None:
        # 0.10.0-0.11.0: on when flashinfer is installed, which `pip install vllm` does not do (an extra);
        # 0.11.1-0.20: off unless VLLM_USE_FLASHINFER_SAMPLER=1 (PR #26859); 0.21: on (PR #40376)
        flashinfer = version >= (0, 21)
    if flashinfer:
        return SamplerPath("FlashInfer", FUSED_BYTES)
    if triton:
        return fused
    return SamplerPath("PyTorch sort", SORT_BYTES)


def sampler_note(version: Version, path: str) -> str | None:
    """What the user can change where the install decides the path."""
    if (0, 10) <= version <= (0, 11) and path.startswith("PyTorch sort"):
        return (
            "sampler profiled on the PyTorch sort path (a pip install without FlashInfer); the "
            f"vllm/vllm-openai image has FlashInfer: --env {FLASHINFER_SAMPLER_ENV}=1"
        )
    return None


# Non-torch memory (CUDA context excluded: it is in vLLM's baseline). One GPU: cuBLAS/Triton workspaces
# and module loads, ~0.07 GiB in the profiler's own breakdown (vLLM 0.10.2 logs: 0.07, 0.07, 0.02 GiB).
NON_TORCH_BYTES = int(0.07 * GiB)
# With TP/PP > 1: NCCL's communicators (not sized in vLLM's source), custom all-reduce IPC buffers
# (custom_all_reduce.py: 2 x max_size, 8 MiB by default) and, from 0.11 on Hopper/Blackwell, the
# symmetric-memory all-reduce buffer (symm_mem.py SYMM_MEM_ALL_REDUCE_MAX_SIZES, in MiB by TP).
CUSTOM_ALL_REDUCE_BYTES = 16 * MiB
SYMM_MEM_MIB: dict[str, dict[int, int]] = {
    "hopper": {2: 64, 4: 32, 6: 64, 8: 64},
    "blackwell": {2: 8, 4: 32, 6: 128, 8: 128},
}
# NCCL's own buffers (not sized in vLLM's source), fitted to the fitting half of
# benchmarks/log_predictions.py. On Hopper/Blackwell SXM boards NCCL adds NVLink-SHARP (NVLS) buffers,
# which grow with the peers: 0.28 GiB x TP (Qwen3-235B at TP 8 on H100: 2.2 GiB; Qwen3-30B at TP 2:
# 0.6 GiB). A100's NVSwitch and PCIe cards have no NVLS: 0.05 GiB (Qwen2-7B at TP 2 on A100).
NCCL_NVLS_BYTES_PER_RANK = int(0.28 * GiB)
NCCL_OTHER_BYTES = int(0.05 * GiB)


def non_torch_bytes(version: Version, gpu: GpuSpec, tp: int, pp: int) -> int:
    if tp * pp == 1:
        return NON_TORCH_BYTES
    symm = SYMM_MEM_MIB.get(gpu.arch or "", {}).get(tp, 0) * MiB if version >= (0, 11) else 0
    nccl = NCCL_NVLS_BYTES_PER_RANK * tp if has_nvls(gpu) else NCCL_OTHER_BYTES
    return NON_TORCH_BYTES + CUSTOM_ALL_REDUCE_BYTES + symm + nccl


# Before vLLM 0.10 (not re-derived from the wheels): three fp32 copies of the logits, added to the
# forward's peak; non-torch 1.79 GiB a GPU before 0.7 (PR 10511's logs, doubled with TP/PP), then
# 0.2 GiB plus ~1 GiB of NCCL buffers with TP/PP (PR 12126 and issue logs).
LEGACY_SAMPLER_BYTES = 12.0
LEGACY_NON_TORCH_V06 = int(1.79 * GiB)
LEGACY_NON_TORCH = int(0.2 * GiB)
LEGACY_NCCL = int(1.0 * GiB)


def legacy_non_torch_bytes(version: Version, tp: int, pp: int) -> int:
    if version < (0, 7):
        return LEGACY_NON_TORCH_V06 * (2 if tp * pp > 1 else 1)
    return LEGACY_NON_TORCH + (LEGACY_NCCL if tp * pp > 1 else 0)


def counts_cuda_graphs(version: Version, given: bool | None) -> bool:
    """vllm/envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS: the estimate exists from 0.18 (PR #30515),
    default "0" in 0.18-0.19 and "1" from 0.20 (its log says 'default since v0.21.0'; the 0.20.0 wheel
    already defaults to 1)."""
    if version < (0, 18):
        return False
    return given if given is not None else version >= (0, 20)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


# vllm/model_executor/layers/quantization/mxfp4.py (Mxfp4MoEMethod.create_weights): MXFP4 experts are
# padded for the kernel that runs them: (backend, intermediate-per-rank multiple, hidden multiple).
# Marlin (no native FP4: A100, Ada; Hopper until 0.11, whose wheels lack the Triton MoE path);
# Triton matmul_ogs on Hopper from 0.12 (triton_kernels vendored); FlashInfer on Blackwell.
MXFP4_BACKENDS = {"marlin": (128, 256), "triton": (64, 1), "flashinfer": (256, 256)}


def mxfp4_backend(version: Version, gpu: GpuSpec) -> str:
    if gpu.vendor == "amd":
        return "ROCm Triton"  # mxfp4.py get_mxfp4_backend: ROCm runs MXFP4 experts with Triton (matmul_ogs)
    if gpu.arch == "blackwell":
        return "flashinfer"
    if gpu.arch == "hopper" and version >= (0, 12):
        return "triton"
    return "marlin"


def mxfp4_expert_factor(
    version: Version, gpu: GpuSpec, hidden: int, inter: int, tp: int
) -> tuple[float, str]:
    """Loaded / stored size of MXFP4 routed experts (weights and block scales pad alike)."""
    backend = mxfp4_backend(version, gpu)
    if backend == "ROCm Triton":
        m_inter = m_hidden = mxfp4_rocm_align(version, gpu)
    else:
        m_inter, m_hidden = MXFP4_BACKENDS[backend]
    per_rank = -(-inter // tp)
    padded = _round_up(per_rank, m_inter) * _round_up(hidden, m_hidden)
    return padded / (per_rank * hidden), backend


def mxfp4_rocm_align(version: Version, gpu: GpuSpec) -> int:
    """The multiple ROCm rounds MXFP4 experts' hidden and per-rank intermediate sizes up to (both alike)."""
    if version < (0, 11):
        return 128  # quantization/mxfp4.py@v0.10.2 create_weights: is_rocm() -> round_up(..., 128)
    if version < (0, 12):
        return (
            256  # mxfp4.py@v0.11.0: is_rocm() -> round_up(..., 256) (0.11.1-0.11.2 already take 0.12's rule)
        )
    if version < (0, 19):
        # mxfp4_utils.py@v0.12.0..v0.18.1 get_padding_alignment: 256 on gfx950 (CDNA4), else 128
        return 256 if gpu.arch == "cdna4" else 128
    # fused_moe/oracle/mxfp4.py@v0.19.1..v0.27.1 mxfp4_round_up_hidden_size_and_intermediate_size: ROCm 256
    # (0.28 on re-derives it by CDNA version and kernel: not re-read here, so 0.27's rule is kept)
    return 256


# vllm/platforms/rocm.py get_current_memory_usage, 0.7.3 (PR #12624, "[ROCm] Using a more precise memory
# profiling") to 0.20.2: total - free from torch.cuda.mem_get_info, where CUDA (and ROCm again from 0.21.0)
# takes torch.cuda.max_memory_allocated; DeviceMemoryProfiler's difference over loading is "Model loading
# took" and the weights the KV budget pays (v1/worker/gpu_worker.py determine_available_memory)
ROCM_DEVICE_WIDE_LOADING: tuple[Version, Version] = ((0, 7), (0, 21))


def rocm_loading_device_wide(version: Version) -> bool:
    return ROCM_DEVICE_WIDE_LOADING[0] <= version < ROCM_DEVICE_WIDE_LOADING[1]


ROCM_LOADING_NOTE = (
    "vLLM 0.7.3-0.20.2 on ROCm logs as 'Model loading took' the device memory that came into use while "
    "loading (total - free, vllm/platforms/rocm.py get_current_memory_usage), not the weights' bytes alone: "
    "memory the allocator keeps or the runtime takes while loading counts too, and the KV budget pays it; "
    "kvplan plans the weights' bytes"
)
# --- AMD Instinct (ROCm): the unquantized fused-MoE padding -------------------------------------
# fused_moe/layer.py@v0.10.2 (unquantized_fused_moe_method.py from 0.11.1) _maybe_pad_weight: with
# VLLM_ROCM_MOE_PADDING (default "1") on ROCm, every expert weight row whose byte stride is a multiple of
# 512 is re-allocated 256 bytes longer (F.pad(w, (0, 256 // elem))[..., :-pad]): w13 [E, 2I, H] rows of H,
# w2 [E, H, I] rows of I. The parameter keeps the padded storage only while nothing copies it compactly:
# - 0.10-0.19: `.data = padded view`, the Triton path uses it as is (kept);
# - 0.20-0.24: _setup_kernel -> oracle/unquantized.py convert_to_unquantized_kernel_format ends with
#   `.contiguous()` (lost; 0.21 not re-read, between two releases that lose it);
# - 0.25-0.29: that function skips .contiguous() for TRITON on ROCm with the padding on (kept);
# - 0.30 on: `.data.copy_(padded view)` copies back into the unpadded storage (lost).
# AITER's fused MoE (VLLM_ROCM_USE_AITER=1, VLLM_ROCM_USE_AITER_MOE default on) shuffles the weights into
# new contiguous tensors (rocm_aiter_fused_moe.py shuffle_weights), so there the padding is always lost.
ROCM_MOE_PADDING_ENV = "VLLM_ROCM_MOE_PADDING"
ROCM_AITER_ENV = "VLLM_ROCM_USE_AITER"
ROCM_AITER_MOE_ENV = "VLLM_ROCM_USE_AITER_MOE"
ROCM_MOE_PAD_BYTES = 256


def rocm_moe_padding_kept(version: Version) -> bool:
    return (0, 10) <= version < (0, 20) or (0, 25) <= version < (0, 30)


def rocm_moe_padding_factor(hidden: int, inter_per_rank: int, elem_bytes: int, gated: bool = True) -> float:
    """Loaded / stored size of unquantized routed experts under _maybe_pad_weight (see above)."""

    def row(n: int) -> int:
        return n + ROCM_MOE_PAD_BYTES // elem_bytes if (n * elem_bytes) % 512 == 0 else n

    rows13 = (2 if gated else 1) * inter_per_rank
    stored = rows13 * hidden + hidden * inter_per_rank
    return (rows13 * row(hidden) + hidden * row(inter_per_rank)) / stored


# rotary_embedding/mrope.py MRotaryEmbedding (0.10.2, 0.11.0, 0.12.0): the M-RoPE of Qwen2/2.5/3-VL text
# models caches cos/sin for 4 x max_position_embeddings positions, rotary_dim values each in the model
# dtype, built at model init, so inside "Model loading took"
MROPE_CACHE_POSITIONS = 4


def vision_load_bytes(
    tower: VisionTower,
    max_positions: int,
    rotary_dim: int,
    text_hidden: int,
    batched_tokens: int,
    act_bytes: int,
) -> int:
    """Buffers a Qwen-VL model allocates at load beside its parameters: the M-RoPE cache, and Qwen3-VL's
    deepstack inputs (qwen3_vl.py, qwen3_vl_moe.py __init__: one zeroed max_num_batched_tokens x text
    hidden buffer per deepstack level)."""
    rope = MROPE_CACHE_POSITIONS * max_positions * rotary_dim * act_bytes
    return rope + tower.deepstack_mergers * batched_tokens * text_hidden * act_bytes


def dummy_encoder_bytes(version: Version, tower: VisionTower, batched_tokens: int, act_bytes: int) -> int:
    """What gpu_model_runner.py profile_run keeps alive through the dummy forward and the sampler for the
    largest multimodal item: its encoder outputs, and its dummy pixel_values (the batched inputs stay
    referenced until profile_run returns; float32 as the processor made them).

    0.10.2 caches the outputs as the encoder returns them. From 0.11 they are copied, zero-padded, into a
    larger tensor (0.11.0: to the encoder budget, max(max_num_batched_tokens, the item's tokens); 0.12.0:
    to the item's tokens) and the loop variable keeps the last unpadded output alive too."""
    assert tower.max_item_tokens is not None
    rows = tower.max_item_rows or tower.max_item_tokens
    width = tower.encoder_output_width * act_bytes
    inputs = rows * tower.spatial_merge_size**2 * tower.pixel_patch_bytes
    if version < (0, 11):
        return rows * width + inputs
    padded = max(batched_tokens, tower.max_item_tokens) if version < (0, 12) else tower.max_item_tokens
    return (padded * width if padded > rows else 0) + rows * width + inputs
