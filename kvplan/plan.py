"""estimate(): specs + options -> Plan. The composition of the pure formulas.

Flow: layout (TP/PP/DP) -> per-stage layers -> KV bits per token per rank ->
weights per GPU -> KV budget per GPU -> paged blocks -> concurrency.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from kvplan import engines, kv, speed
from kvplan.budget import Reserve, estimate_reserve, requested_bytes
from kvplan.errors import InfeasibleError, UsageError
from kvplan.formats import Format, kv_format, normalize_dtype_name, weight_format
from kvplan.parallel import Layout, check_tp, make_layout, stage_layers, stage_ranges
from kvplan.params import param_breakdown
from kvplan.specs.models import (
    ChunkedAttention,
    GpuSpec,
    HeadLayer,
    LatentAttention,
    ModelSpec,
    SlidingWindow,
)
from kvplan.units import GiB, fmt_bytes, fmt_gib
from kvplan.weights import stage_weights

SCHEMA = "kvplan.plan/1"
# engines.md: vLLM keeps one block as the null block; SGLang's padding slot lies outside its pool
NULL_BLOCKS = {"vllm": 1, "sglang": 0}


@dataclass(frozen=True)
class PlanRequest:
    model: ModelSpec
    gpu: GpuSpec
    num_gpus: int | None = None  # None: as many as TP x PP
    nodes: int = 1
    tp: int | None = None
    pp: int | None = None
    max_model_len: int | None = None  # None: the model's max context
    avg_context_tokens: int | None = None
    kv_cache_dtype: str = "auto"
    kv_quant_group_size: int | None = None
    kv_quant_scale_bits: int | None = None
    kv_quant_zero_point: bool | None = None
    weight_dtype: str | None = None
    gpu_memory_utilization: float | None = None  # None: the engine's default
    kv_cache_memory_bytes: int | None = None
    reserve_bytes: int | None = None
    reserve_source: str | None = None  # where a given reserve came from (a calibration file)
    max_num_batched_tokens: int = 8192
    max_num_seqs: int | None = None
    block_size: int | None = None  # None: the engine's default for this model and GPU
    engine: str = "vllm"
    engine_version: str | None = None  # None: the newest release kvplan knows
    num_gpu_blocks_override: int | None = None
    disable_hybrid_kv_cache_manager: bool = False
    enforce_eager: bool = False
    mem_fraction_static: float | None = None  # SGLang
    swa_full_tokens_ratio: float = 0.8  # SGLang
    disable_hybrid_swa_memory: bool = False  # SGLang
    decode_bandwidth_bytes_per_s: float | None = (
        None  # measured peak (a calibration profile); None: datasheet
    )
    decode_bandwidth_half_bytes: float = 0.0  # the measured curve's half-saturation bytes
    decode_bandwidth_source: str | None = None
    enable_prefix_caching: bool = True
    shared_prefix_tokens: int = 0
    prefix_hit_rate: float = 1.0


@dataclass(frozen=True)
class Explain:
    quantity: str
    value: str
    formula: str
    source: str


@dataclass(frozen=True)
class StagePlan:
    stage: int
    first_layer: int
    num_layers: int
    weight_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int
    kv_bits_per_token_per_gpu: int
    block_bytes_per_gpu: int
    num_blocks: int | None


@dataclass(frozen=True)
class Plan:
    schema: str
    model: dict[str, Any]
    gpu: dict[str, Any]
    cluster: dict[str, int]
    settings: dict[str, Any]
    kv_bytes_per_token: float
    kv_bytes_per_token_per_gpu: float
    kv_bytes_per_token_growing: float
    kv_bytes_per_sequence_windowed_cap: int
    kv_bytes_per_request: int
    kv_bytes_per_request_per_gpu: int
    params_total: int
    params_active: int
    params_stated: bool
    memory_bytes_per_gpu: int
    requested_bytes_per_gpu: int
    weight_bytes_per_gpu: int
    reserve_bytes_per_gpu: int
    reserve: dict[str, Any]
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
    avg_context: dict[str, Any] | None
    prefix_caching: dict[str, Any] | None
    fragmentation: dict[str, Any]
    stages: list[StagePlan]
    assumptions: list[str]
    engine_kv_cache_tokens: int | None
    engine_num_blocks: int | None
    engine_max_concurrency: float | None
    engine: dict[str, Any]
    decode: dict[str, Any]
    prefill: dict[str, Any]
    explain: list[Explain] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _num(bits: int) -> float:
    """Bits -> bytes, an int when whole (JSON stays clean for the usual formats)."""
    return bits // 8 if bits % 8 == 0 else bits / 8


def _check_engine_flags(req: PlanRequest) -> None:
    if req.engine not in engines.ENGINES:
        raise UsageError(f"--engine must be one of {', '.join(engines.ENGINES)}, got {req.engine!r}")
    vllm_only = {
        "--gpu-memory-utilization": req.gpu_memory_utilization is not None,
        "--num-gpu-blocks-override": req.num_gpu_blocks_override is not None,
        "--disable-hybrid-kv-cache-manager": req.disable_hybrid_kv_cache_manager,
    }
    sglang_only = {
        "--mem-fraction-static": req.mem_fraction_static is not None,
        "--disable-hybrid-swa-memory": req.disable_hybrid_swa_memory,
        "--swa-full-tokens-ratio": req.swa_full_tokens_ratio != 0.8,
    }
    wrong = [f for f, used in (vllm_only if req.engine == "sglang" else sglang_only).items() if used]
    if wrong:
        other = "vllm" if req.engine == "sglang" else "sglang"
        raise UsageError(f"{wrong[0]} is a {other} flag; add --engine {other} or drop it")
    if req.gpu_memory_utilization is not None and not 0 < req.gpu_memory_utilization <= 1:
        raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {req.gpu_memory_utilization}")
    if req.mem_fraction_static is not None and not 0 < req.mem_fraction_static < 1:
        raise UsageError(f"--mem-fraction-static must be in (0, 1), got {req.mem_fraction_static}")
    if not 0 < req.swa_full_tokens_ratio <= 1:
        raise UsageError(f"--swa-full-tokens-ratio must be in (0, 1], got {req.swa_full_tokens_ratio}")
    if req.num_gpu_blocks_override is not None and req.num_gpu_blocks_override < 2:
        raise UsageError("--num-gpu-blocks-override must be >= 2 (one block is the null block)")
    if req.num_gpu_blocks_override is not None and req.kv_cache_memory_bytes is not None:
        raise UsageError("give --kv-cache-memory or --num-gpu-blocks-override, not both")
    if req.block_size is not None and req.block_size < 1:
        raise UsageError(f"--block-size must be >= 1, got {req.block_size}")


def _check_request(req: PlanRequest) -> tuple[int, Format]:
    spec = req.model
    _check_engine_flags(req)
    if req.max_num_batched_tokens < 1:
        raise UsageError("--max-num-batched-tokens must be >= 1")
    if req.max_num_seqs is not None and req.max_num_seqs < 1:
        raise UsageError("--max-num-seqs must be >= 1")
    max_len = req.max_model_len or spec.max_context
    if max_len < 1:
        raise UsageError("--max-model-len must be >= 1")
    if max_len > spec.max_context:
        raise InfeasibleError(
            f"--max-model-len {max_len:,} exceeds {spec.name}'s maximum context of "
            f"{spec.max_context:,} tokens; use --max-model-len {spec.max_context} or less"
        )
    if req.avg_context_tokens is not None and not 1 <= req.avg_context_tokens <= max_len:
        raise UsageError(
            f"--avg-context must be between 1 and --max-model-len ({max_len:,}), got {req.avg_context_tokens:,}"
        )
    if not 0 <= req.prefix_hit_rate <= 1:
        raise UsageError(f"--prefix-hit-rate must be in [0, 1], got {req.prefix_hit_rate}")
    if req.shared_prefix_tokens < 0 or req.shared_prefix_tokens > max_len:
        raise UsageError(
            f"--shared-prefix-tokens must be between 0 and --max-model-len ({max_len:,}), "
            f"got {req.shared_prefix_tokens:,}"
        )
    if req.shared_prefix_tokens and not req.enable_prefix_caching:
        raise UsageError("--shared-prefix-tokens needs prefix caching; drop --no-enable-prefix-caching")
    if req.kv_cache_memory_bytes is not None and req.kv_cache_memory_bytes <= 0:
        raise UsageError("--kv-cache-memory must be positive")
    if req.reserve_bytes is not None and req.reserve_bytes < 0:
        raise UsageError("--reserve-memory must be >= 0")
    fmt = kv_format(
        req.kv_cache_dtype,
        spec.activation_dtype,
        req.kv_quant_group_size,
        req.kv_quant_scale_bits,
        req.kv_quant_zero_point,
    )
    return max_len, fmt


def _request_bytes(layers: list, fmt: Format, context: int, block_size: int, tp: int) -> int:
    """Block-rounded bytes one request of `context` tokens holds on one GPU."""
    return sum(
        n
        * (
            kv.page_bytes(layer, fmt, block_size, tp) * kv.layer_blocks(layer, context, block_size)
            + kv.layer_state_bytes(layer, tp)
        )
        for layer, n in kv.grouped(layers)
    )


def estimate(req: PlanRequest) -> Plan:
    spec, gpu = req.model, req.gpu
    max_len, fmt = _check_request(req)
    layout: Layout = make_layout(req.num_gpus, gpu.gpus_per_node, req.nodes, req.tp, req.pp)
    check_tp(spec, layout.tp, layout.pp)
    ex: list[Explain] = []
    assumptions: list[str] = []
    version = engines.parse_version(req.engine_version, req.engine)
    engine_name = f"{'vLLM' if req.engine == 'vllm' else 'SGLang'} {engines.fmt_version(version)}"
    null_blocks = NULL_BLOCKS[req.engine]
    if req.block_size is not None:
        bs = req.block_size
    elif req.engine == "sglang":
        bs = 1
        assumptions.append("SGLang page size 1 (its default; FlashMLA forces 64: pass --block-size 64)")
    else:
        bs, why = engines.vllm_default_block_size(spec, gpu)
        if bs != 16:
            assumptions.append(f"block size {bs}: {why} (override with --block-size)")
    tp, pp = layout.tp, layout.pp
    windowed = any(isinstance(layer, (SlidingWindow, ChunkedAttention)) for layer in spec.layers)
    if windowed and (
        (req.engine == "vllm" and req.disable_hybrid_kv_cache_manager)
        or (req.engine == "sglang" and not engines.sglang_hybrid_swa(spec, req.disable_hybrid_swa_memory))
    ):
        why = (
            "--disable-hybrid-kv-cache-manager"
            if req.engine == "vllm"
            else "--disable-hybrid-swa-memory"
            if req.disable_hybrid_swa_memory
            else f"SGLang has no windowed pool for {spec.architecture or 'this model'}"
        )
        assumptions.append(
            f"{engine_name} keeps every token in the sliding-window/chunked layers ({why}): "
            "they cost as much as full-attention layers here"
        )
        spec = engines.windows_as_full(spec)

    # --- KV bytes per token -------------------------------------------------------------
    all_layers = list(spec.layers)
    bits_all = kv.model_bits_per_token(all_layers, fmt)
    bits_growing = kv.model_bits_per_token(all_layers, fmt, growing_only=True)
    windowed_cap = kv.windowed_cap_bytes(all_layers, fmt)
    ex.append(
        Explain(
            "KV bytes per token",
            fmt_bytes(_num(bits_all)),
            "sum over layers: 2 x kv_heads x head_dim x bytes (MLA: kv_lora_rank + qk_rope_head_dim)",
            f"layer_types/layer_pattern of {spec.name}; dtype {fmt.describe()}; seed 000 15.2",
        )
    )
    request_exact = kv.sequence_bytes(all_layers, fmt, max_len)
    ex.append(
        Explain(
            "KV bytes per request",
            fmt_gib(request_exact),
            "max_model_len x bytes per token (windowed layers capped at their window)",
            f"max_model_len {max_len:,}; seed 000 15.3",
        )
    )

    # --- weights ------------------------------------------------------------------------
    params = param_breakdown(spec)
    w_name = normalize_dtype_name(req.weight_dtype) if req.weight_dtype else spec.weight_dtype
    w_fmt = weight_format(w_name)
    e_fmt = weight_format(req.weight_dtype or spec.expert_weight_dtype or w_name)
    weights = stage_weights(spec, params, w_fmt, e_fmt, tp, pp)
    if not params.total_stated:
        assumptions.append(
            f"parameter count {params.total / 1e9:,.2f}B estimated from the architecture (the spec states none)"
        )
    ex.append(
        Explain(
            "weights per GPU",
            fmt_gib(max(w.bytes_per_gpu for w in weights)),
            "params x bits/weight / 8, split by TP; PP stages hold their own layers",
            f"total_params {params.total:,}; weight dtype {w_fmt.describe()}"
            + (f", experts {e_fmt.describe()}" if params.routed_experts and e_fmt != w_fmt else ""),
        )
    )

    # --- budget per GPU -----------------------------------------------------------------
    util = None
    sg_mem = None
    if req.engine == "vllm":
        util = req.gpu_memory_utilization or engines.vllm_default_utilization(version)
        requested = requested_bytes(gpu.memory_bytes, util)
    else:
        sg_mem = engines.sglang_memory_settings(gpu.memory_bytes, tp, pp, req.mem_fraction_static)
    if req.reserve_bytes is not None:
        reserve = Reserve(req.reserve_bytes, 0, 0, 0, given=True)
    elif req.engine == "sglang":
        reserve = Reserve(0, 0, engines.sglang_startup_bytes(tp, pp), 0, given=False)
    else:
        act_bytes = 4 if spec.activation_dtype == "fp32" else 2
        graphs = engines.vllm_counts_cuda_graphs(version) and not req.enforce_eager
        reserve = estimate_reserve(
            spec, tp, pp, req.max_num_batched_tokens, act_bytes, cuda_graphs=graphs, version=version
        )
    if sg_mem is not None:
        # engines.md (SGLang): available = free_after_weights - free_at_start x (1 - mem_fraction_static)
        requested = math.floor((gpu.memory_bytes - reserve.total) * sg_mem.mem_fraction_static)
    vllm_layout = None
    engine_problem = None
    if fmt.name not in engines.ENGINE_KV_DTYPES or fmt.group_size:
        engine_problem = f"{engine_name} has no {fmt.name} KV cache; kvplan's figures are a what-if"
    elif req.engine == "vllm":
        try:
            vllm_layout = engines.vllm_layout(
                spec.layers,
                fmt,
                bs,
                tp,
                max_len,
                req.max_num_batched_tokens,
                hybrid=not req.disable_hybrid_kv_cache_manager,
            )
        except engines.EngineUnsupported as exc:
            engine_problem = str(exc)
    if req.num_gpu_blocks_override is not None and vllm_layout is None:
        raise UsageError(f"--num-gpu-blocks-override needs vLLM's block accounting: {engine_problem}")
    stages: list[StagePlan] = []
    stage_layer_lists = []
    engine_block_bytes = []
    for w, rng in zip(weights, stage_ranges(spec.num_layers, pp), strict=False):
        layers = stage_layers(spec, rng)
        stage_layer_lists.append(layers)
        if vllm_layout is not None:
            engine_block_bytes.append(vllm_layout.block_bytes(set(rng), list(spec.layers), fmt, tp))
        if req.kv_cache_memory_bytes is not None or req.num_gpu_blocks_override is not None:
            if req.kv_cache_memory_bytes is not None:
                budget = req.kv_cache_memory_bytes
                flag = f"--kv-cache-memory {fmt_gib(budget)}"
            else:
                budget = req.num_gpu_blocks_override * engine_block_bytes[-1]
                flag = f"--num-gpu-blocks-override {req.num_gpu_blocks_override:,} ({fmt_gib(budget)})"
            if w.bytes_per_gpu + budget > gpu.memory_bytes:
                raise InfeasibleError(
                    f"{flag} plus {fmt_gib(w.bytes_per_gpu)} of weights per GPU "
                    f"exceed {gpu.name}'s {fmt_gib(gpu.memory_bytes)}; ask for less KV cache "
                    "or use more GPUs"
                )
        else:
            usable = (
                f"{gpu.name} x {util:g}"
                if util is not None
                else f"{gpu.name} x mem-fraction-static {sg_mem.mem_fraction_static:g}"
            )
            if w.bytes_per_gpu >= requested:
                raise InfeasibleError(
                    f"weights need {fmt_gib(w.bytes_per_gpu)} per GPU (stage {w.stage}, TP {tp}, PP {pp}) "
                    f"but {usable} gives {fmt_gib(requested)}; "
                    "use more GPUs (-tp/-pp), a smaller --weight-dtype, or a larger GPU"
                )
            budget = requested - w.bytes_per_gpu - (reserve.total if req.engine == "vllm" else 0)
            if budget <= 0:
                raise InfeasibleError(
                    f"no memory left for the KV cache: {fmt_gib(requested)} usable - "
                    f"{fmt_gib(w.bytes_per_gpu)} weights - {fmt_gib(reserve.total)} reserve = "
                    f"{fmt_gib(budget)} per GPU; use more GPUs, a smaller --weight-dtype, "
                    "a higher --gpu-memory-utilization or a smaller --max-num-batched-tokens"
                )
        bits_rank = kv.model_bits_per_token(layers, fmt, tp)
        block_bytes = sum(n * kv.page_bytes(layer, fmt, bs, tp) for layer, n in kv.grouped(layers))
        num_blocks = budget // block_bytes if block_bytes else None
        stages.append(
            StagePlan(
                w.stage, rng.start, len(rng), w.bytes_per_gpu, budget, bits_rank, block_bytes, num_blocks
            )
        )

    if req.kv_cache_memory_bytes is not None:
        budget_source = "--kv-cache-memory"
        assumptions.append(
            f"KV cache memory per GPU given as {fmt_gib(req.kv_cache_memory_bytes)} (replaces utilization, weights and reserve)"
        )
    elif req.num_gpu_blocks_override is not None:
        budget_source = "--num-gpu-blocks-override"
        assumptions.append(
            f"{req.num_gpu_blocks_override:,} KV blocks per GPU given (replaces utilization, weights and reserve)"
        )
    else:
        budget_source = "computed"
        if reserve.given:
            what = "memory in use at startup" if req.engine == "sglang" else "activation/workspace reserve"
            assumptions.append(
                f"{what} per GPU given as {fmt_gib(reserve.total)}"
                + (f" ({req.reserve_source})" if req.reserve_source else "")
            )
        elif req.engine == "sglang":
            assumptions.append(
                f"memory in use when SGLang starts (CUDA context{', NCCL' if tp * pp > 1 else ''}) estimated at "
                f"{fmt_gib(reserve.total)} per GPU; override with --reserve-memory or calibrate with check-log"
            )
        else:
            assumptions.append(
                f"activation/workspace reserve per GPU estimated at {fmt_gib(reserve.total)} "
                f"(activations for {req.max_num_batched_tokens:,} batched tokens, sampler, NCCL/cuBLAS"
                + (", CUDA graphs" if reserve.cuda_graph_bytes else "")
                + "); override with --reserve-memory or calibrate with check-log"
            )
        if sg_mem is not None and not sg_mem.given:
            assumptions.append(
                f"--mem-fraction-static {sg_mem.mem_fraction_static:g}: SGLang's default for "
                f"{gpu.memory_bytes / GiB:,.1f} GiB and TP {tp} x PP {pp} (reserves {sg_mem.reserved_mib:,.0f} MiB)"
            )
        if util is not None and req.gpu_memory_utilization is None:
            assumptions.append(f"--gpu-memory-utilization {util:g}: {engine_name}'s default")
        assumptions.append(
            f"{gpu.name} memory {fmt_gib(gpu.memory_bytes)} as the CUDA runtime reports it "
            f"(datasheet {gpu.memory_marketing})"
        )

    # --- blocks and concurrency (the binding stage decides) ------------------------------
    block_counts = [s.num_blocks for s in stages if s.num_blocks is not None]
    num_blocks = min(block_counts) if block_counts else None

    def usable_bytes(s: StagePlan, reserved_blocks: int) -> int:
        if num_blocks is None or not s.block_bytes_per_gpu:
            return s.kv_budget_bytes_per_gpu
        return max(num_blocks - reserved_blocks, 0) * s.block_bytes_per_gpu

    def factor(context: int, reserved_blocks: int = 0, shared: dict | None = None) -> tuple[float, int]:
        """(requests that fit at `context`, index of the binding stage)."""
        best, best_i = math.inf, 0
        for i, (s, layers) in enumerate(zip(stages, stage_layer_lists, strict=False)):
            per_req = _request_bytes(layers, fmt, context, bs, tp)
            pool = usable_bytes(s, reserved_blocks)
            if shared is not None:
                pool -= shared["once"][i]
                per_req -= shared["per_request"][i]
            f = pool / per_req if per_req > 0 else math.inf
            if f < best:
                best, best_i = f, i
        return best, best_i

    conc_factor, bind = factor(max_len)
    usable_factor, _ = factor(max_len, null_blocks)
    binding = stages[bind]
    per_req_gpu = _request_bytes(stage_layer_lists[bind], fmt, max_len, bs, tp)
    if usable_factor < 1:
        fit = _largest_fitting_len(
            stage_layer_lists[bind], fmt, bs, tp, usable_bytes(binding, null_blocks), max_len
        )
        hint = f"; the largest --max-model-len that fits is {fit:,}" if fit else ""
        avail = usable_bytes(binding, null_blocks)
        digits = 2 if abs(per_req_gpu - avail) > 0.01 * GiB else 4
        raise InfeasibleError(
            f"one request at --max-model-len {max_len:,} needs {fmt_gib(per_req_gpu, digits)} of KV cache "
            f"per GPU, but only {fmt_gib(avail, digits)} is usable (whole blocks, one kept as the null "
            f"block){hint}; or add GPUs, or use a smaller --kv-cache-dtype"
        )
    kv_limit = math.floor(usable_factor)
    max_conc = kv_limit if req.max_num_seqs is None else min(kv_limit, req.max_num_seqs)
    limited_by = (
        "max_num_seqs" if req.max_num_seqs is not None and req.max_num_seqs < kv_limit else "kv_cache"
    )
    pool_tokens = num_blocks * bs if num_blocks is not None else 0
    ex.append(
        Explain(
            "KV budget per GPU",
            fmt_gib(binding.kv_budget_bytes_per_gpu),
            f"given by {budget_source}"
            if budget_source != "computed"
            else "ceil(memory x gpu_memory_utilization) - weights - reserve"
            if req.engine == "vllm"
            else "(memory - in use at startup) x mem_fraction_static - weights",
            f"{gpu.name} memory_bytes {gpu.memory_bytes:,}; "
            + (
                f"utilization {util:g}; engines.md (vLLM)"
                if util is not None
                else f"mem_fraction_static {sg_mem.mem_fraction_static:g}; engines.md (SGLang)"
            ),
        )
    )
    ex.append(
        Explain(
            "blocks per GPU",
            f"{num_blocks:,}" if num_blocks is not None else "n/a",
            "floor(KV budget / (block_size x KV bytes per token per GPU)); min over PP stages",
            f"block_size {bs}; KV heads per rank max(1, h_kv // {tp}); MLA latent replicated; engines.md",
        )
    )
    ex.append(
        Explain(
            "KV pool tokens",
            f"{pool_tokens:,}",
            "blocks x block_size",
            "engines.md (vLLM: GPU KV cache size)",
        )
    )
    ex.append(
        Explain(
            "max concurrency",
            f"{max_conc:,} per replica x {layout.dp} replica(s)",
            "floor((blocks - 1 null block) / blocks one request needs at max_model_len)",
            f"ceil({max_len:,} / {bs}) blocks per full-attention layer; seed 000 15.8",
        )
    )

    avg = None
    if req.avg_context_tokens is not None:
        a = req.avg_context_tokens
        f_avg, _ = factor(a, null_blocks)
        per_req_avg = _request_bytes(stage_layer_lists[bind], fmt, a, bs, tp)
        avg = {
            "avg_context_tokens": a,
            "kv_bytes_per_request_per_gpu": per_req_avg,
            "max_concurrency_per_replica": math.floor(f_avg),
            "max_concurrency": math.floor(f_avg) * layout.dp,
        }

    prefix = None
    if req.shared_prefix_tokens:
        prefix = _prefix(
            req,
            stages,
            stage_layer_lists,
            fmt,
            bs,
            tp,
            factor,
            layout.dp,
            usable_factor,
            max_len,
            null_blocks,
        )
        assumptions.append(
            f"prefix caching: {req.shared_prefix_tokens:,}-token shared prefix hit by "
            f"{req.prefix_hit_rate:.0%} of requests; only full blocks are shared and stored once"
        )

    frag = _fragmentation(
        req, stage_layer_lists[bind], binding, fmt, bs, tp, max_len, usable_bytes(binding, null_blocks)
    )

    report = _engine_report(
        req,
        version,
        engine_problem,
        vllm_layout,
        engine_block_bytes,
        sg_mem,
        stages,
        stage_layer_lists,
        fmt,
        bs,
        tp,
        max_len,
    )
    report = _with_differences(
        report, req, vllm_layout, math.floor(usable_factor), conc_factor, bs, null_blocks
    )

    decode, prefill = _speed(
        req, spec, gpu, weights, params, w_fmt, tp, pp, max_len, max_conc, per_req_gpu, avg
    )
    assumptions.append(
        f"decode speed at {decode['bandwidth_source']}; prefill at {prefill['mfu']:.0%} of "
        f"{prefill['peak_dtype']} peak; both estimates"
    )

    cluster = {
        "num_gpus": layout.num_gpus,
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "data_parallel_size": layout.dp,
    }
    settings = {
        "max_model_len": max_len,
        "kv_cache_dtype": fmt.name,
        "kv_cache_format": fmt.describe(),
        "kv_bits_per_value": float(fmt.bits_per_value),
        "block_size": bs,
        "engine": req.engine,
        "engine_version": engines.fmt_version(version),
        "gpu_memory_utilization": util,
        "mem_fraction_static": sg_mem.mem_fraction_static if sg_mem else None,
        "max_num_batched_tokens": req.max_num_batched_tokens,
        "max_num_seqs": req.max_num_seqs,
        "enable_prefix_caching": req.enable_prefix_caching,
        "weight_dtype": w_fmt.name,
        "expert_weight_dtype": e_fmt.name if params.routed_experts else None,
    }
    return Plan(
        schema=SCHEMA,
        model={
            "name": spec.name,
            "hf_id": spec.hf_id,
            "attention": spec.attention_summary,
            "num_layers": spec.num_layers,
            "max_context": spec.max_context,
        },
        gpu={
            "name": gpu.name,
            "memory_bytes": gpu.memory_bytes,
            "hbm_bytes_per_s": gpu.hbm_bytes_per_s,
        },
        cluster=cluster,
        settings=settings,
        kv_bytes_per_token=_num(bits_all),
        kv_bytes_per_token_per_gpu=_num(binding.kv_bits_per_token_per_gpu),
        kv_bytes_per_token_growing=_num(bits_growing),
        kv_bytes_per_sequence_windowed_cap=windowed_cap,
        kv_bytes_per_request=request_exact,
        kv_bytes_per_request_per_gpu=per_req_gpu,
        params_total=params.total,
        params_active=params.active,
        params_stated=params.total_stated,
        memory_bytes_per_gpu=gpu.memory_bytes,
        requested_bytes_per_gpu=requested,
        weight_bytes_per_gpu=max(s.weight_bytes_per_gpu for s in stages),
        reserve_bytes_per_gpu=reserve.total if budget_source == "computed" else 0,
        reserve={
            "activation_bytes": reserve.activation_bytes,
            "sampler_bytes": reserve.sampler_bytes,
            "non_torch_bytes": reserve.non_torch_bytes,
            "cuda_graph_bytes": reserve.cuda_graph_bytes,
            "estimated": not reserve.given,
            "used": budget_source == "computed",
        },
        kv_budget_bytes_per_gpu=binding.kv_budget_bytes_per_gpu,
        kv_budget_source=budget_source,
        block_bytes_per_gpu=binding.block_bytes_per_gpu,
        num_blocks_per_gpu=num_blocks,
        kv_pool_tokens=pool_tokens,
        kv_pool_tokens_cluster=pool_tokens * layout.dp,
        blocks_per_request=max(kv.layer_blocks(layer, max_len, bs) for layer, _ in kv.grouped(all_layers)),
        concurrency_factor=conc_factor,
        max_concurrency_per_replica=max_conc,
        max_concurrency=max_conc * layout.dp,
        limited_by=limited_by,
        avg_context=avg,
        prefix_caching=prefix,
        fragmentation=frag,
        stages=stages,
        assumptions=assumptions,
        engine_kv_cache_tokens=report.kv_cache_tokens,
        engine_num_blocks=report.num_blocks,
        engine_max_concurrency=report.max_concurrency,
        engine=asdict(report),
        decode=decode,
        prefill=prefill,
        explain=ex,
    )


def _attention_width(spec: ModelSpec) -> int:
    for layer in spec.layers:
        if isinstance(layer, LatentAttention):
            return spec.num_attention_heads * ((layer.qk_nope_head_dim or 128) + layer.qk_rope_head_dim)
        if isinstance(layer, HeadLayer):
            return spec.num_attention_heads * layer.head_dim
    return spec.hidden_size


def _speed(req, spec, gpu, weights, params, w_fmt, tp, pp, max_len, max_conc, per_req_gpu, avg):
    """Decode step time at batch 1 and at the planned concurrency; prefill of one max-length prompt."""
    slow = max(weights, key=lambda w: w.bytes_per_gpu)
    if req.decode_bandwidth_bytes_per_s:
        bandwidth = req.decode_bandwidth_bytes_per_s
        source = req.decode_bandwidth_source or "a measured bandwidth"
    else:
        bandwidth = gpu.hbm_bytes_per_s * speed.DEFAULT_EFFICIENCY
        source = (
            f"datasheet bandwidth {gpu.hbm_bytes_per_s / 1e12:.2f} TB/s x {speed.DEFAULT_EFFICIENCY:.2f} "
            "assumed efficiency (not measured)"
        )
    moe = spec.moe
    inp = speed.DecodeInputs(
        weight_bytes=slow.bytes_per_gpu,
        expert_bytes=slow.expert_bytes_per_gpu,
        embedding_bytes=slow.embedding_bytes_per_gpu,
        num_experts=moe.num_experts if moe else 0,
        experts_per_token=moe.experts_per_token if moe else 0,
        layers_per_stage=len(slow.layers),
        hidden_size=spec.hidden_size,
        tp=tp,
        pp=pp,
        bandwidth_bytes_per_s=bandwidth,
        link_bytes_per_s=gpu.interconnect.bytes_per_s if gpu.interconnect else gpu.pcie_bytes_per_s,
        bandwidth_half_bytes=req.decode_bandwidth_half_bytes if req.decode_bandwidth_bytes_per_s else 0.0,
    )
    one = speed.decode_step(inp, 1, per_req_gpu)
    full = speed.decode_step(inp, max_conc, per_req_gpu) if max_conc else None
    at_avg = None
    if avg is not None and avg["max_concurrency_per_replica"]:
        at_avg = speed.decode_step(
            inp, avg["max_concurrency_per_replica"], avg["kv_bytes_per_request_per_gpu"]
        ).to_dict()
    decode = {
        "bandwidth_bytes_per_s": bandwidth,
        "bandwidth_source": source,
        "measured": req.decode_bandwidth_bytes_per_s is not None,
        "inputs": asdict(inp),
        "batch_1": one.to_dict(),
        "at_max_concurrency": full.to_dict() if full else None,
        "at_avg_context": at_avg,
    }
    fp8 = w_fmt.name in ("fp8",) and gpu.fp8_dense_flops
    peak = gpu.fp8_dense_flops if fp8 else gpu.bf16_dense_flops
    seconds = speed.prefill_seconds(params.active, max_len, spec.num_layers, _attention_width(spec), tp, peak)
    prefill = {
        "tokens": max_len,
        "ms": seconds * 1e3,
        "mfu": speed.PREFILL_MFU,
        "peak_dtype": "fp8" if fp8 else "bf16",
        "peak_flops_per_gpu": peak,
    }
    return decode, prefill


def _engine_report(
    req,
    version,
    problem,
    vllm_layout,
    engine_block_bytes,
    sg_mem,
    stages,
    stage_layer_lists,
    fmt,
    bs,
    tp,
    max_len,
) -> engines.EngineReport:
    if problem is not None:
        return engines.unsupported(req.engine, version, problem)
    budgets = [s.kv_budget_bytes_per_gpu for s in stages]
    if req.engine == "vllm":
        return engines.vllm_report(
            vllm_layout, budgets, engine_block_bytes, max_len, version, req.num_gpu_blocks_override
        )
    try:
        return engines.sglang_report(
            stage_layer_lists,
            fmt,
            tp,
            bs,
            budgets,
            max_len,
            version,
            engines.sglang_hybrid_swa(req.model, req.disable_hybrid_swa_memory),
            req.swa_full_tokens_ratio,
            sg_mem,
        )
    except engines.EngineUnsupported as exc:
        return engines.unsupported(req.engine, version, str(exc))


def _with_differences(
    report: engines.EngineReport, req, layout, kvplan_conc: int, conc_factor: float, bs: int, null_blocks: int
) -> engines.EngineReport:
    """Say why the engine's concurrency differs from kvplan's, when it does."""
    if not report.supported or report.max_concurrency is None:
        return report
    notes = []
    if req.engine == "vllm" and layout is not None:
        if layout.blocks_per_request != layout.held_blocks_per_request:
            notes.append(
                f"vLLM charges a request {layout.blocks_per_request:,} blocks at admission (a sliding-window "
                f"or chunked layer is charged window + --max-num-batched-tokens {req.max_num_batched_tokens:,} "
                f"tokens); at full length it holds {layout.held_blocks_per_request:,}, which is what kvplan counts"
            )
        if layout.padding_layers:
            notes.append(f"vLLM adds {layout.padding_layers} padding layers to equalise its KV-cache groups")
        same_charge = layout.blocks_per_request == layout.held_blocks_per_request
        if same_charge and math.floor(report.max_concurrency) != kvplan_conc and null_blocks:
            notes.append("vLLM's printed concurrency does not subtract the null block; kvplan's does")
    elif req.engine == "sglang":
        d = report.details
        if d.get("hybrid_swa"):
            notes.append(
                f"SGLang splits its pool into full-attention and sliding-window pools "
                f"(--swa-full-tokens-ratio {d['swa_full_tokens_ratio']:g}); kvplan pools all layers together"
            )
        notes.append("SGLang prints no concurrency; kvplan's figure is its pool tokens / max-model-len")
    return engines.EngineReport(**{**asdict(report), "differences": notes})


def _largest_fitting_len(layers: list, fmt: Format, bs: int, tp: int, pool: int, upper: int) -> int:
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _request_bytes(layers, fmt, mid, bs, tp) <= pool:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _prefix(
    req, stages, stage_layer_lists, fmt, bs, tp, factor, dp, base_factor, max_len, null_blocks
) -> dict:
    """Shared prefix (seed 000 15.6, engines.md): only full blocks are shared, stored once."""
    shared_blocks = req.shared_prefix_tokens // bs
    if shared_blocks * bs >= max_len:  # a hit never covers the request's last token
        shared_blocks = (max_len - 1) // bs
    once, per_request = [], []
    for layers in stage_layer_lists:
        b = sum(
            n * kv.page_bytes(layer, fmt, bs, tp) * shared_blocks
            for layer, n in kv.grouped(layers)
            if kv.is_growing(layer)
        )
        once.append(b)
        per_request.append(req.prefix_hit_rate * b)
    f, bind = factor(max_len, null_blocks, {"once": once, "per_request": per_request})
    with_prefix = math.floor(f)
    if req.max_num_seqs is not None:
        with_prefix = min(with_prefix, req.max_num_seqs)
    saved = max(with_prefix * per_request[bind] - once[bind], 0)
    return {
        "shared_prefix_tokens": req.shared_prefix_tokens,
        "prefix_hit_rate": req.prefix_hit_rate,
        "shared_blocks": shared_blocks,
        "shared_tokens_cached": shared_blocks * bs,
        "shared_bytes_per_gpu": once[bind],
        "max_concurrency_per_replica": with_prefix,
        "max_concurrency": with_prefix * dp,
        "gain": with_prefix / math.floor(base_factor) if base_factor >= 1 else None,
        "memory_saved_bytes_per_gpu": int(saved),
        "prefill_tokens_saved_per_request": req.prefix_hit_rate * shared_blocks * bs,
    }


def _fragmentation(req, layers, stage: StagePlan, fmt, bs, tp, max_len, usable) -> dict:
    """Seed 000 15.4: preallocating max_model_len per request vs paged blocks."""
    context = req.avg_context_tokens or max_len
    exact_rank = kv.sequence_bytes(layers, fmt, context, tp)
    exact_max = kv.sequence_bytes(layers, fmt, max_len, tp)
    paged = _request_bytes(layers, fmt, context, bs, tp)
    budget = stage.kv_budget_bytes_per_gpu
    return {
        "context_tokens": context,
        "prealloc_max_concurrency_per_replica": budget // exact_max if exact_max else None,
        "prealloc_waste_bytes_per_request_per_gpu": exact_max - exact_rank,
        "prealloc_utilization": exact_rank / exact_max if exact_max else 1.0,
        "paged_max_concurrency_per_replica": usable // paged if paged else None,
        "paged_waste_bytes_per_request_per_gpu": paged - exact_rank,
        "paged_utilization": exact_rank / paged if paged else 1.0,
    }
