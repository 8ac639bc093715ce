"""Multi-head latent attention from a config.json (DeepSeek-V2/V3, Kimi K2): `kv_lora_rank`.

DSA (DeepSeek-V3.2, GLM-5): `index_head_dim` adds the sparse-attention indexer's key per token.
GLM-5.2's `indexer_types` marks layers `shared`, which reuse an earlier layer's top-k and keep no
indexer key of their own.
"""

from __future__ import annotations

from kvplan.specs.hf.family import Basics, Layers
from kvplan.specs.hf.reader import Reader


def read(r: Reader, basics: Basics, notes: list[str]) -> Layers | None:
    if not r.has("kv_lora_rank"):
        return None
    out = Layers()
    mla = {
        "kind": "mla",
        "kv_lora_rank": r.int("kv_lora_rank"),
        "qk_rope_head_dim": r.int("qk_rope_head_dim"),
        "qk_nope_head_dim": r.int("qk_nope_head_dim", default=None),
        "v_head_dim": r.int("v_head_dim", default=None),
        "q_lora_rank": r.int("q_lora_rank", default=None),
    }
    num_layers = basics.num_layers or 1
    index_head_dim = r.int("index_head_dim", default=None)
    if index_head_dim is None:
        out.layer_types["mla"] = mla
        out.pattern = ["mla"] * num_layers
        return out
    out.pattern = _dsa_pattern(r, num_layers, notes)
    # the sparse kernels attend to the indexer's top-k tokens, in layers sharing another's indexer too
    topk = r.int("index_topk", default=None)
    sparse = {**mla, "index_topk": topk} if topk else mla
    out.layer_types["dsa"] = {**sparse, "index_head_dim": index_head_dim}
    if "mla" in out.pattern:
        out.layer_types["mla"] = sparse
    return out


def _dsa_pattern(r: Reader, num_layers: int, notes: list[str]) -> list[str]:
    """`dsa` for layers with an indexer key of their own, `mla` for those sharing another's."""
    types = r.list("indexer_types")
    if types is None:
        return ["dsa"] * num_layers
    if len(types) != num_layers:
        r.bad("indexer_types", f"has {len(types)} entries but num_hidden_layers is {num_layers}")
        return ["dsa"] * num_layers
    pattern = []
    for i, t in enumerate(types):
        if t not in ("full", "shared"):
            r.bad(f"indexer_types[{i}]", f"expected 'full' or 'shared', got {t!r}")
            return ["dsa"] * num_layers
        pattern.append("dsa" if t == "full" else "mla")
    notes.append(
        f"indexer_types: {pattern.count('dsa')} of {num_layers} layers keep an indexer key; "
        "the shared ones reuse an earlier layer's top-k"
    )
    return pattern
