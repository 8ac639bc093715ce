"""Parameter counts: from the spec when it states them, else from the architecture.

Embedding and LM head are kept apart (they are split and placed differently
under TP/PP, and tied checkpoints store them once); routed experts are kept
apart (they can be stored in another dtype, and only top-k are read per token).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.specs.models import (
    CrossAttention,
    HeadLayer,
    LatentAttention,
    ModelSpec,
    RecurrentState,
    SharedKV,
)


@dataclass(frozen=True)
class ParamBreakdown:
    embedding: int  # vocab x hidden (input embedding)
    lm_head: int  # 0 when tied to the embedding
    routed_experts: int  # all routed experts of all MoE layers
    body: int  # everything else: attention, dense MLPs, shared experts, norms, routers
    total_stated: bool  # True when the spec states the total and `body` was solved from it
    active: int  # parameters read per token (MoE: top-k experts only)

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.routed_experts + self.body


def _attention_params(spec: ModelSpec, layer) -> int:
    h, heads = spec.hidden_size, spec.num_attention_heads
    if isinstance(layer, (*HeadLayer, CrossAttention)):
        q_dim = heads * layer.head_dim
        return h * q_dim + h * layer.num_kv_heads * (layer.head_dim + layer.v_dim) + heads * layer.v_dim * h
    if isinstance(layer, LatentAttention):
        nope, v = layer.nope_dim, layer.value_dim
        qk = nope + layer.qk_rope_head_dim
        q = (h * layer.q_lora_rank + layer.q_lora_rank * heads * qk) if layer.q_lora_rank else h * heads * qk
        kv = h * layer.latent_dim + layer.kv_lora_rank * heads * (nope + v)
        return q + kv + heads * v * h
    if isinstance(layer, SharedKV):  # own Q and O only
        d = layer.head_dim or spec.hidden_size // heads
        return 2 * h * heads * d
    if isinstance(layer, RecurrentState):
        return state_mixer_params(h, layer)
    return 0


def state_mixer_params(h: int, layer: RecurrentState) -> int:
    """Weights of a recurrent mixer from its state's tensors (the projections into and out of it;
    the layouts of vLLM's mamba_mixer2.py, mamba_mixer.py, qwen3_next.py GatedDeltaNet, short_conv.py)."""
    conv_in = layer.conv_channels + layer.conv_groups * layer.conv_group_channels
    conv = conv_in * layer.conv_kernel
    inner = layer.ssm_heads * layer.ssm_head_dim  # the mixer's output width
    if layer.mixer == "mamba2":  # in_proj to z, x, B, C, dt; conv; A, D, dt_bias, norm; out_proj
        return h * (inner + conv_in + layer.ssm_heads) + conv + 3 * layer.ssm_heads + inner + inner * h
    if layer.mixer == "mamba1":  # in_proj (x, z); conv; x_proj (dt, B, C); dt_proj; A; D; out_proj
        dt_rank = -(-h // 16)
        n = layer.ssm_state_dim
        return (
            2 * h * inner + conv + inner * (dt_rank + 2 * n) + dt_rank * inner + inner * n + inner + inner * h
        )
    if layer.mixer == "gdn":  # in_proj q, k, v, z and b, a; conv; A, dt_bias; norm; out_proj
        return (
            h * (conv_in + inner + 2 * layer.ssm_heads)
            + conv
            + 2 * layer.ssm_heads
            + layer.ssm_head_dim
            + inner * h
        )
    if layer.mixer == "short_conv":  # in_proj (B, C, x); conv; out_proj
        return 3 * h * layer.conv_channels + conv + layer.conv_channels * h
    if layer.mixer in ("linear", "kda"):  # q, k, v, gate and out projections
        return 5 * h * inner
    return 4 * h * h  # a stated state size only: count it like a dense attention block


def is_moe_layer(spec: ModelSpec, index: int) -> bool:
    return spec.moe is not None and spec.mlp_kind(index) == "moe"


def architecture_params(spec: ModelSpec) -> tuple[int, int, int, int]:
    """(embedding, lm_head, routed_experts, body) counted from the architecture."""
    h = spec.hidden_size
    mlp_mats = 3 if spec.mlp_gated else 2
    embedding = spec.vocab_size * h
    lm_head = 0 if spec.tie_word_embeddings else spec.vocab_size * h
    routed = 0
    body = h  # final norm
    for i, layer in enumerate(spec.layers):
        body += _attention_params(spec, layer) + 2 * h
        moe = spec.moe
        kind = spec.mlp_kind(i)
        if moe is not None and kind == "moe":
            routed += moe.num_experts * mlp_mats * h * moe.expert_intermediate_size
            shared_size = moe.shared_expert_intermediate_size or moe.expert_intermediate_size
            body += moe.shared_experts * mlp_mats * h * shared_size + h * moe.num_experts
        elif kind == "dense" and spec.intermediate_sizes:  # per-layer widths (DeciLM ffn_mult, Gemma-3n)
            body += mlp_mats * h * spec.intermediate_sizes[i]
        elif kind == "dense" and spec.intermediate_size:
            body += mlp_mats * h * spec.intermediate_size
    return embedding, lm_head, routed, body


def param_breakdown(spec: ModelSpec) -> ParamBreakdown:
    embedding, lm_head, routed, body = architecture_params(spec)
    stated = spec.total_params is not None
    if stated:
        assert spec.total_params is not None
        # Trust the stated total; the architecture only tells how it divides.
        body = max(spec.total_params - embedding - lm_head - routed, 0)
    total = embedding + lm_head + routed + body
    if spec.active_params is not None:
        active = spec.active_params
    elif spec.moe is not None and routed:
        active = total - routed + routed * spec.moe.experts_per_token // spec.moe.num_experts
    else:
        active = total
    return ParamBreakdown(embedding, lm_head, routed, body, stated, active)
