"""`kvplan solve`."""

from __future__ import annotations

from typing import Annotated

import typer

from kvplan.cli import options as o
from kvplan.cli.app import console, reports_errors


@reports_errors
def solve(
    model: o.Model,
    users: Annotated[int, typer.Option("--users", "-u", help="Concurrent requests to serve.")],
    max_model_len: o.MaxModelLen = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus",
            "-g",
            help="GPU types to search, comma-separated: H100 (default) or H100,H200,B200; "
            "with --max-context, the GPUs you have: 8xH200.",
        ),
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", hidden=True, help="Old name of --gpus.")] = None,
    tpot_ms: Annotated[
        float | None,
        typer.Option("--tpot-ms", help="Time per output token at full load must stay under this."),
    ] = None,
    kv_cache_dtype: Annotated[
        str,
        typer.Option(
            "--kv-cache-dtype", help="any (the engine's: auto, fp8) or a comma list, e.g. auto or fp8."
        ),
    ] = "any",
    max_gpus: Annotated[int, typer.Option("--max-gpus", help="Largest GPU count to consider.")] = 64,
    price: Annotated[
        str | None,
        typer.Option(
            "--price",
            help="Price per GPU-hour, one per --gpus type (e.g. 2.5,3.8), in any currency: rank by cost.",
        ),
    ] = None,
    max_context: Annotated[
        bool,
        typer.Option(
            "--max-context", help="Instead: on --gpus, the longest context --users requests can have."
        ),
    ] = False,
    engine: o.Engine = "vllm",
    block_size: o.BlockSize = None,
    gpu_memory_utilization: o.GpuMemoryUtilization = None,
    top: Annotated[int, typer.Option("--top", help="How many answers to show.")] = 5,
    no_calibration: Annotated[
        bool,
        typer.Option(
            "--no-calibration",
            help="Ignore the GPUs' saved `kvplan calibrate` profiles (else decode is timed with them).",
        ),
    ] = False,
    calibration_file: Annotated[
        str | None,
        typer.Option(
            "--calibration-file",
            help="A `kvplan calibrate` profile to time decode with, for every GPU type searched.",
        ),
    ] = None,
    force_calibration: Annotated[
        bool,
        typer.Option(
            "--force-calibration",
            help="Use a --calibration-file measured on another device (a CPU, another GPU) anyway; "
            "says so on stderr.",
        ),
    ] = False,
    avg_context: o.AvgContext = None,
    input_len: o.InputLen = None,
    output_len: o.OutputLen = None,
    partial_nodes: Annotated[
        bool,
        typer.Option(
            "--partial-nodes",
            help="Answers may use part of a node (e.g. 2 of its 8 GPUs) when less than a node serves; "
            "default: whole nodes, as they are rented.",
        ),
    ] = False,
    network: o.Network = None,
    network_gbps: o.NetworkGbps = None,
    network_latency_us: o.NetworkLatencyUs = None,
    json_out: o.Json = False,
) -> None:
    """The inverse question: the fewest (or cheapest) GPUs, layout and KV dtype for N users; or the longest context.

    --max-model-len is the context each request needs (not with --max-context); with --max-context,
    --gpus is the GPUs you have, e.g. 8xH200. --gpu is an old name of --gpus. TPOT is at every request's
    full context unless --input-len/--output-len (the mean over a decode) or --avg-context say otherwise."""
    flags = {k: v for k, v in locals().items() if k not in ("json_out", "gpu", "no_calibration")}
    flags["calibration"] = not no_calibration
    from kvplan.commands import inputs
    from kvplan.errors import UsageError

    if gpu is not None and gpus is not None:
        raise UsageError("--gpu is an old name of --gpus: give one of them")
    flags.update(gpus=gpus if gpu is None else gpu, gpus_flag="--gpus" if gpu is None else "--gpu")
    q, answers = inputs.solve(inputs.SolveFlags(**flags))
    for warning in inputs.solve_warnings(q):
        typer.echo(f"warning: {warning}", err=True)
    if json_out:
        from kvplan.render.jsonout import solve_json, to_json

        typer.echo(to_json(solve_json(q, answers, max_context)))
        return
    from kvplan.render.tables import render_solve

    render_solve(q, answers, console(), max_context)
