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
    gpu: Annotated[
        str, typer.Option("--gpu", help="GPU type(s) to consider, comma-separated: H100 or H100,H200,B200.")
    ] = "H100",
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
        typer.Option("--price", help="Price per GPU-hour, one per --gpu type (e.g. 2.5,3.8): rank by cost."),
    ] = None,
    max_context: Annotated[
        bool,
        typer.Option(
            "--max-context", help="Instead: on --gpus, the longest context --users requests can have."
        ),
    ] = False,
    gpus: o.MaybeGpus = None,
    engine: o.Engine = "vllm",
    block_size: o.BlockSize = None,
    gpu_memory_utilization: o.GpuMemoryUtilization = None,
    top: Annotated[int, typer.Option("--top", help="How many answers to show.")] = 5,
    json_out: o.Json = False,
) -> None:
    """The inverse question: the fewest (or cheapest) GPUs, layout and KV dtype for N users; or the longest context.

    --max-model-len is the context each request needs (not with --max-context); --gpus goes with
    --max-context: the GPUs you have, e.g. 8xH200."""
    flags = {k: v for k, v in locals().items() if k != "json_out"}  # the query's inputs
    from kvplan import inputs

    q, answers = inputs.solve(inputs.SolveFlags(**flags))
    if json_out:
        from kvplan.render.jsonout import solve_json, to_json

        typer.echo(to_json(solve_json(q, answers, max_context)))
        return
    from kvplan.render.tables import render_solve

    render_solve(q, answers, console(), max_context)
