"""Weight bytes per GPU under TP and PP."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from kvplan.errors import UsageError
from kvplan.formats import Format, weight_format
from kvplan.model.parallel import Sharding, stage_ranges
from kvplan.model.params import ParamBreakdown, is_moe_layer
from kvplan.specs.matrices import COMPONENTS, Matrix, weight_matrices
from kvplan.specs.models import ModelSpec
from kvplan.units import ceil_div


@dataclass(frozen=True)
class StageWeights:
    stage: int
    layers: range
    bytes_per_gpu: int
    expert_bytes_per_gpu: int = 0  # of which routed MoE experts (a decode step reads only those routed to)
    embedding_bytes_per_gpu: int = 0  # of which the input embedding (gathered by row, not streamed)
    offloaded_bytes_per_gpu: int = (
        0  # --cpu-offload-gb: weights kept in CPU memory instead (not in bytes_per_gpu)
    )


def param_bytes(num_params: int, fmt: Format) -> int:
    """params x bits per weight (group scales included) / 8."""
    num = num_params * fmt.bits_per_value
    return ceil_div(num.numerator, num.denominator * 8)


def edge_format(spec: ModelSpec, weight_fmt: Format) -> Format:
    """The embedding's and LM head's format: the model dtype under a quantized format (vLLM's
    VocabParallelEmbedding and ParallelLMHead take no quantization method unless a config names them)."""
    model_fmt = weight_format(spec.activation_dtype)
    return model_fmt if weight_fmt.bits_per_value < model_fmt.bits_per_value else weight_fmt


def stage_weights(
    spec: ModelSpec,
    params: ParamBreakdown,
    weight_fmt: Format,
    expert_fmt: Format,
    tp: int,
    pp: int,
    lm_head: bool = True,
) -> list[StageWeights]:
    """Weights each GPU of each stage holds (without the LM head where `lm_head` is False).

    Layers are assumed equal in size except for MoE vs dense layers; everything is
    split evenly over TP (vocab-parallel embedding and LM head too). The embedding sits
    on the first stage, the LM head on the last; a tied LM head is stored once when
    PP = 1 and twice (first and last stage) when PP > 1. A quantized format covers the
    blocks' linear layers only: AWQ, GPTQ, fp8, MXFP4 and NVFP4 checkpoints keep the
    embedding and the LM head in the model dtype (vLLM's VocabParallelEmbedding and
    ParallelLMHead take no quantization method unless a config names them).
    """
    n = spec.num_layers
    moe_layers = [i for i in range(n) if is_moe_layer(spec, i)]
    expert_per_moe_layer = params.routed_experts / len(moe_layers) if moe_layers else 0.0
    body_per_layer = params.body / n
    head_params = params.lm_head if not spec.tie_word_embeddings else params.embedding
    moe_set = set(moe_layers)
    edge_fmt = edge_format(spec, weight_fmt)
    out = []
    for s, stage in enumerate(stage_ranges(n, pp)):
        body = body_per_layer * len(stage)
        experts = expert_per_moe_layer * sum(1 for i in stage if i in moe_set)
        edges = params.embedding if s == 0 else 0
        if lm_head and s == pp - 1 and (not spec.tie_word_embeddings or pp > 1):
            edges += head_params
        expert_bytes = param_bytes(round(experts), expert_fmt)
        total = param_bytes(round(body), weight_fmt) + param_bytes(edges, edge_fmt) + expert_bytes
        embedding = param_bytes(params.embedding, edge_fmt) if s == 0 else 0
        out.append(
            StageWeights(s, stage, ceil_div(total, tp), ceil_div(expert_bytes, tp), ceil_div(embedding, tp))
        )
    return out


# --- per-matrix formats (quantized checkpoints) -------------------------------------------------


def matrix_format_name(spec: ModelSpec, m: Matrix) -> str:
    """The spec's format for one matrix: the most specific `weight_formats` key, else the defaults."""
    for key in (f"{m.component}.{m.name}@{m.layer}", f"{m.component}.{m.name}", m.component):
        if key in spec.weight_formats:
            return spec.weight_formats[key]
    if m.component in ("router", "norms"):
        return spec.activation_dtype
    if m.component == "routed_experts" and spec.expert_weight_dtype:
        return spec.expert_weight_dtype
    return spec.weight_dtype


def component_formats(spec: ModelSpec, weight_fmt: Format, expert_fmt: Format) -> dict[str, str | None]:
    """Each component's commonest format by parameters (None: the model has no such weights)."""
    out: dict[str, str | None] = dict.fromkeys(COMPONENTS)
    if not spec.weight_formats:
        edge = edge_format(spec, weight_fmt)
        for comp in COMPONENTS:
            fmt = (
                expert_fmt
                if comp == "routed_experts"
                else edge
                if comp in ("embedding", "lm_head")
                else weight_fmt
            )
            out[comp] = fmt.name
        present = {m.component for m in weight_matrices(spec)}
        return {c: (f if c in present else None) for c, f in out.items()}
    params: dict[str, dict[str, int]] = {}
    for m in weight_matrices(spec):
        if m.component in COMPONENTS:
            counts = params.setdefault(m.component, {})
            name = matrix_format_name(spec, m)
            counts[name] = counts.get(name, 0) + m.params
    for comp, counts in params.items():
        out[comp] = max(counts, key=lambda k: counts[k])
    return out


def matrix_stage_weights(spec: ModelSpec, tp: int, pp: int, lm_head: bool = True) -> list[StageWeights]:
    """Weights per GPU per stage, each matrix in its own format, bits exact per matrix
    (Format.matrix_bits); stage placement as stage_weights."""
    ranges = stage_ranges(spec.num_layers, pp)
    stage_of = {i: s for s, r in enumerate(ranges) for i in r}
    total, experts, embedding = [0] * pp, [0] * pp, [0] * pp
    for m in weight_matrices(spec):
        bits = weight_format(matrix_format_name(spec, m)).matrix_bits(m.rows, m.cols) * m.count
        if m.layer is not None:
            stages = [stage_of[m.layer]]
        elif m.component == "embedding":
            stages = [0] + ([pp - 1] if lm_head and spec.tie_word_embeddings and pp > 1 else [])
            embedding[0] += bits
        elif m.component == "lm_head" and not lm_head:
            continue
        else:  # LM head and final norm
            stages = [pp - 1]
        for s in stages:
            total[s] += bits
        if m.component == "routed_experts":
            experts[stages[0]] += bits
    return [
        StageWeights(
            s,
            ranges[s],
            ceil_div(ceil_div(total[s], 8), tp),
            ceil_div(ceil_div(experts[s], 8), tp),
            ceil_div(ceil_div(embedding[s], 8), tp),
        )  # fmt: skip
        for s in range(pp)
    ]


def _checkpoint_field(spec: ModelSpec) -> str:
    """Where a spec's checkpoint byte count came from: a config.json's model.safetensors.index.json beside it
    (metadata.total_size), else the spec's own field."""
    config = next((Path(s) for s in spec.sources if str(s).endswith("config.json")), None)
    if config is not None and (config.parent / "model.safetensors.index.json").is_file():
        return f"{config.parent / 'model.safetensors.index.json'}: metadata.total_size"
    return f"{spec.name}: checkpoint_weight_bytes"


def checkpoint_stage_weights(
    spec: ModelSpec, stages: list[StageWeights], tp: int, notes: list[str], mtp_bytes: int = 0
) -> list[StageWeights]:
    """The checkpoint's own total (model.safetensors.index.json) spread over stages as kvplan's count; less
    `mtp_bytes`, its MTP layers (loaded only as a speculative draft, counted there)."""
    ckpt = spec.checkpoint_weight_bytes
    counted = sum(s.bytes_per_gpu for s in stages) * tp
    if not ckpt or not counted:
        return stages
    less = ""
    if mtp_bytes and ckpt > mtp_bytes:
        # vLLM/SGLang's DeepSeek loaders skip the num_nextn_predict_layers weights unless they serve the draft
        less = (
            f" less its {spec.mtp_layers} MTP layer(s), about {mtp_bytes / 1e9:,.1f} GB, which the engines load "
            "only as a speculative draft"
        )
        ckpt -= mtp_bytes
    if not 0.1 <= ckpt / counted <= 5:  # 16-bit weights counted vs a 1.6-bit checkpoint; 5x: fp32 and a tower
        raise UsageError(
            f"{_checkpoint_field(spec)} {ckpt:,} is {ckpt / counted:.2g}x kvplan's count of the "
            f"architecture ({counted:,} bytes): not this model's checkpoint; fix or drop the field"
        )
    diff = ckpt / counted - 1
    notes.append(
        f"weight bytes = the checkpoint's model.safetensors.index.json metadata.total_size{less} "
        f"({ckpt / 1e9:,.1f} GB); kvplan's own count is {counted / 1e9:,.1f} GB"
    )
    if abs(diff) > 0.03:
        notes.append(
            f"the checkpoint holds {diff:+.1%} vs kvplan's count of the architecture "
            "(extra weights such as MTP or vision layers, or a format kvplan does not model)"
        )
    return [
        replace(
            s,
            bytes_per_gpu=ceil_div(s.bytes_per_gpu * ckpt, counted),
            expert_bytes_per_gpu=ceil_div(s.expert_bytes_per_gpu * ckpt, counted),
        )  # fmt: skip
        for s in stages
    ]


# --- expert parallelism and DP attention --------------------------------------------------------


def sharded_stage_weights(
    spec: ModelSpec, stages: list[StageWeights], sh: Sharding, override: Format | None
) -> list[StageWeights]:
    """The stages' weights per GPU as `sh` places them instead of plain TP (`stages` as TP slices them).

    Routed experts: the fullest GPU's share, sh.local_experts of sh.num_experts experts each sliced over
    sh.expert_tp GPUs (redundant experts add whole ones). Attention: sliced over sh.attn_tp GPUs, so
    replicated across the attention-DP ranks. The input embedding: whole on every GPU where the engine
    replicates it. Everything else keeps its TP slice. `override` is --weight-dtype (None: each matrix
    in the checkpoint's own format).
    """
    if sh.plain:
        return stages
    tp = sh.tp
    attn_bits = [0] * len(stages)
    if sh.attn_tp != tp:
        stage_of = {i: s.stage for s in stages for i in s.layers}
        for m in weight_matrices(spec):
            if m.component != "attention" or m.layer is None or m.replicated:
                continue
            fmt = override or weight_format(matrix_format_name(spec, m))
            attn_bits[stage_of[m.layer]] += fmt.matrix_bits(m.rows, m.cols) * m.count
    out = []
    for s, w in zip(stages, attn_bits, strict=True):
        experts = s.expert_bytes_per_gpu
        if sh.num_experts:
            experts = ceil_div(s.expert_bytes_per_gpu * tp * sh.local_experts, sh.num_experts * sh.expert_tp)
        attn = ceil_div(w, 8)
        extra_attn = ceil_div(attn, sh.attn_tp) - ceil_div(attn, tp) if attn else 0
        embedding = s.embedding_bytes_per_gpu * tp if sh.embedding_replicated else s.embedding_bytes_per_gpu
        total = (
            s.bytes_per_gpu
            + (experts - s.expert_bytes_per_gpu)
            + extra_attn
            + (embedding - s.embedding_bytes_per_gpu)
        )
        out.append(
            replace(s, bytes_per_gpu=total, expert_bytes_per_gpu=experts, embedding_bytes_per_gpu=embedding)
        )
    return out
