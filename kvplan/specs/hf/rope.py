"""The model's maximum context as vLLM derives it: max_position_embeddings, scaled by the RoPE block's factor.

vllm/config/model.py v0.11.0 _get_and_verify_max_len: for a `rope_scaling` whose rope_type is not su, longrope
or llama3 (whose max_position_embeddings is already the scaled length), and not on a Gemma 3 model, the
derived length is multiplied by the block's `factor` (1.0 when absent: "default"/"mrope" blocks); YaRN
multiplies `original_max_position_embeddings` instead of max_position_embeddings. Transformers 5's
`rope_parameters` is read the same way from vLLM 0.12.0 (same function), per layer type when nested.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvplan.limits import MAX_TOKENS
from kvplan.specs.hf.reader import Reader

# rope types whose max_position_embeddings is already the scaled length (vllm/config/model.py v0.11.0
# _get_and_verify_max_len: `if rope_type not in ("su", "longrope", "llama3")`)
_UNSCALED = ("su", "longrope", "llama3")
# transformers configuration_utils.py 4.57.0 ALLOWED_LAYER_TYPES: a RoPE block keyed by these is one block a
# layer type (vllm/config/model.py v0.12.0 _get_and_verify_max_len: `issubset(ALLOWED_LAYER_TYPES)`)
_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention", "linear_attention"})
# legacy `type` beside a modern `rope_type` that vLLM accepts (transformers_utils/config.py v0.12.0
# patch_rope_parameters_dict); any other disagreement it refuses
_SAME_TYPE = {("su", "longrope"), ("mrope", "default")}


def _blocks(r: Reader) -> tuple[str, list[tuple[str, dict]]] | None:
    """(the key read, [(where, block)]): rope_scaling (vLLM 0.11.0), else rope_parameters (transformers 5,
    vLLM 0.12.0); None when there is none."""
    for key in ("rope_scaling", "rope_parameters"):
        value = r.cfg.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            r.bad(key, f"expected an object (a RoPE block), got {type(value).__name__}; fix or remove it")
            return None
        if not value:
            return None
        if set(value) <= _LAYER_TYPES:  # one block a layer type (Gemma 4, Laguna)
            blocks = []
            for layer_type, block in value.items():
                if not isinstance(block, dict):
                    r.bad(
                        f"{key}.{layer_type}",
                        f"expected an object (a RoPE block), got {type(block).__name__}",
                    )
                    return None
                blocks.append((f"{key}.{layer_type}", block))
            return key, blocks
        return key, [(key, value)]
    return None


def _rope_type(r: Reader, where: str, block: dict) -> str | None:
    """The block's rope type as vLLM normalises it (transformers_utils/config.py v0.11.0 patch_rope_scaling_dict:
    `type` is the legacy name, su -> longrope, mrope -> default); None (said in r.problems) when vLLM refuses it."""
    modern, legacy = block.get("rope_type"), block.get("type")
    if modern is None and legacy is None:
        r.bad(where, "has no rope_type (nor type); vLLM refuses a RoPE block without one: add it")
        return None
    if modern is not None and legacy is not None and modern != legacy and (legacy, modern) not in _SAME_TYPE:
        r.bad(f"{where}.rope_type", f"{modern!r} but type is {legacy!r}; vLLM refuses the conflict: keep one")
        return None
    kind = modern if modern is not None else legacy
    if not isinstance(kind, str):
        r.bad(f"{where}.rope_type", f"expected a name such as 'yarn', got {kind!r}")
        return None
    if kind == "mrope" and "mrope_section" not in block:  # patch_rope_scaling_dict asserts it
        r.bad(f"{where}.mrope_section", "rope_type mrope needs mrope_section; add it")
        return None
    return {"su": "longrope", "mrope": "default"}.get(kind, kind)


def _factor(r: Reader, where: str, block: dict) -> float | None:
    factor = block.get("factor")
    if factor is None:
        return None
    number = isinstance(factor, (int, float)) and not isinstance(factor, bool)
    if not number or not math.isfinite(factor) or factor <= 0:
        r.bad(
            f"{where}.factor", f"expected a number above 0 (the RoPE scaling factor), got {factor!r}; fix it"
        )
        return None
    return float(factor)


def _original(r: Reader, where: str, block: dict) -> int | None:
    """YaRN's original_max_position_embeddings: the block's (v0.11.0 reads `rope_scaling[...]`, a KeyError when
    absent), else the config's own (transformers_utils/config.py v0.12.0 patch_rope_parameters copies it in)."""
    value = block.get("original_max_position_embeddings", r.cfg.get("original_max_position_embeddings"))
    if value is None:
        r.bad(
            f"{where}.original_max_position_embeddings",
            "missing: vLLM scales it by the yarn factor to get the maximum context (and fails without it); add it",
        )
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        r.bad(f"{where}.original_max_position_embeddings", f"expected a positive integer, got {value!r}")
        return None
    return value


def _sglang(block: dict, length: int) -> int:
    """SGLang 0.5.2's figure (python/sglang/srt/hf_transformers_utils.py get_context_length): the factor, unless
    the block names original_max_position_embeddings or is llama3, times max_position_embeddings."""
    factor = block.get("factor", 1)
    if "original_max_position_embeddings" in block or block.get("rope_type") == "llama3":
        factor = 1
    return int(factor * length)


@dataclass(frozen=True)
class RopeContext:
    max_context: Any  # vLLM's derived maximum (the config's length when nothing scales it)
    vllm_default: int | None = (
        None  # what vLLM >= 0.12 starts with when no --max-model-len is given (LongRoPE)
    )
    sglang_max: int | None = None  # SGLang's own maximum where it derives another figure


def scaled_max_context(r: Reader, key: str | None, length: Any, notes: list[str]) -> RopeContext:
    """The maximum context vLLM derives from `length` (the config's `key`, max_position_embeddings) and the
    RoPE block, with vLLM's LongRoPE default and SGLang's own maximum where they differ; the derivation said in
    the notes when it changes the figure. Bad RoPE values are r.problems."""
    found = _blocks(r)
    if found is None:
        return RopeContext(length)
    source, blocks = found
    scale, original, what = 1.0, None, f"{source} factor 1"
    longrope = False
    for where, block in blocks:
        kind, factor = _rope_type(r, where, block), _factor(r, where, block)
        longrope = longrope or kind == "longrope"
        if kind is None or kind in _UNSCALED:
            continue
        if factor is not None:  # `rp.get("factor", scaling_factor)`: the last scaled block's factor (v0.12.0)
            scale, what = factor, f"{where}.factor {factor:g} ({kind})"
        if kind == "yarn":
            original = _original(r, where, block)
            if factor is None:  # vLLM's `rope_scaling.get("factor", 1.0)`
                what = f"{where} factor 1 (yarn, none given)"
    # Gemma 3's max_position_embeddings (128K) is already scaled (v0.11.0: `"gemma3" not in hf_config.model_type`)
    if r.problems or not isinstance(length, int) or "gemma3" in str(r.cfg.get("model_type") or ""):
        return RopeContext(length)
    if longrope:
        return RopeContext(length, _longrope_default(r, blocks, length))
    base = original if original is not None else length
    derived = int(base * scale)
    if derived == length:
        return RopeContext(length)
    if not 1 <= derived <= MAX_TOKENS:
        r.bad(key or source, f"{base:,} x {what} gives a maximum context of {derived:,}; fix the factor")
        return RopeContext(length)
    start = f"original_max_position_embeddings {original:,}" if original is not None else f"{key} {length:,}"
    note = f"max context {derived:,}: {start} x {what}, as vLLM derives it"
    if original is not None:
        note += f" ({key} says {length:,})"
    sglang = _sglang(blocks[0][1], length) if source == "rope_scaling" and len(blocks) == 1 else derived
    if sglang != derived:
        note += (
            f"; SGLang 0.5.2 derives {sglang:,} from the same fields, its default and its limit (a longer "
        )
        note += "--context-length only with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1)"
    notes.append(note)
    return RopeContext(derived, None, sglang if sglang != derived else None)


def _longrope_default(r: Reader, blocks: list[tuple[str, dict]], length: int) -> int | None:
    """LongRoPE (Phi-3, Phi-3.5, Phi-4-mini): max_position_embeddings is the long factors' reach, and vLLM
    starts at original_max_position_embeddings when no --max-model-len is given (vllm/config/model.py
    _get_and_verify_max_len, since PR #27431, merged 2025-10-23, first released in 0.11.1: "For LongRoPE,
    default to original_max_position_embeddings to avoid performance degradation for shorter sequences")."""
    block = blocks[0][1]
    value = r.cfg.get("original_max_position_embeddings", block.get("original_max_position_embeddings"))
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < length:
        return None
    return value  # said where a plan takes it (plan.py _engine_context)
