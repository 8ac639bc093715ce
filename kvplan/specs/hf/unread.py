"""Never silent: config.json fields that look like they change memory but that kvplan does not read.

The issue's rule: any `*_layers`, `*_per_layer` (Laguna's `num_attention_heads_per_layer`), `*pattern*`,
`*ratio*` or `quantization*` field kvplan does not
understand gives a warning naming it, so a figure that may be off says so.
"""

from __future__ import annotations

import re
from typing import Any

MEMORY_FIELD = re.compile(
    r"(_layers$|layers_|_per_layer$|layer_types|pattern|(^|_)ratios?($|_)|^quantization)"
)

# Fields of that shape that kvplan reads, or that change no memory an engine allocates by default.
UNDERSTOOD = {
    "num_hidden_layers",
    "layer_types",
    "max_window_layers",
    "sliding_window_pattern",
    "_sliding_window_pattern",
    "no_rope_layers",
    "hybrid_override_pattern",
    "layers_block_type",
    "quantization_config",
    # Gemma 3n: each layer's MLP activation sparsity target, a top-k applied at run time
    # (transformers Gemma3nTextMLP._gaussian_topk); nothing stored
    "activation_sparsity_pattern",
    # multi-token-prediction layers are loaded only for speculative decoding, which kvplan does not plan
    "num_nextn_predict_layers",
    "mtp_num_hidden_layers",
    "mtp_transformer_layers",
    "mtp_layers_block_type",
    "mtp_hybrid_override_pattern",
}


def unread_fields(cfg: dict[str, Any], read: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Memory-shaped fields of `cfg` (already merged with its text_config) that kvplan ignores;
    `read`: the fields a family reader took a value from (Reader.read), which are not ignored."""
    out = []
    for key, value in cfg.items():
        if key in UNDERSTOOD or key in read or not MEMORY_FIELD.search(key):
            continue
        if value in (None, [], {}, 0, False):  # "none" written out: nothing to model
            continue
        out.append(key)
    return sorted(out)
