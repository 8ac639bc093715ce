"""Hybrid state-space / linear-attention models from a config.json: which layers attend, which
keep a recurrent state, and the state's tensors.

Each family names its layers its own way; the state shapes are those vLLM computes in
vllm/model_executor/layers/mamba/mamba_utils.py from the fields each model class passes
(nemotron_h.py, qwen3_next.py, jamba.py, lfm2.py, granitemoehybrid.py, minimax_text_01.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvplan.errors import SpecError
from kvplan.formats import normalize_dtype_name
from kvplan.specs.hf.family import Basics, Layers
from kvplan.specs.hf.reader import Reader

# Nemotron-H `hybrid_override_pattern`: M = Mamba-2, * = attention, - = MLP, E = MoE (one per layer)
_NEMOTRON_CHARS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def _ssm_dtype(r: Reader) -> str:
    """The SSM state dtype the config states (NemotronH mamba_ssm_cache_dtype, Qwen3.5
    mamba_ssm_dtype); "auto" leaves it to the engine."""
    value = r.cfg.get("mamba_ssm_cache_dtype") or r.cfg.get("mamba_ssm_dtype")
    if value is None:
        return "auto"
    name = normalize_dtype_name(str(value))
    if name not in ("fp32", "fp16", "bf16"):
        r.bad("mamba_ssm_cache_dtype", f"expected float32, float16 or bfloat16, got {value!r}")
        return "auto"
    return name


def mamba2_state(
    r: Reader,
    heads: int | None,
    head_dim: int | None,
    state: int | None,
    groups: int | None,
    kernel: int | None,
) -> dict:
    """vLLM mamba2_state_shape: conv (K-1, (I + 2 G N) / tp) with I = heads x head_dim, SSM (H/tp, P, N).
    A field missing or bad is already one of r.problems: the layer is then a placeholder."""
    if heads is None or head_dim is None or state is None or groups is None or kernel is None:
        return {"kind": "none"}
    return {
        "kind": "state",
        "mixer": "mamba2",
        "conv_channels": heads * head_dim,
        "conv_groups": groups,
        "conv_group_channels": 2 * state,
        "conv_kernel": kernel,
        "ssm_heads": heads,
        "ssm_head_dim": head_dim,
        "ssm_state_dim": state,
        "ssm_dtype": _ssm_dtype(r),
    }


def _nemotron_h(r: Reader, basics: Basics, notes: list[str]) -> list[str] | None:
    """NVIDIA Nemotron-H / Nemotron-3 (NemotronHForCausalLM): one mixer or MLP per layer."""
    text = r.cfg.get("hybrid_override_pattern")
    if isinstance(text, str):
        kinds = []
        for i, ch in enumerate(text):
            if ch not in _NEMOTRON_CHARS:
                r.bad("hybrid_override_pattern", f"character {ch!r} at {i} is not one of M * - E")
                return None
            kinds.append(_NEMOTRON_CHARS[ch])
        return kinds
    blocks = r.cfg.get("layers_block_type")
    if isinstance(blocks, list) and r.cfg.get("mamba_num_heads") is not None:
        bad = sorted({str(b) for b in blocks} - set(_NEMOTRON_CHARS.values()))
        if bad:
            r.bad("layers_block_type", f"unknown block type(s) {', '.join(map(repr, bad))}")
            return None
        return [str(b) for b in blocks]
    return None


def _nemotron_layers(r: Reader, basics: Basics, kinds: list[str], out: Layers) -> None:
    out.layer_types["mamba"] = mamba2_state(
        r,
        r.int("mamba_num_heads"),
        r.int("mamba_head_dim"),
        r.int("ssm_state_size"),
        r.int("n_groups"),
        r.int("conv_kernel"),
    )
    head_dim = r.int("head_dim", "attention_head_dim", default=basics.head_dim)
    out.layer_types["attention"] = {"kind": "full", "num_kv_heads": basics.num_kv_heads, "head_dim": head_dim}
    out.layer_types["mlp"] = {"kind": "none"}
    out.pattern = ["mlp" if k == "moe" else k for k in kinds]
    # nemotron_h.py: MLP and MoE blocks are layers of their own; mixers have no MLP
    out.mlp_pattern = ["dense" if k == "mlp" else "moe" if k == "moe" else "none" for k in kinds]


def _gated_deltanet(r: Reader) -> dict:
    """vLLM gated_delta_net_state_shape (qwen3_next.py): conv (K-1, 2 Hk dk + Hv dv), SSM (Hv, dv, dk)."""
    k_heads, v_heads = r.int("linear_num_key_heads"), r.int("linear_num_value_heads")
    k_dim, v_dim = r.int("linear_key_head_dim"), r.int("linear_value_head_dim")
    return {
        "kind": "state",
        "mixer": "gdn",
        "conv_channels": (2 * k_heads * k_dim + v_heads * v_dim)
        if k_heads and v_heads and k_dim and v_dim
        else 0,
        "conv_kernel": r.int("linear_conv_kernel_dim"),
        "ssm_heads": v_heads,
        "ssm_head_dim": v_dim,
        "ssm_state_dim": k_dim,
        "ssm_dtype": _ssm_dtype(r),
    }


def _short_conv(r: Reader, basics: Basics) -> dict:
    """vLLM short_conv_state_shape (lfm2.py): conv (L_cache - 1, conv_dim / tp), no SSM state."""
    return {
        "kind": "state",
        "mixer": "short_conv",
        "conv_channels": r.int("conv_dim", default=basics.hidden_size),
        "conv_kernel": r.int("conv_L_cache"),
    }


def _granite_mamba(r: Reader, basics: Basics) -> dict:
    """GraniteMoeHybrid / Bamba: mamba2 with I = mamba_expand x hidden_size."""
    heads, head_dim = r.int("mamba_n_heads"), r.int("mamba_d_head")
    expand = r.int("mamba_expand", default=2)
    if heads and head_dim and expand and heads * head_dim != expand * basics.hidden_size:
        r.bad(
            "mamba_d_head", f"mamba_n_heads x mamba_d_head != mamba_expand x hidden_size ({heads}x{head_dim})"
        )
    return mamba2_state(
        r, heads, head_dim, r.int("mamba_d_state"), r.int("mamba_n_groups"), r.int("mamba_d_conv")
    )


def _linear_attention(r: Reader, basics: Basics) -> dict:
    """vLLM linear_attention_state_shape (MiniMax lightning attention): (heads / tp, d, d), no conv."""
    return {
        "kind": "state",
        "mixer": "linear",
        "ssm_heads": basics.num_heads,
        "ssm_head_dim": basics.head_dim,
        "ssm_state_dim": basics.head_dim,
    }


# config.json `layer_types` values for state mixers, per family -> the layer they become
_STATE_TYPES: dict[str, Callable[[Reader, Basics], dict]] = {
    "linear_attention": lambda r, b: _gated_deltanet(r),  # Qwen3-Next / Qwen3.5 / Qwen3.6
    "conv": _short_conv,  # LFM2
    "mamba": _granite_mamba,  # GraniteMoeHybrid, Bamba
}
_ATTENTION_TYPES = {"full_attention", "attention"}


def _typed_layers(r: Reader, basics: Basics, types: list[Any], out: Layers) -> None:
    """A `layer_types` list mixing attention with state mixers."""
    out.layer_types["attention"] = {"kind": "full", **basics.head(r)}
    for i, name in enumerate(types):
        if name in _ATTENTION_TYPES:
            out.pattern.append("attention")
        elif name in _STATE_TYPES:
            if name not in out.layer_types:
                out.layer_types[name] = _STATE_TYPES[name](r, basics)
            out.pattern.append(name)
        else:
            known = ", ".join(sorted(_ATTENTION_TYPES | set(_STATE_TYPES)))
            r.bad(f"layer_types[{i}]", f"layer type {name!r} is not one kvplan can plan ({known})")
            return


def _interval_layers(r: Reader, basics: Basics, out: Layers) -> None:
    """Qwen3-Next: every `full_attention_interval`-th layer attends, the rest are Gated DeltaNet."""
    every = r.int("full_attention_interval")
    out.layer_types["attention"] = {"kind": "full", **basics.head(r)}
    out.layer_types["linear_attention"] = _gated_deltanet(r)
    if every:
        out.pattern = [
            "attention" if (i + 1) % every == 0 else "linear_attention" for i in range(basics.num_layers)
        ]


def _jamba(r: Reader, basics: Basics, out: Layers) -> None:
    """Jamba: layer i attends when i % attn_layer_period == attn_layer_offset; the rest are Mamba-1
    (jamba.py: intermediate = mamba_expand x hidden, state mamba_d_state, conv mamba_d_conv)."""
    period, offset = r.int("attn_layer_period"), r.int("attn_layer_offset", minimum=0)
    inner = r.int("mamba_expand", default=2) * basics.hidden_size
    state = r.int("mamba_d_state", default=16)
    out.layer_types["attention"] = {"kind": "full", **basics.head(r)}
    out.layer_types["mamba"] = {
        "kind": "state",
        "mixer": "mamba1",
        "conv_channels": inner,
        "conv_kernel": r.int("mamba_d_conv", default=4),
        "ssm_heads": inner,
        "ssm_head_dim": 1,
        "ssm_state_dim": state,
    }
    if period:
        out.pattern = ["attention" if i % period == offset else "mamba" for i in range(basics.num_layers)]
    every, first = (
        r.int("expert_layer_period", default=None),
        r.int("expert_layer_offset", default=0, minimum=0),
    )
    experts = r.cfg.get("num_experts")
    # jamba.py: layer i is MoE when i % period == offset, and only with more than one expert (v0.11.0
    # JambaDecoderLayer: `if num_experts > 1: JambaMoE`, else a dense JambaMLP)
    if every and isinstance(experts, int) and not isinstance(experts, bool) and experts > 1:
        out.mlp_pattern = ["moe" if i % every == first else "dense" for i in range(basics.num_layers)]


def _minimax(r: Reader, basics: Basics, types: list[Any], out: Layers) -> None:
    """MiniMax-01 / M1: attn_type_list, 0 = lightning (linear) attention, 1 = softmax attention."""
    out.layer_types["attention"] = {"kind": "full", **basics.head(r)}
    out.layer_types["linear"] = _linear_attention(r, basics)
    for i, t in enumerate(types):
        if t not in (0, 1):
            r.bad(f"attn_type_list[{i}]", f"expected 0 (linear) or 1 (softmax), got {t!r}")
            return
        out.pattern.append("attention" if t == 1 else "linear")


# families whose layers kvplan's per-layer model cannot describe yet: refused in one line
_REFUSED = {
    "falcon_h1": "Falcon-H1 runs attention and Mamba-2 side by side in every layer",
    "zamba2": "Zamba2 shares attention blocks across Mamba layers",
    "mamba": "attention-free Mamba models",
    "mamba2": "attention-free Mamba-2 models",
    "falcon_mamba": "attention-free Mamba models",
    "kimi_linear": "Kimi-Linear's KDA layers beside MLA",
    "kimi_k3": "Kimi K3's KDA (Kimi Linear) layers beside MLA",
}


def read(r: Reader, basics: Basics, notes: list[str]) -> Layers | None:
    model_type = str(r.cfg.get("model_type", ""))
    if model_type.startswith("kimi_k3"):  # kimi_k3_text, ...
        model_type = "kimi_k3"
    elif model_type not in _REFUSED and isinstance(r.cfg.get("linear_attn_config"), dict):
        model_type = "kimi_linear"  # KDA layers, whatever the model_type says
    if model_type in _REFUSED:  # at once, in one line: the family's other fields need not be read
        raise SpecError(
            f"{r.path}: {r.prefix}model_type: {r.cfg.get('model_type')!r}: {_REFUSED[model_type]} are not "
            "planned by kvplan yet; describe the model in a YAML spec (model_specs/models/) to plan it"
        )
    out = Layers()
    known_problems = len(r.problems)
    kinds = _nemotron_h(r, basics, notes)
    types = r.cfg.get("layer_types")
    idxs = r.cfg.get("full_attn_idxs")
    if types is None and model_type == "lfm2" and isinstance(idxs, list) and basics.num_layers:
        # LFM2's original key: Lfm2Config builds layer_types from it ("full_attention" if i in full_attn_idxs
        # else "conv", transformers configuration_lfm2.py)
        r.read.add("full_attn_idxs")
        types = ["full_attention" if i in idxs else "conv" for i in range(basics.num_layers)]
    if kinds is not None:
        _nemotron_layers(r, basics, kinds, out)
    elif isinstance(types, list) and any(t in _STATE_TYPES for t in types):
        r.read.add("layer_types")
        _typed_layers(r, basics, types, out)
    elif r.has("full_attention_interval") and r.has("linear_num_value_heads"):
        _interval_layers(r, basics, out)
    elif r.has("attn_layer_period"):
        _jamba(r, basics, out)
    elif isinstance(r.cfg.get("attn_type_list"), list) and 0 in r.cfg["attn_type_list"]:
        _minimax(r, basics, r.cfg["attn_type_list"], out)
    else:
        return None
    if not out.pattern:
        out.pattern = ["attention"]
    if len(out.pattern) != basics.num_layers and basics.num_layers and len(r.problems) == known_problems:
        r.bad(
            "num_hidden_layers", f"is {basics.num_layers} but the layer pattern has {len(out.pattern)} layers"
        )
    return out
