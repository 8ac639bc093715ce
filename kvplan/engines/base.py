"""What every serving engine's accounting answers, and the records it answers with.

kvplan's planner models what physically fits; an engine (vllm.py, sglang.py) adds its own
rounding, grouping, defaults and log lines. A third engine is one more file implementing
`Engine` and one line in `engines/__init__.py`. Every rule names its source in
the engine's own source file at a release (README, How the engines size their KV cache).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from kvplan.errors import UsageError
from kvplan.formats import Format
from kvplan.limits import MAX_VERSION_CHARS
from kvplan.model.parallel import Sharding, plain_sharding
from kvplan.specs.models import GpuSpec, Layer, ModelSpec, RecurrentState

if TYPE_CHECKING:
    from kvplan.engines.budget import Reserve
    from kvplan.request import PlanRequest

Version = tuple[int, int]

# Dtypes the engines' KV caches support; int8/int4/int2 are kvplan what-ifs only.
ENGINE_KV_DTYPES = frozenset({"fp16", "bf16", "fp32", "fp8", "fp8_e4m3", "fp8_e5m2"})


class EngineUnsupported(Exception):
    """The engine cannot serve this configuration; the message says why (kvplan still plans it)."""


def parse_version_text(text: str) -> Version:
    """'0.11', '0.11.2', 'v0.10.1.1' -> (0, 11)."""
    if len(text) > MAX_VERSION_CHARS:
        raise UsageError(f"--engine-version: {text[:20]!r}... is too long; write e.g. 0.11 or 0.11.2")
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)*(?:[.+-]\w+)*", text.strip())
    if not m:
        raise UsageError(f"--engine-version: cannot read {text!r}; write e.g. 0.11 or 0.11.2")
    return int(m.group(1)), int(m.group(2))


def fmt_version(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


@dataclass(frozen=True)
class GroupSummary:
    """One KV-cache group as the engine reports it."""

    kind: str
    num_layers: int
    slots: int
    block_size: int
    page_bytes: int
    blocks_per_request: int


@dataclass(frozen=True)
class VllmDetails:
    num_blocks_per_stage: list[int]
    block_bytes_per_stage: list[int]
    blocks_per_request: int
    held_blocks_per_request: int
    padding_layers: int
    groups: list[GroupSummary]


@dataclass(frozen=True)
class SglangDetails:
    mem_fraction_static: float
    mem_fraction_static_given: bool
    reserved_mib: float | None
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    page_size: int
    hybrid_swa: bool
    swa_full_tokens_ratio: float | None
    swa_kv_cache_tokens: int | None
    k_buffer_bytes: int  # the (full-attention) pool's K buffer; MLA: the whole latent
    v_buffer_bytes: int
    mamba_cache_slots: int | None = None  # recurrent-state pool: sequences it holds
    mamba_state_bytes_per_request: int | None = None  # conv + SSM state of one sequence, all layers
    max_total_tokens: int | None = None  # --max-total-tokens as given
    max_req_len: int | None = None  # tp_worker.py: min(context_len - 1, max_total_num_tokens - 1)
    max_req_input_len: int | None = None  # max_req_len - 5: the longest prompt the scheduler takes


@dataclass(frozen=True)
class EngineReport:
    """The figures an engine computes and prints at startup, from kvplan's budget."""

    engine: str
    version: str
    supported: bool
    reason: str | None = None
    num_blocks: int | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    available_kv_bytes: int | None = None
    log_lines: list[str] = field(default_factory=list)
    details: VllmDetails | SglangDetails | None = None
    differences: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Budget:
    """How one GPU's memory becomes its KV budget under an engine's rules."""

    requested_bytes: int  # what the engine may use before weights (and, for vLLM, the reserve)
    reserve: Reserve
    reserve_after_weights: bool  # vLLM subtracts the reserve after the weights; SGLang before
    gpu_memory_utilization: float | None
    mem_fraction_static: float | None
    usable_label: str  # "H100-SXM x 0.92": what `requested_bytes` is, for messages
    sampler_path: str | None = None  # "PyTorch sort (38.5 B a logit)": how the sampler was profiled
    loading_bytes: int = 0  # what weight loading takes beside the parameters, already out of requested_bytes

    def kv_bytes(self, weight_bytes: int) -> int:
        return self.requested_bytes - weight_bytes - (self.reserve.total if self.reserve_after_weights else 0)


@dataclass(frozen=True)
class StageCache:
    """What the engine needs of one pipeline stage: its layers and its KV budget."""

    layers: list[Layer]
    layer_ids: range
    kv_budget_bytes: int
    engine_budget_bytes: int | None = None  # the whole stage's KV budget when a draft shares it (vLLM)


@dataclass(frozen=True)
class EngineDefaults:
    """The flags a plan took from the engine's defaults because none was given; `--json` lists
    only those taken, in this order."""

    dtype: str | None = None  # the model dtype (--dtype auto)
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: float | None = None  # vLLM
    cuda_graph_max_bs: int | None = None  # SGLang
    chunked_prefill_size: int | None = None  # SGLang
    mem_fraction_static: float | None = None  # SGLang
    mem_fraction_static_source: str | None = None  # SGLang: the rule (and release) it came from
    max_running_requests: int | None = None  # SGLang: 48 under speculative decoding (server_args.py)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class BatchDefaults:
    """What the engine's scheduler takes when --max-num-batched-tokens / --max-num-seqs are not given."""

    max_num_batched_tokens: int
    max_num_seqs: int | None  # None: the engine has no default cap kvplan models
    why: str  # the rule, for the assumptions


class Engine(ABC):
    """An engine's accounting, bound to one request (model, GPU, flags, release)."""

    name: ClassVar[str]
    display_name: ClassVar[str]
    latest: ClassVar[Version]
    first: ClassVar[Version] = (0, 1)  # the engine's first release: anything older never existed
    null_blocks: int  # blocks the engine keeps out of use (vLLM's null block); a class default
    auto_fit_since: ClassVar[Version | None] = None  # first release fitting --max-model-len auto
    own_flags: ClassVar[dict[str, str]]  # flag -> PlanRequest field only this engine reads
    own_flag_defaults: ClassVar[dict[str, object]] = {}
    own_env: ClassVar[tuple[str, ...]] = ()  # environment variables (--env) this engine reads
    launch_command: ClassVar[str]
    launch_flags: ClassVar[tuple[str, str, str, str, str]]  # TP, PP, DP, context, request cap

    def __init__(self, req: PlanRequest, version: Version) -> None:
        self.req = req
        self.version = version

    @classmethod
    def parse_version(cls, text: str | None) -> Version:
        if text is None or text == "latest":
            return cls.latest
        version = parse_version_text(text)
        if version < cls.first:
            raise UsageError(
                f"--engine-version {text}: older than {cls.display_name}'s first release "
                f"({fmt_version(cls.first)}); give the release you run, e.g. {fmt_version(cls.latest)}"
            )
        if version > cls.latest:
            raise UsageError(
                f"--engine-version {text}: newer than the newest {cls.display_name} kvplan knows "
                f"({fmt_version(cls.latest)}); give {fmt_version(cls.latest)} or older"
            )
        return version

    @classmethod
    def batch_defaults(cls, gpu: GpuSpec, usage: str, version: Version) -> BatchDefaults:
        """The engine's default tokens per forward pass and running-sequence cap on this card."""
        return BatchDefaults(8192, None, f"kvplan's default for {cls.display_name}")

    @classmethod
    def auto_dtype(cls, spec: ModelSpec, version: Version, gpu: GpuSpec) -> tuple[str, str | None]:
        """(the model dtype --dtype auto serves, why when it is not the config's own torch_dtype)."""
        return spec.activation_dtype, None

    @classmethod
    def check_model_dtype(cls, dtype: str, gpu: GpuSpec) -> None:
        """Refuse, in one line, a --dtype the engine refuses on this GPU (by default: none)."""
        return None

    @classmethod
    def check_architecture(cls, spec: ModelSpec, version: Version) -> None:
        """Refuse, in one line, a model architecture this release of the engine does not load (by default: none)."""
        return None

    def env(self, name: str) -> str | None:
        """The value the user gave an environment variable with --env, or None."""
        return dict(self.req.env).get(name)

    def env_applied(self, spec: ModelSpec) -> dict[str, str]:
        """The environment variables that shape this plan: {name: value}, given or the release's default."""
        return {}

    def view_notes(self, spec: ModelSpec) -> list[str]:
        """Assumptions about how the engine stores this model's layers, one line each."""
        return []

    def request_cap(self, attn_dp: int = 1) -> int | None:
        """The cap on running requests a flag sets, per attention rank (None: only the KV cache caps them)."""
        return self.req.max_num_seqs

    def running_cap(self, pool_tokens: int, max_len: int, attn_dp: int = 1) -> tuple[int, str, bool]:
        """The most requests one scheduler (an attention rank's) runs at once, a flag's cap or the engine's default:
        (cap, what sets it, whether a larger flag raises it)."""
        raise NotImplementedError(f"{self.display_name} states no running cap")

    def auto_fit_line(self, full: int, fitted: int, available_bytes: int) -> str:
        """The line the engine logs once it has fitted --max-model-len auto (auto_fit_since)."""
        raise NotImplementedError(f"{self.display_name} has no --max-model-len auto")

    def oversized_request(self, max_len: int, fitting_len: int | None) -> tuple[int, str] | None:
        """When one request at --max-model-len does not fit the pool (`fitting_len`: the longest that
        does): (the length the engine caps requests to, a warning) if it starts anyway; None if it
        refuses to start."""
        return None

    def kv_budget_cap(self, kv_bytes: int, layers: list[Layer], fmt: Format, tp: int) -> int:
        """A stage's KV budget once a flag capping the pool (SGLang --max-total-tokens) applies."""
        return kv_bytes

    def defaults_applied(self) -> dict[str, Any]:
        """The engine's own defaults this plan took where no flag was given (after budget())."""
        return {}

    @property
    def label(self) -> str:
        return f"{self.display_name} {self.version_text}"

    @property
    def version_text(self) -> str:
        """The release as planned: major.minor, kvplan's rules being per minor release (an engine whose rules
        change within one names the patch)."""
        return fmt_version(self.version)

    @abstractmethod
    def check_flags(self) -> None:
        """Check the values of this engine's own flags (engines.for_request refuses other engines')."""

    @abstractmethod
    def block_size(self, spec: ModelSpec, gpu: GpuSpec) -> tuple[int, str | None]:
        """(block or page size, an assumption to state or None)."""

    @abstractmethod
    def state_dtypes(self, spec: ModelSpec, layer: RecurrentState) -> tuple[str, str, str | None]:
        """(conv dtype, SSM dtype, why, when it is the engine's default rather than stated) of a
        recurrent state whose config leaves them "auto"."""

    def hybrid_block_size(
        self, spec: ModelSpec, fmt: Format, tp: int, block_size: int
    ) -> tuple[int, str | None]:
        """The block size once the engine fits a recurrent state into a page, and why it changed."""
        return block_size, None

    @abstractmethod
    def windows_kept(self, spec: ModelSpec) -> str | None:
        """Why this engine keeps every token of windowed layers (None: it drops them)."""

    def loaded_expert_factor(
        self, spec: ModelSpec, gpu: GpuSpec, tp: int, expert_format: str
    ) -> tuple[float, str | None]:
        """How much larger the routed experts are in GPU memory than in the checkpoint (kernel
        padding or repacking), and why; (1.0, None) when they load as stored."""
        return 1.0, None

    def sharding(self, spec: ModelSpec, tp: int) -> Sharding:
        """How one replica's GPUs hold the experts, the attention and the KV under this engine's expert-
        parallel and DP-attention flags (plain TP without them)."""
        return plain_sharding(spec, tp)

    def load_buffer_bytes(self, spec: ModelSpec) -> tuple[int, str | None]:
        """Buffers the engine allocates with the model on each GPU beside its parameters, counted with the
        weights as the engine's load measures them, and why; (0, None) when kvplan counts none."""
        return 0, None

    @abstractmethod
    def budget(self, spec: ModelSpec, gpu: GpuSpec, tp: int, pp: int) -> Budget:
        """The memory the engine gives weights + KV on one GPU, and its reserve."""

    @abstractmethod
    def budget_notes(self, budget: Budget, gpu: GpuSpec, tp: int, pp: int) -> list[str]:
        """The assumptions behind a computed budget, one line each."""

    @abstractmethod
    def budget_formula(self, budget: Budget, gpu: GpuSpec) -> tuple[str, str]:
        """(formula, source) of the KV budget, for --explain."""

    @abstractmethod
    def prepare(
        self,
        layers: list[Layer],
        fmt: Format,
        block_size: int,
        tp: int,
        max_len: int,
        draft_layers: tuple[Layer, ...] = (),
    ) -> None:
        """Work out the engine's own grouping of the model's layers, and a speculative draft's layers
        where they share its blocks (raises EngineUnsupported)."""

    def state_blocks(self, layers: list[Layer] | tuple[Layer, ...]) -> tuple[int, str | None]:
        """Copies of each recurrent state a request holds, and the rule (None: one, nothing to say)."""
        return 1, None

    def state_conv_rows(self, layer: RecurrentState) -> int:
        """Rows the engine adds to a recurrent layer's convolution state (speculative decoding)."""
        return 0

    def block_bytes(self, layer_ids: range, layers: list[Layer], fmt: Format, tp: int) -> int | None:
        """Bytes of one engine block on a GPU holding `layer_ids` (None: no block accounting)."""
        return None

    def drops_lm_head(self, spec: ModelSpec) -> str | None:
        """Why the engine loads no LM head for this model (an embedding model), or None."""
        return None

    # set by request_charge: the draft's layers form a KV-cache group of their own, which no target layer's
    # charge carries (its share is then split off the budget, as without charges)
    draft_apart: bool = False

    def request_charge(self, layer_ids: range, fmt: Format, tp: int) -> list[float] | None:
        """Each of a stage's layers' bytes as the engine charges a request, a multiple of the layer's own
        (None: as kvplan counts them)."""
        return None

    @abstractmethod
    def report(
        self, stages: list[StageCache], fmt: Format, block_size: int, tp: int, max_len: int
    ) -> EngineReport:
        """The engine's own figures and log lines (raises EngineUnsupported)."""

    @abstractmethod
    def differences(self, report: EngineReport, kvplan_concurrency: int) -> list[str]:
        """Why the engine's concurrency differs from kvplan's, when it does."""

    # --- reading a startup log (check-log) ---------------------------------------------------

    @classmethod
    def log_settings(cls, facts: dict[str, Any]) -> dict[str, Any]:
        """PlanRequest fields of this engine's own settings that a parsed log states."""
        return {}

    @classmethod
    def arithmetic_budget(cls, facts: dict[str, Any], pred: Any) -> tuple[dict[str, Any], int] | None:
        """(PlanRequest fields that hand the log's own KV figure to kvplan, blocks the log's
        rounding can hide), or None when the log gives no KV figure."""
        if facts.get("available_kv_bytes") is not None:
            return {"kv_cache_memory_bytes": facts["available_kv_bytes"]}, 0
        return None

    @classmethod
    def logged_kv_bytes(cls, facts: dict[str, Any], pred: Any) -> int | None:
        """The KV memory per GPU the log states (or implies)."""
        value = facts.get("available_kv_bytes")
        return int(value) if value is not None else None

    @classmethod
    def logged_kv_derived(cls, facts: dict[str, Any], pred: Any) -> bool:
        """True where logged_kv_bytes is the log's token count through kvplan's bytes per token (the log
        prints no KV memory of its own)."""
        return False

    @classmethod
    @abstractmethod
    def measured_reserve(
        cls, facts: dict[str, Any], pred: Any, logged_kv: int
    ) -> tuple[int, str, str | None]:
        """(non-KV memory the log implies, its label, a note or None), per GPU."""

    def unsupported(self, reason: str) -> EngineReport:
        return EngineReport(
            engine=self.name, version=fmt_version(self.version), supported=False, reason=reason
        )
