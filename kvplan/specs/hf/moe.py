"""Mixture-of-experts fields of a config.json.

Zero means none (`shared_expert_intermediate_size: 0`, Qwen3-Coder); per-layer 0/1 lists
(`moe_layer_freq` in MiMo-V2-Flash and MiniMax-M3) become the leading dense layers when they are
zeros then ones, and are refused in one line otherwise.
"""

from __future__ import annotations

from kvplan.specs.hf.reader import Reader


def _dense_prefix(r: Reader, key: str, flags: list, num_layers: int) -> int | None:
    """Leading dense layers of a per-layer MoE flag list (0 dense, 1 MoE), or None (refused)."""
    if len(flags) != num_layers or any(f not in (0, 1) or isinstance(f, bool) for f in flags):
        r.bad(key, f"expected {num_layers} per-layer 0/1 flags")
        return None
    first = flags.index(1) if 1 in flags else num_layers
    if any(f != 1 for f in flags[first:]):
        r.bad(
            key,
            "dense layers after the first MoE layer are not modelled (only leading dense layers); describe the "
            "model in a YAML spec (model_specs/models/)",
        )
        return None
    return first


# transformers' per-layer MLP kinds (GLM-5.x `glm_moe_dsa`, EXAONE-MoE, Kimi-Linear): "dense" an MLP,
# "sparse" the MoE block (src/transformers/models/glm_moe_dsa/configuration_glm_moe_dsa.py: "MLP type
# pattern for each layer (`"dense"` or `"sparse"`). Defaults to 3 dense + rest sparse"; its decoder
# layer builds the MoE where `config.mlp_layer_types[layer_idx] == "sparse"`)
_MLP_KINDS = {"dense": 0, "sparse": 1}


def _layer_placement(r: Reader) -> tuple[int, int]:
    """(first_dense_layers, layer_step)."""
    first = r.int("first_k_dense_replace", default=0, minimum=0) or 0
    layers = r.int("num_hidden_layers", default=None)
    if layers is not None and first >= layers:
        r.bad("first_k_dense_replace", f"{first} leaves no MoE layer among the {layers} layers")
    only = r.list("mlp_only_layers")
    if only:
        # Qwen2/3-MoE's (and Laguna's) layers with a dense MLP instead of the experts (transformers
        # modeling_qwen3_moe.py Qwen3MoeDecoderLayer: `layer_idx not in config.mlp_only_layers`)
        n = layers if layers is not None else max(only) + 1
        if any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < n for x in only):
            r.bad("mlp_only_layers", f"expected layer indices from 0 to {n - 1}")
            return first, 1
        if r.int("decoder_sparse_step", default=1) != 1:
            r.bad("mlp_only_layers", "with decoder_sparse_step above 1 is not modelled; describe the model "
                  "in a YAML spec (model_specs/models/)")  # fmt: skip
            return first, 1
        dense = _dense_prefix(r, "mlp_only_layers", [0 if i in only else 1 for i in range(n)], n)
        if dense is None:
            return first, 1
        if r.has("first_k_dense_replace") and dense != first:
            r.bad("mlp_only_layers", f"{dense} leading dense layers but first_k_dense_replace is {first}")
        first = dense
    kinds = r.list("mlp_layer_types")
    if kinds is not None:
        n = r.int("num_hidden_layers", default=len(kinds))
        if len(kinds) != n or any(not isinstance(k, str) or k not in _MLP_KINDS for k in kinds):
            r.bad("mlp_layer_types", f'expected {n} per-layer entries, each "dense" or "sparse"')
            return first, 1
        flags = [_MLP_KINDS[k] for k in kinds]
        dense = _dense_prefix(r, "mlp_layer_types", flags, n)
        if dense is not None and (r.has("first_k_dense_replace") or only) and dense != first:
            given = "mlp_only_layers gives" if only else "first_k_dense_replace is"
            r.bad("mlp_layer_types", f"{dense} leading dense layers but {given} {first}")
        return (dense or 0), 1
    freq = r.cfg.get("moe_layer_freq")
    if isinstance(freq, list):
        dense = _dense_prefix(r, "moe_layer_freq", freq, r.int("num_hidden_layers", default=len(freq)))
        if dense is not None and r.has("first_k_dense_replace") and dense != first:
            r.bad("moe_layer_freq", f"{dense} leading dense layers but first_k_dense_replace is {first}")
        return (dense or 0), 1
    step = r.int("moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step", default=1)
    return first, step


# families whose layer is a dense MLP when the config has one expert: vllm/model_executor/models/jamba.py v0.11.0
# JambaDecoderLayer (`if num_experts > 1: JambaMoE`), hunyuan_v1.py v0.11.0 _is_moe (`num_experts > 1`)
_ONE_EXPERT_IS_DENSE = ("jamba", "hunyuan")
_ZERO_EXPERTS_IS_DENSE = ("qwen2_moe", "qwen3_moe")
_EXPERTS = ("num_local_experts", "n_routed_experts", "num_experts")
_TOP_K = ("num_experts_per_tok", "experts_per_token", "moe_topk", "top_k_experts")


def _named(r: Reader, keys: tuple[str, ...]) -> str:
    """The key a value was read from (the first present), for a message about it."""
    return next((k for k in keys if r.has(k)), keys[0])


def read_moe(r: Reader, top: dict, notes: list[str] | None = None) -> dict | None:
    family = str(r.cfg.get("model_type") or "")
    # qwen2_moe.py / qwen3_moe.py v0.11.0 build a dense MLP where `config.num_experts > 0` fails: 0 is dense there
    zero_is_dense = family.startswith(_ZERO_EXPERTS_IS_DENSE)
    experts = r.int(*_EXPERTS, default=None, minimum=0 if zero_is_dense else 1)
    if not experts or r.cfg.get("enable_moe_block") is False:
        return None
    if experts == 1 and family.startswith(_ONE_EXPERT_IS_DENSE):
        return None
    top_k = r.int(*_TOP_K)
    if top_k and top_k > experts:  # torch.topk of the router's `experts` scores cannot pick more
        routed = f"{experts} routed expert{'s' * (experts != 1)}"
        r.bad(_named(r, _TOP_K), f"{top_k} experts a token, but {r.prefix}{_named(r, _EXPERTS)} gives {routed}; "
              "fix the config")  # fmt: skip
        return None
    if experts == 1 and notes is not None:
        # vLLM builds the MoE block whatever the count: mixtral.py v0.11.0 MixtralMoE (FusedMoE(num_experts=
        # config.num_local_experts)), deepseek_v2.py (`config.n_routed_experts is not None`), qwen2_moe.py and
        # qwen3_moe.py (`config.num_experts > 0`); planned as it builds it, one expert and its router
        notes.append(
            f"{r.prefix}{_named(r, _EXPERTS)} 1: planned as vLLM builds it, an MoE layer of one routed expert "
            "(and its router), not a dense MLP"
        )
    cfg = r.cfg
    shared = r.int("n_shared_experts", "num_shared_experts", default=None, minimum=0)
    shared_size = r.int(
        "shared_expert_intermediate_size",
        "shared_intermediate_size",
        "moe_shared_expert_intermediate_size",
        default=None,
        minimum=0,
    )
    if cfg.get("enable_moe_block") is True:
        # Gemma 4: the dense MLP runs beside the routed experts in every layer (vLLM gemma4.py), a shared expert
        shared, shared_size = 1, r.int("intermediate_size")
    if shared is None:
        shared = 1 if shared_size or str(cfg.get("model_type", "")).startswith("llama4") else 0
    expert_size = r.int("moe_intermediate_size", "expert_intermediate_size", "intermediate_size")
    first, step = _layer_placement(r)
    return {
        "num_experts": experts,
        "experts_per_token": top_k,
        "shared_experts": shared if shared_size != 0 else 0,
        "expert_intermediate_size": expert_size,
        "shared_expert_intermediate_size": shared_size or None,
        "expert_hidden_size": r.int("moe_latent_size", default=None),
        "first_dense_layers": first,
        "layer_step": step,
    }
