"""`kvplan solve`: the inverse questions. How many GPUs (and which layout, KV dtype) serve N users
at a context with a TPOT target; or, on given GPUs, the longest context N users can have.

The search covers the layouts an operator rents and the engines run: whole nodes (unless
--partial-nodes, or --max-gpus below a node), tensor parallelism inside a node at the TP sizes the
engines accept (powers of two that divide the node and the attention/KV heads), replicas of that
TP filling the nodes, and pipeline stages only when the weights plus one request at
--max-model-len do not fit one node at the largest TP: then one stage per node at that TP, the
hops over the network (--network). A replica (TP x PP GPUs) is planned once per (GPU, TP, PP,
KV dtype); data-parallel replicas then scale its capacity and shrink its batch analytically, so
the search stays fast. Block sizes other than the engine's default are dominated (larger blocks
only add rounding, and never speed up a step), so they are not searched unless asked for.

For a model with routed experts the search also tries expert parallelism with data-parallel
attention over a unit of whole nodes (vLLM `--enable-expert-parallel --data-parallel-size`,
SGLang `--enable-dp-attention --dp-size` with `--ep-size`): each attention-DP rank holds only its
own requests' KV, which multiplies the users a node holds whenever TP replicates the KV (MLA's
latent KV, GQA with fewer KV heads than TP); the step pays an all-to-all per MoE layer where the
engine runs one. Units of such a layout are replicated as separate deployments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kvplan import engines
from kvplan.engines.sglang import Sglang
from kvplan.engines.sglang import memory_settings as sglang_memory_settings
from kvplan.engines.vllm import BLOCK_SIZES as VLLM_BLOCK_SIZES
from kvplan.engines.vllm import default_utilization as vllm_default_utilization
from kvplan.errors import (
    ContextTooLong,
    InfeasibleError,
    KvplanError,
    RequestDoesNotFit,
    UsageError,
    WeightsDoNotFit,
)
from kvplan.model.parallel import Network, valid_tps
from kvplan.plan.plan import Plan, PlanRequest, estimate
from kvplan.request import SGLANG_ALGORITHM, Speculative, min_model_len
from kvplan.specs.models import GpuSpec, ModelSpec
from kvplan.speed import plan_speed, step_model
from kvplan.units import ceil_div, plural

SCHEMA = "kvplan.solve/1"
# KV dtypes the engines serve, best quality first (int8/int4 are kvplan what-ifs, not engine options)
ENGINE_DTYPES = ("auto", "fp8")
MAX_PP = 16
MAX_EP_NODES = 4  # expert-parallel units of up to 4 nodes (EP 32 on 8-GPU nodes)


@dataclass(frozen=True)
class Parallel:
    """How a unit's GPUs split an MoE model beyond TP x PP: `dp` attention-DP ranks, each with its own
    requests and KV pool (vLLM: engine cores of TP GPUs; SGLang: ranks inside its TP group), and the
    routed experts spread over `ep` GPUs (1: each expert sliced by TP)."""

    dp: int = 1
    ep: int = 1

    @property
    def on(self) -> bool:
        return self.dp > 1 or self.ep > 1


PLAIN = Parallel()


@dataclass(frozen=True)
class Margins:
    """How far an answer clears the targets, as fractions: users (its concurrency over --users,
    minus 1) and TPOT (1 - its step time over --tpot-ms; None without a TPOT target)."""

    users: float
    tpot: float | None


@dataclass
class Answer:
    gpu: str
    num_gpus: int  # GPUs rented: whole nodes unless --partial-nodes
    nodes: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    kv_cache_dtype: str
    block_size: int
    max_model_len: int
    max_concurrency: int
    tpot_ms: float  # at the target load: users spread over the replicas, each at tpot_context_tokens
    tpot_source: str  # where the step model's terms come from (fitted to published runs / measured)
    tpot_context_tokens: int  # the context each request holds in that step
    tpot_context_source: str  # max_model_len, or the mean over a decode (as estimate's)
    decode_step: step_model.StepTime  # the step at that load, term by term
    why_pipeline: str | None  # with PP > 1: why the layout has pipeline stages
    cost_per_hour: float | None
    margins: Margins
    vllm_flags: str | None  # None: an expert-parallel layout searched for the other engine
    sglang_flags: str | None
    sglang_max_concurrency: int | None
    plan: Plan = field(repr=False)
    # expert parallelism with DP attention (1, 1 and None without): GPUs the routed experts are spread
    # over, attention-DP ranks with their own KV inside one deployment, and why the search picked it
    expert_parallel_size: int = 1
    attention_dp_size: int = 1
    why_expert_parallel: str | None = None
    sglang_refused: str | None = None  # why the layout has no SGLang launch line (SGLang does not serve it)
    # under speculative decoding: the step at the answer's load (tpot_ms is its per-token figure)
    speculative: plan_speed.SpecStep | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("plan")
        d["decode_step"] = self.decode_step.to_dict()  # in ms, with memory_ms
        d["speculative"] = self.speculative.to_dict() if self.speculative else None
        held = self.plan.decode.held_out  # the step model's held-out accuracy in this answer's bucket
        d["held_out"] = held.to_dict() if held is not None else None
        return d


@dataclass(frozen=True)
class Query:
    model: ModelSpec
    gpus: tuple[GpuSpec, ...]
    users: int
    max_model_len: int | None  # None in --max-context mode
    tpot_ms: float | None = None
    kv_dtypes: tuple[str, ...] = ENGINE_DTYPES
    max_gpus: int = 64
    prices: dict[str, float] | None = None  # per GPU-hour, by GPU name
    engine: str = "vllm"
    block_size: int | None = None
    gpu_memory_utilization: float | None = None
    fixed_num_gpus: int | None = None  # --max-context mode: exactly these GPUs
    top: int = 5
    # per GPU name, the PlanRequest fields of its saved `kvplan calibrate` profile (the step model's
    # measured terms); a GPU without one keeps the terms fitted to published runs
    measured: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    # the workload, as estimate takes it: TPOT at the mean context of a decode instead of max_model_len
    avg_context_tokens: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    partial_nodes: bool = False  # answers may use part of a node; else whole nodes
    whole_nodes: bool = False  # whole nodes even where --max-gpus is below one (a disaggregated pool's share)
    network: Network | None = None  # the inter-node fabric per GPU; None: the default (400G)
    moe_imbalance: float = 1.0  # the busiest EP rank's expert work / the mean, for expert-parallel layouts
    speculative: Speculative | None = None  # speculative decoding: TPOT is the verify step / acceptance

    @property
    def has_workload(self) -> bool:
        return self.avg_context_tokens is not None or self.input_len is not None


_PLANS: dict[tuple, Plan | InfeasibleError] = {}  # one solve's replicas, planned once each


def _replica(
    q: Query, gpu: GpuSpec, tp: int, pp: int, dtype: str, max_len: int, par: Parallel = PLAIN,
    cap: int | None = None,
) -> Plan:  # fmt: skip
    """One replica's plan; `cap`: the running-request cap its launch line sets (vLLM --max-num-seqs, SGLang
    --max-running-requests), which also sizes vLLM's sampler profiling run (None: the engine's default)."""
    key = (id(q), gpu.name, tp, pp, dtype, max_len, par, cap)
    if key not in _PLANS:
        try:
            req = _request(q, gpu, tp, pp, dtype, max_len, par)
            if cap is not None and q.engine == "sglang":
                req = dataclasses.replace(req, max_running_requests=cap)
            elif cap is not None:
                req = dataclasses.replace(req, max_num_seqs=cap)
                if cap > vllm_default_budget(gpu):  # as the launch line names it (_flags)
                    req = dataclasses.replace(req, max_num_batched_tokens=cap)
            _PLANS[key] = estimate(req)
        except InfeasibleError as exc:
            _PLANS[key] = exc
    got = _PLANS[key]
    if isinstance(got, InfeasibleError):
        raise got
    return got


def engine_tps(q: Query, gpu: GpuSpec) -> list[int]:
    """TP sizes inside one node: powers of two that divide the node's GPUs and that vLLM accepts for the
    model's heads (parallel.valid_tps: TP divides the attention heads; KV heads split or replicate)."""
    gpn = gpu.gpus_per_node
    return [t for t in valid_tps(q.model, gpn) if t & (t - 1) == 0 and gpn % t == 0]


def partial_nodes(q: Query, gpu: GpuSpec) -> bool:
    """Whether an answer may use part of a node: asked for, or --max-gpus is below a node."""
    return q.partial_nodes or (q.max_gpus < gpu.gpus_per_node and not q.whole_nodes)


def rented(q: Query, gpu: GpuSpec, replica: int, dp: int) -> tuple[int, int, int]:
    """(DP, GPUs, nodes) once `dp` replicas of `replica` GPUs are placed on whole nodes: the nodes they
    need, filled with as many replicas as fit. With partial nodes allowed, less than one node stays
    as it is (e.g. 2 of a node's 8 GPUs)."""
    gpn = gpu.gpus_per_node
    n = replica * dp
    if n < gpn and partial_nodes(q, gpu):
        return dp, n, 1
    nodes = ceil_div(n, gpn)
    return max(dp, nodes * gpn // replica), nodes * gpn, nodes


def _max_dp(q: Query, gpu: GpuSpec, replica: int) -> int:
    """The most replicas within --max-gpus, placed as `rented` places them."""
    gpn = gpu.gpus_per_node
    whole = (q.max_gpus // gpn) * gpn // replica
    if partial_nodes(q, gpu):
        return max(whole, min(q.max_gpus, gpn - 1) // replica)
    return whole


def layouts(q: Query, gpu: GpuSpec, dtype: str) -> list[tuple[int, int]]:
    """(TP, PP) pairs to search: TP inside a node; PP only when one node at the largest TP cannot hold
    the weights and one request at the context, then one stage per node at that TP."""
    tps = engine_tps(q, gpu)
    if not tps:
        return []
    top = max(tps)
    length = q.max_model_len or min_model_len(q.engine)  # --max-context: whether the weights fit at all
    try:
        fits = _replica(q, gpu, top, 1, dtype, length).max_concurrency_per_replica >= 1
    except InfeasibleError:
        fits = False
    if fits:
        return [(tp, 1) for tp in tps]
    return [(top, pp) for pp in range(2, min(MAX_PP, q.model.num_layers) + 1)]


def unit_gpus(q: Query, tp: int, pp: int, par: Parallel = PLAIN) -> int:
    """GPUs of one unit: TP x PP, times vLLM's DP engine cores (SGLang's attention-DP ranks sit inside
    its TP group)."""
    return tp * pp * (par.dp if q.engine == "vllm" else 1)


def _parallel_fields(q: Query, par: Parallel) -> dict[str, Any]:
    if not par.on:
        return {}
    # a layout of fewer EP ranks than the factor: its busiest rank carries at most all the work, ep x the mean
    imbalance = {"moe_imbalance": min(q.moe_imbalance, float(par.ep))} if par.ep > 1 else {}
    if q.engine == "vllm":
        return {"data_parallel_size": par.dp, "enable_expert_parallel": par.ep > 1, **imbalance}
    return {"data_parallel_size": par.dp, "enable_dp_attention": par.dp > 1, "ep_size": par.ep, **imbalance}


def _request(
    q: Query, gpu: GpuSpec, tp: int, pp: int, dtype: str, max_len: int, par: Parallel = PLAIN
) -> PlanRequest:
    return PlanRequest(
        remedies=(),  # solve takes neither --weight-dtype nor --cpu-offload-gb
        model=q.model,
        gpu=gpu,
        tp=tp,
        pp=pp,
        max_model_len=max_len,
        kv_cache_dtype=dtype,
        block_size=q.block_size,
        engine=q.engine,
        gpu_memory_utilization=q.gpu_memory_utilization,
        **dict(dict(q.measured).get(gpu.name, ())),
        avg_context_tokens=min(q.avg_context_tokens, max_len) if q.avg_context_tokens else None,
        input_len=q.input_len,
        output_len=q.output_len,
        network=q.network,
        speculative=q.speculative,
        speculative_running_default=False,  # the launch lines give --max-running-requests
        **_parallel_fields(q, par),
    )


def ep_layouts(q: Query, gpu: GpuSpec, dtype: str) -> list[tuple[int, Parallel]]:
    """(TP, Parallel) of the expert-parallel layouts to search for a model with routed experts: a unit
    of the fewest whole nodes that holds the weights and one request at the context, the experts over
    all its GPUs, attention over TP t with unit / t DP ranks, for each TP size t the engines accept
    below the unit (SGLang: --tp-size is the unit, --dp-size unit / t, the experts TP-sliced)."""
    experts = q.model.moe.num_experts if q.model.moe is not None else 0
    tps = engine_tps(q, gpu)
    if experts < 2 or not tps or q.engine not in ("vllm", "sglang"):
        return []
    gpn = gpu.gpus_per_node
    length = q.max_model_len or min_model_len(q.engine)
    for nodes in range(1, MAX_EP_NODES + 1):
        unit = nodes * gpn
        if unit > (q.fixed_num_gpus or q.max_gpus) or unit > experts:
            return []
        shapes = _ep_shapes(q, tps, unit, experts)
        if not shapes:
            return []
        tp, par = shapes[0]
        try:
            fits = _replica(q, gpu, tp, 1, dtype, length, par).max_concurrency >= 1
        except InfeasibleError:
            fits = False
        except UsageError:
            return []
        if fits:
            return shapes
    return []


def shapes(q: Query, gpu: GpuSpec, dtype: str) -> list[tuple[int, int, Parallel]]:
    """(TP, PP, Parallel) of every layout to search: plain TP x PP, then an MoE model's expert-parallel
    units (ep_layouts)."""
    return [(tp, pp, PLAIN) for tp, pp in layouts(q, gpu, dtype)] + [
        (tp, 1, par) for tp, par in ep_layouts(q, gpu, dtype)
    ]


def _ep_shapes(q: Query, tps: list[int], unit: int, experts: int) -> list[tuple[int, Parallel]]:
    out: list[tuple[int, Parallel]] = []
    for t in sorted(tps):
        if t >= unit or unit % t:
            continue
        if q.engine == "vllm":
            out.append((t, Parallel(dp=unit // t, ep=unit)))
        else:
            # SGLang's DeepSeek recipe (--tp N --dp N --enable-dp-attention) keeps the experts TP-sliced;
            # --ep-size without an all-to-all backend holds the same bytes and runs the same step here
            out.append((unit, Parallel(dp=unit // t, ep=1)))
    return out


def _batch(q: Query, par: Parallel, users: int) -> int:
    """The batch the step model takes for `users` requests on one unit: vLLM's step is one DP engine
    core's (its requests; the MoE group sees all cores'), SGLang's the TP group's (split over its
    attention-DP ranks inside the step)."""
    return ceil_div(users, par.dp) if q.engine == "vllm" else users


def _held(q: Query, p: Plan) -> tuple[float, int]:
    """(KV bytes a request holds per GPU, its context) in the step: the mean context of its decode when
    the query gives the workload (as estimate's decode figures), else max_model_len."""
    if q.has_workload:
        return p.decode.kv_bytes_per_request_per_gpu, p.decode.context_tokens
    return p.kv_bytes_per_request_per_gpu, p.settings.max_model_len


def _step(q: Query, p: Plan, batch: int) -> step_model.StepTime:
    """The step model at `batch` requests of one replica (_held's context)."""
    return p.decode.step(batch, *_held(q, p))


def _tpot(q: Query, p: Plan, batch: int) -> float:
    """Time per output token at `batch`: the decode step, or under speculative decoding the verify step
    plus the draft passes over the tokens accepted (estimate's figure)."""
    spec = _spec(q, p, batch)
    return spec.tpot_ms if spec is not None else _step(q, p, batch).tpot_ms


def _spec(q: Query, p: Plan, batch: int) -> plan_speed.SpecStep | None:
    if q.speculative is None:
        return None
    d = p.decode
    return plan_speed.spec_step(d.inputs, q.speculative, batch, *_held(q, p), d.parts)


def _dtype_name(dtype: str, p: Plan) -> str:
    return "auto" if dtype == "auto" else p.settings.kv_cache_dtype


SGLANG_KV_DTYPE = {"auto": "auto", "fp8": "fp8_e4m3"}  # vLLM's fp8 is e4m3 (SGLang names it so)


def launch_line(
    engine: str, model: str, tp: int, pp: int, deployments: int, par: Parallel, max_len: int, extra: list[str],
    cap: int, moe: bool = False, suffix: tuple[str, ...] = (),
) -> str:  # fmt: skip
    """One deployment's command for `engine` (its flag names, engines/*.py launch_flags). Plain TP x PP:
    `deployments` replicas behind the engine's own DP (--data-parallel-size / --dp-size), `cap` the
    requests each takes. An expert-parallel unit (par.on) is one deployment of its own (run `deployments`
    of them); vLLM: --data-parallel-size DP engine cores with --enable-expert-parallel, --max-num-seqs
    each core's share of `cap`; SGLang: --enable-dp-attention --dp-size ranks inside --tp-size,
    --max-running-requests the server's total (each rank takes max_running_requests // dp_size,
    model_executor/cuda_graph_runner.py 0.5.x), rounded up to a multiple of the ranks."""
    cls = engines.engine_class(engine)
    tp_f, pp_f, dp_f, ctx_f, cap_f = cls.launch_flags
    parts = [cls.launch_command.format(model=model), f"{tp_f} {tp}"]
    if pp > 1:
        parts.append(f"{pp_f} {pp}")
    if par.on and engine == "vllm":
        parts.append(f"{dp_f} {par.dp} --enable-expert-parallel")
        cap = ceil_div(cap, par.dp)
    elif par.on:
        parts.append(
            f"--enable-dp-attention {dp_f} {par.dp}" + (f" --ep-size {par.ep}" if par.ep > 1 else "")
        )
        cap = ceil_div(cap, par.dp) * par.dp
    elif deployments > 1 and not (moe and engine == "vllm"):
        parts.append(f"{dp_f} {deployments}")
    parts += [f"{ctx_f} {max_len}", *extra, f"{cap_f} {cap}", *suffix]
    if deployments > 1 and moe and engine == "vllm" and not par.on:
        # vLLM's --data-parallel-size joins the replicas' MoE layers into one group that slices every expert
        # over TP x DP (fused_moe/config.py FusedMoEParallelConfig.make): not the independent replicas planned
        parts.append(
            f"  # run {deployments} of these, {plural(tp * pp, 'GPU')} each, behind a load balancer (vLLM --data-parallel-size "
            "would slice each expert over TP x DP instead)"
        )
    return " ".join(parts)


DRAFT_PLACEHOLDER = "DRAFT_MODEL_PATH"  # the draft checkpoint when kvplan read only its config.json


def speculative_flags(engine: str, spec: Speculative | None) -> list[str]:
    """The engine's flags for the speculative decoding a plan assumed (none without it): vLLM's
    --speculative-config JSON, SGLang's --speculative-algorithm/-num-steps/-num-draft-tokens."""
    if spec is None:
        return []
    draft = (spec.draft.hf_id if spec.draft is not None else None) or DRAFT_PLACEHOLDER
    needs_draft = spec.method in ("eagle", "eagle3")
    if engine == "vllm":
        cfg = f'"method": "{spec.method}", "num_speculative_tokens": {spec.draft_steps}'
        if needs_draft:
            cfg = f'"model": "{draft}", ' + cfg
        return [f"--speculative-config '{{{cfg}}}'"]
    out = [
        f"--speculative-algorithm {SGLANG_ALGORITHM[spec.method]}",
        *(
            [] if spec.method == "ngram" else [f"--speculative-num-steps {spec.draft_steps}"]
        ),  # NGRAM: a lookup
        f"--speculative-num-draft-tokens {spec.verify_tokens}",
    ]
    if needs_draft:
        out.append(f"--speculative-draft-model-path {draft}")
    return out


def _launch(
    engine: str, model: str, a: Answer, per_replica: int, extra: list[str], moe: bool = False,
    suffix: tuple[str, ...] = (),
) -> str:  # fmt: skip
    par = Parallel(a.attention_dp_size, a.expert_parallel_size)
    return launch_line(engine, model, a.tensor_parallel_size, a.pipeline_parallel_size, a.data_parallel_size,
                       par, a.max_model_len, extra, per_replica, moe, suffix)  # fmt: skip


def _vllm_block_flag(q: Query, a: Answer) -> tuple[str, ...]:
    """The answer's --block-size for `vllm serve`: the one given, else the planned one where vLLM takes it as a
    flag; a hybrid model's attention block, which vLLM raises from the configured one itself (above its
    BlockSize choices), is left to it."""
    bs = q.block_size or (a.block_size if a.block_size in VLLM_BLOCK_SIZES else None)
    return (f"--block-size {bs}",) if bs else ()


def vllm_default_budget(gpu: GpuSpec) -> int:
    """`vllm serve`'s default --max-num-batched-tokens on this card (the latest release's rule)."""
    vcls = engines.engine_class("vllm")
    return vcls.batch_defaults(gpu, "serve", vcls.latest).max_num_batched_tokens


def _flags(q: Query, a: Answer, p: Plan, mfs: float) -> tuple[str | None, str | None]:
    model = q.model.hf_id or q.model.name
    moe = q.model.moe is not None
    per_replica = ceil_div(q.users, a.data_parallel_size)
    util = p.settings.gpu_memory_utilization or vllm_default_utilization(engines.ENGINES["vllm"].latest)
    vllm_extra = [f"--kv-cache-dtype {a.kv_cache_dtype}", f"--gpu-memory-utilization {util:g}"]
    # vLLM refuses --max-num-seqs above its step budget (SchedulerConfig._verify_args, on the default budget
    # too): a cap above the default names a budget that holds it
    vllm_cap = ceil_div(per_replica, a.attention_dp_size) if a.expert_parallel_size > 1 else per_replica
    if vllm_cap > vllm_default_budget(next(g for g in q.gpus if g.name == p.gpu.name)):
        vllm_extra.append(f"--max-num-batched-tokens {vllm_cap}")
    vllm_extra += speculative_flags("vllm", q.speculative)
    sg_dtype = SGLANG_KV_DTYPE.get(a.kv_cache_dtype, a.kv_cache_dtype)
    sg_extra = [f"--kv-cache-dtype {sg_dtype}", f"--mem-fraction-static {mfs:g}"]
    sg_extra += speculative_flags("sglang", q.speculative)
    if a.expert_parallel_size > 1 or a.attention_dp_size > 1:
        # an expert-parallel layout is the searched engine's own; the other engine's line would be a
        # different layout (vLLM's DP cores are GPUs beyond TP, SGLang's DP ranks sit inside TP)
        if q.engine == "vllm":
            return _launch("vllm", model, a, per_replica, vllm_extra, moe, _vllm_block_flag(q, a)), None
        return None, _launch("sglang", model, a, per_replica, sg_extra, moe)
    # the answer's block size is the searched engine's: SGLang's page size is no vLLM --block-size (vLLM's
    # default is left to it)
    vllm = _launch(
        "vllm",
        model,
        a,
        per_replica,
        vllm_extra,
        moe,
        _vllm_block_flag(q, a) if q.engine == "vllm" else (),
    )
    sglang = _launch("sglang", model, a, per_replica, sg_extra)
    return vllm, sglang


@dataclass
class _Bounds:
    """What stopped the search, for the verdict when nothing meets every target."""

    weights_min: tuple[int, str] | None = None  # fewest GPUs whose replica holds the weights
    best_users: tuple[int, str] | None = None  # most users any layout within --max-gpus holds
    best_tpot: tuple[float, str] | None = None  # fastest step any layout within --max-gpus reaches
    weight_ms: float | None = None  # the weights-only step time of that fastest layout
    reasons: list[str] = field(default_factory=list)


def solve(q: Query) -> tuple[list[Answer], _Bounds]:
    check_query(q)
    _PLANS.clear()
    answers: list[Answer] = []
    bounds = _Bounds()
    try:
        for gpu in q.gpus:
            if not engine_tps(q, gpu):
                bounds.reasons.append(
                    f"no TP size within a {gpu.gpus_per_node}-GPU {gpu.name} node divides the heads"
                )
            for dtype in q.kv_dtypes:
                _search_gpu(q, gpu, dtype, answers, bounds)
        answers.sort(key=lambda a: _rank(q, a))
        top = answers[: q.top]
        for a in top:
            if a.expert_parallel_size == 1 and a.attention_dp_size == 1:
                a.sglang_max_concurrency, a.sglang_refused, fraction = _sglang_concurrency(q, a)
                if a.sglang_refused:  # no launch line for a layout SGLang does not start
                    a.sglang_flags = None
                elif fraction is not None:
                    # the fraction SGLang's accounting used (a VLM's is lowered for its encoder): SGLang takes a
                    # given fraction as it is, so the line states the one the users figure rests on
                    a.sglang_flags = _flags(q, a, a.plan, fraction)[1]
    finally:
        _PLANS.clear()
    return top, bounds


def _search_gpu(q: Query, gpu: GpuSpec, dtype: str, answers: list[Answer], bounds: _Bounds) -> None:
    """The answers of one GPU type and KV dtype: TP x PP layouts, smallest replica first (a larger
    one cannot do better once a replica alone costs more than the answers kept), then for an MoE
    model its expert-parallel layouts."""
    for tp, pp in layouts(q, gpu, dtype):
        replica = tp * pp
        if q.fixed_num_gpus is not None:
            if replica > q.fixed_num_gpus:
                break
            if q.fixed_num_gpus % replica:
                continue
        elif _max_dp(q, gpu, replica) < 1:
            break
        if _dominated(answers, q, gpu, replica):
            break
        ans = _layout(q, gpu, tp, pp, dtype, bounds)
        if ans is not None:
            answers.append(ans)
    for tp, par in ep_layouts(q, gpu, dtype):
        if q.fixed_num_gpus is not None and q.fixed_num_gpus % unit_gpus(q, tp, 1, par):
            continue
        ans = _layout(q, gpu, tp, 1, dtype, bounds, par)
        if ans is not None:
            answers.append(ans)


def check_query(q: Query) -> None:
    """The query's own numbers, before any plan: one line naming the flag."""
    if q.users < 1:
        raise UsageError("--users must be >= 1")
    if q.tpot_ms is not None and q.tpot_ms <= 0:
        raise UsageError("--tpot-ms must be positive")
    if q.max_gpus < 1:
        raise UsageError("--max-gpus must be >= 1")
    if q.max_model_len is not None and q.max_model_len > q.model.max_context:
        raise ContextTooLong(
            f"--max-model-len {q.max_model_len:,} exceeds {q.model.name}'s maximum context of "
            f"{q.model.max_context:,} tokens; use --max-model-len {q.model.max_context} or less"
        )


def _sglang_concurrency(q: Query, a: Answer) -> tuple[int | None, str | None, float | None]:
    """The same layout under SGLang's accounting, for its launch line: the users it holds, or None and
    why SGLang does not serve it (or serves none of these requests); and the fraction it planned with."""
    if engines.engine_class(q.engine) is Sglang:
        return a.max_concurrency, None, None
    try:
        sg = estimate(
            dataclasses.replace(
                _request(
                    q,
                    next(g for g in q.gpus if g.name == a.gpu),
                    a.tensor_parallel_size,
                    a.pipeline_parallel_size,
                    a.kv_cache_dtype,
                    a.max_model_len,
                ),
                engine="sglang",
                gpu_memory_utilization=None,
                block_size=None,
            )
        )
    except KvplanError as exc:
        return None, str(exc).splitlines()[0].split("; ")[0], None  # the reason, not advice for estimate
    users = sg.max_concurrency_per_replica * a.data_parallel_size
    fraction = sg.settings.mem_fraction_static
    return (
        (users, None, fraction) if users else (None, "not one request of this length fits its KV pool", None)
    )


def _cost(q: Query, gpu: GpuSpec, n: int) -> float:
    return n * q.prices[gpu.name] if q.prices else float(n)


def _dominated(answers: list[Answer], q: Query, gpu: GpuSpec, replica_gpus: int) -> bool:
    """A replica that alone costs more than the q.top-th best answer cannot enter the list."""
    if q.fixed_num_gpus is not None or len(answers) < q.top:
        return False
    costs = sorted(_cost(q, q_gpu, a.num_gpus) for a in answers for q_gpu in q.gpus if q_gpu.name == a.gpu)
    return _cost(q, gpu, rented(q, gpu, replica_gpus, 1)[1]) > costs[q.top - 1]


def _rank(q: Query, a: Answer) -> tuple:
    quality = ENGINE_DTYPES.index(a.kv_cache_dtype) if a.kv_cache_dtype in ENGINE_DTYPES else 9
    ep = a.expert_parallel_size > 1 or a.attention_dp_size > 1
    if q.fixed_num_gpus is not None:  # --max-context: longest context first, then as below
        return (
            -a.max_model_len, quality, a.pipeline_parallel_size, ep, -a.max_concurrency, round(a.tpot_ms, 3),
            a.tensor_parallel_size,
        )  # fmt: skip
    cost = a.cost_per_hour if a.cost_per_hour is not None else a.num_gpus
    # at equal cost the simpler layout first: fewer pipeline stages (each adds a hop to every token),
    # then plain TP before expert parallelism (no all-to-all, no DP-attention balancing); then the most
    # users and the faster step
    return (
        cost, a.num_gpus, quality, a.pipeline_parallel_size, ep, -a.max_concurrency, round(a.tpot_ms, 3),
        a.tensor_parallel_size,
    )  # fmt: skip


def _layout(
    q: Query, gpu: GpuSpec, tp: int, pp: int, dtype: str, bounds: _Bounds, par: Parallel = PLAIN
) -> Answer | None:
    label = _label(q, tp, pp, par)
    unit = unit_gpus(q, tp, pp, par)
    if q.fixed_num_gpus is not None:
        return _longest_context(q, gpu, tp, pp, dtype, bounds, par)
    try:
        p = _replica(q, gpu, tp, pp, dtype, q.max_model_len or q.model.max_context, par)
    except InfeasibleError as exc:
        if isinstance(exc, RequestDoesNotFit):
            bounds.reasons.append(f"{gpu.name} {label}: {exc}")
        return None
    if bounds.weights_min is None or unit < bounds.weights_min[0]:
        bounds.weights_min = (unit, f"{gpu.name} {label}")
    per_replica = p.max_concurrency  # one unit: all its DP ranks
    max_dp = _max_dp(q, gpu, unit)
    best_users = per_replica * max_dp
    if bounds.best_users is None or best_users > bounds.best_users[0]:
        bounds.best_users = (
            best_users,
            f"{rented(q, gpu, unit, max_dp)[1]}x {gpu.name} ({label}, DP {max_dp}, {dtype})",
        )
    if per_replica < 1:
        return None
    dp = ceil_div(q.users, per_replica)
    while dp <= max_dp:
        tpot = _unit_tpot(q, p, par, ceil_div(q.users, dp))
        if q.tpot_ms is None or tpot <= q.tpot_ms:
            break
        dp += 1
    # replicas beyond one per user make no step faster: the fastest layout stops there
    fastest_dp = max(dp, 1) if dp <= max_dp else min(max_dp, q.users)
    if max_dp >= 1:
        fastest_dp = rented(q, gpu, unit, max(fastest_dp, 1))[0] if fastest_dp <= max_dp else fastest_dp
        fastest = _unit_tpot(q, p, par, ceil_div(q.users, max(fastest_dp, 1)))
        if bounds.best_tpot is None or fastest < bounds.best_tpot[0]:
            bounds.best_tpot = (
                fastest,
                f"{rented(q, gpu, unit, fastest_dp)[1]}x {gpu.name} ({label}, DP {fastest_dp}, {dtype})",
            )
            bounds.weight_ms = p.decode.step(1, 0).weights_ms
    if dp > max_dp:
        return None
    dp, n, nodes = rented(q, gpu, unit, dp)  # the units fill the nodes they need
    return _answer(q, gpu, p, tp, pp, dp, dtype, _unit_tpot(q, p, par, ceil_div(q.users, dp)), n, nodes, par)


def _label(q: Query, tp: int, pp: int, par: Parallel) -> str:
    if not par.on:
        return f"TP {tp} x PP {pp}"
    if q.engine == "vllm":
        return f"TP {tp} x DP {par.dp}, EP {par.ep}"
    return f"TP {tp}, DP attention {par.dp}" + (f", EP {par.ep}" if par.ep > 1 else "")


def _unit_tpot(q: Query, p: Plan, par: Parallel, users: int) -> float:
    return _tpot(q, p, _batch(q, par, users))


def _answer(
    q: Query,
    gpu: GpuSpec,
    p: Plan,
    tp: int,
    pp: int,
    dp: int,
    dtype: str,
    tpot: float,
    n: int,
    nodes: int,
    par: Parallel = PLAIN,
) -> Answer:
    # the users memory holds at this context, whatever --max-num-seqs the launch line caps them to
    # (--max-context plans the server it launches, capped at its users; the other modes the engine's default)
    conc = p.pool_max_concurrency * dp
    mfs = sglang_memory_settings(gpu.memory_bytes, tp, pp).mem_fraction_static
    if q.engine == "sglang" and p.settings.mem_fraction_static:
        mfs = p.settings.mem_fraction_static  # the plan's own (DP attention reserves more)
    margins = Margins(users=conc / q.users - 1, tpot=1 - tpot / q.tpot_ms if q.tpot_ms else None)
    step = _step(q, p, _batch(q, par, ceil_div(q.users, dp)))
    by_label: dict[str, list[str]] = {}
    for t, v in sorted(step.sources.items()):
        if step_model.is_measured(v):
            by_label.setdefault(v, []).append(t)
    source = step_model.FITTED + "".join(f"; {', '.join(terms)} {label}" for label, terms in by_label.items())
    a = Answer(
        gpu=gpu.name,
        num_gpus=n,
        nodes=nodes,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        data_parallel_size=dp,
        kv_cache_dtype=_dtype_name(dtype, p),
        block_size=p.settings.block_size,
        max_model_len=p.settings.max_model_len,
        max_concurrency=conc,
        tpot_ms=tpot,
        tpot_source=source,
        tpot_context_tokens=step.context_tokens,
        tpot_context_source=p.decode.context_source if q.has_workload else "every request at --max-model-len",
        decode_step=step,
        why_pipeline=_why_pipeline(q, gpu, p, tp, pp, dtype, step),
        cost_per_hour=n * q.prices[gpu.name] if q.prices else None,
        margins=margins,
        vllm_flags="",
        sglang_flags="",
        sglang_max_concurrency=None,
        plan=p,
        expert_parallel_size=par.ep,
        attention_dp_size=par.dp,
        why_expert_parallel=_why_expert_parallel(q, gpu, p, tp, dtype, par, step, dp) if par.on else None,
        speculative=_spec(q, p, _batch(q, par, ceil_div(q.users, dp))),
    )
    a.vllm_flags, a.sglang_flags = _flags(q, a, p, mfs)
    return a


def _why_expert_parallel(
    q: Query, gpu: GpuSpec, p: Plan, tp: int, dtype: str, par: Parallel, step: step_model.StepTime, units: int
) -> str:
    """Why an expert-parallel layout: the users one unit holds against plain TP over the same GPUs
    (when that fits), and what its all-to-all costs a step."""
    unit = unit_gpus(q, tp, 1, par)  # whole nodes: TP over a node, one PP stage a node beyond one
    plain_tp = min(unit, gpu.gpus_per_node)
    plain_pp = unit // plain_tp
    try:
        plain = _replica(q, gpu, plain_tp, plain_pp, dtype, p.settings.max_model_len)
        compared = f" vs {plain.max_concurrency:,} on TP {plain_tp}" + (
            f" x PP {plain_pp}" if plain_pp > 1 else ""
        )
    except InfeasibleError:
        compared = f" (TP {plain_tp}" + (f" x PP {plain_pp}" if plain_pp > 1 else "") + " does not hold them)"
    kv = "each of its DP attention ranks holds only its own requests' KV"
    a2a = f"; the all-to-all adds {step.all_to_all_ms:.2f} ms a step" if step.all_to_all_ms else ""
    deploy = f"; {units} such deployments" if units > 1 else ""
    return f"{kv}, so {unit} {gpu.name} hold {plural(p.max_concurrency, 'user')}{compared}{a2a}{deploy}"


def _why_pipeline(
    q: Query, gpu: GpuSpec, p: Plan, tp: int, pp: int, dtype: str, step: step_model.StepTime
) -> str | None:
    """Why a layout has PP stages: what fails with one stage fewer, and what the stages cost."""
    if pp == 1:
        return None
    links = p.decode.inputs.pp_links
    over = {link.name for link in links if link.inter_node}
    where = f" (between nodes, over the {'/'.join(sorted(over))})" if over else ""
    cost = f"the {pp - 1} hop(s) between stages{where} add {step.pp_hop_ms:.2f} ms to each token"
    try:
        fewer = _replica(q, gpu, tp, pp - 1, dtype, p.settings.max_model_len)
    except WeightsDoNotFit:
        return f"PP {pp}: the weights do not fit on TP {tp} x PP {pp - 1}; {cost}"
    except InfeasibleError:
        return f"PP {pp}: one request at {p.settings.max_model_len:,} tokens does not fit on TP {tp} x PP {pp - 1}; {cost}"
    return (
        f"PP {pp}: more KV memory per replica ({p.max_concurrency_per_replica:,} users vs "
        f"{fewer.max_concurrency_per_replica:,} on TP {tp} x PP {pp - 1}); {cost}"
    )


def _longest_context(
    q: Query, gpu: GpuSpec, tp: int, pp: int, dtype: str, bounds: _Bounds, par: Parallel = PLAIN
) -> Answer | None:
    """--max-context: the largest max_model_len at which `users` fit on exactly q.fixed_num_gpus."""
    assert q.fixed_num_gpus is not None  # --max-context mode
    dp = q.fixed_num_gpus // unit_gpus(q, tp, pp, par)
    per_replica_users = ceil_div(q.users, dp)

    # the launch line caps each plain replica at its users (launch_line): plan the server it launches
    cap = per_replica_users if par == PLAIN else None

    def fits(length: int) -> Plan | None:
        unit = unit_gpus(q, tp, pp, par)
        p: Plan | None = None
        for c in (None, cap) if cap is not None else (None,):
            # with the engine's default budget: whether the weights fit (the verdict's cue); then the server the
            # launch line starts, with its cap (and, past vLLM's default step budget, a budget that holds it),
            # which alone decides
            try:
                p = _replica(q, gpu, tp, pp, dtype, length, par, c)
            except KvplanError:
                p = None
                continue
            if bounds.weights_min is None or unit < bounds.weights_min[0]:
                bounds.weights_min = (unit, f"{gpu.name} {_label(q, tp, pp, par)}")
        if p is None or p.max_concurrency < per_replica_users:
            return None
        if q.tpot_ms is not None and _unit_tpot(q, p, par, per_replica_users) > q.tpot_ms:
            return None
        return p

    lo, hi, best = min_model_len(q.engine), q.model.max_context, None
    while lo <= hi:  # capacity falls as the context grows: binary search the last length that fits
        mid = (lo + hi) // 2
        p = fits(mid)
        if p is not None:
            best, lo = p, mid + 1
        else:
            hi = mid - 1
    if best is None:
        bounds.reasons.append(
            f"{gpu.name} {_label(q, tp, pp, par)} x DP {dp} ({dtype}): not even {lo} tokens each"
        )
        return None
    n = q.fixed_num_gpus
    tpot = _unit_tpot(q, best, par, per_replica_users)
    return _answer(q, gpu, best, tp, pp, dp, dtype, tpot, n, ceil_div(n, gpu.gpus_per_node), par)


def verdict(q: Query, bounds: _Bounds) -> tuple[str, dict[str, Any]]:
    """One line naming the binding constraint and by how much, and its figures by name (the error's
    `figures` under --json)."""
    names = "/".join(g.name for g in q.gpus)
    if bounds.weights_min is None:
        # no replica holds the weights within --max-gpus: how many would?
        try:
            need = _weights_gpus(q)
        finally:
            _PLANS.clear()  # keyed by the query's id: never kept past this query
        if need is None:
            return (
                f"{q.model.name}'s weights do not fit on {MAX_PP * max(g.gpus_per_node for g in q.gpus)} {names} "
                "(TP x PP); use a larger GPU or a smaller --weight-dtype"
            ), {}
        n, where = need
        figures: dict[str, Any] = {"weights_min_gpus": n, "weights_min_layout": where}
        if q.fixed_num_gpus is not None:  # --max-context on the GPUs given: those are the limit
            return (
                f"weights alone need {n} {names} ({where}); --gpus gives {q.fixed_num_gpus}: "
                f"give at least {n}, e.g. --gpus {n}x{q.gpus[0].name}"
            ), figures
        return f"weights alone need {n} {names} ({where}); --max-gpus is {q.max_gpus}", figures
    if q.fixed_num_gpus is not None:
        extra = "; ".join(bounds.reasons[:2])
        return f"{plural(q.users, 'user')} do not fit on {q.fixed_num_gpus} {names} at any context" + (
            f" ({extra})" if extra else ""
        ), {}
    if bounds.best_users is not None and bounds.best_users[0] < q.users:
        c, where = bounds.best_users
        return (
            f"at most {c:,} users fit at {q.max_model_len:,} tokens within --max-gpus {q.max_gpus} "
            f"({where}); {q.users:,} need more GPUs, a shorter --max-model-len"
            + (" or fp8 KV" if "fp8" not in q.kv_dtypes else "")
        ), {"max_users": c, "max_model_len_tokens": q.max_model_len, "layout": where}
    if q.tpot_ms is not None and bounds.best_tpot is not None:
        t, where = bounds.best_tpot
        weights = (
            f"; the weights alone take {bounds.weight_ms:.1f} ms a step there" if bounds.weight_ms else ""
        )
        figures = {"fastest_tpot_ms": t, "users": q.users, "layout": where}
        if bounds.weight_ms:
            figures["weights_step_ms"] = bounds.weight_ms
        return (
            f"--tpot-ms {q.tpot_ms:g}: the fastest layout within --max-gpus {q.max_gpus} reaches {t:.1f} ms "
            f"at {plural(q.users, 'user')} ({where}){weights}; allow more GPUs or relax the target"
        ), figures
    return "no layout meets every target: " + "; ".join(bounds.reasons[:3]), {}


def _weights_gpus(q: Query) -> tuple[int, str] | None:
    """The fewest GPUs (as rented) whose layout holds the weights: the smallest TP in a node that does,
    else the largest TP with one pipeline stage per node."""
    best = None
    for gpu in q.gpus:
        tps = sorted(engine_tps(q, gpu))
        layouts = [(tp, 1) for tp in tps] + [(tps[-1], pp) for pp in range(2, MAX_PP + 1)] if tps else []
        for tp, pp in layouts:
            try:
                shortest = q.max_model_len or min_model_len(q.engine)
                _replica(q, gpu, tp, pp, q.kv_dtypes[0], min(shortest, q.model.max_context))
            except WeightsDoNotFit:
                continue
            except InfeasibleError:
                pass
            # on the GPUs given (--max-context) the layout's own GPUs; otherwise as rented (whole nodes)
            _, n, nodes = (
                (tp * pp, tp * pp, 1) if q.fixed_num_gpus is not None else rented(q, gpu, tp * pp, 1)
            )
            if best is None or n < best[0]:
                where = f"{nodes} node{'s' if nodes > 1 else ''}: " if nodes > 1 else ""
                best = (n, f"{where}TP {tp} x PP {pp}")
            break
    return best
