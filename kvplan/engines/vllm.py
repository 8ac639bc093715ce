"""vLLM's KV accounting: budget, block size, hybrid KV-cache groups, and the lines it logs.

Sources (README, How the engines size their KV cache): vLLM at v0.11.0, vllm/v1/core/kv_cache_utils.py,
vllm/v1/worker/gpu_worker.py and vllm/v1/kv_cache_interface.py.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvplan.engines import vllm_memory as vm
from kvplan.engines.base import (
    BatchDefaults,
    Budget,
    Engine,
    EngineReport,
    EngineUnsupported,
    GroupSummary,
    StageCache,
    Version,
    VllmDetails,
    fmt_version,
    parse_version_text,
)
from kvplan.engines.budget import CUDA_GRAPH_BYTES, estimate_reserve, given_reserve, requested_bytes
from kvplan.errors import UsageError
from kvplan.formats import Format
from kvplan.model import kv
from kvplan.model.parallel import Sharding, plain_sharding, with_eplb_rule
from kvplan.specs.models import (
    ChunkedAttention,
    CompressedAttention,
    CompressedLatent,
    CrossAttention,
    FullAttention,
    GpuSpec,
    LatentAttention,
    Layer,
    ModelSpec,
    NoCache,
    RecurrentState,
    SharedKV,
    SlidingWindow,
)
from kvplan.units import GiB, ceil_div, fmt_gib, plural

if TYPE_CHECKING:
    from kvplan.request import PlanRequest

# vllm/config/cache.py: BlockSize = Literal[1, 8, 16, 32, 64, 128, 256]
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
DEFAULT_BLOCK_SIZE = 16  # README, How the engines size their KV cache: block_size default 16


def default_utilization(version: Version) -> float:
    # README, How the engines size their KV cache: default 0.9 up to 0.18, 0.92 from 0.20 on
    return 0.92 if version >= (0, 20) else 0.9


# vllm/engine/arg_utils.py, EngineArgs._set_default_args (0.10-0.11; EngineArgs.get_batch_defaults
# from ~0.12): when the user gives no --max-num-batched-tokens / --max-num-seqs, the defaults depend on
# the usage context (UsageContext.OPENAI_API_SERVER for `vllm serve`, LLM_CLASS for the offline LLM
# class) and the card: "device_memory >= 70 * GiB_bytes and 'a100' not in device_name" takes the large
# values (A100 excluded: PR #17885 measured lower throughput there); max_num_seqs is then
# min(default, max_num_batched_tokens). Before 0.9 the large values went to H100/H200 by name only.
# (usage, large card) -> (max_num_batched_tokens, max_num_seqs)
BATCH_DEFAULTS: dict[tuple[str, bool], tuple[int, int]] = {
    ("offline", True): (16384, 1024),
    ("serve", True): (8192, 1024),
    ("offline", False): (8192, 256),
    ("serve", False): (2048, 256),
}
LARGE_CARD_BYTES = 70 * GiB


def large_card(gpu: GpuSpec, version: Version) -> bool:
    """vLLM's "H100-class" test for its larger batch defaults (arg_utils.py, see BATCH_DEFAULTS)."""
    name = f"{gpu.name} {gpu.display_name}".lower()
    if version < (0, 9):  # _set_default_args_v1, 0.8
        return "h100" in name or "h200" in name
    return gpu.memory_bytes >= LARGE_CARD_BYTES and "a100" not in name


def vllm_batch_defaults(gpu: GpuSpec, usage: str, version: Version) -> BatchDefaults:
    if version < (0, 8):
        # V0 (vllm/config.py SchedulerConfig): max_num_seqs 256; without chunked prefill the batch is
        # max(max_model_len, 2048) tokens, which kvplan keeps at its former 8192
        return BatchDefaults(
            8192,
            256,
            "vLLM V0's defaults (vllm/config.py SchedulerConfig, before 0.8), batched tokens taken as 8192",
        )
    large = large_card(gpu, version)
    tokens, seqs = BATCH_DEFAULTS[(usage, large)]
    command = "`vllm serve`" if usage == "serve" else "the offline LLM class"
    card = (
        "a card of >= 70 GiB other than A100"
        if large and version >= (0, 9)
        else "an H100/H200"
        if large
        else "an A100 or a card under 70 GiB"
        if version >= (0, 9)
        else "a card other than H100/H200"
    )
    return BatchDefaults(
        tokens,
        min(seqs, tokens),
        f"vLLM's defaults for {command} on {card} (vllm/engine/arg_utils.py)",
    )


# vllm/envs.py: whether Llama-4's chunked-local attention layers go through the hybrid KV cache
# manager (vllm/config/vllm.py disables the manager otherwise, with a latency-regression warning).
# The gate and its default "0" came with PR #21761 (merged 2025-07-28, first in 0.10.1; docs.vllm.ai
# v0.12.0 vllm.envs: False); PR #29627 (merged 2025-12-16, after the 0.13 branch) made it "1"
# (docs.vllm.ai v0.16.0 vllm.envs: True). Before the gate the manager took chunked layers as they came.
CHUNKED_HYBRID_ENV = "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE"
CHUNKED_HYBRID_OFF = ((0, 10), (0, 13))  # releases whose default is "0"


def before_0_10_1(version: Version, text: str | None) -> Version:
    """The version the rules that changed at 0.10.1 (this gate; float32 checkpoints served in bfloat16) read:
    vLLM 0.10.0, named to the patch, is before them; kvplan's other rules are per minor release."""
    m = re.fullmatch(r"v?0\.10\.0(?:[.+-]\w+)*", (text or "").strip())
    return (0, 9) if version == (0, 10) and m else version


def chunked_hybrid_default(version: Version) -> bool:
    low, high = CHUNKED_HYBRID_OFF
    return not low <= version <= high


def chunked_hybrid_why(version: Version) -> str:
    if version < CHUNKED_HYBRID_OFF[0]:
        return "no such gate before 0.10.1"
    if version <= CHUNKED_HYBRID_OFF[1]:
        return "its default from 0.10.1 to 0.13, vLLM PR #21761"
    return "its default since 0.14, vLLM PR #29627"


def env_flag(name: str, text: str) -> bool:
    """vllm/envs.py reads these flags as bool(int(value))."""
    try:
        return bool(int(text))
    except ValueError:
        raise UsageError(f"--env {name}={text}: vLLM reads it as an integer; give 0 or 1") from None


def tokens_from_concurrency(version: Version) -> bool:
    # README, How the engines size their KV cache: 0.21 to 0.27 printed int(C * L) as the KV cache size in
    # tokens (a real 0.27.1 log of a hybrid model: 292,522 = int(857 / 12 x 4,096), not 857 // 4 x 784)
    return (0, 21) <= version <= (0, 27)


def default_block_size(spec: ModelSpec, gpu: GpuSpec) -> tuple[int, str]:
    """(block size, why). README, How the engines size their KV cache: 16; MLA backends: FlashMLA 64, CUTLASS MLA 128."""
    if any(isinstance(layer, LatentAttention) and layer.index_head_dim for layer in spec.layers):
        # vllm/v1/attention/backends/mla/flashmla_sparse.py: kernel block size 64 only
        return 64, "FlashMLA sparse (the DSA backend) supports block size 64 only"
    if any(isinstance(layer, LatentAttention) for layer in spec.layers):
        if gpu.arch == "hopper":
            return 64, "FlashMLA (the MLA backend on Hopper) needs block size 64"
        if gpu.arch == "blackwell":
            return 128, "CUTLASS MLA (the MLA backend on Blackwell) needs block size 128"
    return DEFAULT_BLOCK_SIZE, "vLLM's default block size"


@dataclass(frozen=True)
class KvGroup:
    """One KV-cache group of vLLM's hybrid allocator: layers of one attention type sharing block tables."""

    kind: str
    layer_ids: tuple[int, ...]  # decoder layers in the group (whole model)
    slots: int  # layers per group, padding included
    block_size: int
    page_bytes: int  # one block of one layer on one GPU
    blocks_per_request: int  # what vLLM charges a request at max_model_len
    held_blocks_per_request: int  # what a request of max_model_len tokens actually holds


@dataclass(frozen=True)
class VllmLayout:
    groups: tuple[KvGroup, ...]
    uniform: bool  # one group holding every layer (page sizes may still differ per layer)

    @property
    def padding_layers(self) -> int:
        return sum(g.slots - len(g.layer_ids) for g in self.groups) if not self.uniform else 0

    @property
    def blocks_per_request(self) -> int:
        return sum(g.blocks_per_request for g in self.groups)

    @property
    def held_blocks_per_request(self) -> int:
        return sum(g.held_blocks_per_request for g in self.groups)

    def block_bytes(self, layer_ids: set[int], layers: list[Layer], fmt: Format, tp: int) -> int:
        """Bytes of one engine block on a GPU holding the layers `layer_ids` (a PP stage)."""
        if self.uniform:
            g = self.groups[0]
            held = [layers[i] for i in g.layer_ids if i in layer_ids]
            return sum(n * kv.page_bytes(la, fmt, g.block_size, tp) for la, n in kv.grouped(held))
        # one tensor per slot, shared by the i-th layer of every group (README, How the engines size their KV cache: groups get
        # equal page sizes); a stage needs as many slots as its fullest group
        slots = max(sum(1 for i in g.layer_ids if i in layer_ids) for g in self.groups)
        return self.groups[0].page_bytes * slots


def _spec_key(layer: Layer, hybrid: bool) -> tuple[str, int]:
    if isinstance(layer, RecurrentState):
        return "state", 0
    if isinstance(layer, SlidingWindow) and hybrid:
        return "sliding", layer.window
    if isinstance(layer, ChunkedAttention) and hybrid:
        return "chunked", layer.chunk
    return "full", 0


def _charge(
    kind: str,
    size: int,
    max_model_len: int,
    block_size: int,
    max_num_batched_tokens: int,
    state_blocks: int = 1,
) -> int:
    if kind == "sliding":
        # README, How the engines size their KV cache: ceil(min(window - 1 + max_num_batched_tokens, max_model_len) / block_size) + 1
        return ceil_div(min(size - 1 + max_num_batched_tokens, max_model_len), block_size) + 1
    if kind == "state":
        # kv_cache_interface.py MambaSpec.max_memory_usage_bytes: (1 + num_speculative_blocks) pages a request
        # with mamba_cache_mode "none", (2 + num_speculative_blocks) with "align" (Vllm.state_blocks)
        return state_blocks
    if kind == "chunked":
        # vLLM ChunkedLocalAttentionSpec: ceil(min(chunk + max_num_batched_tokens, max_model_len) / block_size)
        return ceil_div(min(size + max_num_batched_tokens, max_model_len), block_size)
    return ceil_div(max_model_len, block_size)


def _cached_layers(layers: list[Layer] | tuple[Layer, ...]) -> list[int]:
    """Indices of the layers with a KV cache of their own; refuses kinds vLLM's rules here miss."""
    cached: list[int] = []
    for i, layer in enumerate(layers):
        if isinstance(layer, (SharedKV, NoCache)):
            continue  # no cache of its own (cross-layer sharing reads another layer's)
        if isinstance(layer, CrossAttention):
            raise EngineUnsupported(
                "cross-attention layers (image K/V, vLLM's encoder cache) are not modelled for vLLM's "
                "block accounting; kvplan's own figure stands"
            )
        if isinstance(layer, CompressedAttention):
            raise EngineUnsupported("compressed-KV layers have no vLLM block accounting")
        if isinstance(layer, CompressedLatent):
            raise EngineUnsupported(V4_UNSUPPORTED)
        cached.append(i)
    if kv.mixed_indexers(layers):
        raise EngineUnsupported(SHARED_INDEXER_UNSUPPORTED)
    return cached


def _state_page(
    layers: list[Layer] | tuple[Layer, ...], cached: list[int], pages: dict[int, int], tp: int
) -> int:
    """Set every state layer's page (in `pages`) to the attention page it is padded to; the state page."""
    states = [i for i in cached if isinstance(layers[i], RecurrentState)]
    if not states:
        return 0
    state_page = max(kv.layer_state_bytes(layers[i], tp) for i in states)
    attention = [pages[i] for i in cached if i not in states]
    # models/config.py HybridAttentionMambaModelConfig: the mamba page is padded to the attention
    # page (attention-free models keep the state page as it is)
    padded = max(attention) if attention else state_page
    if padded < state_page:
        raise EngineUnsupported("a state layer's page exceeds the attention page; raise --block-size")
    for i in states:
        pages[i] = padded
    return state_page


MLA_FROM = (0, 7)  # MLA's latent cache in vLLM: v0.7.1 (kvplan's versions are major.minor)
HYBRID_ALIGN_FROM_BLOCK = (0, 19)  # platforms/interface.py _align_hybrid_block_size (PR #37467)


def old_hybrid_alignment(layers: list[Layer] | tuple[Layer, ...], gpu: GpuSpec) -> int:
    """The kernel block alignment vLLM 0.10-0.18 assumed (models/config.py HybridAttentionMambaModelConfig
    at v0.11.0): MLA 64 (128 under CUTLASS MLA, Blackwell's default MLA backend), else 16, 32 on Blackwell
    for head size 256 (FlashInfer, flashinfer issue #1993)."""
    if any(isinstance(la, LatentAttention) for la in layers):
        return 128 if gpu.arch == "blackwell" else 64
    heads = {la.head_dim for la in layers if isinstance(la, FullAttention)}
    return 32 if gpu.arch == "blackwell" and 256 in heads else 16


def state_block_size(
    layers: list[Layer] | tuple[Layer, ...], fmt: Format, block_size: int, tp: int, align: int | None = None
) -> tuple[int, int, int]:
    """(attention block size, state page, attention page) for a model with recurrent-state layers:
    block = A x cdiv(mamba_page, A x attention bytes per token), kept at the configured block size when that
    is larger. A is the kernel's block alignment: from vLLM 0.19 (platforms/interface.py
    _align_hybrid_block_size, PR #37467) max(the backend's smallest kernel block, the configured block size),
    `align` None; before it (models/config.py HybridAttentionMambaModelConfig, 0.10-0.18) a fixed
    alignment whatever the configured block size, `align` (old_hybrid_alignment)."""
    states = [la for la in layers if isinstance(la, RecurrentState)]
    per_token = [kv.page_bytes(la, fmt, 1, tp) for la in layers if kv.layer_bits_per_token(la, fmt, tp)]
    if not states or not per_token:
        return block_size, 0, 0
    state_page = max(kv.layer_state_bytes(la, tp) for la in states)
    attn_1tok = max(per_token)
    a = align or block_size
    raised = a * ceil_div(state_page, a * attn_1tok)
    return max(raised, block_size), state_page, attn_1tok


# DeepSeek-V4 in vLLM: SWA pages of 64 tokens and C4/C128 pages of 256 tokens share one tensor,
# fp8 entries padded to 576-B alignment (vllm/v1/attention/backends/mla/sparse_swa.py)
V4_UNSUPPORTED = (
    "DeepSeek-V4's window + compressed caches share 576-B-aligned pages across KV-cache groups "
    "(vllm/v1/attention/backends/mla/sparse_swa.py); that layout is not modelled, kvplan's own figure stands"
)
SHARED_INDEXER_UNSUPPORTED = (
    "layers that share another layer's DSA indexer (GLM-5.2 indexer_types 'shared'): the engine's "
    "indexer allocation for them is not established; kvplan's own figure stands"
)


def vllm_layout(
    layers: list[Layer] | tuple[Layer, ...],
    fmt: Format,
    block_size: int,
    tp: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    hybrid: bool = True,
    state_blocks: int = 1,
) -> VllmLayout:
    """Group the model's layers the way vLLM's KV-cache manager does (README, How the engines size their KV
    cache); `state_blocks`: the pages a request holds in each recurrent-state group."""
    cached = _cached_layers(layers)

    def held(layer: Layer, bs: int) -> int:
        if isinstance(layer, RecurrentState):
            return state_blocks
        if not hybrid and isinstance(layer, (SlidingWindow, ChunkedAttention)):
            return ceil_div(max_model_len, bs)  # treated as full attention
        return kv.layer_blocks(layer, max_model_len, bs)

    def group(kind: str, size: int, ids: tuple[int, ...], slots: int, bs: int, page: int) -> KvGroup:
        label = kind if kind in ("full", "state") else f"{kind}({size})"
        charge = _charge(kind, size, max_model_len, bs, max_num_batched_tokens, state_blocks)
        return KvGroup(label, ids, slots, bs, page, charge, held(layers[ids[0]], bs))

    keys = {i: _spec_key(layers[i], hybrid) for i in cached}
    page_of = {
        id(la): kv.page_bytes(la, fmt, block_size, tp) for la, _ in kv.grouped(layers[i] for i in cached)
    }
    pages = {i: page_of[id(layers[i])] for i in cached}
    _state_page(layers, cached, pages, tp)
    kinds = set(keys.values())
    if len(kinds) == 1:  # uniform type (page sizes may differ: one group, per-layer tensors)
        kind, size = next(iter(kinds))
        only = group(kind, size, tuple(cached), len(cached), block_size, pages[cached[0]])
        return VllmLayout((only,), uniform=True)

    # hybrid: unify page sizes by growing the block size of layers with smaller pages
    max_page = max(pages.values())
    by_type: dict[tuple[str, int, int], list[int]] = {}
    for i in cached:
        if keys[i][0] == "state":  # a state page holds one sequence, whatever its length
            by_type.setdefault((*keys[i], max_model_len), []).append(i)
            continue
        if max_page % pages[i]:
            raise EngineUnsupported(
                "layers' page sizes do not divide each other; vLLM cannot unify them by block size"
            )
        by_type.setdefault((*keys[i], block_size * (max_page // pages[i])), []).append(i)
    counts = [len(v) for v in by_type.values()]
    # vLLM kv_cache_utils: use the largest count when it is < 1.5x the smallest (less padding)
    group_size = max(counts) if max(counts) < min(counts) * 1.5 else min(counts)
    groups: list[KvGroup] = []
    for (kind, size, bs), ids in by_type.items():
        n_groups = ceil_div(len(ids), group_size)
        # layers[j::n] so that PP stages fill groups evenly
        groups += [
            group(kind, size, tuple(ids[j::n_groups]), group_size, bs, max_page) for j in range(n_groups)
        ]
    return VllmLayout(tuple(groups), uniform=False)


def padding_warnings(layout: VllmLayout) -> list[str]:
    """vLLM warns once per attention type whose groups need padding layers."""
    if layout.uniform:
        return []
    by_kind: dict[str, list[KvGroup]] = {}
    for g in layout.groups:
        by_kind.setdefault(g.kind, []).append(g)
    lines = []
    for kind_groups in by_kind.values():
        n = sum(len(g.layer_ids) for g in kind_groups)
        pad = sum(g.slots for g in kind_groups) - n
        if pad:
            lines.append(f"Add {pad} padding layers, may waste at most {pad / n * 100:.2f}% KV cache memory")
    return lines


def vllm_report(
    layout: VllmLayout,
    stage_budgets: list[int],
    stage_block_bytes: list[int],
    max_model_len: int,
    version: Version,
    num_gpu_blocks_override: int | None = None,
) -> EngineReport:
    """vLLM's num_blocks, KV cache size and maximum concurrency (README, How the engines size their KV cache)."""
    per_stage = [b // bb if bb else 0 for b, bb in zip(stage_budgets, stage_block_bytes, strict=True)]
    # README, How the engines size their KV cache: every worker computes its own figure; the engine takes the minimum
    num_blocks = min(per_stage) if num_gpu_blocks_override is None else num_gpu_blocks_override
    groups = layout.groups
    per_req = layout.blocks_per_request
    conc = num_blocks / per_req
    if tokens_from_concurrency(version):
        tokens = int(conc * max_model_len)
    else:
        # vLLM _report_kv_cache_config: num_blocks // number of groups * smallest block size
        tokens = num_blocks // len(groups) * min(g.block_size for g in groups)
    available = min(stage_budgets)
    lines = padding_warnings(layout)
    lines.append(f"Available KV cache memory: {available / GiB:.2f} GiB")
    size = f"GPU KV cache size: {tokens:,} tokens"
    concurrency = f"Maximum concurrency for {max_model_len:,} tokens per request: {conc:.2f}x"
    lines += [f"{size}, {concurrency}"] if version >= (0, 33) else [size, concurrency]
    details = VllmDetails(
        num_blocks_per_stage=per_stage,
        block_bytes_per_stage=stage_block_bytes,
        blocks_per_request=per_req,
        held_blocks_per_request=layout.held_blocks_per_request,
        padding_layers=layout.padding_layers,
        groups=[
            GroupSummary(g.kind, len(g.layer_ids), g.slots, g.block_size, g.page_bytes, g.blocks_per_request)
            for g in groups
        ],
    )
    return EngineReport(
        engine="vllm",
        version=fmt_version(version),
        supported=True,
        num_blocks=num_blocks,
        kv_cache_tokens=tokens,
        max_concurrency=conc,
        available_kv_bytes=available,
        log_lines=lines,
        details=details,
    )


# architectures vLLM stopped loading, each with the last release that loaded it ("Model architecture X was
# supported in vLLM until vN"): vllm/model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS at
# commit bf8e762 (main, 2026); the encoder-decoder ones left with V0 (PR #24907)
REMOVED_ARCHITECTURES: dict[str, str] = {
    **dict.fromkeys(("Phi3SmallForCausalLM",), "0.9.2"),
    **dict.fromkeys(
        (
            "MotifForCausalLM",
            "Phi4FlashForCausalLM",
            "DonutForConditionalGeneration",
            "MllamaForConditionalGeneration",
            "BartModel",
            "BartForConditionalGeneration",
            "Florence2ForConditionalGeneration",
            "MBartForConditionalGeneration",
        ),
        "0.10.2",
    ),  # fmt: skip
    "Phi4MultimodalForCausalLM": "0.12.0",
    "JAISLMHeadModel": "0.22.0",
    **dict.fromkeys(
        (
            "ErnieModel",
            "ErnieForSequenceClassification",
            "ErnieForTokenClassification",
            "InternLM2VEForCausalLM",
            "QWenLMHeadModel",
            "QwenVLForConditionalGeneration",
            "InternLMForCausalLM",
            "XverseForCausalLM",
            "Dots1ForCausalLM",
            "BambaForCausalLM",
            "MiniMaxForCausalLM",
            "MiniMaxText01ForCausalLM",
            "MiniMaxM1ForCausalLM",
            "MiniMaxVL01ForConditionalGeneration",
            "BaiChuanForCausalLM",
            "BaichuanForCausalLM",
            "Tarsier2ForConditionalGeneration",
        ),
        "0.23.0",
    ),  # fmt: skip
    **dict.fromkeys(
        (
            "AquilaModel",
            "AquilaForCausalLM",
            "Grok1ModelForCausalLM",
            "Grok1ForCausalLM",
            "TarsierForConditionalGeneration",
            "MantisForConditionalGeneration",
            "MusicFlamingoForConditionalGeneration",
            "AyaVisionForConditionalGeneration",
        ),
        "0.24.0",
    ),  # fmt: skip
    **dict.fromkeys(("TeleChatForCausalLM", "PersimmonForCausalLM", "FuyuForCausalLM"), "0.25.0"),
    **dict.fromkeys(("Plamo2ForCausalLM", "OuroForCausalLM"), "0.26.0"),
}

# vLLM 0.8 made the V1 engine the default (VLLM_USE_V1=1, vllm/envs.py at v0.8.0); before it the V0 engine
# sized the cache in vllm/worker/worker.py and logged from vllm/executor/executor_base.py
V1_DEFAULT: Version = (0, 8)
V0_SWAP_BYTES = 4 * GiB  # EngineArgs.swap_space default, 4 GiB a GPU (vllm/engine/arg_utils.py, V0)
V0_UNSUPPORTED = (
    "vLLM before 0.8 ran the V0 engine, which kvplan does not model for {what}; give --engine-version 0.8 "
    "or newer for V1's figures"
)


def v0_report(
    layout: VllmLayout,
    stage_budgets: list[int],
    stage_block_bytes: list[int],
    max_model_len: int,
    version: Version,
    draft: bool,
) -> EngineReport:
    """V0's figures: blocks = KV memory // bytes of one block over every layer (worker.py
    determine_num_available_blocks); CPU blocks from the 4 GiB swap space; concurrency = blocks x
    block size / max_model_len (executor_base.py initialize_cache)."""
    if not layout.uniform or layout.groups[0].kind == "state":
        raise EngineUnsupported(V0_UNSUPPORTED.format(what="hybrid or recurrent-state layers"))
    if draft:
        raise EngineUnsupported(V0_UNSUPPORTED.format(what="a speculative draft"))
    gpu_blocks = min(b // bb if bb else 0 for b, bb in zip(stage_budgets, stage_block_bytes, strict=True))
    cpu_blocks = min(V0_SWAP_BYTES // bb for bb in stage_block_bytes if bb)
    bs = layout.groups[0].block_size
    conc = gpu_blocks * bs / max_model_len
    lines = [
        f"# GPU blocks: {gpu_blocks}, # CPU blocks: {cpu_blocks}",
        f"Maximum concurrency for {max_model_len} tokens per request: {conc:.2f}x",
    ]
    return EngineReport(
        engine="vllm",
        version=fmt_version(version),
        supported=True,
        num_blocks=gpu_blocks,
        kv_cache_tokens=gpu_blocks * bs,
        max_concurrency=conc,
        available_kv_bytes=min(stage_budgets),
        log_lines=lines,
    )


class Vllm(Engine):
    name = "vllm"
    display_name = "vLLM"
    latest = (0, 33)
    null_blocks = 1  # README, How the engines size their KV cache: one block is kept as the null block

    def __init__(self, req: PlanRequest, version: Version) -> None:
        super().__init__(req, version)
        if version < V1_DEFAULT:
            self.null_blocks = 0  # V0's block allocator keeps no null block (vllm/core/block_manager.py)

    # --max-model-len auto (or -1) fits the length after profiling (vllm/v1/core/kv_cache_utils.py
    # _auto_fit_max_model_len: vLLM PR #29431, listed in v0.14.0's release notes)
    auto_fit_since = (0, 14)
    own_flags = {
        "--gpu-memory-utilization": "gpu_memory_utilization",
        "--num-gpu-blocks-override": "num_gpu_blocks_override",
        "--disable-hybrid-kv-cache-manager": "disable_hybrid_kv_cache_manager",
        "--enable-expert-parallel": "enable_expert_parallel",
        "--enforce-eager": "enforce_eager",  # SGLang's counterpart is --disable-cuda-graph, not modelled
        "--usage": "usage",
        "--runner": "runner",
    }
    own_flag_defaults = {"usage": "serve", "runner": "auto"}
    own_env = (
        CHUNKED_HYBRID_ENV,
        vm.FLASHINFER_SAMPLER_ENV,
        vm.RUNNER_V2_ENV,
        vm.CUDA_GRAPH_ENV,
        vm.ROCM_MOE_PADDING_ENV,
        vm.ROCM_AITER_ENV,
        vm.ROCM_AITER_MOE_ENV,
    )
    launch_command = "vllm serve {model}"
    launch_flags = (
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--data-parallel-size",
        "--max-model-len",
        "--max-num-seqs",
    )

    layout: VllmLayout | None = None
    layers: list[Layer] | None = None  # the model's layers as the layout was made from them
    target_layers = 0  # the model's own layers in `layers`; a speculative draft's follow them
    state_lines: tuple[str, ...] = ()  # what vLLM logs when it raises the block size for a state

    def auto_fit_line(self, full: int, fitted: int, available_bytes: int) -> str:
        # kv_cache_utils.py _auto_fit_max_model_len's two info lines (format_gib: 2 decimals)
        if fitted < full:
            return (
                f"Auto-fit max_model_len: reduced from {full} to {fitted} to fit in available GPU memory "
                f"({available_bytes / GiB:.2f} GiB available for KV cache)"
            )
        return f"Auto-fit max_model_len: full model context length {full} fits in available GPU memory"

    def check_flags(self) -> None:
        req = self.req
        if req.block_size is not None and req.block_size not in BLOCK_SIZES:
            raise UsageError(
                f"--block-size {req.block_size}: vLLM takes {', '.join(map(str, BLOCK_SIZES))} "
                "(vllm/config/cache.py BlockSize)"
            )
        util = req.gpu_memory_utilization
        if util is not None and not 0 < util <= 1:
            raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
        if req.num_gpu_blocks_override is not None and req.num_gpu_blocks_override < 2:
            raise UsageError("--num-gpu-blocks-override must be >= 2 (one block is the null block)")
        if req.num_gpu_blocks_override is not None and req.kv_cache_memory_bytes is not None:
            raise UsageError("give --kv-cache-memory or --num-gpu-blocks-override, not both")
        given = self.env(CHUNKED_HYBRID_ENV)
        if given is not None:
            env_flag(CHUNKED_HYBRID_ENV, given)

    @classmethod
    def auto_dtype(cls, spec: ModelSpec, version: Version, gpu: GpuSpec) -> tuple[str, str | None]:
        # vllm/config/model.py _resolve_auto_dtype: a float32 config is served in the platform's first
        # supported dtype (platforms/cuda.py supported_dtypes: bf16 from compute capability 8.0, else fp16);
        # before 0.10.1 it was float16; a bf16 config on a GPU without bf16 falls back to float16
        if not gpu.has_bf16 and spec.activation_dtype in ("bf16", "fp32"):
            return "fp16", (
                f"--dtype auto: {gpu.name} has no bfloat16 (compute capability < 8.0), so vLLM serves this "
                f"{spec.activation_dtype} model in float16 (vllm/config/model.py _resolve_auto_dtype)"
            )
        if spec.config_dtype != "fp32":
            return spec.activation_dtype, None
        if version < (0, 10):
            return "fp16", "--dtype auto: vLLM before 0.10.1 serves a float32 checkpoint in float16"
        return "bf16", "--dtype auto: vLLM from 0.10.1 serves a float32 checkpoint in bfloat16"

    @classmethod
    def check_architecture(cls, spec: ModelSpec, version: Version) -> None:
        if version < MLA_FROM and any(isinstance(la, LatentAttention) for la in spec.layers):
            # before MLA reached vLLM (0.7.1) DeepSeek-V2/V3 were cached as full K/V: num_key_value_heads x a
            # head padded to 256 (config.py get_head_size, "we need to pad head_size 192 to 256"), blocks of 16
            raise UsageError(
                f"{spec.name}: vLLM {fmt_version(version)} cached MLA models as full K/V of every head (head size "
                "padded to 256, vllm/config.py get_head_size), not the latent kvplan plans; MLA came in vLLM "
                "0.7.1: give --engine-version 0.7 or later"
            )
        last = REMOVED_ARCHITECTURES.get(spec.architecture or "")
        if last is not None and version > parse_version_text(last):
            raise UsageError(
                f"{spec.name}: vLLM {fmt_version(version)} does not load {spec.architecture}, 'supported in vLLM until "
                f"v{last}' (vllm/model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS); give "
                f"--engine-version {fmt_version(parse_version_text(last))} or older"
            )

    @classmethod
    def check_model_dtype(cls, dtype: str, gpu: GpuSpec) -> None:
        # platforms/cuda.py check_if_supports_dtype: "Bfloat16 is only supported on GPUs with compute
        # capability of at least 8.0"
        if dtype == "bf16" and not gpu.has_bf16:
            raise UsageError(
                f"--dtype bfloat16: vLLM refuses it on {gpu.name} (compute capability < 8.0, no bfloat16); "
                "use --dtype half"
            )

    @property
    def version_text(self) -> str:
        # 0.10.0, named to the patch, plans by the rules before 0.10.1 (before_0_10_1): said so
        if before_0_10_1(self.version, self.req.engine_version) != self.version:
            return "0.10.0"
        return super().version_text

    def chunked_hybrid(self) -> tuple[bool, str]:
        """Whether chunked-local layers get the hybrid KV cache manager, and where that comes from."""
        given = self.env(CHUNKED_HYBRID_ENV)
        if given is not None:
            return env_flag(CHUNKED_HYBRID_ENV, given), "given with --env"
        v = before_0_10_1(self.version, self.req.engine_version)
        return chunked_hybrid_default(v), f"{self.label}: {chunked_hybrid_why(v)}"

    def env_applied(self, spec: ModelSpec) -> dict[str, str]:
        applied = dict(self.req.env)  # what the user set, then the defaults that shape this plan
        if any(isinstance(layer, ChunkedAttention) for layer in spec.layers):
            applied[CHUNKED_HYBRID_ENV] = "1" if self.chunked_hybrid()[0] else "0"
        return applied

    def view_notes(self, spec: ModelSpec) -> list[str]:
        _, state_rule = self.state_blocks(spec.layers)
        notes = [state_rule] if state_rule and not self.req.disable_hybrid_kv_cache_manager else []
        return notes + self._chunked_notes(spec)

    def _chunked_notes(self, spec: ModelSpec) -> list[str]:
        if not self.env_applied(spec) or self.req.disable_hybrid_kv_cache_manager:
            return []
        on, why = self.chunked_hybrid()
        if not on:
            return []  # the "keeps every token" note says it
        return [
            f"{CHUNKED_HYBRID_ENV}=1 ({why}): the hybrid KV cache manager keeps only the current chunk's "
            f"KV in the chunked-local layers; --env {CHUNKED_HYBRID_ENV}=0 keeps every token"
        ]

    @classmethod
    def log_settings(cls, facts: dict[str, Any]) -> dict[str, Any]:
        out = {"gpu_memory_utilization": facts.get("gpu_memory_utilization")}
        if facts.get("max_num_seqs") is not None:  # a logged --max-num-seqs sizes the sampler's profiling run
            out["max_num_seqs"] = facts["max_num_seqs"]
        return out

    @classmethod
    def arithmetic_budget(cls, facts: dict[str, Any], pred: Any) -> tuple[dict[str, Any], int] | None:
        # the log's KV memory when it gives one (V0's '# GPU blocks' line is then checked against it:
        # worker.py determine_num_available_blocks, blocks = KV memory // block bytes); its blocks otherwise
        if facts.get("available_kv_bytes") is None:
            if facts.get("num_gpu_blocks") is not None:
                return {"num_gpu_blocks_override": facts["num_gpu_blocks"]}, 0
            return None
        # blocks that the 0.005 GiB rounding of a logged "X.XX GiB" figure can hide
        d = pred.engine.details
        block_bytes = (
            min(d.block_bytes_per_stage) if d is not None else pred.block_bytes_per_gpu
        )  # V0: no details
        slack = math.ceil(0.005 * GiB / block_bytes) if block_bytes else 0
        return {"kv_cache_memory_bytes": facts["available_kv_bytes"]}, slack

    @classmethod
    def measured_reserve(
        cls, facts: dict[str, Any], pred: Any, logged_kv: int
    ) -> tuple[int, str, str | None]:
        # kvplan's weights, so that a saved calibration makes estimate give the log's KV memory (check-log keeps
        # none where kvplan's weights are not the log's: the figure would carry their difference)
        return (
            pred.requested_bytes_per_gpu - pred.weight_bytes_per_gpu - logged_kv,
            "non-KV memory",
            "non-KV memory: what the engine kept beside weights and KV (activations, workspaces, "
            "CUDA graphs), measured as requested - weights - KV memory",
        )

    def utilization(self) -> float:
        return self.req.gpu_memory_utilization or default_utilization(self.version)

    @classmethod
    def batch_defaults(cls, gpu: GpuSpec, usage: str, version: Version) -> BatchDefaults:
        return vllm_batch_defaults(gpu, usage, version)

    def profile_num_seqs(self, gpu: GpuSpec) -> int:
        """Sequences of vLLM's dummy sampler run: min(max_num_seqs, max_num_batched_tokens)
        (vllm/v1/worker/gpu_model_runner.py _dummy_run: num_reqs = min(num_tokens, max_num_seqs))."""
        req = self.req
        seqs = req.max_num_seqs or self.batch_defaults(gpu, req.usage, self.version).max_num_seqs or 256
        return min(seqs, req.batched_tokens)

    def running_cap(self, pool_tokens: int, max_len: int, attn_dp: int = 1) -> tuple[int, str, bool]:
        # the scheduler runs at most max_num_seqs: the dummy run's count (profile_num_seqs), the same rule
        if self.req.max_num_seqs is not None:
            return self.profile_num_seqs(self.req.gpu), "--max-num-seqs", True
        why = "vLLM's default --max-num-seqs (vllm/engine/arg_utils.py at v0.11.0, lowered to --max-num-batched-tokens)"
        return self.profile_num_seqs(self.req.gpu), why, True

    def block_size(self, spec: ModelSpec, gpu: GpuSpec) -> tuple[int, str | None]:
        bs, why = default_block_size(spec, gpu)
        return (
            bs,
            None if bs == DEFAULT_BLOCK_SIZE else f"block size {bs}: {why} (override with --block-size)",
        )

    def windows_kept(self, spec: ModelSpec) -> str | None:
        if self.req.disable_hybrid_kv_cache_manager:
            return "--disable-hybrid-kv-cache-manager"
        if self.env_applied(spec) and not self.chunked_hybrid()[0]:
            # vllm/config/vllm.py: chunked-local attention without the env var disables the manager
            # for every layer ("There is a latency regression when using chunked local attention ...")
            why = self.chunked_hybrid()[1]
            return f"{CHUNKED_HYBRID_ENV}=0, {why}; --env {CHUNKED_HYBRID_ENV}=1 enables it"
        return None

    def state_dtypes(self, spec: ModelSpec, layer: RecurrentState) -> tuple[str, str, str | None]:
        # vllm/config/cache.py: mamba_cache_dtype / mamba_ssm_cache_dtype "auto" = the model dtype
        conv = layer.conv_dtype if layer.conv_dtype != "auto" else spec.activation_dtype
        if self.req.mamba_ssm_dtype:
            return conv, self.req.mamba_ssm_dtype, None
        if layer.ssm_dtype != "auto":
            return conv, layer.ssm_dtype, None
        if layer.mixer == "kda":  # mamba_utils.py kda_state_dtype: the recurrent state is always fp32
            return conv, "fp32", "vLLM keeps KDA recurrent state in fp32"
        if (spec.architecture or "").startswith("NemotronH"):
            # models/config.py NemotronHForCausalLMConfig: fp32 when the config states none (PR #39032)
            return conv, "fp32", "vLLM's NemotronH default SSM state dtype is fp32 (since PR #39032, 2026-04)"
        return conv, spec.activation_dtype, None

    def hybrid_block_size(
        self, spec: ModelSpec, fmt: Format, tp: int, block_size: int
    ) -> tuple[int, str | None]:
        align = (
            old_hybrid_alignment(spec.layers, self.req.gpu)
            if self.version < HYBRID_ALIGN_FROM_BLOCK
            else None
        )
        raised, state_page, attn_1tok = state_block_size(spec.layers, fmt, block_size, tp, align)
        if not state_page:
            return block_size, None
        lines = []
        if raised != block_size:
            lines.append(
                f"Setting attention block size to {raised} tokens to ensure that attention page size is "
                ">= mamba page size."
            )
        padded = raised * attn_1tok
        if padded > state_page:
            lines.append(
                f"Padding mamba page size by {100 * (padded - state_page) / state_page:.2f}% to ensure that "
                "mamba page size and attention page size are exactly equal."
            )
        self.state_lines = tuple(lines)
        why = (
            f"block size {raised}: vLLM raises the attention block until one attention page ({attn_1tok:,} B "
            f"a token per layer per GPU) holds a layer's recurrent state ({state_page:,} B a sequence), "
            "and pads the state page to it"
        )
        return raised, why if raised != block_size else None

    def loaded_expert_factor(
        self, spec: ModelSpec, gpu: GpuSpec, tp: int, expert_format: str
    ) -> tuple[float, str | None]:
        if expert_format == "mxfp4" and self.req.enable_eplb and spec.moe is not None:
            # quantization/mxfp4.py Mxfp4MoEMethod.apply: raise NotImplementedError("EPLB is not supported for mxfp4")
            raise UsageError("--enable-eplb: vLLM's MXFP4 experts do not run under EPLB ('EPLB is not supported "
                             "for mxfp4', quantization/mxfp4.py); leave --enable-eplb out")  # fmt: skip
        if gpu.vendor == "amd" and expert_format in ("bf16", "fp16", "fp32") and spec.moe is not None:
            return self.rocm_moe_padding(spec, tp, expert_format)
        if expert_format != "mxfp4" or spec.moe is None or self.version < (0, 10):
            return 1.0, None
        factor, backend = vm.mxfp4_expert_factor(
            self.version, gpu, spec.hidden_size, spec.moe.expert_intermediate_size, tp
        )
        if factor == 1.0:
            return 1.0, None
        return factor, (
            f"MXFP4 experts load {100 * (factor - 1):.1f}% larger than stored: {self.label} runs them with "
            f"its {backend} kernel on {gpu.name}, which pads hidden and intermediate sizes (mxfp4.py)"
        )

    def rocm_moe_padding(self, spec: ModelSpec, tp: int, expert_format: str) -> tuple[float, str | None]:
        """VLLM_ROCM_MOE_PADDING on AMD GPUs (engines/vllm_memory.py rocm_moe_padding_factor)."""
        assert spec.moe is not None
        if not vm.rocm_moe_padding_kept(self.version):
            return 1.0, None
        if self.env_bool(vm.ROCM_MOE_PADDING_ENV) is False:
            return 1.0, None
        # envs.py reads the AITER flags as "true"/"1" (VLLM_ROCM_USE_AITER default off, _MOE default on)
        aiter = (self.env(vm.ROCM_AITER_ENV) or "false").lower() in ("true", "1")
        aiter_moe = (self.env(vm.ROCM_AITER_MOE_ENV) or "true").lower() in ("true", "1")
        if aiter and aiter_moe:
            return 1.0, None  # AITER's shuffle re-lays the experts out compactly
        hidden = spec.moe.expert_hidden_size or spec.hidden_size
        per_rank = -(-spec.moe.expert_intermediate_size // tp)
        elem = {"bf16": 2, "fp16": 2, "fp32": 4}[expert_format]
        factor = vm.rocm_moe_padding_factor(hidden, per_rank, elem, spec.mlp_gated)
        if factor == 1.0:
            return 1.0, None
        return factor, (
            f"{expert_format} experts load {100 * (factor - 1):.1f}% larger than stored: on ROCm {self.label} "
            "pads each expert weight row whose byte stride is a multiple of 512 by 256 bytes "
            f"(_maybe_pad_weight, {vm.ROCM_MOE_PADDING_ENV}=1 by default; not with AITER's fused MoE)"
        )

    def sharding(self, spec: ModelSpec, tp: int) -> Sharding:
        req = self.req
        dp = req.data_parallel_size or 1
        out = vllm_sharding(spec, tp, dp, req.enable_expert_parallel, req.num_redundant_experts)
        group = tp * dp  # the EP group under --enable-expert-parallel (vllm_sharding)
        # vllm/config/parallel.py ParallelConfig (EPLB since v0.9): EPLB needs expert parallelism over TP x DP > 1,
        # and redundant experts need EPLB
        if req.enable_eplb and not req.enable_expert_parallel:
            raise UsageError(
                "--enable-eplb needs --enable-expert-parallel (vLLM: 'enable_expert_parallel must be True to use "
                "EPLB', vllm/config/parallel.py)"
            )
        if req.enable_eplb and group <= 1:
            raise UsageError(
                f"--enable-eplb needs TP or --data-parallel-size above 1 (vLLM: 'EPLB requires tensor, "
                f"prefill-context, or data parallelism', vllm/config/parallel.py); got TP {tp}, DP {dp}"
            )
        physical = (spec.moe.num_experts if spec.moe is not None else 0) + req.num_redundant_experts
        if req.enable_eplb and physical and physical % group:
            # fused_moe/layer.py: under EPLB assert global_num_experts % ep_size == 0
            raise UsageError(
                f"--enable-eplb: vLLM's EPLB spreads the experts evenly ('EPLB currently only supports even "
                f"distribution of experts across ranks', fused_moe/layer.py): {physical} experts (with "
                f"--num-redundant-experts {req.num_redundant_experts}) do not divide over EP {group}"
            )
        if req.num_redundant_experts and not req.enable_eplb:
            raise UsageError(
                f"--num-redundant-experts {req.num_redundant_experts} needs --enable-eplb (vLLM: "
                f"'num_redundant_experts is set to {req.num_redundant_experts} but EPLB is not enabled', "
                "vllm/config/parallel.py)"
            )
        return with_eplb_rule(out, req.enable_eplb, req.moe_imbalance)

    def load_buffer_bytes(self, spec: ModelSpec) -> tuple[int, str | None]:
        tower = spec.vision_tower
        rotary = next((t.head_dim for t in spec.layer_types.values() if isinstance(t, FullAttention)), None)
        if tower is None or tower.style in ("mllama", "siglip") or rotary is None or self.version < (0, 10):
            return (
                0,
                None,
            )  # M-RoPE and deepstack buffers are the Qwen-VL models'; Mllama's and Gemma 3's text plain RoPE
        act_bytes = 4 if spec.activation_dtype == "fp32" else 2
        extra = vm.vision_load_bytes(
            tower, spec.max_context, rotary, spec.hidden_size, self.req.batched_tokens, act_bytes
        )
        deep = (
            f" and {tower.deepstack_mergers} deepstack input buffers of {self.req.batched_tokens:,} tokens"
            if tower.deepstack_mergers
            else ""
        )
        return extra, (
            f"weights include {fmt_gib(extra)} a GPU that {self.label} allocates with the model: the M-RoPE "
            f"cos/sin cache over {vm.MROPE_CACHE_POSITIONS} x {spec.max_context:,} positions (mrope.py){deep}"
        )

    def env_bool(self, name: str) -> bool | None:
        given = self.env(name)
        return None if given is None else env_flag(name, given)

    def profile_sampler(self, spec: ModelSpec, gpu: GpuSpec) -> vm.SamplerPath:
        """The top-k/top-p path vLLM's profiling sampler takes for this model (engines/vllm_memory.py)."""
        v2 = self.env_bool(vm.RUNNER_V2_ENV)
        if v2 is None:
            hybrid = any(isinstance(layer, RecurrentState) for layer in spec.layers)
            v2, _ = vm.runner_v2(self.version, spec.architecture, spec.moe is not None, hybrid)
        return vm.sampler_path(
            self.version,
            self.profile_num_seqs(gpu),
            runner_v2=v2,
            flashinfer=self.env_bool(vm.FLASHINFER_SAMPLER_ENV),
        )

    def counts_cuda_graphs(self) -> bool:
        if self.req.enforce_eager:
            return False
        return vm.counts_cuda_graphs(self.version, self.env_bool(vm.CUDA_GRAPH_ENV))

    def budget(self, spec: ModelSpec, gpu: GpuSpec, tp: int, pp: int) -> Budget:
        req, util = self.req, self.utilization()
        act_bytes = 4 if spec.activation_dtype == "fp32" else 2
        runner, self.runner_why = vm.resolve_runner(req.runner, spec.architecture, spec.pooling_config)
        tower = spec.vision_tower
        self.vision_counted = tower is not None
        # gpu_model_runner.py profile_run: the dummy encoder outputs of the largest multimodal item (padded
        # from 0.11) and its pixel inputs stay alive through the dummy forward and the sampler
        # (engines/vllm_memory.py dummy_encoder_bytes)
        encoder = 0
        if tower is not None and tower.max_item_tokens and self.version >= (0, 10):
            encoder = vm.dummy_encoder_bytes(self.version, tower, req.batched_tokens, act_bytes)
        self.vision_profile = spec.vision_encoder and not encoder
        # a pooling model's profile runs the pooler, not the sampler (gpu_model_runner.py _dummy_pooler_run)
        rows = self.profile_num_seqs(gpu) if runner == "generate" else 0
        path = None
        if req.reserve_bytes is not None:
            reserve = given_reserve(req.reserve_bytes)
        else:
            sequential = self.version >= (0, 10)
            if not sequential:  # kvplan's rules before vLLM 0.10 (not re-derived from the wheels)
                per_logit, graphs = vm.LEGACY_SAMPLER_BYTES, 0
                non_torch = vm.legacy_non_torch_bytes(self.version, tp, pp)
            else:
                sampler = self.profile_sampler(spec, gpu)
                per_logit = sampler.bytes_per_logit
                path = f"{sampler.name}, {per_logit:g} B/logit" if rows else "none (a pooling model)"
                non_torch = vm.non_torch_bytes(self.version, gpu, tp, pp)
                graphs = CUDA_GRAPH_BYTES if self.counts_cuda_graphs() else 0
            reserve = estimate_reserve(
                spec,
                tp,
                req.batched_tokens,
                act_bytes,
                sampler_rows=rows,
                sampler_bytes_per_logit=per_logit,
                non_torch=non_torch,
                cuda_graphs=graphs,
                sequential=sequential,
                encoder_cache=encoder,
            )
        return Budget(
            requested_bytes(gpu.memory_bytes, util),
            reserve,
            True,
            util,
            None,
            f"{gpu.name} x {util:g}",
            sampler_path=path,
        )

    def budget_notes(self, budget: Budget, gpu: GpuSpec, tp: int, pp: int) -> list[str]:
        r, req = budget.reserve, self.req
        if r.given:
            notes = [
                f"activation/workspace reserve per GPU given as {fmt_gib(r.total)}"
                + (f" ({req.reserve_source})" if req.reserve_source else "")
            ]
        else:
            how = "the larger of" if r.sequential else "the sum of"
            path = f", {budget.sampler_path}" if budget.sampler_path else ""
            notes = [
                f"activation/workspace reserve per GPU estimated at {fmt_gib(r.total)} "
                f"({how} the forward pass over {req.batched_tokens:,} batched tokens and the sampler over "
                f"{plural(self.profile_num_seqs(gpu), 'sequence')}{path}; NCCL/cuBLAS"
                + (", CUDA graphs" if r.cuda_graph_bytes else "")
                + "); override with --reserve-memory or calibrate with check-log"
            ]
            sampler_hint = vm.sampler_note(self.version, budget.sampler_path or "")
            if sampler_hint:
                notes.append(sampler_hint)
            if getattr(self, "runner_why", None):
                notes.append(f"{self.runner_why} (no sampler in its memory profile)")
            if getattr(self, "vision_profile", False):
                notes.append(
                    "WARNING: kvplan does not count vLLM's profile of the vision encoder on its largest "
                    "dummy input (the encoder cache held through the dummy forward: 2.3 GiB a GPU in real "
                    "Qwen3-VL-30B-A3B logs)"
                    + ("" if getattr(self, "vision_counted", False) else ", nor the vision tower's weights")
                    + ", so the KV memory here is an upper bound: give --reserve-memory, or run check-log "
                    "on a startup log"
                )
        if req.gpu_memory_utilization is None:
            notes.append(
                f"--gpu-memory-utilization {budget.gpu_memory_utilization:g}: {self.label}'s default"
            )
        if gpu.vendor == "amd" and vm.rocm_loading_device_wide(self.version):
            notes.append(f"{vm.ROCM_LOADING_NOTE}: the KV memory here is an upper bound")
        return notes

    def defaults_applied(self) -> dict[str, Any]:
        return {} if self.req.gpu_memory_utilization else {"gpu_memory_utilization": self.utilization()}

    def budget_formula(self, budget: Budget, gpu: GpuSpec) -> tuple[str, str]:
        return (
            "ceil(memory x gpu_memory_utilization) - weights - reserve",
            f"{gpu.name} memory_bytes {gpu.memory_bytes:,}; utilization {budget.gpu_memory_utilization:g}; "
            "vLLM vllm/v1/worker/gpu_worker.py at v0.11.0",
        )

    def prepare(
        self,
        layers: list[Layer],
        fmt: Format,
        block_size: int,
        tp: int,
        max_len: int,
        draft_layers: tuple[Layer, ...] = (),
    ) -> None:
        hybrid = not self.req.disable_hybrid_kv_cache_manager
        # vllm/v1/spec_decode: the draft's attention layers join the target's KV-cache groups and share its
        # blocks (the last pipeline stage holds them)
        self.target_layers = len(layers)
        self.layers = [*layers, *draft_layers]
        blocks, _ = self.state_blocks(layers)
        self.layout = vllm_layout(
            self.layers, fmt, block_size, tp, max_len, self.req.batched_tokens, hybrid, blocks
        )

    def _with_draft(self, layer_ids: range | list[int]) -> set[int]:
        """A stage's layer ids, with the draft's when the stage holds the model's last layer."""
        ids = set(layer_ids)
        n = self.target_layers
        if self.layers is not None and n and (n - 1) in ids:
            ids.update(range(n, len(self.layers)))
        return ids

    def block_bytes(self, layer_ids: range, layers: list[Layer], fmt: Format, tp: int) -> int | None:
        if not self.layout or self.layers is None:
            return None
        return self.layout.block_bytes(self._with_draft(layer_ids), self.layers, fmt, tp)

    def drops_lm_head(self, spec: ModelSpec) -> str | None:
        runner, _ = vm.resolve_runner(self.req.runner, spec.architecture, spec.pooling_config)
        if runner != "pooling":
            return None
        # vllm/model_executor/models/adapters.py _create_pooling_model_cls: a pooling model deletes its
        # lm_head and logits processor (the Qwen3-Embedding-8B log loads 14.11 GiB, the head's 1.16 GiB less)
        return "vLLM's pooling runner deletes the LM head (vllm/model_executor/models/adapters.py)"

    def request_charge(self, layer_ids: range, fmt: Format, tp: int) -> list[float] | None:
        """vLLM's groups share one tensor per slot, so a block costs every slot's page, padding slots and a
        draft's layers included, and a state page is padded to the attention page (README, How the engines
        size their KV cache): a layer of a group with n of the stage's s slots costs s / n of its own bytes."""
        layout = self.layout
        if layout is None or layout.uniform or self.layers is None or self.version < V1_DEFAULT:
            return None  # V0 (before 0.8) has no groups: kvplan's own count stands
        ids = self._with_draft(layer_ids)
        held = [sum(1 for i in g.layer_ids if i in ids) for g in layout.groups]
        slots = max(held)
        # a draft's layers share the target's blocks: the target's layers carry their pages too; a group of the
        # draft's alone (its page differs) has no target layer to carry it: its share is split off the budget
        counts = [sum(1 for i in g.layer_ids if i in layer_ids) for g in layout.groups]
        self.draft_apart = any(n and not c for n, c in zip(held, counts, strict=True))
        counts = [c or 1 for c in counts]
        group_of = {i: k for k, g in enumerate(layout.groups) for i in g.layer_ids}
        charge = []
        for i in layer_ids:
            k = group_of.get(i)
            if k is None:
                charge.append(1.0)  # no cache of its own
                continue
            scale = slots / counts[k]
            layer = self.layers[i]
            if isinstance(layer, RecurrentState) and kv.layer_state_bytes(layer, tp):
                scale *= layout.groups[k].page_bytes / kv.layer_state_bytes(layer, tp)
            charge.append(scale)
        return charge if any(c != 1.0 for c in charge) else None

    def spec_tokens(self) -> int:
        """vLLM's num_speculative_tokens (0 without --speculative-config)."""
        spec = self.req.speculative
        return spec.draft_tokens if spec is not None else 0

    def state_blocks(self, layers: list[Layer] | tuple[Layer, ...]) -> tuple[int, str | None]:
        """Pages a request holds in each recurrent-state group, and the rule (None: no state layers).

        vllm/v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes: 1 + num_speculative_blocks with
        mamba_cache_mode "none", 2 + num_speculative_blocks with "align", the mode vLLM sets for a hybrid
        model when prefix caching is on (vllm/model_executor/models/config.py: "Mamba cache mode is set to
        'align' ... by default when prefix caching is enabled"); num_speculative_blocks is the
        speculative config's num_speculative_tokens. Real 0.23.0 and 0.27.1 logs of Qwen3.5/3.6 hold them."""
        states = [la for la in layers if isinstance(la, RecurrentState)]
        if not states:
            return 1, None
        k = self.spec_tokens()
        req = self.req
        # prefix caching on a hybrid model: vLLM's default from 0.28 (off before, on when asked); the align
        # mode is read from 0.23 on (a 0.10 log: "disabling prefix caching since it is not yet supported")
        asked = req.enable_prefix_caching and (req.prefix_caching_stated or self.version >= (0, 28))
        align = asked and self.version >= (0, 23)
        base = 2 if align else 1
        spec = f" + {k} speculative" if k else ""
        if align:
            rule = f"prefix caching on: mamba_cache_mode 'align', {base}{spec} pages"
            if any(la.mixer != "gdn" for la in states):
                rule += (
                    " (assumed: vLLM picks mode 'all', a page per block of context, for models that declare "
                    "Mamba prefix caching; kvplan does not know which do)"
                )
        elif asked:
            rule = (
                f"prefix caching on, but its Mamba modes are not modelled before vLLM 0.23: charged as "
                f"mode 'none', {base}{spec} page(s)"
            )
        else:
            rule = f"prefix caching off: mamba_cache_mode 'none', {base}{spec} page(s)"
        return base + k, (
            f"vLLM charges a request {base + k} page(s) in each recurrent-state group ({rule}; "
            "kv_cache_interface.py MambaSpec.max_memory_usage_bytes)"
        )

    def state_conv_rows(self, layer: RecurrentState) -> int:
        # mamba_utils.py MambaStateShapeCalculator.gated_delta_net_state_shape: the convolution state holds
        # conv_kernel - 1 + num_spec rows under speculative decoding (the 0.23.0 MTP logs: block 1,600)
        return self.spec_tokens() if layer.mixer == "gdn" else 0

    def report(
        self, stages: list[StageCache], fmt: Format, block_size: int, tp: int, max_len: int
    ) -> EngineReport:
        if self.layout is None or self.layers is None:
            raise EngineUnsupported("no vLLM block layout")
        block_bytes = [
            self.layout.block_bytes(self._with_draft(s.layer_ids), self.layers, fmt, tp) for s in stages
        ]
        budgets = [s.engine_budget_bytes or s.kv_budget_bytes for s in stages]
        if self.version < V1_DEFAULT:
            draft = len(self.layers) > self.target_layers
            return v0_report(self.layout, budgets, block_bytes, max_len, self.version, draft)
        report = vllm_report(
            self.layout, budgets, block_bytes, max_len, self.version, self.req.num_gpu_blocks_override
        )
        report = dataclasses.replace(report, version=self.version_text)
        if not self.state_lines:
            return report
        return dataclasses.replace(report, log_lines=[*self.state_lines, *report.log_lines])

    def differences(self, report: EngineReport, kvplan_concurrency: int) -> list[str]:
        layout = self.layout
        if layout is None or report.max_concurrency is None:
            return []
        if self.version < V1_DEFAULT:
            return [
                f"vLLM {fmt_version(self.version)} runs the V0 engine: these are V0's figures in its words, "
                "which changed between V0 releases ('# GPU blocks' became '# CUDA blocks'; the concurrency "
                "line came late in V0); CPU blocks are the 4 GiB --swap-space default"
            ]
        notes = []
        if layout.blocks_per_request != layout.held_blocks_per_request:
            notes.append(
                f"vLLM charges a request {layout.blocks_per_request:,} blocks at admission (a sliding-window "
                f"or chunked layer is charged window + --max-num-batched-tokens {self.req.batched_tokens:,} "
                f"tokens); at full length it holds {layout.held_blocks_per_request:,}, which is what kvplan counts"
            )
        if layout.padding_layers:
            notes.append(
                f"vLLM adds {layout.padding_layers} padding layers to equalise its KV-cache groups; their "
                "pages hold nothing, and kvplan charges a request for them as vLLM does"
            )
        if any(g.kind == "state" for g in layout.groups):
            pages = next(g.blocks_per_request for g in layout.groups if g.kind == "state")
            notes.append(
                "vLLM holds each layer's recurrent state in attention-sized pages (padded) and charges a "
                f"request {pages} page(s) per state group; kvplan charges the same pages"
            )
        same_charge = layout.blocks_per_request == layout.held_blocks_per_request
        if same_charge and math.floor(report.max_concurrency) != kvplan_concurrency and self.null_blocks:
            notes.append("vLLM's printed concurrency does not subtract the null block; kvplan's does")
        return notes


def _idle_ep(sharding: Sharding, ep_on: bool, why: str) -> Sharding:
    """--enable-expert-parallel where it places nothing: vLLM takes the flag and changes nothing; said so."""
    if not ep_on:
        return sharding
    rule = f"vLLM --enable-expert-parallel: {why}, so the flag changes nothing"
    return dataclasses.replace(sharding, rules=(*sharding.rules, rule))


def vllm_sharding(spec: ModelSpec, tp: int, dp: int, ep_on: bool, redundant: int) -> Sharding:
    """vLLM's placement of an MoE model's experts over its TP x DP GPUs (one DP rank = one engine core of
    TP GPUs, with its own attention, dense layers and KV cache)."""
    experts = spec.moe.num_experts if spec.moe is not None else 0
    if redundant and not ep_on:
        # vllm/config/parallel.py at v0.11.0: redundant experts are EPLB's, which needs expert parallelism
        raise UsageError(
            "--num-redundant-experts needs --enable-expert-parallel (vLLM's EPLB, vllm/config/parallel.py)"
        )
    if not experts:
        if redundant:
            raise UsageError(f"--num-redundant-experts: {spec.name} has no routed experts")
        return _idle_ep(plain_sharding(spec, tp), ep_on, f"{spec.name} has no routed experts")
    group = tp * dp
    dp_line = (
        f"vLLM --data-parallel-size {dp}: {dp} engine cores of TP {tp} GPUs, each with its own attention, dense "
        "layers and KV cache and its own 'GPU KV cache size' line (EngineCore_DP0..); their MoE layers form one "
        f"group of TP x DP = {group} GPUs (vllm/model_executor/layers/fused_moe/config.py "
        "FusedMoEParallelConfig.make at v0.11.0)"
    )
    rules: tuple[str, ...] = (dp_line,) if dp > 1 else ()
    if ep_on and group > 1:
        physical = experts + redundant
        if physical < group:
            raise UsageError(
                f"--enable-expert-parallel: EP size TP x DP = {group} exceeds the {physical} routed experts of "
                f"{spec.name}; use fewer GPUs per replica"
            )
        # layer.py determine_expert_map at v0.11.0: physical // ep experts a rank, one more on the first
        # physical % ep ranks (older releases gave the remainder to the last rank)
        local = -(-physical // group)
        extra = f" + {redundant} redundant (EPLB)" if redundant else ""
        rules += (
            f"vLLM --enable-expert-parallel: EP size = TP x DP = {group}; the fullest GPU holds {local} of the "
            f"{experts}{extra} routed experts per MoE layer whole instead of a 1/{group} slice of each "
            "(fused_moe/config.py FusedMoEParallelConfig.make, fused_moe/layer.py determine_expert_map at v0.11.0)",
            "vLLM dispatches and combines tokens all-to-all only under expert parallelism with --data-parallel-size > 1 "
            "(fused_moe/config.py FusedMoEParallelConfig.use_all2all_kernels: dp_size > 1 and use_ep, v0.11.0); "
            + (
                "so here it does"
                if dp > 1
                else "at DP 1 the experts' outputs are all-reduced over TP as without EP"
            ),
        )
        return Sharding(tp, tp, 1, group, 1, experts, local, redundant, engine_dp=dp, all_to_all=dp > 1,
                        rules=rules)  # fmt: skip
    if dp == 1:
        return _idle_ep(plain_sharding(spec, tp), ep_on, "at TP x DP = 1 the one GPU holds every expert")
    rules += (f"without --enable-expert-parallel each routed expert is sliced over TP x DP = {group} GPUs",)
    return Sharding(tp, tp, 1, 1, group, experts, experts, engine_dp=dp, rules=rules)
