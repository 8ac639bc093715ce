"""Models and KV techniques side by side: what-if variants of a spec, rows, the optimisation ladder.

A variant is a transformation of a model spec (fewer KV heads, a latent, cross-layer
sharing, a window) or of the plan's options (a KV dtype, a CPU offload tier); variants
compose with `+` (`gqa8+int8`). Every figure comes from the planner (plan.estimate).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvplan import engines
from kvplan.engines.vllm import V1_DEFAULT
from kvplan.errors import InfeasibleError, KvplanError, RequestDoesNotFit, UsageError
from kvplan.formats import KV_DTYPES, kv_format
from kvplan.limits import MAX_DIM, MAX_HEADS, MAX_LAYERS, MAX_TOKENS
from kvplan.model import kv
from kvplan.plan.plan import Plan, PlanRequest, estimate
from kvplan.specs.models import (
    CompressedLatent,
    FullAttention,
    HeadLayer,
    LatentAttention,
    Layer,
    ModelSpec,
    SharedKV,
    SlidingWindow,
)
from kvplan.units import GiB

SCHEMA = "kvplan.compare/1"
DEFAULT_MODELS = (
    "llama3-70b",
    "llama3.1-405b",
    "qwen2.5-72b",
    "deepseek-v3",
)  # the models README's Comparing models and techniques compares
MLA_ROPE_DIM = 64  # DeepSeek-V2/V3's decoupled RoPE key (DeepSeek-V2, arXiv:2405.04434: 512 + 64)

# Quality notes, each with its public source (or marked assumed).
QUALITY = {
    "mha": "baseline",
    "gqa": "~99.5%+ of MHA quality (assumed; cf. GQA, arXiv:2305.13245)",
    "mqa": "~97-99% of MHA quality (assumed; cf. GQA, arXiv:2305.13245)",
    "mla": "almost no loss; a little more compute to decompress (DeepSeek-V2, arXiv:2405.04434)",
    "share": "~MQA accuracy in 1B/3B research models; not yet in production (CLA, arXiv:2405.12981)",
    "int8": "< 0.5% accuracy loss (assumed)",
    "int4": "1-2% accuracy loss (assumed)",
    "int2": "KIVI: small loss at 2 bits (arXiv:2402.02750)",
    "offload": "no loss; PCIe (~64 GB/s) instead of HBM on read-back (assumed)",
}


KV_READ_SOURCE = "datasheet HBM bandwidth (no kernel efficiency; weights excluded)"


@dataclass(frozen=True)
class Variant:
    label: str
    spec: ModelSpec
    kv_cache_dtype: str | None = None
    offload_bytes_per_gpu: int = 0
    notes: tuple[str, ...] = ()


def _with_layers(spec: ModelSpec, layers: Sequence[Layer], suffix: str) -> ModelSpec:
    """The spec with an explicit per-layer list (deduplicated into layer_types)."""
    names: dict[str, str] = {}
    types: dict[str, dict] = {}
    pattern = []
    for layer in layers:
        key = layer.model_dump_json()
        if key not in names:
            names[key] = f"t{len(names)}"
            types[names[key]] = layer.model_dump()
        pattern.append(names[key])
    data = spec.model_dump()
    data.update(
        name=f"{spec.name}+{suffix}", layer_types=types, layer_pattern=pattern, aliases=[], hf_id=None
    )
    return ModelSpec.model_validate(data)


class VariantNotApplicable(UsageError):
    """A variant with no form for this model's layers (a window over MLA latents): its table row says so."""


def _mha_dims(spec: ModelSpec, layer: Layer) -> tuple[int, int]:
    if isinstance(layer, CompressedLatent):  # DeepSeek-V4: per-head K and V of head_dim
        return layer.head_dim, layer.head_dim
    if isinstance(layer, LatentAttention):  # the MHA it replaces: per-head K (nope + rope) and V
        return layer.nope_dim + layer.qk_rope_head_dim, layer.value_dim
    assert isinstance(layer, HeadLayer)
    return layer.head_dim, layer.v_dim


def _heads(spec: ModelSpec, n: int, what: str) -> ModelSpec:
    h = spec.num_attention_heads
    if n < 1 or n > h or h % n:
        raise UsageError(f"variant {what}: {n} KV heads must divide {spec.name}'s {h} attention heads")
    out = []
    for layer in spec.layers:
        if isinstance(layer, (HeadLayer, LatentAttention, CompressedLatent)):
            k, v = _mha_dims(spec, layer)
            fields = {"num_kv_heads": n, "head_dim": k, "head_dim_v": v if v != k else None}
            if isinstance(layer, HeadLayer) and type(layer) is not FullAttention:
                layer = layer.model_copy(update=fields)  # keeps a window/chunk
            else:
                layer = FullAttention(**fields)
        out.append(layer)
    return _with_layers(spec, out, what)


def _mla(spec: ModelSpec, rank: int, what: str) -> ModelSpec:
    """Every attention layer an MLA latent of `rank` + MLA_ROPE_DIM values; a layer that is MLA already keeps
    its other parts (its query and value widths, a DSA indexer) and takes the new latent."""
    out: list[Layer] = []
    for layer in spec.layers:
        if isinstance(layer, LatentAttention):
            layer = layer.model_copy(update={"kv_lora_rank": rank, "qk_rope_head_dim": MLA_ROPE_DIM})
        elif isinstance(layer, (HeadLayer, CompressedLatent)):
            layer = LatentAttention(kv_lora_rank=rank, qk_rope_head_dim=MLA_ROPE_DIM)
        out.append(layer)
    return _with_layers(spec, out, what)


def _share(spec: ModelSpec, factor: int, what: str) -> ModelSpec:
    """Cross-layer sharing (CLA, arXiv:2405.12981): of each `factor` consecutive cache layers, the first
    keeps K/V and the others read it."""
    if factor < 2:
        raise UsageError(f"variant {what}: the sharing factor must be >= 2")
    if any(isinstance(layer, CompressedLatent) for layer in spec.layers):
        raise VariantNotApplicable(
            f"variant {what}: {spec.name}'s compressed_mla layers (DeepSeek-V4) have no cross-layer sharing form in "
            "kvplan"
        )
    cached = sum(isinstance(layer, (HeadLayer, LatentAttention)) for layer in spec.layers)
    if factor > cached:
        raise UsageError(
            f"variant {what}: {spec.name} has {cached} layers with a KV cache; share at most {cached} a group"
        )
    out: list[Layer] = []
    producer = None
    run = 0
    for i, layer in enumerate(spec.layers):
        holds = isinstance(layer, (HeadLayer, LatentAttention))
        if holds and producer is not None and run % factor and type(layer) is type(spec.layers[producer]):
            out.append(SharedKV(source=producer - i))
            run += 1
            continue
        if holds:
            producer, run = i, 1
        out.append(layer)
    return _with_layers(spec, out, what)


def _window(spec: ModelSpec, w: int, what: str) -> ModelSpec:
    latent = sum(isinstance(layer, (LatentAttention, CompressedLatent)) for layer in spec.layers)
    if latent:
        raise VariantNotApplicable(
            f"variant {what}: {spec.name}'s {latent} latent (MLA) layers have no sliding-window form in kvplan"
        )
    if w >= spec.max_context:  # every token kept: the same model, not a window (a spec refuses such a layer)
        raise VariantNotApplicable(
            f"variant {what}: a window of {w:,} tokens keeps every token of {spec.name}'s {spec.max_context:,}-token "
            "context: no sliding-window form to compare"
        )
    out = []
    for layer in spec.layers:
        if isinstance(layer, HeadLayer):
            layer = SlidingWindow(
                num_kv_heads=layer.num_kv_heads,
                head_dim=layer.head_dim,
                head_dim_v=layer.head_dim_v,
                window=w,
            )
        out.append(layer)
    return _with_layers(spec, out, what)


_TOKEN = re.compile(
    r"^(shipped|mha|mqa|gqa(\d+)|mla(\d+)?|share(\d+)?|window(\d+[kK]?)|offload(\d+(?:\.\d+)?))$"
)


def _number(digits: str, what: str, high: int) -> int:
    """A variant's number (gqa8, mla512, window4k), from 1 to `high`."""
    if len(digits) > 12 or not 1 <= int(digits) <= high:
        raise UsageError(f"variant {what}: the number must be between 1 and {high:,}")
    return int(digits)


def _kind(token: str) -> str:
    """What a variant token changes: the KV dtype, the attention's shape, sharing, a window or offload."""
    low = token.lower()
    if low in KV_DTYPES or low == "auto":
        return "KV dtype"
    if not _TOKEN.match(low):
        return ""  # refused as unknown where it is read
    for prefix, kind in (("share", "sharing"), ("window", "window"), ("offload", "offload")):
        if low.startswith(prefix):
            return kind
    return "" if low == "shipped" else "attention"


def _one_of_each(tokens: list[str], text: str) -> None:
    """Two tokens of one kind (mha+mqa, fp8+int8) would silently keep the last: refused."""
    seen: dict[str, str] = {}
    for tok in tokens:
        kind = _kind(tok)
        if kind and kind in seen:
            raise UsageError(
                f"--variants: {text!r} gives two of one kind ({kind}: {seen[kind]}, {tok}); keep one"
            )
        if kind:
            seen[kind] = tok


def make_variant(spec: ModelSpec, text: str, offload_gib: float = 0.0) -> Variant:
    """Apply `text` (tokens joined by '+') to `spec`; `offload_gib` adds a CPU tier to every row."""
    tokens = [t.strip() for t in text.split("+") if t.strip()]
    if not tokens:
        raise UsageError(f"--variants: empty variant in {text!r}")
    dtype = None
    offload = offload_gib
    notes: list[str] = []
    _one_of_each(tokens, text)
    for tok in tokens:
        low = tok.lower()
        if low in KV_DTYPES or low == "auto":
            dtype = low
            if low in QUALITY:
                notes.append(QUALITY[low])
            continue
        m = _TOKEN.match(low)
        if not m:
            raise UsageError(
                f"--variants: unknown {tok!r}; use shipped, mha, gqaN, mqa, mlaR, shareN, windowW, offloadG "
                f"or a KV dtype ({', '.join(KV_DTYPES)}), joined by '+'"
            )
        if low == "shipped":
            continue
        if low == "mha":
            spec = _heads(spec, spec.num_attention_heads, low)
            notes.append(QUALITY["mha"])
        elif low == "mqa":
            spec = _heads(spec, 1, low)
            notes.append(QUALITY["mqa"])
        elif m.group(2):
            spec = _heads(spec, _number(m.group(2), low, MAX_HEADS), low)
            notes.append(QUALITY["gqa"])
        elif low.startswith("mla"):
            spec = _mla(spec, _number(m.group(3) or "512", low, MAX_DIM), low)
            notes.append(QUALITY["mla"])
        elif low.startswith("share"):
            spec = _share(spec, _number(m.group(4) or "2", low, MAX_LAYERS), low)
            notes.append(QUALITY["share"])
        elif low.startswith("window"):
            w = m.group(5)
            tokens_w = (
                _number(w[:-1], low, MAX_TOKENS // 1024) * 1024
                if w[-1] in "kK"
                else _number(w, low, MAX_TOKENS)
            )
            spec = _window(spec, tokens_w, low)
        else:
            offload = float(m.group(6))
            if not 0 <= offload <= 2**20:
                raise UsageError(f"variant {low}: offload GiB must be between 0 and {2**20:,}")
    if offload:
        notes.append(QUALITY["offload"])
    return Variant("+".join(tokens), spec, dtype, int(offload * GiB), tuple(dict.fromkeys(notes)))


def mha_bytes_per_token(spec: ModelSpec) -> int:
    """KV bytes per token of the same model with one K/V head per query head, in its activation dtype."""
    fmt = KV_DTYPES[spec.activation_dtype]
    bits = 0
    for layer in spec.layers:
        if isinstance(layer, (HeadLayer, LatentAttention, CompressedLatent)):
            k, v = _mha_dims(spec, layer)
            bits += spec.num_attention_heads * (fmt.vector_bits(k) + fmt.vector_bits(v))
    return bits // 8


@dataclass
class Row:
    model: str
    variant: str
    attention: str
    kv_cache_dtype: str | None
    kv_bytes_per_token: float | None
    kv_bytes_per_token_per_gpu: float | None
    ratio_to_mha: float | None
    kv_bytes_per_request: int | None
    state_bytes_per_request: int | None  # recurrent state + image K/V: fixed per request, whole model
    max_concurrency: int | None
    decode_kv_read_ms_one_request: float | None
    decode_kv_read_ms: float | None
    offload_bytes_per_gpu: int
    offload_read_ms: float | None
    quality: str
    error: str | None = None
    # the decode_kv_read_* columns: KV bytes over the GPU's datasheet HBM bandwidth, not the step model
    decode_kv_read_source: str = KV_READ_SOURCE
    plan: Plan | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("plan")
        # the context this row was planned at: a model whose maximum is below the table's is capped
        d["max_model_len"] = self.plan.settings.max_model_len if self.plan is not None else None
        return d


def _request(base: PlanRequest, variant: Variant) -> PlanRequest:
    kw: dict[str, Any] = {"model": variant.spec}
    if variant.kv_cache_dtype:
        kw["kv_cache_dtype"] = variant.kv_cache_dtype
    return dataclasses.replace(base, **kw)


def _null_blocks(plan: Plan) -> int:
    """The blocks the plan's engine keeps out of use at its release (vLLM V0, before 0.8: none)."""
    s = plan.settings
    if s.engine == "vllm" and engines.parse_version(s.engine_version, "vllm") < V1_DEFAULT:
        return 0
    return engines.engine_class(s.engine).null_blocks


def offload_concurrency(plan: Plan, offload_bytes: int) -> tuple[int, int]:
    """(requests that fit with `offload_bytes` of CPU memory per GPU added to the pool, bytes that must
    cross PCIe each decode step at that concurrency, per GPU)."""
    per_req = plan.kv_bytes_per_request_per_gpu
    gpu_pool = (
        plan.max_concurrency_per_replica * per_req
        if plan.num_blocks_per_gpu is None
        else ((plan.num_blocks_per_gpu - _null_blocks(plan)) * plan.block_bytes_per_gpu)
    )
    per_replica = math.floor((gpu_pool + offload_bytes) / per_req) if per_req else 0
    if plan.settings.max_num_seqs is not None:
        per_replica = min(per_replica, plan.settings.max_num_seqs)
    spilled = max(per_replica * per_req - gpu_pool, 0)
    return per_replica * plan.cluster.data_parallel_size, spilled


def row(base: PlanRequest, model: ModelSpec, text: str, offload_gib: float = 0.0) -> Row:
    try:
        variant = make_variant(model, text, offload_gib)
    except VariantNotApplicable as exc:  # the other models' rows stand; this one says why it has no figures
        none: dict[str, Any] = dict.fromkeys(
            ("kv_cache_dtype", "kv_bytes_per_token", "kv_bytes_per_token_per_gpu", "ratio_to_mha",
             "kv_bytes_per_request", "state_bytes_per_request", "max_concurrency", "decode_kv_read_ms_one_request",
             "decode_kv_read_ms", "offload_read_ms")
        )  # fmt: skip
        return Row(model=model.name, variant=text, attention=model.attention_summary, offload_bytes_per_gpu=0,
                   quality="", error=f"not applicable: {exc}", **none)  # fmt: skip
    quality = "; ".join(variant.notes)
    try:
        p = estimate(_request(base, variant))
    except InfeasibleError as exc:
        # the model's own KV bytes per token need no cluster: an infeasible row keeps them
        fmt = kv_format(variant.kv_cache_dtype or "auto", variant.spec.activation_dtype)
        per_token = kv.model_bits_per_token(variant.spec.layers, fmt) / 8
        nothing: dict[str, Any] = dict.fromkeys(
            (
                "kv_bytes_per_token_per_gpu",
                "kv_bytes_per_request",
                "state_bytes_per_request",
                "max_concurrency",
                "decode_kv_read_ms_one_request",
                "decode_kv_read_ms",
                "offload_read_ms",
            )
        )
        return Row(
            model=model.name,
            variant=variant.label,
            attention=variant.spec.attention_summary,
            kv_cache_dtype=variant.kv_cache_dtype,
            offload_bytes_per_gpu=variant.offload_bytes_per_gpu,
            quality=quality,
            error=str(exc),
            kv_bytes_per_token=int(per_token) if per_token == int(per_token) else per_token,
            ratio_to_mha=per_token / mha_bytes_per_token(model),
            **nothing,
        )
    conc = p.max_concurrency
    spilled = 0
    if variant.offload_bytes_per_gpu:
        conc, spilled = offload_concurrency(p, variant.offload_bytes_per_gpu)
    per_gpu_conc = conc // p.cluster.data_parallel_size
    hbm = p.gpu.hbm_bytes_per_s
    # decode reads every live request's KV once per step (README, The formulas); datasheet HBM bandwidth
    read_ms = (per_gpu_conc * p.kv_bytes_per_request_per_gpu - spilled) / hbm * 1e3
    pcie = base.gpu.pcie_bytes_per_s
    return Row(
        model=model.name,
        variant=variant.label,
        attention=variant.spec.attention_summary,
        kv_cache_dtype=p.settings.kv_cache_dtype,
        kv_bytes_per_token=p.kv_bytes_per_token,
        kv_bytes_per_token_per_gpu=p.kv_bytes_per_token_per_gpu,
        ratio_to_mha=p.kv_bytes_per_token / mha_bytes_per_token(model),
        kv_bytes_per_request=p.kv_bytes_per_request,
        state_bytes_per_request=p.kv_bytes_per_request_fixed,
        max_concurrency=conc,
        decode_kv_read_ms_one_request=p.kv_bytes_per_request_per_gpu / hbm * 1e3,
        decode_kv_read_ms=read_ms,
        offload_bytes_per_gpu=variant.offload_bytes_per_gpu,
        offload_read_ms=spilled / pcie * 1e3 if variant.offload_bytes_per_gpu else None,
        quality=quality,
        plan=p,
    )


def table(
    base: PlanRequest, models: list[ModelSpec], variants: list[str], offload_gib: float = 0.0
) -> list[Row]:
    return [row(base, m, v, offload_gib) for m in models for v in variants]


# --- the ladder (README, Comparing models and techniques) ------------------------------------------


@dataclass
class Step:
    step: str
    variant: str
    max_concurrency: int
    factor: float | None  # against the previous step
    cumulative: float | None  # against the first step
    how: str


def _avg_requests(p: Plan) -> int:
    assert p.avg_context is not None  # every ladder plan after the first is made with an average context
    return p.avg_context.max_concurrency_per_replica


def _prefix_requests(p: Plan) -> int:
    assert p.prefix_caching is not None  # made with a shared prefix
    return p.prefix_caching.max_concurrency_per_replica


def ladder(
    base: PlanRequest, avg_context: int, shared_prefix_tokens: int, prefix_hit_rate: float
) -> tuple[list[Step], Plan]:
    """The optimisation ladder (README, Comparing models and techniques) for one model: naive preallocation -> paged -> GQA -> INT8 -> prefix
    caching -> MLA + FP8, each step computed by the planner on the same KV budget per GPU."""
    spec = base.model
    shipped = estimate(dataclasses.replace(base, avg_context_tokens=avg_context))
    budget = shipped.kv_budget_bytes_per_gpu
    fixed = dataclasses.replace(
        base, kv_cache_memory_bytes=budget, reserve_bytes=None, avg_context_tokens=avg_context
    )
    heads = [la for la in spec.layers if isinstance(la, (HeadLayer, LatentAttention))]
    if any(isinstance(la, LatentAttention) for la in heads):
        gqa = "gqa8" if spec.num_attention_heads % 8 == 0 else "mqa"
    elif all(isinstance(la, HeadLayer) and la.num_kv_heads < spec.num_attention_heads for la in heads):
        gqa = "shipped"
    else:
        gqa = "gqa8" if spec.num_attention_heads % 8 == 0 else "mqa"
    # a model whose attention is a latent already (MLA, DeepSeek-V4's compressed latent) takes its own at this step
    mla = (
        "shipped"
        if any(isinstance(la, (LatentAttention, CompressedLatent)) for la in spec.layers)
        else "mla512"
    )

    def plan_for(text: str, **kw) -> Plan:
        v = make_variant(spec, text)
        return estimate(dataclasses.replace(_request(fixed, v), **kw))

    full = base.max_model_len or spec.max_context
    naive_how = f"contiguous {full:,}-token buffer per request, MHA, bf16"
    try:
        naive = plan_for("mha")
        paged = naive
    except RequestDoesNotFit as exc:  # MHA's KV of one full-length request exceeds the budget: none fit
        fit = exc.figures.get("largest_fitting_max_model_len")
        if not fit:
            raise
        naive = None
        # the same pool, at a length one request fits; a request of the average length may not fit either
        paged = plan_for("mha", max_model_len=fit, avg_context_tokens=min(avg_context, fit))
        naive_how += " (one does not fit the budget)"
    paged_conc = _avg_requests(paged) if avg_context <= paged.settings.max_model_len else 0
    steps_raw = [
        (
            "naive PyTorch",
            "mha",
            (naive.fragmentation.prealloc_max_concurrency_per_replica or 0) if naive else 0,
            naive_how,
        ),
        (
            "+ PagedAttention",
            "mha",
            paged_conc,
            f"blocks of {paged.settings.block_size} for the {avg_context:,} tokens a request holds on average",
        ),
    ]
    g = plan_for(gqa)
    steps_raw.append(("+ GQA", gqa, _avg_requests(g), f"{g.model.attention}"))
    i8 = plan_for(f"{gqa}+int8")
    steps_raw.append(
        (
            "+ INT8 KV",
            f"{gqa}+int8",
            _avg_requests(i8),
            "1 byte per value, per-layer scale",
        )
    )
    prefix_kw = {
        "shared_prefix_tokens": shared_prefix_tokens,
        "prefix_hit_rate": prefix_hit_rate,
        "max_model_len": avg_context,
        "avg_context_tokens": None,
    }
    pc = plan_for(f"{gqa}+int8", **prefix_kw)
    steps_raw.append(
        (
            "+ prefix caching",
            f"{gqa}+int8",
            _prefix_requests(pc),
            f"a {shared_prefix_tokens:,}-token prefix shared by {prefix_hit_rate:.0%} of requests",
        )
    )
    mf = plan_for(f"{mla}+fp8", **prefix_kw)
    replicated = _prefix_requests(mf)
    tp = mf.cluster.tensor_parallel_size
    how = f"{mf.model.attention}, fp8 KV"
    mla_conc = replicated
    if tp > 1:
        # README, How the engines size their KV cache: under TP every rank holds the whole latent; MLA models are served with
        # data-parallel attention instead, each rank keeping the latents of its own requests
        mla_conc = replicated * tp
        how += (
            f"; data-parallel attention over the {tp} GPUs (with the latent replicated on every TP rank, "
            f"as vLLM's TP does: {replicated * shipped.cluster.data_parallel_size:,})"
        )
    steps_raw.append(("+ MLA + FP8", f"{mla}+fp8", mla_conc, how))
    dp = shipped.cluster.data_parallel_size
    steps: list[Step] = []
    for name, variant, per_replica, how in steps_raw:
        conc = per_replica * dp
        prev = steps[-1].max_concurrency if steps else None
        first = steps[0].max_concurrency if steps else None
        steps.append(
            Step(
                name,
                variant,
                conc,
                conc / prev if prev else None,
                conc / first if first else None,
                how,
            )
        )
    return steps, shipped


# --- concurrency vs context, for charts -------------------------------------------------------


def contexts(upper: int, lower: int = 1024) -> list[int]:
    out, c = [], lower
    while c < upper:
        out.append(c)
        c *= 2
    out.append(upper)
    return out


def curve(base: PlanRequest, model: ModelSpec, text: str, ctxs: list[int]) -> list[int | None]:
    """Max concurrency at each context (None where the model cannot serve it)."""
    try:
        variant = make_variant(model, text)
    except VariantNotApplicable:
        return [None] * len(ctxs)
    out: list[int | None] = []
    for c in ctxs:
        if c > variant.spec.max_context:
            out.append(None)
            continue
        try:
            p = estimate(dataclasses.replace(_request(base, variant), max_model_len=c))
        except KvplanError:
            out.append(None)
            continue
        conc = p.max_concurrency
        if variant.offload_bytes_per_gpu:
            conc, _ = offload_concurrency(p, variant.offload_bytes_per_gpu)
        out.append(conc)
    return out
