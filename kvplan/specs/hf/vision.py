"""Llama 3.2 Vision (Mllama): `cross_attention_layers` attend to the image tokens' K/V, not the text's.

Their cache is fixed per image (max_num_tiles x ((image_size // patch_size)^2 + 1) tokens; vLLM sizes it
as CrossAttentionSpec in v1/kv_cache_interface.py), not per context token. The `cross` layer kind exists
(kvplan/specs/models.py); until the planners charge it per request, the config is refused in one line
rather than counted as self-attention over the whole context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.specs.hf.reader import Reader

if TYPE_CHECKING:
    from kvplan.specs.hf.layers import Basics, Layers


def read(r: Reader, basics: Basics, notes: list[str]) -> Layers | None:
    if not r.list("cross_attention_layers"):
        return None
    from kvplan.specs.hf.layers import Layers

    r.bad(
        "cross_attention_layers",
        "cross-attention layers hold the image tokens' K/V per request, which kvplan does not plan yet "
        "(they are not self-attention over the context)",
    )
    return Layers()
