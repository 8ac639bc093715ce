"""Reading a Hugging Face config.json offline into a ModelSpec.

The KV size comes only from the config's fields (explicit head_dim, layer_types,
sliding-window patterns, MLA ranks); never from the model's name or size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvplan.errors import SpecError
from kvplan.specs.io import validate
from kvplan.specs.models import ModelSpec

_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "half": "fp16"}


class _Reader:
    """Typed field access that collects every problem instead of stopping at the first."""

    def __init__(self, cfg: dict, path: Path, prefix: str = "") -> None:
        self.cfg, self.path, self.prefix = cfg, path, prefix
        self.problems: list[str] = []

    def _bad(self, key: str, msg: str) -> None:
        self.problems.append(f"{self.path}: {self.prefix}{key}: {msg}")

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def int(self, *keys: str, default: Any = ..., minimum: int = 1) -> Any:
        for key in keys:
            value = self.cfg.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                self._bad(key, f"expected an integer, got {value!r}")
                return None
            if value < minimum:
                self._bad(key, f"must be >= {minimum}, got {value}")
                return None
            return value
        if default is ...:
            self._bad(keys[0], "required field is missing")
            return None
        return default

    def bool(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self._bad(key, f"expected true/false, got {value!r}")
            return default
        return value

    def list(self, key: str) -> list | None:
        value = self.cfg.get(key)
        if value is None:
            return None
        if not isinstance(value, list):
            self._bad(key, f"expected a list, got {type(value).__name__}")
            return None
        return value


def model_from_config(cfg: Any, path: Path) -> ModelSpec:
    if not isinstance(cfg, dict):
        raise SpecError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    top = cfg
    prefix = ""
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers (Llama 4, Gemma 3)
        cfg = {**{k: v for k, v in top.items() if k != "text_config"}, **cfg["text_config"]}
        prefix = "text_config."
    r = _Reader(cfg, path, prefix)
    notes: list[str] = [f"read from {path}; parameter count estimated from the architecture"]

    num_layers = r.int("num_hidden_layers", "n_layer", "num_layers")
    hidden = r.int("hidden_size", "n_embd", "d_model")
    heads = r.int("num_attention_heads", "n_head", "num_heads")
    vocab = r.int("vocab_size", "padded_vocab_size")
    max_context = r.int("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
    if r.cfg.get("multi_query") is True and not r.has("num_kv_heads"):
        kv_heads = 1
    else:
        kv_heads = r.int("num_key_value_heads", "num_kv_heads", "n_head_kv", default=heads)
    head_dim = r.int("head_dim", default=None)
    if head_dim is None and hidden and heads:
        if hidden % heads:
            r._bad("head_dim", f"missing, and hidden_size {hidden} is not divisible by {heads} heads")
        head_dim = hidden // heads

    layer_types: dict[str, dict] = {}
    pattern: list[str] = []
    if r.has("kv_lora_rank"):  # MLA (DeepSeek-V2/V3, Kimi K2)
        layer_types["mla"] = {
            "kind": "mla",
            "kv_lora_rank": r.int("kv_lora_rank"),
            "qk_rope_head_dim": r.int("qk_rope_head_dim"),
            "qk_nope_head_dim": r.int("qk_nope_head_dim", default=None),
            "v_head_dim": r.int("v_head_dim", default=None),
            "q_lora_rank": r.int("q_lora_rank", default=None),
        }
        pattern = ["mla"] * (num_layers or 1)
    else:
        head = {"num_kv_heads": kv_heads, "head_dim": head_dim}
        if r.has("v_head_dim"):
            head["head_dim_v"] = r.int("v_head_dim")
        pattern = _attention_pattern(r, num_layers or 0, head, layer_types, notes)

    moe = _moe(r, top)
    quant = top.get("quantization_config") or cfg.get("quantization_config") or {}
    weight_dtype, expert_dtype = _weight_dtypes(quant, notes)
    raw_dtype = top.get("torch_dtype") or top.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    act = _DTYPES.get(str(raw_dtype), None)
    if act is None:
        notes.append(f"torch_dtype {raw_dtype!r} not recognised; activations assumed bf16")
        act = "bf16"
    elif act == "fp32":
        notes.append("checkpoint is float32; served in bf16 as engines do by default")
        act = "bf16"
    if weight_dtype is None:
        weight_dtype = act

    if r.problems:
        raise SpecError("\n".join(r.problems))

    name = str(top.get("_name_or_path") or path.resolve().parent.name or path.stem)
    archs = top.get("architectures")
    spec: dict[str, Any] = {
        "name": name,
        "display_name": name,
        "architecture": str(archs[0]) if isinstance(archs, list) and archs else None,
        "sources": [str(path)],
        "notes": notes,
        "num_layers": num_layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "intermediate_size": r.int("intermediate_size", "ffn_hidden_size", "n_inner", default=None),
        "mlp_gated": str(cfg.get("hidden_act", "silu")) not in ("gelu", "gelu_new", "relu")
        or cfg.get("model_type") in ("gemma", "gemma2", "gemma3_text"),
        "vocab_size": vocab,
        "tie_word_embeddings": bool(top.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        "max_context": max_context,
        "moe": moe,
        "weight_dtype": weight_dtype,
        "expert_weight_dtype": expert_dtype if moe else None,
        "activation_dtype": act,
        "layer_types": layer_types,
        "layer_pattern": pattern,
    }
    if r.problems:
        raise SpecError("\n".join(r.problems))
    return validate(ModelSpec, spec, path)


def _attention_pattern(
    r: _Reader, num_layers: int, head: dict, layer_types: dict, notes: list[str]
) -> list[str]:
    window = r.int("sliding_window", default=None)
    model_type = str(r.cfg.get("model_type", ""))
    full = {"kind": "full", **head}
    types = r.list("layer_types")
    if types is not None:
        if len(types) != num_layers:
            r._bad("layer_types", f"has {len(types)} entries but num_hidden_layers is {num_layers}")
            return ["full"]
        out = []
        for i, t in enumerate(types):
            if t == "full_attention":
                layer_types["full"] = full
                out.append("full")
            elif t == "sliding_attention":
                if window is None:
                    r._bad("sliding_window", f"layer_types[{i}] is sliding_attention but no window is set")
                    return ["full"]
                layer_types["sliding"] = {"kind": "sliding", "window": window, **head}
                out.append("sliding")
            elif t == "chunked_attention":
                chunk = r.int("attention_chunk_size")
                layer_types["chunked"] = {"kind": "chunked", "chunk": chunk, **head}
                out.append("chunked")
            else:
                r._bad(
                    f"layer_types[{i}]",
                    f"layer type {t!r} is not supported from config.json; describe the model in a "
                    "YAML spec (see model_specs/models/) with a `state` or `none` layer",
                )
                return ["full"]
        return out

    if r.has("attention_chunk_size"):  # Llama 4: chunked RoPE layers, every Nth layer global NoPE
        chunk = r.int("attention_chunk_size")
        layer_types["chunked"] = {"kind": "chunked", "chunk": chunk, **head}
        layer_types["full"] = full
        no_rope = r.list("no_rope_layers")
        if no_rope is not None and len(no_rope) == num_layers:
            return ["chunked" if flag else "full" for flag in no_rope]
        interval = r.int("no_rope_layer_interval", default=4)
        return ["full" if (i + 1) % interval == 0 else "chunked" for i in range(num_layers)]

    pattern_every = r.int("sliding_window_pattern", "_sliding_window_pattern", default=None)
    if window is not None and pattern_every:  # Gemma 3: N-1 local then 1 global
        layer_types["sliding"] = {"kind": "sliding", "window": window, **head}
        layer_types["full"] = full
        return ["full" if (i + 1) % pattern_every == 0 else "sliding" for i in range(num_layers)]
    if window is not None and model_type == "gemma2":  # Gemma 2: alternate, local first
        layer_types["sliding"] = {"kind": "sliding", "window": window, **head}
        layer_types["full"] = full
        return ["sliding", "full"]
    if window is not None and r.cfg.get("use_sliding_window") is not False:
        if window >= (r.int("max_position_embeddings", default=0) or 0) > 0:
            notes.append(f"sliding_window {window} >= max context: treated as full attention")
        else:
            max_window_layers = r.int("max_window_layers", default=None, minimum=0)
            layer_types["sliding"] = {"kind": "sliding", "window": window, **head}
            if max_window_layers is not None and model_type.startswith("qwen"):
                # Qwen2: layers from max_window_layers on use the window.
                layer_types["full"] = full
                return ["full" if i < max_window_layers else "sliding" for i in range(num_layers)]
            return ["sliding"]
    layer_types["full"] = full
    return ["full"]


def _moe(r: _Reader, top: dict) -> dict | None:
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


def _weight_dtypes(quant: Any, notes: list[str]) -> tuple[str | None, str | None]:
    if not isinstance(quant, dict) or not quant:
        return None, None
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8" or "fp8" in str(quant.get("fmt", "")):
        return "fp8", None
    if method == "mxfp4":  # gpt-oss: MoE experts in MXFP4, the rest unquantized
        return None, "mxfp4"
    bits = quant.get("bits") or quant.get("w_bit")
    if method in ("awq", "gptq", "marlin", "autoround") or bits == 4:
        return "int4", None
    if bits == 8:
        return "int8", None
    notes.append(f"quantization {method or quant!r} not modelled; weights counted at the activation dtype")
    return None, None
