"""Gemma 3n / Gemma 4 from a config.json: per-layer-type KV heads and widths, and KV sharing.

vLLM model_executor/models/gemma4.py (Gemma4DecoderLayer): full-attention layers use `global_head_dim`;
with `attention_k_eq_v` they use `num_global_key_value_heads` and load K's weights into V's slot, so the
cache still holds K and V (2 x heads x dim). The last `num_kv_shared_layers` layers reuse the KV of the
last earlier layer of the same type and store nothing (Gemma4Attention, kv_sharing_target_layer_name).
"""

from __future__ import annotations

from kvplan.specs.hf.family import Basics, Layers
from kvplan.specs.hf.reader import Reader

_KINDS = {"sliding_attention": "sliding", "full_attention": "full"}


def _applies(r: Reader) -> bool:
    if not str(r.cfg.get("model_type", "")).startswith("gemma"):
        return False
    keys = ("global_head_dim", "num_global_key_value_heads")
    return any(r.has(k) for k in keys) or bool(r.cfg.get("num_kv_shared_layers"))


def _layer_type(r: Reader, kind: str, basics: Basics) -> dict:
    if kind == "sliding":
        return {"kind": "sliding", "window": r.int("sliding_window"), **basics.head(r)}
    heads = basics.num_kv_heads
    if r.bool("attention_k_eq_v", False):
        heads = r.int("num_global_key_value_heads", default=heads)
    return {
        "kind": "full",
        "num_kv_heads": heads,
        "head_dim": r.int("global_head_dim", default=basics.head_dim),
    }


def read(r: Reader, basics: Basics, notes: list[str]) -> Layers | None:
    if not _applies(r):
        return None
    out = Layers()
    types = r.list("layer_types")
    if types is None or len(types) != basics.num_layers or any(t not in _KINDS for t in types):
        r.bad("layer_types", f"expected {basics.num_layers} entries of sliding_attention/full_attention")
        return out
    kinds = [_KINDS[t] for t in types]
    for kind in dict.fromkeys(kinds):
        out.layer_types[kind] = _layer_type(r, kind, basics)
    shared = r.int("num_kv_shared_layers", default=0, minimum=0) or 0
    first_shared = basics.num_layers - shared
    out.pattern = kinds[:first_shared]
    for i in range(first_shared, basics.num_layers):
        producers = [j for j in range(first_shared) if kinds[j] == kinds[i]]
        if not producers:
            r.bad("num_kv_shared_layers", f"layer {i} ({types[i]}) has no earlier layer of its type to share")
            return out
        name = f"shared{producers[-1] - i}"
        out.layer_types[name] = {"kind": "shared", "source": producers[-1] - i}
        out.pattern.append(name)
    if shared:
        notes.append(f"num_kv_shared_layers: the last {shared} layers reuse earlier layers' KV (no cache)")
    sizes = r.cfg.get("intermediate_size")
    if isinstance(sizes, list):  # Gemma 3n: one MLP width per layer
        if len(sizes) != basics.num_layers or not all(isinstance(x, int) and x >= 0 for x in sizes):
            r.bad("intermediate_size", f"expected {basics.num_layers} non-negative integers")
        else:
            out.intermediate_sizes = list(sizes)
    return out
