"""Model and GPU specs: validated once at the edge, then typed objects everywhere.

A model is a list of layers, each described by what it keeps in the KV cache.
YAML writes that list compactly as named `layer_types` and a `layer_pattern`
tiled over `num_layers` (e.g. five sliding layers then one full, repeated).
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Literal, Union

from kvplan.formats import KV_DTYPES, normalize_dtype_name
from kvplan.specs.record import Record

if TYPE_CHECKING:
    # Only in annotations: kvplan/specs/schema.py evaluates them, with pydantic, to validate.
    from pydantic import Field, PositiveInt


class _Strict(Record):
    """Validation (kvplan/specs/schema.py) forbids unknown fields; every spec is frozen."""


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
    """One KV entry per `ratio` tokens (token-compressed attention, seed 001 10.2.8)."""

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


class SharedKV(_Strict):
    """Reuses the KV of an earlier layer (cross-layer attention, seed 001 10.2.9)."""

    kind: Literal["shared"] = "shared"
    source: Annotated[int, Field(le=-1)] = -1  # offset of the producing layer, e.g. -1 = previous
    num_kv_heads: PositiveInt | None = None  # for parameter counting only
    head_dim: PositiveInt | None = None


class RecurrentState(_Strict):
    """Linear attention / Mamba: a fixed state per sequence, whatever the context."""

    kind: Literal["state"] = "state"
    state_bytes: Annotated[int, Field(ge=0)]


class NoCache(_Strict):
    kind: Literal["none"] = "none"


# Any layer; validation tells them apart by `kind` (schema.py makes it a discriminated union).
Layer = Union[  # noqa: UP007 - a runtime alias others import; `|` of classes is the same thing
    SlidingWindow,
    ChunkedAttention,
    CompressedAttention,
    FullAttention,
    LatentAttention,
    SharedKV,
    RecurrentState,
    NoCache,
]
HeadLayer = (FullAttention, SlidingWindow, ChunkedAttention, CompressedAttention)


class MoE(_Strict):
    num_experts: PositiveInt
    experts_per_token: PositiveInt
    shared_experts: Annotated[int, Field(ge=0)] = 0
    expert_intermediate_size: PositiveInt
    shared_expert_intermediate_size: PositiveInt | None = None
    # Layers that are MoE: all but the first `first_dense_layers`, every `layer_step`-th.
    first_dense_layers: Annotated[int, Field(ge=0)] = 0
    layer_step: PositiveInt = 1

    def _check(self) -> MoE:  # run after field validation (schema.py)
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) exceeds num_experts ({self.num_experts})"
            )
        return self


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


class ModelSpec(_Strict):
    name: str
    display_name: str | None = None
    hf_id: str | None = None
    architecture: str | None = None  # config.json `architectures[0]`; engines key some defaults on it
    aliases: list[str] = []
    sources: Annotated[list[str], Field(min_length=1)]
    notes: list[str] = []

    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    intermediate_size: PositiveInt | None = None
    mlp_gated: bool = True
    vocab_size: PositiveInt
    tie_word_embeddings: bool = False
    max_context: PositiveInt

    total_params: PositiveInt | None = None
    active_params: PositiveInt | None = None
    moe: MoE | None = None

    weight_dtype: str = "bf16"
    expert_weight_dtype: str | None = None
    activation_dtype: str = "bf16"
    # Per-component weight formats of a quantized checkpoint (README, Weight formats): keys
    # `component`, `component.matrix`, `component.matrix@layer`; unlisted weights: weight_dtype.
    weight_formats: dict[str, str] = {}
    checkpoint_weight_bytes: PositiveInt | None = None  # model.safetensors.index.json metadata.total_size

    layer_types: dict[str, Layer]
    layer_pattern: Annotated[list[str], Field(min_length=1)]

    def _check(self) -> ModelSpec:  # run after field validation (schema.py)
        for name in self.layer_pattern:
            if name not in self.layer_types:
                raise ValueError(
                    f"layer_pattern names {name!r}, which is not in layer_types "
                    f"({', '.join(self.layer_types)})"
                )
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
        self._check_layers()
        return self

    def _check_layers(self) -> None:
        if all(isinstance(layer, (SharedKV, NoCache)) for layer in self.layers):
            raise ValueError("no layer keeps a KV cache or state: at least one must be full/sliding/mla/...")
        for i, layer in enumerate(self.layers):
            if isinstance(layer, SharedKV):
                src = i + layer.source
                if src < 0 or isinstance(self.layers[src], (SharedKV, NoCache)):
                    raise ValueError(
                        f"layer {i} shares KV with layer {src}, which does not hold its own KV cache"
                    )

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


def _layer_label(layer: Layer) -> str:
    if isinstance(layer, SlidingWindow):
        return f"sliding({layer.window}) kv{layer.num_kv_heads}x{layer.head_dim}"
    if isinstance(layer, ChunkedAttention):
        return f"chunked({layer.chunk}) kv{layer.num_kv_heads}x{layer.head_dim}"
    if isinstance(layer, CompressedAttention):
        return f"compressed(1/{layer.ratio}) kv{layer.num_kv_heads}x{layer.head_dim}"
    if isinstance(layer, FullAttention):
        dims = f"{layer.head_dim}" if layer.v_dim == layer.head_dim else f"{layer.head_dim}/{layer.v_dim}"
        return f"full kv{layer.num_kv_heads}x{dims}"
    if isinstance(layer, LatentAttention):
        return f"MLA latent {layer.kv_lora_rank}+{layer.qk_rope_head_dim}"
    if isinstance(layer, SharedKV):
        return f"shared(KV of layer {layer.source:+d})"
    if isinstance(layer, RecurrentState):
        return f"state({layer.state_bytes} B/seq)"
    return "no cache"


class Interconnect(_Strict):
    kind: str
    bytes_per_s: Annotated[float, Field(gt=0)]


class GpuSpec(_Strict):
    name: str
    display_name: str | None = None
    aliases: list[str] = []
    vendor: Literal["nvidia", "amd"]
    # GPU generation: engines pick kernels (and so MLA block sizes) by it
    arch: Literal["ampere", "ada", "hopper", "blackwell", "cdna3"]
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

    @property
    def all_names(self) -> list[str]:
        return [self.name, *self.aliases]
