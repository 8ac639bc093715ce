"""Model and GPU specs: validated once at the edge, then typed objects everywhere.

A model is a list of layers, each described by what it keeps in the KV cache.
YAML writes that list compactly as named `layer_types` and a `layer_pattern`
tiled over `num_layers` (e.g. five sliding layers then one full, repeated).
"""

from __future__ import annotations

import typing
from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, Union

from kvplan.formats import KV_DTYPES, normalize_dtype_name
from kvplan.specs import schema
from kvplan.specs.record import Record

if TYPE_CHECKING:
    # Only in annotations: kvplan/specs/schema.py evaluates them, with pydantic, to validate.
    from pydantic import Field, PositiveInt

S = TypeVar("S", bound=Record)


class _Strict(Record):
    """Validation (kvplan/specs/schema.py) forbids unknown fields; every spec is frozen."""

    @classmethod
    def model_validate(cls: type[S], data: Any) -> S:
        return schema.validate_record(cls, data, LAYER_CLASSES, OTHER_RECORDS)


class FullAttention(_Strict):
    """MHA/GQA/MQA: K and V for every head, for every token."""

    kind: Literal["full"] = "full"
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    head_dim_v: PositiveInt | None = None

    @property
    def v_dim(self) -> int:
        return self.head_dim_v or self.head_dim


class SlidingWindow(FullAttention):
    """Keeps only the last `window` tokens."""

    kind: Literal["sliding"] = "sliding"  # type: ignore[assignment]
    window: PositiveInt


class ChunkedAttention(FullAttention):
    """Chunked local attention (Llama 4): a token sees only its own chunk of `chunk` tokens."""

    kind: Literal["chunked"] = "chunked"  # type: ignore[assignment]
    chunk: PositiveInt


class CompressedAttention(FullAttention):
    """One KV entry per `ratio` tokens (token-compressed attention, README, The formulas: DeepSeek-V4)."""

    kind: Literal["compressed"] = "compressed"  # type: ignore[assignment]
    ratio: Annotated[int, Field(ge=2)]


class LatentAttention(_Strict):
    """MLA: one latent of kv_lora_rank + qk_rope_head_dim values per token, shared by K and V."""

    kind: Literal["mla"] = "mla"
    kv_lora_rank: PositiveInt
    qk_rope_head_dim: PositiveInt
    # Only for parameter counting; they do not change the cache.
    qk_nope_head_dim: PositiveInt | None = None
    v_head_dim: PositiveInt | None = None
    q_lora_rank: PositiveInt | None = None
    # DSA (DeepSeek-V3.2, GLM-5): the sparse-attention indexer keeps one key of this width per token
    index_head_dim: PositiveInt | None = None
    # DSA: the tokens each query attends to, the indexer's top-k (config.json index_topk); time only
    index_topk: PositiveInt | None = None

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def nope_dim(self) -> int:
        """Per-head query/key width without RoPE; 128 when unstated (DeepSeek-V2/V3's config.json)."""
        return self.qk_nope_head_dim or 128

    @property
    def value_dim(self) -> int:
        """Per-head value width; the nope width when unstated (DeepSeek-V2/V3: both 128)."""
        return self.v_head_dim or self.nope_dim


class CompressedLatent(_Strict):
    """DeepSeek-V4 attention (README, The formulas: DeepSeek-V4): one latent of `head_dim` values (K = V) per entry;
    the last `window` tokens uncompressed, plus one entry per `ratio` tokens (0: window only).
    CSA layers (`index_head_dim` set) add the sparse indexer's key per compressed entry; HCA layers
    attend densely over their entries."""

    kind: Literal["compressed_mla"] = "compressed_mla"
    head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt
    window: PositiveInt
    ratio: Annotated[int, Field(ge=0)]
    index_head_dim: PositiveInt | None = None
    # parameter counting only (vLLM deepseek_v4.py DeepseekV4Attention): wq_a/wq_b through q_lora_rank, one wkv of
    # head_dim, the output through o_groups grouped projections to o_lora_rank each; unstated: not counted (said)
    q_lora_rank: PositiveInt | None = None
    o_groups: PositiveInt | None = None
    o_lora_rank: PositiveInt | None = None

    def _check(self) -> CompressedLatent:  # run after field validation (schema.py)
        if self.ratio == 1:
            raise ValueError("ratio 1 compresses nothing: write 0 for a window-only layer")
        if self.qk_rope_head_dim >= self.head_dim:
            raise ValueError(
                f"qk_rope_head_dim {self.qk_rope_head_dim} must be below head_dim {self.head_dim}"
            )
        return self


class SharedKV(_Strict):
    """Reuses the KV of an earlier layer (cross-layer attention, CLA, arXiv:2405.12981)."""

    kind: Literal["shared"] = "shared"
    source: Annotated[int, Field(le=-1)] = -1  # offset of the producing layer, e.g. -1 = previous
    num_kv_heads: PositiveInt | None = None  # for parameter counting only
    head_dim: PositiveInt | None = None


class RecurrentState(_Strict):
    """A fixed state per sequence, whatever the context: Mamba-1/2, Gated DeltaNet, short
    convolutions, linear attention. Either `state_bytes` (a stated size) or the state's tensors:
    a convolution window of `conv_kernel - 1` steps over `conv_channels` (+ `conv_groups` x
    `conv_group_channels`, Mamba-2's B/C groups), and a recurrent (SSM) state of
    `ssm_heads x ssm_head_dim x ssm_state_dim` values. Shapes follow vLLM's
    vllm/model_executor/layers/mamba/mamba_utils.py (MambaStateShapeCalculator)."""

    kind: Literal["state"] = "state"
    mixer: Literal["fixed", "mamba1", "mamba2", "gdn", "short_conv", "linear", "kda"] = "fixed"
    state_bytes: Annotated[int, Field(ge=0)] | None = None  # mixer "fixed": bytes per sequence
    conv_channels: Annotated[int, Field(ge=0)] = 0
    conv_groups: Annotated[int, Field(ge=0)] = 0  # Mamba-2 n_groups (replicated when TP does not divide)
    conv_group_channels: Annotated[int, Field(ge=0)] = 0  # per group: 2 x ssm_state_dim (B and C)
    conv_kernel: Annotated[int, Field(ge=0)] = 0
    ssm_heads: Annotated[int, Field(ge=0)] = 0
    ssm_head_dim: Annotated[int, Field(ge=0)] = 0
    ssm_state_dim: Annotated[int, Field(ge=0)] = 0
    # "auto": the engine decides (vLLM: the model dtype; SGLang: fp32 SSM, bf16 conv)
    conv_dtype: str = "auto"
    ssm_dtype: str = "auto"

    def _check(self) -> RecurrentState:  # run after field validation (schema.py)
        if self.mixer == "fixed" and not self.state_bytes:
            raise ValueError("a state layer needs state_bytes >= 1, or a mixer with its tensor sizes")
        if self.mixer != "fixed" and not (self.conv_channels or self.ssm_heads):
            raise ValueError(f"mixer {self.mixer}: give conv_channels/conv_kernel and/or ssm_heads/dims")
        conv = max(self.conv_kernel - 1, 0) * (
            self.conv_channels + self.conv_groups * self.conv_group_channels
        )
        ssm = self.ssm_heads * self.ssm_head_dim * self.ssm_state_dim
        if self.mixer != "fixed" and not (
            conv or ssm
        ):  # a state of (conv_kernel - 1) rows and/or heads x dims
            raise ValueError(
                f"mixer {self.mixer}: the state holds nothing (conv_kernel - 1 = {max(self.conv_kernel - 1, 0)} rows, "
                f"ssm {self.ssm_heads} x {self.ssm_head_dim} x {self.ssm_state_dim}): give conv_kernel >= 2 with "
                "conv_channels, or ssm_heads, ssm_head_dim and ssm_state_dim"
            )
        for what in ("conv_dtype", "ssm_dtype"):
            value = getattr(self, what)
            if value != "auto" and normalize_dtype_name(value) not in ("fp32", "fp16", "bf16"):
                raise ValueError(f"{what} must be auto, fp32, fp16 or bf16, not {value!r}")
        return self


class NoCache(_Strict):
    kind: Literal["none"] = "none"


class CrossAttention(_Strict):
    """Cross-attention to image tokens (Llama 3.2 Vision): K/V of `image_tokens` per image, held once
    per request whatever the text context (vLLM CrossAttentionSpec: sized by encoder tokens)."""

    kind: Literal["cross"] = "cross"
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    image_tokens: PositiveInt  # per image: max_num_tiles x ((image_size // patch_size)^2 + 1)
    images_per_request: Annotated[int, Field(ge=0)] = 1  # an assumption, stated in the plan's notes

    @property
    def v_dim(self) -> int:
        return self.head_dim


# Any layer; validation tells them apart by `kind` (schema.py makes it a discriminated union).
Layer = Union[  # noqa: UP007 - a runtime alias others import; `|` of classes is the same thing
    SlidingWindow,
    ChunkedAttention,
    CompressedAttention,
    FullAttention,
    LatentAttention,
    CompressedLatent,
    SharedKV,
    RecurrentState,
    NoCache,
    CrossAttention,
]
HeadLayer = (FullAttention, SlidingWindow, ChunkedAttention, CompressedAttention)
# every layer class, in the order validation tries them (subclasses before their bases)
LAYER_CLASSES: tuple[type[_Strict], ...] = typing.get_args(Layer)


class MoE(_Strict):
    num_experts: PositiveInt
    experts_per_token: PositiveInt
    shared_experts: Annotated[int, Field(ge=0)] = 0
    expert_intermediate_size: PositiveInt
    shared_expert_intermediate_size: PositiveInt | None = None
    # Nemotron-3 latent MoE (moe_latent_size): routed experts work in this width, not hidden_size
    expert_hidden_size: PositiveInt | None = None
    # Layers that are MoE: all but the first `first_dense_layers`, every `layer_step`-th.
    first_dense_layers: Annotated[int, Field(ge=0)] = 0
    layer_step: PositiveInt = 1

    def _check(self) -> MoE:  # run after field validation (schema.py)
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) exceeds num_experts ({self.num_experts})"
            )
        return self


def _check_names(name: str, display_name: str | None) -> None:
    """A name is printed in headers, tables and CSV: printable text, not empty, no control characters
    (a newline or an escape sequence would break the output or colour the terminal)."""
    for key, value in (("name", name), ("display_name", display_name)):
        if value is not None and (not value.strip() or not value.isprintable()):
            raise ValueError(f"{key}: {value!r} is not a printable name; use letters, digits and punctuation")


def _check_dtype(value: str | None, table: dict, what: str) -> str | None:
    if value is None:
        return None
    key = normalize_dtype_name(value)
    if key not in table:
        raise ValueError(f"{what} {value!r} is not one of {', '.join(table)}")
    return key


def _check_weight_formats(spec: ModelSpec) -> None:
    from kvplan.errors import UsageError
    from kvplan.formats import weight_format

    named = {"weight_dtype": spec.weight_dtype, "expert_weight_dtype": spec.expert_weight_dtype}
    named.update({f"weight_formats.{k}": v for k, v in spec.weight_formats.items()})
    for what, value in named.items():
        try:
            if value is not None:
                weight_format(value)
        except UsageError as exc:
            raise ValueError(f"{what} {value!r}: {exc}") from None


class VisionTower(_Strict):
    """A Qwen2-VL / Qwen2.5-VL / Qwen3-VL style vision tower (config.json's vision_config), as vLLM
    builds it (qwen2_vl.py, qwen2_5_vl.py, qwen3_vl.py): a Conv3d patch embed, `depth` ViT blocks, a
    patch merger (merge^2 patches -> one out_hidden_size token), Qwen3-VL's deepstack mergers.
    Or Llama 3.2 Vision's (style mllama, transformers modeling_mllama.py MllamaVisionModel): a Conv2d
    patch embed, tile and position embeddings, `depth` local and `global_layers` gated layers, and the
    multi_modal_projector from the concatenated intermediate outputs (`projector_in` wide) to the text.
    Or Gemma 3's (style siglip, vLLM gemma3_mm.py over siglip.py): a SigLIP ViT of `depth` layers, a position
    table of (image_size / patch)^2 rows, and the multi_modal_projector's one hidden x text-hidden matrix."""

    style: Literal["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "mllama", "siglip"]
    depth: PositiveInt
    hidden_size: PositiveInt
    intermediate_size: PositiveInt
    out_hidden_size: PositiveInt
    patch_size: PositiveInt
    temporal_patch_size: PositiveInt = 2
    in_channels: PositiveInt = 3
    spatial_merge_size: PositiveInt = 2
    deepstack_mergers: int = 0  # Qwen3-VL: one merger per deepstack_visual_indexes entry
    position_embeddings: int = 0  # Qwen3-VL: a learned num_position_embeddings x hidden table
    # mllama: the gated global layers, the image side, the tiles, the aspect-ratio ids and the projector's input
    global_layers: int = 0
    image_size: int = 0
    max_num_tiles: int = 0
    aspect_ratios: int = 0
    projector_in: int = 0
    # the largest multimodal item in encoder tokens (vLLM's max_tokens_per_mm_item), from the processor
    # configs beside config.json; None when they are absent
    max_item_tokens: PositiveInt | None = None
    # that item's encoder-output rows (its merged patches; a Qwen3-VL video's before the timestamp text)
    max_item_rows: PositiveInt | None = None

    @property
    def encoder_output_width(self) -> int:
        """Width of one encoder-output token: out_hidden_size, times (1 + deepstack) for Qwen3-VL."""
        return self.out_hidden_size * (1 + self.deepstack_mergers)

    @property
    def pixel_patch_bytes(self) -> int:
        """One row of the processor's pixel_values: in_channels x temporal_patch x patch^2 values in
        float32 (transformers' Qwen2-VL image and Qwen3-VL video processors normalise in float32)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2 * 4


class ModelSpec(_Strict):
    name: str
    display_name: str | None = None
    hf_id: str | None = None
    architecture: str | None = None  # config.json `architectures[0]`; engines key some defaults on it
    pooling_config: bool = False  # a sentence-transformers modules.json with a Pooling module beside it
    vision_encoder: bool = False  # config.json has a vision_config: the engine also profiles an image encoder
    vision_tower: VisionTower | None = None  # the vision_config kvplan can count (None: it cannot)
    # config.json's vision_config (num_hidden_layers, hidden_size) as SGLang's server_args reads them
    # (defaults 24, 1024); it lowers --mem-fraction-static by them (engines/sglang.py vlm_fraction_factor)
    vision_vit: Annotated[list[PositiveInt], Field(min_length=2, max_length=2)] | None = None
    aliases: list[str] = []
    sources: Annotated[list[str], Field(min_length=1)]
    notes: list[str] = []
    warnings: list[str] = []  # fields read from a config.json that kvplan could not model
    # how a config.json was read where a figure rests on that reading (torch_dtype unknown, a window as long
    # as the context, hash-routed layers, ...): printed with every plan's assumptions
    assumptions: list[str] = []

    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    intermediate_size: PositiveInt | None = None
    # per decoder layer (DeciLM ffn_mult, Gemma-3n lists); 0 = no MLP in that layer; overrides the above
    intermediate_sizes: list[Annotated[int, Field(ge=0)]] = []
    mlp_gated: bool = True
    vocab_size: PositiveInt
    tie_word_embeddings: bool = False
    max_context: PositiveInt
    # the context vLLM (0.12 and later) starts with when no --max-model-len is given, where it is not max_context
    # (LongRoPE: original_max_position_embeddings), and SGLang's own maximum where it derives another (YaRN
    # blocks naming original_max_position_embeddings): kvplan/specs/hf/rope.py
    vllm_default_context: PositiveInt | None = None
    sglang_max_context: PositiveInt | None = None
    # MTP layers in the checkpoint (config.json num_nextn_predict_layers): the draft of --speculative-config
    # mtp / SGLang NEXTN, each one decoder layer like the target's (kvplan/plan/draft.py)
    mtp_layers: Annotated[int, Field(ge=0)] = 0
    # an EAGLE-3 draft's LM head predicts over this reduced vocabulary (config.json draft_vocab_size)
    draft_vocab_size: PositiveInt | None = None

    total_params: PositiveInt | None = None
    active_params: PositiveInt | None = None
    moe: MoE | None = None

    weight_dtype: str = "bf16"
    expert_weight_dtype: str | None = None
    activation_dtype: str = "bf16"
    # the config's torch_dtype when it is not what an engine serves by default (a float32 checkpoint:
    # activation_dtype then holds bf16, and each engine's --dtype auto rule decides)
    config_dtype: str | None = None
    # Per-component weight formats of a quantized checkpoint (README, Weight formats): keys
    # `component`, `component.matrix`, `component.matrix@layer`; unlisted weights: weight_dtype.
    weight_formats: dict[str, str] = {}
    checkpoint_weight_bytes: PositiveInt | None = None  # model.safetensors.index.json metadata.total_size
    checkpoint_holds_mtp: bool = True  # the index names the MTP layers' tensors (or cannot tell)
    # the KV format the checkpoint's quantization config names (ModelOpt kv_cache_quant_algo FP8,
    # compressed-tensors kv_cache_scheme): the engines' --kv-cache-dtype auto resolves to it
    checkpoint_kv_cache_dtype: str | None = None

    layer_types: dict[str, Layer]
    layer_pattern: Annotated[list[str], Field(min_length=1)]
    # which layers have an MLP, tiled like layer_pattern: "dense", "moe" or "none" (hybrid models
    # whose mixer and MLP are separate layers, e.g. Nemotron-H); unset: every layer has one
    mlp_pattern: list[Literal["dense", "moe", "none"]] | None = None

    def _check(self) -> ModelSpec:  # run after field validation (schema.py)
        _check_names(self.name, self.display_name)
        for name in self.layer_pattern:
            if name not in self.layer_types:
                raise ValueError(
                    f"layer_pattern names {name!r}, which is not in layer_types "
                    f"({', '.join(self.layer_types)})"
                )
        if self.mlp_pattern is not None and not self.mlp_pattern:
            raise ValueError("mlp_pattern, when given, needs at least one entry")
        self._check_mlp()
        if len(self.layer_pattern) > self.num_layers:
            raise ValueError(
                f"layer_pattern has {len(self.layer_pattern)} entries but num_layers is {self.num_layers}"
            )
        _check_weight_formats(self)
        act = _check_dtype(self.activation_dtype, KV_DTYPES, "activation_dtype")
        if act not in ("fp32", "fp16", "bf16"):
            raise ValueError(f"activation_dtype must be fp32, fp16 or bf16, not {self.activation_dtype!r}")
        if self.expert_weight_dtype and not self.moe:
            raise ValueError("expert_weight_dtype is set but the model has no moe section")
        if self.intermediate_sizes and len(self.intermediate_sizes) != self.num_layers:
            raise ValueError(
                f"intermediate_sizes has {len(self.intermediate_sizes)} entries but num_layers is "
                f"{self.num_layers}"
            )
        self._check_layers()
        return self

    def _check_layers(self) -> None:
        if all(isinstance(layer, (SharedKV, NoCache)) for layer in self.layers):
            raise ValueError("no layer keeps a KV cache or state: at least one must be full/sliding/mla/...")
        for name, kind in self.layer_types.items():
            if isinstance(kind, FullAttention) and self.num_attention_heads % kind.num_kv_heads:
                raise ValueError(
                    f"layer_types.{name}.num_kv_heads: {self.num_attention_heads} attention heads do not "
                    f"split evenly over {kind.num_kv_heads} KV heads"
                )
        for name, kind in self.layer_types.items():
            # a window or chunk that holds the whole context is full attention under another name; a ratio past
            # the context keeps no entry a request can fill
            span = (
                getattr(kind, "window", None)
                if isinstance(kind, SlidingWindow)
                else getattr(kind, "chunk", None)
            )
            if span is not None and span >= self.max_context:
                raise ValueError(
                    f"layer_types.{name}: {'window' if isinstance(kind, SlidingWindow) else 'chunk'} {span:,} >= "
                    f"max_context {self.max_context:,}: every token is kept; write it as kind: full"
                )
            ratio = (
                getattr(kind, "ratio", 0) if isinstance(kind, (CompressedAttention, CompressedLatent)) else 0
            )
            if ratio > self.max_context:
                raise ValueError(
                    f"layer_types.{name}.ratio {ratio:,} is beyond max_context {self.max_context:,}: no request "
                    "fills one entry"
                )
        for i, layer in enumerate(self.layers):
            if isinstance(layer, SharedKV):
                src = i + layer.source
                if src < 0 or isinstance(self.layers[src], (SharedKV, NoCache)):
                    raise ValueError(
                        f"layer {i} shares KV with layer {src}, which does not hold its own KV cache"
                    )
                if isinstance(self.layers[src], (RecurrentState, CrossAttention)):
                    raise ValueError(
                        f"layer {i} shares KV with layer {src}, a {type(self.layers[src]).__name__} layer: only "
                        "attention over the text's tokens has K/V another layer can read"
                    )

    def _check_mlp(self) -> None:
        """The MLP fields agree: a 'moe' entry needs a moe section, a moe section some MoE layer."""
        if self.mlp_pattern is not None:
            if len(self.mlp_pattern) > self.num_layers:
                raise ValueError(
                    f"mlp_pattern has {len(self.mlp_pattern)} entries but num_layers is {self.num_layers}"
                )
            if "moe" in self.mlp_pattern and self.moe is None:
                raise ValueError("mlp_pattern names 'moe' layers but there is no moe section")
        if self.moe is not None and not any(self.mlp_kind(i) == "moe" for i in range(self.num_layers)):
            raise ValueError(
                "the moe section applies to no layer (mlp_pattern, first_dense_layers or layer_step leave none); "
                "fix them or drop the section"
            )

    def mlp_kind(self, index: int) -> str:
        """ "dense", "moe" or "none": the MLP of decoder layer `index`."""
        if self.mlp_pattern is not None:
            return self.mlp_pattern[index % len(self.mlp_pattern)]
        moe = self.moe
        if moe is None or index < moe.first_dense_layers:
            return "dense"
        if moe.layer_step > 1 and (index + 1) % moe.layer_step:
            return "dense"
        return "moe"

    @cached_property
    def layers(self) -> tuple[Layer, ...]:
        """The pattern tiled over num_layers: one entry per decoder layer."""
        pattern = [self.layer_types[n] for n in self.layer_pattern]
        return tuple(pattern[i % len(pattern)] for i in range(self.num_layers))

    @property
    def all_names(self) -> list[str]:
        names = [self.name, *self.aliases]
        if self.hf_id:
            names.append(self.hf_id)
        return names

    @property
    def attention_summary(self) -> str:
        counts: dict[str, int] = {}
        for layer in self.layers:
            counts[_layer_label(layer)] = counts.get(_layer_label(layer), 0) + 1
        return " + ".join(f"{n}x {label}" for label, n in counts.items())


def _kv_dims(layer: FullAttention) -> str:
    """'kv8x128', or 'kv8x192/128' where V's head is not K's (every attention kind alike)."""
    dims = f"{layer.head_dim}" if layer.v_dim == layer.head_dim else f"{layer.head_dim}/{layer.v_dim}"
    return f"kv{layer.num_kv_heads}x{dims}"


def _layer_label(layer: Layer) -> str:
    if isinstance(layer, SlidingWindow):
        return f"sliding({layer.window}) {_kv_dims(layer)}"
    if isinstance(layer, ChunkedAttention):
        return f"chunked({layer.chunk}) {_kv_dims(layer)}"
    if isinstance(layer, CompressedAttention):
        return f"compressed(1/{layer.ratio}) {_kv_dims(layer)}"
    if isinstance(layer, FullAttention):
        return f"full {_kv_dims(layer)}"
    if isinstance(layer, LatentAttention):
        indexer = f" + indexer {layer.index_head_dim}" if layer.index_head_dim else ""
        return f"MLA latent {layer.kv_lora_rank}+{layer.qk_rope_head_dim}{indexer}"
    if isinstance(layer, CompressedLatent):
        kept = f" + 1/{layer.ratio}" if layer.ratio else ""
        indexer = f" + indexer {layer.index_head_dim}" if layer.index_head_dim else ""
        return f"latent {layer.head_dim}, window {layer.window}{kept}{indexer}"
    if isinstance(layer, SharedKV):
        return f"shared(KV of layer {layer.source:+d})"
    if isinstance(layer, RecurrentState):
        if layer.mixer == "fixed":
            return f"state({layer.state_bytes} B/seq)"
        ssm = f" ssm {layer.ssm_heads}x{layer.ssm_head_dim}x{layer.ssm_state_dim}" if layer.ssm_heads else ""
        channels = layer.conv_channels + layer.conv_groups * layer.conv_group_channels
        conv = f" conv {layer.conv_kernel - 1}x{channels}" if layer.conv_kernel > 1 else ""
        return f"{layer.mixer}({conv.strip()}{ssm})" if conv else f"{layer.mixer}({ssm.strip()})"
    if isinstance(layer, CrossAttention):
        return f"cross({layer.image_tokens} image tokens) kv{layer.num_kv_heads}x{layer.head_dim}"
    return "no cache"


class Interconnect(_Strict):
    kind: str
    # NVLink / Infinity Fabric: the datasheet's figure, both directions together (H100: 900 GB/s); the
    # step model's links take one direction, half of it. PCIe cards' links use pcie_bytes_per_s instead.
    bytes_per_s: Annotated[float, Field(gt=0)]


# plausible ranges of a GPU's figures, far beyond every shipped card both ways: a figure outside
# is a unit slip (GB/s for B/s, TFLOPS for FLOPS) that would print times off by 1e9
_GPU_RANGES = {
    "memory_bytes": (2**30, 2**40, "bytes (80 GiB is 85.9e9)"),
    "hbm_bytes_per_s": (1e10, 1e14, "bytes per second (3.35 TB/s is 3.35e12)"),
    "bf16_dense_flops": (1e12, 1e17, "FLOPS (989 TFLOPS is 989e12)"),
    "fp8_dense_flops": (1e12, 1e17, "FLOPS (1,979 TFLOPS is 1979e12)"),
    "pcie_bytes_per_s": (1e9, 1e12, "bytes per second, one direction (64 GB/s is 64e9)"),
    "interconnect.bytes_per_s": (1e9, 1e13, "bytes per second, both directions (900 GB/s is 900e9)"),
}


class GpuSpec(_Strict):
    name: str
    display_name: str | None = None
    aliases: list[str] = []
    vendor: Literal["nvidia", "amd"]
    # GPU generation: engines pick kernels (and so MLA block sizes) by it
    arch: Literal["turing", "ampere", "ada", "hopper", "blackwell", "cdna3", "cdna4"]
    sources: Annotated[list[str], Field(min_length=1)]
    notes: list[str] = []

    memory_bytes: PositiveInt  # total as the CUDA/ROCm runtime reports it (what vLLM multiplies)
    memory_marketing: str  # the datasheet label, e.g. "80 GB"
    hbm_bytes_per_s: Annotated[float, Field(gt=0)]  # datasheet bandwidth
    bf16_dense_flops: Annotated[float, Field(gt=0)]
    fp8_dense_flops: Annotated[float, Field(gt=0)] | None = None
    interconnect: Interconnect | None = None
    pcie_bytes_per_s: Annotated[float, Field(gt=0)]  # host link, one direction
    gpus_per_node: PositiveInt = 8

    def _check(self) -> GpuSpec:  # run after field validation (schema.py)
        _check_names(self.name, self.display_name)
        figures = {k: getattr(self, k) for k in _GPU_RANGES if "." not in k}
        figures["interconnect.bytes_per_s"] = self.interconnect.bytes_per_s if self.interconnect else None
        for key, value in figures.items():
            low, high, unit = _GPU_RANGES[key]
            if value is not None and not low <= value <= high:
                raise ValueError(f"{key}: {value:g} is not a GPU's figure; give {unit}")
        return self

    @property
    def all_names(self) -> list[str]:
        return [self.name, *self.aliases]

    @property
    def has_bf16(self) -> bool:
        """bfloat16 arithmetic: NVIDIA from Ampere (compute capability 8.0) on, and AMD's CDNA3/CDNA4."""
        return self.arch != "turing"


# every other record a spec holds, for validation (kvplan/specs/schema.py)
OTHER_RECORDS: tuple[type[_Strict], ...] = (MoE, VisionTower, Interconnect, ModelSpec, GpuSpec)
