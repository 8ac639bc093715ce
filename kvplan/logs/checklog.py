"""`kvplan check-log`: re-derive an engine's startup numbers for the setup its log names.

Two runs of the planner for the same setup:
- prediction: kvplan's own budget (its estimate of the engine's non-KV memory), as
  `kvplan estimate` would print it before the engine ever ran;
- arithmetic: the log's own KV memory handed to kvplan, so blocks, tokens and concurrency
  can be checked exactly (up to the rounding of the logged GiB figure).
The difference between the log's KV memory and kvplan's prediction is the measured error of
kvplan's non-KV estimate; it can be saved as a calibration for later estimates.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kvplan import engines
from kvplan.engines import vllm_memory as vm
from kvplan.errors import NoKvMemoryLeft, UsageError, WeightsDoNotFit
from kvplan.formats import normalize_dtype_name
from kvplan.limits import MAX_GPUS, MAX_TOKENS
from kvplan.logs.logparse import ParsedLog, release_of
from kvplan.plan.plan import Plan, PlanRequest, estimate
from kvplan.request import Speculative, model_dtype_name
from kvplan.specs.models import ChunkedAttention, GpuSpec, ModelSpec, SlidingWindow
from kvplan.units import GiB

SCHEMA = "kvplan.checklog/1"

# vLLM --quantization names -> kvplan weight dtypes
_QUANT = {
    "fp8": "fp8",
    "mxfp4": "mxfp4",
    "awq": "int4",
    "gptq": "int4",
    "awq_marlin": "int4",
    "gptq_marlin": "int4",
    "compressed-tensors": None,
    "modelopt_fp4": "nvfp4",
    "bitsandbytes": "int4",
}


@dataclass
class Row:
    quantity: str
    unit: str  # "bytes", "tokens", "blocks", "x"
    log: float | None
    kvplan: float | None
    cause: str = ""

    @property
    def difference(self) -> float | None:
        if self.log in (None, 0) or self.kvplan is None:
            return None
        return (self.kvplan - self.log) / self.log


@dataclass(frozen=True)
class CheckSetup:
    """The setup kvplan re-derived the log for."""

    model: str
    gpu: str
    num_gpus: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_model_len: int
    kv_cache_dtype: str
    block_size: int
    gpu_memory_utilization: float | None
    mem_fraction_static: float | None
    max_num_batched_tokens: int


@dataclass
class CheckResult:
    engine: str
    version: str
    log_format: str | None
    setup: CheckSetup
    prediction: Plan
    arithmetic: Plan | None
    rows: list[Row]
    arithmetic_rows: list[Row]
    measured_reserve_bytes: int | None
    notes: list[str] = field(default_factory=list)
    unmeasured_reason: str = ""  # why measured_reserve_bytes is None

    def to_dict(self) -> dict[str, Any]:
        def row(r: Row) -> dict[str, Any]:
            return {**dataclasses.asdict(r), "difference": r.difference}

        return {
            "schema": SCHEMA,
            "engine": self.engine,
            "engine_version": self.version,
            "log_format": self.log_format,
            "setup": dataclasses.asdict(self.setup),
            "rows": [row(r) for r in self.rows],
            "arithmetic": [row(r) for r in self.arithmetic_rows],
            "measured_reserve_bytes": self.measured_reserve_bytes,
            "notes": self.notes,
        }


def request_from_log(
    log: ParsedLog, model: ModelSpec, gpu: GpuSpec, overrides: dict[str, Any]
) -> PlanRequest:
    """The PlanRequest for the setup the log names; explicit `overrides` (CLI flags) win."""
    f = log.facts
    engine = engines.engine_class(log.engine or "vllm")
    tp = f.get("tensor_parallel_size", 1)
    pp = f.get("pipeline_parallel_size", 1)
    dp = f.get("data_parallel_size", 1)
    for key, value, high in (
        ("tensor_parallel_size", tp, MAX_GPUS),
        ("pipeline_parallel_size", pp, MAX_GPUS),
        ("data_parallel_size", dp, MAX_GPUS),
        ("max_model_len", f.get("max_model_len", 1), MAX_TOKENS),
    ):
        if not 1 <= value <= high:
            raise UsageError(
                f"the log's {key} is {value:,}, which no engine runs (kvplan takes 1 to {high:,}); "
                "paste the engine's own startup log"
            )
    if f.get("weights_bytes") == 0:
        raise UsageError(
            f"the log's weights are 0 GiB per GPU (line {log.evidence['weights_bytes'][:80]!r}), which no "
            "model loads; paste the engine's own startup log"
        )
    for key, what in (
        ("weights_bytes", "weights"),
        ("available_kv_bytes", "KV cache memory"),
        ("free_at_start_bytes", "free memory at startup"),  # SGLang's 'Load weight begin. avail mem'
    ):
        if f.get(key) is not None and f[key] > gpu.memory_bytes:
            raise UsageError(
                f"the log's {what}, {f[key] / GiB:,.2f} GiB per GPU, exceeds the {gpu.name}'s "
                f"{gpu.memory_bytes / GiB:,.2f} GiB: pass the --gpus the log ran on"
            )
    kw: dict[str, Any] = {
        "engine": engine.name,
        "engine_version": _minor(f.get("version"), engine),
        "num_gpus": tp * pp * dp,
        "nodes": 1,
        "tp": tp,
        "pp": pp,
        "max_model_len": f.get("max_model_len"),
        "max_num_batched_tokens": f.get("max_num_batched_tokens"),
        "block_size": f.get("block_size"),
        "enforce_eager": f.get("enforce_eager", False),
        "runner": f.get("runner", "auto"),  # vLLM's resolved runner (an embedding model: pooling)
    }
    kv_dtype = str(f.get("kv_cache_dtype", "auto"))
    if kv_dtype != "auto":
        kw["kv_cache_dtype"] = normalize_dtype_name(kv_dtype)
    quant = _QUANT.get(str(f.get("quantization")))
    if quant and quant not in (model.weight_dtype, model.expert_weight_dtype):
        kw["weight_dtype"] = quant  # the spec describes the unquantized checkpoint
    if f.get("cpu_offload_gb"):  # vLLM non-default args / SGLang ServerArgs
        kw["cpu_offload_gb"] = f["cpu_offload_gb"]
    if model_dtype_name(str(f.get("dtype", "auto"))) not in (None, "auto"):
        kw["dtype"] = str(f["dtype"])
    kw.update(_settings_for(model, engine.log_settings(f)))
    given = overrides.get("engine_version")
    if given is not None and kw["engine_version"] is not None:
        if engine.parse_version(str(given)) != engine.parse_version(kw["engine_version"]):
            raise UsageError(
                f"--engine-version {given}, but the log is from {engine.display_name} {f['version']}; "
                "drop --engine-version"
            )
    kw.update(_log_caching_and_drafts(f))
    _check_overrides_agree(f, model, overrides, engine.name)
    if f.get("max_model_len_auto"):  # vLLM --max-model-len auto: kvplan fits it as vLLM does
        kw["max_model_len"], kw["max_model_len_auto"] = None, True
    kw.update({k: v for k, v in overrides.items() if v is not None})
    if kw.get("max_model_len") is not None:
        kw["max_model_len_auto"] = False
    if kw.get("max_model_len") and kw["max_model_len"] > model.max_context:
        raise UsageError(
            f"the log serves {kw['max_model_len']:,} tokens but {model.name} allows {model.max_context:,}; "
            "pass the model's own config.json with --model"
        )
    return PlanRequest(model=model, gpu=gpu, **kw)


# check-log flags that fill a setting in, and the log's fact for it: a flag may fill what the log lacks, not
# contradict what it states (the check would then be of another deployment, its arithmetic no longer the log's)
_LOGGED_SETTINGS = (
    ("kv_cache_dtype", "--kv-cache-dtype"),
    ("block_size", "--block-size"),
    ("gpu_memory_utilization", "--gpu-memory-utilization"),
    ("mem_fraction_static", "--mem-fraction-static"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
)


def _check_overrides_agree(
    f: dict[str, Any], model: ModelSpec, overrides: dict[str, Any], engine: str
) -> None:
    for key, flag in _LOGGED_SETTINGS:
        given, logged = overrides.get(key), f.get(key)
        if given is None or logged is None:
            continue
        if key == "kv_cache_dtype":
            if str(given) == "auto":
                continue
            logged_name = (
                model.activation_dtype if str(logged) == "auto" else normalize_dtype_name(str(logged))
            )
            if normalize_dtype_name(str(given)) == logged_name:
                continue
        elif given == logged:
            continue
        name = "--page-size" if key == "block_size" and engine == "sglang" else flag
        raise UsageError(
            f"{name} {given}, but the log ran with {logged}; drop {name} (check-log checks what the log ran)"
        )


def _settings_for(model: ModelSpec, settings: dict[str, Any]) -> dict[str, Any]:
    """The log's engine settings the model has a part for: SGLang prints its SWA settings for every model,
    and they concern only sliding-window layers."""
    if any(isinstance(layer, (SlidingWindow, ChunkedAttention)) for layer in model.layers):
        return settings
    return {
        k: v for k, v in settings.items() if k not in ("swa_full_tokens_ratio", "disable_hybrid_swa_memory")
    }


def _log_caching_and_drafts(f: dict[str, Any]) -> dict[str, Any]:
    """Prefix caching as the engine resolved it (its config line) and the log's speculative decoding."""
    kw: dict[str, Any] = {}
    if f.get("enable_prefix_caching") is not None:
        kw["enable_prefix_caching"] = bool(f["enable_prefix_caching"])
    else:
        kw["prefix_caching_stated"] = False
    spec = _log_speculative(f)
    if spec is not None:
        kw["speculative"] = spec
    return kw


def _log_speculative(f: dict[str, Any]) -> Speculative | None:
    """The log's speculative decoding as kvplan plans it: MTP (the checkpoint's own layers) and n-gram
    drafting; a separate draft checkpoint (EAGLE) needs its config, which a log does not carry."""
    method, n = f.get("speculative_method"), f.get("speculative_tokens")
    algo = f.get("sglang_speculative_algorithm")
    if algo is not None:  # SGLang's ServerArgs: speculative_algorithm and speculative_num_steps
        from kvplan.request import SGLANG_SPEC

        method, n = (
            SGLANG_SPEC.get(str(algo).upper(), str(algo).lower()),
            f.get("sglang_speculative_num_steps"),
        )
        if n is None:
            raise UsageError(
                f"the log runs SGLang speculative decoding ({algo}) but gives no speculative_num_steps; paste the "
                "engine's own log, its server_args line whole"
            )
        if method not in ("mtp", "ngram"):
            raise UsageError(
                f"the log runs SGLang speculative decoding with a draft checkpoint ({algo}, {n} steps), whose "
                "weights and KV pool come out of the same memory; check-log does not take its config: run "
                "estimate with --speculative-algorithm, --speculative-num-steps and --speculative-draft-config"
            )
    if method is None or n is None:
        return None
    if method in ("mtp", "ngram"):
        # an acceptance length only times a step, which check-log does not: 1 stands in where kvplan has no
        # sourced default (n-gram)
        flag = (
            f"the log's speculative_algorithm {algo}:"
            if algo is not None
            else "the log's speculative_config method"
        )
        # SGLang's NGRAM verifies its speculative_num_draft_tokens a step (server_args.py); EAGLE's rule is steps + 1
        verify = (
            f.get("sglang_speculative_num_draft_tokens") if algo is not None and method == "ngram" else None
        )
        return Speculative.make(method, n, verify, None if method == "mtp" else 1.0, flag)
    raise UsageError(
        f"the log runs speculative decoding with a draft checkpoint ({method}, {n} tokens), whose layers "
        "share vLLM's KV blocks; check-log does not take its config: run estimate with "
        "--speculative-config and --speculative-draft-config instead"
    )


def _minor(version: str | None, engine: type[engines.Engine]) -> str | None:
    """The log's release as kvplan reads it: a newer one by the newest rules kvplan has (check() says
    so); an older one than kvplan reads is refused."""
    if not version:
        return None
    v = release_of(version)
    if v < engine.first:
        raise UsageError(
            f"the log is from {engine.display_name} {version}, older than the first release kvplan reads "
            f"({engines.fmt_version(engine.first)})"
        )
    return engines.fmt_version(min(v, engine.latest))


def _version_note(f: dict[str, Any], engine: type[engines.Engine], req: PlanRequest) -> str | None:
    """Where the release kvplan reads the log by is not the one the log names: say which it is."""
    latest = engines.fmt_version(engine.latest)
    if f.get("version_conflict"):
        first, then = f["version_conflict"]
        return (
            f"the log names {engine.display_name} {first} and then {then} (a log spliced from two startups, or "
            f"edited?): read by {req.engine_version or first}'s rules; give --engine-version to say which"
        )
    if f.get("version") is None:
        if req.engine_version is None:
            build = f.get("untagged_version")
            what = (
                f"is from a {engine.display_name} source build without a release tag ({build})"
                if build
                else f"names no {engine.display_name} release"
            )
            return f"the log {what}; read by {latest}'s rules (give --engine-version to say which)"
        return None
    if release_of(f["version"]) > engine.latest:
        return (
            f"the log is from {engine.display_name} {f['version']}, newer than the newest release kvplan "
            f"knows; read by {latest}'s rules"
        )
    return None


def _max_model_len_note(f: dict[str, Any]) -> str | None:
    """The engine's arguments name one max_model_len and its concurrency line another: the line's is
    the length it ran with (vLLM --max-model-len auto lowers it so, and says so)."""
    if f.get("max_model_len_auto"):
        fitted = f.get("auto_fit_to")
        return (
            f"vLLM --max-model-len auto: the engine fitted {fitted:,} tokens (from {f['auto_fit_from']:,})"
            if fitted is not None and f.get("auto_fit_from") is not None
            else "vLLM --max-model-len auto: the log's context length is the one the engine fitted"
        )
    given, ran = f.get("configured_max_model_len"), f.get("max_model_len")
    if f.get("max_model_len_conflict"):
        first, then = f["max_model_len_conflict"]
        return (
            f"the log's startup lines give max_model_len {first:,} and then {then:,} (a log spliced from two "
            f"startups, or edited?): read as {ran:,}; paste one startup's log as the engine printed it"
        )
    if given is not None and ran is not None and given != ran:
        return (
            f"the engine's arguments give max_model_len {given:,} but its concurrency line {ran:,}; "
            f"read as {ran:,}, the length it reports serving"
        )
    return None


def _arithmetic_rows(f: dict[str, Any], arith: Plan, slack: int, req: PlanRequest) -> list[Row]:
    """The log's own KV figure through kvplan's block accounting: tokens, concurrency, blocks, K size."""
    a = arith.engine
    rows: list[Row] = []
    tokens_per_block = a.kv_cache_tokens / a.num_blocks if a.kv_cache_tokens and a.num_blocks else 0
    if arith.settings.max_model_len_auto_from and f.get("max_model_len") is not None:
        fitted = arith.settings.max_model_len
        cause = _agree(abs(fitted - f["max_model_len"]), slack * tokens_per_block, "tokens",
                       "vLLM fitted another length: check --block-size, --kv-cache-dtype and -tp")  # fmt: skip
        rows.append(Row("max-model-len (auto-fit)", "tokens", f["max_model_len"], fitted, cause))
    if f.get("kv_cache_tokens") is not None and a.kv_cache_tokens is not None:
        diff = abs(a.kv_cache_tokens - f["kv_cache_tokens"])
        cause = _agree(diff, slack * tokens_per_block, "tokens")
        ranks = arith.cluster.tensor_parallel_size * arith.cluster.pipeline_parallel_size
        if (
            not cause.startswith("matches")
            and ranks > 1
            and 0 < a.kv_cache_tokens - f["kv_cache_tokens"] <= (SMALLEST_RANK_SHARE * a.kv_cache_tokens)
        ):
            cause = SMALLEST_RANK
        rows.append(Row("KV cache tokens", "tokens", f["kv_cache_tokens"], a.kv_cache_tokens, cause))
    if f.get("max_concurrency") is not None and a.max_concurrency is not None:
        off = abs(round(a.max_concurrency, 2) - f["max_concurrency"])
        per_req = a.details.blocks_per_request if isinstance(a.details, engines.VllmDetails) else 1
        tol = slack / max(per_req, 1) + 0.005
        cause = "matches" if off <= tol else _concurrency_cause(req)
        rows.append(Row("maximum concurrency", "x", f["max_concurrency"], round(a.max_concurrency, 2), cause))
    if f.get("num_gpu_blocks") is not None:
        if f.get("available_kv_bytes") is None:
            cause = "given to kvplan"
        else:
            cause = _agree(abs((a.num_blocks or 0) - f["num_gpu_blocks"]), slack, "blocks")
        rows.append(Row("GPU blocks", "blocks", f["num_gpu_blocks"], a.num_blocks, cause))
    _inconsistent_log(rows)
    logged_k = f.get("k_size_bytes", f.get("kv_size_bytes"))
    if isinstance(a.details, engines.SglangDetails) and logged_k is not None:
        k = a.details.k_buffer_bytes
        # the log prints K size rounded to 0.01 GiB
        same = abs(round(k / GiB, 2) * GiB - logged_k) <= 0.006 * GiB
        cause = (
            "matches"
            if same
            else "KV heads, head size, layers or dtype differ: check --model and --kv-cache-dtype"
        )
        rows.append(Row("K size" if "k_size_bytes" in f else "KV size", "bytes", logged_k, k, cause))
    return rows


# vLLM V1 gives every rank the smallest rank's block count (vllm/v1/core/kv_cache_utils.py
# unify_kv_cache_configs, v0.9+); a log that prints one rank's memory may show a few blocks fewer than it holds
SMALLEST_RANK_SHARE = 0.001
SMALLEST_RANK = (
    "a few blocks under what the printed rank's KV memory holds: vLLM gives every rank the smallest rank's "
    "blocks, and another rank's memory line is not in this log"
)


def _inconsistent_log(rows: list[Row]) -> None:
    """Where the log's tokens and concurrency lines disagree with its own KV memory rather than with kvplan's
    accounting, say so instead of blaming the page size or the blocks a request holds: both off by one ratio
    (the pair agrees with itself, not with the memory), or one off while the other matches."""
    by = {r.quantity: r for r in rows}
    tok, conc = by.get("KV cache tokens"), by.get("maximum concurrency")
    if (
        tok is None
        or conc is None
        or not tok.log
        or not conc.log
        or tok.kvplan is None
        or conc.kvplan is None
    ):
        return
    tok_ok, conc_ok = tok.cause.startswith("matches"), conc.cause.startswith("matches")
    if tok_ok and conc_ok:
        return
    same = abs(tok.kvplan / tok.log - conc.kvplan / conc.log) <= 0.005
    if not tok_ok and not conc_ok and same:
        why = (
            "the log's tokens and concurrency agree with each other but not with its KV memory line: a log edited "
            "or cut between those lines (one worker's pair beside another's memory?)"
        )
        tok.cause = conc.cause = why
    elif not tok_ok and conc_ok and tok.cause != SMALLEST_RANK:
        tok.cause = (
            "the log's token count disagrees with its own KV memory and concurrency: an edited or cut log?"
        )


def _prediction_rows(
    f: dict[str, Any], pred: Plan, engine: type[engines.Engine], notes: list[str]
) -> tuple[list[Row], int | None]:
    """kvplan's own prediction beside the log, and the non-KV memory the log implies."""
    eng = pred.engine
    rows: list[Row] = []
    weights_log = f.get("weights_bytes")
    if weights_log is not None:
        off = abs(pred.weight_bytes_per_gpu - weights_log) / weights_log
        cause = (
            ""
            if off < 0.02
            else "weights as loaded differ (quantization, padding): try --weight-dtype or its config.json"
        )
        rows.append(Row("weights per GPU", "bytes", weights_log, pred.weight_bytes_per_gpu, cause))
    rows += _reserve_rows(f, pred)
    logged_kv = engine.logged_kv_bytes(f, pred)
    measured = None
    if logged_kv is not None and pred.kv_budget_source == "computed":
        measured, label, note = engine.measured_reserve(f, pred, logged_kv)
        if note:
            notes.append(note)
        cause = "kvplan's estimate; --save-calibration keeps the log's"
        rows.append(Row(label, "bytes", measured, pred.reserve_bytes_per_gpu, cause))
        if measured < 0:
            notes.append(
                "the log's KV memory exceeds what kvplan's budget leaves before any reserve: check --gpus, "
                "--gpu-memory-utilization / --mem-fraction-static and the weights"
            )
        derived = engine.logged_kv_derived(f, pred)
        why = (
            "the log prints no KV memory: its token count x kvplan's KV bytes per token"
            if derived
            else "follows from the line above"
        )
        rows.append(Row("KV cache memory", "bytes", logged_kv, eng.available_kv_bytes, why))
    if pred.settings.max_model_len_auto_from and f.get("max_model_len") is not None:
        fitted = pred.settings.max_model_len
        rows.append(
            Row("max-model-len (auto-fit)", "tokens", f["max_model_len"], fitted, "follows the KV memory")
        )
    kv_gap = (eng.available_kv_bytes or 0) / logged_kv - 1 if logged_kv else None

    def follows(log_value: float, mine: float | None) -> str:
        """'follows the KV memory' only where the KV memory differs about as much; else the other table."""
        if kv_gap is None or not mine or not log_value:
            return "follows the KV memory"
        gap = mine / log_value - 1
        if abs(gap) <= 0.01 or abs(gap - kv_gap) <= max(0.02, 0.25 * abs(gap)):
            return "follows the KV memory"
        return "not the KV memory (it agrees): see the arithmetic given the log's KV memory below"

    if f.get("kv_cache_tokens") is not None:
        tokens = f["kv_cache_tokens"]
        cause = follows(tokens, eng.kv_cache_tokens)
        if logged_kv is not None and engine.logged_kv_derived(f, pred):
            # the KV memory above is these tokens: nothing to follow
            cause = (
                "matches"
                if eng.kv_cache_tokens and abs(eng.kv_cache_tokens / tokens - 1) <= 0.01
                else "kvplan's pool differs (the log prints no KV memory to say why): check "
                "--mem-fraction-static, --kv-cache-dtype and --model"
            )
        rows.append(Row("KV cache tokens", "tokens", tokens, eng.kv_cache_tokens, cause))
    if f.get("max_concurrency") is not None and eng.max_concurrency is not None:
        conc = round(eng.max_concurrency, 2)
        rows.append(
            Row("maximum concurrency", "x", f["max_concurrency"], conc, follows(f["max_concurrency"], conc))
        )
    if f.get("total_gpu_memory_bytes") is not None:
        total = f["total_gpu_memory_bytes"]
        off = abs(total - pred.memory_bytes_per_gpu) / total
        cause = "" if off < 0.01 else "a different GPU than --gpus? pass the right --gpus"
        rows.append(Row("total GPU memory", "bytes", total, pred.memory_bytes_per_gpu, cause))
    return rows, measured


def _reserve_rows(f: dict[str, Any], pred: Plan) -> list[Row]:
    """The profiler's own breakdown (vLLM >= 0.10.2 prints it) beside kvplan's estimate of each part."""
    r = pred.reserve
    if not r.estimated:
        return []
    rows = []
    parts = (
        ("activation_bytes", "profiled peak (forward or sampler)", r.profile_peak_bytes),
        ("non_torch_bytes", "non-torch memory", r.non_torch_bytes),
        ("cuda_graph_bytes", "CUDA graph memory", r.cuda_graph_bytes),
    )
    for key, label, mine in parts:
        if f.get(key) is None:
            continue
        if key == "cuda_graph_bytes" and not mine:
            cause = "not taken from the KV memory by this release (vLLM subtracts its estimate from 0.20)"
        elif abs(mine - f[key]) <= max(0.05 * f[key], 0.02 * GiB):
            cause = "matches"
        else:
            cause = "kvplan's estimate differs"
        rows.append(Row(label, "bytes", f[key], mine, cause))
    return rows


def _weights_refusal(message: str, f: dict[str, Any], exc: WeightsDoNotFit) -> WeightsDoNotFit:
    """A log that started cannot have weights too large for its GPUs: kvplan's weight format is wrong."""
    head = message.split("; use more GPUs")[0]
    quant = f.get("quantization")
    if quant is not None and _QUANT.get(str(quant), "") is None:
        why = (f"the log's quantization {quant} does not say its format: give --weight-dtype as the "
               "checkpoint's quantization_config says (fp8, int8, int4 or nvfp4)")  # fmt: skip
    else:
        why = "the engine loaded them, so kvplan's weight format is not the checkpoint's: give --weight-dtype"
    loaded = f.get("weights_bytes")
    logged = f" (the log loaded {loaded / GiB:,.2f} GiB)" if loaded else ""
    return WeightsDoNotFit(f"{head}{logged}; {why}", **exc.figures)


def _kept_reserve(
    f: dict[str, Any], pred: Plan, req: PlanRequest, measured: int | None, rows: list[Row], notes: list[str]
) -> tuple[int | None, str]:
    """(the non-KV memory --save-calibration may keep, or None; why not): not from a log of another GPU, nor a
    negative or implausible figure; where none is kept, its row no longer promises it."""
    unmeasured = "the log gives no KV memory figure to calibrate from"
    negative = "the log's KV memory exceeds what kvplan's budget leaves before any reserve"
    if measured is not None and (mismatch := _other_gpu(f, pred, req.gpu.name)):
        notes.append(mismatch)
        measured, unmeasured = None, "the log's GPU memory is not --gpus'; pass the GPU the log ran on"
    elif measured is not None and measured < 0:  # said in the notes (_prediction_rows): nothing to keep
        measured, unmeasured = None, negative
    elif measured is not None and (why := _weights_off(f, pred) or _implausible_reserve(measured, pred)):
        notes.append(why)
        measured, unmeasured = None, why
    if measured is None:
        for row in rows:
            if row.cause.startswith("kvplan's estimate; --save-calibration"):
                row.cause = "not kept (see the notes)"
    return measured, unmeasured


def check(log: ParsedLog, req: PlanRequest) -> CheckResult:
    f = log.facts
    engine = engines.engine_class(req.engine)
    try:
        pred = estimate(dataclasses.replace(req, reserve_bytes=None, reserve_source=None))
    except WeightsDoNotFit as exc:  # the log ran: its layout and GPU are facts, the weights format is not
        total, have = f.get("total_gpu_memory_bytes"), req.gpu.memory_bytes
        if total is not None and abs(total - have) > 0.01 * total:  # unless the GPU is not the log's
            raise UsageError(
                f"the log's total GPU memory {total / GiB:,.2f} GiB per GPU is not {req.gpu.name}'s "
                f"{have / GiB:,.2f} GiB: pass the GPU the log ran on (--gpus)"
            ) from None
        raise _weights_refusal(str(exc), f, exc) from None
    eng = pred.engine
    if not eng.supported:
        raise UsageError(f"cannot reproduce this log: {eng.reason}")
    arith = None
    arows: list[Row] = []
    given = engine.arithmetic_budget(f, pred)
    if given is not None:
        fields, slack = given
        try:
            arith = estimate(dataclasses.replace(req, **fields))
        except NoKvMemoryLeft:  # the log's KV memory and weights together exceed this GPU
            kv = fields.get("kv_cache_memory_bytes") or 0
            head = (
                f"the log's KV cache memory ({kv / GiB:,.2f} GiB) and kvplan's weights "
                f"({pred.weight_bytes_per_gpu / GiB:,.2f} GiB) per GPU exceed {req.gpu.name}'s "
                f"{req.gpu.memory_bytes / GiB:,.2f} GiB"
            )
            loaded = f.get("weights_bytes")
            if loaded and loaded + kv <= req.gpu.memory_bytes:
                # the log's own weights and KV fit this GPU: kvplan's weight format is what differs
                raise UsageError(
                    f"{head}, but the log loaded {loaded / GiB:,.2f} GiB of weights, which fit beside it: kvplan's "
                    "weight format is not the checkpoint's; give --weight-dtype"
                ) from None
            raise UsageError(f"{head}: pass the GPU the log ran on (--gpus)") from None
        arows = _arithmetic_rows(f, arith, slack, req)
    notes: list[str] = []
    if note := _version_note(f, engine, req):
        notes.append(note)
    if f.get("startups"):
        notes.append(
            f"the log holds {f['startups']} startups with different figures; only the last, from line "
            f"{f['startup_line']:,}, is read"
        )
    if note := _max_model_len_note(f):
        notes.append(note)
    if f.get("unpaired_kv_lines"):
        pools, shares = f["unpaired_kv_lines"]
        notes.append(
            f"the log's {pools} 'GPU KV cache size' and {shares} 'Maximum concurrency' line(s) do not pair (vLLM "
            "prints one beside the other, at one max_model_len): which concurrency goes with the pool read (the "
            "smallest) is unknown, so none is compared; paste one startup's log as the engine printed it"
        )
    rows, measured = _prediction_rows(f, pred, engine, notes)
    measured, unmeasured = _kept_reserve(f, pred, req, measured, rows, notes)
    amd = req.gpu.vendor == "amd"
    if engine.name == "vllm" and amd and vm.rocm_loading_device_wide(engine.parse_version(eng.version)):
        notes.append(vm.ROCM_LOADING_NOTE)
    s, c = pred.settings, pred.cluster
    setup = CheckSetup(
        model=req.model.name,
        gpu=req.gpu.name,
        num_gpus=c.num_gpus,
        tensor_parallel_size=c.tensor_parallel_size,
        pipeline_parallel_size=c.pipeline_parallel_size,
        max_model_len=s.max_model_len,
        kv_cache_dtype=s.kv_cache_dtype,
        block_size=s.block_size,
        gpu_memory_utilization=s.gpu_memory_utilization,
        mem_fraction_static=s.mem_fraction_static,
        max_num_batched_tokens=s.max_num_batched_tokens,
    )
    return CheckResult(
        engine=engine.name,
        version=eng.version,
        log_format=f.get("format"),
        setup=setup,
        prediction=pred,
        arithmetic=arith,
        rows=rows,
        arithmetic_rows=arows,
        measured_reserve_bytes=measured,
        notes=notes,
        unmeasured_reason=unmeasured,
    )


def _weights_off(f: dict[str, Any], pred: Plan) -> str | None:
    """The non-KV memory is measured with kvplan's weights (a saved calibration then reproduces the log's KV
    memory); where they are not the log's, the figure would carry the difference: it is not kept."""
    logged = f.get("weights_bytes")
    # 5%: the fixture logs' weights are within 3% of kvplan's (the Qwen3.6-27B-FP8 H100 log: 2.6%); the N1 case
    # that saved a corrupted figure was 44% off
    if not logged or abs(pred.weight_bytes_per_gpu - logged) <= 0.05 * logged:
        return None
    if pred.settings.engine == "sglang" and f.get("free_at_start_bytes") is not None:
        return None  # SGLang's is the memory in use before loading: no weights in it
    return (
        f"kvplan's weights ({pred.weight_bytes_per_gpu / GiB:,.2f} GiB per GPU) are not the log's "
        f"({logged / GiB:,.2f}): the non-KV memory measured with them carries the difference and is not kept; "
        "match the weights first (--weight-dtype, the model's config.json)"
    )


def _implausible_reserve(measured: int, pred: Plan) -> str | None:
    """A non-KV figure no engine keeps: over a tenth of the card and 4x kvplan's estimate (the
    fixture logs' reserves are 0.5-15 GiB, within 2.6x the estimate). It comes from a log of another GPU or
    another process on it, or a log whose figures do not add up, not from the engine: it is not kept."""
    have, mine = pred.memory_bytes_per_gpu, pred.reserve_bytes_per_gpu
    if not (
        measured > 0.1 * have and measured > 4 * max(mine, 1)
    ):  # a negative one is said and refused apart
        return None
    return (
        f"the log implies {measured / GiB:,.2f} GiB of non-KV memory per GPU ({measured / have:.0%} of "
        f"{pred.gpu.name}'s {have / GiB:,.2f} GiB; kvplan estimates {mine / GiB:,.2f}): a log from another GPU "
        "than --gpus, another process on it, or figures that do not add up; it is not kept"
    )


def _other_gpu(f: dict[str, Any], pred: Plan, gpu: str) -> str | None:
    """Why the log cannot be from `gpu`, or None: its total memory (vLLM) is not the GPU's, or the memory
    SGLang found free before loading is more than the GPU has or under 85% of it (a CUDA context and a
    desktop take 1-4% on the fixture logs). The non-KV memory measured against the wrong GPU is not kept."""
    have = pred.memory_bytes_per_gpu
    total, free = f.get("total_gpu_memory_bytes"), f.get("free_at_start_bytes")
    if total is not None and abs(total - have) > 0.01 * total:
        seen = f"total GPU memory {total / GiB:,.2f} GiB"
    elif free is not None and not 0.85 * have <= free <= 1.01 * have:
        seen = f"free memory at startup {free / GiB:,.2f} GiB"
    else:
        return None
    return (
        f"the log's {seen} per GPU does not fit {gpu}'s {have / GiB:,.2f} GiB: a different GPU than --gpus, "
        "or another process on it? pass the right --gpus; the non-KV memory is not measured"
    )


def _agree(
    diff: float,
    tol: float,
    unit: str,
    otherwise: str = "page size differs: check --block-size, --kv-cache-dtype, -tp and the model's KV heads",
) -> str:
    if diff == 0:
        return "matches"
    if diff <= tol:
        return f"matches within the 0.01 GiB rounding of the logged KV memory ({diff:,.0f} {unit})"
    return otherwise


def _concurrency_cause(req: PlanRequest) -> str:
    return (
        "blocks charged per request differ: check --max-model-len, --block-size and, for sliding-window "
        + (
            f"models, --max-num-batched-tokens (now {req.max_num_batched_tokens:,})"
            if req.max_num_batched_tokens is not None
            else "models, --max-num-batched-tokens"
        )
    )


def infer_gpu(total_bytes: int, gpus: list[GpuSpec]) -> GpuSpec | None:
    """The shipped GPU whose runtime memory is within 0.5% of a logged total, if exactly one is."""
    near = [g for g in gpus if abs(g.memory_bytes - total_bytes) <= 0.005 * g.memory_bytes]
    return near[0] if len(near) == 1 else None
