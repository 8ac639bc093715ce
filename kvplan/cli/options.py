"""The flags several commands share, each defined once as an `Annotated` type.

A command states the default where it declares the parameter (`gpus: Gpus = "H100"`); the
`Maybe...` forms are the same flag where a command may leave it unset.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer


def _model() -> Any:
    return typer.Option(
        "--model",
        "-m",
        help="Shipped name/alias/HF id, a spec .yaml, a Hugging Face config.json or a folder holding one, "
        "or any Hugging Face Hub id org/name[@revision] (fetched into the HF cache; HF_HUB_OFFLINE=1 reads only the cache).",
    )


# The default GPUs, one rule for every command (README, Commands): the type is H100; a command that
# plans the one deployment you describe (estimate, simulate) takes one card, a comparison of several
# models or steps (compare table, ladder, plot) one node of 8, since its default models (70B and up)
# fit no single card. solve searches H100 and picks the count itself.
DEFAULT_GPUS = "H100"
DEFAULT_COMPARE_GPUS = "8xH100"
_GPUS_HELP = "GPU type and count: H100, 8xH100, 2x8xH100 (nodes x GPUs)."


def _gpus(default_rule: str = "") -> Any:
    return typer.Option("--gpus", "-g", help=_GPUS_HELP + default_rule)


def _max_model_len() -> Any:
    return typer.Option(
        "--max-model-len",
        "--context",
        help="Context length each request may reach (default: the model's maximum). 8192 or 8K.",
    )


def _kv_cache_dtype() -> Any:
    return typer.Option(
        "--kv-cache-dtype",
        help="auto (the model's activation dtype), fp16, bf16, fp32, fp8, fp8_e4m3, fp8_e5m2, int8, int4, int2.",
    )


def _max_num_batched_tokens() -> Any:
    return typer.Option(
        "--max-num-batched-tokens",
        help="Tokens per forward pass; sizes the activation reserve (default: the engine's for the card and --usage).",
    )


def _shared_prefix_tokens() -> Any:
    return typer.Option(
        "--shared-prefix-tokens", help="Tokens of a prefix (system prompt, document) shared across requests."
    )


Model = Annotated[str, _model()]
MaybeModel = Annotated[str | None, _model()]
Gpus = Annotated[str, _gpus(" Default one H100 (compare: one node, 8xH100).")]
CompareGpus = Annotated[str, _gpus(" Default one node, 8xH100 (estimate, simulate: one H100).")]
MaybeGpus = Annotated[str | None, _gpus()]
MaxModelLen = Annotated[str | None, _max_model_len()]
AutoMaxModelLen = Annotated[
    str | None,
    typer.Option(
        "--max-model-len",
        "--context",
        help="Context length each request may reach (default: the model's maximum). 8192 or 8K; auto: "
        "vLLM 0.14+'s fit, the longest one request the KV pool holds.",
    ),
]
TableMaxModelLen = Annotated[
    str | None,
    typer.Option(
        "--max-model-len",
        "--context",
        help="Context each request holds (default 8K; a model whose maximum is lower is capped at "
        "its maximum). 8192 or 8K.",
    ),
]
PlotMaxModelLen = Annotated[
    str | None,
    typer.Option(
        "--max-model-len",
        "--context",
        help="The longest context on the x axis (default: the longest maximum of the models). 8192 or 8K.",
    ),
]
AvgContext = Annotated[
    str | None,
    typer.Option("--avg-context", help="Tokens a request holds on average (concurrency at that length)."),
]
InputLen = Annotated[
    str | None,
    typer.Option("--input-len", help="Prompt tokens of a request: decode speed at input + output / 2."),
]
OutputLen = Annotated[
    str | None,
    typer.Option("--output-len", help="Output tokens of a request (with --input-len)."),
]
SharedPrefixTokens = Annotated[str, _shared_prefix_tokens()]
MaybeSharedPrefixTokens = Annotated[str | None, _shared_prefix_tokens()]
PrefixHitRate = Annotated[
    float, typer.Option("--prefix-hit-rate", help="Fraction of requests that share that prefix.")
]
TensorParallelSize = Annotated[
    int | None, typer.Option("--tensor-parallel-size", "-tp", help="Default: the GPUs of one node.")
]
PipelineParallelSize = Annotated[
    int | None, typer.Option("--pipeline-parallel-size", "-pp", help="Default: the number of nodes.")
]
GpuMemoryUtilization = Annotated[
    float | None,
    typer.Option(
        "--gpu-memory-utilization",
        help="vLLM: fraction of each GPU's memory it may use (default 0.92; 0.9 before vLLM 0.20).",
    ),
]
MemFractionStatic = Annotated[
    float | None,
    typer.Option(
        "--mem-fraction-static", help="SGLang: weights + KV pool as a fraction of memory (default: SGLang's)."
    ),
]
KvCacheMemory = Annotated[
    str | None,
    typer.Option(
        "--kv-cache-memory",
        help="KV cache memory per GPU (51.02GiB, 40GB, bytes); replaces the computed budget.",
    ),
]
BlockSize = Annotated[
    int | None,
    typer.Option(
        "--block-size",
        "--page-size",
        help="Block (vLLM) or page (SGLang) size in tokens. Default: vLLM 16 (MLA: 64 on Hopper, "
        "128 on Blackwell), SGLang 1.",
    ),
]
Engine = Annotated[
    str, typer.Option("--engine", help="Whose accounting and log lines to reproduce: vllm or sglang.")
]
EngineVersion = Annotated[
    str | None,
    typer.Option("--engine-version", help="Engine release, e.g. 0.11 (default: the newest kvplan knows)."),
]
KvCacheDtype = Annotated[str, _kv_cache_dtype()]
MaybeKvCacheDtype = Annotated[str | None, _kv_cache_dtype()]
WeightDtype = Annotated[
    str | None,
    typer.Option(
        "--weight-dtype", help="Override the weights' dtype: bf16, fp16, fp32, fp8, int8, int4, mxfp4, nvfp4."
    ),
]
MaxNumBatchedTokens = Annotated[str, _max_num_batched_tokens()]
MaybeMaxNumBatchedTokens = Annotated[str | None, _max_num_batched_tokens()]
Models = Annotated[
    str | None,
    typer.Option(
        "--models",
        "-m",
        "--model",
        help="Comma-separated models (default: llama3-70b, llama3.1-405b, qwen2.5-72b, deepseek-v3).",
    ),
]
Variants = Annotated[
    str,
    typer.Option(
        "--variants",
        help="Comma-separated what-ifs, each tokens joined by '+': shipped, mha, gqaN, mqa, mlaR, shareN, "
        "windowW, offloadG, fp8/int8/int4/int2 (e.g. shipped,gqa8+int8,mla512+fp8).",
    ),
]
Output = Annotated[str | None, typer.Option("--output", "-o", help="Where to write the file.")]
Format = Annotated[str, typer.Option("--format", "-f", help="table, md, csv or json (json: as --json).")]
Json = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print JSON on stdout (schemas in the README); a failure prints a kvplan.error/1 object.",
    ),
]
Network = Annotated[
    str | None,
    typer.Option(
        "--network",
        help="Inter-node fabric per GPU, used when a layout crosses nodes: 25G (Ethernet), 100G, 200G, "
        "400G (default: one 400 Gb/s InfiniBand NDR / RoCE NIC per GPU) or 800G.",
    ),
]
NetworkGbps = Annotated[
    float | None,
    typer.Option("--network-gbps", help="Instead of --network: the inter-node link per GPU in Gb/s."),
]
NetworkLatencyUs = Annotated[
    float | None,
    typer.Option(
        "--network-latency-us",
        help="With --network-gbps: one message's latency across nodes in microseconds (default: the RDMA figure).",
    ),
]
NumRedundantExperts = Annotated[
    int,
    typer.Option(
        "--num-redundant-experts",
        "--ep-num-redundant-experts",
        help="Redundant experts (EPLB) added to the routed ones, whole experts per GPU; needs expert parallelism.",
    ),
]
EnableEplb = Annotated[
    bool,
    typer.Option(
        "--enable-eplb",
        help="Expert-parallel load balancing (vLLM, SGLang): experts are moved while serving; vLLM takes "
        "--num-redundant-experts only with it. Needs expert parallelism.",
    ),
]
MoeImbalance = Annotated[
    float,
    typer.Option(
        "--moe-imbalance",
        help="Under expert parallelism: the busiest EP rank's routed-expert work over the mean (assumed 1.0).",
    ),
]
SpeculativeConfig = Annotated[
    str | None,
    typer.Option(
        "--speculative-config",
        help='vLLM: speculative decoding as JSON, e.g. \'{"method": "mtp", "num_speculative_tokens": 1}\' (eagle, eagle3, mtp, ngram).',
    ),
]
SpeculativeAlgorithm = Annotated[
    str | None, typer.Option("--speculative-algorithm", help="SGLang: EAGLE, EAGLE3, NEXTN (MTP) or NGRAM.")
]
SpeculativeNumSteps = Annotated[
    int | None, typer.Option("--speculative-num-steps", help="SGLang: draft forward passes per step.")
]
SpeculativeNumDraftTokens = Annotated[
    int | None,
    typer.Option(
        "--speculative-num-draft-tokens",
        help="SGLang: tokens a request verifies per step (default steps + 1).",
    ),
]
AcceptanceLength = Annotated[
    float | None,
    typer.Option(
        "--acceptance-length",
        help="Speculative decoding: mean tokens accepted per step (default: MTP 1 + 0.85 + ..., others must give it).",
    ),
]
SpeculativeDraftConfig = Annotated[
    str | None,
    typer.Option(
        "--speculative-draft-config",
        help="Speculative decoding: the draft checkpoint's config.json (EAGLE/EAGLE-3 heads), to count its weights and KV.",
    ),
]
DataParallelSize = Annotated[
    int | None,
    typer.Option(
        "--data-parallel-size",
        "--dp-size",
        "-dp",
        help="vLLM: DP engine cores of TP GPUs each, whose MoE layers share the experts; SGLang: --dp-size "
        "(replicas, or attention-DP ranks inside TP with --enable-dp-attention).",
    ),
]
EnableExpertParallel = Annotated[
    bool,
    typer.Option(
        "--enable-expert-parallel",
        help="vLLM: whole routed experts over EP = TP x DP GPUs, not sliced by TP.",
    ),
]
