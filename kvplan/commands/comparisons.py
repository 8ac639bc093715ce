"""What `kvplan compare table|ladder|plot` compute from their flags: rows, steps, curves, notes.

compare.py holds the what-if arithmetic for one request; this module applies it across the
models and variants a user names, on the cluster the flags describe, and words the notes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvplan.errors import InfeasibleError, UsageError
from kvplan.search import compare
from kvplan.units import GiB, fmt_gib

if TYPE_CHECKING:
    from kvplan.plan.plan import Cluster, Plan, PlanRequest
    from kvplan.search.compare import Row, Step
    from kvplan.specs.models import ModelSpec


@dataclass(frozen=True)
class ClusterFlags:
    """The flags every compare command shares, as typed."""

    gpus: str
    max_model_len: str | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory: str | None = None
    block_size: int | None = None
    network: str | None = None
    network_gbps: float | None = None
    network_latency_us: float | None = None
    data_parallel_size: int | None = None  # vLLM: DP engine cores of TP GPUs (with EP: their MoE group)
    enable_expert_parallel: bool = False  # vLLM: whole experts over TP x DP GPUs (MoE rows only)

    def __post_init__(self) -> None:
        from kvplan.commands.inputs import refuse_empty

        refuse_empty(self)
        given = [f for f, v in (("network", self.network), ("network_gbps", self.network_gbps),
                                ("network_latency_us", self.network_latency_us)) if v is not None]  # fmt: skip
        if given:
            raise UsageError(
                f"compare: {given[0]} plays no part in its figures (KV memory, requests held, the KV read a step at "
                "HBM bandwidth); give it to estimate, simulate or solve"
            )


@dataclass(frozen=True)
class TableCluster:
    """The cluster a comparison table ran on: the GPU, and the layout and context of its first
    row that planned (none when no row could run)."""

    gpu: str
    memory_bytes_per_gpu: int
    layout: Cluster | None = None
    max_model_len: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpu": self.gpu, "memory_bytes_per_gpu": self.memory_bytes_per_gpu}
        if self.layout is not None:
            out.update(dataclasses.asdict(self.layout))
            out["max_model_len"] = self.max_model_len
        return out


@dataclass(frozen=True)
class TableResult:
    base: PlanRequest
    rows: list[Row]
    cluster: TableCluster
    notes: list[str]

    def __repr__(self) -> str:
        """One line per row (the request behind them, a model spec and profile, left out)."""
        lines = [f"compare table: {len(self.rows)} row(s)"]
        for r in self.rows:
            got = f"max {r.max_concurrency:,} requests" if r.max_concurrency is not None else "cannot run"
            lines.append(f"{r.model} / {r.variant}: {r.attention}; {got}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """As `compare table --json`."""
        return {
            "schema": compare.SCHEMA,
            "kind": "table",
            "cluster": self.cluster.to_dict(),
            "rows": [r.to_dict() for r in self.rows],
            "notes": self.notes,
        }


@dataclass(frozen=True)
class LadderResult:
    base: PlanRequest
    steps: list[Step]
    shipped: Plan
    max_model_len: int
    avg_context_tokens: int
    shared_prefix_tokens: int
    prefix_hit_rate: float
    notes: list[str]


@dataclass(frozen=True)
class PlotResult:
    base: PlanRequest
    contexts: list[int]
    series: list[tuple[str, list[int | None]]]  # label, max concurrency at each context
    bars: list[tuple[str, int, int, int, int]]  # label, weights, KV, reserve, memory (bytes per GPU)
    budget: str
    notes: tuple[
        str, ...
    ] = ()  # why a model/variant has no memory bar (it does not fit at its longest context)


MAX_OFFLOAD_GIB = 2**20


def split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def base_request(model_ref: str, flags: ClusterFlags, max_model_len: str | None) -> PlanRequest:
    from kvplan.commands import inputs
    from kvplan.commands.inputs import load_cluster, parse_network
    from kvplan.plan.plan import PlanRequest
    from kvplan.units import parse_bytes, parse_count

    gpu, num_gpus, nodes = load_cluster(flags.gpus)
    return PlanRequest(
        remedies=(),  # compare takes neither --weight-dtype nor --cpu-offload-gb
        model=inputs.load_spec(model_ref),
        gpu=gpu,
        num_gpus=num_gpus,
        nodes=nodes,
        tp=flags.tensor_parallel_size,
        pp=flags.pipeline_parallel_size,
        max_model_len=parse_count(max_model_len, "--max-model-len") if max_model_len else None,
        gpu_memory_utilization=flags.gpu_memory_utilization,
        kv_cache_memory_bytes=parse_bytes(flags.kv_cache_memory, "--kv-cache-memory")
        if flags.kv_cache_memory
        else None,
        block_size=flags.block_size,
        network=parse_network(flags.network, flags.network_gbps, flags.network_latency_us),
        data_parallel_size=flags.data_parallel_size,
        enable_expert_parallel=flags.enable_expert_parallel,
    )


def _models(models: str | None) -> tuple[list[str], list[ModelSpec]]:
    from kvplan.commands import inputs

    names = split(models) if models is not None else list(compare.DEFAULT_MODELS)
    if not names:
        raise UsageError(f"--models: no model named in {models!r}; give e.g. --models qwen3-8b,llama3-70b")
    if models and len(names) != len(models.split(",")):
        raise UsageError(f"--models: an empty name between commas in {models!r}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"--models: {', '.join(twice)} given twice; name each model once")
    return names, [inputs.load_spec(n) for n in names]


def _variants(variants: str) -> list[str]:
    """--variants as listed: an empty entry or one given twice is refused as --models refuses them."""
    names = split(variants)
    if not variants.strip():
        raise UsageError(
            "--variants is empty; give variant names (e.g. shipped,int8), or leave it out for shipped"
        )
    if len(names) != len(variants.split(",")):
        raise UsageError(f"--variants: an empty entry between commas in {variants!r}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"--variants: {', '.join(twice)} given twice; name each variant once")
    return names or ["shipped"]


def _cluster(base: PlanRequest, rows: list[Row]) -> TableCluster:
    plan = next((r.plan for r in rows if r.plan is not None), None)
    if plan is None:
        return TableCluster(base.gpu.name, base.gpu.memory_bytes)
    # the context asked for, not the first row's: a first model whose maximum is below it is capped to that
    context = base.max_model_len or plan.settings.max_model_len
    return TableCluster(base.gpu.name, base.gpu.memory_bytes, plan.cluster, context)


def with_kv_dtype(variants: list[str], kv_cache_dtype: str) -> list[str]:
    """compare's --kv-cache-dtype in the variant vocabulary: each variant naming no KV dtype gets
    it as its '+dtype' token (shipped -> shipped+fp8); one naming its own keeps it; auto adds none."""
    from kvplan.formats import KV_DTYPES

    dtype = kv_cache_dtype.strip().lower()
    if dtype != "auto" and dtype not in KV_DTYPES:
        raise UsageError(
            f"--kv-cache-dtype must be auto or one of {', '.join(KV_DTYPES)}, got {kv_cache_dtype!r}"
        )
    if dtype == "auto":
        return variants
    out = []
    for v in variants:
        tokens = [t.strip().lower() for t in v.split("+")]
        named = any(t in KV_DTYPES or t == "auto" for t in tokens)
        out.append(v if named else f"{v}+{dtype}")
    return out


def table(
    models: str | None, variants: str, flags: ClusterFlags, offload_gib: float, kv_cache_dtype: str = "auto"
) -> TableResult:
    """One row per model x variant on the flags' cluster (8K tokens per request by default)."""

    names, specs = _models(models)
    vlist = with_kv_dtype(_variants(variants), kv_cache_dtype)
    if not 0 <= offload_gib <= MAX_OFFLOAD_GIB:  # also refuses nan
        raise UsageError(f"--offload-gib must be between 0 and {MAX_OFFLOAD_GIB:,}, got {offload_gib}")
    base = base_request(names[0], flags, flags.max_model_len or "8K")
    rows: list[Row] = []
    for spec in specs:  # a model whose maximum is below the context is capped, and the notes say so
        b = base
        if base.max_model_len and base.max_model_len > spec.max_context:
            b = dataclasses.replace(base, max_model_len=spec.max_context)
        rows += compare.table(b, [spec], vlist, offload_gib)
    cluster = _cluster(base, rows)
    return TableResult(base, rows, cluster, _table_notes(rows, cluster, base))


def _table_notes(rows: list[Row], cluster: TableCluster, base: PlanRequest) -> list[str]:
    notes = [
        "vs MHA: KV bytes per token against the same model with one K/V head per query head, in bf16",
        "KV read/step: the KV bytes a decode step reads on one GPU (one request at the full context, or every "
        f"request at max requests) at {base.gpu.name}'s datasheet HBM bandwidth "
        f"({base.gpu.hbm_bytes_per_s / 1e12:.2f} TB/s), weights excluded; `kvplan estimate` gives the step "
        "model's TPOT (kernel efficiency, weights, communication)",
    ]
    tp = cluster.layout.tensor_parallel_size if cluster.layout else 1
    if tp > 1 and any(r.plan and "MLA" in r.attention for r in rows):
        notes.append(
            f"MLA: vLLM keeps the whole latent on each of the {tp} TP ranks (README, How the engines size their KV cache), so per GPU it can hold "
            f"less than GQA split {tp} ways; engines serving MLA with data-parallel attention hold {tp}x more"
        )
    if any(r.offload_bytes_per_gpu for r in rows):
        notes.append(
            f"offload: CPU memory per GPU added to the KV pool; what spills is read back over PCIe each step at "
            f"{base.gpu.pcie_bytes_per_s / 1e9:.0f} GB/s (assumed)"
        )
    capped = {
        r.model: r.plan.settings.max_model_len
        for r in rows
        if r.plan and r.plan.settings.max_model_len < (cluster.max_model_len or 0)
    }
    for m in sorted(capped):
        notes.append(f"{m}: context capped at its maximum, {capped[m]:,} tokens")
    for r in rows:
        if r.error:
            notes.append(f"{r.model} {r.variant}: {r.error}")
    return notes


def ladder(
    model: str,
    flags: ClusterFlags,
    avg_context: str | None,
    shared_prefix_tokens: str | None,
    prefix_hit_rate: float,
) -> LadderResult:
    """The optimisation ladder (README, Comparing models and techniques) on the flags' cluster; averages default to half the context and 3/4 of it."""
    from kvplan.units import parse_count

    base = base_request(model, flags, flags.max_model_len)
    if base.max_model_len is not None and base.max_model_len < 1:  # as estimate and compare table refuse it
        raise UsageError("--max-model-len must be >= 1 (leave it out for the model's maximum)")
    length = base.max_model_len or base.model.max_context
    base = dataclasses.replace(base, max_model_len=length)
    if not avg_context and length < 4:  # the defaults below name no flag the user gave
        raise UsageError(
            f"--max-model-len {length:,}: the ladder needs at least 4 tokens (its average context defaults "
            "to half of it and the shared prefix to 3/4 of that)"
        )
    avg = parse_count(avg_context, "--avg-context") if avg_context else length // 2
    if avg_context and not shared_prefix_tokens and 1 <= avg < 2:
        raise UsageError(
            f"--avg-context {avg:,}: the shared prefix defaults to 3/4 of it, under one token; give a longer "
            "--avg-context or --shared-prefix-tokens"
        )
    if not 1 <= avg <= length:
        raise UsageError(f"--avg-context must be between 1 and --max-model-len ({length:,})")
    prefix = (
        parse_count(shared_prefix_tokens, "--shared-prefix-tokens") if shared_prefix_tokens else avg * 3 // 4
    )
    if not 0 < prefix < avg:
        raise UsageError(f"--shared-prefix-tokens must be between 1 and --avg-context ({avg:,}) - 1")
    if not 0 < prefix_hit_rate <= 1:
        raise UsageError(f"--prefix-hit-rate must be in (0, 1], got {prefix_hit_rate}")
    steps, shipped = compare.ladder(base, avg, prefix, prefix_hit_rate)
    notes = [
        f"every step on the same KV budget: {fmt_gib(shipped.kv_budget_bytes_per_gpu)} per GPU "
        f"({shipped.kv_budget_source}; {base.model.name}'s weights)",
        f"naive preallocates {length:,} tokens per request; later steps hold the {avg:,}-token average "
        "(the vLLM paper, arXiv:2309.06180: preallocation wastes what requests do not use)",
        "factor: against the previous step; cumulative: against the first",
    ]
    return LadderResult(base, steps, shipped, length, avg, prefix, prefix_hit_rate, notes)


def plot(models: str | None, variants: str, flags: ClusterFlags, kv_cache_dtype: str = "auto") -> PlotResult:
    """Max concurrency at doubling contexts up to --max-model-len (default: the longest maximum),
    and each model/variant's memory per GPU at its own longest context."""
    from kvplan.units import parse_count

    names, specs = _models(models)
    vlist = with_kv_dtype(_variants(variants), kv_cache_dtype)
    base = base_request(names[0], flags, None)
    upper = (
        parse_count(flags.max_model_len, "--max-model-len")
        if flags.max_model_len
        else max(s.max_context for s in specs)
    )
    ctxs = compare.contexts(upper)
    series: list[tuple[str, list[int | None]]] = []
    bars: list[tuple[str, int, int, int, int]] = []
    notes: list[str] = []
    for spec in specs:
        for v in vlist:
            label = spec.name if v == "shipped" else f"{spec.name} {v}"
            series.append((label, compare.curve(base, spec, v, ctxs)))
            r = compare.row(dataclasses.replace(base, max_model_len=min(upper, spec.max_context)), spec, v)
            if r.plan is None:
                notes.append(f"{label}: {r.error}" if r.error else f"{label}: does not fit")
            else:
                p = r.plan
                bars.append(
                    (
                        label,
                        p.weight_bytes_per_gpu,
                        p.kv_budget_bytes_per_gpu,
                        p.reserve_bytes_per_gpu,
                        p.memory_bytes_per_gpu,
                    )
                )
    if not any(v is not None for _, curve in series for v in curve):
        first = compare.row(dataclasses.replace(base, max_model_len=min(upper, specs[0].max_context)), specs[0],
                            vlist[0])  # fmt: skip
        raise InfeasibleError(
            f"nothing to plot: no model and variant fits {_gpus_asked(base)}x {base.gpu.name} at any context"
            + (f" ({first.model}: {first.error})" if first.error else "")
        )
    return PlotResult(
        base, ctxs, series, bars, _budget(base, compare.row(base, specs[0], vlist[0])), tuple(notes)
    )


def _gpus_asked(base: PlanRequest) -> int:
    return base.num_gpus or (base.tp or 1) * (base.pp or 1)


def _budget(base: PlanRequest, first: Row) -> str:
    plan = first.plan
    n = plan.cluster.num_gpus if plan else _gpus_asked(base)
    budget = f"{n}x {base.gpu.name}, {base.gpu.memory_bytes / GiB:,.1f} GiB each"
    if base.kv_cache_memory_bytes:
        return budget + f", KV {fmt_gib(base.kv_cache_memory_bytes)}/GPU given"
    if plan and plan.settings.gpu_memory_utilization:
        return budget + f", utilization {plan.settings.gpu_memory_utilization:g}"
    return budget
