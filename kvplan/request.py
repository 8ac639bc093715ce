"""The request: what a user asks `estimate` for, checked once before any planning.

A stage of its own: the engines and the speed model read it, the plan answers it. May import the
base modules, kvplan.specs and kvplan.calibrate (the profile).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvplan.errors import ContextTooLong, UsageError
from kvplan.formats import Format, kv_format, normalize_dtype_name
from kvplan.limits import MAX_GIB, MAX_GPUS, MAX_NODES, MAX_TOKENS, MAX_USERS, check_number
from kvplan.specs.models import GpuSpec, ModelSpec

if TYPE_CHECKING:
    from kvplan.calibrate.calibration import CalibrationUse, Profile
    from kvplan.model.parallel import Network

RUNNERS = ("auto", "generate", "pooling")  # vLLM's --runner (vllm/config/model.py RunnerOption)
USAGES = ("serve", "offline")
# managers/tp_worker.py: max_req_input_len = max_req_len - 5 (engines/sglang.py request_limits)
SGLANG_REQ_RESERVE = 5


def min_model_len(engine: str) -> int:
    """The shortest --max-model-len a request fits in: a prompt token and a generated one; SGLang's
    max_req_input_len = context - 1 - 5 must be above 0 besides."""
    return 2 + SGLANG_REQ_RESERVE if engine == "sglang" else 2


MAX_MOE_IMBALANCE = 64.0  # --moe-imbalance: the busiest EP rank's expert work over the mean  # vLLM's UsageContext: OPENAI_API_SERVER (`vllm serve`) or LLM_CLASS


def model_dtype_name(text: str) -> str | None:
    """--dtype as kvplan names it: auto, bf16, fp16 or fp32 (None: not a model dtype). The names are
    vLLM's (vllm/config/model.py _STR_DTYPE_TO_TORCH_DTYPE: half, float16, float, float32, bfloat16);
    SGLang's --dtype takes the same."""
    key = normalize_dtype_name(text)
    key = "fp32" if key == "float" else key
    return key if key in ("auto", "bf16", "fp16", "fp32") else None


# Speculative decoding (issue 23). DeepSeek-V3's technical report (arXiv:2412.19437, section 5.4.3):
# "the acceptance rate of the second token prediction ranges between 85% and 90%"; kvplan takes the low
# end for every MTP draft token (assumed: the report measures only the second token).
MTP_ACCEPTANCE = 0.85
MTP_SOURCE = (
    "MTP: each draft token accepted at 85%, the low end of DeepSeek-V3's 85-90% for its second-token "
    "prediction (arXiv:2412.19437, 5.4.3); the same rate assumed for every further draft token"
)
SPEC_METHODS = ("eagle", "eagle3", "mtp", "ngram")
# SGLang --speculative-algorithm as kvplan names the method (server_args.py 0.5.x: NEXTN is DeepSeek's MTP)
SGLANG_SPEC = {
    "EAGLE": "eagle",
    "EAGLE3": "eagle3",
    "NEXTN": "mtp",
    "STANDALONE": "draft_model",
    "NGRAM": "ngram",
}
SGLANG_ALGORITHM = {
    method: algo for algo, method in SGLANG_SPEC.items()
}  # the method's SGLang name  # draft-free or one-layer drafts kvplan can time


def check_avg_context(avg: int | None, max_len: int) -> None:
    """--avg-context is a request's mean context: at least 1 token, at most --max-model-len."""
    if avg is not None and not 1 <= avg <= max_len:
        raise UsageError(f"--avg-context must be between 1 and --max-model-len ({max_len:,}), got {avg:,}")


@dataclass(frozen=True)
class Speculative:
    """A speculative-decoding setup: `draft_steps` draft forward passes a step, `verify_tokens` tokens a
    request the target verifies (vLLM: num_speculative_tokens and + 1; SGLang: --speculative-num-steps
    and --speculative-num-draft-tokens), `acceptance_length` tokens accepted a step on average."""

    method: str  # eagle, eagle3, mtp, ngram (SGLang EAGLE, EAGLE3, NEXTN)
    draft_steps: int
    verify_tokens: int
    acceptance_length: float
    acceptance_source: str  # --acceptance-length, or the default's source
    flag: str  # the flag it came from, for messages
    draft: ModelSpec | None = None  # the draft checkpoint's config (--speculative-draft-config), EAGLE heads
    unread: tuple[str, ...] = ()  # --speculative-config keys kvplan does not read (said in the assumptions)

    @staticmethod
    def make(
        method: str,
        draft_steps: int,
        verify_tokens: int | None,
        acceptance: float | None,
        flag: str,
        draft: ModelSpec | None = None,
        steps_flag: str | None = None,
        unread: tuple[str, ...] = (),
    ) -> Speculative:
        if method not in SPEC_METHODS:
            raise UsageError(
                f"{flag}: method {method!r} is not modelled; kvplan times {', '.join(SPEC_METHODS)} "
                "(a separate draft model's weights, KV and step are not modelled yet)"
            )
        if not 1 <= draft_steps <= 64:
            raise UsageError(
                f"{steps_flag or flag}: draft tokens per step must be between 1 and 64, got {draft_steps}"
            )
        verify = draft_steps + 1 if verify_tokens is None else verify_tokens
        if not 2 <= verify <= 1024:
            raise UsageError(f"--speculative-num-draft-tokens must be between 2 and 1,024, got {verify}")
        if acceptance is None:
            if method != "mtp":
                raise UsageError(
                    f"--acceptance-length: give the mean tokens accepted per step for {flag} {method} "
                    "(kvplan has a sourced default only for mtp)"
                )
            acceptance = sum(MTP_ACCEPTANCE**i for i in range(min(draft_steps, verify - 1) + 1))
            source = f"assumed: {MTP_SOURCE}; 1 + 0.85 + ... + 0.85^{min(draft_steps, verify - 1)}"
        else:
            source = "--acceptance-length"
        check_number(
            acceptance, "--acceptance-length", 1.0, float(verify),
            f"tokens accepted per step, at most the {verify} a request verifies",
        )  # fmt: skip
        return Speculative(method, draft_steps, verify, acceptance, source, flag, draft, unread)

    @property
    def draft_tokens(self) -> int:
        """Tokens proposed a request a step: vLLM's num_speculative_tokens (SGLang: draft tokens - 1)."""
        return self.verify_tokens - 1


@dataclass(frozen=True)
class PlanRequest:
    model: ModelSpec
    gpu: GpuSpec
    num_gpus: int | None = None  # None: as many as TP x PP
    nodes: int = 1
    tp: int | None = None
    pp: int | None = None
    max_model_len: int | None = None  # None: the model's max context
    max_model_len_auto: bool = False  # vLLM --max-model-len auto: the longest that fits the KV pool
    avg_context_tokens: int | None = None
    input_len: int | None = None  # prompt tokens: the decode step runs at input + output / 2
    output_len: int | None = None
    kv_cache_dtype: str = "auto"
    kv_quant_group_size: int | None = None
    kv_quant_scale_bits: int | None = None
    kv_quant_zero_point: bool | None = None
    weight_dtype: str | None = None
    gpu_memory_utilization: float | None = None  # None: the engine's default
    kv_cache_memory_bytes: int | None = None
    reserve_bytes: int | None = None
    reserve_source: str | None = None  # where a given reserve came from (a calibration file)
    max_num_batched_tokens: int | None = None  # None: the engine's default for the card and usage
    max_num_seqs: int | None = None
    block_size: int | None = None  # None: the engine's default for this model and GPU
    engine: str = "vllm"
    engine_version: str | None = None  # None: the newest release kvplan knows
    num_gpu_blocks_override: int | None = None
    disable_hybrid_kv_cache_manager: bool = False
    enforce_eager: bool = False
    mem_fraction_static: float | None = None  # SGLang
    swa_full_tokens_ratio: float | None = None  # SGLang; None: its default
    disable_hybrid_swa_memory: bool = False  # SGLang
    mamba_ssm_dtype: str | None = None  # vLLM --mamba-ssm-cache-dtype, SGLang --mamba-ssm-dtype
    images_per_request: int | None = (
        None  # cross-attention models: images whose K/V a request holds (the spec's)
    )
    decode_bandwidth_bytes_per_s: float | None = (
        None  # measured peak (a calibration profile); None: datasheet
    )
    decode_bandwidth_half_bytes: float = 0.0  # the measured curve's half-saturation bytes
    decode_bandwidth_source: str | None = None
    # the `kvplan calibrate` profile in use (GEMMs, all-reduces, launch floor for the step model)
    calibration: Profile | None = field(default=None, compare=False, repr=False)
    calibration_use: CalibrationUse | None = None  # which file, and whether forced onto another device
    enable_prefix_caching: bool = True
    # False when no flag or log said it (the engine's own default may differ: vLLM before 0.28 leaves it off for hybrid models)
    prefix_caching_stated: bool = True
    shared_prefix_tokens: int = 0
    prefix_hit_rate: float = 1.0
    usage: str = "serve"  # vLLM's usage context: serve (`vllm serve`) or offline (the LLM class)
    runner: str = "auto"  # vLLM --runner: auto (from the model), generate or pooling (embedding models)
    dtype: str = "auto"  # --dtype: the model dtype (activations, auto KV, unquantized weights)
    cpu_offload_gb: float = 0.0  # --cpu-offload-gb: GiB of weights per GPU kept in CPU memory
    # the remedy flags the calling command takes, named in its refusals (compare and solve take neither)
    remedies: tuple[str, ...] = ("--weight-dtype", "--cpu-offload-gb")
    max_total_tokens: int | None = None  # SGLang: a cap on the KV pool's tokens
    max_running_requests: int | None = None  # SGLang: a cap on running requests
    chunked_prefill_size: int | None = None  # SGLang; None: its default for the card, -1: no chunking
    env: tuple[tuple[str, str], ...] = ()  # the engine's environment variables (--env NAME=VALUE)
    network: Network | None = None  # the inter-node fabric per GPU (--network); None: the default 400G
    # expert parallelism and DP attention (issue 23); each engine's rules in engines/vllm.py, sglang.py
    data_parallel_size: int | None = None  # vLLM --data-parallel-size, SGLang --dp-size
    enable_expert_parallel: bool = False  # vLLM: EP size = TP x DP
    enable_dp_attention: bool = False  # SGLang: attention TP size = TP / --dp-size
    ep_size: int | None = None  # SGLang --ep-size
    moe_a2a_backend: str | None = None  # SGLang --moe-a2a-backend
    num_redundant_experts: int = 0  # vLLM --num-redundant-experts, SGLang --ep-num-redundant-experts
    enable_eplb: bool = False  # vLLM and SGLang --enable-eplb: experts rebalanced while serving
    # SGLang under speculative decoding: its max_running_requests default (48) applies; solve states its own cap in
    # every launch line, so it plans without it
    speculative_running_default: bool = True
    moe_imbalance: float = 1.0  # the busiest EP rank's routed-expert work / the mean (an assumption)
    speculative: Speculative | None = None  # speculative decoding (--speculative-config, SGLang's flags)

    @property
    def batched_tokens(self) -> int:
        """--max-num-batched-tokens once estimate() has filled in the engine's default."""
        if self.max_num_batched_tokens is None:
            raise ValueError("max_num_batched_tokens is resolved by plan.estimate before use")
        return self.max_num_batched_tokens

    def checked(self) -> tuple[int, Format]:
        """(max_model_len, KV format) once every engine-independent value is in range."""
        spec = self.model
        if self.block_size is not None and not 1 <= self.block_size <= MAX_TOKENS:
            raise UsageError(f"--block-size must be between 1 and {MAX_TOKENS:,}, got {self.block_size}")
        self._check_counts()
        if self.usage not in USAGES:
            raise UsageError(f"--usage must be {' or '.join(USAGES)}, got {self.usage!r}")
        if self.runner not in RUNNERS:
            raise UsageError(f"--runner must be {', '.join(RUNNERS)}, got {self.runner!r}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise UsageError("--max-num-batched-tokens must be >= 1")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise UsageError("--max-num-seqs must be >= 1")
        max_len = spec.max_context if self.max_model_len is None else self.max_model_len
        if max_len < 1:
            raise UsageError("--max-model-len must be >= 1 (leave it out for the model's maximum)")
        if max_len < 2:  # a prompt token and a generated one: every request would be refused
            raise UsageError(
                "--max-model-len 1 holds no request (a prompt token and a generated token need 2); give 2 or more"
            )
        if max_len < min_model_len(self.engine):
            # managers/tp_worker.py: max_req_input_len = min(context_len - 1, pool - 1) - 5 must be > 0, or
            # SGLang stops at startup ("Memory pool size is too small")
            raise UsageError(
                f"--max-model-len {max_len}: SGLang does not start with a context of {1 + SGLANG_REQ_RESERVE} "
                f"tokens or fewer (max_req_input_len = context - 1 - {SGLANG_REQ_RESERVE} must be above 0); give "
                f"{2 + SGLANG_REQ_RESERVE} or more"
            )
        if max_len > spec.max_context:
            raise ContextTooLong(
                f"--max-model-len {max_len:,} exceeds {spec.name}'s maximum context of "
                f"{spec.max_context:,} tokens; use --max-model-len {spec.max_context} or less",
                max_model_len=max_len,
                max_context=spec.max_context,
            )
        self._check_workload(max_len)
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise UsageError("--kv-cache-memory must be positive")
        if self.mamba_ssm_dtype is not None and self.mamba_ssm_dtype not in ("fp32", "fp16", "bf16"):
            raise UsageError(
                f"--mamba-ssm-cache-dtype must be float32, float16 or bfloat16, got {self.mamba_ssm_dtype!r}"
            )
        if self.images_per_request is not None and not 0 <= self.images_per_request <= 1024:
            raise UsageError(
                f"--images-per-request must be between 0 and 1024, got {self.images_per_request}"
            )
        if self.reserve_bytes is not None and self.reserve_bytes < 0:
            raise UsageError("--reserve-memory must be >= 0")
        self._check_engine_settings()
        self._check_expert_parallel()
        self._check_applies(spec)
        fmt = kv_format(
            self.kv_cache_dtype,
            spec.checkpoint_kv_cache_dtype or spec.activation_dtype,
            self.kv_quant_group_size,
            self.kv_quant_scale_bits,
            self.kv_quant_zero_point,
        )
        return max_len, fmt

    def _check_counts(self) -> None:
        """Counts that size a search or a loop: bounded so that planning cost never depends on them."""
        for what, value, high in (
            ("--gpus (GPU count)", self.num_gpus, MAX_GPUS),
            ("--gpus (node count)", self.nodes, MAX_NODES),
            ("--tensor-parallel-size", self.tp, MAX_GPUS),
            ("--pipeline-parallel-size", self.pp, MAX_GPUS),
            ("--max-num-seqs", self.max_num_seqs, MAX_USERS),
            ("--max-num-batched-tokens", self.max_num_batched_tokens, MAX_TOKENS),
            ("--num-gpu-blocks-override", self.num_gpu_blocks_override, MAX_TOKENS),
            ("--data-parallel-size", self.data_parallel_size, MAX_GPUS),
            ("--ep-size", self.ep_size, MAX_GPUS),
            ("--num-redundant-experts", self.num_redundant_experts, 65536),
        ):
            if value is not None and value > high:
                raise UsageError(f"{what} must be at most {high:,}, got {value:,}")
        for what, fraction in (
            ("--gpu-memory-utilization", self.gpu_memory_utilization),
            ("--mem-fraction-static", self.mem_fraction_static),
            ("--swa-full-tokens-ratio", self.swa_full_tokens_ratio),
            ("--prefix-hit-rate", self.prefix_hit_rate),
        ):
            if fraction is not None and not math.isfinite(fraction):
                raise UsageError(f"{what}: {fraction} is not a finite number")

    def _check_engine_settings(self) -> None:
        """The engines' own settings that every engine shares (--dtype, --cpu-offload-gb) and the
        ranges of SGLang's; which engine may take which is engines.for_request's check."""
        if model_dtype_name(self.dtype) is None:
            raise UsageError(
                f"--dtype must be auto, bfloat16, float16 (half) or float32 (float), got {self.dtype!r}"
            )
        check_number(
            self.cpu_offload_gb, "--cpu-offload-gb", 0, MAX_GIB, "give the GiB of weights per GPU to offload"
        )
        for what, value, low, high in (
            ("--max-total-tokens", self.max_total_tokens, 1, MAX_TOKENS),
            ("--max-running-requests", self.max_running_requests, 1, MAX_USERS),
        ):
            if value is not None and not low <= value <= high:
                raise UsageError(f"{what} must be between {low} and {high:,}, got {value:,}")
        chunk = self.chunked_prefill_size
        if chunk is not None and chunk != -1 and not 1 <= chunk <= MAX_TOKENS:
            raise UsageError(
                f"--chunked-prefill-size must be -1 (no chunking) or between 1 and {MAX_TOKENS:,}, got {chunk:,}"
            )

    def _check_expert_parallel(self) -> None:
        """Expert parallelism and DP attention: counts in range; each engine checks its own rules."""
        for what, count in (("--data-parallel-size", self.data_parallel_size), ("--ep-size", self.ep_size)):
            if count is not None and count < 1:
                raise UsageError(f"{what} must be >= 1, got {count}")
        if self.num_redundant_experts < 0:
            raise UsageError(f"--num-redundant-experts must be >= 0, got {self.num_redundant_experts}")
        check_number(
            self.moe_imbalance, "--moe-imbalance", 1.0, MAX_MOE_IMBALANCE,
            "the busiest EP rank's expert work over the mean: 1 is perfectly balanced",
        )  # fmt: skip

    def _check_applies(self, spec: ModelSpec) -> None:
        """Flags for a part the model does not have would be ignored: refused, naming what is missing."""
        from kvplan.specs.models import ChunkedAttention, CrossAttention, RecurrentState, SlidingWindow

        kinds = {type(layer) for layer in spec.layer_types.values()}
        windowed = bool(kinds & {SlidingWindow, ChunkedAttention})
        swa_ratio = self.swa_full_tokens_ratio is not None
        # --enable-expert-parallel on a dense model is taken and changes nothing, as vLLM takes it;
        # SGLang's --ep-size and redundant experts are refused by the engines' own checks
        for flag, given, lacks, missing in (
            ("--moe-imbalance", self.moe_imbalance != 1.0, spec.moe is None, "no routed experts"),
            ("--mamba-ssm-cache-dtype", self.mamba_ssm_dtype is not None, RecurrentState not in kinds,
             "no Mamba/linear-attention state layers"),
            ("--images-per-request", self.images_per_request is not None, CrossAttention not in kinds,
             "no cross-attention to images"),
            ("--disable-hybrid-kv-cache-manager", self.disable_hybrid_kv_cache_manager,
             not (windowed or RecurrentState in kinds), "no sliding-window, chunked or state layers to group"),
            ("--swa-full-tokens-ratio", swa_ratio, not windowed, "no sliding-window layers"),
            ("--disable-hybrid-swa-memory", self.disable_hybrid_swa_memory, not windowed, "no sliding-window layers"),
        ):  # fmt: skip
            if given and lacks:
                raise UsageError(f"{flag}: {spec.name} has {missing}; drop the flag")

    def _check_workload(self, max_len: int) -> None:
        check_avg_context(self.avg_context_tokens, max_len)
        for what, n in (("--input-len", self.input_len), ("--output-len", self.output_len)):
            if n is not None and not 0 <= n <= MAX_TOKENS:
                raise UsageError(f"{what} must be between 0 and {MAX_TOKENS:,}, got {n:,}")
        if (self.input_len is None) != (self.output_len is None):
            raise UsageError("give --input-len and --output-len together")
        if self.input_len is not None and self.output_len is not None:
            if self.input_len < 1 or self.output_len < 1:
                raise UsageError(
                    f"--input-len and --output-len must be at least 1 token (an engine takes no empty prompt "
                    f"and generates at least one token), got {self.input_len:,} and {self.output_len:,}"
                )
            if self.input_len + self.output_len > max_len:
                raise UsageError(
                    f"--input-len {self.input_len:,} + --output-len {self.output_len:,} is over --max-model-len "
                    f"({max_len:,}): the engine refuses such a request; raise --max-model-len or shorten them"
                )
        if not 0 <= self.prefix_hit_rate <= 1:
            raise UsageError(f"--prefix-hit-rate must be in [0, 1], got {self.prefix_hit_rate}")
        if self.prefix_hit_rate != 1.0 and not self.shared_prefix_tokens:
            raise UsageError(
                "--prefix-hit-rate is the share of requests that hit --shared-prefix-tokens; give the prefix too"
            )
        if self.shared_prefix_tokens < 0 or self.shared_prefix_tokens > max_len:
            raise UsageError(
                f"--shared-prefix-tokens must be between 0 and --max-model-len ({max_len:,}), "
                f"got {self.shared_prefix_tokens:,}"
            )
        if self.shared_prefix_tokens and not self.enable_prefix_caching:
            raise UsageError("--shared-prefix-tokens needs prefix caching; drop --no-enable-prefix-caching")
