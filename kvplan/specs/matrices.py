"""A model's weights as its checkpoint stores them: one Matrix per weight, under the module names
checkpoints use. The spec readers match a quantization config against these names (hf/quant.py);
kvplan.model counts and places them (params.py, weights.py), the step model sizes its GEMMs."""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.specs.models import (
    CompressedLatent,
    CrossAttention,
    HeadLayer,
    LatentAttention,
    ModelSpec,
    MoE,
    RecurrentState,
    SharedKV,
    VisionTower,
)


def state_mixer_params(h: int, layer: RecurrentState) -> int:
    """Weights of a recurrent mixer from its state's tensors (the projections into and out of it;
    the layouts of vLLM's mamba_mixer2.py, mamba_mixer.py, qwen3_next.py GatedDeltaNet, short_conv.py)."""
    conv_in = layer.conv_channels + layer.conv_groups * layer.conv_group_channels
    conv = conv_in * layer.conv_kernel
    inner = layer.ssm_heads * layer.ssm_head_dim  # the mixer's output width
    if layer.mixer == "mamba2":  # in_proj to z, x, B, C, dt; conv; A, D, dt_bias, norm; out_proj
        return h * (inner + conv_in + layer.ssm_heads) + conv + 3 * layer.ssm_heads + inner + inner * h
    if layer.mixer == "mamba1":  # in_proj (x, z); conv; x_proj (dt, B, C); dt_proj; A; D; out_proj
        dt_rank = -(-h // 16)
        n = layer.ssm_state_dim
        return (
            2 * h * inner + conv + inner * (dt_rank + 2 * n) + dt_rank * inner + inner * n + inner + inner * h
        )
    if layer.mixer == "gdn":  # in_proj q, k, v, z and b, a; conv; A, dt_bias; norm; out_proj
        return (
            h * (conv_in + inner + 2 * layer.ssm_heads)
            + conv
            + 2 * layer.ssm_heads
            + layer.ssm_head_dim
            + inner * h
        )
    if layer.mixer == "short_conv":  # in_proj (B, C, x); conv; out_proj
        return 3 * h * layer.conv_channels + conv + layer.conv_channels * h
    if layer.mixer in ("linear", "kda"):  # q, k, v, gate and out projections
        return 5 * h * inner
    return 4 * h * h  # a stated state size only: count it like a dense attention block


COMPONENTS = ("embedding", "lm_head", "attention", "dense_mlp", "shared_experts", "routed_experts", "vision")


@dataclass(frozen=True)
class Matrix:
    """One weight as a checkpoint stores it: [rows, cols] = a Linear's [out, in], `count` copies
    (routed experts). `names` are its module names inside a layer, in the spellings checkpoints use."""

    layer: int | None  # None: outside the decoder layers (embedding, LM head, final norm, vision tower)
    component: str  # one of COMPONENTS, or "router" / "norms" (always kept at the model dtype)
    name: str  # canonical short name, e.g. "q_proj", "experts.gate_proj"
    rows: int
    cols: int
    names: tuple[str, ...] = ()
    count: int = 1
    replicated: bool = False  # every TP rank holds it whole (vLLM's vision patch/position embeds, norms)
    quantizable: bool = True  # False: not a Linear (a conv, a gate's parameters): kept at the model dtype

    @property
    def params(self) -> int:
        return self.rows * self.cols * self.count


_ATTN = ("self_attn", "mixer", "attn", "attention", "linear_attn")


_MLP = ("mlp", "feed_forward", "block_sparse_moe", "ffn", "mixer")


_MLP_NAMES = {
    "gate_proj": ("gate_proj", "w1"),
    "up_proj": ("up_proj", "w3"),
    "down_proj": ("down_proj", "w2"),
}


def _attention_matrices(spec: ModelSpec, i: int, layer) -> list[Matrix]:
    """The attention (or mixer) projections of layer i, one Matrix each."""
    h, heads = spec.hidden_size, spec.num_attention_heads
    shapes: list[tuple[str, int, int]] = []
    if isinstance(layer, (*HeadLayer, CrossAttention)):
        shapes = [("q_proj", heads * layer.head_dim, h), ("k_proj", layer.num_kv_heads * layer.head_dim, h),
                  ("v_proj", layer.num_kv_heads * layer.v_dim, h), ("o_proj", h, heads * layer.v_dim)]  # fmt: skip
    elif isinstance(layer, LatentAttention):
        qk, v = layer.nope_dim + layer.qk_rope_head_dim, layer.value_dim
        if layer.q_lora_rank:
            shapes = [("q_a_proj", layer.q_lora_rank, h), ("q_b_proj", heads * qk, layer.q_lora_rank)]
        else:
            shapes = [("q_proj", heads * qk, h)]
        shapes += [("kv_a_proj_with_mqa", layer.latent_dim, h),
                   ("kv_b_proj", heads * (layer.nope_dim + v), layer.kv_lora_rank), ("o_proj", h, heads * v)]  # fmt: skip
    elif isinstance(layer, CompressedLatent) and layer.q_lora_rank and layer.o_groups and layer.o_lora_rank:
        # vLLM deepseek_v4.py DeepseekV4Attention: wq_a, wq_b, wkv (K = V), then o_groups grouped projections
        # (wo_a) of heads x head_dim / o_groups inputs to o_lora_rank, and wo_b back to hidden
        q, d, g, o = layer.q_lora_rank, layer.head_dim, layer.o_groups, layer.o_lora_rank
        shapes = [("wq_a", q, h), ("wq_b", heads * d, q), ("wkv", d, h),
                  ("wo_a", g * o, heads * d // g), ("wo_b", h, g * o)]  # fmt: skip
    elif isinstance(layer, SharedKV):
        d = layer.head_dim or spec.hidden_size // heads
        shapes = [("q_proj", heads * d, h), ("o_proj", h, heads * d)]
    elif isinstance(layer, RecurrentState) and layer.mixer == "gdn":
        return _gdn_matrices(spec, i, layer)
    elif isinstance(layer, RecurrentState):  # the mixer's projections, as state_mixer_params counts them
        shapes = [("mixer", state_mixer_params(h, layer), 1)]
    return [Matrix(i, "attention", n, r, c, tuple(f"{a}.{n}" for a in _ATTN)) for n, r, c in shapes]


# a Gated DeltaNet layer's weights under their own names, which quantized checkpoints list one by one
# (Qwen3.5/3.6 ModelOpt quantized_layers: linear_attn.in_proj_qkv, in_proj_z, out_proj in FP8):
# vLLM qwen3_next.py GatedDeltaNet fuses in_proj_qkvz and in_proj_ba; qwen3_5.py splits
# in_proj_qkv, in_proj_z, in_proj_b, in_proj_a. Their params sum to state_mixer_params' "gdn".
_GDN_NAMES = {
    "in_proj_qkv": ("in_proj_qkv", "in_proj_qkvz"),
    "in_proj_z": ("in_proj_z", "in_proj_qkvz"),
    "in_proj_ba": ("in_proj_ba", "in_proj_b", "in_proj_a"),
    "out_proj": ("out_proj",),
    "state": ("conv1d", "A_log", "dt_bias", "norm"),  # not Linear layers: never quantized
}


def _gdn_matrices(spec: ModelSpec, i: int, layer: RecurrentState) -> list[Matrix]:
    h = spec.hidden_size
    conv_in = layer.conv_channels + layer.conv_groups * layer.conv_group_channels
    inner = layer.ssm_heads * layer.ssm_head_dim
    parts = [
        ("in_proj_qkv", conv_in, h),
        ("in_proj_z", inner, h),
        ("in_proj_ba", 2 * layer.ssm_heads, h),
        ("out_proj", h, inner),
        ("state", conv_in * layer.conv_kernel + 2 * layer.ssm_heads + layer.ssm_head_dim, 1),
    ]
    return [
        Matrix(
            i,
            "attention",
            f"mixer.{n}",
            r,
            c,
            tuple(f"{a}.{x}" for a in _ATTN for x in _GDN_NAMES[n]),
            quantizable=n != "state",
        )  # fmt: skip
        for n, r, c in parts
    ]


# Gemma 4 keeps its routed experts beside the MLP, not inside it: `layers.N.experts` and `layers.N.mlp`
# (the dense MLP every layer runs, kvplan's shared expert), as transformers' modeling_gemma4.py
# Gemma4TextDecoderLayer and vLLM's gemma4.py name them; its checkpoints exclude `layers.N.mlp*` from
# quantization, which must not reach the experts
_LAYER_LEVEL_EXPERTS = ("Gemma4",)


def _mlp_matrices(
    spec: ModelSpec, i: int, component: str, size: int, count: int = 1, width: int | None = None
) -> list[Matrix]:
    h = width or spec.hidden_size
    mats = ("gate_proj", "up_proj", "down_proj") if spec.mlp_gated else ("up_proj", "down_proj")
    sub = {"dense_mlp": ("",), "shared_experts": ("shared_experts.", "shared_expert.", "shared_mlp."),
           "routed_experts": ("experts.0.", "experts.")}[component]  # fmt: skip
    prefixes = [f"{a}.{s}" for a in _MLP for s in sub]  # the module path up to the projection
    if (spec.architecture or "").startswith(_LAYER_LEVEL_EXPERTS) and component != "dense_mlp":
        prefixes = list(sub) if component == "routed_experts" else ["mlp."]
    out = []
    for m in mats:
        rows, cols = (h, size) if m == "down_proj" else (size, h)
        names = tuple(p + n for p in prefixes for n in _MLP_NAMES[m])
        prefix = "experts." if component == "routed_experts" else ""
        out.append(Matrix(i, component, prefix + m, rows, cols, names, count))
    return out


def weight_matrices(spec: ModelSpec) -> list[Matrix]:
    """Every weight of the architecture as matrices; their params sum to architecture_params."""
    h = spec.hidden_size
    out = [Matrix(None, "embedding", "embed_tokens", spec.vocab_size, h, ("embed_tokens", "embeddings"))]
    if not spec.tie_word_embeddings:
        out.append(Matrix(None, "lm_head", "lm_head", spec.vocab_size, h, ("lm_head", "output")))
    out.append(Matrix(None, "norms", "norm", 1, h))
    moe = spec.moe
    for i, layer in enumerate(spec.layers):
        out += _attention_matrices(spec, i, layer)
        out.append(Matrix(i, "norms", "layernorms", 2, h))
        kind = spec.mlp_kind(i)
        if moe is not None and kind == "moe":
            out += _moe_matrices(spec, i, moe)
        elif kind == "dense" and spec.intermediate_sizes:  # per-layer widths (DeciLM ffn_mult, Gemma-3n)
            if spec.intermediate_sizes[i]:
                out += _mlp_matrices(spec, i, "dense_mlp", spec.intermediate_sizes[i])
        elif kind == "dense" and spec.intermediate_size:
            out += _mlp_matrices(spec, i, "dense_mlp", spec.intermediate_size)
    if spec.vision_tower is not None:
        out += vision_matrices(spec.vision_tower)
    return out


def vision_matrices(v: VisionTower) -> list[Matrix]:
    """The vision tower's weights as vLLM 0.11/0.12 builds them (vllm/model_executor/models/qwen2_vl.py,
    qwen2_5_vl.py, qwen3_vl.py). The blocks' qkv/proj and MLP and the mergers' two linears are
    Column/RowParallelLinear (TP-sharded; a RowParallel bias is whole on every rank); the Conv3d patch
    embed, Qwen3-VL's position table and the norms are replicated. Biases are matrices of one row."""
    if v.style == "mllama":
        return _mllama_vision(v)
    if v.style == "siglip":
        return _siglip_vision(v)
    h, inter, merged = v.hidden_size, v.intermediate_size, v.hidden_size * v.spatial_merge_size**2
    rms = v.style == "qwen2_5_vl"  # RMSNorm: a weight only; LayerNorm: weight and bias
    norm = 1 if rms else 2
    conv = v.in_channels * v.temporal_patch_size * v.patch_size**2
    out = [Matrix(None, "vision", "patch_embed", h, conv, ("visual.patch_embed.proj",), replicated=True)]
    if v.style == "qwen3_vl":  # Conv3d(bias=True) and nn.Embedding(num_position_embeddings, hidden)
        out.append(Matrix(None, "vision", "patch_embed.bias", 1, h, replicated=True))
        out.append(Matrix(None, "vision", "pos_embed", v.position_embeddings, h, ("visual.pos_embed",), replicated=True))  # fmt: skip
    d = v.depth
    mlp = [("mlp.gate_proj", inter, h), ("mlp.up_proj", inter, h)] if rms else [("mlp.fc1", inter, h)]
    out += [
        Matrix(None, "vision", "blocks.norms", 2 * d, norm * h, replicated=True),
        Matrix(None, "vision", "blocks.attn.qkv", 3 * h, h, ("attn.qkv",), d),
        Matrix(None, "vision", "blocks.attn.qkv.bias", 1, 3 * h, count=d),
        Matrix(None, "vision", "blocks.attn.proj", h, h, ("attn.proj",), d),
        *[Matrix(None, "vision", f"blocks.{n}", r, c, (n,), d) for n, r, c in mlp],
        Matrix(None, "vision", "blocks.mlp.column.bias", 1, inter * len(mlp), count=d),
        Matrix(None, "vision", "blocks.mlp.fc2", h, inter, ("mlp.fc2", "mlp.down_proj"), d),
        Matrix(None, "vision", "blocks.row.bias", 1, 2 * h, count=d, replicated=True),  # proj, fc2
    ]
    mergers = 1 + v.deepstack_mergers
    # the main merger normalises hidden-wide before the merge; Qwen3-VL's deepstack mergers after it
    norms = norm * (h + v.deepstack_mergers * merged)
    out += [
        Matrix(None, "vision", "merger.norms", 1, norms, replicated=True),
        Matrix(None, "vision", "merger.fc1", merged, merged, ("merger.mlp.0", "linear_fc1"), mergers),
        Matrix(None, "vision", "merger.fc1.bias", 1, merged, count=mergers),
        Matrix(
            None, "vision", "merger.fc2", v.out_hidden_size, merged, ("merger.mlp.2", "linear_fc2"), mergers
        ),
        Matrix(None, "vision", "merger.fc2.bias", 1, v.out_hidden_size, count=mergers, replicated=True),
    ]
    return out


def _siglip_vision(v: VisionTower) -> list[Matrix]:
    """Gemma 3's SigLIP tower and projector (vLLM siglip.py SiglipVisionModel, gemma3_mm.py
    Gemma3MultiModalProjector). Embeddings: a Conv2d with bias (replicated) and a position table of
    (image / patch)^2 rows (a VocabParallelEmbedding, split over TP). Layers: q/k/v (QKVParallelLinear) and
    out_proj, fc1 and fc2, each with a bias (a RowParallel bias whole on every rank), two LayerNorms; a
    post-LayerNorm. Projector: mm_input_projection_weight [vision hidden, text hidden] and an RMSNorm."""
    h, inter, d = v.hidden_size, v.intermediate_size, v.depth
    patches = (v.image_size // v.patch_size) ** 2
    conv = v.in_channels * v.patch_size**2
    names = ("vision_tower.vision_model.embeddings.patch_embedding",)
    return [
        Matrix(None, "vision", "patch_embedding", h, conv, names, replicated=True, quantizable=False),
        Matrix(None, "vision", "patch_embedding.bias", 1, h, replicated=True, quantizable=False),
        Matrix(None, "vision", "position_embedding", patches, h, quantizable=False),
        Matrix(None, "vision", "layer_norms", 1, (2 * d + 1) * 2 * h, replicated=True, quantizable=False),
        Matrix(None, "vision", "layers.self_attn.qkv", 3 * h, h, ("self_attn.qkv_proj",), d),
        Matrix(None, "vision", "layers.self_attn.qkv.bias", 1, 3 * h, count=d),
        Matrix(None, "vision", "layers.self_attn.out_proj", h, h, ("self_attn.out_proj",), d),
        Matrix(None, "vision", "layers.mlp.fc1", inter, h, ("mlp.fc1",), d),
        Matrix(None, "vision", "layers.mlp.fc1.bias", 1, inter, count=d),
        Matrix(None, "vision", "layers.mlp.fc2", h, inter, ("mlp.fc2",), d),
        Matrix(None, "vision", "layers.row.bias", 1, 2 * h, count=d, replicated=True),  # out_proj, fc2
        Matrix(None, "vision", "projector", h, v.out_hidden_size, ("multi_modal_projector",), replicated=True,
               quantizable=False),
        Matrix(None, "vision", "projector.norm", 1, h, replicated=True, quantizable=False),
    ]  # fmt: skip


def _mllama_vision(v: VisionTower) -> list[Matrix]:
    """Llama 3.2 Vision's tower and projector (transformers modeling_mllama.py MllamaVisionModel,
    MllamaForConditionalGeneration.multi_modal_projector; vLLM mllama.py builds the same weights, its
    attention and MLP Column/RowParallel). Layers: q/k/v/o without bias, fc1/fc2 with bias, two
    LayerNorms; the global layers add two scalar gates. Embeddings: a bias-free Conv2d, a class token,
    a patch-position table and its gate, a tile-position table per aspect-ratio id (ids 0..n), and the
    pre- and post-tile embeddings with their gates."""
    h, inter, layers = v.hidden_size, v.intermediate_size, v.depth + v.global_layers
    patches = (v.image_size // v.patch_size) ** 2 + 1  # with the class token
    ids = v.aspect_ratios + 1  # max_aspect_ratio_id + 1 rows
    conv = v.in_channels * v.patch_size**2
    return [
        Matrix(
            None,
            "vision",
            "patch_embedding",
            h,
            conv,
            ("vision_model.patch_embedding",),
            replicated=True,
            quantizable=False,
        ),  # fmt: skip
        Matrix(
            None, "vision", "position_embeddings", patches + 1, h, replicated=True, quantizable=False
        ),  # + class
        Matrix(
            None,
            "vision",
            "tile_position_embedding",
            ids,
            v.max_num_tiles * patches * h,
            replicated=True,
            quantizable=False,
        ),  # fmt: skip
        Matrix(
            None,
            "vision",
            "tile_embeddings",
            2 * ids,
            v.max_num_tiles * h,
            replicated=True,
            quantizable=False,
        ),
        Matrix(None, "vision", "gates", 1, 3 + 2 * v.global_layers, replicated=True, quantizable=False),
        Matrix(None, "vision", "layernorms", 1, 4 * h + layers * 4 * h, replicated=True, quantizable=False),
        Matrix(None, "vision", "layers.self_attn.qkv", 3 * h, h, ("self_attn.qkv_proj",), layers),
        Matrix(None, "vision", "layers.self_attn.o_proj", h, h, ("self_attn.o_proj",), layers),
        Matrix(None, "vision", "layers.mlp.fc1", inter, h, ("mlp.fc1",), layers),
        Matrix(None, "vision", "layers.mlp.fc2", h, inter, ("mlp.fc2",), layers),
        Matrix(None, "vision", "layers.mlp.bias", 1, inter + h, count=layers),
        Matrix(
            None,
            "vision",
            "multi_modal_projector",
            v.out_hidden_size,
            v.projector_in + 1,
            ("multi_modal_projector",),
        ),  # fmt: skip
    ]


def _moe_matrices(spec: ModelSpec, i: int, moe: MoE) -> list[Matrix]:
    h = spec.hidden_size
    latent = moe.expert_hidden_size or h
    out = _mlp_matrices(spec, i, "routed_experts", moe.expert_intermediate_size, moe.num_experts, latent)
    if latent != h:  # Nemotron-3 latent MoE: experts work in a smaller space, projected in and out
        names = tuple(f"{a}.fc1_latent_proj" for a in _MLP)
        out += [Matrix(i, "routed_experts", "latent_in", latent, h, names),
                Matrix(i, "routed_experts", "latent_out", h, latent, tuple(n.replace("fc1", "fc2") for n in names))]  # fmt: skip
    shared_size = moe.shared_expert_intermediate_size or moe.expert_intermediate_size
    for _ in range(moe.shared_experts):
        out += _mlp_matrices(spec, i, "shared_experts", shared_size)
    out.append(Matrix(i, "router", "gate", moe.num_experts, h, tuple(f"{a}.gate" for a in _MLP)))
    return out
