"""`kvplan check-log`."""

from __future__ import annotations

from typing import Annotated

import typer

from kvplan.cli import options as o
from kvplan.cli.app import console, reports_errors


@reports_errors
def check_log(
    log_file: Annotated[
        str | None, typer.Argument(help="A vLLM or SGLang startup log; '-' or nothing reads stdin.")
    ] = None,
    model: o.MaybeModel = None,
    gpus: o.MaybeGpus = None,
    engine_version: o.EngineVersion = None,
    gpu_memory_utilization: o.GpuMemoryUtilization = None,
    mem_fraction_static: o.MemFractionStatic = None,
    block_size: o.BlockSize = None,
    max_num_batched_tokens: o.MaybeMaxNumBatchedTokens = None,
    kv_cache_dtype: o.MaybeKvCacheDtype = None,
    weight_dtype: o.WeightDtype = None,
    save_calibration: Annotated[
        bool,
        typer.Option(
            "--save-calibration",
            help="Save the measured non-KV memory for this model/GPU/engine/layout; estimate then uses it.",
        ),
    ] = False,
    json_out: o.Json = False,
) -> None:
    """Hold a pasted vLLM/SGLang startup log against kvplan: the same numbers, side by side, and why they differ.

    The model, GPU and engine settings come from the log; the flags fill in what it does not say."""
    from kvplan.commands import inputs

    overrides = {
        "engine_version": engine_version,
        "gpu_memory_utilization": gpu_memory_utilization,
        "mem_fraction_static": mem_fraction_static,
        "block_size": block_size,
        "max_num_batched_tokens": max_num_batched_tokens,
        "kv_cache_dtype": kv_cache_dtype,
        "weight_dtype": weight_dtype,
    }
    checked = inputs.check_log(log_file, model, gpus, overrides, save_calibration)
    if json_out:
        from kvplan.render.jsonout import check_json, to_json

        typer.echo(to_json(check_json(checked.result, checked.saved)))
        return
    from kvplan.render.tables import render_check

    render_check(checked.result, console(), checked.source, checked.saved)
