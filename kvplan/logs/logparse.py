"""Read a pasted vLLM (V0 or V1) or SGLang startup log: the setup it names and the numbers it prints.

Only facts the log states are extracted; nothing is guessed here. Sizes are returned in
bytes. vLLM's V0 "GB" figures are GiB (it divides by 2**30), as are SGLang's "GB".
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from typing import Any

from kvplan.errors import UsageError
from kvplan.units import GiB

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"


def _f(text: str) -> float:
    """A number from the log, finite and below 2**53 (a 400-digit count is not a real log)."""
    value = float(text.replace(",", ""))
    if not math.isfinite(value) or abs(value) > 2**53:
        raise UsageError(f"the log's number {text[:24]!r} is out of range; paste the engine's own log")
    return value


def _count(text: str) -> int:
    """A count from the log (tokens, blocks, requests): the engines print whole numbers ('93,872')."""
    value = _f(text)
    if value != int(value):
        raise UsageError(
            f"the log's count {text[:24]!r} is not a whole number (the engines print counts as 93,872); "
            "paste the engine's own log"
        )
    return int(value)


def _gib(text: str) -> int:
    return round(_f(text) * GiB)


@dataclass
class ParsedLog:
    engine: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, str] = field(default_factory=dict)  # fact -> the line it came from
    # SGLang: per rank, the "Load weight end" lines read (and "draft" once its draft model loaded)
    loads: dict[str, set[str]] = field(default_factory=dict, repr=False, compare=False)

    def get(self, key: str, default: Any = None) -> Any:
        return self.facts.get(key, default)

    def put(self, key: str, value: Any, line: str, keep: str = "first") -> None:
        """Record a fact; `keep` decides between repeats: first, last or min (across TP workers)."""
        if self.engine == "sglang":
            key = _sglang_draft_key(self, key, line)
        if key in _LAYOUT_FACTS and key in self.facts and self.facts[key] != value:
            # vLLM prints the arguments as given and then the engine's resolved config: one startup's two
            # lines naming two layouts is a log edited or spliced, and either reading would be a guess
            raise UsageError(
                f"the log names {key} {self.facts[key]} and then {value} (line {line.strip()[:60]!r}): "
                "paste one startup's log as the engine printed it"
            )
        if key == "version" and key in self.facts and release_of(self.facts[key]) != release_of(value):
            # a log spliced from two startups, or edited: read by the first, and check-log says so
            self.facts.setdefault("version_conflict", (self.facts[key], value))
        if key == "configured_max_model_len" and self.facts.get(key, value) != value:
            # vLLM prints its arguments and then the engine config built from them (max_seq_len), SGLang its
            # ServerArgs once: two lengths in one startup's lines is a log spliced from two, or edited
            self.facts.setdefault("max_model_len_conflict", (self.facts[key], value))
        if key in self.facts:
            if keep == "first" or (keep == "min" and value >= self.facts[key]):
                return
        self.facts[key] = value
        self.evidence[key] = line.strip()


def release_of(version: str) -> tuple[int, int]:
    """'0.11.0', 'v0.11.0rc2.dev113+g...' -> (0, 11): the release a version line names (the lines this
    module reads a version from hold major.minor first)."""
    m = re.match(r"v?(\d+)\.(\d+)", str(version))
    assert m is not None, version
    return int(m.group(1)), int(m.group(2))


# (pattern, fact, converter, keep) for lines that carry one number each
_VLLM_NUMBERS: list[tuple[re.Pattern, str, Any, str]] = [
    (re.compile(r"Available KV cache memory: " + _NUM + r" ?GiB"), "available_kv_bytes", _gib, "min"),
    (
        re.compile(r"the rest of the memory reserved for KV Cache is " + _NUM + r" ?GiB"),
        "available_kv_bytes",
        _gib,
        "min",
    ),
    (re.compile(r"available_kv_cache_memory\s+" + _NUM + r" ?GiB"), "available_kv_bytes", _gib, "min"),
    # vLLM 0.6.4 (worker.py, PR #9352): "Memory profiling results: total_gpu_memory=79.10GiB ...
    # non_torch_memory=1.79GiB kv_cache_size=53.29GiB gpu_memory_utilization=0.90"
    (re.compile(r"kv_cache_size=" + _NUM + r" ?GiB"), "available_kv_bytes", _gib, "min"),
    (re.compile(r"non_torch_memory=" + _NUM + r" ?GiB"), "non_torch_bytes", _gib, "last"),
    (re.compile(r"total_gpu_memory=" + _NUM + r" ?GiB"), "total_gpu_memory_bytes", _gib, "first"),
    (re.compile(r"gpu_memory_utilization=" + _NUM + r"(?!\d)"), "gpu_memory_utilization", _f, "first"),
    (re.compile(r"GPU KV cache size: " + _NUM + r" tokens"), "kv_cache_tokens", _count, "min"),
    (re.compile(r"# (?:GPU|CUDA) blocks: " + _NUM), "num_gpu_blocks", _count, "min"),
    (re.compile(r"Model loading took " + _NUM + r" ?GiB"), "weights_bytes", _gib, "last"),
    # vLLM 0.8.x V1 (vllm/v1/worker/gpu_model_runner.py load_model): "Model loading took %.4f GB" of bytes / 2**30
    (re.compile(r"Model loading took " + _NUM + r" ?GB\b"), "weights_bytes", _gib, "last"),
    (re.compile(r"Loading model weights took " + _NUM + r" ?GB"), "weights_bytes", _gib, "last"),
    (re.compile(r"model weights take " + _NUM + r" ?GiB"), "weights_bytes", _gib, "last"),
    (re.compile(r"non_torch_memory(?: takes)?\s+" + _NUM + r" ?GiB"), "non_torch_bytes", _gib, "last"),
    (
        re.compile(r"PyTorch activation peak memory(?: takes)?\s+" + _NUM + r" ?GiB"),
        "activation_bytes",
        _gib,
        "last",
    ),
    (re.compile(r"Estimated CUDA graph memory: " + _NUM + r" ?GiB"), "cuda_graph_bytes", _gib, "last"),
    (re.compile(r"total_gpu_memory \(?" + _NUM + r" ?GiB"), "total_gpu_memory_bytes", _gib, "first"),
    (re.compile(r"total_gpu_memory\s+" + _NUM + r" ?GiB"), "total_gpu_memory_bytes", _gib, "first"),
    (re.compile(r"gpu_memory_utilization\s+\(?" + _NUM + r"\)?"), "gpu_memory_utilization", _f, "first"),
    (
        re.compile(r"--gpu-memory-utilization=" + _NUM + r" is equivalent"),
        "gpu_memory_utilization",
        _f,
        "first",
    ),
    # "Chunked prefill is enabled with max_num_batched_tokens=N" is printed once before the usage
    # context's defaults are applied (EngineArgs, vllm/engine/arg_utils.py) and again after; the
    # engine config runs with the last value printed
    (re.compile(r"max_num_batched_tokens=" + _NUM), "max_num_batched_tokens", _count, "last"),
    (re.compile(r"Add " + _NUM + r" padding layers"), "padding_layers", _count, "first"),
]
# vLLM >= 0.10.2 (vllm/v1/worker/gpu_worker.py, after the CUDA graph capture): the profiler's breakdown
_USAGE = re.compile(
    r"Actual usage is " + _NUM + r" ?GiB for weight, " + _NUM + r" ?GiB for peak activation, " + _NUM
    + r" ?GiB for non-torch memory, and " + _NUM + r" ?GiB for CUDAGraph memory"
)  # fmt: skip
_FREE_AT_START = re.compile(r"Free memory on device \(" + _NUM + r"/" + _NUM + r" ?GiB\) on startup")
# vllm/v1/sample/ops/topk_topp_sampler.py: which top-k/top-p sampler the profiling run used
_SAMPLER = (
    (re.compile(r"Using FlashInfer for top-p & top-k sampling"), "flashinfer"),
    (re.compile(r"PyTorch-native implementation of top-p & top-k sampling"), "native"),
)
_CONCURRENCY = re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + r"x")
# vllm/v1/core/kv_cache_utils.py _auto_fit_max_model_len (vLLM --max-model-len auto)
_AUTO_FIT = re.compile(r"Auto-fit max_model_len: reduced from " + _NUM + r" to " + _NUM)
_AUTO_FULL = re.compile(r"Auto-fit max_model_len: full model context length " + _NUM + r" fits")
# vLLM's engine config line: speculative_config=SpeculativeConfig(method='mtp', model=..., num_spec_tokens=3)
_SPEC_CONFIG = re.compile(
    r"speculative_config=SpeculativeConfig\(method='(\w+)'.*?num_spec_tokens=([^,)\s]*)\)"
)
# vllm/config/model.py: "Resolved `--runner auto` to `--runner pooling`"; a runner given is in the args
_RUNNER = re.compile(
    r"Resolved `--runner auto` to `--runner (generate|pooling)`|'runner': '(generate|pooling)'"
)
_VERSION = re.compile(
    r"(?:LLM engine|vLLM API server version|vLLM version)[\s:(]*v?(\d+\.\d+(?:\.\d+)?[\w.+-]*)"
)
_V1 = re.compile(r"V1 LLM engine|EngineCore|gpu_worker\.py|kv_cache_utils\.py|GPU KV cache size")
_V0 = re.compile(r"# (?:GPU|CUDA) blocks:|Initializing an LLM engine")

# key=value pairs of vLLM's engine-config line and SGLang's ServerArgs(...)
_KV_PAIR = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|\"[^\"]*\"|[^,)\s]+)")
# 'key': value pairs of vLLM's "non-default args: {...}" line
DICT_PAIR = re.compile(r"'(\w+)': ('(?:[^'\\]|\\.)*'|[^,}]+)")

# "#tokens: N, " since SGLang ~0.4.4; before it the line gave the K and V sizes alone (the count came on the
# max_total_num_tokens= line)
_SGLANG_KV = re.compile(
    r"KV Cache is allocated\.(?: dtype: [\w.]+,)?(?: #tokens: "
    + _NUM
    + r",)? (?:K size: "
    + _NUM
    + r" GB, V size: "
    + _NUM
    + r" GB|KV size: "
    + _NUM
    + r" GB)"
)
_SGLANG_NUMBERS: list[tuple[re.Pattern, str, Any, str]] = [
    (re.compile(r"max_total_num_tokens=" + _NUM), "kv_cache_tokens", _count, "min"),
    (re.compile(r"full_layer_tokens=" + _NUM), "kv_cache_tokens", _count, "min"),
    (re.compile(r"swa_layer_tokens=" + _NUM), "swa_kv_cache_tokens", _count, "min"),
    (re.compile(r"Load weight end\..*?mem usage=" + _NUM + r" GB"), "weights_bytes", _gib, "last"),
    (re.compile(r"Load weight begin\. avail mem=" + _NUM + r" GB"), "free_at_start_bytes", _gib, "min"),
    # DeepSeek-V4's pools are sized from one budget, printed per rank (0.5.11+, DSV4PoolConfigurator in
    # model_executor/pool_configurator.py): "DSv4 memory calculation: bytes_per_full_token=...,
    # available_bytes=87.26 GB, full_token=529408" (GB = GiB there: 87.26 GiB / 176983.05 B = 529,397,
    # page-rounded 529,408); full_token is the un-windowed token count, not the pool tokens kvplan prints
    (
        re.compile(r"DSV4 memory calculation:.*?available_bytes=" + _NUM + r" GB", re.I),
        "available_kv_bytes",
        _gib,
        "min",
    ),
    (re.compile(r"available_gpu_mem=" + _NUM + r" GB"), "available_gpu_mem_after_bytes", _gib, "min"),
    (re.compile(r"context_len=" + _NUM), "max_model_len", _count, "first"),
]

# config keys -> facts (vLLM engine config and non-default args; SGLang ServerArgs)
_CONFIG_KEYS = {
    "model": "model",
    "model_path": "model",
    "model_tag": "model",
    "max_seq_len": "max_model_len",
    "max_model_len": "max_model_len",
    "context_length": "max_model_len",
    "tensor_parallel_size": "tensor_parallel_size",
    "tp_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size",
    "pp_size": "pipeline_parallel_size",
    "data_parallel_size": "data_parallel_size",
    "dp_size": "data_parallel_size",
    "kv_cache_dtype": "kv_cache_dtype",
    "quantization": "quantization",
    "dtype": "dtype",
    "enforce_eager": "enforce_eager",
    "enable_prefix_caching": "enable_prefix_caching",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "mem_fraction_static": "mem_fraction_static",
    "block_size": "block_size",
    "page_size": "block_size",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "chunked_prefill_size": "max_num_batched_tokens",
    "max_num_seqs": "max_num_seqs",
    "max_running_requests": "max_num_seqs",
    "num_gpu_blocks_override": "num_gpu_blocks_override",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "swa_full_tokens_ratio": "swa_full_tokens_ratio",
    "disable_hybrid_swa_memory": "disable_hybrid_swa_memory",
    "cpu_offload_gb": "cpu_offload_gb",
    "max_total_tokens": "max_total_tokens",
    "speculative_algorithm": "sglang_speculative_algorithm",  # SGLang's ServerArgs (vLLM: speculative_config)
    "speculative_num_steps": "sglang_speculative_num_steps",
    "speculative_num_draft_tokens": "sglang_speculative_num_draft_tokens",
}
# settings no engine starts with at 0 (a layout of 0 GPUs, a block of 0 tokens, 0 running requests)
_POSITIVE_FACTS = {
    "max_model_len",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "block_size",
    "max_num_batched_tokens",
    "max_num_seqs",
}
_LAYOUT_FACTS = {"tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"}
_INT_FACTS = _POSITIVE_FACTS | {
    "num_gpu_blocks_override", "kv_cache_memory_bytes", "max_total_tokens", "sglang_speculative_num_steps",
    "sglang_speculative_num_draft_tokens",
}  # fmt: skip
_FLOAT_FACTS = {"gpu_memory_utilization", "mem_fraction_static", "swa_full_tokens_ratio", "cpu_offload_gb"}
_BOOL_FACTS = {"enforce_eager", "enable_prefix_caching", "disable_hybrid_swa_memory"}
_TRUE, _FALSE = ("True", "true", "1"), ("False", "false", "0")


def _pattern(
    lead: str, table: list[tuple[re.Pattern, str, Any, str]] = _VLLM_NUMBERS
) -> tuple[re.Pattern, ...]:
    return tuple(p for p, *_ in table if p.pattern.startswith(lead))


# the lines the KV and weight rows come from: a line holding one of these words whose figure kvplan cannot
# read (a sign, another unit, 'nan': an edited or corrupted log) is refused, never dropped without a word
_VLLM_LEADS: list[tuple[re.Pattern, tuple[re.Pattern, ...], str]] = [
    (re.compile(r"Available KV cache memory:"), _pattern("Available KV cache memory"), "a size in GiB"),
    (re.compile(r"GPU KV cache size:"), _pattern("GPU KV cache size"), "a count of tokens"),
    (re.compile(r"# (?:GPU|CUDA) blocks:"), _pattern("# (?:GPU|CUDA) blocks"), "a count of blocks"),
    (re.compile(r"Maximum concurrency for"), (_CONCURRENCY,), "tokens per request and a factor ('13.53x')"),
    (re.compile(r"Model loading took"), _pattern("Model loading took"), "a size in GiB"),
    (re.compile(r"Auto-fit max_model_len: (?:reduced|full)"), (_AUTO_FIT, _AUTO_FULL), "token counts"),
]
_SGLANG_LEADS: list[tuple[re.Pattern, tuple[re.Pattern, ...], str]] = [
    (
        re.compile(r"KV Cache is allocated\.(?: dtype: [\w.]+,)? (?:#tokens|K size|KV size):"),
        (_SGLANG_KV,),
        "a token count and sizes in GB",
    ),
    (
        re.compile(r"max_total_num_tokens="),
        _pattern("max_total_num_tokens=", _SGLANG_NUMBERS),
        "a count of tokens",
    ),
    (
        re.compile(r"Load weight end\..*?(?P<at>mem usage=)"),
        _pattern("Load weight end", _SGLANG_NUMBERS),
        "a size in GB",
    ),
    (
        re.compile(r"Load weight begin\. (?P<at>avail mem=)"),
        _pattern("Load weight begin", _SGLANG_NUMBERS),
        "a size in GB",
    ),
]


def _check_read(line: str, leads: list[tuple[re.Pattern, tuple[re.Pattern, ...], str]]) -> None:
    for lead, patterns, what in leads:
        m = lead.search(line)
        if m and not any(p.search(line) for p in patterns):
            start = m.start("at") if "at" in lead.groupindex else m.start()  # the figure, not the line's head
            text = line[start : start + 90].strip()
            sign = (
                " (a negative figure: the engine stops before serving)"
                if re.search(r"[:=]\s*-\d", text)
                else ""
            )
            raise UsageError(
                f"cannot read the line {text!r}: kvplan reads {what} there{sign}; paste the engine's own "
                "startup log, unedited"
            )


def _value(raw: str) -> Any:
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return raw[1:-1]
    return raw


def _config(log: ParsedLog, line: str, pairs: re.Pattern) -> None:
    for key, raw in pairs.findall(line):
        if key == "chunked_prefill_size":  # SGLang; -1 turns chunking off (no batched-tokens figure)
            _chunked_prefill(log, line, _value(raw))
            if _value(raw).startswith("-"):
                continue
        fact = _CONFIG_KEYS.get(key)
        if fact is None:
            continue
        value = _value(raw)
        if value in ("None", "null", ""):
            continue
        if key in ("max_model_len", "max_seq_len") and value in ("-1", "auto"):  # vLLM's; not SGLang's
            # vLLM --max-model-len auto (or -1): fitted to the KV memory after profiling
            # (vllm/v1/core/kv_cache_utils.py _auto_fit_max_model_len); the fitted length is read from
            # the "Auto-fit max_model_len" and "Maximum concurrency" lines
            log.put("max_model_len_auto", True, line)
            continue
        value = _typed(key, fact, value)
        if fact == "dtype":
            value = value.replace("torch.", "")
        log.put(fact, value, line)
        if fact == "max_model_len":
            log.put("configured_max_model_len", value, line)


def _typed(key: str, fact: str, value: str) -> Any:
    """A config value as its fact's type; a figure an engine would not start with is refused, not skipped."""
    try:
        if fact in _INT_FACTS:
            number: Any = _count(value)
        elif fact in _FLOAT_FACTS:
            number = _f(value)
        elif fact in _BOOL_FACTS:
            if value not in _TRUE + _FALSE:
                raise UsageError(
                    f"the log's {key}={value[:24]} is neither True nor False; paste the engine's own log"
                )
            return value in _TRUE
        else:
            return value
    except ValueError:
        raise UsageError(
            f"the log's {key}={value[:24]} is not a number; paste the engine's own log"
        ) from None
    if number < 0:
        raise UsageError(f"the log's {key}={value[:24]} is negative; paste the engine's own log")
    if number == 0 and fact in _POSITIVE_FACTS:
        raise UsageError(
            f"the log's {key}=0 is not a setting the engine starts with; paste the engine's own log"
        )
    return number


def _chunked_prefill(log: ParsedLog, line: str, value: str) -> None:
    try:
        chunk = _count(value.lstrip("-")) * (-1 if value.startswith("-") else 1)
    except ValueError:
        raise UsageError(
            f"the log's chunked_prefill_size={value[:24]} is not a number; paste the engine's own log"
        ) from None
    log.put("chunked_prefill_size", chunk, line)


def _sglang_line(log: ParsedLog, line: str) -> None:
    if "ServerArgs(" in line:
        _config(log, line.split("ServerArgs(", 1)[1], _KV_PAIR)
    m = _SGLANG_KV.search(line)
    if m:
        if m.group(1):
            log.put("kv_cache_tokens", _count(m.group(1)), line, keep="min")
        if m.group(2):
            log.put("k_size_bytes", _gib(m.group(2)), line, keep="min")
            log.put("v_size_bytes", _gib(m.group(3)), line, keep="min")
        else:
            log.put("kv_size_bytes", _gib(m.group(4)), line, keep="min")
    for pattern, fact, conv, keep in _SGLANG_NUMBERS:
        m = pattern.search(line)
        if m:
            log.put(fact, conv(m.group(1)), line, keep=keep)
    _check_read(line, _SGLANG_LEADS)
    # not "sglang is using nccl==2.27.7" (0.5.x prints its NCCL version so)
    m = re.search(r"(?:sglang|SGLang)(?! is using)[^\d]{0,20}v?(\d+\.\d+(?:\.\d+)?(?:\.post\d+)?)", line)
    if m:
        log.put("version", m.group(1), line)


_VLLM_CONFIG = re.compile(r"LLM engine \(v([\d.]+\S*?)\) with config")


def _vllm_line(log: ParsedLog, line: str) -> None:
    if m := _VLLM_CONFIG.search(line):
        _config(log, line.split("with config", 1)[1], _KV_PAIR)
        if not re.match(r"0\.1\.dev\d+", m.group(1)):  # the engine's own release, beside the API server's
            log.put("version", m.group(1), line)
    if "non-default args" in line:
        _config(log, line, DICT_PAIR)
    m = _VERSION.search(line)
    if m:
        # setuptools-scm names a build from a checkout without tags 0.1.devN+g<commit>: no release
        untagged = re.match(r"0\.1\.dev\d+", m.group(1))
        log.put("untagged_version" if untagged else "version", m.group(1), line)
    m = _CONCURRENCY.search(line)
    if m:
        log.put("max_model_len", _count(m.group(1)), line, keep="last")
        log.put("max_concurrency", _f(m.group(2)), line, keep="min")
    m = _SPEC_CONFIG.search(line)
    if m:
        tokens = m.group(2)
        if not tokens.isdigit() or int(tokens) < 1:
            raise UsageError(
                f"the log's speculative config gives num_spec_tokens={tokens[:24]}; vLLM runs a whole number >= 1 "
                "(paste the engine's own log)"
            )
        log.put("speculative_method", m.group(1).lower(), line)
        log.put("speculative_tokens", int(tokens), line)
    elif "speculative_config=SpeculativeConfig(" in line:
        raise UsageError(
            "cannot read the log's speculative_config=SpeculativeConfig(...): kvplan reads its method='...' and "
            "num_spec_tokens=N; paste the engine's own log"
        )
    m = _AUTO_FIT.search(line)
    if m:
        log.put("max_model_len_auto", True, line)
        log.put("auto_fit_from", _count(m.group(1)), line, keep="last")
        log.put("auto_fit_to", _count(m.group(2)), line, keep="min")
    elif m := _AUTO_FULL.search(line):
        log.put("max_model_len_auto", True, line)
        log.put("auto_fit_from", _count(m.group(1)), line, keep="last")
    if m := _RUNNER.search(line):
        log.put("runner", m.group(1) or m.group(2), line, keep="last")
    for pattern, fact, conv, keep in _VLLM_NUMBERS:
        m = pattern.search(line)
        if m:
            log.put(fact, conv(m.group(1)), line, keep=keep)
    _vllm_profile_line(log, line)
    _check_read(line, _VLLM_LEADS)


def _vllm_profile_line(log: ParsedLog, line: str) -> None:
    """The profiler's own breakdown of the non-KV memory, where the version prints it."""
    m = _USAGE.search(line)
    if m:
        for fact, group in (("activation_bytes", 2), ("non_torch_bytes", 3), ("cuda_graph_bytes", 4)):
            log.put(fact, _gib(m.group(group)), line, keep="last")
    m = _FREE_AT_START.search(line)
    if m:
        log.put("total_gpu_memory_bytes", _gib(m.group(2)), line)
    for pattern, sampler in _SAMPLER:
        if pattern.search(line):
            log.put("sampler", sampler, line)


def _vllm_format(log: ParsedLog, text: str) -> None:
    log.facts["format"] = "V1" if _V1.search(text) else "V0" if _V0.search(text) else "unknown"


# each engine's log format: (reads one line, reads the whole text once after)
_FORMATS = {"sglang": (_sglang_line, None), "vllm": (_vllm_line, _vllm_format)}

# words every line a reader takes a fact from holds (each pattern above names one of them): only the
# lines holding one are read, found by one scan of the text, so a 64 MiB log of noise reads in a
# second or two, not minutes (tests/test_logparse_anchors.py checks every fixture log reads the same)
_ANCHORS = {
    "vllm": re.compile(
        "|".join(
            re.escape(w)
            for w in (
                "LLM engine",
                "non-default args",
                "vLLM API server version",
                "vLLM version",
                "Maximum concurrency for",
                "KV cache memory",
                "reserved for KV Cache",
                "available_kv_cache_memory",
                "GPU KV cache size",
                "GPU blocks:",
                "CUDA blocks:",
                "Model loading took",
                "Loading model weights took",
                "model weights take",
                "non_torch_memory",
                "PyTorch activation peak memory",
                "Estimated CUDA graph memory",
                "total_gpu_memory",
                "gpu_memory_utilization",
                "--gpu-memory-utilization=",
                "max_num_batched_tokens=",
                "padding layers",
                "Actual usage is",
                "Free memory on device",
                "top-p & top-k sampling",
                "Auto-fit max_model_len",
                "--runner",
            )
        )
    ),  # fmt: skip
    "sglang": re.compile(
        r"ServerArgs\(|KV Cache is allocated|max_total_num_tokens=|full_layer_tokens=|swa_layer_tokens="
        r"|Load weight (?:end|begin)|(?i:DSV4 memory calculation)|available_gpu_mem=|context_len=|sglang|SGLang"
    ),
}


class _Recorder:
    """What a line reader would put, without a log's state: a line's facts depend on it alone."""

    def __init__(self) -> None:
        self.puts: list[tuple[str, Any, str, str]] = []

    def put(self, key: str, value: Any, line: str, keep: str = "first") -> None:
        self.puts.append((key, value, line, keep))


def _anchored_lines(text: str, anchor: re.Pattern):
    """The lines of `text` (as str.splitlines cuts them) that hold `anchor`, in order."""
    done = -1
    for m in anchor.finditer(text):
        if m.start() < done:
            continue
        start = text.rfind("\n", 0, m.start()) + 1
        done = text.find("\n", m.end())
        if done < 0:
            done = len(text)
        for line in text[start:done].splitlines():
            if anchor.search(line):
                yield line


def _which_engine(text: str) -> str | None:
    sglang_marks = r"ServerArgs\(|KV Cache is allocated"
    is_sglang = bool(re.search(sglang_marks + r"|max_total_num_tokens=|sglang", text))
    is_vllm = bool(
        re.search(r"GPU KV cache size|Available KV cache memory|# (?:GPU|CUDA) blocks|LLM engine|vllm", text)
    )
    if is_vllm and not re.search(sglang_marks, text):
        is_sglang = False
    return "sglang" if is_sglang else "vllm" if is_vllm else None


# lines that begin a startup (vLLM's API server and engine; SGLang's server arguments), and lines that
# report its KV cache: a log holding two startups with different figures (a log appended to on every
# restart) is read from the last startup only, never blended
_STARTS = {
    "vllm": re.compile(
        r"vLLM API server version|non-default args|Initializing a V1 LLM engine|Initializing an LLM engine"
    ),
    "sglang": re.compile(r"ServerArgs\("),
}
_KV_REPORTS = {
    "vllm": re.compile(r"GPU KV cache size|Available KV cache memory|# (?:GPU|CUDA) blocks"),
    "sglang": re.compile(r"KV Cache is allocated|max_total_num_tokens="),
}
# facts two startups of one deployment print alike (a log duplicated line for line reads the same)
_STARTUP_FACTS = ("available_kv_bytes", "kv_cache_tokens", "num_gpu_blocks", "weights_bytes", "model",
                  "max_model_len", "tensor_parallel_size")  # fmt: skip


def _startups(text: str, engine: str) -> list[int]:
    """Where each startup that reports a KV cache begins (offsets into text): the first begins the text;
    another begins at the first start line after a KV report, when a KV report follows it."""
    starts = [m.start() for m in _STARTS[engine].finditer(text)]
    begins: list[int] = []
    prev = -1
    for m in _KV_REPORTS[engine].finditer(text):
        i = bisect.bisect_right(starts, prev)
        if not begins:
            begins.append(0)
        elif i < len(starts) and starts[i] < m.start():
            begins.append(text.rfind("\n", 0, starts[i]) + 1)
        prev = m.start()
    return begins


def _mixed(text: str) -> bool:
    return bool(_KV_REPORTS["vllm"].search(text)) and bool(_KV_REPORTS["sglang"].search(text))


def parse(text: str) -> ParsedLog:
    # a log saved on Windows: CRLF as LF, or a hard-wrapped line's pieces would join with their CRs inside
    text = text.replace("\r\n", "\n")
    engine = _which_engine(text)
    if engine is not None and _mixed(text):
        raise UsageError(
            "the log holds both vLLM's and SGLang's KV-cache lines; check one engine's startup log at a time"
        )
    if engine is None:
        return _parse(text, engine)
    if engine == "sglang" and not _KV_REPORTS["sglang"].search(text) and _KV_REPORTS["vllm"].search(text):
        # an SGLang line (ServerArgs(...)) above vLLM's KV-cache lines: a log spliced from two engines
        raise UsageError(
            "the log holds SGLang's lines (ServerArgs(...)) and vLLM's KV-cache lines; check one engine's startup "
            "log at a time"
        )
    begins = _startups(text, engine) or [0]
    parts = [_parse(text[a:b], engine) for a, b in zip(begins, [*begins[1:], len(text)], strict=True)]
    log, start = parts[-1], begins[-1]
    if len(parts) > 1:
        if any(p.facts.get(k) != log.facts.get(k) for p in parts for k in _STARTUP_FACTS):
            log.facts["startups"] = len(parts)
            log.facts["startup_line"] = text.count("\n", 0, start) + 1
        else:  # one startup logged twice over: read as one, its evidence from the first
            log, start = _parse(text, engine), 0
    if (read_text := _FORMATS[engine][1]) is not None:
        read_text(log, text[start:])
    if engine == "vllm":
        _check_pairs(log, text[start:])
    _check_pool(log)
    _check_auto_fit(log)
    return log


# a KV pool of nothing: vLLM raises before it prints one ("No available memory for the cache blocks",
# vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory), SGLang too ("Not enough memory. Please
# try to increase --mem-fraction-static", model_runner.py init_memory_pool)
_EMPTY_POOL = (
    ("kv_cache_tokens", "KV cache size", "0 tokens"),
    ("num_gpu_blocks", "KV blocks", "0 blocks"),
    ("available_kv_bytes", "KV cache memory", "0.00 GiB"),
    ("max_concurrency", "maximum concurrency", "0.00x"),
)


_KV_TOKENS = re.compile(r"GPU KV cache size: " + _NUM + r" tokens")


def _check_pairs(log: ParsedLog, text: str) -> None:
    """vLLM prints 'GPU KV cache size' and 'Maximum concurrency' together, once per KV-cache config
    (kv_cache_utils.py), at one max_model_len: lines for two lengths, or not as many concurrency lines as pool
    lines where either's figures differ, cannot say which concurrency goes with the pool read (the smallest),
    so none is read and check-log says why."""
    tokens = [_count(m.group(1)) for m in _KV_TOKENS.finditer(text)]
    shares = [(_count(m.group(1)), _f(m.group(2))) for m in _CONCURRENCY.finditer(text)]
    if not tokens or not shares:
        return
    lengths = {n for n, _ in shares}
    differ = len(set(tokens)) > 1 or len({c for _, c in shares}) > 1
    if len(lengths) > 1 or (len(tokens) != len(shares) and differ):
        log.facts.pop("max_concurrency", None)
        log.evidence.pop("max_concurrency", None)
        log.facts["unpaired_kv_lines"] = (len(tokens), len(shares))
        if len(lengths) > 1 and log.facts.get("configured_max_model_len") is not None:
            log.facts["max_model_len"] = log.facts["configured_max_model_len"]  # the arguments', not a guess


def _check_pool(log: ParsedLog) -> None:
    for fact, what, shown in _EMPTY_POOL:
        value = log.facts.get(fact)
        if value is not None and value <= 0:
            raise UsageError(
                f"the log's {what} is {shown}: the engine stops before serving with no room for the KV "
                f"cache, so there is nothing to check (line {log.evidence[fact][:80]!r}); paste the log of "
                "a startup that served"
            )


def _check_auto_fit(log: ParsedLog) -> None:
    """vLLM --max-model-len auto prints the length it fitted twice: 'Auto-fit max_model_len: reduced from A
    to B' and 'Maximum concurrency for B tokens per request' (vllm/v1/core/kv_cache_utils.py); B above A, or
    two different B, is an edited log, and a check of either would compare against the wrong length."""
    f = log.facts
    start, fitted, ran = f.get("auto_fit_from"), f.get("auto_fit_to"), f.get("max_model_len")
    if start is not None and fitted is not None and fitted > start:
        raise UsageError(
            f"the log's auto-fit line raises max_model_len from {start:,} to {fitted:,}; vLLM only lowers it "
            "(paste the engine's own log)"
        )
    if f.get("max_model_len_auto") and (fitted if fitted is not None else start) not in (None, ran) and ran:
        said = fitted if fitted is not None else start
        raise UsageError(
            f"the log's auto-fit line gives max_model_len {said:,} but its concurrency line {ran:,} tokens per "
            "request; vLLM prints one length in both (paste the engine's own log)"
        )


ARGS_OPEN = re.compile(r"non-default args: \{")


def join_wrapped_args(text: str) -> str:
    """vLLM's 'non-default args: {...}' line as one line where a terminal copy hard-wrapped it (a real
    0.10.1.1 log splits 'gpu_memory_utilization': 0.25 onto the next line): the dict runs on until its
    braces balance, over at most 20 lines."""
    if "non-default args: {" not in text:
        return text
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = ARGS_OPEN.search(line)
        if m:
            depth = line.count("{", m.end() - 1) - line.count("}", m.end() - 1)
            j = i + 1
            while depth > 0 and j < len(lines) and j <= i + 20:
                depth += lines[j].count("{") - lines[j].count("}")
                line += lines[j]
                j += 1
            if depth == 0:
                out.append(line)
                i = j
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


# SGLang's speculative decoding loads a draft model after the target, on every rank, and allocates its own KV pool
# (managers/scheduler.py: the target's TpModelWorker, then the draft worker, EAGLEWorker/StandaloneWorker, whose
# ModelRunner prints the same "Load weight end" and "KV Cache is allocated" lines); its classes are named so
_SGLANG_DRAFT_TYPE = re.compile(r"Load weight end\. type=\w*(?:Eagle|NextN|MTP)\w*")
_SGLANG_RANK = re.compile(r"\bTP(\d+)\b")
_SGLANG_POOL_FACTS = ("kv_cache_tokens", "k_size_bytes", "v_size_bytes", "kv_size_bytes")


def _sglang_draft_key(log: ParsedLog, key: str, where: str) -> str:
    """The fact a put from an SGLang line is: the draft model's weights and pool once a rank has loaded its
    target (a second distinct "Load weight end" on that rank while a speculative algorithm runs, or a draft
    model's class), as draft_* facts; the target's otherwise."""
    m = _SGLANG_RANK.search(where)
    rank = m.group(1) if m else "0"
    done = log.loads.setdefault(rank, set())
    speculative = log.facts.get("sglang_speculative_algorithm") is not None
    if key == "weights_bytes":
        draft = bool(_SGLANG_DRAFT_TYPE.search(where)) or (speculative and bool(done) and where not in done)
        done.add(where)
        if draft:
            done.add("draft")
            return "draft_weights_bytes"
    elif key in _SGLANG_POOL_FACTS and "KV Cache is allocated" in where and "draft" in done:
        return f"draft_{key}"
    elif (
        key == "free_at_start_bytes" and speculative and done
    ):  # the draft's "Load weight begin", after the target
        return "draft_free_at_start_bytes"
    return key


def _parse(text: str, engine: str | None) -> ParsedLog:
    log = ParsedLog()
    log.engine = engine
    if engine is None:
        return log
    read_line = _FORMATS[engine][0]
    seen: dict[str, list[tuple[str, Any, str, str]]] = {}  # a line read once: its facts, replayed on a repeat
    for line in _anchored_lines(join_wrapped_args(text), _ANCHORS[engine]):
        puts = seen.get(line)
        if puts is None:
            rec = _Recorder()
            read_line(rec, line)  # type: ignore[arg-type]
            puts = seen[line] = rec.puts
        for key, value, where, keep in puts:
            log.put(key, value, where, keep)
    return log


def found_numbers(log: ParsedLog) -> bool:
    return any(k in log.facts for k in ("available_kv_bytes", "kv_cache_tokens", "num_gpu_blocks"))
