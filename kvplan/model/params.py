"""Parameter counts: from the spec when it states them, else from the architecture.

Embedding and LM head are kept apart (they are split and placed differently
under TP/PP, and tied checkpoints store them once); routed experts are kept
apart (they can be stored in another dtype, and only top-k are read per token).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import SpecError
from kvplan.specs.matrices import vision_matrices, weight_matrices
from kvplan.specs.models import (
    ModelSpec,
)


@dataclass(frozen=True)
class ParamBreakdown:
    embedding: int  # vocab x hidden (input embedding)
    lm_head: int  # 0 when tied to the embedding
    routed_experts: int  # all routed experts of all MoE layers
    body: int  # everything else: attention, dense MLPs, shared experts, norms, routers
    total_stated: bool  # True when the spec states the total and `body` was solved from it
    active: int  # parameters read per token (MoE: top-k experts only)
    # the GEMM parameters a prompt token passes through, from the architecture: the body less the vision tower
    # (it runs per image) and the top-k share of the routed experts; no input embedding (a gather) nor LM head
    # (run once per prompt); not the stated active figure, whose convention varies (gpt-oss's 3.6B counts its head)
    per_token_gemm: int = 0

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.routed_experts + self.body


def is_moe_layer(spec: ModelSpec, index: int) -> bool:
    return spec.moe is not None and spec.mlp_kind(index) == "moe"


def architecture_params(spec: ModelSpec) -> tuple[int, int, int, int]:
    """(embedding, lm_head, routed_experts, body) counted from the architecture: the sums of
    weight_matrices, so parameter counts and per-matrix weight formats never disagree."""
    sums = {"embedding": 0, "lm_head": 0, "routed_experts": 0}
    body = 0
    for m in weight_matrices(spec):
        if m.component in sums:
            sums[m.component] += m.params
        else:
            body += m.params
    return sums["embedding"], sums["lm_head"], sums["routed_experts"], body


def _check_stated(spec: ModelSpec, arch: int) -> None:
    """A stated total_params is trusted over the architecture's count, so it must be near that count
    (within 2x: compare's variants keep the stated total over a changed attention); active_params cannot
    exceed the total."""
    total = spec.total_params if spec.total_params is not None else arch
    if spec.total_params is not None and not 0.5 * arch <= total <= 2 * arch:
        raise SpecError(
            f"{spec.name}: total_params: {total:,} is far from the {arch:,} the architecture holds (embedding, "
            "layers, LM head); fix it, or drop it to count from the architecture"
        )
    if spec.active_params is not None and spec.active_params > total:
        raise SpecError(f"{spec.name}: active_params: {spec.active_params:,} is above the total, {total:,}")


def param_breakdown(spec: ModelSpec) -> ParamBreakdown:
    embedding, lm_head, routed, body = architecture_params(spec)
    _check_stated(spec, embedding + lm_head + routed + body)
    stated = spec.total_params is not None
    if stated:
        assert spec.total_params is not None
        # Trust the stated total; the architecture only tells how it divides.
        body = max(spec.total_params - embedding - lm_head - routed, 0)
    total = embedding + lm_head + routed + body
    # the vision tower runs per image, not per generated token; a token reads its top-k routed experts
    vision = sum(m.params for m in vision_matrices(spec.vision_tower)) if spec.vision_tower else 0
    top_k = (
        routed * spec.moe.experts_per_token // spec.moe.num_experts if spec.moe is not None and routed else 0
    )
    per_token_gemm = max(0, body - vision) + top_k
    if spec.active_params is not None:
        active = spec.active_params
    else:
        active = total - vision - routed + top_k
    return ParamBreakdown(embedding, lm_head, routed, body, stated, active, per_token_gemm)
