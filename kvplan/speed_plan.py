"""Decode and prefill figures of a plan: the speed model (speed.py) fed with the plan's numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvplan import speed
from kvplan.formats import Format
from kvplan.params import ParamBreakdown
from kvplan.specs.models import HeadLayer, LatentAttention, ModelSpec
from kvplan.weights import StageWeights

if TYPE_CHECKING:
    from kvplan.plan import AvgContext
    from kvplan.request import PlanRequest


@dataclass(frozen=True)
class Decode:
    bandwidth_bytes_per_s: float
    bandwidth_source: str
    measured: bool
    inputs: speed.DecodeInputs
    batch_1: speed.StepTime
    at_max_concurrency: speed.StepTime | None
    at_avg_context: speed.StepTime | None


@dataclass(frozen=True)
class Prefill:
    tokens: int
    ms: float
    mfu: float
    peak_dtype: str
    peak_flops_per_gpu: float


def assumed_bandwidth_source(hbm_bytes_per_s: float) -> str:
    """How a datasheet-based decode bandwidth is labelled wherever kvplan prints it."""
    return (
        f"datasheet bandwidth {hbm_bytes_per_s / 1e12:.2f} TB/s x {speed.DEFAULT_EFFICIENCY:.2f} "
        "assumed efficiency (not measured)"
    )


def attention_width(spec: ModelSpec) -> int:
    """Query width of one attention layer (heads x head dim), for attention FLOPs."""
    for layer in spec.layers:
        if isinstance(layer, LatentAttention):
            return spec.num_attention_heads * (layer.nope_dim + layer.qk_rope_head_dim)
        if isinstance(layer, HeadLayer):
            return spec.num_attention_heads * layer.head_dim
    return spec.hidden_size


def plan_speed(
    req: PlanRequest,
    spec: ModelSpec,
    weights: list[StageWeights],
    params: ParamBreakdown,
    w_fmt: Format,
    tp: int,
    pp: int,
    max_len: int,
    max_conc: int,
    per_req_gpu: int,
    avg: AvgContext | None,
) -> tuple[Decode, Prefill]:
    """Decode step time at batch 1 and at the planned concurrency; prefill of one max-length prompt."""
    gpu = req.gpu
    slow = max(weights, key=lambda w: w.bytes_per_gpu)
    if req.decode_bandwidth_bytes_per_s:
        bandwidth = req.decode_bandwidth_bytes_per_s
        source = req.decode_bandwidth_source or "a measured bandwidth"
    else:
        bandwidth = gpu.hbm_bytes_per_s * speed.DEFAULT_EFFICIENCY
        source = assumed_bandwidth_source(gpu.hbm_bytes_per_s)
    moe = spec.moe
    inp = speed.DecodeInputs(
        weight_bytes=slow.bytes_per_gpu,
        expert_bytes=slow.expert_bytes_per_gpu,
        embedding_bytes=slow.embedding_bytes_per_gpu,
        num_experts=moe.num_experts if moe else 0,
        experts_per_token=moe.experts_per_token if moe else 0,
        layers_per_stage=len(slow.layers),
        hidden_size=spec.hidden_size,
        tp=tp,
        pp=pp,
        bandwidth_bytes_per_s=bandwidth,
        link_bytes_per_s=gpu.interconnect.bytes_per_s if gpu.interconnect else gpu.pcie_bytes_per_s,
        bandwidth_half_bytes=req.decode_bandwidth_half_bytes if req.decode_bandwidth_bytes_per_s else 0.0,
    )
    at_avg = None
    if avg is not None and avg.max_concurrency_per_replica:
        at_avg = speed.decode_step(inp, avg.max_concurrency_per_replica, avg.kv_bytes_per_request_per_gpu)
    decode = Decode(
        bandwidth_bytes_per_s=bandwidth,
        bandwidth_source=source,
        measured=req.decode_bandwidth_bytes_per_s is not None,
        inputs=inp,
        batch_1=speed.decode_step(inp, 1, per_req_gpu),
        at_max_concurrency=speed.decode_step(inp, max_conc, per_req_gpu) if max_conc else None,
        at_avg_context=at_avg,
    )
    fp8 = w_fmt.name == "fp8" and gpu.fp8_dense_flops is not None
    peak = gpu.fp8_dense_flops if fp8 and gpu.fp8_dense_flops is not None else gpu.bf16_dense_flops
    seconds = speed.prefill_seconds(params.active, max_len, spec.num_layers, attention_width(spec), tp, peak)
    return decode, Prefill(max_len, seconds * 1e3, speed.PREFILL_MFU, "fp8" if fp8 else "bf16", peak)
