"""MiniMax-M3's sparse attention (`sparse_attention_config`): refused until its index cache is modelled.

Sparse layers keep, beside K and V, an index key per token (`sparse_index_dim` x `sparse_num_index_heads`)
to pick `sparse_topk_blocks`; leaving it out would print a KV figure that is silently low.
"""

from __future__ import annotations

from kvplan.specs.hf.family import Basics, Layers
from kvplan.specs.hf.reader import Reader


def read(r: Reader, basics: Basics, notes: list[str]) -> Layers | None:
    sparse = r.cfg.get("sparse_attention_config")
    if not isinstance(sparse, dict) or not sparse.get("use_sparse_attention"):
        return None
    r.bad(
        "sparse_attention_config.use_sparse_attention",
        f"{r.cfg.get('model_type', 'this model')}'s block-sparse attention keeps an index cache "
        "that kvplan does not model yet; describe the model in a YAML spec",
    )
    return Layers()
