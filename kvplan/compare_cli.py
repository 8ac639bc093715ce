"""`kvplan compare table|ladder|plot`: flags, then compare.py, then rendering."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from kvplan.cliutil import load_cluster, reports_errors
from kvplan.errors import UsageError
from kvplan.units import GiB, fmt_bytes, fmt_gib

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Models and KV techniques side by side: a table, the optimisation ladder, charts.",
)

FORMATS = ("table", "md", "csv", "json")

GpusOpt = Annotated[str, typer.Option("--gpus", "-g", help="GPU type and count: 8xH100, 2x8xH200.")]
LenOpt = Annotated[
    str | None, typer.Option("--max-model-len", "--context", help="Context per request (default: 8K).")
]
TpOpt = Annotated[
    int | None, typer.Option("--tensor-parallel-size", "-tp", help="Default: GPUs of one node.")
]
PpOpt = Annotated[int | None, typer.Option("--pipeline-parallel-size", "-pp", help="Default: nodes.")]
UtilOpt = Annotated[
    float | None, typer.Option("--gpu-memory-utilization", help="vLLM's fraction (default 0.92).")
]
KvMemOpt = Annotated[
    str | None,
    typer.Option("--kv-cache-memory", help="KV memory per GPU (50GiB); replaces the computed budget."),
]
BlockOpt = Annotated[int | None, typer.Option("--block-size", help="Block size in tokens (default: vLLM's).")]
OffloadOpt = Annotated[
    float,
    typer.Option(
        "--offload-gib", help="CPU memory per GPU added as a KV tier to every row (GiB, over PCIe)."
    ),
]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help="table, md, csv or json.")]


def _base(model_ref: str, gpus: str, max_model_len, tp, pp, util, kv_mem, block_size):
    from kvplan.plan import PlanRequest
    from kvplan.specs.registry import load_model
    from kvplan.units import parse_bytes, parse_count

    gpu, num_gpus, nodes = load_cluster(gpus)
    return PlanRequest(
        model=load_model(model_ref),
        gpu=gpu,
        num_gpus=num_gpus,
        nodes=nodes,
        tp=tp,
        pp=pp,
        max_model_len=parse_count(max_model_len, "--max-model-len") if max_model_len else None,
        gpu_memory_utilization=util,
        kv_cache_memory_bytes=parse_bytes(kv_mem, "--kv-cache-memory") if kv_mem else None,
        block_size=block_size,
    )


def _check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _cluster(base, rows) -> dict[str, Any]:
    plan = next((r.plan for r in rows if r.plan is not None), None)
    out = {"gpu": base.gpu.name, "memory_bytes_per_gpu": base.gpu.memory_bytes}
    if plan is not None:
        out.update(dataclasses.asdict(plan.cluster))
        out["max_model_len"] = plan.settings.max_model_len
    return out


# --- table ----------------------------------------------------------------------------------

_COLUMNS = [
    ("model", "model", None),
    ("variant", "variant", None),
    ("KV/token", "kv_bytes_per_token", "bytes"),
    ("KV/token/GPU", "kv_bytes_per_token_per_gpu", "bytes"),
    ("vs MHA", "ratio_to_mha", "ratio"),
    ("KV/request", "kv_bytes_per_request", "gib"),
    ("max requests", "max_concurrency", "int"),
    ("KV read/step, 1 req", "decode_kv_read_ms_one_request", "ms"),
    ("KV read/step, all", "decode_kv_read_ms", "ms"),
    ("offload read/step", "offload_read_ms", "ms"),
    ("quality (seeds)", "quality", None),
]


def _fmt(kind: str | None, value) -> str:
    if value is None:
        return "-"
    if kind == "bytes":
        return fmt_bytes(value)
    if kind == "gib":
        return fmt_gib(value)
    if kind == "ratio":
        return f"{value:.3f}x"
    if kind == "int":
        return f"{value:,}"
    if kind == "ms":
        return f"{value:,.2f} ms"
    return str(value)


def _emit_rows(rows: list[dict], columns, fmt: str, title: str, footer: list[str]) -> None:
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow([key for _, key, _ in columns])
        for r in rows:
            w.writerow(["" if r[key] is None else r[key] for _, key, _ in columns])
        typer.echo(buf.getvalue(), nl=False)
        return
    if fmt == "md":
        lines = [f"**{title}**", "", "| " + " | ".join(h for h, _, _ in columns) + " |"]
        lines.append("|" + "|".join(" --- " for _ in columns) + "|")
        for r in rows:
            lines.append("| " + " | ".join(_fmt(k, r[key]).replace("|", "/") for _, key, k in columns) + " |")
        lines += [""] + [f"- {f}" for f in footer]
        typer.echo("\n".join(lines))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=False)
    t = Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    for i, (h, _, kind) in enumerate(columns):
        t.add_column(h, justify="left" if kind is None else "right", no_wrap=i < 2)
    for r in rows:
        t.add_row(*[_fmt(k, r[key]) for _, key, k in columns])
    console.print(t)
    for f in footer:
        console.print(f"- {f}", highlight=False)


@app.command("table")
@reports_errors
def table_cmd(
    models: Annotated[
        str | None, typer.Option("--models", help="Comma-separated models (default: the seeds' models).")
    ] = None,
    variants: Annotated[
        str,
        typer.Option(
            "--variants",
            help="Comma-separated what-ifs, each tokens joined by '+': shipped, mha, gqaN, mqa, mlaR, shareN, "
            "windowW, offloadG, fp8/int8/int4/int2 (e.g. shipped,gqa8+int8,mla512+fp8).",
        ),
    ] = "shipped",
    gpus: GpusOpt = "8xH200",
    max_model_len: LenOpt = None,
    tensor_parallel_size: TpOpt = None,
    pipeline_parallel_size: PpOpt = None,
    gpu_memory_utilization: UtilOpt = None,
    kv_cache_memory: KvMemOpt = None,
    block_size: BlockOpt = None,
    offload_gib: OffloadOpt = 0.0,
    fmt: FormatOpt = "table",
) -> None:
    """One row per model x variant: KV per token, vs MHA, per request, max requests, decode KV read time."""
    _table(
        models,
        variants,
        gpus,
        max_model_len,
        tensor_parallel_size,
        pipeline_parallel_size,
        gpu_memory_utilization,
        kv_cache_memory,
        block_size,
        offload_gib,
        fmt,
    )


def _table(models, variants, gpus, max_model_len, tp, pp, util, kv_mem, block_size, offload_gib, fmt) -> None:
    from kvplan import compare
    from kvplan.specs.registry import load_model

    _check_format(fmt)
    names = _split(models) if models else list(compare.DEFAULT_MODELS)
    specs = [load_model(n) for n in names]
    vlist = _split(variants) or ["shipped"]
    if offload_gib < 0:
        raise UsageError("--offload-gib must be >= 0")
    base = _base(names[0], gpus, max_model_len or "8K", tp, pp, util, kv_mem, block_size)
    rows = []
    for spec in specs:  # a model whose maximum is below the context is capped, and the notes say so
        b = base
        if base.max_model_len and base.max_model_len > spec.max_context:
            b = dataclasses.replace(base, max_model_len=spec.max_context)
        rows += compare.table(b, [spec], vlist, offload_gib)
    cluster = _cluster(base, rows)
    footer = _table_footer(rows, cluster, base)
    if fmt == "json":
        typer.echo(
            json.dumps(
                {
                    "schema": compare.SCHEMA,
                    "kind": "table",
                    "cluster": cluster,
                    "rows": [r.to_dict() for r in rows],
                    "notes": footer,
                },
                indent=2,
            )
        )
        return
    title = (
        f"{cluster.get('num_gpus', '?')}x {base.gpu.name}, TP {cluster.get('tensor_parallel_size', '?')}, "
        f"{cluster.get('max_model_len', 0):,} tokens per request"
    )
    _emit_rows([r.to_dict() for r in rows], _COLUMNS, fmt, title, footer)


def _table_footer(rows, cluster, base) -> list[str]:
    notes = [
        "vs MHA: KV bytes per token against the same model with one K/V head per query head, in bf16",
        "KV read/step: the KV bytes a decode step reads on one GPU (one request at the full context, or every "
        f"request at max requests) at {base.gpu.name}'s datasheet HBM bandwidth "
        f"({base.gpu.hbm_bytes_per_s / 1e12:.2f} TB/s), weights excluded",
    ]
    tp = cluster.get("tensor_parallel_size", 1)
    if tp > 1 and any(r.plan and "MLA" in r.attention for r in rows):
        notes.append(
            f"MLA: vLLM keeps the whole latent on each of the {tp} TP ranks (engines.md), so per GPU it can hold "
            f"less than GQA split {tp} ways; engines serving MLA with data-parallel attention hold {tp}x more"
        )
    if any(r.offload_bytes_per_gpu for r in rows):
        notes.append(
            f"offload: CPU memory per GPU added to the KV pool; what spills is read back over PCIe each step at "
            f"{base.gpu.pcie_bytes_per_s / 1e9:.0f} GB/s (seed 000 15.7)"
        )
    capped = {
        r.model for r in rows if r.plan and r.plan.settings.max_model_len < cluster.get("max_model_len", 0)
    }
    for m in sorted(capped):
        notes.append(f"{m}: context capped at its maximum")
    for r in rows:
        if r.error:
            notes.append(f"{r.model} {r.variant}: {r.error}")
    return notes


# --- ladder ---------------------------------------------------------------------------------

_LADDER_COLUMNS = [
    ("step", "step", None),
    ("variant", "variant", None),
    ("max requests", "max_concurrency", "int"),
    ("factor", "factor", "ratio"),
    ("cumulative", "cumulative", "ratio"),
    ("how", "how", None),
]


@app.command("ladder")
@reports_errors
def ladder_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="The model.")] = "llama3-70b",
    gpus: GpusOpt = "8xH100",
    max_model_len: LenOpt = None,
    avg_context: Annotated[
        str | None, typer.Option("--avg-context", help="Tokens a request holds on average (default: half).")
    ] = None,
    shared_prefix_tokens: Annotated[
        str | None,
        typer.Option("--shared-prefix-tokens", help="Shared prefix length (default: 3/4 of --avg-context)."),
    ] = None,
    prefix_hit_rate: Annotated[
        float, typer.Option("--prefix-hit-rate", help="Fraction of requests sharing it (seed: 50%).")
    ] = 0.5,
    tensor_parallel_size: TpOpt = None,
    pipeline_parallel_size: PpOpt = None,
    gpu_memory_utilization: UtilOpt = None,
    kv_cache_memory: KvMemOpt = None,
    block_size: BlockOpt = None,
    fmt: FormatOpt = "table",
) -> None:
    """Seed 000 15.8's ladder for your model and GPUs: naive -> paged -> GQA -> INT8 -> prefix -> MLA + FP8."""
    _ladder(
        model,
        gpus,
        max_model_len,
        avg_context,
        shared_prefix_tokens,
        prefix_hit_rate,
        tensor_parallel_size,
        pipeline_parallel_size,
        gpu_memory_utilization,
        kv_cache_memory,
        block_size,
        fmt,
    )


def _ladder(
    model, gpus, max_model_len, avg_context, shared, hit, tp, pp, util, kv_mem, block_size, fmt
) -> None:

    from kvplan import compare
    from kvplan.units import parse_count

    _check_format(fmt)
    base = _base(model, gpus, max_model_len, tp, pp, util, kv_mem, block_size)
    length = base.max_model_len or base.model.max_context
    base = dataclasses.replace(base, max_model_len=length)
    avg = parse_count(avg_context, "--avg-context") if avg_context else length // 2
    if not 1 <= avg <= length:
        raise UsageError(f"--avg-context must be between 1 and --max-model-len ({length:,})")
    prefix = parse_count(shared, "--shared-prefix-tokens") if shared else avg * 3 // 4
    if not 0 < prefix < avg:
        raise UsageError(f"--shared-prefix-tokens must be between 1 and --avg-context ({avg:,}) - 1")
    if not 0 < hit <= 1:
        raise UsageError(f"--prefix-hit-rate must be in (0, 1], got {hit}")
    steps, shipped = compare.ladder(base, avg, prefix, hit)
    notes = [
        f"every step on the same KV budget: {fmt_gib(shipped.kv_budget_bytes_per_gpu)} per GPU "
        f"({shipped.kv_budget_source}; {base.model.name}'s weights)",
        f"naive preallocates {length:,} tokens per request; later steps hold the {avg:,}-token average "
        "(seed 000 15.4: preallocation wastes what requests do not use)",
        "factor: against the previous step; cumulative: against the first",
    ]
    data = [dataclasses.asdict(s) for s in steps]
    if fmt == "json":
        typer.echo(
            json.dumps(
                {
                    "schema": compare.SCHEMA,
                    "kind": "ladder",
                    "model": base.model.name,
                    "cluster": dataclasses.asdict(shipped.cluster),
                    "max_model_len": length,
                    "avg_context_tokens": avg,
                    "shared_prefix_tokens": prefix,
                    "prefix_hit_rate": hit,
                    "kv_budget_bytes_per_gpu": shipped.kv_budget_bytes_per_gpu,
                    "steps": data,
                    "notes": notes,
                },
                indent=2,
            )
        )
        return
    title = f"{base.model.name} on {shipped.cluster.num_gpus}x {base.gpu.name}: the ladder (seed 000 15.8)"
    _emit_rows(data, _LADDER_COLUMNS, fmt, title, notes)


# --- plot -----------------------------------------------------------------------------------

_BARS = "▁▂▃▄▅▆▇█"


@app.command("plot")
@reports_errors
def plot_cmd(
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="Write a chart: FILE.png or FILE.svg (needs matplotlib)."),
    ] = None,
    models: Annotated[str | None, typer.Option("--models", help="Comma-separated models.")] = None,
    variants: Annotated[
        str, typer.Option("--variants", help="Comma-separated what-ifs (see table).")
    ] = "shipped",
    gpus: GpusOpt = "8xH200",
    max_model_len: Annotated[
        str | None, typer.Option("--max-model-len", "--context", help="Longest context on the x axis.")
    ] = None,
    tensor_parallel_size: TpOpt = None,
    pipeline_parallel_size: PpOpt = None,
    gpu_memory_utilization: UtilOpt = None,
    kv_cache_memory: KvMemOpt = None,
    block_size: BlockOpt = None,
) -> None:
    """Max concurrency vs context (log axis) and the memory per GPU, per model/variant; in the terminal too."""
    _plot(
        output,
        models,
        variants,
        gpus,
        max_model_len,
        tensor_parallel_size,
        pipeline_parallel_size,
        gpu_memory_utilization,
        kv_cache_memory,
        block_size,
    )


def _plot(output, models, variants, gpus, max_model_len, tp, pp, util, kv_mem, block_size) -> None:

    from kvplan import compare
    from kvplan.specs.registry import load_model
    from kvplan.units import parse_count

    path = Path(output) if output else None
    if path is not None and path.suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"--output {output}: the chart is written as .png or .svg; name the file so")
    names = _split(models) if models else list(compare.DEFAULT_MODELS)
    specs = [load_model(n) for n in names]
    vlist = _split(variants) or ["shipped"]
    base = _base(names[0], gpus, None, tp, pp, util, kv_mem, block_size)
    upper = (
        parse_count(max_model_len, "--max-model-len") if max_model_len else max(s.max_context for s in specs)
    )
    ctxs = compare.contexts(upper)
    series = []
    bars = []
    for spec in specs:
        for v in vlist:
            label = spec.name if v == "shipped" else f"{spec.name} {v}"
            series.append((label, compare.curve(base, spec, v, ctxs)))
            r = compare.row(dataclasses.replace(base, max_model_len=min(upper, spec.max_context)), spec, v)
            if r.plan is not None:
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
    plan = next((r for r in [compare.row(base, specs[0], vlist[0])] if r.plan), None)
    n = plan.plan.cluster.num_gpus if plan else "?"
    budget = f"{n}x {base.gpu.name}, {base.gpu.memory_bytes / GiB:,.1f} GiB each" + (
        f", KV {fmt_gib(base.kv_cache_memory_bytes)}/GPU given"
        if base.kv_cache_memory_bytes
        else f", utilization {plan.plan.settings.gpu_memory_utilization:g}"
        if plan and plan.plan.settings.gpu_memory_utilization
        else ""
    )
    _terminal_curve(series, ctxs, budget)
    if path is None:
        return
    _write_chart(path, series, ctxs, bars, budget)
    from rich.console import Console

    Console().print(f"wrote {path} ({path.stat().st_size:,} bytes)", highlight=False)


def _terminal_curve(series, ctxs, budget: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=False)
    t = Table(
        title=f"Max concurrent requests vs context ({budget})",
        title_justify="left",
        title_style="bold",
        show_edge=False,
        pad_edge=False,
    )
    t.add_column("model / variant", no_wrap=True)
    t.add_column("curve", no_wrap=True)
    for c in ctxs:
        t.add_column(f"{c // 1024}K" if c % 1024 == 0 else f"{c:,}", justify="right")
    top = max((v for _, ys in series for v in ys if v), default=1)
    import math

    for label, ys in series:
        spark = "".join(
            " "
            if not y
            else _BARS[
                min(len(_BARS) - 1, int(math.log(y) / math.log(top) * (len(_BARS) - 1))) if top > 1 else 0
            ]
            for y in ys
        )
        t.add_row(label, spark, *["-" if y is None else f"{y:,}" for y in ys])
    console.print(t)


def _write_chart(path: Path, series, ctxs, bars, budget: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--output needs matplotlib: pip install 'kvplan[plot]'") from None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    for label, ys in series:
        pts = [(c, y) for c, y in zip(ctxs, ys, strict=True) if y]
        if pts:
            ax1.plot([c for c, _ in pts], [y for _, y in pts], marker="o", label=label)
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(ctxs, [f"{c // 1024}K" if c % 1024 == 0 else f"{c:,}" for c in ctxs], fontsize=8)
    ax1.minorticks_off()
    ax1.set_yscale("log")
    ax1.set_xlabel("context per request (tokens)")
    ax1.set_ylabel("max concurrent requests")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    labels = [b[0] for b in bars]
    weights = [b[1] / GiB for b in bars]
    kvb = [b[2] / GiB for b in bars]
    res = [b[3] / GiB for b in bars]
    rest = [max(b[4] / GiB - w - k - r, 0) for b, w, k, r in zip(bars, weights, kvb, res, strict=True)]
    xs = range(len(bars))
    ax2.bar(xs, weights, label="weights")
    ax2.bar(xs, kvb, bottom=weights, label="KV cache")
    ax2.bar(xs, res, bottom=[w + k for w, k in zip(weights, kvb, strict=True)], label="reserve (estimated)")
    ax2.bar(
        xs,
        rest,
        bottom=[w + k + r for w, k, r in zip(weights, kvb, res, strict=True)],
        label="not used",
        color="lightgrey",
    )
    ax2.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=8)
    ax2.set_ylabel("GiB per GPU")
    ax2.legend(fontsize=8)
    fig.suptitle(f"kvplan: {budget}")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    try:
        fig.savefig(tmp)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"{path}: cannot write ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)
