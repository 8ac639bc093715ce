"""estimate(): specs + request -> Plan, as a short composition of named steps.

layout (TP/PP/DP) -> the engine's view of the model (block size, windows) -> KV bytes per
token -> weights per GPU -> the engine's budget -> per-stage pools -> concurrency -> the
engine's own report -> decode/prefill speed. Each step returns a small frozen record.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from kvplan import engines
from kvplan.engines import Budget, Engine, EngineDefaults, EngineReport, EngineUnsupported, StageCache
from kvplan.engines.sglang import MAMBA_SLOTS_PER_REQUEST, state_running_cap
from kvplan.engines.vllm import V1_DEFAULT, before_0_10_1
from kvplan.errors import NoKvMemoryLeft, RequestDoesNotFit, UsageError, WeightsDoNotFit
from kvplan.formats import Format, normalize_dtype_name, weight_format
from kvplan.model import kv
from kvplan.model.capacity import (
    AvgContext,
    Fragmentation,
    Pool,
    PrefixCaching,
    StagePlan,
    fragmentation,
    prefix_caching,
)
from kvplan.model.parallel import Layout, Sharding, check_tp, make_layout, stage_layers, stage_ranges
from kvplan.model.params import ParamBreakdown, param_breakdown
from kvplan.model.weights import (
    StageWeights,
    checkpoint_stage_weights,
    component_formats,
    matrix_stage_weights,
    sharded_stage_weights,
    stage_weights,
)
from kvplan.plan.draft import SGLANG_POOL, DraftMemory, draft_memory, mtp_checkpoint_bytes
from kvplan.plan.offload import offload_limit_bytes, offload_stage
from kvplan.request import PlanRequest, model_dtype_name
from kvplan.specs.models import ChunkedAttention, CrossAttention, GpuSpec, Layer, ModelSpec, SlidingWindow
from kvplan.speed.plan_speed import Decode, Prefill, link_notes, plan_speed
from kvplan.units import GiB, fmt_bytes, fmt_gib, plural

if TYPE_CHECKING:
    from kvplan.calibrate.calibration import CalibrationUse

__all__ = ["SCHEMA", "Plan", "PlanRequest", "StagePlan", "estimate"]

SCHEMA = "kvplan.plan/1"


@dataclass(frozen=True)
class Explain:
    quantity: str
    value: str
    formula: str
    source: str


@dataclass(frozen=True)
class ModelSummary:
    name: str
    hf_id: str | None
    attention: str
    num_layers: int
    max_context: int
    warnings: list[str]  # config fields kvplan could not model (printed on stderr too)


@dataclass(frozen=True)
class GpuSummary:
    name: str
    memory_bytes: int
    hbm_bytes_per_s: float


@dataclass(frozen=True)
class Cluster:
    num_gpus: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    # expert parallelism and DP attention (issue 23); plain TP: EP 1, attention TP = TP, one attention rank
    expert_parallel_size: int = 1
    attention_tp_size: int | None = None
    attention_dp_size: int = 1  # attention-DP ranks per replica, each with its own requests and KV pool
    routed_experts_per_gpu: int | None = None  # whole or sliced, on the fullest GPU, per MoE layer
    expert_tp_size: int | None = None  # GPUs each routed expert is sliced over


@dataclass(frozen=True)
class Settings:
    max_model_len: int
    kv_cache_dtype: str
    kv_cache_format: str
    kv_bits_per_value: float
    block_size: int
    engine: str
    engine_version: str
    gpu_memory_utilization: float | None
    mem_fraction_static: float | None
    max_num_batched_tokens: int
    max_num_seqs: int | None
    enable_prefix_caching: bool
    usage: str
    engine_defaults: EngineDefaults  # flags not given, filled from the engine's own default rule
    dtype: str  # the model dtype served (--dtype, or the engine's rule for auto)
    cpu_offload_gb: float
    max_total_tokens: int | None  # SGLang
    max_running_requests: int | None  # SGLang
    chunked_prefill_size: int | None  # SGLang: as given, or its default for the card
    engine_env: dict[str, str]  # the engine's environment variables that shape the plan
    max_request_tokens: int  # the longest request the engine serves (< max_model_len: capped)
    weight_dtype: str
    expert_weight_dtype: str | None
    weight_formats: dict[str, str | None]  # per component (README, Weight formats)
    # vLLM --max-model-len auto: the length it fitted from (the model's maximum), else None
    max_model_len_auto_from: int | None = None


@dataclass(frozen=True)
class ReserveSummary:
    activation_bytes: int
    sampler_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    estimated: bool
    used: bool
    profile_peak_bytes: int = 0  # the larger of forward and sampler (vLLM >= 0.10), else their sum
    encoder_cache_bytes: int = 0  # a multimodal model's dummy encoder tensors held through the profile
    sampler_path: str | None = None  # the engine's top-k/top-p path its profiling run takes
    weight_loading_bytes: int = 0  # SGLang: taken by weight loading beside the parameters (out of the budget)
    # the forward's hidden states held through the sampler's profile (vLLM >= 0.10)
    sampler_hidden_bytes: int = 0


@dataclass(frozen=True)
class Plan:
    schema: str
    model: ModelSummary
    gpu: GpuSummary
    cluster: Cluster
    settings: Settings
    kv_bytes_per_token: float
    kv_bytes_per_token_per_gpu: float
    kv_bytes_per_token_growing: float
    kv_bytes_per_sequence_windowed_cap: int
    kv_bytes_per_request: int
    kv_bytes_per_request_fixed: int  # of which fixed per request: recurrent state, image K/V
    kv_bytes_per_request_per_gpu: int
    params_total: int
    params_active: int
    params_stated: bool
    memory_bytes_per_gpu: int
    requested_bytes_per_gpu: int
    weight_bytes_per_gpu: int
    weight_bytes_total: int  # all GPUs, the whole model once (+ a tied head's copy under PP)
    weight_bytes_checkpoint: int | None  # model.safetensors.index.json metadata.total_size
    reserve_bytes_per_gpu: int
    reserve: ReserveSummary
    kv_budget_bytes_per_gpu: int
    kv_budget_source: str
    block_bytes_per_gpu: int
    num_blocks_per_gpu: int | None
    kv_pool_tokens: int
    kv_pool_tokens_cluster: int
    blocks_per_request: int
    concurrency_factor: float
    max_concurrency_per_replica: int
    max_concurrency: int
    limited_by: str
    # what memory alone holds (KV pool, SGLang's state pool), before --max-num-seqs / --max-running-requests
    pool_max_concurrency_per_replica: int
    # the most requests one scheduler (an attention-DP rank's) runs at once: a flag's cap or the engine's default
    running_cap_per_rank: int
    avg_context: AvgContext | None
    prefix_caching: PrefixCaching | None
    fragmentation: Fragmentation
    stages: list[StagePlan]
    assumptions: list[str]
    engine: EngineReport
    decode: Decode
    prefill: Prefill
    explain: list[Explain] = field(default_factory=list)
    calibration: CalibrationUse | None = None  # the `kvplan calibrate` profile used, if any
    speculative_memory: DraftMemory | None = None  # the speculative draft's weights and KV per GPU

    def __repr__(self) -> str:  # the whole dataclass (a calibration profile inside) ran to 52,000 characters
        return plan_summary(self)

    @property
    def pool_max_concurrency(self) -> int:
        """Whole requests at max_model_len that memory alone holds, all replicas: no flag's cap."""
        return self.pool_max_concurrency_per_replica * self.cluster.data_parallel_size

    @property
    def engine_kv_cache_tokens(self) -> int | None:
        return self.engine.kv_cache_tokens

    @property
    def engine_num_blocks(self) -> int | None:
        return self.engine.num_blocks

    @property
    def engine_max_concurrency(self) -> float | None:
        return self.engine.max_concurrency

    def to_dict(self) -> dict[str, Any]:
        """The JSON schema documented in the README (kvplan.plan/1)."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if key == "engine":  # the engine's three headline figures, also at the top level
                out["engine_kv_cache_tokens"] = self.engine.kv_cache_tokens
                out["engine_num_blocks"] = self.engine.num_blocks
                out["engine_max_concurrency"] = self.engine.max_concurrency
            out[key] = value
        out["settings"]["engine_defaults"] = self.settings.engine_defaults.to_dict()
        out["decode"] = self.decode.to_dict()
        if out["speculative_memory"] is not None:  # its layers are kvplan's own objects, not in the schema
            out["speculative_memory"].pop("kv_layers")
        if out["engine"]["details"] is None:  # the schema has always had an object here
            out["engine"]["details"] = {}
        return out


def _num(bits: int) -> float:
    """Bits -> bytes, an int when whole (JSON stays clean for the usual formats)."""
    return bits // 8 if bits % 8 == 0 else bits / 8


# --- the steps ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KvTotals:
    """KV of the whole model (all GPUs together), before any split or rounding."""

    bits_per_token: int
    bits_per_token_growing: int
    windowed_cap_bytes: int
    request_bytes: int  # one request at max_model_len, exact
    fixed_bytes: int  # of which independent of the context: recurrent state, image K/V


def _engine_view(
    req: PlanRequest, engine: Engine, fmt: Format, tp: int, notes: list[str]
) -> tuple[ModelSpec, int]:
    """The model as the engine stores it (windows kept or dropped) and the block size it uses."""
    spec = req.model
    if req.block_size is not None:
        bs = req.block_size
    else:
        bs, why = engine.block_size(spec, req.gpu)
        if why:
            notes.append(why)
    spec = engines.with_engine_states(spec, engine, notes)
    spec = _with_images(spec, req.images_per_request, notes)
    windowed = any(isinstance(layer, (SlidingWindow, ChunkedAttention)) for layer in spec.layers)
    kept = engine.windows_kept(spec) if windowed else None
    if kept:
        notes.append(
            f"{engine.label} keeps every token in the sliding-window/chunked layers ({kept}): "
            "they cost as much as full-attention layers here"
        )
        spec = engines.windows_as_full(spec)
    bs, why = engine.hybrid_block_size(spec, fmt, tp, bs)
    if why:
        notes.append(why)
    notes += engine.view_notes(spec)
    if note := kv.partial_group_note(spec.layers, fmt):
        notes.append(note)
    return spec, bs


def _with_images(spec: ModelSpec, images: int | None, notes: list[str]) -> ModelSpec:
    """Cross-attention layers hold the K/V of the request's images (an assumption: --images-per-request,
    else the spec's images_per_request)."""
    cross = [la for la in spec.layer_types.values() if isinstance(la, CrossAttention)]
    if images is None:
        if cross:
            notes.append(
                f"{cross[0].images_per_request} image(s) per request in the cross-attention layers (the spec's "
                "images_per_request; --images-per-request to change it)"
            )
        return spec
    types = {
        name: layer.model_copy(update={"images_per_request": images})
        for name, layer in spec.layer_types.items()
        if isinstance(layer, CrossAttention)
    }
    if not types:
        return spec
    notes.append(f"{images} image(s) per request in the cross-attention layers (--images-per-request)")
    return spec.model_copy(update={"layer_types": {**spec.layer_types, **types}})


def _kv_totals(spec: ModelSpec, fmt: Format, max_len: int, ex: list[Explain]) -> KvTotals:
    layers = list(spec.layers)
    totals = KvTotals(
        kv.model_bits_per_token(layers, fmt),
        kv.model_bits_per_token(layers, fmt, growing_only=True),
        kv.windowed_cap_bytes(layers, fmt),
        kv.sequence_bytes(layers, fmt, max_len),
        kv.sequence_bytes(layers, fmt, 0),
    )
    ex.append(
        Explain(
            "KV bytes per token",
            fmt_bytes(_num(totals.bits_per_token)),
            "sum over layers: 2 x kv_heads x head_dim x bytes (MLA: kv_lora_rank + qk_rope_head_dim)",
            f"layer_types/layer_pattern of {spec.name}; dtype {fmt.describe()}; README, The formulas",
        )
    )
    ex.append(
        Explain(
            "KV bytes per request",
            fmt_gib(totals.request_bytes),
            "max_model_len x bytes per token (windowed layers capped at their window)",
            f"max_model_len {max_len:,}; README, The formulas",
        )
    )
    return totals


@dataclass(frozen=True)
class Weights:
    params: ParamBreakdown
    weight_fmt: Format
    expert_fmt: Format
    stages: list[StageWeights]


def _weights(
    req: PlanRequest,
    engine: Engine,
    spec: ModelSpec,
    sh: Sharding,
    pp: int,
    notes: list[str],
    ex: list[Explain],
) -> Weights:
    tp = sh.tp
    params = param_breakdown(spec)
    w_name = normalize_dtype_name(req.weight_dtype) if req.weight_dtype else spec.weight_dtype
    w_fmt = weight_format(w_name)
    e_fmt = weight_format(req.weight_dtype or spec.expert_weight_dtype or w_name)
    notes += [n for n in spec.notes if n.startswith(("WARNING", "weights "))] + spec.assumptions
    if req.weight_dtype or not (spec.weight_formats or spec.checkpoint_weight_bytes):
        stages = stage_weights(spec, params, w_fmt, e_fmt, tp, pp)
        headless = stage_weights(spec, params, w_fmt, e_fmt, tp, pp, lm_head=False)
    else:  # per-matrix formats of a quantized checkpoint; the checkpoint's own total when known
        counted = matrix_stage_weights(spec, tp, pp)
        mtp = mtp_checkpoint_bytes(spec, counted, tp) if spec.checkpoint_holds_mtp else 0
        stages = checkpoint_stage_weights(spec, counted, tp, notes, mtp)
        headless = matrix_stage_weights(spec, tp, pp, lm_head=False)
        headless = [dataclasses.replace(h, bytes_per_gpu=s.bytes_per_gpu - (c.bytes_per_gpu - h.bytes_per_gpu))
                    for s, c, h in zip(stages, counted, headless, strict=True)]  # fmt: skip
    if (why := engine.drops_lm_head(spec)) and (
        head := stages[-1].bytes_per_gpu - headless[-1].bytes_per_gpu
    ):
        stages = headless
        notes.append(f"no LM head loaded ({fmt_gib(head)} per GPU of the last stage left out): {why}")
    stages = sharded_stage_weights(spec, stages, sh, w_fmt if req.weight_dtype else None)
    stages = _as_loaded(engine, spec, stages, e_fmt, sh.expert_tp, notes)
    if req.cpu_offload_gb:
        stages = _offload(req, spec, stages, pp, notes)
    if not params.total_stated:
        notes.append(
            f"parameter count {params.total / 1e9:,.2f}B estimated from the architecture (the spec states none)"
        )
    ex.append(
        Explain(
            "weights per GPU",
            fmt_gib(max(w.bytes_per_gpu for w in stages)),
            "params x bits/weight / 8, split by TP; PP stages hold their own layers"
            + ("" if sh.plain else "; routed experts by EP, attention by attention TP (assumptions)"),
            f"total_params {params.total:,}; weight dtype {w_fmt.describe()}"
            + (f", experts {e_fmt.describe()}" if params.routed_experts and e_fmt != w_fmt else ""),
        )
    )
    return Weights(params, w_fmt, e_fmt, stages)


def _as_loaded(
    engine: Engine, spec: ModelSpec, stages: list[StageWeights], e_fmt: Format, tp: int, notes: list[str]
) -> list[StageWeights]:
    """The routed experts as the engine's kernels hold them (padding), where that differs, and the
    buffers the engine allocates with the model on every GPU."""
    factor, why = engine.loaded_expert_factor(spec, engine.req.gpu, tp, e_fmt.name)
    if why is not None:
        notes.append(why)
        out = []
        for w in stages:
            extra = round(w.expert_bytes_per_gpu * (factor - 1))
            out.append(
                dataclasses.replace(
                    w,
                    bytes_per_gpu=w.bytes_per_gpu + extra,
                    expert_bytes_per_gpu=w.expert_bytes_per_gpu + extra,
                )
            )
        stages = out
    buffers, why = engine.load_buffer_bytes(spec)
    if why is not None:
        notes.append(why)
        stages = [dataclasses.replace(w, bytes_per_gpu=w.bytes_per_gpu + buffers) for w in stages]
    return stages


def _offload(
    req: PlanRequest, spec: ModelSpec, stages: list[StageWeights], pp: int, notes: list[str]
) -> list[StageWeights]:
    """--cpu-offload-gb: whole decoder layers per GPU moved to CPU memory (kvplan/plan/offload.py)."""
    limit = offload_limit_bytes(req.cpu_offload_gb)
    # the LM head (the embedding's shape) sits on the last stage unless it is the tied embedding itself
    head = stages[0].embedding_bytes_per_gpu if not spec.tie_word_embeddings or pp > 1 else 0
    out, moved = [], []
    for w in stages:
        kept, gone = offload_stage(w, head if w.stage == pp - 1 else 0, limit)
        out.append(kept)
        moved.append(gone)
    notes.append(
        f"--cpu-offload-gb {req.cpu_offload_gb:g}: {fmt_gib(max(moved))} of weights per GPU in CPU memory "
        "(whole decoder layers until the limit is reached), copied to the GPU in every forward pass: the step times "
        "include that copy over PCIe"
    )
    return out


def _prepare_engine(
    engine: Engine, spec: ModelSpec, fmt: Format, bs: int, tp: int, max_len: int,
    draft_layers: tuple[Layer, ...] = (),
) -> str | None:  # fmt: skip
    """Let the engine lay out its blocks; the reason it cannot, or None."""
    if fmt.name not in engines.ENGINE_KV_DTYPES or fmt.group_size:
        return f"{engine.label} has no {fmt.name} KV cache; kvplan's figures are a what-if"
    try:
        engine.prepare(list(spec.layers), fmt, bs, tp, max_len, draft_layers)
    except EngineUnsupported as exc:
        return str(exc)
    return None


def _stage_budget(
    req: PlanRequest, budget: Budget, weights: StageWeights, block_bytes: int | None, tp: int, pp: int
) -> int:
    """KV bytes one GPU of this stage may hold; raises when nothing is left."""
    gpu = req.gpu
    figures = {"weight_bytes_per_gpu": weights.bytes_per_gpu, "stage": weights.stage, "tp": tp, "pp": pp}
    if req.kv_cache_memory_bytes is not None or req.num_gpu_blocks_override is not None:
        if req.kv_cache_memory_bytes is not None:
            kv_bytes = req.kv_cache_memory_bytes
            flag = f"--kv-cache-memory {fmt_gib(kv_bytes)}"
        else:
            assert req.num_gpu_blocks_override is not None and block_bytes is not None
            kv_bytes = req.num_gpu_blocks_override * block_bytes
            flag = f"--num-gpu-blocks-override {req.num_gpu_blocks_override:,} ({fmt_gib(kv_bytes)})"
        if weights.bytes_per_gpu + kv_bytes > gpu.memory_bytes:
            raise NoKvMemoryLeft(
                f"{flag} plus {fmt_gib(weights.bytes_per_gpu)} of weights per GPU "
                f"exceed {gpu.name}'s {fmt_gib(gpu.memory_bytes)}; ask for less KV cache "
                "or use more GPUs",
                kv_budget_bytes_per_gpu=kv_bytes,
                memory_bytes_per_gpu=gpu.memory_bytes,
                **figures,
            )
        return kv_bytes
    if weights.bytes_per_gpu >= budget.requested_bytes:
        raise WeightsDoNotFit(
            f"weights need {fmt_gib(weights.bytes_per_gpu)} per GPU (stage {weights.stage}, TP {tp}, PP {pp}) "
            f"but {budget.usable_label} gives {fmt_gib(budget.requested_bytes)}; "
            + _weights_remedies(
                req, weights.bytes_per_gpu - budget.requested_bytes <= weights.bytes_per_gpu / 4
            ),
            requested_bytes_per_gpu=budget.requested_bytes,
            **figures,
        )
    kv_bytes = budget.kv_bytes(weights.bytes_per_gpu)
    if kv_bytes <= 0:
        r = budget.reserve
        # a refusal that rests on the sampler's assumed path says so: it is an assumption, not a fact
        sampler = (
            f" (the reserve is the sampler's profiling run, {budget.sampler_path} assumed: "
            "--env VLLM_USE_FLASHINFER_SAMPLER=1 if your vLLM has FlashInfer, or a smaller --max-num-seqs)"
            if budget.sampler_path and not r.given and r.sampler_bytes + r.hidden_bytes > r.activation_bytes
            else ""
        )
        raise NoKvMemoryLeft(
            f"no memory left for the KV cache: {fmt_gib(budget.requested_bytes)} usable - "
            f"{fmt_gib(weights.bytes_per_gpu)} weights - {fmt_gib(budget.reserve.total)} reserve = "
            f"{fmt_gib(kv_bytes)} per GPU{sampler}; use more GPUs, a smaller --weight-dtype, "
            "a higher --gpu-memory-utilization or a smaller --max-num-batched-tokens",
            requested_bytes_per_gpu=budget.requested_bytes,
            reserve_bytes_per_gpu=budget.reserve.total,
            **figures,
        )
    return kv_bytes


def _pool(
    req: PlanRequest,
    spec: ModelSpec,
    engine: Engine,
    budget: Budget,
    weights: Weights,
    fmt: Format,
    bs: int,
    tp: int,
    pp: int,
    kv_tp: int,
    draft_bytes_per_token: float = 0.0,
) -> tuple[Pool, list[StageCache]]:
    """Each pipeline stage's KV budget, bytes per token and blocks on one GPU (KV heads split over kv_tp,
    the attention TP size)."""
    stages: list[StagePlan] = []
    caches: list[StageCache] = []
    charges = []
    for w, rng in zip(weights.stages, stage_ranges(spec.num_layers, pp), strict=False):
        layers = stage_layers(spec, rng)
        engine_block = engine.block_bytes(rng, list(spec.layers), fmt, kv_tp)
        kv_bytes = engine.kv_budget_cap(
            _stage_budget(req, budget, w, engine_block, tp, pp), layers, fmt, kv_tp
        )
        whole = kv_bytes
        # vLLM: the draft's layers share the blocks; a charge (Engine.request_charge) carries their pages
        charges.append(charge := engine.request_charge(rng, fmt, kv_tp))
        if draft_bytes_per_token and w.stage == pp - 1 and (charge is None or engine.draft_apart):
            target = float(kv.model_bits_per_token(layers, fmt, kv_tp)) / 8
            kv_bytes = math.floor(kv_bytes * target / (target + draft_bytes_per_token))
        block_bytes = sum(n * kv.page_bytes(layer, fmt, bs, kv_tp) for layer, n in kv.grouped(layers))
        stages.append(
            StagePlan(
                w.stage,
                rng.start,
                len(rng),
                w.bytes_per_gpu,
                kv_bytes,
                kv.model_bits_per_token(layers, fmt, kv_tp),
                block_bytes,
                kv_bytes // block_bytes if block_bytes else None,
            )
        )
        caches.append(StageCache(layers, rng, kv_bytes, whole))
    copies, _ = engine.state_blocks(list(spec.layers))
    return (
        Pool(stages, [c.layers for c in caches], fmt, bs, kv_tp, copies, charges if any(charges) else None),
        caches,
    )


def _draft_pool(
    engine: Engine, draft: DraftMemory, pool: Pool, req: PlanRequest, notes: list[str], last: StageCache
) -> DraftMemory:
    """The draft's KV in memory: vLLM gives its layers their share of the KV budget (the pool above holds
    the target's share); SGLang gives the draft its own pool, beside the target's."""
    stage = pool.stages[-1]
    tokens = (stage.num_blocks or 0) * pool.block_size
    gib = 2**30
    if engine.name == "vllm" and pool.charges and pool.charges[-1] and not engine.draft_apart:
        # its layers sit in the target's groups: a request's pages for them are charged with its own
        kv_bytes = 0
        where = (
            "inside the KV budget: its layers join the target's KV-cache groups and share their blocks, "
            "so each request's pages for them are charged with the target's (Engine.request_charge)"
        )
        out = dataclasses.replace(draft, kv_bytes_per_gpu=kv_bytes, pool_tokens=tokens)
    elif engine.name == "vllm":
        # the budget less the target's share (the memory table's row): split in proportion to the bytes per token
        kv_bytes = (last.engine_budget_bytes or stage.kv_budget_bytes_per_gpu) - stage.kv_budget_bytes_per_gpu
        where = (
            f"inside the KV budget: the budget per GPU is split target : draft in proportion to their KV bytes "
            f"per token ({stage.kv_bits_per_token_per_gpu / 8:,.0f} : {draft.kv_bytes_per_token_per_gpu:,.0f} B), "
            "the draft's weights counted with the target's"
        )
        out = dataclasses.replace(draft, kv_bytes_per_gpu=kv_bytes, pool_tokens=tokens)
    else:
        spec = req.speculative
        assert spec is not None
        reqs = req.max_running_requests or min(
            max(int(tokens / max(req.max_model_len or req.model.max_context, 1) * 512), 2048), 4096
        )
        tokens = tokens + reqs * (spec.draft_steps * 1 + spec.verify_tokens) + 100
        kv_bytes = math.ceil(tokens * draft.kv_bytes_per_token_per_gpu)
        where = (
            f"beside the target's pool, outside --mem-fraction-static: its own pool of {tokens:,} tokens "
            f"({SGLANG_POOL}; max_num_reqs {reqs:,}, topk 1) at {draft.kv_bytes_per_token_per_gpu:,.0f} B per token"
        )
        out = dataclasses.replace(draft, kv_bytes_per_gpu=kv_bytes, pool_tokens=tokens, in_budget=False)
    notes.append(
        f"speculative draft ({draft.method}): weights {draft.weight_bytes_per_gpu / gib:.2f} GiB per GPU, KV "
        f"{kv_bytes / gib:.2f} GiB per GPU for {tokens:,} tokens, {where}; {draft.rule}"
    )
    return out


def _budget_source(
    req: PlanRequest, engine: Engine, budget: Budget, tp: int, pp: int, notes: list[str]
) -> str:
    if req.kv_cache_memory_bytes is not None:
        notes.append(
            f"KV cache memory per GPU given as {fmt_gib(req.kv_cache_memory_bytes)} (replaces utilization, weights and reserve)"
        )
        return "--kv-cache-memory"
    if req.num_gpu_blocks_override is not None:
        notes.append(
            f"{req.num_gpu_blocks_override:,} KV blocks per GPU given (replaces utilization, weights and reserve)"
        )
        return "--num-gpu-blocks-override"
    gpu = req.gpu
    notes += engine.budget_notes(budget, gpu, tp, pp)
    notes.append(
        f"{gpu.name} memory {fmt_gib(gpu.memory_bytes)} as the CUDA runtime reports it "
        f"(the datasheet's label '{gpu.memory_marketing}' is its marketing capacity, not a count of 10^9 bytes)"
    )
    return "computed"


@dataclass(frozen=True)
class Concurrency:
    factor: float  # blocks / blocks one request holds (the engine's printed figure, null block included)
    usable_factor: float  # the same without the engine's reserved blocks
    binding_stage: int
    request_bytes_per_gpu: int
    max_concurrency: int  # per replica
    limited_by: str
    request_tokens: int  # the longest request served: max_model_len, or the engine's cap to the pool
    # per replica: what memory alone allows (KV pool, state pool, vLLM's draft count), no flag's cap
    pool_limit: int


def _concurrency(
    req: PlanRequest, engine: Engine, pool: Pool, max_len: int, notes: list[str], attn_dp: int = 1
) -> Concurrency:
    null_blocks = engine.null_blocks
    _, bind = pool.requests_fitting(max_len)
    usable_factor, _ = pool.requests_fitting(max_len, null_blocks)
    if usable_factor < 1:
        fit = pool.largest_fitting_len(bind, pool.usable_bytes(bind, null_blocks), max_len)
        started = engine.oversized_request(max_len, fit)
        if started is None:
            _does_not_fit(pool, bind, null_blocks, max_len, fit, _more_kv(req))
        max_len, warning = started
        notes.append(f"WARNING: {warning}")
    conc_factor, bind = pool.requests_fitting(max_len)
    usable_factor, _ = pool.requests_fitting(max_len, null_blocks)
    per_req = pool.request_bytes(bind, max_len)
    cap = engine.request_cap(attn_dp)
    if cap is not None and attn_dp > 1 and engine.name == "sglang":
        notes.append(
            f"--max-running-requests over {attn_dp} attention-DP ranks: {cap:,} a rank, {cap * attn_dp:,} in all "
            "(SGLang divides it by the DP size: model_runner.py)"
        )
    if not per_req:  # e.g. cross-attention only, with no images: nothing bounds the pool
        if cap is None:
            raise UsageError(
                "a request holds no KV cache in this model (no self-attention or state layer, and no image K/V): "
                "the pool bounds nothing; give --max-num-seqs (SGLang: --max-running-requests) for the concurrency"
            )
        usable_factor = conc_factor = float(cap)
    kv_limit = math.floor(usable_factor)
    capped = cap is not None and cap < kv_limit
    max_conc = min(kv_limit, cap) if cap is not None else kv_limit
    return Concurrency(
        conc_factor,
        usable_factor,
        bind,
        per_req,
        max_conc,
        "max_num_seqs" if capped else "kv_cache",
        max_len,
        kv_limit,
    )


def _state_pool_cap(
    report: EngineReport, conc: Concurrency, notes: list[str], radix: bool
) -> tuple[Concurrency, int | None]:
    """SGLang runs at most state_running_cap requests of a model with recurrent states (its state pool): a cap
    the KV pool does not show. (the concurrency, the cap a rank, or None)"""
    d = report.details
    slots = d.mamba_cache_slots if isinstance(d, engines.SglangDetails) else None
    if slots is None:
        return conc, None
    cap = state_running_cap(slots, radix)
    if cap < 1:
        per = f"{MAMBA_SLOTS_PER_REQUEST} a request with the radix cache" if radix else "one a request"
        raise RequestDoesNotFit(
            f"SGLang's recurrent-state pool holds {slots:,} slot{'' if slots == 1 else 's'} ({per}): no request "
            "can run and SGLang refuses to start (tp_worker.py: 'max_running_request is zero'); raise "
            "--mem-fraction-static or --mamba-full-memory-ratio, or add GPUs",
            state_slots=slots,
        )
    conc = dataclasses.replace(conc, pool_limit=min(conc.pool_limit, cap))
    if cap >= conc.max_concurrency:
        return conc, cap
    notes.append(
        f"SGLang runs at most {cap:,} requests ({slots:,} state slots, {'3 a request with the radix cache' if radix else 'one a request'}: "
        f"model_runner.py); the KV pool alone holds {conc.max_concurrency:,}"
    )
    return dataclasses.replace(conc, max_concurrency=cap, limited_by="state_pool"), cap


def _draft_apart_cap(
    engine: Engine, report: EngineReport, conc: Concurrency, notes: list[str]
) -> Concurrency:
    """A draft in a vLLM KV-cache group of its own is split off the budget by its bytes per token, not charged as
    vLLM charges it (its group's pages a request, over every pipeline stage's groups): kvplan's count is held to
    vLLM's own, (blocks - null block) // the blocks a full-length request holds."""
    d = report.details
    if not engine.draft_apart or not isinstance(d, engines.VllmDetails) or not report.num_blocks:
        return conc
    held = (report.num_blocks - engine.null_blocks) // max(d.held_blocks_per_request, 1)
    conc = dataclasses.replace(conc, pool_limit=min(conc.pool_limit, held))
    if held >= conc.max_concurrency:
        return conc
    notes.append(
        f"the speculative draft's layers form a vLLM KV-cache group of their own: concurrency is vLLM's count, "
        f"{held:,} (its {report.num_blocks:,} blocks // {d.held_blocks_per_request:,} a full-length request holds), "
        f"not kvplan's {conc.max_concurrency:,}"
    )
    per_request = max(d.held_blocks_per_request, 1)
    return dataclasses.replace(
        conc, max_concurrency=held, factor=report.num_blocks / per_request,
        usable_factor=(report.num_blocks - engine.null_blocks) / per_request,
    )  # fmt: skip


def _running_note(
    running: int, why: str, raisable: bool, attn_dp: int, req_len: int, conc: Concurrency,
    memory_avg: AvgContext | None, avg: AvgContext | None,
) -> list[str]:  # fmt: skip
    """The line that says where the running cap, not memory, sets the decode rows' batch (none where it does not)."""
    memory = [(f"{req_len:,}", conc.pool_limit, conc.max_concurrency)]
    if memory_avg is not None and avg is not None:
        memory.append((f"{memory_avg.avg_context_tokens:,}", memory_avg.max_concurrency_per_replica // attn_dp,
                       avg.max_concurrency_per_replica // attn_dp))  # fmt: skip
    held = [(n, c) for n, c, capped in memory if capped > running]
    if not held:
        return []
    return [
        f"decode speed at {running * attn_dp:,} running requests a replica: {why} runs no more at once; "
        + ", ".join(f"memory holds {c * attn_dp:,} at {n} tokens" for n, c in held)
        + (" (give a larger cap to batch more)" if raisable else "")
    ]


def _check_within_cap(req: PlanRequest, req_len: int, max_len: int) -> None:
    """Where the engine caps each request below --max-model-len (SGLang with a pool smaller than one request),
    a context or request the flags describe beyond the cap is one no request can reach: refused, as one beyond
    --max-model-len is."""
    if req_len >= max_len:
        return
    longest = [(f, v) for f, v in (("--input-len + --output-len", (req.input_len or 0) + (req.output_len or 0)),
                                   ("--avg-context", req.avg_context_tokens))
               if v and v > req_len]  # fmt: skip
    if longest:
        flag, value = longest[0]
        raise RequestDoesNotFit(
            f"{flag} {value:,} is above SGLang's max_req_len {req_len:,}, the longest request its KV pool holds "
            f"at --max-model-len {max_len:,} on these GPUs; give a shorter context, more GPUs or more KV memory",
            max_req_len=req_len,
        )


def _capped_avg(avg: AvgContext | None, caps: list[int | None], attn_dp: int, dp: int) -> AvgContext | None:
    """--avg-context's requests, no more than the engine runs at once (a flag's cap, SGLang's state pool; each an
    attention rank's)."""
    given = [c for c in caps if c is not None]
    if avg is None or not given:
        return avg
    per_replica = min(avg.max_concurrency_per_replica, min(given) * attn_dp)
    return dataclasses.replace(avg, max_concurrency_per_replica=per_replica, max_concurrency=per_replica * dp)


def _capped_fragmentation(
    frag: Fragmentation, prealloc_cap: int | None, avg: AvgContext | None, headline: int
) -> Fragmentation:
    """The preallocation row reserves a max_model_len request each: it holds no more than `prealloc_cap` (the
    headline when something beyond the pool's bytes bounds it). The paged row no more than the same context's
    row (--avg-context's, or the headline's)."""
    paged = avg.max_concurrency_per_replica if avg is not None else headline

    def cap(n: int | None, limit: int | None) -> int | None:
        return None if n is None else n if limit is None else min(n, limit)

    return dataclasses.replace(
        frag,
        prealloc_max_concurrency_per_replica=cap(frag.prealloc_max_concurrency_per_replica, prealloc_cap),
        paged_max_concurrency_per_replica=cap(frag.paged_max_concurrency_per_replica, paged),
    )


def _does_not_fit(
    pool: Pool, bind: int, null_blocks: int, max_len: int, fit: int | None, more: str
) -> NoReturn:
    """One request at --max-model-len does not fit and the engine refuses to start (vLLM raises in
    kv_cache_utils.py check_enough_kv_cache_memory)."""
    per_req = pool.request_bytes(bind, max_len)
    avail = pool.usable_bytes(bind, null_blocks)
    hint = f"; the largest --max-model-len that fits is {fit:,}" if fit else ""
    digits = 2 if abs(per_req - avail) > 0.01 * GiB else 4
    raise RequestDoesNotFit(
        f"one request at --max-model-len {max_len:,} needs {fmt_gib(per_req, digits)} of KV cache "
        f"per GPU, but only {fmt_gib(avail, digits)} is usable ("
        + ("whole blocks, one kept as the null block" if null_blocks else "whole pages")
        + f"){hint}; or {more}",
        kv_bytes_per_request_per_gpu=per_req,
        usable_kv_bytes_per_gpu=avail,
        largest_fitting_max_model_len=fit,
        kv_budget_bytes_per_gpu=pool.stages[bind].kv_budget_bytes_per_gpu,
    )


def _avg_context(
    req: PlanRequest, pool: Pool, null_blocks: int, bind: int, dp: int, attn_dp: int = 1
) -> AvgContext | None:
    if req.avg_context_tokens is None:
        return None
    a = req.avg_context_tokens
    f_avg, _ = pool.requests_fitting(a, null_blocks)
    per_replica = math.floor(f_avg) * attn_dp
    return AvgContext(a, pool.request_bytes(bind, a), per_replica, per_replica * dp)


def _engine_report(
    engine: Engine,
    problem: str | None,
    caches: list[StageCache],
    fmt: Format,
    bs: int,
    tp: int,
    max_len: int,
    kvplan_conc: int,
) -> EngineReport:
    if problem is not None:
        return engine.unsupported(problem)
    try:
        report = engine.report(caches, fmt, bs, tp, max_len)
    except EngineUnsupported as exc:
        return engine.unsupported(str(exc))
    if report.max_concurrency is None:
        return report
    return dataclasses.replace(report, differences=engine.differences(report, kvplan_conc))


def _explain_pool(ex: list[Explain], engine: Engine, budget: Budget, gpu: GpuSpec, source: str, pool: Pool,
                  conc: Concurrency, dp: int, max_len: int, split: bool = False) -> None:  # fmt: skip
    bs, tp = pool.block_size, pool.tp
    formula, cite = engine.budget_formula(budget, gpu)
    num_blocks = pool.num_blocks
    ex += [
        Explain(
            "KV budget per GPU",
            fmt_gib(pool.stages[conc.binding_stage].kv_budget_bytes_per_gpu),
            f"given by {source}"
            if source != "computed"
            else formula + (" - the speculative draft's share (by KV bytes per token)" if split else ""),
            cite,
        ),
        Explain(
            "blocks per GPU",
            f"{num_blocks:,}" if num_blocks is not None else "n/a",
            "floor(KV budget / (block_size x KV bytes per token per GPU)); min over PP stages",
            f"block_size {bs}; KV heads per rank max(1, h_kv // {tp}); MLA latent replicated; vLLM vllm/v1/core/kv_cache_utils.py at v0.11.0",
        ),
        Explain(
            "KV pool tokens",
            f"{(num_blocks or 0) * bs:,}",
            "blocks x block_size",
            "vLLM vllm/v1/core/kv_cache_utils.py at v0.11.0 (GPU KV cache size)",
        ),
        Explain(
            "max concurrency",
            f"{conc.max_concurrency:,} per replica x {dp} replica(s)",
            (
                "floor((blocks - 1 null block) / blocks one request needs at max_model_len)"
                if engine.null_blocks
                else "floor(blocks / blocks one request needs at max_model_len)"
            )
            + (", each group's padding slots and padded state pages charged" if pool.charges else ""),
            f"ceil({max_len:,} / {bs}) blocks per full-attention layer"
            + ("; null block: vLLM vllm/v1/core/block_pool.py at v0.11.0" if engine.null_blocks else ""),
        ),
    ]


# DeepSeek-V3.2-Exp's config.json index_topk 2048: its sparse kernels read the indexer's top-k tokens' latents
DSA_DENSE = (
    "sparse attention (DSA) timed as dense: decode reads each request's whole latent cache and prefill "
    "attention is charged full causal FLOPs, though the engines' sparse kernels attend to the indexer's "
    "top-k tokens (index_topk, 2,048 in DeepSeek-V3.2's config; this spec states none); past that context "
    "the attention time is an upper bound"
)
DSA_SPARSE = (
    "sparse attention (DSA): a decode step reads the latents of the indexer's top {topk:,} tokens (index_topk) "
    "and every token's indexer key, at the dense kernel's efficiency (the top-k selection is not timed); "
    "prefill attention is charged full causal FLOPs, an upper bound past {topk:,} tokens"
)


def _chunked_prefill_size(req: PlanRequest, report: EngineReport) -> int | None:
    d = report.details
    if isinstance(d, engines.SglangDetails):
        return d.chunked_prefill_size
    return req.chunked_prefill_size


# --- the composition --------------------------------------------------------------------------


def _engine_context(
    req: PlanRequest, cls: type[Engine], version: tuple[int, int], notes: list[str]
) -> PlanRequest:
    """The context an engine starts with where it is not the model's maximum (kvplan/specs/hf/rope.py): vLLM
    0.12+ on a LongRoPE model without --max-model-len, SGLang on a YaRN block whose maximum it derives
    unscaled; and SGLang's own limit where --max-model-len passes it."""
    spec = req.model
    if req.max_model_len is None and not req.max_model_len_auto:
        if cls.name == "vllm" and spec.vllm_default_context and version >= (0, 12):
            # vllm/config/model.py _get_and_verify_max_len (PR #27431, first released in 0.11.1)
            value = spec.vllm_default_context
            notes.append(
                f"--max-model-len {value:,}: vLLM's default for a LongRoPE model (original_max_position_embeddings, "
                f"vllm/config/model.py _get_and_verify_max_len); up to {spec.max_context:,} with the long factors"
            )
        elif cls.name == "sglang" and spec.sglang_max_context:
            value = spec.sglang_max_context
            notes.append(
                f"--max-model-len {value:,}: SGLang's default for this model (hf_transformers_utils.py "
                f"get_context_length: a rope_scaling block naming original_max_position_embeddings is not scaled), "
                f"where vLLM derives {spec.max_context:,}"
            )
        else:
            return req
        return dataclasses.replace(req, max_model_len=value)
    if (
        cls.name == "sglang"
        and spec.sglang_max_context
        and (req.max_model_len or 0) > spec.sglang_max_context
    ):
        notes.append(
            f"--context-length {req.max_model_len:,} is above SGLang's own maximum for this model, "
            f"{spec.sglang_max_context:,} (rope_scaling not scaled): SGLang starts with it only with "
            "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
        )
    return req


def engine_defaults(req: PlanRequest) -> tuple[PlanRequest, dict[str, Any], list[str]]:
    """The request with the engine's defaults filled in where the user gave none (batch sizes, the
    model dtype): (request, {flag: value applied}, assumption lines)."""
    cls = engines.engine_class(req.engine)
    version = cls.parse_version(req.engine_version)
    cls.check_architecture(req.model, version)
    req, applied, notes = _model_dtype(req, cls, version)
    req = _engine_context(req, cls, version, notes)
    if (
        cls.name == "sglang"
        and req.speculative is not None
        and req.max_running_requests is None
        and req.speculative_running_default
    ):
        # server_args.py _handle_speculative_decoding (0.5.x): EAGLE, EAGLE3, STANDALONE, NEXTN (run as EAGLE) and
        # NGRAM set max_running_requests to 48 when it is not given ("Max running requests is reset to 48 for
        # speculative decoding"); under DP attention each rank takes 48 // dp_size
        from kvplan.engines.sglang import SPECULATIVE_MAX_RUNNING as SGLANG_SPEC_MAX_RUNNING

        req = dataclasses.replace(req, max_running_requests=SGLANG_SPEC_MAX_RUNNING)
        applied["max_running_requests"] = SGLANG_SPEC_MAX_RUNNING
        notes.append(
            f"--max-running-requests {SGLANG_SPEC_MAX_RUNNING}: SGLang's default under speculative decoding "
            "(server_args.py: 'Max running requests is reset to 48 for speculative decoding'); give "
            "--max-running-requests to raise it"
        )
    if (
        cls.name == "vllm"
        and version < V1_DEFAULT
        and req.enable_prefix_caching
        and not req.prefix_caching_stated
    ):
        # vLLM's V0 engine (before 0.8) had prefix caching off unless --enable-prefix-caching (engine/arg_utils.py)
        req = dataclasses.replace(req, enable_prefix_caching=False)
        notes.append(
            "prefix caching off: vLLM's V0 engine (before 0.8) enables it only with --enable-prefix-caching"
        )
    given = req.max_num_batched_tokens is not None
    d = None if given else cls.batch_defaults(req.gpu, req.usage, version)
    budget = req.max_num_batched_tokens if d is None else d.max_num_batched_tokens
    assert budget is not None
    # vllm/config/scheduler.py at v0.11.0 (SchedulerConfig._verify_args), on the budget given or the default vLLM
    # fills in before it verifies; a default max_num_seqs is first lowered to the budget (vllm/engine/arg_utils.py
    # _set_default_args), so only a given one is checked
    if cls.name == "vllm" and req.max_num_seqs and budget < req.max_num_seqs:
        what = (
            "--max-num-batched-tokens"
            if given
            else "vLLM's default --max-num-batched-tokens for this card and usage,"
        )
        raise UsageError(
            f"--max-num-seqs {req.max_num_seqs:,} is above {what} {budget:,}: vLLM refuses to start "
            f"(max_num_batched_tokens must be >= max_num_seqs); give --max-num-batched-tokens {req.max_num_seqs:,} "
            "or more, or a smaller --max-num-seqs"
        )
    if d is None:
        return req, applied, notes
    applied["max_num_batched_tokens"] = d.max_num_batched_tokens
    line = f"--max-num-batched-tokens {d.max_num_batched_tokens:,}"
    if req.max_num_seqs is None and d.max_num_seqs is not None:
        applied["max_num_seqs"] = d.max_num_seqs
        line += (
            f"; its --max-num-seqs default {d.max_num_seqs:,} sizes the sampler's profiling run and caps the "
            "requests run at once (kvplan's concurrency figures are what memory holds, capped only by a "
            "--max-num-seqs you give; its decode speed rows time no more than the cap)"
        )
    if cls.name == "vllm":  # SGLang's step budget is --chunked-prefill-size; the figure keys nothing it plans
        notes.append(f"{line}: {d.why}; override with --max-num-batched-tokens / --max-num-seqs")
    return dataclasses.replace(req, max_num_batched_tokens=d.max_num_batched_tokens), applied, notes


def _model_dtype(
    req: PlanRequest, cls: type[Engine], version: engines.Version
) -> tuple[PlanRequest, dict[str, Any], list[str]]:
    """--dtype: the engine's rule for auto, or the dtype given, applied to the model (activations,
    the KV cache under --kv-cache-dtype auto, and the weights of an unquantized checkpoint)."""
    spec = req.model
    given = model_dtype_name(req.dtype) or "auto"
    if given == "auto":
        rules = before_0_10_1(version, req.engine_version) if cls.name == "vllm" else version
        dtype, why = cls.auto_dtype(spec, rules, req.gpu)
        notes = [why] if why else []
        applied: dict[str, Any] = {"dtype": dtype}
    else:
        dtype, applied = given, {}
        check_dtype(spec, dtype)
        cls.check_model_dtype(dtype, req.gpu)
        notes = [
            f"--dtype {req.dtype}: activations{', the KV cache (auto)' if req.kv_cache_dtype == 'auto' else ''}"
            f"{' and the weights' if _unquantized(spec) else ''} in {dtype}"
        ]
    if dtype == spec.activation_dtype:
        return req, applied, notes
    return dataclasses.replace(req, model=with_model_dtype(spec, dtype)), applied, notes


def _unquantized(spec: ModelSpec) -> bool:
    return not spec.weight_formats and spec.weight_dtype in ("bf16", "fp16", "fp32")


def with_model_dtype(spec: ModelSpec, dtype: str) -> ModelSpec:
    """The model served in `dtype`: vllm/config/model.py sets the model's dtype, which the
    unquantized weights are loaded in and KV cache dtype auto follows (SGLang: model_config.py)."""
    update: dict[str, Any] = {"activation_dtype": dtype}
    if _unquantized(spec):
        update["weight_dtype"] = dtype
        if spec.checkpoint_weight_bytes:  # the index's total is of the files: the weights load in `dtype`
            bits = weight_format(dtype).bits_per_value / weight_format(spec.activation_dtype).bits_per_value
            update["checkpoint_weight_bytes"] = round(spec.checkpoint_weight_bytes * bits)
        if spec.expert_weight_dtype in ("bf16", "fp16", "fp32"):
            update["expert_weight_dtype"] = dtype
    return spec.model_copy(update=update)


# vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS: --dtype float16 raises for these (numerical
# instability); by architecture as kvplan's specs name it
FLOAT16_REFUSED = ("Gemma2", "Gemma3", "Glm4", "Plamo2")


def check_dtype(spec: ModelSpec, dtype: str) -> None:
    arch = spec.architecture or ""
    if dtype == "fp16" and arch.startswith(FLOAT16_REFUSED):
        raise UsageError(
            f"--dtype float16: {arch} does not support float16 (numerical instability, "
            "vllm/config/model.py); use bfloat16 or float32"
        )


def _layout(req: PlanRequest) -> Layout:
    """TP x PP x DP. --data-parallel-size (vLLM, or SGLang without DP attention) counts replicas of
    TP x PP GPUs (PP 1 unless given): it must divide the replicas --gpus gives, and sets the GPU count of
    a bare GPU name.
    Under SGLang's --enable-dp-attention its --dp-size splits the TP group instead (engines/sglang.py)."""
    gpu, d = req.gpu, req.data_parallel_size or 1
    # the GPUs of one node: as --gpus NODESxNxGPU says (2x4xH100: 4), else the catalog's
    per_node = req.num_gpus // req.nodes if req.num_gpus and req.nodes > 1 else gpu.gpus_per_node
    if d == 1 or req.enable_dp_attention:
        return make_layout(req.num_gpus, per_node, req.nodes, req.tp, req.pp)
    if req.num_gpus is None:
        t, p = req.tp or 1, req.pp or 1
        return make_layout(t * p * d, per_node, 1, t, p)
    # TP defaults to what gives d replicas of TP x PP, no wider than a node: 2x8xH100 -dp 2 is TP 8 x DP 2
    tp = req.tp or max(1, min(per_node, req.num_gpus // (d * (req.pp or 1))))
    layout = make_layout(req.num_gpus, per_node, req.nodes, tp, req.pp or 1)
    if layout.dp % d:
        raise UsageError(
            f"--data-parallel-size {d}: --gpus gives {layout.num_gpus} GPUs, {layout.dp} replica(s) of TP "
            f"{layout.tp} x PP {layout.pp}; give --gpus with {d} x TP x PP GPUs or a smaller --data-parallel-size"
        )
    return layout


def _weights_remedies(req: PlanRequest, offload_helps: bool) -> str:
    """What to do when the weights do not fit, naming only the flags the calling command takes; offload is
    offered where a quarter of the weights or less is over (that much kept in CPU memory starts the engine)."""
    ways = ["use more GPUs (-tp/-pp)"]
    if "--weight-dtype" in req.remedies:
        ways.append("a smaller --weight-dtype")
    ways.append("a larger GPU")
    text = ", ".join(ways)
    if offload_helps and not req.cpu_offload_gb:
        if "--cpu-offload-gb" in req.remedies:
            text += ", or --cpu-offload-gb to keep some in CPU memory (copied over PCIe every step)"
        else:
            text += "; `kvplan estimate --cpu-offload-gb` plans keeping some in CPU memory"
    return text


def estimate(req: PlanRequest) -> Plan:
    if req.max_model_len_auto:
        return _auto_fit(req)
    return _estimate(req)


def _more_kv(req: PlanRequest) -> str:
    """How to get more KV memory, naming the flag that sized it in this request."""
    if req.kv_cache_memory_bytes is not None:
        flag = "--kv-cache-memory"
    elif req.num_gpu_blocks_override is not None:
        flag = "--num-gpu-blocks-override"
    elif req.engine == "sglang":
        flag = "--mem-fraction-static"
    else:
        flag = "--gpu-memory-utilization"
    return f"add GPUs, use a smaller --kv-cache-dtype, or raise {flag}"


def _auto_fit(req: PlanRequest) -> Plan:
    """--max-model-len auto: plan at the model's maximum; where one request of it does not fit, at the
    longest that does (kvplan's own fit rule, the one its 'does not fit' refusal names)."""
    if req.max_model_len is not None:
        raise UsageError("--max-model-len is auto or a length, not both")
    engine = engines.for_request(req)
    since = engine.auto_fit_since
    if since is None:
        raise UsageError(
            f"--max-model-len auto is vLLM's; {engine.display_name} serves the context length given "
            "(default: the model's maximum): give --max-model-len a length, or --engine vllm"
        )
    if engine.version < since:
        raise UsageError(
            f"--max-model-len auto came in {engine.display_name} {engines.fmt_version(since)}; "
            f"{engine.label} takes a length"
        )
    base = dataclasses.replace(req, max_model_len_auto=False)
    full = req.model.max_context
    try:
        plan = _estimate(base)
    except RequestDoesNotFit as e:
        fit = e.figures.get("largest_fitting_max_model_len")
        if not fit:
            raise RequestDoesNotFit(
                f"vLLM cannot auto-fit --max-model-len: {fmt_bytes(e.figures.get('kv_budget_bytes_per_gpu', 0))} "
                "of KV memory per GPU holds not one block of a request ('Cannot auto-fit max_model_len: "
                f"not enough GPU memory'); {_more_kv(req)}",
                **e.figures,
            ) from None
        plan = _estimate(dataclasses.replace(base, max_model_len=fit))
    fitted = plan.settings.max_model_len
    lines = list(plan.engine.log_lines)
    at = next((i + 1 for i, line in enumerate(lines) if line.startswith("Available KV cache memory")), 0)
    lines.insert(at, engine.auto_fit_line(full, fitted, plan.engine.available_kv_bytes or 0))
    note = (
        f"--max-model-len auto: vLLM fits {fitted:,} tokens, the longest request the KV pool holds "
        f"(whole blocks, one kept as the null block); the model's maximum, {full:,}, does not fit"
        if fitted < full
        else f"--max-model-len auto: the model's maximum, {full:,} tokens, fits; vLLM keeps it"
    )
    return dataclasses.replace(
        plan,
        settings=dataclasses.replace(plan.settings, max_model_len_auto_from=full),
        engine=dataclasses.replace(plan.engine, log_lines=lines),
        assumptions=[note, *plan.assumptions],
    )


def _estimate(req: PlanRequest) -> Plan:
    req.checked()
    req, applied, default_notes = engine_defaults(req)
    engine = engines.for_request(req)
    max_len, fmt = req.checked()
    gpu = req.gpu
    layout: Layout = _layout(req)
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    sh = engine.sharding(req.model, tp)
    check_tp(req.model, sh.attn_tp, layout.pp)
    if req.moe_imbalance != 1.0 and not (sh.ep > 1 and sh.num_experts):
        raise UsageError(
            "--moe-imbalance needs expert parallelism (vLLM --enable-expert-parallel, SGLang --ep-size > 1): "
            "under TP every GPU holds a slice of every expert"
        )
    # the mean is the total over the EP ranks: the busiest carries at most all of it, EP x the mean
    if req.moe_imbalance > sh.ep:
        raise UsageError(
            f"--moe-imbalance {req.moe_imbalance:g} is above the EP size {sh.ep}: the busiest of {sh.ep} ranks "
            f"carries at most all the routed-expert work, {sh.ep}x the mean; give {sh.ep} or less"
        )
    kv_tp, attn_dp = sh.attn_tp, sh.attn_dp
    ex: list[Explain] = []
    notes: list[str] = list(default_notes)
    if req.data_parallel_size and not req.enable_dp_attention and dp != req.data_parallel_size:
        notes.append(
            f"--data-parallel-size {req.data_parallel_size}: the {layout.num_gpus} GPUs hold {dp} replicas of "
            f"TP {tp} x PP {pp}, i.e. {dp // req.data_parallel_size} deployments of DP {req.data_parallel_size}; "
            "the figures are per replica and for all of them"
        )
    if req.model.checkpoint_kv_cache_dtype and normalize_dtype_name(req.kv_cache_dtype) == "auto":
        notes.append(
            f"--kv-cache-dtype auto: {fmt.name}, the checkpoint's KV quantization (as the engines resolve auto: "
            "SGLang model_runner.py configure_kv_cache_dtype, vLLM resolve_kv_cache_dtype_string)"
        )
    spec, bs = _engine_view(req, engine, fmt, kv_tp, notes)
    totals = _kv_totals(spec, fmt, max_len, ex)
    notes += sh.rules
    weights = _weights(req, engine, spec, sh, pp, notes, ex)
    draft = draft_memory(req.speculative, spec, weights.stages, fmt, tp, kv_tp)
    shared = draft is not None and engine.name == "vllm"  # vLLM: the draft inside the budget
    if shared:
        assert draft is not None
        last = weights.stages[-1]
        weights = dataclasses.replace(
            weights,
            stages=[
                *weights.stages[:-1],
                dataclasses.replace(last, bytes_per_gpu=last.bytes_per_gpu + draft.weight_bytes_per_gpu),
            ],
        )
    budget = engine.budget(spec, gpu, tp, pp)
    problem = _prepare_engine(
        engine, spec, fmt, bs, kv_tp, max_len, draft.kv_layers if shared and draft else ()
    )
    if req.num_gpu_blocks_override is not None and problem is not None:
        raise UsageError(f"--num-gpu-blocks-override needs vLLM's block accounting: {problem}")
    pool, caches = _pool(
        req,
        spec,
        engine,
        budget,
        weights,
        fmt,
        bs,
        tp,
        pp,
        kv_tp,
        draft.kv_bytes_per_token_per_gpu if shared and draft else 0.0,
    )
    source = _budget_source(req, engine, budget, tp, pp, notes)
    conc = _concurrency(req, engine, pool, max_len, notes, attn_dp)
    req_len = conc.request_tokens  # max_len, or the engine's cap when one request overflows the pool
    _check_within_cap(req, req_len, max_len)
    binding = pool.stages[conc.binding_stage]
    split = any(c.engine_budget_bytes not in (None, c.kv_budget_bytes) for c in caches)
    _explain_pool(ex, engine, budget, gpu, source, pool, conc, dp, max_len, split)
    avg = _avg_context(req, pool, engine.null_blocks, conc.binding_stage, dp, attn_dp)
    prefix = None
    if req.shared_prefix_tokens:
        prefix = prefix_caching(
            pool, min(req.shared_prefix_tokens, req_len), req.prefix_hit_rate, req_len, engine.null_blocks,
            engine.request_cap(attn_dp), dp, conc.usable_factor, attn_dp,
        )  # fmt: skip
        notes.append(
            f"prefix caching: {req.shared_prefix_tokens:,}-token shared prefix hit by "
            f"{req.prefix_hit_rate:.0%} of requests; only full blocks are shared and stored once"
        )
    frag = fragmentation(
        pool, conc.binding_stage, min(req.avg_context_tokens or req_len, req_len), req_len,
        pool.usable_bytes(conc.binding_stage, engine.null_blocks),
    )  # fmt: skip
    report = _engine_report(engine, problem, caches, fmt, bs, kv_tp, max_len, math.floor(conc.usable_factor))
    conc, state_cap = _state_pool_cap(report, conc, notes, req.enable_prefix_caching)
    pooled = conc.max_concurrency
    conc = _draft_apart_cap(engine, report, conc, notes)
    memory_avg = avg  # what memory holds at --avg-context, before any cap
    avg = _capped_avg(avg, [engine.request_cap(attn_dp), state_cap], attn_dp, dp)
    # the preallocation row is held to the headline where more than the pool's bytes bound it (a cap, the
    # state pool, vLLM's count of a draft's own group); the pool alone: no null block unpaged, so it may hold one more
    bound = conc.limited_by != "kv_cache" or conc.max_concurrency < pooled
    frag = _capped_fragmentation(frag, conc.max_concurrency if bound else None, avg, conc.max_concurrency)
    # the decode rows time the batch the scheduler forms: no more than it runs at once, a flag's cap or its default
    # one attention rank's pool, as the engine reports it (SGLang sizes its request pool from it)
    rank_tokens = report.kv_cache_tokens or (pool.num_blocks or 0) * pool.block_size
    running, running_why, raisable = engine.running_cap(rank_tokens, max_len, attn_dp)
    batch = min(conc.max_concurrency, running)
    speed_avg = _capped_avg(avg, [running], attn_dp, dp)
    notes += _running_note(running, running_why, raisable, attn_dp, req_len, conc, memory_avg, avg)
    decode, prefill = plan_speed(req, spec, weights.params, weights.weight_fmt, weights.expert_fmt, pool,
                                 tp, req_len, batch * attn_dp, speed_avg,
                                 weights.stages[0].embedding_bytes_per_gpu, float(fmt.bits_per_value), sh,
                                 tuple(w.offloaded_bytes_per_gpu for w in weights.stages))  # fmt: skip
    if dsa := [layer for layer in spec.layers if getattr(layer, "index_head_dim", None)]:
        topk = getattr(dsa[0], "index_topk", None)
        notes.append(DSA_SPARSE.format(topk=topk) if topk else DSA_DENSE)
    notes.append(
        f"decode step model: {decode.bandwidth_source}; prefill: {prefill.gemm_words}, attention, "
        f"all-reduces, launch, {prefill.source}; both are estimates"
    )
    notes += link_notes(req, decode.inputs)
    if not sh.plain:
        # the all-to-all's source is in the decode line above
        notes += [text for term, text in decode.inputs.parallel.sources if term != "all_to_all"]
        notes.append(
            "prefill (TTFT) under this layout: a prompt's attention GEMMs and attention run on one "
            "attention-DP rank's GPUs (all-reduced over them), its MLP/MoE side over the TP group, its "
            "tokens dispatched all-to-all where the engine does; the routed experts' FLOPs are still charged "
            "as TP-sliced (a vLLM EP group spreading them over more GPUs is not credited)"
        )
    if req.speculative is not None and req.speculative.unread:
        notes.append(
            f"{req.speculative.flag.split()[0]}: {', '.join(req.speculative.unread)} not read by kvplan, so its "
            "figures leave out whatever they change; check the spelling if vLLM should take them"
        )
    if draft is not None:
        draft = _draft_pool(engine, draft, pool, req, notes, caches[-1])
    elif req.speculative is not None:
        notes.append(
            f"speculative decoding ({req.speculative.method}): n-gram drafting holds no weights or KV"
        )
    reserve = budget.reserve
    used = source == "computed"
    num_blocks = pool.num_blocks
    pool_tokens = num_blocks * bs if num_blocks is not None else 0
    return Plan(
        schema=SCHEMA,
        model=ModelSummary(
            spec.name,
            spec.hf_id,
            spec.attention_summary,
            spec.num_layers,
            spec.max_context,
            list(spec.warnings),
        ),
        gpu=GpuSummary(gpu.name, gpu.memory_bytes, gpu.hbm_bytes_per_s),
        cluster=Cluster(
            layout.num_gpus,
            tp,
            pp,
            dp,
            sh.ep,
            sh.attn_tp,
            attn_dp,
            sh.local_experts if sh.num_experts else None,
            sh.expert_tp if sh.num_experts else None,
        ),  # fmt: skip
        settings=Settings(
            max_model_len=max_len,
            kv_cache_dtype=fmt.name,
            kv_cache_format=fmt.describe(),
            kv_bits_per_value=float(fmt.bits_per_value),
            block_size=bs,
            engine=req.engine,
            engine_version=engine.version_text,
            gpu_memory_utilization=budget.gpu_memory_utilization,
            mem_fraction_static=budget.mem_fraction_static,
            max_num_batched_tokens=req.batched_tokens,
            max_num_seqs=req.max_num_seqs,
            enable_prefix_caching=req.enable_prefix_caching,
            usage=req.usage,
            engine_defaults=EngineDefaults(**applied, **engine.defaults_applied()),
            dtype=spec.activation_dtype,
            cpu_offload_gb=req.cpu_offload_gb,
            max_total_tokens=req.max_total_tokens,
            max_running_requests=req.max_running_requests,
            chunked_prefill_size=_chunked_prefill_size(req, report),
            engine_env=engine.env_applied(req.model),
            max_request_tokens=req_len,
            weight_dtype=weights.weight_fmt.name,
            expert_weight_dtype=weights.expert_fmt.name if weights.params.routed_experts else None,
            weight_formats=component_formats(spec, weights.weight_fmt, weights.expert_fmt)
            if not req.weight_dtype
            else component_formats(
                spec.model_copy(update={"weight_formats": {}}), weights.weight_fmt, weights.expert_fmt
            ),  # fmt: skip
        ),
        kv_bytes_per_token=_num(totals.bits_per_token),
        kv_bytes_per_token_per_gpu=_num(binding.kv_bits_per_token_per_gpu),
        kv_bytes_per_token_growing=_num(totals.bits_per_token_growing),
        kv_bytes_per_sequence_windowed_cap=totals.windowed_cap_bytes,
        kv_bytes_per_request=totals.request_bytes,
        kv_bytes_per_request_fixed=totals.fixed_bytes,
        kv_bytes_per_request_per_gpu=conc.request_bytes_per_gpu,
        params_total=weights.params.total,
        params_active=weights.params.active,
        params_stated=weights.params.total_stated,
        memory_bytes_per_gpu=gpu.memory_bytes,
        requested_bytes_per_gpu=budget.requested_bytes,
        weight_bytes_per_gpu=max(s.weight_bytes_per_gpu for s in pool.stages),
        weight_bytes_total=sum(w.bytes_per_gpu for w in weights.stages) * tp,
        weight_bytes_checkpoint=spec.checkpoint_weight_bytes,
        reserve_bytes_per_gpu=reserve.total if used else 0,
        reserve=ReserveSummary(
            reserve.activation_bytes,
            reserve.sampler_bytes,
            reserve.non_torch_bytes,
            reserve.cuda_graph_bytes,
            estimated=not reserve.given,
            used=used,
            profile_peak_bytes=reserve.peak_bytes,
            encoder_cache_bytes=reserve.encoder_cache_bytes,
            sampler_path=budget.sampler_path,
            weight_loading_bytes=budget.loading_bytes,
            sampler_hidden_bytes=reserve.hidden_bytes if reserve.sequential and reserve.sampler_bytes else 0,
        ),  # fmt: skip
        kv_budget_bytes_per_gpu=binding.kv_budget_bytes_per_gpu,
        kv_budget_source=source,
        block_bytes_per_gpu=binding.block_bytes_per_gpu,
        num_blocks_per_gpu=num_blocks,
        kv_pool_tokens=pool_tokens * attn_dp,
        kv_pool_tokens_cluster=pool_tokens * attn_dp * dp,
        blocks_per_request=max(kv.layer_blocks(layer, max_len, bs) for layer, _ in kv.grouped(spec.layers)),
        concurrency_factor=conc.factor,
        max_concurrency_per_replica=conc.max_concurrency * attn_dp,
        max_concurrency=conc.max_concurrency * attn_dp * dp,
        limited_by=conc.limited_by,
        pool_max_concurrency_per_replica=conc.pool_limit * attn_dp,
        running_cap_per_rank=running,
        avg_context=avg,
        prefix_caching=prefix,
        fragmentation=frag,
        stages=pool.stages,
        assumptions=notes,
        engine=report,
        decode=decode,
        prefill=prefill,
        explain=ex,
        calibration=req.calibration_use,
        speculative_memory=draft,
    )


def _ep_dp_text(c: Cluster) -> str:
    """ ", EP 8, attention DP 8 x TP 1" where expert parallelism or DP attention is on; "" otherwise."""
    out = f", EP {c.expert_parallel_size}" if c.expert_parallel_size > 1 else ""
    if c.attention_dp_size > 1:
        out += f", attention DP {c.attention_dp_size} x TP {c.attention_tp_size}"
    return out


def plan_header(plan: Plan) -> tuple[str, str]:
    """The two lines `estimate` opens with: the setup, and the attention layers."""
    c = plan.cluster
    s = plan.settings
    return (
        f"{plan.model.name} on {c.num_gpus}x {plan.gpu.name} "
        f"(TP {c.tensor_parallel_size}, PP {c.pipeline_parallel_size}, DP {c.data_parallel_size}{_ep_dp_text(c)}); "
        f"max-model-len {plural(s.max_model_len, 'token')}{' (auto)' if s.max_model_len_auto_from else ''}; "
        f"KV {s.kv_cache_format}; block size {plural(s.block_size, 'token')}",
        f"attention: {plan.model.attention}",
    )


def plan_summary(plan: Plan) -> str:
    """A plan in a few lines (the Python API's repr): the header and the headline figures."""
    s = plan.settings
    return "\n".join(
        (
            *plan_header(plan),
            f"KV per token {fmt_bytes(plan.kv_bytes_per_token)}; KV pool "
            f"{plural(plan.kv_pool_tokens, 'token')} per replica; max concurrent requests at "
            f"{plural(s.max_model_len, 'token')}: {plan.max_concurrency:,}",
        )
    )
