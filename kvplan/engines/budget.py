"""Memory left for the KV cache on one GPU: card x utilization - weights - reserve."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvplan.specs.models import ModelSpec
from kvplan.units import GiB

# The CUDA graph memory an engine subtracts where it does (vLLM >= 0.20 subtracts its own estimate,
# from capturing the two largest graphs): 0.14 GiB in a real 0.22.1 log (Qwen3-30B-A3B on one H100,
# the fitting half of benchmarks/log_predictions.py); check-log measures the real figure for a setup.
CUDA_GRAPH_BYTES = int(0.14 * GiB)


@dataclass(frozen=True)
class Reserve:
    """Non-weight, non-KV memory of one GPU during the engine's profiling run.

    The forward pass (`activation_bytes`) and the sampler (`sampler_bytes`, with the forward's output
    `hidden_bytes` still alive) run one after the other, so the profiled peak is the larger of the two."""

    activation_bytes: int
    sampler_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    given: bool  # True when the user stated the reserve (then only `total` matters)
    hidden_bytes: int = 0
    sequential: bool = True  # False: kvplan's rule before vLLM 0.10, forward and sampler added
    encoder_cache_bytes: int = 0  # a multimodal model's dummy encoder outputs and inputs, held through both

    @property
    def peak_bytes(self) -> int:
        if not self.sequential:
            return self.activation_bytes + self.sampler_bytes
        return max(self.activation_bytes, self.sampler_bytes + self.hidden_bytes) + self.encoder_cache_bytes

    @property
    def total(self) -> int:
        return self.peak_bytes + self.non_torch_bytes + self.cuda_graph_bytes


def given_reserve(total: int) -> Reserve:
    return Reserve(total, 0, 0, 0, given=True)


def forward_activation_bytes(spec: ModelSpec, tp: int, tokens: int, act_bytes: int) -> int:
    """The widest point of a layer for `tokens` tokens: the hidden state a few times plus the MLP's
    gate/up and activated outputs on this rank."""
    h = spec.hidden_size
    mlp_width = spec.intermediate_size or 4 * h
    if spec.moe is not None:
        routed = spec.moe.experts_per_token * spec.moe.expert_intermediate_size
        shared = spec.moe.shared_experts * (
            spec.moe.shared_expert_intermediate_size or spec.moe.expert_intermediate_size
        )
        mlp_width = max(mlp_width if spec.moe.first_dense_layers else 0, routed + shared)
    return tokens * act_bytes * (4 * h + 3 * math.ceil(mlp_width / tp))


def estimate_reserve(
    spec: ModelSpec,
    tp: int,
    max_num_batched_tokens: int,
    act_bytes: int,
    *,
    sampler_rows: int,
    sampler_bytes_per_logit: float,
    non_torch: int,
    cuda_graphs: int,
    sequential: bool = True,
    encoder_cache: int = 0,
) -> Reserve:
    """The profiling run's reserve: the forward over `max_num_batched_tokens` tokens, the sampler over
    `sampler_rows` rows of the vocabulary at `sampler_bytes_per_logit`, plus the engine's non-torch
    memory and CUDA graphs."""
    return Reserve(
        forward_activation_bytes(spec, tp, max_num_batched_tokens, act_bytes),
        round(sampler_rows * spec.vocab_size * sampler_bytes_per_logit),
        non_torch,
        cuda_graphs,
        given=False,
        hidden_bytes=max_num_batched_tokens * spec.hidden_size * act_bytes,
        sequential=sequential,
        encoder_cache_bytes=encoder_cache,
    )


def requested_bytes(memory_bytes: int, utilization: float) -> int:
    # vLLM (vllm/v1/worker/gpu_worker.py at v0.11.0): requested = ceil(total_gpu_memory * gpu_memory_utilization)
    return math.ceil(memory_bytes * utilization)
