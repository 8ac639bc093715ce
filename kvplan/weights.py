"""Weight bytes per GPU under TP and PP."""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.formats import Format
from kvplan.parallel import stage_ranges
from kvplan.params import ParamBreakdown, is_moe_layer
from kvplan.specs.models import ModelSpec
from kvplan.units import ceil_div


@dataclass(frozen=True)
class StageWeights:
    stage: int
    layers: range
    bytes_per_gpu: int
    expert_bytes_per_gpu: int = 0  # of which routed MoE experts (a decode step reads only those routed to)
    embedding_bytes_per_gpu: int = 0  # of which the input embedding (gathered by row, not streamed)


def param_bytes(num_params: int, fmt: Format) -> int:
    """params x bits per weight (group scales included) / 8."""
    num = num_params * fmt.bits_per_value
    return ceil_div(num.numerator, num.denominator * 8)


def stage_weights(
    spec: ModelSpec,
    params: ParamBreakdown,
    weight_fmt: Format,
    expert_fmt: Format,
    tp: int,
    pp: int,
) -> list[StageWeights]:
    """Weights each GPU of each stage holds.

    Layers are assumed equal in size except for MoE vs dense layers; everything is
    split evenly over TP (vocab-parallel embedding and LM head too). The embedding sits
    on the first stage, the LM head on the last; a tied LM head is stored once when
    PP = 1 and twice (first and last stage) when PP > 1.
    """
    n = spec.num_layers
    moe_layers = [i for i in range(n) if is_moe_layer(spec, i)]
    expert_per_moe_layer = params.routed_experts / len(moe_layers) if moe_layers else 0.0
    body_per_layer = params.body / n
    head_params = params.lm_head if not spec.tie_word_embeddings else params.embedding
    moe_set = set(moe_layers)
    out = []
    for s, stage in enumerate(stage_ranges(n, pp)):
        body = body_per_layer * len(stage)
        experts = expert_per_moe_layer * sum(1 for i in stage if i in moe_set)
        dense = body
        if s == 0:
            dense += params.embedding
        if s == pp - 1 and (not spec.tie_word_embeddings or pp > 1):
            dense += head_params
        expert_bytes = param_bytes(round(experts), expert_fmt)
        total = param_bytes(round(dense), weight_fmt) + expert_bytes
        embedding = param_bytes(params.embedding, weight_fmt) if s == 0 else 0
        out.append(
            StageWeights(s, stage, ceil_div(total, tp), ceil_div(expert_bytes, tp), ceil_div(embedding, tp))
        )
    return out
