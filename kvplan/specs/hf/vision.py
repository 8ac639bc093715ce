"""Llama 3.2 Vision (Mllama): `cross_attention_layers` attend to the image tokens' K/V, not the text's.

Their cache is fixed per image, max_num_tiles x ((image_size // patch_size)^2 + 1) tokens (the
vision encoder's patches plus one class token per tile; transformers modeling_mllama.py), held
once per request whatever the text context (vLLM sizes it from encoder tokens: CrossAttentionSpec
in v1/kv_cache_interface.py).
"""

from __future__ import annotations

from kvplan.specs.hf.family import Basics, Layers
from kvplan.specs.hf.reader import Reader


def _image_tokens(r: Reader) -> int | None:
    vision = r.cfg.get("vision_config")
    if not isinstance(vision, dict):
        r.bad("vision_config", "cross-attention layers need the vision_config to size an image")
        return None
    v = Reader(vision, r.path, "vision_config.")
    tiles, size, patch = v.int("max_num_tiles"), v.int("image_size"), v.int("patch_size")
    r.problems += v.problems
    if not (tiles and size and patch):
        return None
    return tiles * ((size // patch) ** 2 + 1)


def read(r: Reader, basics: Basics, notes: list[str]) -> Layers | None:
    cross = r.list("cross_attention_layers")
    if not cross:
        return None
    out = Layers()
    tokens = _image_tokens(r)
    bad = [i for i in cross if not isinstance(i, int) or not 0 <= i < basics.num_layers]
    if bad or tokens is None:
        if bad:
            r.bad("cross_attention_layers", f"layer indices {bad[:3]} are not layers of the model")
        return out
    out.layer_types["full"] = {"kind": "full", **basics.head(r)}
    out.layer_types["cross"] = {"kind": "cross", **basics.head(r), "image_tokens": tokens}
    out.layer_types["cross"].pop("head_dim_v", None)
    wanted = set(cross)
    out.pattern = ["cross" if i in wanted else "full" for i in range(basics.num_layers)]
    notes.append(f"cross-attention layers hold {tokens:,} image tokens' K/V per image (--images-per-request)")
    return out
