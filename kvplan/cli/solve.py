"""`kvplan solve`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from kvplan.cli import options as o
from kvplan.cli.app import console, reports_errors

if TYPE_CHECKING:
    from kvplan.commands.inputs import LoadFlags, SolveFlags


@reports_errors
def solve(
    model: o.Model,
    users: Annotated[
        int | None,
        typer.Option(
            "--users", "-u", help="Concurrent requests to serve (not with --request-rate/--max-rate)."
        ),
    ] = None,
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
    calibration: Annotated[
        bool,
        typer.Option(
            "--calibration/--no-calibration",
            help="Time decode with the GPUs' saved `kvplan calibrate` profiles (the default), or not.",
        ),
    ] = True,
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
    moe_imbalance: o.MoeImbalance = 1.0,
    speculative_config: o.SpeculativeConfig = None,
    speculative_algorithm: o.SpeculativeAlgorithm = None,
    speculative_num_steps: o.SpeculativeNumSteps = None,
    speculative_num_draft_tokens: o.SpeculativeNumDraftTokens = None,
    acceptance_length: o.AcceptanceLength = None,
    speculative_draft_config: o.SpeculativeDraftConfig = None,
    request_rate: Annotated[
        float | None,
        typer.Option(
            "--request-rate",
            help="Instead of --users: the fewest GPUs serving R requests/s within --ttft-ms/--tpot-ms (simulated).",
        ),
    ] = None,
    max_rate: Annotated[
        bool,
        typer.Option(
            "--max-rate", help="Instead: on --gpus NxGPU, the highest request rate meeting the targets."
        ),
    ] = False,
    ttft_ms: Annotated[
        float | None, typer.Option("--ttft-ms", help="With --request-rate/--max-rate: the TTFT target (ms).")
    ] = None,
    percentile: Annotated[
        int, typer.Option("--percentile", help="With --request-rate/--max-rate: targets at p50, p90 or p99.")
    ] = 90,
    num_prompts: Annotated[
        int | None, typer.Option("--num-prompts", help="Requests simulated per load (default 1000).")
    ] = None,
    range_ratio: Annotated[
        float, typer.Option("--range-ratio", help="Lengths uniform in len x [1 - r, 1 + r], as vLLM's.")
    ] = 0.0,
    burstiness: Annotated[
        float, typer.Option("--burstiness", help="Gamma shape of the gaps (1: Poisson).")
    ] = 1.0,
    trace: Annotated[
        str | None,
        typer.Option("--trace", help="Replay a Mooncake .jsonl or Azure .csv, stretched to each rate."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the workload.")] = 0,
    plot: Annotated[
        str | None, typer.Option("--plot", help="With --max-rate: TTFT/TPOT vs rate to FILE.png or .svg.")
    ] = None,
    disaggregated: Annotated[
        bool,
        typer.Option(
            "--disaggregated",
            help="With --request-rate: a prefill pool and a decode pool (the split), beside the colocated answer.",
        ),
    ] = False,
    json_out: o.Json = False,
) -> None:
    """The inverse question: the fewest (or cheapest) GPUs, layout and KV dtype for N users; or the longest context.

    --max-model-len is the context each request needs (not with --max-context); with --max-context,
    --gpus is the GPUs you have, e.g. 8xH200. --gpu is an old name of --gpus. TPOT is at every request's
    full context unless --input-len/--output-len (the mean over a decode) or --avg-context say otherwise."""
    given = dict(locals())
    load_names = ("request_rate", "max_rate", "ttft_ms", "percentile", "num_prompts", "range_ratio",
                  "burstiness", "trace", "seed", "disaggregated")  # fmt: skip
    flags = {k: v for k, v in given.items() if k not in ("json_out", "gpu", "plot", *load_names)}
    from kvplan.commands import inputs
    from kvplan.errors import UsageError

    if gpu is not None and gpus is not None:
        raise UsageError("--gpu is an old name of --gpus: give one of them")
    flags.update(gpus=gpus if gpu is None else gpu, gpus_flag="--gpus" if gpu is None else "--gpu")
    if request_rate is not None or max_rate:
        if users is not None or max_context:
            raise UsageError(
                "--request-rate/--max-rate answer by simulation: not with --users or --max-context"
            )
        if plot is not None and disaggregated:
            raise UsageError(
                "--plot: --disaggregated draws no chart (its answer is two pools' sizes); leave it out"
            )
        load = inputs.LoadFlags(
            **{k: given[k] for k in load_names},
            input_len=input_len,
            output_len=output_len,
        )
        flags.update(users=1, input_len=None, output_len=None)
        _solve_load(inputs.SolveFlags(**flags), load, plot, json_out)
        return
    if users is None:
        raise UsageError("give --users N (or --request-rate R / --max-rate with --ttft-ms and --tpot-ms)")
    stray = [flag for flag, on in (
        ("--ttft-ms", ttft_ms is not None), ("--plot", plot is not None), ("--disaggregated", disaggregated),
        ("--num-prompts", num_prompts is not None), ("--range-ratio", range_ratio != 0.0),
        ("--burstiness", burstiness != 1.0), ("--trace", trace is not None), ("--seed", seed != 0),
        ("--percentile", percentile != 90),
    ) if on]  # fmt: skip
    if stray:
        raise UsageError(
            f"{', '.join(stray)} {'goes' if len(stray) == 1 else 'go'} with --request-rate or --max-rate "
            "(a simulated load); --users plans memory and the decode step"
        )
    q, answers = inputs.solve(inputs.SolveFlags(**flags))
    for warning in inputs.solve_warnings(q):
        typer.echo(f"warning: {warning}", err=True)
    if json_out:
        from kvplan.render.jsonout import solve_json, to_json

        typer.echo(to_json(solve_json(q, answers, max_context)))
        return
    from kvplan.render.tables import render_solve

    render_solve(q, answers, console(), max_context)


def _solve_load(f: SolveFlags, load: LoadFlags, plot: str | None, json_out: bool) -> None:
    from kvplan.commands import inputs
    from kvplan.search.rate import ON_SIMULATION
    from kvplan.simulator.progress import count_status
    from kvplan.simulator.render import plot_target

    if plot is not None:
        plot_target(plot)  # refused before the search, not after it
    with count_status("solve: loads", enabled=not json_out) as tick:
        token = ON_SIMULATION.set(tick)
        try:
            ans = inputs.solve_load(f, load)
        finally:
            ON_SIMULATION.reset(token)
    if load.disaggregated:
        if json_out:
            from kvplan.render.jsonout import to_json

            typer.echo(to_json(ans.to_dict()))
            return
        from kvplan.render.tables import render_solve_disaggregated

        render_solve_disaggregated(ans, console())
        return
    chart = None
    if plot is not None:
        from kvplan.simulator.render import plot_load

        chart = plot_load(
            [(p.rate, p.ttft_ms, p.tpot_ms) for p in ans.points],
            load.percentile,
            (load.ttft_ms or 0.0, f.tpot_ms or 0.0),
            f"{ans.layout.num_gpus}x {ans.layout.gpu} (TP {ans.layout.tensor_parallel_size} x DP "
            f"{ans.layout.data_parallel_size}), {ans.result.workload['num_requests']} requests a load",
            plot,
        )
    if json_out:
        from kvplan.render.jsonout import to_json

        typer.echo(to_json({**ans.to_dict(), "chart": chart}))
        return
    from kvplan.render.tables import render_solve_load

    render_solve_load(ans, console())
    if chart:
        typer.echo(f"chart: {chart}")
