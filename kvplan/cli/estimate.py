"""`kvplan estimate`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from kvplan.cli import options as o
from kvplan.cli.app import console, reports_errors

if TYPE_CHECKING:
    from kvplan.commands.inputs import EstimateFlags

# Flags only estimate has (the shared ones are in options.py).
KvQuantGroupSize = Annotated[
    int | None,
    typer.Option(
        "--kv-quant-group-size",
        help="Values per quantization group for int8/int4/int2 KV (0: one scale per layer). Default: int4/int2 64, int8/fp8 0.",
    ),
]
KvQuantScaleBits = Annotated[
    int | None, typer.Option("--kv-quant-scale-bits", help="Bits of each group scale (default 16).")
]
KvQuantZeroPoint = Annotated[
    bool | None,
    typer.Option(
        "--kv-quant-zero-point/--kv-quant-no-zero-point",
        help="Store a zero-point per group too (default: yes for int4/int2).",
    ),
]
EnablePrefixCaching = Annotated[
    bool | None,
    typer.Option(
        "--enable-prefix-caching/--no-enable-prefix-caching",
        help="As in vLLM (on by default); sharing is modelled when --shared-prefix-tokens is given.",
    ),
]
MaxNumSeqs = Annotated[
    int | None, typer.Option("--max-num-seqs", help="Cap on concurrent requests, as the engine's flag.")
]
ReserveMemory = Annotated[
    str | None,
    typer.Option(
        "--reserve-memory",
        help="vLLM: activation/workspace reserve per GPU; SGLang: memory in use at startup. Replaces the estimate.",
    ),
]
NumGpuBlocksOverride = Annotated[
    int | None,
    typer.Option("--num-gpu-blocks-override", help="vLLM: KV blocks per GPU; replaces the computed budget."),
]
DisableHybridKvCacheManager = Annotated[
    bool,
    typer.Option(
        "--disable-hybrid-kv-cache-manager", help="vLLM: treat sliding-window layers as full attention."
    ),
]
EnforceEager = Annotated[
    bool, typer.Option("--enforce-eager", help="vLLM: no CUDA graphs (none reserved for them).")
]
SwaFullTokensRatio = Annotated[
    float | None,
    typer.Option(
        "--swa-full-tokens-ratio",
        help="SGLang: sliding-window pool size / full-attention pool (default 0.8, SGLang's).",
    ),
]
DisableHybridSwaMemory = Annotated[
    bool, typer.Option("--disable-hybrid-swa-memory", help="SGLang: one pool for all layers, no SWA pool.")
]
MambaSsmCacheDtype = Annotated[
    str | None,
    typer.Option(
        "--mamba-ssm-cache-dtype",
        "--mamba-ssm-dtype",
        help="Recurrent (SSM) state dtype of hybrid Mamba/DeltaNet models: float32, float16, bfloat16 "
        "(default: the config's, else the engine's).",
    ),
]
ImagesPerRequest = Annotated[
    int | None,
    typer.Option(
        "--images-per-request", help="Images a request carries (cross-attention models; default: the spec's)."
    ),
]
Calibration = Annotated[
    bool,
    typer.Option(
        "--calibration/--no-calibration",
        help="Use what this machine measured: a non-KV overhead saved by `check-log --save-calibration` "
        "and a bandwidth profile from `kvplan calibrate` for this GPU.",
    ),
]
CalibrationFile = Annotated[
    str | None,
    typer.Option("--calibration-file", help="A `kvplan calibrate` profile to take decode bandwidth from."),
]
ForceCalibration = Annotated[
    bool,
    typer.Option(
        "--force-calibration",
        help="Use a calibration profile measured on another device (a CPU, another GPU) anyway; the "
        "output says so.",
    ),
]
Usage = Annotated[
    str,
    typer.Option(
        "--usage",
        help="vLLM's usage context: serve (`vllm serve`) or offline (the LLM class); picks its batch defaults.",
    ),
]
Runner = Annotated[
    str,
    typer.Option(
        "--runner",
        help="vLLM's --runner: auto (pooling when the model folder has a sentence-transformers "
        "modules.json or its architecture is an embedding/classifier), generate, or pooling (no sampler).",
    ),
]
Dtype = Annotated[
    str,
    typer.Option(
        "--dtype",
        help="Model dtype: auto, bfloat16, float16 (half), float32 (float). Sets the activations, the KV "
        "cache under --kv-cache-dtype auto and an unquantized checkpoint's weights (auto: the config's; "
        "float32 configs: vLLM bfloat16, SGLang float16).",
    ),
]
CpuOffloadGb = Annotated[
    float,
    typer.Option(
        "--cpu-offload-gb",
        help="GiB of weights per GPU kept in CPU memory (vLLM and SGLang: whole layers until reached).",
    ),
]
MaxTotalTokens = Annotated[
    int | None, typer.Option("--max-total-tokens", help="SGLang: cap on the KV pool's tokens per GPU.")
]
MaxRunningRequests = Annotated[
    int | None, typer.Option("--max-running-requests", help="SGLang: cap on running requests.")
]
ChunkedPrefillSize = Annotated[
    int | None,
    typer.Option(
        "--chunked-prefill-size",
        help="SGLang: prefill chunk in tokens (-1: no chunking); sizes its default --mem-fraction-static "
        "(default: 2K-16K by card).",
    ),
]
Env = Annotated[
    list[str] | None,
    typer.Option(
        "--env",
        help="An engine environment variable NAME=VALUE (repeatable), e.g. "
        "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0 (default: the release's).",
    ),
]
EnableDpAttention = Annotated[
    bool,
    typer.Option(
        "--enable-dp-attention",
        help="SGLang: attention over TP / --dp-size GPUs, each rank with its own requests and KV pool.",
    ),
]
EpSize = Annotated[
    int | None,
    typer.Option(
        "--ep-size", "--expert-parallel-size", help="SGLang: GPUs the routed experts are spread over."
    ),
]
MoeA2aBackend = Annotated[
    str | None,
    typer.Option(
        "--moe-a2a-backend", help="SGLang: none, deepep, mooncake, flashinfer (all but none set EP = TP)."
    ),
]
Explain = Annotated[bool, typer.Option("--explain", help="Trace each number to its formula and spec field.")]
Disaggregated = Annotated[
    bool,
    typer.Option(
        "--disaggregated",
        help="Disaggregated prefill/decode: plan --prefill-gpus and --decode-gpus as two pools (--gpus "
        "unused) and report the KV each request moves and which pool binds; needs --input-len/--output-len.",
    ),
]
PrefillGpus = Annotated[
    str | None,
    typer.Option("--prefill-gpus", help="With --disaggregated: the prefill pool, e.g. 4xH100."),
]
DecodeGpus = Annotated[
    str | None,
    typer.Option("--decode-gpus", help="With --disaggregated: the decode pool, e.g. 8xH100."),
]
PrefillTp = Annotated[
    int | None,
    typer.Option(
        "--prefill-tensor-parallel-size",
        "--prefill-tp",
        help="With --disaggregated: the prefill pool's TP (default -tp), its GPUs in replicas of it.",
    ),
]
DecodeTp = Annotated[
    int | None,
    typer.Option(
        "--decode-tensor-parallel-size",
        "--decode-tp",
        help="With --disaggregated: the decode pool's TP (default -tp), its GPUs in replicas of it.",
    ),
]


@reports_errors
def estimate(
    model: o.Model,
    gpus: o.Gpus = o.DEFAULT_GPUS,
    max_model_len: o.AutoMaxModelLen = None,
    avg_context: o.AvgContext = None,
    input_len: o.InputLen = None,
    output_len: o.OutputLen = None,
    gpu_memory_utilization: o.GpuMemoryUtilization = None,
    kv_cache_dtype: o.KvCacheDtype = "auto",
    kv_quant_group_size: KvQuantGroupSize = None,
    kv_quant_scale_bits: KvQuantScaleBits = None,
    kv_quant_zero_point: KvQuantZeroPoint = None,
    weight_dtype: o.WeightDtype = None,
    block_size: o.BlockSize = None,
    tensor_parallel_size: o.TensorParallelSize = None,
    pipeline_parallel_size: o.PipelineParallelSize = None,
    enable_prefix_caching: EnablePrefixCaching = None,
    shared_prefix_tokens: o.SharedPrefixTokens = "0",
    prefix_hit_rate: o.PrefixHitRate = 1.0,
    max_num_batched_tokens: o.MaybeMaxNumBatchedTokens = None,
    max_num_seqs: MaxNumSeqs = None,
    kv_cache_memory: o.KvCacheMemory = None,
    reserve_memory: ReserveMemory = None,
    engine: o.Engine = "vllm",
    engine_version: o.EngineVersion = None,
    num_gpu_blocks_override: NumGpuBlocksOverride = None,
    disable_hybrid_kv_cache_manager: DisableHybridKvCacheManager = False,
    enforce_eager: EnforceEager = False,
    mem_fraction_static: o.MemFractionStatic = None,
    swa_full_tokens_ratio: SwaFullTokensRatio = None,
    disable_hybrid_swa_memory: DisableHybridSwaMemory = False,
    mamba_ssm_cache_dtype: MambaSsmCacheDtype = None,
    images_per_request: ImagesPerRequest = None,
    calibration: Calibration = True,
    calibration_file: CalibrationFile = None,
    force_calibration: ForceCalibration = False,
    usage: Usage = "serve",
    runner: Runner = "auto",
    dtype: Dtype = "auto",
    cpu_offload_gb: CpuOffloadGb = 0.0,
    max_total_tokens: MaxTotalTokens = None,
    max_running_requests: MaxRunningRequests = None,
    chunked_prefill_size: ChunkedPrefillSize = None,
    env: Env = None,
    network: o.Network = None,
    network_gbps: o.NetworkGbps = None,
    network_latency_us: o.NetworkLatencyUs = None,
    data_parallel_size: o.DataParallelSize = None,
    enable_expert_parallel: o.EnableExpertParallel = False,
    enable_dp_attention: EnableDpAttention = False,
    ep_size: EpSize = None,
    moe_a2a_backend: MoeA2aBackend = None,
    num_redundant_experts: o.NumRedundantExperts = 0,
    enable_eplb: o.EnableEplb = False,
    moe_imbalance: o.MoeImbalance = 1.0,
    speculative_config: o.SpeculativeConfig = None,
    speculative_algorithm: o.SpeculativeAlgorithm = None,
    speculative_num_steps: o.SpeculativeNumSteps = None,
    speculative_num_draft_tokens: o.SpeculativeNumDraftTokens = None,
    acceptance_length: o.AcceptanceLength = None,
    speculative_draft_config: o.SpeculativeDraftConfig = None,
    json_out: o.Json = False,
    explain: Explain = False,
    disaggregated: Disaggregated = False,
    prefill_gpus: PrefillGpus = None,
    decode_gpus: DecodeGpus = None,
    prefill_tensor_parallel_size: PrefillTp = None,
    decode_tensor_parallel_size: DecodeTp = None,
) -> None:
    """How a model fits on GPUs: weights, KV budget, KV per token, pool tokens, concurrent requests."""
    pools = (
        disaggregated,
        prefill_gpus,
        decode_gpus,
        prefill_tensor_parallel_size,
        decode_tensor_parallel_size,
    )
    flags = {k: v for k, v in locals().items() if k not in ("json_out", "explain", "pools", *_DISAGG)}
    from kvplan.commands import inputs

    if (
        disaggregated
        or prefill_gpus
        or decode_gpus
        or prefill_tensor_parallel_size is not None
        or decode_tensor_parallel_size is not None
    ):
        from kvplan.errors import UsageError

        # nothing given is silently dropped: the pools replace --gpus, and --explain is one plan's; a pool flag
        # without --disaggregated is named first (_disaggregated), not --gpus
        if disaggregated and gpus != o.DEFAULT_GPUS:
            raise UsageError("--gpus: with --disaggregated the pools are --prefill-gpus and --decode-gpus")
        if disaggregated and explain:
            raise UsageError(
                "--explain: not with --disaggregated; run estimate on each pool's GPUs to explain it"
            )
        _disaggregated(inputs.EstimateFlags(**flags), pools, json_out)
        return
    from kvplan.plan.plan import estimate as run_estimate

    req = inputs.plan_request(inputs.EstimateFlags(**flags))
    for warning in req.model.warnings:  # before planning: an infeasible verdict may rest on them too
        typer.echo(f"warning: {warning}", err=True)
    if req.calibration_use is not None and req.calibration_use.warning:
        typer.echo(f"warning: {req.calibration_use.warning}", err=True)
    plan = run_estimate(req)
    if json_out:
        from kvplan.render.jsonout import to_json

        typer.echo(to_json(plan.to_dict()))
        return
    from kvplan.render.tables import render_plan

    render_plan(plan, console(), explain=explain)


_DISAGG = (
    "disaggregated",
    "prefill_gpus",
    "decode_gpus",
    "prefill_tensor_parallel_size",
    "decode_tensor_parallel_size",
)


def _disaggregated(
    flags: EstimateFlags, pools: tuple[bool, str | None, str | None, int | None, int | None], json_out: bool
) -> None:
    from kvplan.commands import inputs
    from kvplan.errors import UsageError
    from kvplan.plan.disagg import disaggregate

    on, prefill_gpus, decode_gpus, prefill_tp, decode_tp = pools
    if not on:
        given = [
            flag
            for flag, v in (
                ("--prefill-gpus", prefill_gpus), ("--decode-gpus", decode_gpus),
                ("--prefill-tp", prefill_tp), ("--decode-tp", decode_tp),
            )
            if v is not None
        ]  # fmt: skip
        verb = "needs" if len(given) == 1 else "need"
        raise UsageError(
            f"{', '.join(given[:-1])}{' and ' if len(given) > 1 else ''}{given[-1]} {verb} --disaggregated"
        )
    p_req, d_req = inputs.disaggregated_requests(flags, prefill_gpus, decode_gpus, prefill_tp, decode_tp)
    for warning in p_req.model.warnings:  # one model: its warnings once
        typer.echo(f"warning: {warning}", err=True)
    for req in (p_req, d_req):
        if req.calibration_use is not None and req.calibration_use.warning:
            typer.echo(f"warning: {req.calibration_use.warning}", err=True)
    assert prefill_gpus is not None and decode_gpus is not None  # disaggregated_requests checked
    result = disaggregate(p_req, d_req, prefill_gpus, decode_gpus)
    if json_out:
        from kvplan.render.jsonout import to_json

        typer.echo(to_json(result.to_dict()))
        return
    from kvplan.render.tables import render_disaggregated

    render_disaggregated(result, console())
