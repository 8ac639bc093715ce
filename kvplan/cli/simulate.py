"""`kvplan simulate`."""

from __future__ import annotations

import warnings
from typing import Annotated

import typer

from kvplan.cli import estimate as e
from kvplan.cli import options as o
from kvplan.cli.app import console, reports_errors


@reports_errors
def simulate(
    model: o.Model,
    gpus: o.Gpus = o.DEFAULT_GPUS,
    max_model_len: o.AutoMaxModelLen = None,
    kv_cache_dtype: o.KvCacheDtype = "auto",
    weight_dtype: o.WeightDtype = None,
    block_size: o.BlockSize = None,
    tensor_parallel_size: o.TensorParallelSize = None,
    pipeline_parallel_size: o.PipelineParallelSize = None,
    gpu_memory_utilization: o.GpuMemoryUtilization = None,
    mem_fraction_static: o.MemFractionStatic = None,
    kv_cache_memory: o.KvCacheMemory = None,
    engine: o.Engine = "vllm",
    engine_version: o.EngineVersion = None,
    max_num_batched_tokens: o.MaybeMaxNumBatchedTokens = None,
    max_num_seqs: e.MaxNumSeqs = None,
    num_gpu_blocks_override: e.NumGpuBlocksOverride = None,
    max_running_requests: e.MaxRunningRequests = None,
    chunked_prefill_size: e.ChunkedPrefillSize = None,
    calibration: e.Calibration = True,
    calibration_file: e.CalibrationFile = None,
    force_calibration: e.ForceCalibration = False,
    network: o.Network = None,
    network_gbps: o.NetworkGbps = None,
    network_latency_us: o.NetworkLatencyUs = None,
    data_parallel_size: o.DataParallelSize = None,
    enable_expert_parallel: o.EnableExpertParallel = False,
    enable_dp_attention: e.EnableDpAttention = False,
    ep_size: e.EpSize = None,
    moe_a2a_backend: e.MoeA2aBackend = None,
    num_redundant_experts: o.NumRedundantExperts = 0,
    enable_eplb: o.EnableEplb = False,
    moe_imbalance: o.MoeImbalance = 1.0,
    speculative_config: o.SpeculativeConfig = None,
    speculative_algorithm: o.SpeculativeAlgorithm = None,
    speculative_num_steps: o.SpeculativeNumSteps = None,
    speculative_num_draft_tokens: o.SpeculativeNumDraftTokens = None,
    acceptance_length: o.AcceptanceLength = None,
    speculative_draft_config: o.SpeculativeDraftConfig = None,
    enable_prefix_caching: Annotated[
        bool | None,
        typer.Option(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            help="vLLM prefix caching / SGLang radix cache (on by default in both; vLLM V0, before 0.8: off).",
        ),
    ] = None,
    trace: Annotated[
        str | None, typer.Option("--trace", help="Replay a Mooncake .jsonl or an Azure LLM trace .csv.")
    ] = None,
    num_prompts: Annotated[
        int | None, typer.Option("--num-prompts", help="Requests (default 1000; with --trace, the first N).")
    ] = None,
    input_len: Annotated[
        str | None, typer.Option("--input-len", help="Prompt tokens (random dataset; default 1024).")
    ] = None,
    output_len: Annotated[
        str | None, typer.Option("--output-len", help="Output tokens (random dataset; default 128).")
    ] = None,
    range_ratio: Annotated[
        float, typer.Option("--range-ratio", help="Lengths uniform in len x [1 - r, 1 + r], as vLLM's.")
    ] = 0.0,
    length_histogram: Annotated[
        str | None,
        typer.Option("--length-histogram", help="Draw lengths from a CSV of input_len,output_len,weight."),
    ] = None,
    request_rate: Annotated[
        float, typer.Option("--request-rate", help="Requests/s, Poisson or gamma (inf: all at t = 0).")
    ] = float("inf"),
    burstiness: Annotated[
        float, typer.Option("--burstiness", help="Gamma shape of the gaps (1: Poisson; < 1 burstier).")
    ] = 1.0,
    max_concurrency: Annotated[
        int | None, typer.Option("--max-concurrency", help="Clients: at most N requests in flight.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed (same seed, same result).")] = 0,
    ttft_ms: Annotated[float | None, typer.Option("--ttft-ms", help="Goodput: TTFT target (ms).")] = None,
    tpot_ms: Annotated[float | None, typer.Option("--tpot-ms", help="Goodput: TPOT target (ms).")] = None,
    plot: Annotated[
        str | None, typer.Option("--plot", help="Write KV usage and latency to FILE.png or FILE.svg.")
    ] = None,
    json_out: o.Json = False,
) -> None:
    """Serve a workload on the deployment `estimate` plans, scheduled by the engine's own rules:
    TTFT, TPOT, ITL, latency, throughput, goodput, prefix-cache hits, preemptions, KV usage."""
    flags = {k: v for k, v in locals().items() if k not in ("json_out", "plot")}
    from kvplan import api
    from kvplan.simulator.progress import progress_bar
    from kvplan.simulator.render import plot_target

    if plot is not None:
        plot_target(plot)  # a bad --plot is refused before the run, not after it

    with warnings.catch_warnings(record=True) as said, progress_bar(enabled=not json_out) as progress:
        warnings.simplefilter("always")
        result = api.simulate(progress=progress, **flags)
    for warning in dict.fromkeys(
        str(w.message) for w in said
    ):  # the spec's and a forced profile's, once each
        typer.echo(f"warning: {warning}", err=True)
    chart = None
    if plot is not None:
        from kvplan.simulator.render import plot as write_plot

        chart = write_plot(result, plot)
    if json_out:
        from kvplan.render.jsonout import to_json

        typer.echo(to_json({**result.to_dict(), "chart": chart}))
        return
    from kvplan.simulator.render import render

    render(result, console())
    if chart:
        typer.echo(f"chart: {chart}")
