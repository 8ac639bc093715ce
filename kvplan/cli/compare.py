"""`kvplan compare table|ladder|plot`: models and KV techniques side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvplan.cli import options as o
from kvplan.cli.app import WholeHelpGroup, console, reports_errors
from kvplan.commands.comparisons import ClusterFlags
from kvplan.errors import UsageError
from kvplan.userdata import chart_path

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    cls=WholeHelpGroup,
    rich_markup_mode=None,  # plain help, as every command's (app.HELP_MARKUP)
    help="Models and KV techniques side by side: a table, the optimisation ladder, charts.",
)

KvCacheDtype = Annotated[
    str,
    typer.Option(
        "--kv-cache-dtype",
        help="The KV dtype of every row: auto (each model's activation dtype) or fp8, int8, int4, ...; "
        "added to each variant as its '+dtype' token (shipped becomes shipped+fp8); a variant naming "
        "its own dtype keeps it.",
    ),
]

OffloadGib = Annotated[
    float,
    typer.Option(
        "--offload-gib", help="CPU memory per GPU added as a KV tier to every row (GiB, over PCIe)."
    ),
]


def _format(fmt: str, json_out: bool) -> str:
    """--json is --format json; a --format outside the four is an error either way."""
    from kvplan.render.rows import FORMATS

    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if json_out and fmt not in ("table", "json"):
        raise UsageError(f"--json is --format json: give one of --json and --format {fmt}")
    return "json" if json_out else fmt


def _echo(text: str, newline: bool) -> None:
    typer.echo(text, nl=newline)


@app.command("table")
@reports_errors
def table_cmd(
    models: o.Models = None,
    variants: o.Variants = "shipped",
    gpus: o.CompareGpus = o.DEFAULT_COMPARE_GPUS,
    max_model_len: o.TableMaxModelLen = None,
    kv_cache_dtype: KvCacheDtype = "auto",
    tensor_parallel_size: o.TensorParallelSize = None,
    pipeline_parallel_size: o.PipelineParallelSize = None,
    gpu_memory_utilization: o.GpuMemoryUtilization = None,
    kv_cache_memory: o.KvCacheMemory = None,
    block_size: o.BlockSize = None,
    data_parallel_size: o.DataParallelSize = None,
    enable_expert_parallel: o.EnableExpertParallel = False,
    offload_gib: OffloadGib = 0.0,
    fmt: o.Format = "table",
    json_out: o.Json = False,
) -> None:
    """One row per model x variant: KV per token, vs MHA, per request, max requests, decode KV read time.

    Each request holds --max-model-len tokens (default 8K, capped at a model's maximum). Default GPUs:
    one node, 8xH100."""
    from kvplan.commands import comparisons
    from kvplan.render import rows as render_rows

    fmt = _format(fmt, json_out)
    cluster = ClusterFlags(
        gpus,
        max_model_len,
        tensor_parallel_size,
        pipeline_parallel_size,
        gpu_memory_utilization,
        kv_cache_memory,
        block_size,
        None,  # no compare figure crosses the network: the flags are estimate's, simulate's and solve's
        None,
        None,
        data_parallel_size,
        enable_expert_parallel,
    )
    result = comparisons.table(models, variants, cluster, offload_gib, kv_cache_dtype)
    if fmt == "table":
        render_rows.print_comparison(result, console())
    else:
        _echo(*render_rows.table_text(result, fmt))


@app.command("ladder")
@reports_errors
def ladder_cmd(
    model: o.Model = "llama3-70b",
    gpus: o.CompareGpus = o.DEFAULT_COMPARE_GPUS,
    max_model_len: o.MaxModelLen = None,
    avg_context: o.AvgContext = None,
    shared_prefix_tokens: o.MaybeSharedPrefixTokens = None,
    prefix_hit_rate: o.PrefixHitRate = 0.5,
    tensor_parallel_size: o.TensorParallelSize = None,
    pipeline_parallel_size: o.PipelineParallelSize = None,
    gpu_memory_utilization: o.GpuMemoryUtilization = None,
    kv_cache_memory: o.KvCacheMemory = None,
    block_size: o.BlockSize = None,
    fmt: o.Format = "table",
    json_out: o.Json = False,
) -> None:
    """The optimisation ladder (README, Comparing models and techniques) for your model and GPUs: naive -> paged -> GQA -> INT8 -> prefix -> MLA + FP8.

    Defaults: --avg-context half of --max-model-len, --shared-prefix-tokens 3/4 of --avg-context,
    --prefix-hit-rate 0.5 (the README's worked example)."""
    from kvplan.commands import comparisons
    from kvplan.render import rows as render_rows

    fmt = _format(fmt, json_out)
    cluster = ClusterFlags(
        gpus,
        max_model_len,
        tensor_parallel_size,
        pipeline_parallel_size,
        gpu_memory_utilization,
        kv_cache_memory,
        block_size,
        None,  # no compare figure crosses the network: the flags are estimate's, simulate's and solve's
        None,
        None,
    )
    result = comparisons.ladder(model, cluster, avg_context, shared_prefix_tokens, prefix_hit_rate)
    if fmt == "table":
        render_rows.print_ladder(result, console())
    else:
        _echo(*render_rows.ladder_text(result, fmt))


def _chart_path(output: str | None) -> Path | None:
    return None if output is None else chart_path(output, "--output")


@app.command("plot")
@reports_errors
def plot_cmd(
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="Write a chart: FILE.png or FILE.svg (needs matplotlib)."),
    ] = None,
    models: o.Models = None,
    variants: o.Variants = "shipped",
    gpus: o.CompareGpus = o.DEFAULT_COMPARE_GPUS,
    max_model_len: o.PlotMaxModelLen = None,
    kv_cache_dtype: KvCacheDtype = "auto",
    tensor_parallel_size: o.TensorParallelSize = None,
    pipeline_parallel_size: o.PipelineParallelSize = None,
    gpu_memory_utilization: o.GpuMemoryUtilization = None,
    kv_cache_memory: o.KvCacheMemory = None,
    block_size: o.BlockSize = None,
    data_parallel_size: o.DataParallelSize = None,
    enable_expert_parallel: o.EnableExpertParallel = False,
    json_out: o.Json = False,
) -> None:
    """Max concurrency vs context (log axis) and the memory per GPU, per model/variant; in the terminal too.

    --max-model-len is the longest context on the x axis (default: the longest model maximum)."""
    from kvplan.commands import comparisons
    from kvplan.render import chart as render_chart

    path = _chart_path(output)
    cluster = ClusterFlags(
        gpus,
        max_model_len,
        tensor_parallel_size,
        pipeline_parallel_size,
        gpu_memory_utilization,
        kv_cache_memory,
        block_size,
        None,  # no compare figure crosses the network: the flags are estimate's, simulate's and solve's
        None,
        None,
        data_parallel_size,
        enable_expert_parallel,
    )
    result = comparisons.plot(models, variants, cluster, kv_cache_dtype)
    if json_out:
        from kvplan.render.jsonout import plot_json, to_json

        if path is not None:
            render_chart.write_chart(path, result)
        typer.echo(to_json(plot_json(result, path)))
        return
    render_chart.print_curve(result, console())
    if path is None:
        return
    render_chart.write_chart(path, result)
    console().print(f"wrote {path} ({path.stat().st_size:,} bytes)", highlight=False)
