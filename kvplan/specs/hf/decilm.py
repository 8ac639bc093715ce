"""DeciLM / Nemotron-NAS (Llama-3.3-Nemotron-Super-49B, -Ultra-253B): `block_configs`, one per layer.

Each layer states its own attention (`n_heads_in_group`: KV heads = heads / n_heads_in_group, or `no_op`:
no attention and no cache) and its own MLP width (`ffn_mult`, or `no_op`: no MLP).
"""

from __future__ import annotations

from kvplan.specs.hf.family import Basics, Layers
from kvplan.specs.hf.reader import Reader


def ffn_mult_to_intermediate_size(ffn_mult: float, hidden_size: int) -> int:
    # vLLM model_executor/models/nemotron_nas.py and HF modeling_decilm.py `_ffn_mult_to_intermediate_size`:
    # int(2 * ffn_mult * hidden / 3), rounded up to a multiple of 256
    size = int(2 * ffn_mult * hidden_size / 3)
    return size if size % 256 == 0 else size + 256 - size % 256


def _attention(r: Reader, i: int, block: dict, basics: Basics) -> dict | None:
    attn = block.get("attention") or {}
    where = f"block_configs[{i}].attention"
    for field in ("replace_with_linear", "sparsify", "window_length", "num_sink_tokens"):
        if attn.get(field):
            r.bad(f"{where}.{field}", f"{attn[field]!r} is not modelled (only GQA or no_op attention)")
    if attn.get("no_op") is True:
        return {"kind": "none"}
    group = attn.get("n_heads_in_group")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1 or basics.num_heads % group:
        r.bad(f"{where}.n_heads_in_group", f"expected a divisor of {basics.num_heads} heads, got {group!r}")
        return None
    return {"kind": "full", "num_kv_heads": basics.num_heads // group, "head_dim": basics.head_dim}


def _ffn_size(r: Reader, i: int, block: dict, hidden: int) -> int:
    ffn = block.get("ffn") or {}
    where = f"block_configs[{i}].ffn"
    for field in ("replace_with_linear", "sparsify"):
        if ffn.get(field):
            r.bad(f"{where}.{field}", f"{ffn[field]!r} is not modelled (only gated MLP or no_op)")
    if ffn.get("no_op") is True:
        return 0
    mult = ffn.get("ffn_mult")
    if isinstance(mult, bool) or not isinstance(mult, (int, float)) or mult <= 0:
        r.bad(f"{where}.ffn_mult", f"expected a positive number, got {mult!r}")
        return 0
    return ffn_mult_to_intermediate_size(mult, hidden)


def read(r: Reader, basics: Basics, notes: list[str]) -> Layers | None:
    blocks = r.list("block_configs")
    if blocks is None:
        return None
    out = Layers()
    if len(blocks) != basics.num_layers:
        r.bad("block_configs", f"has {len(blocks)} entries but num_hidden_layers is {basics.num_layers}")
        return out
    for i, block in enumerate(blocks):
        if not isinstance(block, dict):
            r.bad(f"block_configs[{i}]", f"expected an object, got {block!r}")
            return out
        layer = _attention(r, i, block, basics)
        if layer is None:
            return out
        name = "no_attention" if layer["kind"] == "none" else f"gqa_kv{layer['num_kv_heads']}"
        out.layer_types[name] = layer
        out.pattern.append(name)
        out.intermediate_sizes.append(_ffn_size(r, i, block, basics.hidden_size))
    skipped = out.pattern.count("no_attention")
    if skipped:
        notes.append(
            f"block_configs: {skipped} of {basics.num_layers} layers have no attention (no KV cache)"
        )
    return out
