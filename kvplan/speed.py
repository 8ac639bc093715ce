"""Decode and prefill speed: a decode step reads the weights and every live token's K and V.

Step time per GPU = (weight bytes read + KV bytes read) / effective bandwidth + tensor-parallel
all-reduces + a per-step overhead; pipeline stages run one after another for a token. The
effective bandwidth is the datasheet figure times an assumed efficiency until `kvplan
calibrate` measures the local GPU. Pure functions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# kernels.md: the best decode kernels reach 84-89% of datasheet bandwidth at batch >= 64 on
# H100/A100 (FlashInfer), under 25% at batch 1 with short contexts; weight GEMVs stream at
# similar rates. 0.80 is kvplan's assumption until a calibration profile replaces it.
DEFAULT_EFFICIENCY = 0.80
STEP_OVERHEAD_S = 0.2e-3  # scheduling, sampling and launches with CUDA graphs (estimated)
ALLREDUCE_LATENCY_S = 8e-6  # one NVLink all-reduce of a small message (estimated)
PREFILL_MFU = 0.5  # share of dense bf16/fp8 peak a long prefill reaches (estimated)


@dataclass(frozen=True)
class DecodeInputs:
    """What one GPU of the slowest pipeline stage holds and streams."""

    weight_bytes: int
    expert_bytes: int
    embedding_bytes: int
    num_experts: int  # 0 for dense models
    experts_per_token: int
    layers_per_stage: int
    hidden_size: int
    tp: int
    pp: int
    bandwidth_bytes_per_s: float  # effective per GPU; with a half-bytes, the measured curve's peak
    link_bytes_per_s: float  # GPU-to-GPU (NVLink, else PCIe from the GPU spec), for TP all-reduces
    bandwidth_half_bytes: float = 0.0  # measured curve: bandwidth(B) = peak x B / (B + half)


@dataclass(frozen=True)
class StepTime:
    batch: int
    weight_bytes_read: int
    kv_bytes_read: int
    memory_ms: float
    communication_ms: float
    overhead_ms: float
    tpot_ms: float
    tokens_per_s: float  # per replica

    def to_dict(self) -> dict:
        return asdict(self)


def experts_touched(batch: int, num_experts: int, top_k: int) -> float:
    """Expected fraction of a layer's routed experts that `batch` tokens touch: 1 - (1 - k/E)^batch."""
    if not num_experts:
        return 1.0
    return 1.0 - (1.0 - top_k / num_experts) ** batch


def decode_step(inp: DecodeInputs, batch: int, kv_bytes_per_request: int) -> StepTime:
    """One decode step for `batch` requests of one replica, each holding `kv_bytes_per_request` per GPU."""
    touched = experts_touched(batch, inp.num_experts, inp.experts_per_token)
    weights = inp.weight_bytes - inp.embedding_bytes - round(inp.expert_bytes * (1.0 - touched))
    kv_read = batch * kv_bytes_per_request
    streamed = weights + kv_read
    bandwidth = inp.bandwidth_bytes_per_s * streamed / (streamed + inp.bandwidth_half_bytes)
    memory_s = streamed / bandwidth
    comm_s = 0.0
    if inp.tp > 1:
        # two all-reduces of batch x hidden bf16 activations per layer (attention and MLP outputs)
        msg = batch * inp.hidden_size * 2
        per = ALLREDUCE_LATENCY_S + 2 * msg * (inp.tp - 1) / inp.tp / inp.link_bytes_per_s
        comm_s = 2 * inp.layers_per_stage * per
    tpot_s = inp.pp * (memory_s + comm_s) + STEP_OVERHEAD_S
    return StepTime(
        batch=batch,
        weight_bytes_read=weights,
        kv_bytes_read=kv_read,
        memory_ms=inp.pp * memory_s * 1e3,
        communication_ms=inp.pp * comm_s * 1e3,
        overhead_ms=STEP_OVERHEAD_S * 1e3,
        tpot_ms=tpot_s * 1e3,
        tokens_per_s=batch / tpot_s,
    )


def prefill_seconds(
    active_params: int,
    tokens: int,
    num_layers: int,
    attention_width: int,
    gpus: int,
    flops_per_gpu: float,
    mfu: float = PREFILL_MFU,
) -> float:
    """One prompt of `tokens` on one replica: 2 x active params per token plus causal attention
    (2 x 2 x T^2 / 2 x layers x heads x head_dim), at `mfu` of the replica's dense peak."""
    flops = 2 * active_params * tokens + 2 * tokens * tokens * num_layers * attention_width
    return flops / (gpus * flops_per_gpu * mfu)
