"""Memory left for the KV cache on one GPU: card x utilization - weights - reserve."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvplan.specs.models import ModelSpec
from kvplan.units import GiB

# Constants of the serving runtime, all labelled "estimated" in the output; `kvplan check-log`
# measures the real figure for a setup and replaces them. Non-torch memory (cuBLAS/NCCL
# workspaces, allocator slack) as vLLM's profiler reports it, per GPU:
# - before 0.7: 1.79 GiB on one H100, 3.58 GiB per GPU at TP 2 (vLLM PR 10511's sanity logs);
# - from 0.7 on: 0.16-0.20 GiB on one GPU (vLLM PR 12126 and issue logs); NCCL/custom
#   all-reduce buffers with TP/PP > 1 are a rough 1 GiB more (no public log pins it down).
NON_TORCH_BYTES_SINGLE = int(0.2 * GiB)
NCCL_BYTES = int(1.0 * GiB)
NON_TORCH_BYTES_V06 = int(1.79 * GiB)
CUDA_GRAPH_BYTES = int(0.5 * GiB)
SAMPLER_FP32_COPIES = 3  # logits, probabilities, a sort/top-k buffer
PROFILE_NUM_SEQS = 256  # sequences the engine's dummy sampler run uses


@dataclass(frozen=True)
class Reserve:
    activation_bytes: int
    sampler_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    given: bool  # True when the user stated the reserve (then only `total` matters)

    @property
    def total(self) -> int:
        return self.activation_bytes + self.sampler_bytes + self.non_torch_bytes + self.cuda_graph_bytes


def estimate_reserve(
    spec: ModelSpec,
    tp: int,
    pp: int,
    max_num_batched_tokens: int,
    act_bytes: int,
    cuda_graphs: bool = True,
    version: tuple[int, int] = (0, 33),
    num_seqs: int = PROFILE_NUM_SEQS,
) -> Reserve:
    """Peak non-weight, non-KV memory of one GPU during the engine's profiling forward pass.

    Activations: the widest point of a layer for `max_num_batched_tokens` tokens, the
    hidden state a few times plus the MLP's gate/up and activated outputs on this rank.
    Sampler: fp32 logits over the vocabulary for the profiling batch of `num_seqs` sequences.
    """
    h = spec.hidden_size
    mlp_width = spec.intermediate_size or 4 * h
    if spec.moe is not None:
        routed = spec.moe.experts_per_token * spec.moe.expert_intermediate_size
        shared = spec.moe.shared_experts * (
            spec.moe.shared_expert_intermediate_size or spec.moe.expert_intermediate_size
        )
        mlp_width = max(mlp_width if spec.moe.first_dense_layers else 0, routed + shared)
    per_token = act_bytes * (4 * h + 3 * math.ceil(mlp_width / tp))
    activation = max_num_batched_tokens * per_token
    sampler = num_seqs * spec.vocab_size * 4 * SAMPLER_FP32_COPIES
    if version < (0, 7):
        non_torch = NON_TORCH_BYTES_V06 * (2 if tp * pp > 1 else 1)
    else:
        non_torch = NON_TORCH_BYTES_SINGLE + (NCCL_BYTES if tp * pp > 1 else 0)
    # CUDA graphs count only where the engine subtracts them (vLLM >= 0.21, not --enforce-eager)
    return Reserve(activation, sampler, non_torch, CUDA_GRAPH_BYTES if cuda_graphs else 0, given=False)


def requested_bytes(memory_bytes: int, utilization: float) -> int:
    # engines.md (vLLM): requested = ceil(total_gpu_memory * gpu_memory_utilization)
    return math.ceil(memory_bytes * utilization)
