"""Mixture-of-experts fields of a config.json."""

from __future__ import annotations

from kvplan.specs.hf.reader import Reader


def read_moe(r: Reader, top: dict) -> dict | None:
    experts = r.int("num_local_experts", "n_routed_experts", "num_experts", default=None)
    if not experts or experts <= 1:
        return None
    cfg = r.cfg
    shared = r.int("n_shared_experts", default=None, minimum=0)
    shared_size = r.int("shared_expert_intermediate_size", default=None)
    if shared is None:
        shared = 1 if shared_size or str(cfg.get("model_type", "")).startswith("llama4") else 0
    expert_size = r.int("moe_intermediate_size", "intermediate_size")
    step = r.int("moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step", default=1)
    return {
        "num_experts": experts,
        "experts_per_token": r.int("num_experts_per_tok", "experts_per_token", "moe_topk"),
        "shared_experts": shared,
        "expert_intermediate_size": expert_size,
        "shared_expert_intermediate_size": shared_size,
        "first_dense_layers": r.int("first_k_dense_replace", default=0, minimum=0),
        "layer_step": step,
    }
