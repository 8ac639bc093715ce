"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL, Llama 3.2 Vision and Gemma 3 vision towers, from config.json's
vision_config, and (Qwen-VL) the largest
multimodal item in encoder tokens, from the processor configs beside config.json.

The tower's layout is vLLM's (0.11/0.12, vllm/model_executor/models/): qwen2_vl.py (LayerNorm, a
2-matrix MLP of embed_dim x mlp_ratio, a bias-free Conv3d), qwen2_5_vl.py (RMSNorm, a gated MLP of
intermediate_size, a bias-free Conv3d), qwen3_vl.py (LayerNorm, a 2-matrix MLP, a Conv3d with bias,
a learned position table, one extra merger per deepstack_visual_indexes entry).

The largest item (vLLM's max_tokens_per_mm_item, which sizes the encoder-cache budget that
gpu_model_runner.py profile_run holds through the LM's dummy forward) follows qwen3_vl.py
Qwen3VLProcessingInfo: an image's tokens are at most longest_edge / (patch x merge)^2; a video's
soft tokens at most longest_edge / (temporal_patch x (patch x merge)^2) (video_smart_resize caps
frames x height x width at longest_edge), and get_max_video_tokens multiplies them by 12.5 (the
timestamp text around each frame). This assumes a context long enough for the frame count to reach
the pixel cap, as for the model's own max_position_embeddings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvplan.errors import SpecError
from kvplan.limits import MAX_LAYERS
from kvplan.specs.hf.quant import read_sidecar, sidecar_present

_STYLES = {
    "qwen2_vl": "qwen2_vl",
    "qwen2_5_vl": "qwen2_5_vl",
    "qwen3_vl": "qwen3_vl",
    "qwen3_vl_moe": "qwen3_vl",
}
VIDEO_TEXT_FACTOR = 12.5  # qwen3_vl.py get_max_video_tokens: formatted_video_soft_tokens = soft x 12.5
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json")


def _pos_int(d: dict, *keys: str) -> int | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _mllama(top: dict, vc: dict) -> dict[str, Any] | None:
    """Llama 3.2 Vision's tower (transformers configuration_mllama.py MllamaVisionConfig; its defaults
    where a key is absent: 32 + 8 layers of 1280, MLP 5120, patch 14, 4 tiles, 3 channels)."""
    text = top.get("text_config")
    out = _pos_int(text, "hidden_size") if isinstance(text, dict) else None
    hidden = _pos_int(vc, "hidden_size") or 1280
    ratios = vc.get("supported_aspect_ratios")
    middle = vc.get("intermediate_layers_indices", [3, 7, 15, 23, 30])
    image = _pos_int(vc, "image_size") or 448
    if not (out and isinstance(ratios, list) and ratios and isinstance(middle, list)):
        return None  # kvplan does not rebuild transformers' default aspect-ratio list
    return {
        "style": "mllama",
        "depth": _pos_int(vc, "num_hidden_layers") or 32,
        "global_layers": _pos_int(vc, "num_global_layers") or 8,
        "hidden_size": hidden,
        "intermediate_size": _pos_int(vc, "intermediate_size") or 5120,
        "out_hidden_size": out,
        "patch_size": _pos_int(vc, "patch_size") or 14,
        "temporal_patch_size": 1,
        "in_channels": _pos_int(vc, "num_channels") or 3,
        "spatial_merge_size": 1,
        "image_size": image,
        "max_num_tiles": _pos_int(vc, "max_num_tiles") or 4,
        "aspect_ratios": len(ratios),
        # MllamaVisionConfig: vision_output_dim = hidden x (1 + the intermediate layers it concatenates)
        "projector_in": _pos_int(vc, "vision_output_dim") or hidden * (len(middle) + 1),
    }


def _siglip(top: dict, vc: dict, path: Path) -> dict[str, Any] | None:
    """Gemma 3's SigLIP tower (vLLM gemma3_mm.py Gemma3ForConditionalGeneration over siglip.py
    SiglipVisionModel, no head: vision_use_head false): transformers' SiglipVisionConfig defaults where a
    key is absent are not rebuilt, so every shape must be given."""
    text = top.get("text_config")
    out = _pos_int(text, "hidden_size") if isinstance(text, dict) else None
    hidden, inter = _pos_int(vc, "hidden_size"), _pos_int(vc, "intermediate_size")
    depth, patch, image = (
        _pos_int(vc, "num_hidden_layers"),
        _pos_int(vc, "patch_size"),
        _pos_int(vc, "image_size"),
    )
    channels = _pos_int(vc, "num_channels") if "num_channels" in vc else 3
    if (
        not (out and hidden and inter and depth and patch and image and channels)
        or vc.get("vision_use_head") is True
    ):
        return None  # a shape missing or not a positive count: not counted, and the plan says so
    if depth > MAX_LAYERS:
        raise SpecError(
            f"{path}: vision_config.num_hidden_layers {depth:,} is over kvplan's limit of {MAX_LAYERS:,}; "
            "is it the right config?"
        )
    return {
        "style": "siglip",
        "depth": depth,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "out_hidden_size": out,
        "patch_size": patch,
        "temporal_patch_size": 1,
        "in_channels": channels,
        "spatial_merge_size": 1,
        "image_size": image,
    }


def tower(top: dict, path: Path) -> dict[str, Any] | None:
    """The VisionTower fields of a vision_config kvplan can count, else None."""
    vc = top.get("vision_config")
    if not isinstance(vc, dict):
        return None
    if top.get("model_type") == "mllama":
        return _mllama(top, vc)
    if top.get("model_type") == "gemma3" and vc.get("model_type") == "siglip_vision_model":
        return _siglip(top, vc, path)
    style = _STYLES.get(str(top.get("model_type") or vc.get("model_type") or ""))
    if style is None:
        return None
    hidden = _pos_int(vc, "embed_dim" if style == "qwen2_vl" else "hidden_size")
    if style == "qwen2_vl":
        ratio = vc.get("mlp_ratio", 4)
        inter = int(hidden * ratio) if hidden and isinstance(ratio, (int, float)) else None
        out = _pos_int(vc, "hidden_size")
    else:
        inter, out = _pos_int(vc, "intermediate_size"), _pos_int(vc, "out_hidden_size")
    depth, patch = _pos_int(vc, "depth"), _pos_int(vc, "patch_size")
    if not (hidden and inter and out and depth and patch):
        return None
    deep = vc.get("deepstack_visual_indexes") or []
    fields: dict[str, Any] = {
        "style": style,
        "depth": depth,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "out_hidden_size": out,
        "patch_size": patch,
        "temporal_patch_size": _pos_int(vc, "temporal_patch_size") or 2,
        "in_channels": _pos_int(vc, "in_channels", "in_chans") or 3,
        "spatial_merge_size": _pos_int(vc, "spatial_merge_size") or 2,
        "deepstack_mergers": len(deep) if style == "qwen3_vl" and isinstance(deep, list) else 0,
        "position_embeddings": (_pos_int(vc, "num_position_embeddings") or 0) if style == "qwen3_vl" else 0,
    }
    fields["max_item_tokens"], fields["max_item_rows"] = largest_item(fields, path) or (None, None)
    return fields


def _max_pixels(path: Path) -> int | None:
    """longest_edge (transformers >= 4.5x) or max_pixels (older Qwen2-VL processors) of one file."""
    if not sidecar_present(path):
        return None
    data = read_sidecar(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected an object (a Hugging Face processor config)")
    size = data.get("size")
    if isinstance(size, dict) and _pos_int(size, "longest_edge", "max_pixels"):
        return _pos_int(size, "longest_edge", "max_pixels")
    return _pos_int(data, "max_pixels")


def largest_item(t: dict[str, Any], path: Path) -> tuple[int, int] | None:
    """vLLM's max_tokens_per_mm_item and that item's encoder-output rows, from the processor configs
    beside config.json (None: none there).

    Images: longest_edge / (patch x merge)^2 tokens, one row each. Videos (Qwen3-VL only,
    video_preprocessor_config.json): longest_edge / (temporal_patch x (patch x merge)^2) rows, x 12.5
    tokens. Qwen2/2.5-VL videos depend on the context length (qwen2_vl.py _get_max_video_frames), which
    kvplan does not model: images only. vLLM profiles the modality with the most tokens."""
    if path.name != "config.json":
        return None
    unit = (t["patch_size"] * t["spatial_merge_size"]) ** 2
    found: list[tuple[int, int]] = []  # (tokens, rows)
    image = _max_pixels(path.parent / "preprocessor_config.json")
    if image and image // unit:
        found.append((image // unit, image // unit))
    video = _max_pixels(path.parent / "video_preprocessor_config.json") if t["style"] == "qwen3_vl" else None
    rows = video // (t["temporal_patch_size"] * unit) if video else 0
    if rows:
        found.append((int(rows * VIDEO_TEXT_FACTOR), rows))
    return max(found) if found else None
