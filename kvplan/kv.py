"""KV-cache formulas per layer: pure functions, no I/O.

Bits are integers so that group-quantized formats stay exact; bytes appear
when whole blocks are charged.
"""

from __future__ import annotations

from kvplan.formats import Format, normalize_dtype_name
from kvplan.specs.models import (
    ChunkedAttention,
    CompressedAttention,
    HeadLayer,
    LatentAttention,
    Layer,
    RecurrentState,
    SlidingWindow,
)
from kvplan.units import ceil_div


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    # engines.md (vLLM): KV heads split over TP ranks, replicated when tp > num_kv_heads
    return max(1, num_kv_heads // tp)


def layer_bits_per_token(layer: Layer, fmt: Format, tp: int = 1) -> int:
    """Bits one token adds to this layer's cache on one TP rank (0: no per-token cache)."""
    if isinstance(layer, HeadLayer):
        # seed 000 15.2: per token per layer = 2 (K and V) x h_kv x d_h x bytes
        heads = kv_heads_per_rank(layer.num_kv_heads, tp)
        return heads * (fmt.vector_bits(layer.head_dim) + fmt.vector_bits(layer.v_dim))
    if isinstance(layer, LatentAttention):
        # seed 001 10.2.7: one latent of kv_lora_rank + qk_rope_head_dim (512 + 64); replicated on TP
        return fmt.vector_bits(layer.latent_dim)
    return 0  # shared, state, none


# bytes per value of a recurrent state's dtype; "auto" (unresolved) is the model's 16-bit dtype
_STATE_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "auto": 2}


def state_parts_per_rank(layer: RecurrentState, tp: int = 1) -> tuple[int, int]:
    """(conv state bytes, recurrent/SSM state bytes) of one sequence on one TP rank.

    vLLM mamba_utils.py MambaStateShapeCalculator: conv (conv_kernel - 1, channels / tp), where
    Mamba-2's n_groups are replicated up to tp when tp does not divide them
    (extra_groups_for_head_shards); SSM (heads / tp, head_dim, state_dim)."""
    groups = layer.conv_groups
    if groups and groups % tp:
        groups = tp
    channels = ceil_div(layer.conv_channels + groups * layer.conv_group_channels, tp)
    conv = max(layer.conv_kernel - 1, 0) * channels
    ssm = ceil_div(layer.ssm_heads, tp) * layer.ssm_head_dim * layer.ssm_state_dim
    conv_bytes = _STATE_DTYPE_BYTES[normalize_dtype_name(layer.conv_dtype)]
    return conv * conv_bytes, ssm * _STATE_DTYPE_BYTES[normalize_dtype_name(layer.ssm_dtype)]


def layer_state_bytes(layer: Layer, tp: int = 1) -> int:
    """Fixed bytes per sequence (linear attention / Mamba state) on one TP rank."""
    if not isinstance(layer, RecurrentState):
        return 0
    if layer.mixer == "fixed":
        return ceil_div(layer.state_bytes or 0, tp)
    return sum(state_parts_per_rank(layer, tp))


def layer_entries(layer: Layer, context_tokens: int) -> int:
    """Token entries the layer holds for one sequence of `context_tokens` (no block rounding)."""
    if isinstance(layer, SlidingWindow):
        return min(context_tokens, layer.window)
    if isinstance(layer, ChunkedAttention):
        return min(context_tokens, layer.chunk)
    if isinstance(layer, CompressedAttention):
        # seed 001 10.2.8: one entry per m tokens
        return ceil_div(context_tokens, layer.ratio)
    if isinstance(layer, (HeadLayer, LatentAttention)):
        return context_tokens
    return 0


def layer_blocks(layer: Layer, context_tokens: int, block_size: int) -> int:
    """Whole blocks one sequence holds in this layer: a request is charged whole blocks."""
    if context_tokens <= 0 or not isinstance(layer, (HeadLayer, LatentAttention)):
        return 0
    growing = ceil_div(context_tokens, block_size)
    if isinstance(layer, SlidingWindow):
        # the last `window` tokens can straddle one more block than they fill
        return min(growing, ceil_div(layer.window - 1, block_size) + 1)
    if isinstance(layer, ChunkedAttention):
        extra = 1 if layer.chunk % block_size else 0
        return min(growing, ceil_div(layer.chunk, block_size) + extra)
    if isinstance(layer, CompressedAttention):
        return ceil_div(ceil_div(context_tokens, layer.ratio), block_size)
    return growing


def is_growing(layer: Layer) -> bool:
    """True when the layer's cache grows with the whole context (no window)."""
    return isinstance(layer, (HeadLayer, LatentAttention)) and not isinstance(
        layer, (SlidingWindow, ChunkedAttention)
    )


def page_bytes(layer: Layer, fmt: Format, block_size: int, tp: int = 1) -> int:
    """Bytes of one block of `block_size` tokens of this layer on one rank."""
    return ceil_div(block_size * layer_bits_per_token(layer, fmt, tp), 8)


def grouped(layers) -> list[tuple[Layer, int]]:
    """(layer, how many times it occurs): a model tiles a few layer objects over its depth, so
    per-layer formulas need computing once per distinct object, not once per layer."""
    counts: dict[int, list] = {}
    for layer in layers:
        entry = counts.get(id(layer))
        if entry is None:
            counts[id(layer)] = [layer, 1]
        else:
            entry[1] += 1
    return [(layer, n) for layer, n in counts.values()]


def model_bits_per_token(layers, fmt: Format, tp: int = 1, growing_only: bool = False) -> int:
    """Sum over layers of the bits one token adds (seed 000 15.2: L x 2 x h_kv x d_h x bytes)."""
    return sum(
        n * layer_bits_per_token(layer, fmt, tp)
        for layer, n in grouped(layers)
        if not growing_only or is_growing(layer)
    )


def windowed_cap_bytes(layers, fmt: Format) -> int:
    """The most the windowed (sliding/chunked) layers hold for one sequence, whole model."""
    bits = sum(
        n * layer_bits_per_token(layer, fmt) * layer_entries(layer, 1 << 62)
        for layer, n in grouped(layers)
        if not is_growing(layer)
    )
    return ceil_div(bits, 8)


def sequence_bytes(
    layers: tuple[Layer, ...] | list[Layer], fmt: Format, context_tokens: int, tp: int = 1
) -> int:
    """Exact KV bytes of one sequence on one TP rank, no block rounding (seed 000 15.3)."""
    groups = grouped(layers)
    bits = sum(
        n * layer_bits_per_token(layer, fmt, tp) * layer_entries(layer, context_tokens) for layer, n in groups
    )
    return ceil_div(bits, 8) + sum(n * layer_state_bytes(layer, tp) for layer, n in groups)
