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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kvplan import engines
from kvplan.engines.sglang import Sglang
from kvplan.engines.sglang import memory_settings as sglang_memory_settings
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
from kvplan.specs.models import GpuSpec, ModelSpec
from kvplan.speed import step_model
from kvplan.units import ceil_div

SCHEMA = "kvplan.solve/1"
# KV dtypes the engines serve, best quality first (int8/int4 are kvplan what-ifs, not engine options)
ENGINE_DTYPES = ("auto", "fp8")
MAX_PP = 16


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
    vllm_flags: str
    sglang_flags: str
    sglang_max_concurrency: int | None
    plan: Plan = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("plan")
        d["decode_step"] = self.decode_step.to_dict()  # in ms, with memory_ms
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
    network: Network | None = None  # the inter-node fabric per GPU; None: the default (400G)

    @property
    def has_workload(self) -> bool:
        return self.avg_context_tokens is not None or self.input_len is not None


_PLANS: dict[tuple, Plan | InfeasibleError] = {}  # one solve's replicas, planned once each


def _replica(q: Query, gpu: GpuSpec, tp: int, pp: int, dtype: str, max_len: int) -> Plan:
    key = (id(q), gpu.name, tp, pp, dtype, max_len)
    if key not in _PLANS:
        try:
            _PLANS[key] = estimate(_request(q, gpu, tp, pp, dtype, max_len))
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
    return q.partial_nodes or q.max_gpus < gpu.gpus_per_node


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
    length = q.max_model_len or 1  # --max-context: whether the weights fit at all
    try:
        fits = _replica(q, gpu, top, 1, dtype, length).max_concurrency_per_replica >= 1
    except InfeasibleError:
        fits = False
    if fits:
        return [(tp, 1) for tp in tps]
    return [(top, pp) for pp in range(2, min(MAX_PP, q.model.num_layers) + 1)]


def _request(q: Query, gpu: GpuSpec, tp: int, pp: int, dtype: str, max_len: int) -> PlanRequest:
    return PlanRequest(
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
    )


def _step(q: Query, p: Plan, batch: int) -> step_model.StepTime:
    """The step model at `batch` requests of one replica, each at the mean context of its decode when
    the query gives the workload (as estimate's decode figures), else at max_model_len."""
    if q.has_workload:
        return p.decode.step(batch, p.decode.kv_bytes_per_request_per_gpu, p.decode.context_tokens)
    return p.decode.step(batch, p.kv_bytes_per_request_per_gpu, p.settings.max_model_len)


def _tpot(q: Query, p: Plan, batch: int) -> float:
    return _step(q, p, batch).tpot_ms


def _dtype_name(dtype: str, p: Plan) -> str:
    return "auto" if dtype == "auto" else p.settings.kv_cache_dtype


def _launch(engine: str, model: str, a: Answer, per_replica: int, extra: list[str]) -> str:
    cls = engines.engine_class(engine)
    tp, pp, dp, ctx, cap = cls.launch_flags
    parts = [cls.launch_command.format(model=model), f"{tp} {a.tensor_parallel_size}"]
    if a.pipeline_parallel_size > 1:
        parts.append(f"{pp} {a.pipeline_parallel_size}")
    if a.data_parallel_size > 1:
        parts.append(f"{dp} {a.data_parallel_size}")
    parts += [f"{ctx} {a.max_model_len}", *extra, f"{cap} {per_replica}"]
    return " ".join(parts)


def _flags(q: Query, a: Answer, p: Plan, mfs: float) -> tuple[str, str]:
    model = q.model.hf_id or q.model.name
    per_replica = ceil_div(q.users, a.data_parallel_size)
    util = p.settings.gpu_memory_utilization or vllm_default_utilization(engines.ENGINES["vllm"].latest)
    vllm = (
        _launch(
            "vllm",
            model,
            a,
            per_replica,
            [f"--kv-cache-dtype {a.kv_cache_dtype}", f"--gpu-memory-utilization {util:g}"],
        )
        + f" --block-size {a.block_size}"
    )
    sg_dtype = {"auto": "auto", "fp8": "fp8_e4m3"}.get(a.kv_cache_dtype, a.kv_cache_dtype)
    sglang = _launch(
        "sglang", model, a, per_replica, [f"--kv-cache-dtype {sg_dtype}", f"--mem-fraction-static {mfs:g}"]
    )
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
    _check_query(q)
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
        answers.sort(key=lambda a: _rank(q, a))
        top = answers[: q.top]
        for a in top:
            a.sglang_max_concurrency = _sglang_concurrency(q, a)
    finally:
        _PLANS.clear()
    return top, bounds


def _check_query(q: Query) -> None:
    if q.users < 1:
        raise UsageError("--users must be >= 1")
    if q.tpot_ms is not None and q.tpot_ms <= 0:
        raise UsageError("--tpot-ms must be positive")
    if q.max_gpus < 1:
        raise UsageError("--max-gpus must be >= 1")
    if q.max_model_len is not None and q.max_model_len > q.model.max_context:
        raise ContextTooLong(
            f"--max-model-len {q.max_model_len:,} exceeds {q.model.name}'s maximum context of "
            f"{q.model.max_context:,} tokens"
        )


def _sglang_concurrency(q: Query, a: Answer) -> int:
    """The same layout under SGLang's accounting, for its launch line."""
    if engines.engine_class(q.engine) is Sglang:
        return a.max_concurrency
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
        return sg.max_concurrency_per_replica * a.data_parallel_size
    except KvplanError:
        return 0


def _cost(q: Query, gpu: GpuSpec, n: int) -> float:
    return n * q.prices[gpu.name] if q.prices else float(n)


def _dominated(answers: list[Answer], q: Query, gpu: GpuSpec, replica_gpus: int) -> bool:
    """A replica that alone costs more than the q.top-th best answer cannot enter the list."""
    if q.fixed_num_gpus is not None or len(answers) < q.top:
        return False
    costs = sorted(_cost(q, q_gpu, a.num_gpus) for a in answers for q_gpu in q.gpus if q_gpu.name == a.gpu)
    return _cost(q, gpu, rented(q, gpu, replica_gpus, 1)[1]) > costs[q.top - 1]


def _rank(q: Query, a: Answer) -> tuple:
    if q.fixed_num_gpus is not None:  # --max-context: longest context first
        return (
            -a.max_model_len,
            ENGINE_DTYPES.index(a.kv_cache_dtype) if a.kv_cache_dtype in ENGINE_DTYPES else 9,
        )
    cost = a.cost_per_hour if a.cost_per_hour is not None else a.num_gpus
    quality = ENGINE_DTYPES.index(a.kv_cache_dtype) if a.kv_cache_dtype in ENGINE_DTYPES else 9
    # at equal cost, fewer pipeline stages first: each one adds a hop to every token
    return (cost, a.num_gpus, quality, a.pipeline_parallel_size, -a.max_concurrency, a.tensor_parallel_size)


def _layout(q: Query, gpu: GpuSpec, tp: int, pp: int, dtype: str, bounds: _Bounds) -> Answer | None:
    label = f"TP {tp} x PP {pp}"
    if q.fixed_num_gpus is not None:
        return _longest_context(q, gpu, tp, pp, dtype, bounds)
    try:
        p = _replica(q, gpu, tp, pp, dtype, q.max_model_len or q.model.max_context)
    except InfeasibleError as exc:
        if isinstance(exc, RequestDoesNotFit):
            bounds.reasons.append(f"{gpu.name} {label}: {exc}")
        return None
    if bounds.weights_min is None or tp * pp < bounds.weights_min[0]:
        bounds.weights_min = (tp * pp, f"{gpu.name} {label}")
    per_replica = p.max_concurrency_per_replica
    max_dp = _max_dp(q, gpu, tp * pp)
    best_users = per_replica * max_dp
    if bounds.best_users is None or best_users > bounds.best_users[0]:
        bounds.best_users = (
            best_users,
            f"{rented(q, gpu, tp * pp, max_dp)[1]}x {gpu.name} ({label}, DP {max_dp}, {dtype})",
        )
    if per_replica < 1:
        return None
    dp = ceil_div(q.users, per_replica)
    while dp <= max_dp:
        tpot = _tpot(q, p, ceil_div(q.users, dp))
        if q.tpot_ms is None or tpot <= q.tpot_ms:
            break
        dp += 1
    # replicas beyond one per user make no step faster: the fastest layout stops there
    fastest_dp = max(dp, 1) if dp <= max_dp else min(max_dp, q.users)
    if max_dp >= 1:
        fastest_dp = rented(q, gpu, tp * pp, max(fastest_dp, 1))[0] if fastest_dp <= max_dp else fastest_dp
        fastest = _tpot(q, p, ceil_div(q.users, max(fastest_dp, 1)))
        if bounds.best_tpot is None or fastest < bounds.best_tpot[0]:
            bounds.best_tpot = (
                fastest,
                f"{rented(q, gpu, tp * pp, fastest_dp)[1]}x {gpu.name} ({label}, DP {fastest_dp}, {dtype})",
            )
            bounds.weight_ms = p.decode.step(1, 0).weights_ms
    if dp > max_dp:
        return None
    dp, n, nodes = rented(q, gpu, tp * pp, dp)  # the replicas fill the nodes they need
    return _answer(q, gpu, p, tp, pp, dp, dtype, _tpot(q, p, ceil_div(q.users, dp)), n, nodes)


def _answer(
    q: Query, gpu: GpuSpec, p: Plan, tp: int, pp: int, dp: int, dtype: str, tpot: float, n: int, nodes: int
) -> Answer:
    conc = p.max_concurrency_per_replica * dp
    mfs = sglang_memory_settings(gpu.memory_bytes, tp, pp).mem_fraction_static
    margins = Margins(users=conc / q.users - 1, tpot=1 - tpot / q.tpot_ms if q.tpot_ms else None)
    step = _step(q, p, ceil_div(q.users, dp))
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
    )
    a.vllm_flags, a.sglang_flags = _flags(q, a, p, mfs)
    return a


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


def _longest_context(q: Query, gpu: GpuSpec, tp: int, pp: int, dtype: str, bounds: _Bounds) -> Answer | None:
    """--max-context: the largest max_model_len at which `users` fit on exactly q.fixed_num_gpus."""
    assert q.fixed_num_gpus is not None  # --max-context mode
    dp = q.fixed_num_gpus // (tp * pp)
    per_replica_users = ceil_div(q.users, dp)

    def fits(length: int) -> Plan | None:
        try:
            p = _replica(q, gpu, tp, pp, dtype, length)
        except KvplanError:
            return None
        if p.max_concurrency_per_replica < per_replica_users:
            return None
        if q.tpot_ms is not None and _tpot(q, p, per_replica_users) > q.tpot_ms:
            return None
        return p

    lo, hi, best = 1, q.model.max_context, None
    while lo <= hi:  # capacity falls as the context grows: binary search the last length that fits
        mid = (lo + hi) // 2
        p = fits(mid)
        if p is not None:
            best, lo = p, mid + 1
        else:
            hi = mid - 1
    if best is None:
        bounds.reasons.append(f"{gpu.name} TP {tp} x PP {pp} x DP {dp} ({dtype}): not even 1 token each")
        return None
    n = q.fixed_num_gpus
    return _answer(
        q, gpu, best, tp, pp, dp, dtype, _tpot(q, best, per_replica_users), n, ceil_div(n, gpu.gpus_per_node)
    )


def verdict(q: Query, bounds: _Bounds) -> str:
    """One line naming the binding constraint and by how much."""
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
            )
        n, where = need
        if q.fixed_num_gpus is not None:  # --max-context on the GPUs given: those are the limit
            return (
                f"weights alone need {n} {names} ({where}); --gpus gives {q.fixed_num_gpus}: "
                f"give at least {n}, e.g. --gpus {n}x{q.gpus[0].name}"
            )
        return f"weights alone need {n} {names} ({where}); --max-gpus is {q.max_gpus}"
    if q.fixed_num_gpus is not None:
        extra = "; ".join(bounds.reasons[:2])
        return f"{q.users:,} users do not fit on {q.fixed_num_gpus} {names} at any context" + (
            f" ({extra})" if extra else ""
        )
    if bounds.best_users is not None and bounds.best_users[0] < q.users:
        c, where = bounds.best_users
        return (
            f"at most {c:,} users fit at {q.max_model_len:,} tokens within --max-gpus {q.max_gpus} "
            f"({where}); {q.users:,} need more GPUs, a shorter --max-model-len"
            + (" or fp8 KV" if "fp8" not in q.kv_dtypes else "")
        )
    if q.tpot_ms is not None and bounds.best_tpot is not None:
        t, where = bounds.best_tpot
        weights = (
            f"; the weights alone take {bounds.weight_ms:.1f} ms a step there" if bounds.weight_ms else ""
        )
        return (
            f"--tpot-ms {q.tpot_ms:g}: the fastest layout within --max-gpus {q.max_gpus} reaches {t:.1f} ms "
            f"at {q.users:,} users ({where}){weights}; allow more GPUs or relax the target"
        )
    return "no layout meets every target: " + "; ".join(bounds.reasons[:3])


def _weights_gpus(q: Query) -> tuple[int, str] | None:
    """The fewest GPUs (as rented) whose layout holds the weights: the largest TP in a node, then one
    pipeline stage per node."""
    best = None
    for gpu in q.gpus:
        tps = engine_tps(q, gpu)
        if not tps:
            continue
        tp = max(tps)
        for pp in range(1, MAX_PP + 1):
            try:
                _replica(q, gpu, tp, pp, q.kv_dtypes[0], min(q.max_model_len or 1, q.model.max_context))
            except WeightsDoNotFit:
                continue
            except InfeasibleError:
                pass
            _, n, nodes = rented(q, gpu, tp * pp, 1)
            if best is None or n < best[0]:
                where = f"{nodes} node{'s' if nodes > 1 else ''}: " if nodes > 1 else ""
                best = (n, f"{where}TP {tp} x PP {pp}")
            break
    return best
