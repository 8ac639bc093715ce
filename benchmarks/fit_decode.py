"""Fit kvplan's decode step model to published decode runs (issue 13).

Reads tests/fixtures/bench/decode_runs.tsv (90 published decode figures, sources in quotes.md), maps
every row kvplan can represent to a plan (model spec, GPU, TP/PP, batch, input/output lengths,
weight and KV dtypes), and excludes the others with a stated reason. The usable rows are sorted
by (source, model, GPU, TP, batch, input length, weight dtype, engine) and every third one (the
3rd, 6th, ...) is held out; the coefficients are fitted on the other two thirds only, by a
coordinate search on log-coefficients minimising the mean squared log error of predicted vs
published TPOT. Coefficients no spec gives and the data cannot pin are stated assumptions, not
fitted (the attention kernel curve, README: Where the decode-kernel efficiency figures come from; the
inter-node network).

What is counted: the published figure itself, predicted from kvplan's step model (kvplan/speed/step_model.py)
at the published batch, each request at the mean context of its decode (input + output / 2), and
kvplan's prefill model (speed.prefill_seconds) where the figure includes prefill. What each source's
figure measures is stated per source in METRICS, with the words that say so (quotes.md):
  step     the decode step itself (one batch decoding, no new prompts): step
  serving  a served request's mean TPOT/ITL at concurrency c: while it decodes, the other c - 1
           requests' prompts (input tokens each, one new prompt per `output` steps a slot) are
           prefilled between or within its steps: step + (c - 1) x prefill(input) / output
  batch    one static batch timed from the first prompt to the last token, divided by the output
           tokens: (batch x prefill(input) + (output - 1) x step) / output

Run:  python benchmarks/fit_decode.py            # fit, print the table, write kvplan/data/decode_fit.yaml
      python benchmarks/fit_decode.py --check    # the shipped coefficients only, no fit, no write
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvplan.errors import KvplanError  # noqa: E402
from kvplan.model.params import param_breakdown  # noqa: E402
from kvplan.plan.plan import PlanRequest, estimate  # noqa: E402
from kvplan.specs.models import HeadLayer, ModelSpec  # noqa: E402
from kvplan.specs.registry import load_gpu, load_model  # noqa: E402
from kvplan.speed import step_model as speed  # noqa: E402
from kvplan.speed.plan_speed import attention_width  # noqa: E402

TSV = REPO / "tests" / "fixtures" / "bench" / "decode_runs.tsv"
CORPUS = REPO / "tests" / "fixtures" / "hf" / "corpus"
OUT = REPO / "kvplan" / "data" / "decode_fit.yaml"
GIB = 2**30

STEP, SERVING, BATCH = "step", "serving", "batch"
# what each source's published figure measures, and the words (quotes.md) that say so
METRICS: dict[str, tuple[str, str]] = {
    "https://github.com/NVIDIA/TensorRT-LLM/blob/main/docs/source/performance.md": (
        BATCH,
        "gptSessionBenchmark, static batching: 'Throughput is calculated as output tokens per second per "
        "gpu. out_tps=output_seqlen*batch_size/total_latency/tp' (TensorRT-LLM blogs/XQA-kernel.md); the "
        "total latency includes the context phase of batch x input tokens",
    ),
    "https://buildkite.com/vllm/performance-benchmark/builds/": (
        BATCH,
        "benchmark_latency: 'Batch size: fixed (8)', 'Evaluation metrics: end-to-end latency' of one "
        "batch of 32-token prompts generating 128 tokens; tpot_ms = latency / 128",
    ),
    "https://lmsys.org/blog/2025-08-27-gpt-oss/": (
        STEP,
        "bench_one_batch_server '--batch-size 1': 'single-batch decode throughput'",
    ),
    "https://johnmusgrave.com/": (STEP, "'decode at one request per time runs at about 75 tokens/sec'"),
    "https://docs.nvidia.com/nim/": (SERVING, "AIPerf 'ITL (ms)' per concurrency of a serving run"),
    "https://docs.vultr.com/": (SERVING, "vllm bench serve 'TPOT (ms)' per 'Concurrent' requests"),
    "https://github.com/SemiAnalysisAI/InferenceX/": (
        SERVING,
        "InferenceX serving sweep: 'TPOT ms' per 'Conc'",
    ),
    "https://github.com/gpustack/": (
        SERVING,
        "'vllm bench serve ... --max-concurrency 4': 'Median TPOT (ms)' over 100 requests",
    ),
    "https://github.com/NVIDIA/TensorRT-LLM/issues/5929": (
        SERVING,
        "'running LLMPerf against trtllm-serve': 'ITL p50' per 'Batch Size' (concurrent requests)",
    ),
    "https://yobitelcomm.github.io/": (SERVING, "'conc' sweep: 'tpot_p50_ms' of a serving run"),
}
# engines whose decode attention reads a KV head's cache once per query head: TensorRT-LLM before the
# XQA kernel ('XQA kernel provides optimization for MQA and GQA during generation phase ... reducing
# data loading', 'will be included in the v0.8 releases': blogs/XQA-kernel.md); its masked MHA kernel
# (from FasterTransformer's decoder_masked_multihead_attention) launches one CTA per (query head,
# sequence): grid(num_heads, batch)
KV_READ_PER_QUERY_HEAD = ("v0.5", "v0.6.1")  # TensorRT-LLM engine_version column

# what the search moves (the rest are stated assumptions, kept as shipped)
FITTED = (
    "gemm_efficiency",
    "gemm_half_bytes",
    "lowbit_gemm_efficiency",
    "moe_layer_s",
    "launch_per_layer_s",
    "step_overhead_s",
    "allreduce_latency_s",
)
BOUNDS = {  # physical ranges: a fit outside them would be absorbing something else
    "gemm_efficiency": (0.5, 0.95),  # decode GEMV/GEMM kernels: 50-95% of datasheet
    "lowbit_gemm_efficiency": (0.3, 1.0),
    "gemm_half_bytes": (1e5, 5e7),
    "moe_layer_s": (1e-6, 3e-4),
    "launch_per_layer_s": (1e-6, 1e-4),
    "step_overhead_s": (5e-5, 3e-3),  # CUDA-graph replay + scheduler + sampler: 0.05-3 ms
    "allreduce_latency_s": (3e-6, 4e-5),  # custom/NCCL all-reduce of a few KiB over NVLink
}
ASSUMED = {
    "gemm_mfu": (0.5, "assumed: kvplan's prefill MFU (few published rows are compute bound, none pins it)"),
    "attention_efficiency": (
        0.88,
        "assumed from FlashInfer's decode benchmarks (arXiv:2501.01005; README, Where the decode-kernel efficiency figures come from): about 88% of "
        "datasheet bandwidth at batch 64, long context (H100)",
    ),
    "attention_half_bytes": (
        10.0e6,
        "assumed (README, Where the decode-kernel efficiency figures come from): under 25% at batch 1 below 1k tokens, i.e. a 4 MiB call "
        "(one Llama-3-8B layer, 1k tokens) at 0.88 x 4 / (4 + 10)",
    ),
    "network_latency_s": (
        25.0e-6,
        "assumed: one small-message NCCL all-reduce/send across nodes over InfiniBand/RoCE; no published "
        "row crosses nodes",
    ),
    "network_bytes_per_s": (
        50.0e9,
        "assumed: one 400 Gb/s NIC per GPU (HGX H100/H200/B200 nodes); no published row crosses nodes",
    ),
}

GPUS = {
    "H100 80GB": "H100",
    "H100 SXM": "H100",
    "H100": "H100",
    "H100 (8xH100 node)": "H100",
    "H100 80GB HBM3": "H100",
    "H200": "H200",
    "B200": "B200",
    "A100-SXM4-80GB": "A100-80GB",
    "A100 40GB": "A100-40GB",
    "L40S": "L40S",
}


@dataclass(frozen=True)
class Row:
    line: int  # data row number in the TSV (1-based, header excluded)
    source: str
    engine: str
    model: str
    gpu: str
    tp: int
    batch: int
    input_len: int
    output_len: int
    weight: str
    kv: str
    tpot_ms: float
    metric: str = STEP  # what the published figure measures (METRICS)
    kv_reads_per_head: bool = False  # the engine's attention reads KV once per query head


@dataclass(frozen=True)
class Case:
    row: Row
    spec: ModelSpec
    weight_dtype: str | None  # --weight-dtype, None: the spec's
    kv_dtype: str
    note: str = ""


def _int(text: str) -> int | None:
    head = text.split(" ")[0].strip()
    return int(head) if head.isdigit() else None


def _spec(r: dict[str, str]) -> tuple[ModelSpec | None, str | None, str]:
    """(spec, --weight-dtype, note) for a row's model, or (None, None, reason)."""
    m, w = r["model"], r["weight_dtype"].split(" ")[0]
    if "DeepSeek-R1" in m:
        spec = load_model("deepseek-v3")
        if w == "nvfp4":  # NVIDIA's FP4 checkpoints: MoE experts in NVFP4, attention in bf16
            return spec.model_copy(update={"weight_dtype": "bf16", "expert_weight_dtype": "nvfp4"}), None, ""
        return spec, None, ""
    table = {
        "meta-llama/Llama-3.3-70B-Instruct": "llama3.1-70b",
        "nvidia/Llama-3_3-Nemotron-Super-49B": "llama-3.3-nemotron-super-49b",
        "openai/gpt-oss-120b": "gpt-oss-120b",
        "lmsys/gpt-oss-120b-bf16": "gpt-oss-120b",
        "Qwen/Qwen3-8B": "qwen3-8b",
        "meta-llama/Meta-Llama-3.1-8B": "llama3-8b",  # the CI's tests json runs Meta-Llama-3-8B
        "meta-llama/Meta-Llama-3-70B": "llama3-70b",
        "mistralai/Mixtral-8x7B": "mixtral-8x7b",
        "meta-llama/Llama-2-7b": "llama2-7b",
        "meta-llama/Llama-2-70b": "llama2-70b",
        "meta-llama/Llama-3.1-8B-Instruct": "llama3.1-8b",
    }
    if "Nemotron-3-Nano" in m:
        spec = load_model(str(CORPUS / "nemotron-3-nano-30b-a3b.json"))
        return spec, "fp8", "BF16 config with --weight-dtype fp8"
    for prefix, name in table.items():
        if m.startswith(prefix):
            dtype = {"fp8": "fp8", "bf16": "bf16", "fp16": "fp16"}.get(w)
            if "gpt-oss" in m and w == "mxfp4":
                dtype = None  # the shipped spec: experts MXFP4, the rest bf16
            return load_model(name), dtype, ""
    return None, None, f"no kvplan spec for {m}"


# runs that measure an engine build rather than the hardware: (source, GPU) -> why
ANOMALOUS = {
    ("https://github.com/NVIDIA/TensorRT-LLM/issues/5929", "H200"): (
        "user-reported in a bug issue on a from-source v0.21.0rc2 build; on the same 8x H200, model and "
        "fp8 weights, SGLang's published TP8 runs (InferenceX PR 3173) decode batch 4 in 9.70 ms and "
        "batch 8 in 11.73 ms against this report's 13.78 ms at batch 1 and 18.18 ms at batch 8: 1.4-1.55x "
        "slower on the same work, a property of that build, not of the hardware"
    ),
}


def _exclusion(r: dict[str, str], line: int) -> str | None:
    """Why kvplan cannot represent this row, or None."""
    anomalous = ANOMALOUS.get((r["source_url"], r["gpu"]))
    if anomalous is not None and r["ep"] in ("", "none"):
        return anomalous
    if r["gpu"] not in GPUS:
        if r["gpu"].startswith("GB200"):
            return "GB200: no shipped GPU spec"
        return f"GPU {r['gpu']!r}: variant not stated (A100 40 GB and 80 GB differ in bandwidth)"
    if not r["tp"].isdigit():
        return "parallel layout not stated (likely DP-attention + EP16): kvplan models TP x PP only"
    if r["ep"] not in ("", "1", "none"):
        return f"expert parallelism EP {r['ep']}: kvplan models TP-sharded experts only"
    if "EP8TP8" in r["notes"] or "EP/TP split for this row not stated" in r["notes"]:
        return "expert-parallel or unstated MoE layout (EP8TP8 min-latency blog rows)"
    if "attention-DP" in r["notes"] and _int(r["batch_or_concurrency"]) in (64, 128):
        return "c64/c128 points may use attention-DP (the source does not say): layout unknown"
    if "requests queueing" in r["notes"]:
        return (
            "TTFT 8.0 s against 0.41 s at concurrency 1: requests queue for a batch slot, so the decode "
            "batch is below the concurrency and not published"
        )
    if _int(r["batch_or_concurrency"]) is None:
        return "batch not stated per engine step"
    if r["input_len"].startswith("unknown") and (_int(r["batch_or_concurrency"]) or 0) > 4:
        return "lengths not published and batch >= 16: attention and prefill interference unbounded"
    return None


def _lengths(r: dict[str, str]) -> tuple[int, int, str]:
    if r["input_len"].startswith("ShareGPT"):  # the published means
        return 233, 221, "ShareGPT mean lengths 232.6 / 220.6"
    if r["input_len"].startswith("unknown"):
        return 512, 256, "lengths not published: assumed 512 in / 256 out (chatbot-short); batch <= 4"
    i, o = _int(r["input_len"]), _int(r["output_len"])
    assert i is not None and o is not None, r["input_len"]
    return i, o, ""


def read_rows() -> tuple[list[Case], list[tuple[Row | None, int, str]]]:
    cases: list[Case] = []
    excluded: list[tuple[Row | None, int, str]] = []
    with TSV.open(encoding="utf-8") as fh:
        for line, r in enumerate(csv.DictReader(fh, delimiter="\t"), 1):
            why = _exclusion(r, line)
            if why is not None:
                excluded.append((None, line, f"{r['model']} on {r['gpu']}: {why}"))
                continue
            spec, dtype, note = _spec(r)
            if spec is None:
                excluded.append((None, line, note))
                continue
            i, o, len_note = _lengths(r)
            kv = "fp8" if r["kv_dtype"].startswith("fp8") else "auto"
            batch = _int(r["batch_or_concurrency"])
            assert batch is not None
            row = Row(
                line, r["source_url"], r["engine"].split(" ")[0], r["model"], GPUS[r["gpu"]],
                int(r["tp"]), batch, i, o, r["weight_dtype"].split(" ")[0], kv, float(r["tpot_ms"]),
                metric_of(r["source_url"]), r["engine_version"] in KV_READ_PER_QUERY_HEAD,
            )  # fmt: skip
            cases.append(Case(row, spec, dtype, kv, "; ".join(x for x in (note, len_note) if x)))
    return cases, excluded


def metric_of(source: str) -> str:
    """What a source's published figure measures (METRICS)."""
    for prefix, (kind, _) in METRICS.items():
        if source.startswith(prefix):
            return kind
    raise SystemExit(f"{source}: no METRICS entry says what its figure measures")


def split(cases: list[Case]) -> tuple[list[Case], list[Case]]:
    """Sorted by (source, model, GPU, TP, batch, input length, weight dtype, engine); every third held out."""
    key = sorted(
        cases,
        key=lambda c: (c.row.source, c.row.model, c.row.gpu, c.row.tp, c.row.batch, c.row.input_len,
                       c.row.weight, c.row.engine),
    )  # fmt: skip
    fit = [c for i, c in enumerate(key) if i % 3 != 2]
    held = [c for i, c in enumerate(key) if i % 3 == 2]
    return fit, held


@dataclass(frozen=True)
class Prepared:
    case: Case
    inputs: speed.DecodeInputs
    kv_bytes_per_request: int  # the bytes the engine's attention reads per request (KV_READ_PER_QUERY_HEAD)
    context: int
    prefill_ms: float  # kvplan's prefill of one prompt of input_len tokens on the row's GPUs


def _query_heads_per_kv_head(spec: ModelSpec) -> int:
    for layer in spec.layers:
        if isinstance(layer, HeadLayer):
            return spec.num_attention_heads // layer.num_kv_heads
    return 1


def _prefill_ms(case: Case) -> float:
    """kvplan's prefill model (speed.prefill_seconds) for one prompt of the row's input length, at the
    dense peak of the weights' dtype (fp8 where the GPU has it)."""
    r = case.row
    gpu = load_gpu(r.gpu)
    fp8 = (case.weight_dtype or case.spec.weight_dtype) == "fp8" and gpu.fp8_dense_flops
    peak = gpu.fp8_dense_flops if fp8 and gpu.fp8_dense_flops else gpu.bf16_dense_flops
    active = param_breakdown(case.spec).active
    width = attention_width(case.spec)
    return speed.prefill_seconds(active, r.input_len, case.spec.num_layers, width, r.tp, peak) * 1e3


def prepare(case: Case) -> Prepared:
    r = case.row
    ctx_len = r.input_len + r.output_len
    last: KvplanError | None = None
    for kv_mem in (8 * GIB, 2 * GIB, GIB // 2):
        try:
            p = estimate(
                PlanRequest(
                    model=case.spec,
                    gpu=load_gpu(r.gpu),
                    num_gpus=r.tp,
                    tp=r.tp,
                    pp=1,
                    max_model_len=ctx_len,
                    kv_cache_dtype=case.kv_dtype,
                    weight_dtype=case.weight_dtype,
                    kv_cache_memory_bytes=kv_mem,
                    input_len=r.input_len,
                    output_len=r.output_len,
                )  # fmt: skip
            )
        except KvplanError as exc:
            last = exc
            continue
        kv = p.decode.kv_bytes_per_request_per_gpu
        if r.kv_reads_per_head:
            kv *= _query_heads_per_kv_head(case.spec)
        return Prepared(case, p.decode.inputs, kv, p.decode.context_tokens, _prefill_ms(case))
    raise SystemExit(f"row {r.line}: kvplan cannot plan it: {last}")


def predict(p: Prepared, c: speed.Coefficients) -> speed.StepTime:
    return speed.decode_step(p.inputs, p.case.row.batch, p.kv_bytes_per_request, p.context, None, c)


def published_ms(p: Prepared, c: speed.Coefficients) -> float:
    """The published figure as kvplan predicts it, by what it measures (METRICS)."""
    r = p.case.row
    step_ms = predict(p, c).tpot_ms
    if r.metric == SERVING:  # the other requests' prompts, one per slot every `output` steps
        return step_ms + (r.batch - 1) * p.prefill_ms / r.output_len
    if r.metric == BATCH:  # the batch's prompts, then output - 1 steps (the prefill gives the first token)
        return (r.batch * p.prefill_ms + (r.output_len - 1) * step_ms) / r.output_len
    return step_ms


def errors(rows: list[Prepared], c: speed.Coefficients) -> list[float]:
    return [published_ms(p, c) / p.case.row.tpot_ms - 1 for p in rows]


HUBER = 0.10  # log-error at which the loss turns from quadratic to linear (outliers pull less)


def loss(rows: list[Prepared], c: speed.Coefficients) -> float:
    """Mean pseudo-Huber loss of the log errors: smooth, and robust to the few rows no model fits."""
    return statistics.fmean(
        HUBER**2 * (math.sqrt(1 + (math.log1p(e) / HUBER) ** 2) - 1) for e in errors(rows, c)
    )


def _coefficients(base: speed.Coefficients, x: list[float]) -> speed.Coefficients:
    values = {}
    for name, v in zip(FITTED, x, strict=True):
        lo, hi = BOUNDS[name]
        values[name] = min(hi, max(lo, math.exp(v)))
    return dataclasses.replace(base, **values)


def nelder_mead(f, x0: list[float], scale: float, iterations: int) -> list[float]:
    """The textbook simplex search (reflect, expand, contract, shrink); no scipy on this path."""
    n = len(x0)
    simplex = [list(x0)] + [[x + (scale if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=lambda i: values[i])
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centre = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        refl = [c + (c - w) for c, w in zip(centre, worst, strict=True)]
        fr = f(refl)
        if fr < values[0]:
            exp = [c + 2 * (c - w) for c, w in zip(centre, worst, strict=True)]
            fe = f(exp)
            simplex[-1], values[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centre, worst, strict=True)]
            fc = f(con)
            if fc < values[-1]:
                simplex[-1], values[-1] = con, fc
            else:
                best = simplex[0]
                simplex = [best] + [
                    [b + 0.5 * (x - b) for b, x in zip(best, p, strict=True)] for p in simplex[1:]
                ]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    return simplex[min(range(n + 1), key=lambda i: values[i])]


def fit(rows: list[Prepared], start: speed.Coefficients) -> speed.Coefficients:
    """Nelder-Mead on the log of the FITTED coefficients (clipped to BOUNDS), restarted from its own
    answer with a shrinking simplex until the loss stops falling."""
    x = [math.log(getattr(start, name)) for name in FITTED]

    def f(v: list[float]) -> float:
        return loss(rows, _coefficients(start, v))

    best = f(x)
    for scale in (1.0, 0.5, 0.25, 0.1, 0.05):
        x = nelder_mead(f, x, scale, 400)
        best = f(x)
    print(f"fit: loss {best:.5f}")
    return _coefficients(start, x)


def start_coefficients() -> speed.Coefficients:
    values = {
        "gemm_efficiency": 0.8,
        "gemm_half_bytes": 1e6,
        "lowbit_gemm_efficiency": 0.8,
        "moe_layer_s": 30e-6,
        "launch_per_layer_s": 20e-6,
        "step_overhead_s": 0.5e-3,
        "allreduce_latency_s": 10e-6,
    }
    values.update({k: v for k, (v, _) in ASSUMED.items()})
    return speed.Coefficients(**values)


def summary(errs: list[float]) -> tuple[float, float]:
    a = [abs(e) for e in errs]
    return statistics.median(a), max(a)


def _fitted_source(name: str, n_fit: int) -> str:
    what = {
        "gemm_efficiency": "share of datasheet bandwidth a large weight GEMM streams at",
        "gemm_half_bytes": "GEMM bytes at which streaming reaches half that (a fixed cost per GEMM)",
        "lowbit_gemm_efficiency": "fp8/int4/fp4 weights stream at this x the bf16 efficiency "
        "(dequantisation, scales); set by the fp8 and mxfp4/nvfp4 rows",
        "moe_layer_s": "routing, top-k, permute/unpermute per MoE layer; set by the MoE rows "
        "(DeepSeek-R1, gpt-oss, Mixtral, Nemotron-3-Nano)",
        "launch_per_layer_s": "kernel launches and small ops per layer; set by the batch-1 dense rows",
        "step_overhead_s": "scheduling, sampling, input preparation per step",
        "allreduce_latency_s": "one small-message NVLink all-reduce; set by the TP 2-8 rows",
    }[name]
    return f"fitted to {n_fit} published runs (fit part of decode_runs.tsv): {what}"


def write_yaml(c: speed.Coefficients, n_fit: int, stats: dict[str, tuple[float, float]], n_held: int) -> None:
    lines = [
        "# kvplan's decode step model coefficients (kvplan/speed/step_model.py). Written by benchmarks/fit_decode.py",
        "# from tests/fixtures/bench/decode_runs.tsv: fitted on two thirds of the usable rows, checked on",
        "# the third held out (every third row sorted by source, model, GPU, TP, batch, input length). Each row",
        "# is compared as published: a step, a served TPOT with the other requests' prefill, or a static batch",
        "# with its context phase (METRICS in the script).",
        f"# fit part ({n_fit} rows): median |error| {stats['fit'][0]:.1%}, worst {stats['fit'][1]:.1%}",
        f"# held-out part ({n_held} rows): median |error| {stats['held'][0]:.1%}, worst {stats['held'][1]:.1%}",
        "coefficients:",
    ]
    for name in speed.COEFFICIENTS:
        value = getattr(c, name)
        if name in FITTED:
            source = _fitted_source(name, n_fit)
        else:
            source = ASSUMED[name][1]
        lines.append(f"  # {source}")
        lines.append(f"  {name}: {{value: {value:.4g}, source: {json.dumps(source)}}}")
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")


def report(label: str, rows: list[Prepared], c: speed.Coefficients) -> tuple[float, float]:
    print(f"\n{label} ({len(rows)} rows)")
    print(f"{'line':>4} {'engine':<12} {'model':<34} {'gpu':<9} {'tp':>2} {'batch':>5} {'ctx':>6} "
          f"{'metric':<7} {'published':>9} {'kvplan':>8} {'step':>7} {'error':>7}  "
          "step: weights/attn/moe/comm/launch/overhead ms")  # fmt: skip
    errs = []
    for p in rows:
        r = p.case.row
        s = predict(p, c)
        pub = published_ms(p, c)
        e = pub / r.tpot_ms - 1
        errs.append(e)
        print(f"{r.line:>4} {r.engine[:12]:<12} {r.model[:34]:<34} {r.gpu:<9} {r.tp:>2} {r.batch:>5} "
              f"{p.context:>6} {r.metric:<7} {r.tpot_ms:>9.2f} {pub:>8.2f} {s.tpot_ms:>7.2f} {e:>+7.1%}  "
              f"{s.weights_ms:.2f}/{s.attention_ms:.2f}/{s.moe_ms:.2f}/{s.communication_ms:.2f}/"
              f"{s.launch_ms:.2f}/{s.overhead_ms:.2f}")  # fmt: skip
    med, worst = summary(errs)
    print(f"{label}: median |error| {med:.1%}, worst {worst:.1%}")
    return med, worst


def main(argv: list[str]) -> None:
    cases, excluded = read_rows()
    fit_cases, held_cases = split(cases)
    fit_rows = [prepare(c) for c in fit_cases]
    held_rows = [prepare(c) for c in held_cases]
    print(
        f"{len(cases)} usable rows ({len(fit_rows)} fit, {len(held_rows)} held out), {len(excluded)} excluded:"
    )
    for _, line, why in excluded:
        print(f"  line {line}: {why}")
    for c in cases:
        if c.note:
            print(f"  line {c.row.line}: note: {c.note}")
    if "--check" in argv:
        coef = speed.coefficients()
    else:
        coef = fit(fit_rows, start_coefficients())
    stats = {"fit": report("fit", fit_rows, coef), "held": report("held out", held_rows, coef)}
    print()
    for name in speed.COEFFICIENTS:
        tag = "fitted" if name in FITTED else "assumed"
        print(f"  {name:<24} {getattr(coef, name):.4g}  ({tag})")
    if "--check" not in argv:
        write_yaml(coef, len(fit_rows), stats, len(held_rows))
        print(f"wrote {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    main(sys.argv[1:])
