"""`kvplan simulate` against published serving runs: TTFT, TPOT and output throughput.

Reads tests/fixtures/bench/serving_runs.tsv (published `vllm bench serve` / SGLang bench_serving
runs; their verbatim text in serving_quotes.md), maps every row kvplan can express to a
`kvplan simulate` run (model, GPU, TP/PP, engine and version, --max-num-seqs /
--max-num-batched-tokens as stated, prefix caching as stated or the engine's default, the
deployment's memory as the notes give it, the random dataset's lengths and range ratio,
num_prompts, max_concurrency or request_rate) and compares the published mean (or median, as
published) TTFT, TPOT and output throughput with the simulated ones.

Nothing is fitted here: the simulator's step times come from the decode step model fitted by
benchmarks/fit_decode.py to decode_runs.tsv, plus kvplan's prefill model. Every row here is a
serving run the simulator never saw; what the decode fit saw is another matter: its dev sources
include gpustack's concurrency-4 ShareGPT rows (decode_runs.tsv), the same publisher and harness
as the gpustack rows below (those are excluded here as ShareGPT; the random-dataset rows kept are
other runs of the same harness).

Exclusion rules, written before any error was looked at and applied to every row of the kind
(`exclusion` below, in this order; each excluded row is printed with its reason):
  1. ShareGPT prompts: kvplan ships no ShareGPT length histogram.
  2. The dataset or the lengths are not stated (lengths only from token totals, output 'unknown').
  3. The parallel layout is not stated (TP 'unknown').
  4. Speculative decoding whose method, draft tokens and acceptance length are not all stated (MTP/EAGLE).
     (Until 2026-12-01 rule 4 excluded every expert-parallel, DP-attention and speculative row as not
     modelled; `simulate` now runs them (DP ranks dealt round-robin, speculative steps), so they are
     replayed with the flags their launch states: --enable-expert-parallel, --enable-dp-attention
     with its --dp size (SGLang's default 1), MTP with its stated tokens and acceptance length.)
  5. No shipped GPU spec; no kvplan spec for the model (or an architecture twin, named).
  6. num_prompts, the request rate or the random range ratio not stated.
  7. Rows the collector flagged as unreliable: no --ignore-eos and the outputs fell short of the
     requested tokens by more than 2%, or requests failed (successful < sent).
  8. Nothing comparable published (no TTFT, TPOT/ITL or output throughput).
  Per metric (written 2026-12-07, before the round-4 rows were first replayed): at --max-concurrency 1 nothing
  queues, so a published mean TTFT above 10x its median is one outlier request's (a warm-up inside the timed
  run): the median is compared (the largest mean/median of a queueing row here is 8.2).
  Per metric: the dennislee rows' TTFT is not compared: prefix caching was on with vLLM's seeded
  random dataset and the engine logs show hit rates of tens of percent (earlier runs' prompts
  repeated), a saving of unknown size that only the TTFT feels first-hand.
GPUs without peer-to-peer: a source whose own startup logs (tests/fixtures/logs/real, SOURCES.tsv) say
vLLM disabled its custom all-reduce because "your platform lacks GPU P2P capability" has its same-node
TP > 1 rows planned on the GPU's PCIe card (kvplan's PCIe all-reduce: NCCL through host memory, no
NVLink), since GPUs that cannot reach each other's memory have no NVLink between them (NO_P2P below).
Kept and stated, not excluded: --async-scheduling (not modelled: the simulator's steps are
serial), vLLM 0.10.x and SGLang 0.5.4-0.5.7 rows (simulated with the v0.11.0 / v0.5.3 scheduler
rules), --enforce-eager rows (no CUDA graph memory; the step time still as CUDA-graph launched),
SGLang bench_serving's range ratio 0 (lengths uniform in [1, len]: replayed as len/2 with
range ratio 0.999), architecture twins (Qwen2-7B as Qwen2.5-7B, Llama-3.3-70B as Llama-3.1-70B,
DeepSeek-R1 as DeepSeek-V3).

Splits are by source, as fit_decode.py splits decode runs: a source is the publisher's harness
(SOURCE_KEYS: a URL prefix; otherwise the whole URL), and the frozen test set is fit_decode's
FROZEN_RULE (the first hex digit of sha256(source key) is 0-3), used for nothing but reporting.
Figures per bucket (GPU x engine x dense/MoE/hybrid): rows, median |error| and median signed error
(bias, > 0: the simulation is slower / higher than published for TTFT and TPOT, higher for
throughput), for dev and frozen sources.

Run:  python benchmarks/serving_check.py            # simulate every row; write benchmarks/results/serving_check.yaml,
                                                    # kvplan/data/served_evidence.yaml (what estimate and simulate
                                                    # print of their bucket) and README's block
      python benchmarks/serving_check.py --readme   # README.md's block and served_evidence.yaml from serving_check.yaml only
      python benchmarks/serving_check.py --lines 5,17  # replay some rows, print them, write nothing
"""

from __future__ import annotations

import csv
import math
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from fit_decode import is_frozen  # noqa: E402

from kvplan import api  # noqa: E402
from kvplan.errors import KvplanError  # noqa: E402
from kvplan.specs.registry import load_gpu, load_model  # noqa: E402

TSV = REPO / "tests" / "fixtures" / "bench" / "serving_runs.tsv"
OUT = REPO / "benchmarks" / "results" / "serving_check.yaml"
SCHEMA = "kvplan.serving-check/1"

# a source is the publisher's harness: these URL prefixes (the same keys as decode_runs' sources.tsv
# where a publisher is in both); any other URL is its own source
SOURCE_KEYS = (
    "https://github.com/gpustack/",
    "https://github.com/SemiAnalysisAI/InferenceX/",
    "https://github.com/dennislee22/",
    "https://github.com/datacrunch-research/",
    "https://github.com/sgl-project/sgl-cookbook/",
)
# one document at two commits is one source (the later version replaced the earlier one)
SAME_SOURCE = {
    "https://github.com/vllm-project/recipes/blob/cbb075bc97ee792159824303c4eaa36d34375b49/DeepSeek/AMD_GPU/README.md": (
        "https://github.com/vllm-project/recipes/blob/b7d325e027bfa796f217af9dc4c020361db1bc4f/DeepSeek/AMD_GPU/README.md"
    ),
}

GPUS = {
    "H100-SXM-80GB": "H100",
    "H100": "H100",
    "A100-80GB": "A100-80GB",
    "A100-SXM-80GB": "A100-80GB",
    "A100-40GB": "A100-40GB",
    "H200": "H200",
    "H200-SXM-141GB": "H200",
    "MI300X": "MI300X",
    "B200": "B200",
    "H20": "H20",
}

# model id prefix -> (kvplan model, note); twins share the architecture (layers, widths, heads, experts)
MODELS = {
    "Qwen/Qwen2-7B-Instruct": (
        "tests/fixtures/hf/corpus/qwen2.5-7b.json",
        "Qwen2-7B as Qwen2.5-7B (same architecture)",
    ),
    "Qwen/Qwen2.5-32B": ("tests/fixtures/hf/corpus/qwen2.5-32b-instruct.json", ""),
    "Qwen/Qwen3-8B": ("qwen3-8b", ""),
    "Qwen/Qwen3-32B": ("qwen3-32b", ""),
    "Qwen/Qwen3-235B-A22B": ("qwen3-235b-a22b", ""),
    "Qwen/Qwen3-14B": ("tests/fixtures/hf/corpus/qwen3-14b.json", ""),
    "Qwen/Qwen3-30B-A3B": ("tests/fixtures/hf/corpus/qwen3-30b-a3b.json", ""),
    "openai/gpt-oss-120b": ("gpt-oss-120b", ""),
    "openai/gpt-oss-20b": ("gpt-oss-20b", ""),
    "deepseek-ai/DeepSeek-R1": ("deepseek-v3", "DeepSeek-R1 as DeepSeek-V3 (same architecture)"),
    "deepseek-ai/DeepSeek-V3.2": ("deepseek-v3.2", ""),
    "deepseek-ai/DeepSeek-V3.1": ("deepseek-v3", "DeepSeek-V3.1 as DeepSeek-V3 (same architecture)"),
    "MiniMaxAI/MiniMax-M2.5": ("tests/fixtures/hf/corpus/minimax-m2.5.json", ""),
    "MiniMaxAI/MiniMax-M2": ("tests/fixtures/hf/corpus/minimax-m2.json", ""),
    "zai-org/GLM-4.7-Flash": (
        "tests/fixtures/hf/corpus/glm-4.7-flash.json",
        "GLM-4.7-Flash's config as aiconfigurator abridges it (every shape kvplan reads)",
    ),
    "meta-llama/Llama-3.3-70B-Instruct": (
        "llama3.1-70b",
        "Llama-3.3-70B as Llama-3.1-70B (same architecture)",
    ),
    "meta-llama/Llama-3.1-405B": ("llama3.1-405b", ""),
    "meta-llama/Llama-3.1-70B": ("tests/fixtures/hf/corpus/llama-3.1-70b.json", ""),
    "meta-llama/Llama-3.2-3B": (
        "tests/fixtures/hf/corpus/llama-3.2-3b-instruct.json",
        "Llama-3.2-3B as its Instruct config (same shapes)",
    ),
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": (
        "tests/fixtures/hf/corpus/llama-4-scout-17b-16e-instruct.json",
        "",
    ),
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct": (
        "tests/fixtures/hf/corpus/llama-4-maverick-17b-128e-instruct.json",
        "",
    ),
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": (
        "tests/fixtures/hf/corpus/qwen3-coder-480b-a35b-instruct.json",
        "",
    ),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B": ("tests/fixtures/hf/corpus/nemotron-3-nano-30b-a3b.json", ""),
    "zai-org/GLM-5.1": (
        "tests/fixtures/hf/corpus/glm-5.1.json",
        "GLM-5.1's config.json (the FP8 checkpoint's weights as fp8)",
    ),
}

METRICS = ("ttft", "tpot", "throughput")
SHORTFALL = 0.02  # rule 7: outputs more than 2% short of the requested tokens
OUTLIER_MEAN = (
    10.0  # at concurrency 1, a mean TTFT this many times its median is an outlier's: the median is compared
)


@dataclass
class Case:
    line: int  # data row number in the TSV (1-based, header excluded)
    url: str
    source: str
    gpu: str
    engine: str
    kind: str  # dense | moe | hybrid
    model: str  # the row's model id
    flags: dict[str, Any]  # kvplan.simulate's deployment flags
    workload: dict[str, Any]  # kvplan.simulate's workload flags
    published: dict[str, tuple[str, float]]  # metric -> (statistic, value)
    skipped: dict[str, str] = field(default_factory=dict)  # metric -> why it is not compared
    notes: list[str] = field(default_factory=list)

    @property
    def frozen(self) -> bool:
        return is_frozen(self.source)

    @property
    def bucket(self) -> tuple[str, str, str]:
        return (self.gpu, self.engine, self.kind)


# source key -> the startup logs of that source that show no GPU peer-to-peer (tests/fixtures/logs/real)
NO_P2P = {
    "https://github.com/dennislee22/": (
        "vllm_0.10.1.1_qwen2-7b-instruct_a100-80gb_tp2.log",
        "vllm_0.10.1.1_qwen2-7b-instruct_a100-80gb_tp2_util0.25.log",
    ),
}
NO_P2P_LINE = "Custom allreduce is disabled because your platform lacks GPU P2P capability"


def _has_gpu(name: str) -> bool:
    try:
        load_gpu(name)
    except KvplanError:
        return False
    return True


def source_of(url: str) -> str:
    url = SAME_SOURCE.get(url, url)
    return next((k for k in SOURCE_KEYS if url.startswith(k)), url)


def _int(text: str) -> int | None:
    head = text.split(" ")[0].strip()
    return int(head) if head.isdigit() else None


def _float(text: str) -> float | None:
    try:
        v = float(text.split(" ")[0])
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _rate(text: str) -> float | None:
    if text.startswith("unknown"):
        return None
    if "inf" in text:
        return math.inf
    return _float(text)


def _kind(model: str) -> str:
    spec = load_model(model)
    attention = (
        "FullAttention",
        "SlidingWindow",
        "ChunkedAttention",
        "CompressedAttention",
        "LatentAttention",
    )
    if any(type(layer).__name__ not in attention for layer in spec.layers):
        return "hybrid"  # state-space / linear-attention layers beside attention
    return "moe" if spec.moe else "dense"


def exclusion(r: dict[str, str]) -> str | None:
    """Why the row cannot be replayed (rules 1-8 of the module docstring), or None."""
    notes = r["notes"]
    if r["dataset"] == "sharegpt":
        return "ShareGPT prompts: kvplan ships no ShareGPT length histogram"
    if r["dataset"] != "random" or _int(r["input_len"]) is None or _int(r["output_len"]) is None:
        return f"dataset or lengths not stated (dataset {r['dataset']!r}, output {r['output_len']!r})"
    if (
        _int(r["tp"]) is None or _int(r["pp"]) is None
    ):  # "1 (not set)": the engine's default, stated by absence
        return "parallel layout not stated"
    if ("MTP" in notes or "EAGLE" in notes or "speculative" in notes) and _speculative(notes) is None:
        return "speculative decoding: its method, draft tokens or acceptance length not stated"
    if r["gpu"] not in GPUS:
        return f"GPU {r['gpu']!r}: no shipped GPU spec"
    if not any(r["model"].startswith(p) for p in MODELS):
        return f"no kvplan spec for {r['model']}"
    if _int(r["num_prompts"]) is None:
        return "num_prompts not stated"
    if _rate(r["request_rate"]) is None:
        return "request rate not stated"
    if r["range_ratio"].startswith("unknown"):
        return "random range ratio not stated"
    m = re.search(r"generated tokens (\d+) vs (\d+) requested", notes)
    if m and "no --ignore-eos" in notes and int(m[1]) < (1 - SHORTFALL) * int(m[2]):
        return f"no --ignore-eos and the outputs fell short: {int(m[1]):,} of {int(m[2]):,} tokens"
    m = re.search(r"successful requests (\d+) of (\d+)", notes) or re.search(
        r"--num-prompts (\d+); successful (\d+)", r["num_prompts"]
    )
    if m and int(m[1]) != int(m[2]):
        return f"failed requests (successful and sent differ: {m[1]} / {m[2]})"
    if all(_published(r, k) is None for k in METRICS):
        return "no TTFT, TPOT/ITL or output throughput published"
    return None


def _published(r: dict[str, str], metric: str) -> tuple[str, float] | None:
    cols = {
        "ttft": (("mean", "ttft_mean_ms"), ("median", "ttft_median_ms")),
        "tpot": (("mean", "tpot_mean_ms"), ("median", "tpot_median_ms"), ("itl_median", "itl_median_ms")),
        "throughput": (("output", "output_throughput"),),
    }[metric]
    for stat, col in cols:
        v = _float(r[col])
        if v is not None and v > 0:
            return stat, v
    return None


def _outlier_ttft(r: dict[str, str]) -> tuple[float, str] | None:
    """(the median TTFT, why) where the published mean is over OUTLIER_MEAN x the median (at concurrency 1)."""
    mean, median = _float(r["ttft_mean_ms"]), _float(r["ttft_median_ms"])
    if not mean or not median or mean <= OUTLIER_MEAN * median:
        return None
    return (
        median,
        f"mean TTFT {mean:,.0f} ms is {mean / median:.0f}x its median at concurrency 1: the median is compared",
    )


def _speculative(notes: str) -> tuple[int, float] | None:
    """(MTP draft tokens, acceptance length) when the row states both ('MTP with 3 speculative tokens',
    'acceptance length 1.64'), else None."""
    steps = re.search(r"MTP with (\d+) speculative tokens?", notes)
    accept = re.search(r"acceptance length ([\d.]+)", notes)
    if steps is None or accept is None:
        return None
    return int(steps[1]), float(accept[1])


def _parallel_flags(notes: str, engine: str) -> dict[str, Any]:
    """Expert parallelism and DP attention as the row's launch states them."""
    flags: dict[str, Any] = {}
    dp = re.search(r"--dp(?:-size)? (\d+)", notes)
    if engine == "sglang" and ("DP ATTENTION" in notes or "--enable-dp-attention" in notes):
        flags["enable_dp_attention"] = True
        flags["data_parallel_size"] = int(dp[1]) if dp else 1  # SGLang's --dp-size default
    if engine == "sglang" and (ep := re.search(r"--ep(?:-size)? (\d+)", notes)):
        flags["ep_size"] = int(ep[1])
    if engine == "vllm" and "--enable-expert-parallel" in notes:
        flags["enable_expert_parallel"] = True
        if m := re.search(r"--data-parallel-size (\d+)", notes):
            flags["data_parallel_size"] = int(m[1])
    if (spec := _speculative(notes)) is not None:
        steps, accept = spec
        if engine == "vllm":
            flags["speculative_config"] = f'{{"method": "mtp", "num_speculative_tokens": {steps}}}'
        else:
            flags["speculative_algorithm"], flags["speculative_num_steps"] = "NEXTN", steps
        flags["acceptance_length"] = accept
    return flags


def _engine_flags(r: dict[str, str], engine: str) -> dict[str, Any]:
    """Dtypes, batch limits and prefix caching as the row states them (else the engine's defaults)."""
    flags: dict[str, Any] = {}
    w, mid = r["weight_dtype"].lower(), r["model"].lower()
    if "fp8" in mid or w.startswith("fp8"):
        flags["weight_dtype"] = "fp8"
    elif "awq" in mid or w.startswith("awq"):
        flags["weight_dtype"] = "int4"
    if r["kv_dtype"].startswith("fp8"):
        flags["kv_cache_dtype"] = "fp8"
    if (n := _int(r["max_num_seqs"])) is not None:
        flags["max_running_requests" if engine == "sglang" else "max_num_seqs"] = n
    if (n := _int(r["max_num_batched_tokens"])) is not None:
        if engine == "sglang":
            flags["chunked_prefill_size"] = n
        else:
            flags["max_num_batched_tokens"] = str(n)
    flags["enable_prefix_caching"] = not r["prefix_caching"].startswith("off")
    if m := re.search(r"--(?:block|page)-size (\d+)", r["notes"]):
        flags["block_size"] = int(m[1])
    flags.update(_parallel_flags(r["notes"], engine))
    return flags


def _case(line: int, r: dict[str, str]) -> Case:
    notes: list[str] = []
    model_id = r["model"]
    # the longest prefix names the model: MiniMax-M2 is a prefix of MiniMax-M2.5
    model, twin = MODELS[max((p for p in MODELS if model_id.startswith(p)), key=len)]
    if twin:
        notes.append(twin)
    engine = "sglang" if r["engine"].lower().startswith("sglang") else "vllm"
    tp, pp = _int(r["tp"]), _int(r["pp"])
    assert tp is not None and pp is not None
    gpu = GPUS[r["gpu"]]
    flags: dict[str, Any] = {
        "gpus": f"{tp * pp}x{gpu}",
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "engine": engine,
        "calibration": False,  # the terms fitted to published runs, never this machine's profile
    }
    version = re.match(r"(\d+\.\d+\.\d+)", r["engine_version"])
    if version:
        flags["engine_version"] = version[1]
    else:
        notes.append(f"engine version {r['engine_version'][:40]!r}: kvplan's default")
    flags.update(_engine_flags(r, engine))
    text = r["notes"]
    if re.search(r"TP\d across (?:\d+|different) nodes", text) and pp == 1:  # one GPU per node
        flags["gpus"] = f"{tp}x1x{gpu}"
        notes.append("TP across nodes, one GPU each: the network is not stated (kvplan's default, 400G)")
    elif tp * pp > 1 and source_of(r["source_url"]) in NO_P2P and _has_gpu(f"{gpu}-PCIe"):
        flags["gpus"] = f"{tp * pp}x{gpu}-PCIe"
        notes.append(
            f"no GPU peer-to-peer (the source's startup logs: '{NO_P2P_LINE}'): planned on {gpu}-PCIe"
        )
    if m := re.search(r"(?:max_model_len|--max-model-len) (\d+)", text):
        flags["max_model_len"] = m[1]
    if m := re.search(r"KV ([\d.]+) GiB", text):
        flags["kv_cache_memory"] = f"{m[1]}GiB"
    elif m := re.search(r"(?:gpu_memory_utilization|--gpu-memory-utilization) (\d*\.?\d+)", text):
        flags["gpu_memory_utilization"] = float(m[1])
    if "--async-scheduling" in text:
        notes.append("--async-scheduling (not modelled)")
    if "--enforce-eager" in text:  # no CUDA graphs: their memory is not taken; the step still assumes them
        flags["enforce_eager"] = True
        notes.append(
            "--enforce-eager: no CUDA graph memory; the step time is CUDA-graph launched (not modelled)"
        )
    inp, out = _int(r["input_len"]), _int(r["output_len"])
    assert inp is not None and out is not None
    ratio = 0.0
    if "uniform in [1, len]" in r["range_ratio"]:  # SGLang bench_serving, range ratio 0
        inp, out, ratio = -(-inp // 2), -(-out // 2), 0.999
        notes.append("SGLang range ratio 0: lengths uniform in [1, len]")
    elif (v := _float(r["range_ratio"])) is not None:
        ratio = v
    num_prompts = _int(r["num_prompts"])
    workload: dict[str, Any] = {
        "num_prompts": num_prompts,
        "input_len": inp,
        "output_len": out,
        "range_ratio": ratio,
        "request_rate": _rate(r["request_rate"]),
        "max_concurrency": _int(r["max_concurrency"]),
    }
    if "max_model_len" not in flags:  # the engines' default: the model's context
        flags["max_model_len"] = str(load_model(model).max_context)
        notes.append(
            f"--max-model-len not stated: the model's {flags['max_model_len']} (the engine's default)"
        )
    published = {k: v for k in METRICS if (v := _published(r, k)) is not None}
    if workload["max_concurrency"] == 1 and (outlier := _outlier_ttft(r)):
        published["ttft"] = ("median", outlier[0])
        notes.append(outlier[1])
    skipped = {}
    if "prefix-cache hit rates of tens of percent on the random dataset" in text:
        skipped["ttft"] = "prefix-cache hits of unknown size on the seeded random dataset"
    url = r["source_url"]
    return Case(
        line, url, source_of(url), gpu, engine, _kind(model), model_id,
        {"model": model, **flags}, workload, published, skipped, notes,
    )  # fmt: skip


def frozen_sources() -> list[str]:
    """Every source of serving_runs.tsv that FROZEN_RULE puts in the frozen test set."""
    with TSV.open(encoding="utf-8") as fh:
        sources = {source_of(r["source_url"]) for r in csv.DictReader(fh, delimiter="\t")}
    return sorted(s for s in sources if is_frozen(s))


def read_rows() -> tuple[list[Case], list[tuple[int, str, str]]]:
    """(cases to replay, excluded rows as (line, model on GPU, reason))."""
    cases, excluded = [], []
    with TSV.open(encoding="utf-8") as fh:
        for line, r in enumerate(csv.DictReader(fh, delimiter="\t"), 1):
            why = exclusion(r)
            if why is not None:
                excluded.append((line, f"{r['model']} on {r['gpu']}", why))
            else:
                cases.append(_case(line, r))
    return cases, excluded


def simulated(case: Case) -> dict[str, float]:
    """The row replayed: the simulated figure of each published metric (same statistic)."""
    flags = dict(case.flags)
    model = flags.pop("model")
    # a config in the repository, kept relative so the figures file is portable
    if model.startswith("tests/"):
        model = str(REPO / model)
    try:
        res = api.simulate(model, **case.workload, **flags)
    except KvplanError as exc:
        # vLLM sizes its pool whatever --max-model-len is; where kvplan's pool cannot hold one request at
        # the model's context (the engine's default) but the run did, replay at the requests' own length
        if "--max-model-len" not in str(exc) or not any("not stated" in n for n in case.notes):
            raise
        w = case.workload
        need = math.ceil(w["input_len"] * (1 + w["range_ratio"])) + math.ceil(
            w["output_len"] * (1 + w["range_ratio"])
        )
        flags["max_model_len"] = str(need)
        case.flags["max_model_len"] = str(need)
        case.notes.append(
            f"kvplan's pool holds no request at the model's context: replayed at --max-model-len {need}"
        )
        res = api.simulate(model, **case.workload, **flags)
    out: dict[str, float] = {}
    for metric, (stat, _) in case.published.items():
        if metric == "ttft":
            out[metric] = res.ttft_ms.mean if stat == "mean" else res.ttft_ms.median
        elif metric == "tpot":
            s = res.itl_ms if stat == "itl_median" else res.tpot_ms
            out[metric] = s.mean if stat == "mean" else s.median
        else:
            out[metric] = res.output_token_throughput
    out["completed"] = res.completed
    return out


def run_case(case: Case) -> dict[str, Any]:
    """A row's record for serving_check.yaml: what was published, what was simulated, the errors."""
    start = time.perf_counter()
    try:
        sim = simulated(case)
    except KvplanError as exc:
        return {"line": case.line, "error": f"kvplan cannot simulate it: {exc}"}
    rec: dict[str, Any] = {
        "line": case.line,
        "source": case.source,
        "frozen": case.frozen,
        "model": case.model,
        "gpu": case.gpu,
        "engine": case.engine,
        "kind": case.kind,
        "flags": case.flags,
        "workload": {
            k: (str(v) if isinstance(v, float) and math.isinf(v) else v) for k, v in case.workload.items()
        },
        "completed": sim["completed"],
        "metrics": {},
        "notes": case.notes,
        "wall_s": round(time.perf_counter() - start, 2),
    }
    for metric, (stat, pub) in case.published.items():
        m = {"statistic": stat, "published": pub, "simulated": sim[metric], "error": sim[metric] / pub - 1}
        if metric in case.skipped:
            m["not_compared"] = case.skipped[metric]
        rec["metrics"][metric] = m
    return rec


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per split (dev, frozen) and bucket: rows, median |error| and median signed error, per metric."""
    out: dict[str, Any] = {}
    for split in ("dev", "frozen"):
        recs = [r for r in records if "metrics" in r and r["frozen"] == (split == "frozen")]
        buckets = sorted({(r["gpu"], r["engine"], r["kind"]) for r in recs})
        rows = []
        for b in [None, *buckets]:
            mine = [r for r in recs if b is None or (r["gpu"], r["engine"], r["kind"]) == b]
            entry: dict[str, Any] = {
                "gpu": "all" if b is None else b[0],
                "engine": "all" if b is None else b[1],
                "kind": "all" if b is None else b[2],
                "rows": len(mine),
                "sources": len({r["source"] for r in mine}),
            }
            for metric in METRICS:
                errs = [
                    r["metrics"][metric]["error"]
                    for r in mine
                    if metric in r["metrics"] and "not_compared" not in r["metrics"][metric]
                ]
                entry[metric] = (
                    {
                        "n": len(errs),
                        "median_abs": statistics.median(abs(e) for e in errs),
                        "bias": statistics.median(errs),
                    }
                    if errs
                    else {"n": 0}
                )
            rows.append(entry)
        out[split] = rows
    return out


EVIDENCE = REPO / "kvplan" / "data" / "served_evidence.yaml"


def _planned_gpu(rec: dict[str, Any]) -> tuple[str, bool]:
    """The card a record was simulated on (its --gpus flag: '8xH100', '2x1xA100-40GB', '8xH100-PCIe') and
    whether its tensor-parallel group crossed nodes (NODESxPER_NODExGPU)."""
    spec = str(rec["flags"]["gpus"])
    counts = re.match(r"^((?:\d+x)+)", spec)
    assert counts, spec
    return spec[counts.end() :], counts.group(1).count("x") > 1


def held_out_evidence(data: dict[str, Any]) -> dict[str, Any]:
    """kvplan/data/served_evidence.yaml: per bucket (the card simulated, engine, kind, TP across nodes or not),
    the served TPOT and TTFT errors of every replayed row (dev and frozen: none is fitted), for
    kvplan/speed/evidence.py to print beside the figures of a plan in that bucket."""

    def stats(recs: list[dict[str, Any]], metric: str) -> dict[str, Any] | None:
        got = [
            (r["metrics"][metric]["error"], r["source"])
            for r in recs
            if metric in r["metrics"] and "not_compared" not in r["metrics"][metric]
        ]
        if not got:
            return None
        errs = [e for e, _ in got]
        return {
            "rows": len(errs),
            "sources": len({s for _, s in got}),
            "median_abs": round(statistics.median(abs(e) for e in errs), 4),
            "median_signed": round(statistics.median(errs), 4),
        }

    recs = data["records"]
    by: dict[tuple[str, str, str, bool], list[dict[str, Any]]] = {}
    for r in recs:
        gpu, across = _planned_gpu(r)
        by.setdefault((gpu, r["engine"], r["kind"], across), []).append(r)
    buckets = []
    for (gpu, engine, kind, across), mine in sorted(by.items()):
        entry: dict[str, Any] = {"gpu": gpu, "engine": engine, "kind": kind, "across_nodes": across}
        for metric in ("tpot", "ttft"):
            if (s := stats(mine, metric)) is not None:
                entry[metric] = s
        buckets.append(entry)
    overall = {m: s for m in ("tpot", "ttft") if (s := stats(recs, m)) is not None}
    return {
        "schema": "kvplan.served-evidence/1",
        "what": "kvplan simulate against published serving runs it never fitted, per bucket: median |error| and "
        "median signed error (> 0: kvplan higher) of TPOT and TTFT; written by benchmarks/serving_check.py from "
        "benchmarks/results/serving_check.yaml",
        "overall": overall,
        "buckets": buckets,
    }


def write_evidence(data: dict[str, Any]) -> None:
    import yaml

    text = yaml.safe_dump(held_out_evidence(data), sort_keys=False, width=120)
    tmp = EVIDENCE.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(EVIDENCE)


README_MARK = (
    "<!-- serving-accuracy: written by benchmarks/serving_check.py --readme -->",
    "<!-- /serving-accuracy -->",
)


def _cell(m: dict[str, Any]) -> str:
    return "-" if not m["n"] else f"{m['median_abs']:.0%} ({m['bias']:+.0%}, {m['n']})"


def readme_block(data: dict[str, Any]) -> str:
    """README's figures, from serving_check.yaml."""
    s = data["summary"]
    dev_all, frozen_all = s["dev"][0], s["frozen"][0]
    lines = [
        README_MARK[0],
        f"- {data['replayed']} of {data['rows']} published runs replayed; {data['excluded']} excluded by rules "
        "written before any error was seen (ShareGPT: no length histogram; unstated layout or lengths; speculative "
        "decoding without its method, tokens and acceptance; no GPU spec or model config; outputs short without "
        "`--ignore-eos`; failed requests), and "
        f"{data['refused']} that kvplan refuses to plan although the engine served them (its memory estimate "
        "leaves no room for the KV cache or for one request).",
        f"- Split by source (fit_decode's frozen rule): dev {dev_all['rows']} rows from {dev_all['sources']} "
        f"sources; frozen test set {frozen_all['rows']} rows"
        + (
            f" from {frozen_all['sources']} sources."
            if frozen_all["rows"]
            else f" (the rule picks {', '.join(data['frozen_sources']) or 'no source'}, none of whose rows can be replayed)."
        ),
        "- Nothing is fitted to these rows: every one is out of sample for the simulator (its decode step "
        "comes from the decode fit and the prefill model, whose dev sources include gpustack's ShareGPT "
        "concurrency-4 rows and the SGLang Cookbook's concurrency-1 B200 rows: other runs of those harnesses).",
        "- Each cell: median |error| (median signed error, > 0: simulated higher; rows compared). TTFT and TPOT "
        "as published (mean, else median; median ITL where only ITL is published); output tokens/s.",
        "",
        "| split | GPU | engine | kind | rows | TTFT | TPOT | output tok/s |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for split in ("dev", "frozen"):
        for b in s[split]:
            lines.append(
                f"| {split} | {b['gpu']} | {b['engine']} | {b['kind']} | {b['rows']} | {_cell(b['ttft'])} | "
                f"{_cell(b['tpot'])} | {_cell(b['throughput'])} |"
            )
    lines.append(README_MARK[1])
    return "\n".join(lines)


def write_readme(data: dict[str, Any]) -> None:
    readme = REPO / "README.md"
    text = readme.read_text(encoding="utf-8")
    a, b = text.index(README_MARK[0]), text.index(README_MARK[1]) + len(README_MARK[1])
    readme.write_text(text[:a] + readme_block(data) + text[b:], encoding="utf-8")


def load() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(OUT.read_text(encoding="utf-8"))


def print_record(rec: dict[str, Any]) -> None:
    if "metrics" not in rec:
        print(f"  line {rec['line']}: {rec['error']}")
        return
    parts = []
    for metric, m in rec["metrics"].items():
        tag = " (not compared)" if "not_compared" in m else ""
        parts.append(
            f"{metric} {m['statistic']} {m['published']:,.1f} -> {m['simulated']:,.1f} ({m['error']:+.0%}){tag}"
        )
    split = "frozen" if rec["frozen"] else "dev"
    print(f"  line {rec['line']:>3} [{split}] {rec['model'][:36]:<36} {rec['gpu']:<9} {rec['engine']:<6} "
          f"{rec['kind']:<6}: " + "; ".join(parts) + f"  [{rec['wall_s']:.1f} s]")  # fmt: skip


def main(argv: list[str]) -> None:
    import yaml

    if "--readme" in argv:
        write_readme(load())
        write_evidence(load())
        print(f"wrote README.md's serving-accuracy block and {EVIDENCE.relative_to(REPO)}")
        return
    cases, excluded = read_rows()
    if "--lines" in argv:
        wanted = {int(x) for x in argv[argv.index("--lines") + 1].split(",")}
        for c in cases:
            if c.line in wanted:
                print_record(run_case(c))
        return
    print(f"{len(cases)} rows to replay, {len(excluded)} excluded:")
    for line, what, why in excluded:
        print(f"  line {line}: {what}: {why}")
    records = []
    for c in cases:
        rec = run_case(c)
        print_record(rec)
        records.append(rec)
    failed = [r for r in records if "metrics" not in r]
    summary = summarize(records)
    for split in ("dev", "frozen"):
        print(f"\n{split}:")
        for b in summary[split]:
            print(f"  {b['gpu']:<9} {b['engine']:<6} {b['kind']:<6} rows {b['rows']:>3}: "
                  + ", ".join(f"{m} {_cell(b[m])}" for m in METRICS))  # fmt: skip
    data = {
        "schema": SCHEMA,
        "what": "kvplan simulate against published serving runs (benchmarks/serving_check.py); nothing fitted here",
        "frozen_rule": "fit_decode.FROZEN_RULE: the first hex digit of sha256(source key) is 0-3",
        "frozen_sources": frozen_sources(),
        "rows": len(cases) + len(excluded),
        "replayed": len(records) - len(failed),
        "excluded": len(excluded),
        "refused": len(failed),
        "excluded_rows": [{"line": line, "what": what, "reason": why} for line, what, why in excluded],
        "refused_rows": [{"line": r["line"], "reason": r["error"]} for r in failed],
        "summary": summary,
        "records": [r for r in records if "metrics" in r],
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(yaml.safe_dump(data, sort_keys=False, width=120), encoding="utf-8")
    write_readme(data)
    write_evidence(data)
    print(
        f"\nwrote {OUT.relative_to(REPO)}, {EVIDENCE.relative_to(REPO)} and README.md's serving-accuracy block"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
