"""What the user typed, turned into what kvplan computes with.

--gpus into a GPU spec and counts, a startup log (file or stdin) into the model and GPU it names,
and the measurements this machine saved (a non-KV overhead, a bandwidth profile) into a plan's
request. Every failure here is a one-line UsageError/SpecError naming the flag or file.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.errors import KvplanError, SpecError, UsageError
from kvplan.limits import MAX_LOG_BYTES, read_regular

if TYPE_CHECKING:
    from kvplan.logs.checklog import CheckResult
    from kvplan.logs.logparse import ParsedLog
    from kvplan.model.parallel import Network
    from kvplan.plan.plan import PlanRequest
    from kvplan.search.solve import Answer, Query
    from kvplan.specs.models import GpuSpec, ModelSpec

_GPUS_RE = re.compile(r"^\s*(?:(\d+)\s*[xX*]\s*)?(?:(\d+)\s*[xX*]\s*)?(.+?)\s*$")


def parse_gpus(text: str, flag: str = "--gpus") -> tuple[int | None, int | None, str]:
    """'8xH100' -> (8 GPUs, 1 node, 'H100'); '2x8xH100' -> (16, 2); 'H100' -> (None, None)."""
    m = _GPUS_RE.match(text)
    if not m or not m.group(3):
        raise UsageError(f"{flag}: cannot read {text!r}; write e.g. H100, 8xH100 or 2x8xH100")
    a, b, name = m.group(1), m.group(2), m.group(3)
    if a is not None and int(a) < 1 or b is not None and int(b) < 1:
        raise UsageError(f"{flag}: GPU and node counts must be >= 1 in {text!r}")
    from kvplan.limits import MAX_GPUS, MAX_NODES

    nodes = int(a) if b is not None else None
    count = None if a is None else int(a) * (int(b) if b is not None else 1)
    # every command, before any plan or search (README, Limits)
    for what, value, high in (("GPU count", count, MAX_GPUS), ("node count", nodes, MAX_NODES)):
        if value is not None and value > high:
            raise UsageError(f"{flag} ({what}) must be at most {high:,}, got {value:,}")
    return count, nodes, name


def load_gpu_as(name: str, flag: str) -> GpuSpec:
    """A GPU spec, its errors naming `flag` (the alias the user typed) instead of --gpus."""
    from kvplan.specs.registry import load_gpu

    try:
        return load_gpu(name)
    except UsageError as exc:
        text = str(exc)
        if flag == "--gpus" or not text.startswith("--gpus"):
            raise
        raise UsageError(flag + text[len("--gpus") :], **exc.figures) from None


def load_cluster(text: str, flag: str = "--gpus") -> tuple[GpuSpec, int | None, int]:
    """--gpus -> (GPU spec, GPU count or None, nodes): '16xH100' spans ceil(16 / 8) nodes."""
    from kvplan.units import ceil_div

    num_gpus, nodes, name = parse_gpus(text, flag)
    gpu = load_gpu_as(name, flag)
    if nodes is None:
        nodes = ceil_div(num_gpus, gpu.gpus_per_node) if num_gpus is not None else 1
    return gpu, num_gpus, nodes


def refuse_empty(flags: object) -> None:
    """A text flag given as '' (an unset shell variable, "$KV") is refused in one line, never read as the
    flag left out: every str field of a flags dataclass, named as its --flag."""
    import dataclasses as dc

    for f in dc.fields(flags):  # type: ignore[arg-type]
        value = getattr(flags, f.name)
        if isinstance(value, str) and not value.strip():
            raise UsageError(f"--{f.name.replace('_', '-')}: empty; give a value, or leave the flag out")


# --- estimate ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class EstimateFlags:
    """`kvplan estimate`'s flags as typed (sizes and counts still text: 8K, 40GiB)."""

    model: str
    gpus: str = "H100"
    max_model_len: str | None = None
    avg_context: str | None = None
    input_len: str | None = None
    output_len: str | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str = "auto"
    kv_quant_group_size: int | None = None
    kv_quant_scale_bits: int | None = None
    kv_quant_zero_point: bool | None = None
    weight_dtype: str | None = None
    block_size: int | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    enable_prefix_caching: bool | None = None  # None: not given (on, as vLLM from 0.28)
    shared_prefix_tokens: str = "0"
    prefix_hit_rate: float = 1.0
    max_num_batched_tokens: str | None = None  # None: the engine's default for the card and --usage
    max_num_seqs: int | None = None
    kv_cache_memory: str | None = None
    reserve_memory: str | None = None
    engine: str = "vllm"
    engine_version: str | None = None
    num_gpu_blocks_override: int | None = None
    disable_hybrid_kv_cache_manager: bool = False
    enforce_eager: bool = False
    mem_fraction_static: float | None = None
    swa_full_tokens_ratio: float | None = None
    disable_hybrid_swa_memory: bool = False
    mamba_ssm_cache_dtype: str | None = None
    images_per_request: int | None = None
    calibration: bool = True
    calibration_file: str | None = None
    force_calibration: bool = False
    usage: str = "serve"
    runner: str = "auto"
    dtype: str = "auto"
    cpu_offload_gb: float = 0.0
    max_total_tokens: int | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    env: list[str] | None = None  # NAME=VALUE, as typed
    network: str | None = None  # --network 400G; None: the default
    network_gbps: float | None = None
    network_latency_us: float | None = None
    data_parallel_size: int | None = None
    enable_expert_parallel: bool = False
    enable_dp_attention: bool = False
    ep_size: int | None = None
    moe_a2a_backend: str | None = None
    num_redundant_experts: int = 0
    enable_eplb: bool = False
    moe_imbalance: float = 1.0
    speculative_config: str | None = None  # vLLM, JSON as typed
    speculative_algorithm: str | None = None  # SGLang
    speculative_num_steps: int | None = None
    speculative_num_draft_tokens: int | None = None
    acceptance_length: float | None = None
    speculative_draft_config: str | None = None  # the draft checkpoint's config.json (EAGLE heads)

    def __post_init__(self) -> None:
        refuse_empty(self)


def _json_flag(text: str, flag: str) -> Any:
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag}: not JSON ({exc.msg})") from None
    except ValueError:  # a number past Python's 4,300-digit limit for int()
        raise UsageError(f"{flag}: a number in it is too long; give a JSON object") from None


def load_spec(ref: str, flag: str = "--model") -> ModelSpec:
    """A model (registry.load_model) whose stated total/active parameters are checked against its
    architecture here, so that a spec file's refusal names the file (a plan names only the model)."""
    from kvplan.model.params import param_breakdown
    from kvplan.specs.registry import load_model

    spec = load_model(ref, flag)
    if Path(ref).suffix.lower() in (".yaml", ".yml"):
        try:
            param_breakdown(spec)
        except SpecError as exc:
            raise SpecError(f"{ref}: {str(exc).removeprefix(f'{spec.name}: ')}") from None
    return spec


# the --speculative-config keys kvplan reads (vllm/config/speculative.py SpeculativeConfig); vLLM takes more
_SPEC_KEYS_READ = {"method", "num_speculative_tokens", "model"}


SGLANG_NGRAM_DRAFT_TOKENS = 12  # server_args.py speculative_ngram_max_match_window_size, NGRAM's draft tokens


def parse_speculative(f: EstimateFlags | SolveFlags) -> Any:
    """--speculative-config (vLLM) or --speculative-algorithm/-num-steps/-num-draft-tokens (SGLang), and
    --acceptance-length: a request.Speculative, or None."""

    from kvplan.request import Speculative

    sglang = f.speculative_algorithm is not None
    sglang_extra = f.speculative_num_steps is not None or f.speculative_num_draft_tokens is not None
    engine = f.engine.lower()
    if f.speculative_config is not None and (sglang or sglang_extra):
        raise UsageError(
            "--speculative-config is vLLM's; SGLang takes --speculative-algorithm: give one of them"
        )
    if f.speculative_config is not None:
        if engine != "vllm":
            raise UsageError("--speculative-config is a vllm flag; SGLang takes --speculative-algorithm")
        cfg = _json_flag(f.speculative_config, "--speculative-config")
        if not isinstance(cfg, dict):
            raise UsageError('--speculative-config: give a JSON object, e.g. \'{"method": "mtp", ...}\'')
        method = str(cfg.get("method") or ("draft_model" if cfg.get("model") else "")).lower()
        if method in ("deepseek_mtp", "qwen3_next_mtp", "ernie_mtp", "glm4_moe_mtp", "mimo_mtp"):
            method = "mtp"  # vLLM's per-model MTP names (vllm/config/speculative.py)
        n = cfg.get("num_speculative_tokens")
        if not isinstance(n, int) or isinstance(n, bool):
            raise UsageError("--speculative-config: give num_speculative_tokens, a whole number")
        return Speculative.make(
            method, n, None, f.acceptance_length, "--speculative-config method", _draft_config(f, method),
            "--speculative-config num_speculative_tokens",
            tuple(sorted(str(k)[:40] for k in cfg if k not in _SPEC_KEYS_READ)),
        )  # fmt: skip
    if sglang:
        if engine != "sglang":
            raise UsageError("--speculative-algorithm is an sglang flag; vLLM takes --speculative-config")
        return _sglang_speculative(f)
    if sglang_extra:
        raise UsageError(
            "--speculative-num-steps/--speculative-num-draft-tokens need --speculative-algorithm"
        )
    if f.speculative_draft_config is not None:
        raise UsageError(
            "--speculative-draft-config needs speculative decoding (--speculative-config or --speculative-algorithm)"
        )
    if f.acceptance_length is not None:
        raise UsageError(
            "--acceptance-length needs speculative decoding (--speculative-config or --speculative-algorithm)"
        )
    return None


def _sglang_speculative(f: EstimateFlags | SolveFlags) -> Any:
    """SGLang's --speculative-algorithm/-num-steps/-num-draft-tokens as a request.Speculative."""
    from kvplan.request import SGLANG_SPEC, Speculative

    algo = str(f.speculative_algorithm).upper()
    if algo not in SGLANG_SPEC:
        raise UsageError(f"--speculative-algorithm must be {', '.join(SGLANG_SPEC)}, got {algo!r}")
    steps, tokens = f.speculative_num_steps, f.speculative_num_draft_tokens
    if algo == "NGRAM":
        # server_args.py _handle_speculative_decoding: NGRAM's top-k is speculative_ngram_max_bfs_breadth and its
        # draft tokens default to speculative_ngram_max_match_window_size (12); the steps + 1 rule is EAGLE's.
        # Its draft is a lookup in the prompt, no draft passes: the tokens proposed are draft tokens - 1
        if steps is not None:
            raise UsageError(
                "--speculative-num-steps would change nothing for NGRAM (its draft is a lookup, no draft passes); "
                "give --speculative-num-draft-tokens, or leave both out for SGLang's 12"
            )
        verify = SGLANG_NGRAM_DRAFT_TOKENS if tokens is None else tokens
        return Speculative.make(
            "ngram", max(1, verify - 1), verify, f.acceptance_length, "--speculative-algorithm",
            _draft_config(f, "ngram"), "--speculative-num-draft-tokens",
        )  # fmt: skip
    if f.speculative_num_steps is None:
        raise UsageError(
            "--speculative-num-steps: give the draft steps (kvplan does not pick SGLang's default)"
        )
    if tokens is not None and isinstance(steps, int) and steps >= 1 and tokens != steps + 1:
        # SGLang server_args.py: with speculative_eagle_topk 1 (the one kvplan models) the draft tokens are
        # adjusted to speculative_num_steps + 1, with a warning
        raise UsageError(
            f"--speculative-num-draft-tokens {tokens}: with top-k 1 (the only kind kvplan models) SGLang sets "
            f"it to --speculative-num-steps + 1 = {steps + 1}; give that or leave it out"
        )
    return Speculative.make(
        SGLANG_SPEC[algo], f.speculative_num_steps, f.speculative_num_draft_tokens, f.acceptance_length,
        "--speculative-algorithm", _draft_config(f, SGLANG_SPEC[algo]), "--speculative-num-steps",
    )  # fmt: skip


def _draft_config(f: EstimateFlags | SolveFlags, method: str) -> Any:
    """--speculative-draft-config: the draft's config.json as a ModelSpec (EAGLE/EAGLE-3 heads); refused
    for methods whose draft is no checkpoint of its own (mtp: the target's MTP layers; ngram: none)."""
    if f.speculative_draft_config is None:
        return None
    if method not in ("eagle", "eagle3"):
        raise UsageError(
            f"--speculative-draft-config: {method} has no draft checkpoint of its own "
            "(mtp uses the target's MTP layers, ngram none); leave the flag out"
        )

    return load_spec(f.speculative_draft_config, "--speculative-draft-config")


_NETWORK_RE = re.compile(r"^\s*(\d{1,6})\s*G(?:b/s|bps|b)?\s*$", re.IGNORECASE)


def parse_network(
    name: str | None, gbps: float | None = None, latency_us: float | None = None
) -> Network | None:
    """--network 400G, or --network-gbps N [--network-latency-us L]: the inter-node fabric per GPU;
    None when nothing is given (the default, 400G)."""
    from kvplan.model.parallel import NETWORKS, Network

    presets = ", ".join(NETWORKS)
    if name is not None and (gbps is not None or latency_us is not None):
        raise UsageError(
            "--network: give a preset (e.g. 400G) or --network-gbps/--network-latency-us, not both"
        )
    if name is not None:
        m = _NETWORK_RE.match(name)
        key = f"{int(m.group(1))}G" if m else None
        if key not in NETWORKS:
            raise UsageError(
                f"--network: unknown fabric {name[:40]!r}; use one of {presets}, or --network-gbps N "
                "--network-latency-us L"
            )
        return NETWORKS[key]
    if gbps is None:
        if latency_us is not None:
            raise UsageError("--network-latency-us goes with --network-gbps (the link's Gb/s per GPU)")
        return None
    if not 1 <= gbps <= 100_000:  # also refuses nan and inf; 1 Gb/s: the slowest Ethernet a cluster has
        raise UsageError(f"--network-gbps must be 1 to 100,000 Gb/s per GPU, got {gbps:g}")
    if latency_us is not None and not 0 <= latency_us <= 1e6:
        raise UsageError(
            f"--network-latency-us must be between 0 and 1,000,000 microseconds, got {latency_us}"
        )
    return Network(
        f"{gbps:g}G (custom)",
        gbps,
        None if latency_us is None else latency_us * 1e-6,
        f"a {gbps:g} Gb/s link per GPU (--network-gbps)",
    )


def parse_env(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    """--env NAME=VALUE (repeatable) -> ((NAME, VALUE), ...); a name given twice keeps the last."""
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Z_][A-Z0-9_]{0,127}", name.strip()) or len(value) > 64:
            raise UsageError(f"--env: cannot read {item[:80]!r}; write NAME=VALUE, e.g. --env VLLM_FOO=1")
        out[name.strip()] = value.strip()
    return tuple(out.items())


def plan_request(f: EstimateFlags, gpus_flag: str = "--gpus") -> PlanRequest:
    from kvplan.formats import normalize_dtype_name
    from kvplan.plan.plan import PlanRequest
    from kvplan.units import parse_bytes, parse_count

    gpu, num_gpus, nodes = load_cluster(f.gpus, gpus_flag)
    spec = load_spec(f.model)
    if f.max_num_batched_tokens and f.engine.lower() == "sglang":
        # SGLang's step budget is its chunked prefill size (server_args.py); kvplan would drop this flag
        raise UsageError(
            "--max-num-batched-tokens is a vllm flag; SGLang's step budget is --chunked-prefill-size: "
            "give that, or add --engine vllm"
        )
    mnbt = (
        parse_count(f.max_num_batched_tokens, "--max-num-batched-tokens")
        if f.max_num_batched_tokens
        else None
    )
    reserve_bytes = parse_bytes(f.reserve_memory, "--reserve-memory") if f.reserve_memory else None
    reserve_source = None
    if (
        f.calibration
        and reserve_bytes is None
        and f.kv_cache_memory is None
        and f.num_gpu_blocks_override is None
    ):
        tp, pp = f.tensor_parallel_size, f.pipeline_parallel_size
        reserve_bytes, reserve_source = calibrated_reserve(
            spec.name, gpu, f.engine.lower(), num_gpus, nodes or 1, tp, pp, mnbt or _default_mnbt(f, gpu)
        )
    bandwidth = bandwidth_profile(gpu, f.calibration, f.calibration_file, f.force_calibration)
    if f.weight_dtype is not None and not f.weight_dtype.strip():
        raise UsageError("--weight-dtype: give a format such as fp8, int4 or nvfp4, or leave the flag out")
    # vLLM's --max-model-len auto, or its -1 (vllm/engine/arg_utils.py: "-1" and "auto" alike)
    auto = f.max_model_len is not None and f.max_model_len.strip().lower() in ("auto", "-1")
    return PlanRequest(
        model=spec,
        gpu=gpu,
        num_gpus=num_gpus,
        nodes=nodes,
        tp=f.tensor_parallel_size,
        pp=f.pipeline_parallel_size,
        max_model_len=parse_count(f.max_model_len, "--max-model-len")
        if f.max_model_len and not auto
        else None,
        max_model_len_auto=auto,
        avg_context_tokens=parse_count(f.avg_context, "--avg-context") if f.avg_context else None,
        input_len=parse_count(f.input_len, "--input-len") if f.input_len is not None else None,
        output_len=parse_count(f.output_len, "--output-len") if f.output_len is not None else None,
        kv_cache_dtype=f.kv_cache_dtype,
        kv_quant_group_size=f.kv_quant_group_size,
        kv_quant_scale_bits=f.kv_quant_scale_bits,
        kv_quant_zero_point=f.kv_quant_zero_point,
        weight_dtype=f.weight_dtype,
        gpu_memory_utilization=f.gpu_memory_utilization,
        kv_cache_memory_bytes=parse_bytes(f.kv_cache_memory, "--kv-cache-memory")
        if f.kv_cache_memory
        else None,
        reserve_bytes=reserve_bytes,
        reserve_source=reserve_source,
        max_num_batched_tokens=mnbt,
        max_num_seqs=f.max_num_seqs,
        block_size=f.block_size,
        engine=f.engine.lower(),
        engine_version=f.engine_version,
        num_gpu_blocks_override=f.num_gpu_blocks_override,
        disable_hybrid_kv_cache_manager=f.disable_hybrid_kv_cache_manager,
        enforce_eager=f.enforce_eager,
        mem_fraction_static=f.mem_fraction_static,
        swa_full_tokens_ratio=f.swa_full_tokens_ratio,
        disable_hybrid_swa_memory=f.disable_hybrid_swa_memory,
        mamba_ssm_dtype=normalize_dtype_name(f.mamba_ssm_cache_dtype) if f.mamba_ssm_cache_dtype else None,
        images_per_request=f.images_per_request,
        enable_prefix_caching=f.enable_prefix_caching is not False,
        prefix_caching_stated=f.enable_prefix_caching is not None,
        **bandwidth,
        shared_prefix_tokens=parse_count(f.shared_prefix_tokens, "--shared-prefix-tokens"),
        prefix_hit_rate=f.prefix_hit_rate,
        usage=f.usage,
        runner=f.runner,
        dtype=f.dtype,
        cpu_offload_gb=f.cpu_offload_gb,
        max_total_tokens=f.max_total_tokens,
        max_running_requests=f.max_running_requests,
        chunked_prefill_size=f.chunked_prefill_size,
        env=parse_env(f.env),
        network=parse_network(f.network, f.network_gbps, f.network_latency_us),
        data_parallel_size=f.data_parallel_size,
        enable_expert_parallel=f.enable_expert_parallel,
        enable_dp_attention=f.enable_dp_attention,
        ep_size=f.ep_size,
        moe_a2a_backend=f.moe_a2a_backend.lower() if f.moe_a2a_backend else None,
        num_redundant_experts=f.num_redundant_experts,
        enable_eplb=f.enable_eplb,
        moe_imbalance=f.moe_imbalance,
        speculative=parse_speculative(f),
    )


def disaggregated_requests(
    f: EstimateFlags,
    prefill_gpus: str | None,
    decode_gpus: str | None,
    prefill_tp: int | None = None,
    decode_tp: int | None = None,
) -> tuple[PlanRequest, PlanRequest]:
    """`estimate --disaggregated`: the prefill pool's and the decode pool's requests, the same flags
    with each pool's GPUs (--gpus is not used) and, when given, each pool's own TP."""
    if not prefill_gpus or not decode_gpus:
        raise UsageError("--disaggregated needs --prefill-gpus NxGPU and --decode-gpus MxGPU, e.g. 8xH100")
    if f.input_len is None or f.output_len is None:
        raise UsageError("--disaggregated needs --input-len and --output-len (a request's prompt and output)")
    ignored = [flag for flag, given in (("--avg-context", f.avg_context is not None),
               ("--shared-prefix-tokens", f.shared_prefix_tokens not in ("0", "")),
               ("--prefix-hit-rate", f.prefix_hit_rate != 1.0)) if given]  # fmt: skip
    if ignored:
        raise UsageError(
            f"--disaggregated sizes its pools from --input-len and --output-len; {', '.join(ignored)} "
            "would change nothing: leave them out"
        )
    for tp, flag in ((prefill_tp, "--prefill-tp"), (decode_tp, "--decode-tp")):
        if tp is not None and not 1 <= tp <= 1024:
            raise UsageError(f"{flag} must be between 1 and 1,024, got {tp}")
    p_tp = prefill_tp or f.tensor_parallel_size
    d_tp = decode_tp or f.tensor_parallel_size
    prefill = plan_request(
        dataclasses.replace(f, gpus=prefill_gpus, tensor_parallel_size=p_tp), "--prefill-gpus"
    )
    decode = plan_request(
        dataclasses.replace(f, gpus=decode_gpus, tensor_parallel_size=d_tp), "--decode-gpus"
    )
    for req, tp, gpus, flags in ((prefill, p_tp, prefill_gpus, "--prefill-gpus/--prefill-tp"),
                                 (decode, d_tp, decode_gpus, "--decode-gpus/--decode-tp")):  # fmt: skip
        if tp and req.num_gpus and req.num_gpus % tp:
            raise UsageError(
                f"{flags}: TP {tp} does not divide the {req.num_gpus} GPUs of {gpus}; choose a divisor"
            )
    return prefill, decode


def _default_mnbt(f: EstimateFlags, gpu: GpuSpec) -> int:
    """The engine's default --max-num-batched-tokens (the key of a saved calibration)."""
    from kvplan import engines
    from kvplan.request import USAGES

    if f.usage not in USAGES:
        raise UsageError(f"--usage must be {' or '.join(USAGES)}, got {f.usage!r}")
    cls = engines.engine_class(f.engine.lower())
    return cls.batch_defaults(gpu, f.usage, cls.parse_version(f.engine_version)).max_num_batched_tokens


def bandwidth_profile(gpu: GpuSpec, use_saved: bool, path: str | None, force: bool = False) -> dict[str, Any]:
    """PlanRequest fields from a `kvplan calibrate` profile: a named one, else this GPU's saved one.
    A profile of another device (a CPU, another GPU) is refused unless `force`, and then says so."""
    from kvplan.userdata import present, profile_path, shipped_profile_path

    saved = use_saved and any(present(p) for p in (profile_path(gpu.name), shipped_profile_path(gpu.name)))
    if not path and not saved:
        return {}  # nothing to read: the calibration module need not even load
    from kvplan.calibrate import calibration

    found = (calibration.load(Path(path)), Path(path)) if path else calibration.find_for(gpu.name)
    if found is None:
        return {}
    prof, where = found
    fields: dict[str, Any] = {
        "calibration": prof,  # its measured GEMMs, all-reduce and launch floor, where it has them
        "calibration_use": calibration.use_for(prof, where, gpu, force),
    }
    if prof.fit is not None:
        fields.update(
            decode_bandwidth_bytes_per_s=prof.fit.peak_bytes_per_s,
            decode_bandwidth_half_bytes=prof.fit.half_bytes,
            decode_bandwidth_source=prof.describe(where),
        )
    return fields


def calibrated_reserve(
    model: str,
    gpu: GpuSpec,
    engine: str,
    num_gpus: int | None,
    nodes: int,
    tp: int | None,
    pp: int | None,
    max_num_batched_tokens: int,
) -> tuple[int | None, str | None]:
    """A saved non-KV overhead for this exact setup, if `check-log --save-calibration` recorded one."""
    from kvplan.userdata import overheads_path, present

    path = overheads_path()
    if not present(path):  # a dangling link or a loop is refused
        return None, None
    from kvplan.logs import overheads
    from kvplan.model.parallel import make_layout

    try:
        layout = make_layout(num_gpus, gpu.gpus_per_node, nodes, tp, pp)
    except KvplanError:
        return None, None  # the planner reports the bad layout itself
    entry = overheads.find(path, model, gpu.name, engine, layout.tp, layout.pp, max_num_batched_tokens)
    if entry is None:
        return None, None
    if entry.reserve_bytes >= gpu.memory_bytes:  # an edited file: no engine keeps a whole GPU beside its KV
        raise UsageError(
            f"{path}: reserve_bytes {entry.reserve_bytes:,} for {model} on {gpu.name} is more than the GPU's "
            f"{gpu.memory_bytes:,} bytes; fix or delete that entry, or pass --no-calibration"
        )
    return entry.reserve_bytes, entry.describe(path)


# --- check-log --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogCheck:
    result: CheckResult
    source: str  # the log's file name, or "stdin"
    saved: Path | None  # where --save-calibration wrote the overhead


def read_log(log_file: str | None) -> tuple[str, str]:
    """(text, source) of a log file, or of stdin for '-' or nothing (but never a terminal)."""
    if log_file in (None, "-"):
        if log_file is None and sys.stdin.isatty():
            raise UsageError(
                "give a log file, or pipe the startup log in: vllm serve ... 2>&1 | kvplan check-log"
            )
        raw = getattr(sys.stdin, "buffer", None)
        if raw is None:  # a text-only stream (an embedding program's)
            text = sys.stdin.read(MAX_LOG_BYTES + 1)
        else:  # bytes, so a UTF-16 log piped from PowerShell reads as it does from a file
            data = raw.read(MAX_LOG_BYTES + 1)
            if len(data) > MAX_LOG_BYTES:
                raise UsageError(f"stdin: the log is over kvplan's limit of {MAX_LOG_BYTES:,} bytes")
            text = _log_text(data, "stdin")
        if len(text) > MAX_LOG_BYTES:
            raise UsageError(f"stdin: the log is over kvplan's limit of {MAX_LOG_BYTES:,} characters")
        return text, "stdin"
    path = Path(log_file)
    try:
        missing = (
            not path.exists() and not path.is_symlink()
        )  # a link loop is read, and refused for what it is
    except OSError as exc:  # a name the system will not look up (over 255 bytes a part)
        raise UsageError(f"{log_file[:80]}: cannot read ({exc.strerror or exc})") from None
    if missing:
        raise UsageError(f"{log_file}: cannot read (No such file or directory)")
    try:
        data = read_regular(path, MAX_LOG_BYTES)
    except KvplanError as exc:
        raise UsageError(str(exc)) from None
    return _log_text(data, log_file), path.name


def _log_text(data: bytes, source: str) -> str:
    """A log's bytes as text: UTF-8, or UTF-16 where a byte-order mark says so (PowerShell's `>`
    writes UTF-16); other bytes with NULs are refused in one line rather than read as no KV lines."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            raise UsageError(
                f"{source}: not UTF-16 text after its byte-order mark; save the log as UTF-8"
            ) from None
    if b"\x00" in data[:4096]:
        raise UsageError(f"{source}: not UTF-8 text (it holds NUL bytes: UTF-16 without a byte-order mark?); "
                         "save the log as UTF-8")  # fmt: skip
    return data.decode("utf-8-sig", errors="replace")


def parse_log(text: str, source: str) -> ParsedLog:
    from kvplan.logs.logparse import found_numbers, parse

    try:
        log = parse(text)
    except UsageError as exc:
        raise UsageError(f"{source}: {exc}") from None
    if log.engine is None or not found_numbers(log):
        raise UsageError(
            f"{source}: no vLLM or SGLang KV-cache lines found (looked for 'GPU KV cache size', "
            "'Available KV cache memory', '# GPU blocks', 'KV Cache is allocated'); paste the engine's startup log"
        )
    return log


def log_model(log: ParsedLog, source: str, model: str | None) -> ModelSpec:
    """--model, else the model the log names (which must then be a shipped one)."""

    model_ref = model or log.get("model")
    if not model_ref:
        raise UsageError(f"{source}: the log does not name the model; pass --model")
    if not model:
        model_ref = _logged_model_ref(str(model_ref), source)
    try:
        spec = load_spec(model_ref)
        if model and log.get("model"):
            _same_model(spec, str(log.get("model")), source)
        return spec
    except KvplanError as exc:
        if model:
            raise
        raise UsageError(
            f"{exc}; the log names {model_ref!r}: pass --model NAME or its config.json"
        ) from None


def _same_model(spec: ModelSpec, logged: str, source: str) -> None:
    """--model must be the model the log serves where kvplan ships that one: a different architecture
    would be checked against the wrong numbers (a config.json of the same model, renamed, passes)."""
    from kvplan.specs.registry import find_shipped_model

    served = find_shipped_model(logged)
    if served is None:
        return

    def shape(m: ModelSpec) -> tuple:
        return m.num_layers, m.hidden_size, m.num_attention_heads, m.vocab_size

    if shape(served) != shape(spec):
        raise UsageError(
            f"{source}: --model {spec.name}, but the log serves {logged} ({served.name}: {served.num_layers} "
            f"layers, hidden size {served.hidden_size:,}; {spec.name}: {spec.num_layers}, "
            f"{spec.hidden_size:,}); drop --model or pass the model the log serves"
        )


def _logged_model_ref(ref: str, source: str) -> str:
    """A model the log names: a shipped name/HF id, or a local directory holding a config.json;
    never any other local file (a pasted log must not make kvplan open arbitrary paths)."""
    from kvplan.limits import MAX_NAME_CHARS

    try:
        if len(ref) <= MAX_NAME_CHARS and Path(ref).is_dir() and (Path(ref) / "config.json").is_file():
            return ref
    except OSError:
        pass
    if (
        len(ref) > MAX_NAME_CHARS
        or Path(ref).suffix.lower() in (".yaml", ".yml", ".json")
        or ref.startswith(("/", "~", "."))
    ):
        raise UsageError(
            f"{source}: the log names {ref[:80]!r}, which is neither a shipped model nor a directory "
            "holding a config.json; pass --model NAME or its config.json"
        )
    return ref


def log_gpu(log: ParsedLog, source: str, gpus: str | None) -> GpuSpec:
    """--gpus, else the one GPU whose memory matches the total the log gives."""
    from kvplan.logs.checklog import infer_gpu
    from kvplan.specs.registry import all_gpus

    if gpus:
        return load_cluster(gpus)[0]
    total = log.get("total_gpu_memory_bytes")
    gpu = infer_gpu(total, all_gpus()) if total else None
    if gpu is None:
        raise UsageError(f"{source}: the log does not say which GPU; pass --gpus, e.g. --gpus H100")
    return gpu


# a setting check-log takes from the log unless its flag is given: the flag a refusal names, and the log's field
_LOG_SETTINGS = (
    ("--gpu-memory-utilization", "gpu_memory_utilization"),
    ("--mem-fraction-static", "mem_fraction_static"),
    ("--kv-cache-dtype", "kv_cache_dtype"),
    ("--block-size", "block_size"),
    ("--page-size", "block_size"),
    ("--max-num-batched-tokens", "max_num_batched_tokens"),
    ("--max-num-seqs", "max_num_seqs"),
    ("--max-model-len", "max_model_len"),
    ("--dtype", "dtype"),
)


def _log_named(message: str, log: Any, overrides: dict[str, Any]) -> str:
    """A refusal of a setting the log gave (not a flag the user typed) names the log's field instead."""
    for flag, key in _LOG_SETTINGS:
        if message.startswith(flag) and overrides.get(key) is None and key in log.facts:
            return f"the log's {key}{message[len(flag) :]}; paste the engine's own log"
    return message


_LAYOUT_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


def _unlogged_layout(
    log: ParsedLog, gpus: str | None, overrides: dict[str, Any]
) -> tuple[str | None, dict[str, Any]]:
    """A log that names no parallel layout (a pasted excerpt without the engine's arguments): TP over the GPUs
    --gpus names on one node, said in a note; TP 1 where it names no count. (note, overrides)"""
    if any(k in log.facts for k in _LAYOUT_KEYS):
        return None, overrides
    count, nodes = load_cluster(gpus)[1:] if gpus else (None, 1)
    if count is None or count == 1:
        return (
            "the log names no parallel layout (TP, PP, DP): checked on one GPU, TP 1; give --gpus NxGPU if it ran on "
            "more",
            overrides,
        )
    if nodes > 1:
        raise UsageError(
            f"the log names no parallel layout (TP, PP, DP) and --gpus {gpus} spans {nodes} nodes: paste the log "
            "with the engine's arguments (vLLM's 'non-default args', SGLang's 'server_args')"
        )
    note = (
        f"the log names no parallel layout (TP, PP, DP): checked at TP {count}, the GPUs --gpus {gpus} names"
    )
    return note, {**overrides, "tp": count, "num_gpus": count}


def check_log(
    log_file: str | None,
    model: str | None,
    gpus: str | None,
    overrides: dict[str, Any],
    save_calibration: bool,
    text: str | None = None,
) -> LogCheck:
    """Read, parse and check a startup log (or its `text`); with save_calibration, keep its measured
    overhead. `overrides` fill what the log does not say (max_num_batched_tokens as typed: 8K)."""
    from kvplan.logs import overheads
    from kvplan.logs.checklog import check, request_from_log
    from kvplan.units import parse_count

    for flag, given in (
        ("--gpus", gpus),
        ("--model", model),
        ("--max-num-batched-tokens", overrides.get("max_num_batched_tokens")),
    ):
        if isinstance(given, str) and not given.strip():
            raise UsageError(f"{flag}: empty; give a value, or leave the flag out")
    text, source = (text, "text") if text is not None else read_log(log_file)
    log = parse_log(text, source)
    spec = log_model(log, source, model)
    gpu = log_gpu(log, source, gpus)
    mnbt = overrides.get("max_num_batched_tokens")
    overrides = {
        **overrides,
        "max_num_batched_tokens": parse_count(mnbt, "--max-num-batched-tokens") if mnbt else None,
    }
    _check_log_engine_flags(log.engine or "vllm", overrides)
    layout_note, overrides = _unlogged_layout(log, gpus, overrides)
    try:
        req = request_from_log(log, spec, gpu, overrides)
    except UsageError as exc:
        raise UsageError(f"{source}: {_log_named(str(exc), log, overrides)}") from None
    try:
        result = check(log, req)
    except UsageError as exc:  # a refusal of the log's own setting names the log; of a flag, the flag
        if (named := _log_named(str(exc), log, overrides)) == str(exc):
            raise
        raise UsageError(f"{source}: {named}") from None
    if layout_note:
        result.notes.insert(0, layout_note)
    elif gpus:
        asked = load_cluster(gpus)[1]
        used = result.prediction.cluster.num_gpus
        if asked is not None and asked != used:
            result.notes.insert(0, f"--gpus {gpus} names {asked:,} GPUs but the log ran on {used:,} "
                                f"(TP x PP x DP as it logs them); checked on {used:,}")  # fmt: skip
    saved = overheads.save_measured(result, spec.name, gpu.name, source) if save_calibration else None
    return LogCheck(result, source, saved)


# --- solve ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SolveFlags:
    """`kvplan solve`'s flags as typed."""

    model: str
    users: int
    max_model_len: str | None = None
    gpus: str | None = None  # GPU types to search (default H100); with max_context, NxGPU to use
    tpot_ms: float | None = None
    kv_cache_dtype: str = "any"
    max_gpus: int = 64
    price: str | None = None
    max_context: bool = False
    engine: str = "vllm"
    block_size: int | None = None
    gpu_memory_utilization: float | None = None
    top: int = 5
    avg_context: str | None = None
    input_len: str | None = None
    output_len: str | None = None
    gpus_flag: str = "--gpus"  # the name the user typed (--gpu is an alias), for messages
    calibration: bool = True  # use each GPU's saved `kvplan calibrate` profile where there is one
    calibration_file: str | None = None  # a profile for every GPU type searched, as estimate's
    force_calibration: bool = False  # use a profile of another device anyway
    partial_nodes: bool = False  # answers may use part of a node (else whole nodes)
    network: str | None = None
    network_gbps: float | None = None
    network_latency_us: float | None = None
    fixed_gpus: bool = False  # --max-rate: --gpus is the GPUs you have (NxGPU), with --max-model-len
    moe_imbalance: float = 1.0  # under expert parallelism (the EP layouts solve tries)
    speculative_config: str | None = None  # vLLM, JSON as typed
    speculative_algorithm: str | None = None  # SGLang
    speculative_num_steps: int | None = None
    speculative_num_draft_tokens: int | None = None
    acceptance_length: float | None = None
    speculative_draft_config: str | None = None

    def __post_init__(self) -> None:
        refuse_empty(self)


@dataclass(frozen=True)
class LoadFlags:
    """`solve --request-rate` / `--max-rate`: the targets and the workload (simulate's flags)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    percentile: int = 90
    request_rate: float | None = None
    max_rate: bool = False
    num_prompts: int | None = None
    input_len: str | None = None  # None: simulator.synthetic's default
    output_len: str | None = None
    range_ratio: float = 0.0
    burstiness: float = 1.0
    trace: str | None = None
    seed: int = 0
    disaggregated: bool = False  # a prefill pool and a decode pool (search/disagg_rate.py)

    def __post_init__(self) -> None:
        refuse_empty(self)


def lengths(input_len: int | str | None, output_len: int | str | None) -> tuple[int, int]:
    """A synthetic workload's prompt and output tokens as given (8K or 8192), else its defaults."""
    from kvplan.simulator.workload import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN
    from kvplan.units import parse_count

    def one(value: int | str | None, flag: str, default: int) -> int:
        return default if value is None else value if isinstance(value, int) else parse_count(value, flag)

    return one(input_len, "--input-len", DEFAULT_INPUT_LEN), one(
        output_len, "--output-len", DEFAULT_OUTPUT_LEN
    )


def check_trace_flags(given: dict[str, bool]) -> None:
    """A trace sets every request's lengths and send time: the synthetic workload's flags beside it would
    be ignored, so they are refused."""
    extra = [flag for flag, on in given.items() if on]
    if extra:
        raise UsageError(
            f"--trace gives each request's lengths and send time: {', '.join(extra)} "
            f"{'does' if len(extra) == 1 else 'do'} not apply with it; drop {'it' if len(extra) == 1 else 'them'}"
        )


def solve_load(f: SolveFlags, load: LoadFlags) -> Any:
    """`solve --request-rate R` (fewest/cheapest GPUs at R requests/s) or `solve --max-rate` (the highest
    rate on the GPUs given), both meeting --ttft-ms/--tpot-ms at --percentile, by simulation."""
    import math

    from kvplan.search import rate
    from kvplan.simulator import read_trace, synthetic

    if (load.request_rate is None) == (not load.max_rate):
        raise UsageError(
            "give one of --request-rate R (the GPUs for that rate) or --max-rate (on --gpus NxGPU)"
        )
    # one answer: --top has nothing to choose from; --max-rate's GPUs are the ones given (the CLI and the API)
    plain = SolveFlags(model=f.model, users=1)
    idle = [flag for flag, on in (
        ("--top", f.top != plain.top), ("--max-gpus", load.max_rate and f.max_gpus != plain.max_gpus),
        ("--price", load.max_rate and f.price is not None), ("--partial-nodes", load.max_rate and f.partial_nodes),
    ) if on]  # fmt: skip
    if idle:
        what = "--max-rate answers for the GPUs given" if load.max_rate else "--request-rate gives one answer"
        raise UsageError(
            f"{', '.join(idle)} would change nothing: {what}; leave {'it' if len(idle) == 1 else 'them'} out"
        )
    if f.avg_context is not None:
        raise UsageError(
            "--avg-context: under --request-rate/--max-rate each request's context is its workload's lengths "
            "(--input-len/--output-len or the trace), simulated token by token; leave it out"
        )
    if load.ttft_ms is None or f.tpot_ms is None:
        raise UsageError("--request-rate/--max-rate need both targets: --ttft-ms and --tpot-ms")
    targets = rate.LoadTargets(load.ttft_ms, f.tpot_ms, load.percentile)
    if load.max_rate and not (f.gpus and parse_gpus(f.gpus.split(",")[0], f.gpus_flag)[0]):
        raise UsageError(
            f"--max-rate needs the GPUs you have: {f.gpus_flag} NxGPU, e.g. {f.gpus_flag} 8xH100"
        )
    from kvplan.search.solve import check_query

    q = solve_query(dataclasses.replace(f, users=1, fixed_gpus=load.max_rate))
    check_query(q)  # e.g. --max-model-len beyond the model's maximum: one line, before any layout
    if load.trace is not None:
        check_trace_flags(
            {"--input-len": load.input_len is not None, "--output-len": load.output_len is not None,
             "--range-ratio": load.range_ratio != 0.0, "--burstiness": load.burstiness != 1.0,
             "--seed": load.seed != 0}
        )  # fmt: skip
        workload = read_trace(load.trace, None, load.num_prompts)
    else:
        inp, out = lengths(load.input_len, load.output_len)
        workload = synthetic(
            num_prompts=1000 if load.num_prompts is None else load.num_prompts,
            input_len=inp,
            output_len=out,
            range_ratio=load.range_ratio,
            request_rate=1.0,  # rescaled to each simulated rate
            burstiness=load.burstiness,
            seed=load.seed,
        )
    if load.disaggregated:
        if load.max_rate or load.request_rate is None:
            raise UsageError("--disaggregated answers for a --request-rate (not --max-rate)")
        if not (load.request_rate > 0 and not math.isinf(load.request_rate)):
            raise UsageError(
                f"--request-rate must be a positive number of requests/s, got {load.request_rate}"
            )
        from kvplan.search.disagg_rate import solve_disaggregated

        return solve_disaggregated(q, workload, targets, load.request_rate)
    if load.max_rate:
        return rate.max_rate(q, workload, targets)
    assert load.request_rate is not None
    if not (load.request_rate > 0 and not math.isinf(load.request_rate)):
        raise UsageError(f"--request-rate must be a positive number of requests/s, got {load.request_rate}")
    return rate.min_gpus_at_rate(q, workload, targets, load.request_rate)


def solve(f: SolveFlags) -> tuple[Query, list[Answer]]:
    """The answers, best first; none is a NoAnswer error that names what stopped the search."""
    from kvplan.errors import NoAnswer
    from kvplan.search.solve import solve as run_solve
    from kvplan.search.solve import verdict

    q = solve_query(f)
    answers, bounds = run_solve(q)
    if not answers:
        message, figures = verdict(q, bounds)
        raise NoAnswer(message, **figures)
    return q, answers


def solve_query(f: SolveFlags) -> Query:
    from kvplan.search.solve import ENGINE_DTYPES, Query
    from kvplan.units import parse_count

    _check_solve_flags(f)
    spec = load_spec(f.model)
    if f.moe_imbalance != 1.0:
        from kvplan.limits import check_number
        from kvplan.request import MAX_MOE_IMBALANCE

        check_number(
            f.moe_imbalance, "--moe-imbalance", 1.0, MAX_MOE_IMBALANCE,
            "the busiest EP rank's expert work over the mean: 1 is perfectly balanced",
        )  # fmt: skip
        if spec.moe is None:
            raise UsageError(
                f"--moe-imbalance: {spec.name} has no routed experts (it applies to the expert-parallel "
                "layouts solve tries for MoE models)"
            )
    flag = f.gpus_flag
    if f.gpus is not None and not f.gpus.strip(", "):
        raise UsageError(f"{flag}: give GPU names, e.g. H100 or H100,H200, or leave the flag out for H100")
    if f.max_context or f.fixed_gpus:
        if f.max_context and (not f.gpus or f.max_model_len):
            raise UsageError(f"--max-context needs {flag} (e.g. 8xH200) and no --max-model-len")
        if f.fixed_gpus and not f.max_model_len:
            raise UsageError("give --max-model-len (the context the engine is launched with)")
        cluster_gpu, n, _ = load_cluster(f.gpus or "H100", flag)
        gpu_specs: tuple[GpuSpec, ...] = (cluster_gpu,)
        fixed: int | None = n or 1
    else:
        gpu_specs, fixed = _gpu_types(f.gpus or "H100", flag), None
        if not f.max_model_len:
            raise UsageError(
                f"give --max-model-len (or ask for the longest context with --max-context {flag} NxGPU)"
            )
    dtypes = (
        ENGINE_DTYPES if f.kv_cache_dtype == "any" else tuple(d.strip() for d in f.kv_cache_dtype.split(","))
    )
    if f.kv_cache_dtype != "any" and "any" in dtypes:
        raise UsageError(
            f"--kv-cache-dtype {f.kv_cache_dtype!r}: 'any' already means every dtype the engines serve "
            f"({', '.join(ENGINE_DTYPES)}); give it alone, or name the dtypes"
        )
    if not all(dtypes):
        raise UsageError(
            f"--kv-cache-dtype {f.kv_cache_dtype!r}: an empty entry in the list; give dtypes joined by commas"
        )
    twice = sorted({d for d in dtypes if dtypes.count(d) > 1})
    if twice:
        raise UsageError(f"--kv-cache-dtype: {', '.join(twice)} named twice; give each KV dtype once")
    _check_engine_kv_dtypes(dtypes)
    prices = _prices(f.price, gpu_specs, flag)
    if f.avg_context and f.max_model_len:  # estimate's rule
        from kvplan.request import check_avg_context

        check_avg_context(
            parse_count(f.avg_context, "--avg-context"), parse_count(f.max_model_len, "--max-model-len")
        )
    return Query(
        model=spec,
        gpus=gpu_specs,
        users=f.users,
        max_model_len=parse_count(f.max_model_len, "--max-model-len") if f.max_model_len else None,
        tpot_ms=f.tpot_ms,
        kv_dtypes=dtypes,
        max_gpus=f.max_gpus,
        prices=prices,
        engine=f.engine.lower(),
        block_size=f.block_size,
        gpu_memory_utilization=f.gpu_memory_utilization,
        fixed_num_gpus=fixed,
        top=f.top,
        measured=tuple(
            (g.name, tuple(sorted(fields.items())))
            for g in gpu_specs
            if (fields := bandwidth_profile(g, f.calibration, f.calibration_file, f.force_calibration))
        ),
        avg_context_tokens=parse_count(f.avg_context, "--avg-context") if f.avg_context else None,
        input_len=parse_count(f.input_len, "--input-len") if f.input_len is not None else None,
        output_len=parse_count(f.output_len, "--output-len") if f.output_len is not None else None,
        partial_nodes=f.partial_nodes,
        network=parse_network(f.network, f.network_gbps, f.network_latency_us),
        moe_imbalance=f.moe_imbalance,
        speculative=parse_speculative(f),
    )


def solve_warnings(q: Query) -> list[str]:
    """The warnings of profiles used for a GPU they were not measured on (--force-calibration)."""
    out = []
    for _gpu, fields in q.measured:
        use = dict(fields).get("calibration_use")
        if use is not None and use.warning and use.warning not in out:
            out.append(use.warning)
    return out


def _check_log_engine_flags(engine: str, overrides: dict[str, Any]) -> None:
    """check-log reads the engine from the log: another engine's flag is a mistake to drop (estimate's advice,
    --engine, is no check-log option)."""
    from kvplan import engines

    if engine == "sglang" and overrides.get("max_num_batched_tokens") is not None:
        # SGLang's step budget is its chunked_prefill_size, read from the log's ServerArgs
        raise UsageError(
            "--max-num-batched-tokens is vLLM's flag and this is a SGLang log (its chunked_prefill_size is read "
            "from the log); drop it"
        )

    for other in engines.ENGINES.values():
        if other.name == engine:
            continue
        for flag, attr in other.own_flags.items():
            value = overrides.get(attr)
            if value not in (None, False, other.own_flag_defaults.get(attr)):
                raise UsageError(
                    f"{flag} is {other.display_name}'s flag and this is a {engines.engine_class(engine).display_name} "
                    "log; drop it"
                )


def _check_engine_kv_dtypes(dtypes: tuple[str, ...]) -> None:
    """solve prints launch commands: each KV dtype must be one vLLM and SGLang take (--kv-cache-dtype)."""
    from kvplan.engines import ENGINE_KV_DTYPES
    from kvplan.formats import normalize_dtype_name

    for d in dtypes:
        if d != "auto" and normalize_dtype_name(d) not in ENGINE_KV_DTYPES:
            raise UsageError(
                f"--kv-cache-dtype {d}: neither vLLM nor SGLang serves a KV cache of that dtype, so solve would "
                "print a launch command that cannot run; use auto, fp8 (or any), and estimate/compare for others"
            )
        # a KV cache in the model's own dtype is 'auto' on the engines' command lines
        if normalize_dtype_name(d) in ("bf16", "fp16", "fp32"):
            raise UsageError(
                f"--kv-cache-dtype {d}: the engines' launch flag for a KV cache in the model's own dtype is 'auto' "
                "(vLLM and SGLang name no bf16/fp16 KV on every release); use auto or fp8"
            )


def _gpu_types(text: str, flag: str) -> tuple[GpuSpec, ...]:
    """solve's GPU types to search: 'H100,H200'. A count (8xH200) means fixed GPUs: --max-context."""
    names = [g.strip() for g in text.split(",")]
    if not any(names):
        raise UsageError(f"{flag}: give GPU types, e.g. {flag} H100,H200")
    if not all(names):
        raise UsageError(f"{flag} {text!r}: an empty entry in the list; give GPU types joined by commas")
    for name in names:
        num_gpus, _, _ = parse_gpus(name, flag)
        if num_gpus is not None:
            raise UsageError(
                f"{flag} {name}: a GPU count means fixed GPUs, which goes with --max-context; to search "
                f"GPU types give types only (e.g. {flag} H100,H200) and cap the count with --max-gpus"
            )
    specs = tuple(load_gpu_as(name, flag) for name in names)
    twice = sorted({g.name for g in specs if sum(h.name == g.name for h in specs) > 1})
    if twice:
        raise UsageError(f"{flag}: {', '.join(twice)} named twice; give each GPU type once")
    return specs


def _check_solve_flags(f: SolveFlags) -> None:
    """solve's numbers, bounded so that the search stays small whatever is typed."""
    from kvplan.limits import MAX_GPUS, MAX_USERS, check_range
    from kvplan.search.rate import check_target_ms

    check_range(f.users, "--users", 1, MAX_USERS)
    check_range(f.max_gpus, "--max-gpus", 1, MAX_GPUS)
    check_range(f.top, "--top", 1, 1000)
    if f.tpot_ms is not None:
        check_target_ms("--tpot-ms", f.tpot_ms)
    if f.gpu_memory_utilization is not None and not 0 < f.gpu_memory_utilization <= 1:
        raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {f.gpu_memory_utilization}")


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(
            f"--price: cannot read {text.strip()!r} as a price; write e.g. 2.5 or 2.5,3.8"
        ) from None
    if not 0 < value < 1e9:  # also refuses nan and inf
        raise UsageError(f"--price: {text.strip()!r} is not a positive price per GPU-hour")
    if value < 0.01:  # costs print to the cent: every answer would read 0.00
        raise UsageError(f"--price: {text.strip()!r} is below 0.01 per GPU-hour, which kvplan's costs (to the "
                         "cent) cannot show; give the price per GPU-hour")  # fmt: skip
    return value


def _prices(price: str | None, gpu_specs: tuple[GpuSpec, ...], flag: str) -> dict[str, float] | None:
    """--price: one per GPU type, or one for all."""
    if not price:
        return None
    values = [_price(x) for x in price.split(",")]
    if len(values) not in (1, len(gpu_specs)) or any(v <= 0 for v in values):
        raise UsageError(f"--price: one positive price per {flag} type (or one for all)")
    return {g.name: values[0 if len(values) == 1 else i] for i, g in enumerate(gpu_specs)}
