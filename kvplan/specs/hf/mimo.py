"""MiMo-V2-Flash: `hybrid_layer_pattern` (1: sliding window, 0: full attention), each kind with its own
heads and widths (`swa_num_key_value_heads`, `swa_head_dim`, `swa_v_head_dim`).

vLLM/SGLang mimo_v2_flash.py: `is_swa = config.hybrid_layer_pattern[layer_idx] == 1`; SWA layers read the
swa_* fields and `sliding_window`. The attention sink bias is a per-head scalar, not a cache entry.
"""

from __future__ import annotations

from kvplan.specs.hf.family import Basics, Layers
from kvplan.specs.hf.reader import Reader


def read(r: Reader, basics: Basics, notes: list[str]) -> Layers | None:
    flags = r.list("hybrid_layer_pattern")
    if flags is None:
        return None
    out = Layers()
    if len(flags) != basics.num_layers or any(f not in (0, 1) or isinstance(f, bool) for f in flags):
        r.bad("hybrid_layer_pattern", f"expected {basics.num_layers} per-layer 0/1 flags")
        return out
    full = {"kind": "full", **basics.head(r)}
    swa_dim = r.int("swa_head_dim", default=basics.head_dim)
    sliding = {
        "kind": "sliding",
        "window": r.int("sliding_window", "sliding_window_size"),
        "num_kv_heads": r.int("swa_num_key_value_heads", default=basics.num_kv_heads),
        "head_dim": swa_dim,
        "head_dim_v": r.int("swa_v_head_dim", default=swa_dim),
    }
    out.pattern = ["sliding" if f == 1 else "full" for f in flags]
    for name in dict.fromkeys(out.pattern):
        out.layer_types[name] = sliding if name == "sliding" else full
    return out
