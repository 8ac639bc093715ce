"""KV-cache formulas per layer: pure functions, no I/O.

Bits are integers so that group-quantized formats stay exact; bytes appear
when whole blocks are charged.
"""

from __future__ import annotations

import math
from fractions import Fraction

from kvplan.formats import PER_ROW, Format, normalize_dtype_name
from kvplan.specs.models import (
    ChunkedAttention,
    CompressedAttention,
    CompressedLatent,
    CrossAttention,
    HeadLayer,
    LatentAttention,
    Layer,
    RecurrentState,
    SlidingWindow,
)
from kvplan.units import ceil_div


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    # vLLM (vllm/config/model.py get_num_kv_heads at v0.11.0): KV heads split over TP ranks, replicated when tp > num_kv_heads
    return max(1, num_kv_heads // tp)


def indexer_bytes(index_head_dim: int) -> int:
    """Bytes of one DSA indexer key: fp8 values + one fp32 scale per 128 (128 + 4 = 132).
    vLLM vllm/model_executor/models/deepseek_v2.py (DeepseekV32IndexerCache); SGLang
    model_executor/pool_configurator.py: index_head_dim + index_head_dim // 128 * 4."""
    return index_head_dim + index_head_dim // 128 * 4


def fp8_ds_mla_bytes(kv_lora_rank: int, qk_rope_head_dim: int) -> int:
    """fp8_ds_mla: 512 fp8 NoPE + 4 fp32 scales (one per 128) + 64 bf16 RoPE = 656 B per token.
    vLLM vllm/v1/attention/backends/mla/flashmla_sparse.py; SGLang calculate_mla_kv_cache_dim."""
    return kv_lora_rank + kv_lora_rank // 128 * 4 + qk_rope_head_dim * 2


V4_FP8_SCALE_BYTES = 8  # 448 / 64 = 7 UE8M0 scale bytes, padded to 8


def v4_fp8_entry_bytes(head_dim: int, qk_rope_head_dim: int) -> int:
    """DeepSeek-V4 fp8 entry: (512 - 64) fp8 NoPE + 64 bf16 RoPE + 8 B UE8M0 scales = 584 B.
    vLLM vllm/v1/attention/backends/mla/sparse_swa.py (get_kv_cache_shape); SGLang
    pool_configurator.py DSV4PoolConfigurator: qk_nope_head_dim + 2 x qk_rope_head_dim + 8."""
    return head_dim - qk_rope_head_dim + qk_rope_head_dim * 2 + V4_FP8_SCALE_BYTES


def _is_fp8(fmt: Format) -> bool:
    return fmt.name.startswith("fp8") and fmt.value_bits == 8


def latent_bits(layer: LatentAttention | CompressedLatent, fmt: Format) -> int:
    """Bits of one latent entry. Sparse MLA (DSA, V4) stores fp8 in its own layout, scales and a
    bf16 RoPE part included (the engines map --kv-cache-dtype fp8 to it); other formats store
    every value alike."""
    if isinstance(layer, CompressedLatent):
        if _is_fp8(fmt):
            return 8 * v4_fp8_entry_bytes(layer.head_dim, layer.qk_rope_head_dim)
        return fmt.vector_bits(layer.head_dim)
    if layer.index_head_dim and _is_fp8(fmt):
        return 8 * fp8_ds_mla_bytes(layer.kv_lora_rank, layer.qk_rope_head_dim)
    # DeepSeek-V2, arXiv:2405.04434: one latent of kv_lora_rank + qk_rope_head_dim (512 + 64)
    return fmt.vector_bits(layer.latent_dim)


def indexer_bits(layer: Layer) -> int:
    """Bits of the DSA indexer's key per token (latent) or per compressed entry (V4 CSA)."""
    index_head_dim = getattr(layer, "index_head_dim", None)
    return 8 * indexer_bytes(index_head_dim) if index_head_dim else 0


def mixed_indexers(layers) -> bool:
    """True when some latent layers keep a DSA indexer key and others share one (GLM-5.2)."""
    return len({bool(la.index_head_dim) for la in layers if isinstance(la, LatentAttention)}) > 1


def partial_group_note(layers, fmt: Format) -> str | None:
    """A group size that does not divide a cached vector: its last group is short, and kvplan counts it as a
    whole group (one scale and zero point), as vector_bits does; said, since no engine stores such groups."""
    g = fmt.group_size
    if not g or g >= PER_ROW:
        return None
    lengths = set()
    for layer in layers:
        if isinstance(layer, (*HeadLayer, CrossAttention)):
            lengths |= {layer.head_dim, layer.v_dim}
        elif isinstance(layer, (LatentAttention, CompressedLatent)):
            lengths.add(layer.latent_dim if isinstance(layer, LatentAttention) else layer.head_dim)
    odd = sorted(n for n in lengths if n % g)
    if not odd:
        return None
    n = odd[0]
    return (
        f"--kv-quant-group-size {g} does not divide the {n}-value KV vectors: each ends in a group of {n % g} "
        "values, counted as a whole group (its scale and zero point); a divisor of the head size is what a "
        "real kernel would use"
    )


def layer_bits_per_token(layer: Layer, fmt: Format, tp: int = 1) -> int:
    """Bits one token (compressed layers: one compressed entry) adds to this layer's cache on one
    TP rank (0: no per-token cache)."""
    if isinstance(layer, HeadLayer):
        # README, The formulas: per token per layer = 2 (K and V) x h_kv x d_h x bytes
        heads = kv_heads_per_rank(layer.num_kv_heads, tp)
        return heads * (fmt.vector_bits(layer.head_dim) + fmt.vector_bits(layer.v_dim))
    if isinstance(layer, LatentAttention):
        # the latent (and the DSA indexer key) is replicated on every TP rank (README, How the engines size their KV cache)
        return latent_bits(layer, fmt) + indexer_bits(layer)
    if isinstance(layer, CompressedLatent) and layer.ratio:
        return latent_bits(layer, fmt) + indexer_bits(layer)
    return 0  # shared, state, none, a window-only V4 layer (its window: layer_window_bytes)


def layer_window_bytes(layer: Layer, fmt: Format, context_tokens: int) -> int:
    """DeepSeek-V4: the last `window` tokens of every layer, uncompressed (README, The formulas: DeepSeek-V4)."""
    if not isinstance(layer, CompressedLatent):
        return 0
    return ceil_div(min(context_tokens, layer.window) * latent_bits(layer, fmt), 8)


def layer_growth_bits(layer: Layer, fmt: Format, tp: int = 1) -> Fraction:
    """Bits the layer's cache grows by per context token: a compressed layer adds one entry per
    `ratio` tokens (README, The formulas: DeepSeek-V4)."""
    bits = layer_bits_per_token(layer, fmt, tp)
    if isinstance(layer, (CompressedAttention, CompressedLatent)) and layer.ratio:
        return Fraction(bits, layer.ratio)
    return Fraction(bits)


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


def layer_image_bytes(layer: Layer, fmt: Format, tp: int = 1) -> int:
    """Cross-attention (Llama 3.2 Vision): K and V of every image token, for the request's images,
    on one TP rank; fixed per request whatever the text context (vLLM CrossAttentionSpec)."""
    if not isinstance(layer, CrossAttention):
        return 0
    heads = kv_heads_per_rank(layer.num_kv_heads, tp)
    bits = heads * 2 * fmt.vector_bits(layer.head_dim)
    return ceil_div(layer.image_tokens * layer.images_per_request * bits, 8)


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
    if isinstance(layer, (CompressedAttention, CompressedLatent)):
        # README, The formulas: DeepSeek-V4: one entry per m tokens (a V4 window-only layer: none)
        return ceil_div(context_tokens, layer.ratio) if layer.ratio else 0
    if isinstance(layer, (HeadLayer, LatentAttention)):
        return context_tokens
    return 0


def layer_blocks(layer: Layer, context_tokens: int, block_size: int) -> int:
    """Whole blocks one sequence holds in this layer: a request is charged whole blocks."""
    if isinstance(layer, CompressedLatent):
        return ceil_div(layer_entries(layer, context_tokens), block_size)
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


def window_blocks(layer: Layer, context_tokens: int, block_size: int) -> int:
    """Whole blocks of a V4 layer's window: the last `window` tokens can straddle one more block."""
    if not isinstance(layer, CompressedLatent) or context_tokens <= 0:
        return 0
    return min(ceil_div(context_tokens, block_size), ceil_div(layer.window - 1, block_size) + 1)


def layer_request_bytes(layer: Layer, fmt: Format, context_tokens: int, block_size: int, tp: int = 1) -> int:
    """Block-rounded bytes one request of `context_tokens` holds in this layer on one GPU."""
    window_page = (
        ceil_div(block_size * latent_bits(layer, fmt), 8) if isinstance(layer, CompressedLatent) else 0
    )
    return (
        page_bytes(layer, fmt, block_size, tp) * layer_blocks(layer, context_tokens, block_size)
        + window_page * window_blocks(layer, context_tokens, block_size)
        + layer_state_bytes(layer, tp)
        + layer_image_bytes(layer, fmt, tp)
    )


def layer_read_bytes(layer: Layer, fmt: Format, context_tokens: int, block_size: int, tp: int = 1) -> int:
    """Bytes one decode step reads of this layer for one request of `context_tokens`: what it holds, except
    that sparse MLA (DSA) reads the latents of the indexer's top-k tokens and every token's indexer key
    (DeepSeek-V3.2-Exp, github.com/deepseek-ai/DeepSeek-V3.2-Exp: lightning indexer + top-k selection)."""
    topk = getattr(layer, "index_topk", None)
    if not isinstance(layer, LatentAttention) or not topk or context_tokens <= topk:
        return layer_request_bytes(layer, fmt, context_tokens, block_size, tp)
    latent = ceil_div(topk * latent_bits(layer, fmt), 8)  # whole entries gathered, not blocks
    return latent + ceil_div(block_size * indexer_bits(layer), 8) * ceil_div(context_tokens, block_size)


def is_growing(layer: Layer) -> bool:
    """True when the layer's cache grows with the whole context (no window)."""
    if isinstance(layer, CompressedLatent):
        return layer.ratio > 0
    return isinstance(layer, (HeadLayer, LatentAttention)) and not isinstance(
        layer, (SlidingWindow, ChunkedAttention)
    )


def shared_full_blocks(layer: Layer, prefix_tokens: int, block_size: int) -> int:
    """Full blocks of this layer's own entries a shared prefix of `prefix_tokens` fills: only full
    blocks are shared (vLLM vllm/v1/core/kv_cache_utils.py at v0.11.0); a compressed layer's block
    holds `block_size` entries of `ratio` tokens each, and an entry is whole only once its `ratio`
    tokens have arrived (README, The formulas: DeepSeek-V4)."""
    if isinstance(layer, (CompressedAttention, CompressedLatent)):
        return (prefix_tokens // layer.ratio) // block_size if layer.ratio else 0
    return prefix_tokens // block_size


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
    """Sum over layers of the bits one token adds (README, The formulas: L x 2 x h_kv x d_h x bytes);
    compressed layers add their entry / ratio, V4 layers their window's entry unless growing_only."""
    total: Fraction = sum(
        (
            n * layer_growth_bits(layer, fmt, tp)
            for layer, n in grouped(layers)
            if not growing_only or is_growing(layer)
        ),
        Fraction(0),
    )
    if not growing_only:
        total += sum(n * layer_window_bytes(layer, fmt, 1) * 8 for layer, n in grouped(layers))
    return math.ceil(total)


def windowed_cap_bytes(layers, fmt: Format) -> int:
    """The most the windowed (sliding/chunked, V4 window) layers hold for one sequence, whole model."""
    bits = sum(
        n * layer_bits_per_token(layer, fmt) * layer_entries(layer, 1 << 62)
        for layer, n in grouped(layers)
        if not is_growing(layer)
    )
    return ceil_div(bits, 8) + sum(
        n * layer_window_bytes(layer, fmt, 1 << 62) for layer, n in grouped(layers)
    )


def sequence_bytes(
    layers: tuple[Layer, ...] | list[Layer], fmt: Format, context_tokens: int, tp: int = 1
) -> int:
    """Exact KV bytes of one sequence on one TP rank, no block rounding (README, The formulas)."""
    groups = grouped(layers)
    bits = sum(
        n * layer_bits_per_token(layer, fmt, tp) * layer_entries(layer, context_tokens) for layer, n in groups
    )
    return ceil_div(bits, 8) + sum(
        n
        * (
            layer_state_bytes(layer, tp)
            + layer_window_bytes(layer, fmt, context_tokens)
            + layer_image_bytes(layer, fmt, tp)
        )
        for layer, n in groups
    )
