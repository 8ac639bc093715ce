"""Reading a Hugging Face config.json offline into a ModelSpec.

The KV size comes only from the config's fields (explicit head_dim, layer_types,
sliding-window patterns, MLA ranks); never from the model's name or size.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kvplan.errors import SpecError
from kvplan.formats import weight_format
from kvplan.specs.hf import quant as q
from kvplan.specs.hf import vision_tower
from kvplan.specs.hf.family import Basics
from kvplan.specs.hf.layers import read_layers
from kvplan.specs.hf.moe import read_moe
from kvplan.specs.hf.reader import Reader
from kvplan.specs.hf.rope import scaled_max_context
from kvplan.specs.hf.unread import unread_fields
from kvplan.specs.io import validate
from kvplan.specs.models import ModelSpec

# Llama 4 / Gemma / Mllama: text_config; DeepSeek-VL2: language_config; InternVL: llm_config
_NESTED = ("text_config", "language_config", "llm_config")
_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "half": "fp16"}


def _listed_layers(cfg: dict) -> Any:
    """A config that lists its layers instead of counting them (Nemotron-3 `layers_block_type`)."""
    blocks = cfg.get("layers_block_type")
    return len(blocks) if isinstance(blocks, list) and blocks else ...


def _hash_and_per_layer_inputs(
    r: Reader, moe: dict | None, vocab: int, num_layers: int, notes: list[str]
) -> None:
    """Two fields that change no KV cache, said as what they are.

    DeepSeek-V4 `num_hash_layers`: the first N MoE layers pick their experts from a fixed token-id
    table instead of the learned top-k (DeepSeek-V4-Flash inference/model.py, class Gate:
    `self.hash = layer_id < args.n_hash_layers`, `tid2eid` of vocab_size x n_activated_experts int32;
    the gate weight and the experts are as in every MoE layer). Gemma 3n's per-layer inputs:
    `vocab_size_per_layer_input` x (`num_hidden_layers` x `hidden_size_per_layer_input`) embedding
    values (vLLM gemma3n.py `embed_tokens_per_layer`) that kvplan's parameter count leaves out."""
    hashed = r.int("num_hash_layers", default=0, minimum=0) or 0
    if hashed and moe is not None:
        table = hashed * vocab * moe["experts_per_token"] * 4 if moe.get("experts_per_token") else 0
        notes.append(
            f"num_hash_layers: the first {hashed} MoE layers route by a token-id table (DeepSeek-V4 "
            f"hash routing), experts and KV as every MoE layer; the tables' {table / 1e6:,.1f} MB "
            "(vocab x top-k int32) are not counted in the weights"
        )
    width = r.int("hidden_size_per_layer_input", default=0, minimum=0) or 0
    rows = r.int("vocab_size_per_layer_input", default=0, minimum=0) or 0
    if width and rows:
        params = rows * num_layers * width
        notes.append(
            f"WARNING: per-layer input embeddings (vocab_size_per_layer_input {rows:,} x {num_layers} "
            f"layers x hidden_size_per_layer_input {width}: {params / 1e9:,.2f}B parameters, "
            f"{params * 2 / 2**30:,.2f} GiB in bf16) are not counted in the weights"
        )


def _scalar_intermediate(r: Reader, per_layer: list[int]) -> int | None:
    """The dense MLP's width. Llama 4's dense layers take intermediate_size_mlp (intermediate_size is its
    experts'; transformers modeling_llama4.py Llama4TextDecoderLayer; absent, _CLASS_DEFAULTS gives it); LFM2 derives its width from block_ff_dim
    when block_auto_adjust_ff_dim is set (vLLM lfm2.py Lfm2MLP: 2/3, x block_ffn_dim_multiplier, rounded up to
    block_multiple_of)."""
    if per_layer:
        return max(per_layer) or None
    size = r.int(
        "dense_intermediate_size", "intermediate_size_mlp", "intermediate_size", "ffn_hidden_size", "n_inner",
        default=None,
    )  # fmt: skip
    lfm2 = r.cfg.get("model_type") == "lfm2"
    if lfm2 and not size:
        size = r.int("block_ff_dim", default=None)
    # Lfm2Config's default block_auto_adjust_ff_dim is True (transformers writes it only when it differs)
    if size and r.cfg.get("block_auto_adjust_ff_dim", lfm2) is True:
        ff = int(2 * (r.int("block_ff_dim", default=None) or size) / 3)
        mult = r.cfg.get("block_ffn_dim_multiplier")
        if isinstance(mult, (int, float)) and not isinstance(mult, bool) and mult > 0:
            ff = int(mult * ff)
        step = r.int("block_multiple_of", default=None) or 1
        size = step * -(-ff // step)
    return size


# a checkpoint's name that says its weights are quantized (nvidia/...-NVFP4, ...-FP8, ...-AWQ)
_QUANT_IN_NAME = re.compile(
    r"(?<![A-Za-z0-9])(NVFP4|MXFP4|FP8|FP4|AWQ|GPTQ|INT4|INT8|W4A16|W8A8)(?![A-Za-z0-9])", re.I
)


def _vision_vit(top: dict) -> list[int] | None:
    """vision_config's (num_hidden_layers, hidden_size) as SGLang's adjust_mem_fraction_for_vlm reads them
    (server_args.py v0.5.2: getattr with defaults 24 and 1024). Kimi-K2.5's config.json names them
    vt_num_hidden_layers / vt_hidden_size; SGLang's own KimiK25VisionConfig (configs/kimi_k25.py, 0.5.23)
    has num_hidden_layers 27 and hidden_size 1152, the same figures (its log's 0.826 shows 27 x 1152)."""
    vc = top.get("vision_config")
    if not isinstance(vc, dict):
        return None
    out = []
    for names, default in (
        (("num_hidden_layers", "vt_num_hidden_layers"), 24),
        (("hidden_size", "vt_hidden_size"), 1024),
    ):
        v = next((vc[n] for n in names if n in vc), default)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 1_000_000:
            return None
        out.append(v)
    return out


# transformers writes config.json as a diff against the defaults (PretrainedConfig.to_diff_dict), so a family
# whose config class ties the embeddings by default (GemmaConfig, Gemma2Config, Gemma3TextConfig,
# Gemma3nTextConfig, Lfm2Config: tie_word_embeddings=True) leaves the key out; vLLM's Gemma models have no lm_head
_TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "lfm2")


# vLLM's Gemma, Gemma 2 and Gemma 3 models build no LM head: their ForCausalLM asserts tie_word_embeddings
# ("currently all existing Gemma models have tie_word_embeddings enabled"; vllm/model_executor/models/gemma.py,
# gemma2.py, gemma3.py), and Gemma 3's multimodal wrapper builds its language model from text_config
_ALWAYS_TIED = ("gemma", "gemma2", "gemma3", "gemma3_text")


def _tied(r: Reader, top: dict, path: Path, notes: list[str]) -> bool:
    """tie_word_embeddings, the outer config's over the text config's (r), a JSON true/false (a string
    such as "false" would read as true), the problem named at the field it came from; absent, the
    family's default, said in the notes. Gemma's families are tied whatever the file says (said)."""
    family = str(r.cfg.get("model_type") or top.get("model_type") or "")
    if family in _ALWAYS_TIED:
        nested = top.get(r.prefix[:-1]) if r.prefix else top
        own = nested.get("tie_word_embeddings") if isinstance(nested, dict) else None
        outer_false = False
        if r.prefix and top.get("tie_word_embeddings") is not None:
            outer = Reader(top, path)
            outer_false = not outer.bool("tie_word_embeddings", True)
            r.problems += outer.problems
        if own is not None and not r.bool("tie_word_embeddings", True):
            notes.append(
                f"{r.prefix}tie_word_embeddings false: vLLM's Gemma models assert it is true and will not load "
                "this config (gemma3.py Gemma3ForCausalLM); planned tied, with no LM head of its own"
            )
        elif outer_false:
            notes.append(
                "tie_word_embeddings false at the top level: vLLM builds the language model from text_config, "
                "and its Gemma models are always tied; no LM head of its own"
            )
        elif not r.has("tie_word_embeddings"):
            notes.append(f"tie_word_embeddings absent: tied, {family}'s default (no LM head of its own)")
        return True
    if r.prefix and top.get("tie_word_embeddings") is not None:
        outer = Reader(top, path)
        tied = outer.bool("tie_word_embeddings", False)
        r.problems += outer.problems
        return tied
    if r.has("tie_word_embeddings"):
        return r.bool("tie_word_embeddings", False)
    if r.has("tie_embedding"):  # LFM2's older name for it (Lfm2Config maps tie_embedding)
        return r.bool("tie_embedding", True)
    tied = family in _TIED_BY_DEFAULT
    notes.append(
        f"tie_word_embeddings absent: tied, {family}'s default (no LM head of its own)"
        if tied
        else "tie_word_embeddings absent: read as untied (an LM head of its own); set it if the model ties them"
    )
    return tied


# A family's config-class defaults where they differ from what kvplan's readers fall back to (the Llama rules:
# head_dim = hidden / heads, KV heads = heads, no MLA, no experts). transformers 4.57 configuration_*.py
# __init__ defaults; vLLM builds the model from that config object, so an absent key is the class default.
_CLASS_DEFAULTS: dict[str, tuple[str, dict[str, Any]]] = {
    "deepseek_v3": (
        "DeepseekV3Config (configuration_deepseek_v3.py)",
        {
            "kv_lora_rank": 512,
            "q_lora_rank": 1536,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
            "n_routed_experts": 256,
            "n_shared_experts": 1,
            "num_experts_per_tok": 8,
            "first_k_dense_replace": 3,
            "moe_intermediate_size": 2048,
            "intermediate_size": 18432,
        },
    ),
    "deepseek_v4": (
        "DeepseekV4Config (transformers 5.x configuration_deepseek_v4.py)",
        {
            "head_dim": 512,
            "num_key_value_heads": 1,
            "qk_rope_head_dim": 64,  # the class's default_partial_rotary_factor 64 / 512 of head_dim
            "q_lora_rank": 1024,
            "o_groups": 8,
            "o_lora_rank": 1024,
            "sliding_window": 128,
            "index_head_dim": 128,
            "n_routed_experts": 256,
            "n_shared_experts": 1,
            "num_experts_per_tok": 6,
            "moe_intermediate_size": 2048,
        },
    ),
    "llama4_text": (
        "Llama4TextConfig (configuration_llama4.py)",
        {
            "num_key_value_heads": 8,
            "num_local_experts": 16,
            "num_experts_per_tok": 1,
            "attention_chunk_size": 8192,
            "head_dim": 128,
            "intermediate_size_mlp": 16384,  # the dense layers' width (intermediate_size is the experts')
        },
    ),
    "mixtral": (
        "MixtralConfig (configuration_mixtral.py)",
        {"num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2},
    ),
    "mistral": ("MistralConfig (configuration_mistral.py)", {"num_key_value_heads": 8}),
    "qwen2_moe": (
        "Qwen2MoeConfig (configuration_qwen2_moe.py)",
        {
            "num_experts": 60,
            "num_experts_per_tok": 4,
            "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632,
        },
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig (configuration_qwen3_moe.py)",
        {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768},
    ),
    "glm4_moe": (
        "Glm4MoeConfig (configuration_glm4_moe.py)",
        {
            "n_routed_experts": 128,
            "num_experts_per_tok": 8,
            "n_shared_experts": 1,
            "moe_intermediate_size": 1408,
            "first_k_dense_replace": 1,
        },
    ),
    "olmoe": ("OlmoeConfig (configuration_olmoe.py)", {"num_experts": 64, "num_experts_per_tok": 8}),
    "granitemoe": (
        "GraniteMoeConfig (configuration_granitemoe.py)",
        {"num_local_experts": 8, "num_experts_per_tok": 2},
    ),
    "phimoe": ("PhimoeConfig (configuration_phimoe.py)", {"num_local_experts": 16, "num_experts_per_tok": 2}),
    "minimax": (
        "MiniMaxConfig (configuration_minimax.py)",
        {"num_local_experts": 8, "num_experts_per_tok": 2},
    ),
    "gpt_oss": (
        "GptOssConfig (configuration_gpt_oss.py)",
        {"num_local_experts": 128, "num_experts_per_tok": 4},
    ),
    "jamba": (
        "JambaConfig (configuration_jamba.py)",
        {
            "num_experts": 16,
            "num_experts_per_tok": 2,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "attn_layer_period": 8,
            "attn_layer_offset": 4,
        },
    ),
    "gemma3_text": (
        "Gemma3TextConfig (configuration_gemma3.py)",
        {"head_dim": 256, "num_key_value_heads": 4},
    ),
}


def _class_defaults(cfg: dict, prefix: str, notes: list[str]) -> dict:
    """cfg with its family's class defaults for the keys it leaves out, each said in the notes."""
    family = _CLASS_DEFAULTS.get(str(cfg.get("model_type") or ""))
    if family is None:
        return cfg
    source, defaults = family
    absent = {k: v for k, v in defaults.items() if k not in cfg}
    if not absent:
        return cfg
    given = ", ".join(f"{prefix}{k} {v}" for k, v in absent.items())
    notes.append(f"absent from the config, taken at {source}'s defaults: {given}")
    return {**cfg, **absent}


def _noted_warnings(notes: list[str], path: Path) -> list[str]:
    """The WARNING notes (what the quantization reader could not model: an unknown method, ...), said on stderr
    too, naming the file once: the quantization notes already start with theirs (config.json's, or
    hf_quant_config.json's beside it), the others are prefixed with the config's."""
    files = (f"{path}: ", f"{path.parent / 'hf_quant_config.json'}: ")
    out = []
    for n in notes:
        if n.startswith("WARNING"):
            text = n[len("WARNING") :].lstrip(": ")
            out.append(text if text.startswith(files) else f"{path}: {text}")
    return out


# vllm/config.py v0.11.0 _get_and_verify_max_len possible_keys (OPT, GPT-2, MPT, ChatGLM2, Command-R, Whisper, others)
_LENGTH_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)  # fmt: skip


def _max_length(r: Reader, notes: list[str]) -> tuple[str | None, Any]:
    """(its key, the model's length before RoPE scaling) as vLLM derives it: the smallest of the length keys the
    config holds, unless it names model_max_length (Command-R / Cohere: that one); the choice said in the notes
    where the keys disagree."""
    present = [k for k in _LENGTH_KEYS if r.has(k)]
    if not present:
        return None, r.int(_LENGTH_KEYS[0])  # required: the one-line refusal names the usual key
    values = {k: r.int(k) for k in present}
    if any(v is None for v in values.values()):
        return present[0], None  # a bad value: said in r.problems
    key = "model_max_length" if "model_max_length" in values else min(present, key=lambda k: values[k])
    if len(set(values.values())) > 1:
        rule = "named by Command-R / Cohere configs" if key == "model_max_length" else "the smallest"
        listed = ", ".join(f"{k} {v:,}" for k, v in values.items())
        notes.append(f"max context {values[key]:,} from {key} ({rule}, as vLLM derives it) of {listed}")
    return key, values[key]


def model_from_config(cfg: Any, path: Path) -> ModelSpec:
    if not isinstance(cfg, dict):
        raise SpecError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    top = cfg
    prefix = ""
    for key in _NESTED:  # multimodal wrappers: the language model's fields one level down
        if isinstance(cfg.get(key), dict):
            cfg = {**{k: v for k, v in top.items() if k != key}, **cfg[key]}
            prefix = f"{key}."
            break
    notes: list[str] = [f"read from {path}; parameter count estimated from the architecture"]
    cfg = _class_defaults(cfg, prefix, notes)
    r = Reader(cfg, path, prefix)

    num_layers = r.int("num_hidden_layers", "n_layer", "num_layers", default=_listed_layers(cfg))
    hidden = r.int("hidden_size", "n_embd", "d_model")
    heads = r.int("num_attention_heads", "n_head", "num_heads")
    vocab = r.int("vocab_size", "padded_vocab_size")
    length_key, max_context = _max_length(r, notes)
    rope = scaled_max_context(r, length_key, max_context, notes)
    max_context = rope.max_context
    if r.cfg.get("multi_query") is True and not r.has("num_kv_heads"):
        kv_heads = 1
    else:
        kv_heads = r.int("num_key_value_heads", "num_kv_heads", "n_head_kv", default=heads)
    if heads and kv_heads and heads % kv_heads:  # each KV head serves a whole group of query heads
        r.bad(
            "num_key_value_heads",
            f"{heads} attention heads do not split evenly over {kv_heads} KV heads; fix the config",
        )
    head_dim = r.int("head_dim", default=None)
    if head_dim is None and hidden and heads:
        if hidden % heads:
            r.bad("head_dim", f"missing, and hidden_size {hidden} is not divisible by {heads} heads")
        head_dim = hidden // heads

    basics = Basics(num_layers or 0, hidden or 0, heads or 0, kv_heads or 0, head_dim or 0)
    layers = read_layers(r, basics, notes)
    layer_types, pattern = layers.layer_types, layers.pattern

    moe = read_moe(r, top, notes)
    _hash_and_per_layer_inputs(r, moe, vocab or 0, num_layers or 0, notes)
    raw_dtype = top.get("torch_dtype") or top.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    act = _DTYPES.get(str(raw_dtype), None)
    if act is None:
        notes.append(f"WARNING: torch_dtype {str(raw_dtype)[:40]!r} not recognised; activations assumed bf16")
        act = "bf16"
    config_dtype = None
    if act == "fp32":
        notes.append(
            "checkpoint is float32 (its torch_dtype): served in 16 bits by the engine's --dtype auto (bf16 unless its "
            "release or the GPU says float16; settings.dtype is the one planned)"
        )
        act, config_dtype = "bf16", "fp32"
    quant, quant_where = q.quant_config(top, cfg, path)
    scheme = q.read_scheme(quant, quant_where, 16 if act != "fp32" else 32, notes)

    if r.problems:
        raise SpecError("\n".join(dict.fromkeys(r.problems)))  # a field read twice is said once
    warnings = [
        f"{path}: config field {r.prefix}{key} is not read by kvplan and may change memory; "
        "its figures may be off for this model"
        for key in unread_fields(cfg, r.read)
    ]
    warnings += _noted_warnings(notes, path)

    # a model folder's config.json is named by its folder; any other file by its own name
    folder_name = path.resolve().parent.name if path.name == "config.json" else path.stem
    # _name_or_path records where the exporter loaded the config from: a path on that machine is not a name to
    # serve (solve's launch lines would name it); the folder given is
    recorded = str(top.get("_name_or_path") or "")
    local = (
        recorded.startswith(("/", "./", "../", "~")) or "\\" in recorded or re.match(r"^[A-Za-z]:", recorded)
    )
    name = (recorded if recorded and not local else "") or folder_name or path.stem
    claimed = _QUANT_IN_NAME.search(f"{name} {folder_name}")
    if scheme is None and claimed:
        warnings.append(
            f"{path}: the name says {claimed.group(0)} but there is no quantization_config (nor "
            f"hf_quant_config.json): planned as {act} weights; pass --weight-dtype if they are quantized"
        )
    archs = top.get("architectures")
    tied = _tied(r, top, path, notes)
    ckpt_bytes = q.checkpoint_weight_bytes(path)
    if ckpt_bytes and config_dtype == "fp32" and scheme is None:  # float32 files, served in 16 bits
        ckpt_bytes //= 2
        notes.append(
            "weight bytes: the index's total_size is of float32 files, scaled to the dtype served (halved for "
            "16-bit weights, kept whole under --dtype float32)"
        )
    spec: dict[str, Any] = {
        "name": name,
        "display_name": name,
        "architecture": str(archs[0]) if isinstance(archs, list) and archs else None,
        "sources": [str(path)],
        "notes": notes,
        # the reading notes beside the provenance line, the quantization summary (a plan prints its own
        # weight formats), stderr warnings and the image-token count (a plan states its own)
        "assumptions": [
            n for n in notes[1:] if not n.startswith(("WARNING", "weights ", "cross-attention layers hold"))
        ],
        "num_layers": num_layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "intermediate_size": _scalar_intermediate(r, layers.intermediate_sizes),
        "intermediate_sizes": layers.intermediate_sizes,
        # a gated MLP has three matrices (gate, up, down); GELU/ReLU/ReLU^2 MLPs two
        "mlp_gated": str(cfg.get("mlp_hidden_act") or cfg.get("hidden_act", "silu"))
        not in ("gelu", "gelu_new", "relu", "relu2")
        or cfg.get("model_type") in ("gemma", "gemma2", "gemma3_text"),
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "max_context": max_context,
        "vllm_default_context": rope.vllm_default,
        "sglang_max_context": rope.sglang_max,
        "moe": moe,
        "weight_dtype": act,
        "checkpoint_weight_bytes": ckpt_bytes,
        "pooling_config": q.has_pooling_config(path),
        "checkpoint_kv_cache_dtype": q.kv_cache_dtype(quant),
        "draft_vocab_size": r.int("draft_vocab_size", default=None),
        # Gemma 3 with vision_config null: transformers builds its default SigLIP tower
        "vision_encoder": isinstance(top.get("vision_config"), dict)
        or ("vision_config" in top and top.get("model_type") == "gemma3"),
        "vision_tower": vision_tower.tower(top, path),
        "vision_vit": _vision_vit(top),
        "activation_dtype": act,
        "config_dtype": config_dtype,
        "layer_types": layer_types,
        "layer_pattern": pattern,
        "mlp_pattern": layers.mlp_pattern,
        "warnings": warnings,
        # multi-token-prediction layers shipped in the checkpoint: loaded only as the draft of MTP
        # speculative decoding (kvplan/plan/draft.py); DeepSeek/GLM/MiniMax-M3/Nemotron name them
        # num_nextn_predict_layers, Qwen3.5/3.6 mtp_num_hidden_layers, MiniMax-M2.5 mtp_transformer_layers
        "checkpoint_holds_mtp": q.checkpoint_layers_beyond(path, num_layers or 0),
        "mtp_layers": r.int(
            "num_nextn_predict_layers",
            "mtp_num_hidden_layers",
            "mtp_transformer_layers",
            default=0,
            minimum=0,
        ),
    }
    if r.problems:
        raise SpecError("\n".join(dict.fromkeys(r.problems)))  # a field read twice is said once
    return _with_formats(validate(ModelSpec, spec, path), spec, scheme, cfg, quant_where, notes, path)


def _with_formats(
    model: ModelSpec,
    spec: dict[str, Any],
    scheme: Any,
    cfg: dict,
    quant_where: str,
    notes: list[str],
    path: Path,
) -> ModelSpec:
    """The model with its checkpoint's per-matrix weight formats (quantization config, DeepSeek-V4's
    expert_dtype), said in its notes."""
    fp4_experts = str(cfg.get("expert_dtype") or "").lower() == "fp4" and model.moe is not None
    if scheme is None and not fp4_experts:
        return model
    formats = q.resolve(model, scheme) if scheme is not None else {}
    if fp4_experts and weight_format(formats.get("routed_experts") or "fp8").bits_per_value > 4.5:
        # (a re-export whose quantization config names the experts' 4-bit format keeps that one)
        # DeepSeek-V4's expert_dtype fp4: FP4 (e2m1) experts with a UE8M0 scale per 32 values, MXFP4's layout
        formats["routed_experts"] = "mxfp4"
        notes.append(
            "weights of the routed experts: expert_dtype fp4, FP4 with a scale per 32 values (MXFP4's layout, 4.25 bits)"
        )
    method = scheme.method if scheme is not None else "expert_dtype"
    notes.append(
        f"weights quantized ({method}, {quant_where.split(': ')[0]}): "
        + ", ".join(f"{k} {v}" for k, v in formats.items() if "." not in k)
    )
    return validate(
        ModelSpec,
        {**spec, "weight_formats": formats, "expert_weight_dtype": formats.get("routed_experts")},
        path,
    )
