"""Multi-head latent attention from a config.json (DeepSeek-V2/V3, Kimi K2): `kv_lora_rank`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.specs.hf.reader import Reader

if TYPE_CHECKING:
    from kvplan.specs.hf.layers import Basics, Layers


def read(r: Reader, basics: Basics, notes: list[str]) -> Layers | None:
    if not r.has("kv_lora_rank"):
        return None
    from kvplan.specs.hf.layers import Layers

    out = Layers()
    out.layer_types["mla"] = {
        "kind": "mla",
        "kv_lora_rank": r.int("kv_lora_rank"),
        "qk_rope_head_dim": r.int("qk_rope_head_dim"),
        "qk_nope_head_dim": r.int("qk_nope_head_dim", default=None),
        "v_head_dim": r.int("v_head_dim", default=None),
        "q_lora_rank": r.int("q_lora_rank", default=None),
    }
    out.pattern = ["mla"] * (basics.num_layers or 1)
    return out
