"""kvplan from Python: the CLI's commands as functions, with the CLI's names and units.

    >>> import kvplan
    >>> plan = kvplan.estimate(model="llama3-70b", gpus="8xH100", max_model_len="8K", kv_cache_dtype="fp8")
    >>> plan.max_concurrency, plan.to_dict()["kv_bytes_per_token"]

Keyword arguments are the CLI's flags with underscores (--max-model-len -> max_model_len) and take
what the flags take: token counts as 8192 or "8K" (K = 1024), memory as "50GiB", "40GB" or bytes,
GPUs as "H100", "8xH100" or "2x8xH100" (nodes x GPUs). Results are the typed objects the CLI renders,
each with `to_dict()` (the command's --json). Errors are kvplan.errors.KvplanError subclasses:
UsageError/SpecError for bad input, InfeasibleError (and its subclasses) when a plan cannot work.
This module imports nothing heavy (no typer, no rich); each function loads what it needs.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

from kvplan.errors import InfeasibleError, UsageError
from kvplan.units import plural

if TYPE_CHECKING:
    from kvplan.commands.comparisons import TableResult
    from kvplan.logs.checklog import CheckResult
    from kvplan.plan.disagg import Disaggregated
    from kvplan.plan.plan import Plan
    from kvplan.search.solve import Answer, Query
    from kvplan.simulator import Deployment, SimResult, Workload

__all__ = ["CheckLogResult", "SolveResult", "check_log", "compare", "estimate", "simulate", "solve"]


# the annotation words an argument is checked against, and how an error names each
_TYPE_WORDS = {"None": "None", "bool": "True/False", "int": "an integer", "float": "a number",
               "str": "a string", "list[str]": "a list of strings", "Any": "anything"}  # fmt: skip


def _type_ok(value: Any, annotation: str) -> bool | None:
    """Whether `value` is of the (string) annotation; None where it names a type this check does not
    know (a Deployment, a callback): the callee checks those."""
    parts = [p.strip() for p in annotation.split("|")]
    if any(p not in _TYPE_WORDS for p in parts):
        return None
    for p in parts:
        if p == "Any" or (p == "None" and value is None) or (p == "bool" and isinstance(value, bool)):
            return True
        if isinstance(value, bool):  # True is an int to Python, not a count or a fraction to kvplan
            continue
        if (p == "int" and isinstance(value, int)) or (p == "float" and isinstance(value, int | float)):
            return True
        if (p == "str" and isinstance(value, str)) or (
            p == "list[str]" and isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            return True
    return False


def _check(command: str, name: str, value: Any, annotation: Any) -> None:
    """A one-line UsageError where an argument is not of its declared type: "no" is not False, "2" is
    not a count and 20.5 is not a number of prompts (a Python truth test would take them silently)."""
    if name == "engine_version" and isinstance(value, float):  # 0.10 is the float 0.1: vLLM 0.1
        raise UsageError(f"{command}: engine_version={value!r}: give the release as text, e.g. '0.10'")
    if _type_ok(value, str(annotation)) is False:
        want = " or ".join(_TYPE_WORDS[p.strip()] for p in str(annotation).split("|"))
        raise UsageError(f"{command}: {name} must be {want}, got {type(value).__name__} {value!r:.60}")


def _check_args(fn: Any, values: dict[str, Any], command: str) -> None:
    """Each of a function's own arguments (its locals at entry) against its annotation."""
    for name, value in values.items():
        if name in fn.__annotations__ and name != "return":
            _check(command, name, value, fn.__annotations__[name])


_INTERNAL = {"gpus_flag", "fixed_gpus"}  # SolveFlags' fields the CLI sets itself, not arguments


def _flags(cls: type, given: dict[str, Any], command: str) -> Any:
    """`given` as the command's flags dataclass: names checked, numbers accepted where the CLI reads text."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in _INTERNAL}
    unknown = sorted(set(given) - set(fields))
    if unknown:
        names = ", ".join(sorted(fields))
        raise UsageError(f"{command}: unknown argument(s) {', '.join(unknown)}; known: {names}")
    kwargs = {}
    for name, value in given.items():
        typed_as_text = "str" in str(fields[name].type)
        if (
            typed_as_text
            and name != "engine_version"
            and isinstance(value, int | float)
            and not isinstance(value, bool)
        ):
            value = str(value)  # max_model_len=8192 as the CLI's "8192"
        _check(command, name, value, fields[name].type)
        kwargs[name] = value
    return cls(**kwargs)


@overload
def estimate(model: str, *, disaggregated: Literal[False] = False, **flags: Any) -> Plan: ...


@overload
def estimate(model: str, *, disaggregated: Literal[True], **flags: Any) -> Disaggregated: ...


def estimate(
    model: str,
    *,
    disaggregated: bool = False,
    prefill_gpus: str | None = None,
    decode_gpus: str | None = None,
    prefill_tensor_parallel_size: int | None = None,
    decode_tensor_parallel_size: int | None = None,
    **flags: Any,
) -> Plan | Disaggregated:
    """How `model` fits on GPUs (`kvplan estimate`): a Plan of weights, KV budget, KV per token, pool
    tokens and concurrent requests; `Plan.to_dict()` is `estimate --json`.

    model: a shipped name/alias/HF id, a spec .yaml or a Hugging Face config.json.
    Common flags (all of `kvplan estimate --help` are accepted, with underscores):
      gpus="H100" | "8xH100" | "2x8xH100"; max_model_len / avg_context: tokens (8192 or "8K";
      max_model_len="auto": the length vLLM 0.14+ fits to the KV pool);
      kv_cache_dtype="auto" | "fp8" | ...; engine="vllm" | "sglang"; engine_version="0.11";
      gpu_memory_utilization: a fraction (0.92); kv_cache_memory / reserve_memory: bytes per GPU
      ("51.02GiB", "40GB" or an integer); tensor_parallel_size / pipeline_parallel_size: counts;
      shared_prefix_tokens: tokens; prefix_hit_rate: a fraction; calibration=False ignores what
      this machine measured. Spec warnings are issued with `warnings.warn`.
    disaggregated=True with prefill_gpus and decode_gpus (and input_len/output_len): the two pools, the
    KV each request moves and which pool binds, as `estimate --disaggregated` (a Disaggregated);
    prefill_tensor_parallel_size / decode_tensor_parallel_size: each pool's own TP.
    """
    _check_args(estimate, locals(), "estimate")
    from kvplan.commands import inputs
    from kvplan.plan.plan import estimate as run_estimate

    pool_tps = (prefill_tensor_parallel_size, decode_tensor_parallel_size)
    if disaggregated or prefill_gpus is not None or decode_gpus is not None or pool_tps != (None, None):
        from kvplan.plan.disagg import disaggregate

        if not disaggregated:
            raise UsageError(
                "estimate: prefill_gpus, decode_gpus and the pools' tensor_parallel_size need disaggregated=True"
            )
        if "gpus" in flags:
            raise UsageError("estimate: with disaggregated=True the pools are prefill_gpus and decode_gpus")
        f = _flags(inputs.EstimateFlags, {"model": model, **flags}, "estimate")
        p_req, d_req = inputs.disaggregated_requests(f, prefill_gpus, decode_gpus, *pool_tps)
        assert prefill_gpus is not None and decode_gpus is not None  # disaggregated_requests checked
        return disaggregate(p_req, d_req, prefill_gpus, decode_gpus)

    req = inputs.plan_request(_flags(inputs.EstimateFlags, {"model": model, **flags}, "estimate"))
    for warning in req.model.warnings:
        warnings.warn(warning, stacklevel=2)
    if req.calibration_use is not None and req.calibration_use.warning:
        warnings.warn(req.calibration_use.warning, stacklevel=2)
    return run_estimate(req)


@dataclass(frozen=True)
class SolveResult:
    """`kvplan solve`'s answers, best first, and the query they answer."""

    query: Query
    answers: list[Answer]
    max_context: bool

    def __repr__(self) -> str:
        """The answers, one line each, as `kvplan solve` lists them (not the whole query)."""
        lines = [
            f"solve {self.query.model.name} for {plural(self.query.users, 'user')}: {len(self.answers)} answer(s)"
        ]
        for i, a in enumerate(self.answers, 1):
            lines.append(
                f"#{i} {a.num_gpus}x {a.gpu} (TP {a.tensor_parallel_size} x PP {a.pipeline_parallel_size} x "
                f"DP {a.data_parallel_size}), KV {a.kv_cache_dtype}, context {a.max_model_len:,}: "
                f"max {plural(a.max_concurrency, 'user')}, TPOT at load {a.tpot_ms:,.1f} ms"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """As `solve --json`."""
        from kvplan.render.jsonout import solve_json

        return solve_json(self.query, self.answers, self.max_context)


def solve(
    model: str,
    users: int | None = None,
    *,
    request_rate: float | None = None,
    max_rate: bool = False,
    ttft_ms: float | None = None,
    percentile: int = 90,
    num_prompts: int | None = None,
    range_ratio: float = 0.0,
    burstiness: float = 1.0,
    trace: str | None = None,
    seed: int = 0,
    disaggregated: bool = False,
    **flags: Any,
) -> Any:
    """The inverse question (`kvplan solve`): the fewest (or cheapest) GPUs, layout and KV dtype for
    `users` concurrent requests of max_model_len tokens; with max_context=True, the longest context
    `users` requests can have on fixed GPUs. Returns a SolveResult.

    gpus: GPU types to search, comma-separated ("H100,H200"; default "H100"), or with max_context
      the GPUs you have ("8xH200"). max_model_len: tokens per request (8192 or "8K").
    tpot_ms: time per output token at full load must stay under this (milliseconds).
    kv_cache_dtype: "any" or a comma list ("auto,fp8"). max_gpus: the largest GPU count to try.
    price: price per GPU-hour, one per GPU type ("2.5,3.8") in any currency; ranks by cost, and
      each answer's cost_per_hour is in that unit. top: how many answers. partial_nodes=True lets
      an answer use part of a node. network: the inter-node fabric per GPU ("400G", the default).

    By simulation instead of users (`solve --request-rate` / `--max-rate`): request_rate=R with
    ttft_ms and tpot_ms, the fewest GPUs serving R requests/s within both targets at `percentile`
    (50, 90 or 99); max_rate=True with gpus="8xH100" and max_model_len, the highest rate those GPUs
    serve. The workload as `simulate` takes it: input_len/output_len (default 1024/128), num_prompts,
    range_ratio, burstiness, seed, or a trace file. Returns a RateAnswer (`to_dict()` is the --json);
    with disaggregated=True (and request_rate), a prefill pool and a decode pool beside the colocated
    answer (`solve --disaggregated`).
    No answer raises kvplan.errors.NoAnswer, naming what stopped the search.
    """
    _check_args(solve, locals(), "solve")
    from kvplan.commands import inputs

    if request_rate is not None or max_rate:
        if users is not None or flags.get("max_context"):
            raise UsageError(
                "solve: request_rate/max_rate answer by simulation: not with users or max_context"
            )
        load = inputs.LoadFlags(
            ttft_ms=ttft_ms, tpot_ms=flags.get("tpot_ms"), percentile=percentile, request_rate=request_rate,
            max_rate=max_rate, num_prompts=num_prompts, range_ratio=range_ratio, burstiness=burstiness,
            trace=trace, seed=seed, disaggregated=disaggregated,
            input_len=None if (n := flags.pop("input_len", None)) is None else str(n),
            output_len=None if (n := flags.pop("output_len", None)) is None else str(n),
        )  # fmt: skip
        f = _flags(inputs.SolveFlags, {"model": model, "users": 1, **flags}, "solve")
        if ttft_ms is None or f.tpot_ms is None:
            raise UsageError("solve: request_rate/max_rate need ttft_ms and tpot_ms")
        return inputs.solve_load(f, load)
    stray = [name for name, on in (
        ("ttft_ms", ttft_ms is not None), ("disaggregated", disaggregated), ("num_prompts", num_prompts is not None),
        ("range_ratio", range_ratio != 0.0), ("burstiness", burstiness != 1.0), ("trace", trace is not None),
        ("seed", seed != 0), ("percentile", percentile != 90),
    ) if on]  # fmt: skip
    if stray:
        raise UsageError(f"solve: {', '.join(stray)}: only with request_rate or max_rate (a simulated load)")
    if users is None:
        raise UsageError("solve: give users (or request_rate / max_rate with ttft_ms and tpot_ms)")
    f = _flags(inputs.SolveFlags, {"model": model, "users": users, **flags}, "solve")
    q, answers = inputs.solve(f)
    for warning in inputs.solve_warnings(q):
        warnings.warn(warning, stacklevel=2)
    return SolveResult(q, answers, f.max_context)


def compare(
    models: str | list[str] | None = None,
    variants: str | list[str] = "shipped",
    gpus: str = "8xH100",
    max_model_len: str | int | None = None,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int | None = None,
    pipeline_parallel_size: int | None = None,
    gpu_memory_utilization: float | None = None,
    kv_cache_memory: str | int | None = None,
    block_size: int | None = None,
    offload_gib: float = 0.0,
    network: str | None = None,
    network_gbps: float | None = None,
    network_latency_us: float | None = None,
    data_parallel_size: int | None = None,
    enable_expert_parallel: bool = False,
    **unknown: Any,
) -> TableResult:
    """Models and KV techniques side by side (`kvplan compare table`): one row per model x variant.

    models: names (a list or "a,b"; default compare's DEFAULT_MODELS). variants: what-ifs such as
    "shipped,gqa8+int8,mla512+fp8". gpus: "8xH100" (the default: one node). max_model_len: tokens per
    request (default 8K). kv_cache_dtype: every row's KV dtype ("fp8": each variant naming none gets "+fp8").
    kv_cache_memory: bytes per GPU ("50GiB"). offload_gib: CPU memory per GPU, in GiB, added as a
    KV tier. network, network_gbps, network_latency_us are refused: no figure here crosses the network
    (estimate, simulate and solve take them). data_parallel_size / enable_expert_parallel: vLLM's DP engine cores
    and expert parallelism (MoE rows). Each row's figures are bytes, ms and counts (`row.to_dict()`); a row that cannot run
    keeps its reason in `row.error`. `result.to_dict()` is `compare table --json`.
    """
    if unknown:
        known = ", ".join(n for n in compare.__annotations__ if n not in ("return", "unknown"))
        raise UsageError(f"compare: unknown argument(s) {', '.join(sorted(unknown))}; known: {known}")
    _check_args(compare, {k: v for k, v in locals().items() if k != "unknown"}, "compare")
    from kvplan.commands import comparisons

    def joined(v: str | list[str] | None) -> str | None:
        return ",".join(v) if isinstance(v, list) else v

    if models is not None and not str(joined(models)).strip():
        raise UsageError("compare: models is empty; give model names, or leave it out for the default four")
    if variants is not None and not str(joined(variants)).strip():
        raise UsageError("compare: variants is empty; give variant names, or leave it out for shipped")

    cluster = comparisons.ClusterFlags(
        gpus,
        None if max_model_len is None else str(max_model_len),
        tensor_parallel_size,
        pipeline_parallel_size,
        gpu_memory_utilization,
        None if kv_cache_memory is None else str(kv_cache_memory),
        block_size,
        network,
        network_gbps,
        network_latency_us,
        data_parallel_size,
        enable_expert_parallel,
    )
    return comparisons.table(
        joined(models), joined(variants) or "shipped", cluster, offload_gib, kv_cache_dtype
    )


@dataclass(frozen=True)
class CheckLogResult:
    """`kvplan check-log`'s comparison of a startup log with kvplan's figures."""

    result: CheckResult
    source: str  # the log's file name, or "text"
    saved: str | None  # where save_calibration wrote the measured overhead

    def __repr__(self) -> str:
        """What was checked, each figure beside kvplan's, then kvplan's plan in short."""
        r = self.result
        lines = [f"check-log {self.source}: {r.engine} {r.version}"]
        lines += [f"{row.quantity}: log {row.log:,}, kvplan {row.kvplan:,} {row.unit}" for row in r.rows]
        return "\n".join([*lines, repr(r.prediction)])

    def to_dict(self) -> dict[str, Any]:
        """As `check-log --json`."""
        return {**self.result.to_dict(), "calibration_saved": self.saved}


def check_log(
    log_file: str | None = None,
    *,
    log_text: str | None = None,
    model: str | None = None,
    gpus: str | None = None,
    save_calibration: bool = False,
    **overrides: Any,
) -> CheckLogResult:
    """Hold a vLLM/SGLang startup log against kvplan (`kvplan check-log`).

    Give the log as a path (log_file) or as its text (log_text). model and gpus fill in what the log
    does not name; overrides take check-log's other flags: engine_version, gpu_memory_utilization
    and mem_fraction_static (fractions), block_size, max_num_batched_tokens (tokens, "8K"),
    kv_cache_dtype, weight_dtype.
    """
    _check_args(check_log, locals(), "check_log")
    from kvplan.commands import inputs

    known = {  # check-log's flags, typed as the CLI types them
        "engine_version": "str | None",
        "gpu_memory_utilization": "float | None",
        "mem_fraction_static": "float | None",
        "block_size": "int | None",
        "max_num_batched_tokens": "str | int | None",
        "kv_cache_dtype": "str | None",
        "weight_dtype": "str | None",
    }
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise UsageError(f"check_log: unknown argument(s) {', '.join(unknown)}; known: {', '.join(known)}")
    for name, value in overrides.items():
        _check("check_log", name, value, known[name])
    if (log_file is None) == (log_text is None):
        raise UsageError("check_log: give exactly one of log_file (a path) or log_text (the log itself)")
    full = {k: overrides.get(k) for k in known}
    mnbt = full["max_num_batched_tokens"]
    if isinstance(mnbt, int):
        full["max_num_batched_tokens"] = str(mnbt)
    checked = inputs.check_log(log_file, model, gpus, full, save_calibration, text=log_text)
    return CheckLogResult(checked.result, checked.source, str(checked.saved) if checked.saved else None)


def _workload_of(
    trace: str | None, num_prompts: int | None, input_len: Any, output_len: Any, range_ratio: float,
    request_rate: float, burstiness: float, max_concurrency: int | None, length_histogram: str | None, seed: int,
) -> Workload:  # fmt: skip
    """simulate's workload from its flags: a trace, or random lengths (fixed, ranged or a histogram)."""
    from pathlib import Path

    from kvplan import simulator as sim
    from kvplan.commands import inputs

    if trace is not None:
        inputs.check_trace_flags(
            {"--input-len": input_len is not None, "--output-len": output_len is not None,
             "--range-ratio": range_ratio != 0.0, "--length-histogram": length_histogram is not None,
             "--request-rate": request_rate != float("inf"), "--burstiness": burstiness != 1.0,
             "--seed": seed != 0}
        )  # fmt: skip
        return sim.read_trace(trace, max_concurrency, num_prompts)
    if length_histogram is not None:
        given = [f for f, on in (("--input-len", input_len is not None), ("--output-len", output_len is not None),
                                 ("--range-ratio", range_ratio != 0.0)) if on]  # fmt: skip
        if given:
            raise UsageError(
                f"--length-histogram gives each request's lengths: {', '.join(given)} does not apply with it; drop it"
            )
    inp, out = inputs.lengths(input_len, output_len)
    return sim.synthetic(
        num_prompts=1000 if num_prompts is None else num_prompts,
        input_len=inp,
        output_len=out,
        range_ratio=range_ratio,
        request_rate=request_rate,
        burstiness=burstiness,
        max_concurrency=max_concurrency,
        seed=seed,
        histogram=Path(length_histogram) if length_histogram is not None else None,
    )


def _no_workload_flags(
    trace: Any, num_prompts: Any, input_len: Any, output_len: Any, range_ratio: float, request_rate: float,
    burstiness: float, max_concurrency: Any, length_histogram: Any, seed: int,
) -> None:  # fmt: skip
    """A prepared workload already holds its requests: its flags beside it would be ignored, so they are refused."""
    given = [name for name, on in (
        ("trace", trace is not None), ("num_prompts", num_prompts is not None), ("input_len", input_len is not None),
        ("output_len", output_len is not None), ("range_ratio", range_ratio != 0.0),
        ("request_rate", request_rate != float("inf")), ("burstiness", burstiness != 1.0),
        ("max_concurrency", max_concurrency is not None), ("length_histogram", length_histogram is not None),
        ("seed", seed != 0),
    ) if on]  # fmt: skip
    if given:
        raise UsageError(
            f"simulate: give either a workload or its flags ({', '.join(given)}), not both: a prepared workload "
            "already holds its requests"
        )


def _check_progress(progress: Any) -> None:
    """simulate's progress callback: a function taking (done, total), refused in one line otherwise."""
    if progress is None:
        return
    if not callable(progress):
        raise UsageError(
            f"simulate: progress must be a function (done, total), got {type(progress).__name__}"
        )
    import inspect

    try:
        inspect.signature(progress).bind(0, 0)
    except TypeError:
        raise UsageError("simulate: progress must take two arguments, (done, total)") from None
    except ValueError:  # a builtin with no signature: taken as it is
        pass


def _no_workload_guesses(flags: dict[str, Any]) -> None:
    """estimate's guesses about the workload are refused by simulate, which serves the workload itself."""
    guessed = sorted(k for k in ("avg_context", "shared_prefix_tokens", "prefix_hit_rate") if k in flags)
    if guessed:
        raise UsageError(
            f"simulate: {', '.join(guessed)} describe a workload for estimate; simulate serves one "
            "(input_len/output_len, length_histogram or a trace, with prefix caching as the engine runs it)"
        )


def simulate(
    model: str | None = None,
    *,
    deployment: Deployment | None = None,
    workload: Workload | None = None,
    trace: str | None = None,
    num_prompts: int | None = None,
    input_len: int | str | None = None,
    output_len: int | str | None = None,
    range_ratio: float = 0.0,
    request_rate: float = float("inf"),
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    length_histogram: str | None = None,
    seed: int = 0,
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    progress: Any = None,
    **flags: Any,
) -> SimResult:
    """Serve a workload on the deployment `estimate` plans (`kvplan simulate`): a SimResult with
    TTFT/TPOT/ITL/latency (ms), throughput (requests/s, tokens/s), goodput under ttft_ms/tpot_ms,
    prefix-cache hit rate, preemptions and KV usage over time; `to_dict()` is `simulate --json`.

    model and **flags: as `estimate` (gpus="H100", max_model_len="8K", engine="vllm", ...).
    The workload: trace (a Mooncake .jsonl or Azure .csv), else num_prompts random prompts of
    input_len/output_len tokens (default 1024/128; range_ratio as vLLM's random dataset) or drawn from
    length_histogram (CSV input_len,output_len,weight), sent at request_rate (requests/s, inf: all at
    once) with burstiness, at most max_concurrency in flight. For many runs (a search), build the
    deployment once (kvplan.simulator.from_plan) and the workload once, and pass them.
    """
    _check_args(simulate, locals(), "simulate")

    from kvplan import simulator as sim
    from kvplan.commands import inputs
    from kvplan.plan.plan import estimate as run_estimate
    from kvplan.search.rate import check_target_ms

    for name, target in (("--ttft-ms", ttft_ms), ("--tpot-ms", tpot_ms)):
        if target is not None:
            check_target_ms(name, target)
    for name, value, cls in (
        ("deployment", deployment, sim.Deployment),
        ("workload", workload, sim.Workload),
    ):
        if value is not None and not isinstance(value, cls):
            raise UsageError(
                f"simulate: {name} must be a kvplan.simulator.{cls.__name__} (or None), got {type(value).__name__}"
            )
    if length_histogram is not None and not length_histogram.strip():
        raise UsageError(
            "simulate: length_histogram is empty; give a CSV file of input_len,output_len,weight"
        )
    _check_progress(progress)
    if deployment is None:
        if model is None:
            raise UsageError("simulate: give a model (or a prepared deployment)")
        _no_workload_guesses(flags)
        req = inputs.plan_request(_flags(inputs.EstimateFlags, {"model": model, **flags}, "simulate"))
        req = dataclasses.replace(req, remedies=("--weight-dtype",))  # simulate takes no --cpu-offload-gb
        for warning in req.model.warnings:
            warnings.warn(warning, stacklevel=2)
        if req.calibration_use is not None and req.calibration_use.warning:
            warnings.warn(req.calibration_use.warning, stacklevel=2)
        deployment = sim.from_plan(run_estimate(req), req)
    elif flags or model is not None:
        raise UsageError("simulate: give either a deployment or a model with its flags, not both")
    if workload is not None:  # a prepared workload already holds its requests
        _no_workload_flags(trace, num_prompts, input_len, output_len, range_ratio, request_rate, burstiness,
                           max_concurrency, length_histogram, seed)  # fmt: skip
    else:
        workload = _workload_of(trace, num_prompts, input_len, output_len, range_ratio, request_rate, burstiness,
                                max_concurrency, length_histogram, seed)  # fmt: skip
    result = sim.simulate(deployment, workload, ttft_ms, tpot_ms, progress)
    if result.completed == 0 and result.failed:
        why = "; ".join(f"{reason}: {n:,}" for reason, n in result.failed.items())
        raise InfeasibleError(
            f"no request completed: the engine refuses all {sum(result.failed.values()):,} ({why})"
        )
    return result
