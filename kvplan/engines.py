"""The serving engines' own KV accounting: what vLLM and SGLang compute and print at startup.

kvplan's planner (plan.py) models what physically fits. This module reproduces, number for
number, the figures the engines log, from the same budget, so that a user can hold kvplan
against a startup log. Every rule names its source in `shared/reference/engines.md`.
Pure functions, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kvplan import kv
from kvplan.errors import UsageError
from kvplan.formats import Format
from kvplan.specs.models import (
    ChunkedAttention,
    CompressedAttention,
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
from kvplan.units import GiB, MiB, ceil_div

ENGINES = ("vllm", "sglang")
LATEST = {"vllm": (0, 33), "sglang": (0, 5)}

# Dtypes the engines' KV caches support; int8/int4/int2 are kvplan what-ifs only.
ENGINE_KV_DTYPES = {"fp16", "bf16", "fp32", "fp8", "fp8_e4m3", "fp8_e5m2"}

# SGLang disables its hybrid SWA pool for these architectures (server_args, 0.5.x).
SGLANG_NO_HYBRID_SWA = {
    "GptOssForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration",
}

# Memory the CUDA context, NCCL communicators and allocator take before SGLang measures
# "free memory at startup"; estimated (one SGLang 0.5 log of Qwen3-235B-FP8 on 4xH100,
# vLLM issue 21348, implies ~2.3 GiB with TP 4). check-log calibration replaces it.
SGLANG_STARTUP_BYTES = int(0.75 * GiB)
SGLANG_STARTUP_NCCL_BYTES = int(1.5 * GiB)


class EngineUnsupported(Exception):
    """The engine cannot serve this configuration; the message says why (kvplan still plans it)."""


def parse_version(text: str | None, engine: str) -> tuple[int, int]:
    """'0.11', '0.11.2', 'v0.10.1.1' -> (0, 11); None or 'latest' -> the newest kvplan knows."""
    if text is None or text == "latest":
        return LATEST[engine]
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)*(?:[.+-]\w+)*", text.strip())
    if not m:
        raise UsageError(f"--engine-version: cannot read {text!r}; write e.g. 0.11 or 0.11.2")
    return int(m.group(1)), int(m.group(2))


def fmt_version(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


# --- vLLM -----------------------------------------------------------------------------------


def vllm_default_utilization(version: tuple[int, int]) -> float:
    # engines.md: default 0.9 up to 0.18, 0.92 from 0.20 on
    return 0.92 if version >= (0, 20) else 0.9


def vllm_counts_cuda_graphs(version: tuple[int, int]) -> bool:
    # vLLM log "CUDA graph memory profiling is enabled (default since v0.21.0)"; engines.md (~0.20)
    return version >= (0, 21)


def vllm_tokens_from_concurrency(version: tuple[int, int]) -> bool:
    # engines.md: 0.21 to 0.25 printed int(C * L) as the KV cache size in tokens
    return (0, 21) <= version <= (0, 25)


def vllm_default_block_size(spec: ModelSpec, gpu: GpuSpec) -> tuple[int, str]:
    """(block size, why). engines.md: 16; MLA backends: FlashMLA 64, CUTLASS MLA 128."""
    if any(isinstance(layer, LatentAttention) for layer in spec.layers):
        if gpu.arch == "hopper":
            return 64, "FlashMLA (the MLA backend on Hopper) needs block size 64"
        if gpu.arch == "blackwell":
            return 128, "CUTLASS MLA (the MLA backend on Blackwell) needs block size 128"
    return 16, "vLLM's default block size"


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
        # one tensor per slot, shared by the i-th layer of every group (engines.md: groups get
        # equal page sizes); a stage needs as many slots as its fullest group
        slots = max(sum(1 for i in g.layer_ids if i in layer_ids) for g in self.groups)
        return self.groups[0].page_bytes * slots


def _spec_key(layer: Layer, hybrid: bool) -> tuple[str, int]:
    if isinstance(layer, SlidingWindow) and hybrid:
        return "sliding", layer.window
    if isinstance(layer, ChunkedAttention) and hybrid:
        return "chunked", layer.chunk
    return "full", 0


def _charge(kind: str, size: int, max_model_len: int, block_size: int, max_num_batched_tokens: int) -> int:
    if kind == "sliding":
        # engines.md: ceil(min(window - 1 + max_num_batched_tokens, max_model_len) / block_size) + 1
        return ceil_div(min(size - 1 + max_num_batched_tokens, max_model_len), block_size) + 1
    if kind == "chunked":
        # vLLM ChunkedLocalAttentionSpec: ceil(min(chunk + max_num_batched_tokens, max_model_len) / block_size)
        return ceil_div(min(size + max_num_batched_tokens, max_model_len), block_size)
    return ceil_div(max_model_len, block_size)


def vllm_layout(
    layers: list[Layer] | tuple[Layer, ...],
    fmt: Format,
    block_size: int,
    tp: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    hybrid: bool = True,
) -> VllmLayout:
    """Group the model's layers the way vLLM's KV-cache manager does (engines.md, hybrid models)."""
    cached: list[int] = []
    for i, layer in enumerate(layers):
        if isinstance(layer, (SharedKV, NoCache)):
            continue  # no cache of its own (cross-layer sharing reads another layer's)
        if isinstance(layer, RecurrentState):
            raise EngineUnsupported(
                "recurrent-state (Mamba/linear attention) layers are not modelled for vLLM"
            )
        if isinstance(layer, CompressedAttention):
            raise EngineUnsupported("compressed-KV layers have no vLLM block accounting")
        cached.append(i)

    def held(layer: Layer, bs: int) -> int:
        if not hybrid and isinstance(layer, (SlidingWindow, ChunkedAttention)):
            return ceil_div(max_model_len, bs)  # treated as full attention
        return kv.layer_blocks(layer, max_model_len, bs)

    keys = {i: _spec_key(layers[i], hybrid) for i in cached}
    page_of = {
        id(la): kv.page_bytes(la, fmt, block_size, tp) for la, _ in kv.grouped(layers[i] for i in cached)
    }
    pages = {i: page_of[id(layers[i])] for i in cached}
    kinds = set(keys.values())
    if len(kinds) == 1:  # uniform type (page sizes may differ: one group, per-layer tensors)
        kind, size = next(iter(kinds))
        rep = layers[cached[0]]
        group = KvGroup(
            kind if kind == "full" else f"{kind}({size})",
            tuple(cached),
            len(cached),
            block_size,
            pages[cached[0]],
            _charge(kind, size, max_model_len, block_size, max_num_batched_tokens),
            held(rep, block_size),
        )
        return VllmLayout((group,), uniform=True)

    # hybrid: unify page sizes by growing the block size of layers with smaller pages
    max_page = max(pages.values())
    block_sizes: dict[int, int] = {}
    for i in cached:
        if max_page % pages[i]:
            raise EngineUnsupported(
                "layers' page sizes do not divide each other; vLLM cannot unify them by block size"
            )
        block_sizes[i] = block_size * (max_page // pages[i])
    by_type: dict[tuple[str, int, int], list[int]] = {}
    for i in cached:
        by_type.setdefault((*keys[i], block_sizes[i]), []).append(i)
    counts = [len(v) for v in by_type.values()]
    group_size = min(counts)
    # vLLM kv_cache_utils: use the largest count when it is < 1.5x the smallest (less padding)
    if max(counts) < min(counts) * 1.5:
        group_size = max(counts)
    groups: list[KvGroup] = []
    for (kind, size, bs), ids in by_type.items():
        n_groups = ceil_div(len(ids), group_size)
        for j in range(n_groups):  # layers[j::n] so that PP stages fill groups evenly
            members = tuple(ids[j::n_groups])
            groups.append(
                KvGroup(
                    kind if kind == "full" else f"{kind}({size})",
                    members,
                    group_size,
                    bs,
                    max_page,
                    _charge(kind, size, max_model_len, bs, max_num_batched_tokens),
                    held(layers[members[0]], bs),
                )
            )
    return VllmLayout(tuple(groups), uniform=False)


@dataclass(frozen=True)
class EngineReport:
    engine: str
    version: str
    supported: bool
    reason: str | None = None
    num_blocks: int | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    available_kv_bytes: int | None = None
    log_lines: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)


def vllm_report(
    layout: VllmLayout,
    stage_budgets: list[int],
    stage_block_bytes: list[int],
    max_model_len: int,
    version: tuple[int, int],
    num_gpu_blocks_override: int | None = None,
) -> EngineReport:
    """vLLM's num_blocks, KV cache size and maximum concurrency (engines.md, Blocks and tokens)."""
    per_stage = [b // bb if bb else 0 for b, bb in zip(stage_budgets, stage_block_bytes, strict=True)]
    # engines.md: every worker computes its own figure; the engine takes the minimum
    num_blocks = min(per_stage) if num_gpu_blocks_override is None else num_gpu_blocks_override
    groups = layout.groups
    min_bs = min(g.block_size for g in groups)
    per_req = layout.blocks_per_request
    conc = num_blocks / per_req
    if vllm_tokens_from_concurrency(version):
        tokens = int(conc * max_model_len)
    else:
        # vLLM _report_kv_cache_config: num_blocks // number of groups * smallest block size
        tokens = num_blocks // len(groups) * min_bs
    available = min(stage_budgets)
    lines = []
    if not layout.uniform:
        by_kind: dict[str, list[KvGroup]] = {}
        for g in groups:
            by_kind.setdefault(g.kind, []).append(g)
        for kind_groups in by_kind.values():  # vLLM warns once per attention type that needs padding
            n = sum(len(g.layer_ids) for g in kind_groups)
            pad = sum(g.slots for g in kind_groups) - n
            if pad:
                lines.append(
                    f"Add {pad} padding layers, may waste at most {pad / n * 100:.2f}% KV cache memory"
                )
    lines.append(f"Available KV cache memory: {available / GiB:.2f} GiB")
    size = f"GPU KV cache size: {tokens:,} tokens"
    concurrency = f"Maximum concurrency for {max_model_len:,} tokens per request: {conc:.2f}x"
    if version >= (0, 33):
        lines.append(f"{size}, {concurrency}")
    else:
        lines += [size, concurrency]
    return EngineReport(
        engine="vllm",
        version=fmt_version(version),
        supported=True,
        num_blocks=num_blocks,
        kv_cache_tokens=tokens,
        max_concurrency=conc,
        available_kv_bytes=available,
        log_lines=lines,
        details={
            "num_blocks_per_stage": per_stage,
            "block_bytes_per_stage": stage_block_bytes,
            "blocks_per_request": per_req,
            "held_blocks_per_request": layout.held_blocks_per_request,
            "padding_layers": layout.padding_layers,
            "groups": [
                {
                    "kind": g.kind,
                    "num_layers": len(g.layer_ids),
                    "slots": g.slots,
                    "block_size": g.block_size,
                    "page_bytes": g.page_bytes,
                    "blocks_per_request": g.blocks_per_request,
                }
                for g in groups
            ],
        },
    )


# --- SGLang ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SglangMemory:
    mem_fraction_static: float
    given: bool
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    reserved_mib: float | None  # the reserve behind the default fraction


def sglang_memory_settings(
    memory_bytes: int, tp: int, pp: int, mem_fraction_static: float | None = None
) -> SglangMemory:
    """SGLang 0.5.x default --mem-fraction-static from the card's memory (server_args, GPU memory settings)."""
    gpu_mib = memory_bytes / MiB
    if gpu_mib < 20 * 1024:
        chunk, graph_bs = 2048, 16 if tp < 4 else 64
    elif gpu_mib < 35 * 1024:
        chunk, graph_bs = 2048, 24 if tp < 4 else 80
    elif gpu_mib < 60 * 1024:
        chunk, graph_bs = 4096, 32 if tp < 4 else 160
    elif gpu_mib < 160 * 1024:
        chunk, graph_bs = 8192, 256 if tp < 4 else 512
    else:
        chunk, graph_bs = 16384, 512
    if mem_fraction_static is not None:
        return SglangMemory(mem_fraction_static, True, chunk, graph_bs, None)
    # reserved MiB: metadata 512 + activations 1.5 x chunk + CUDA graphs 2 x max bs + parallelism
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return SglangMemory(round((gpu_mib - reserved) / gpu_mib, 3), False, chunk, graph_bs, reserved)


def sglang_startup_bytes(tp: int, pp: int) -> int:
    """Estimated memory already taken when SGLang reads the free memory it calls total."""
    return SGLANG_STARTUP_BYTES + (SGLANG_STARTUP_NCCL_BYTES if tp * pp > 1 else 0)


def sglang_hybrid_swa(spec: ModelSpec, disabled: bool) -> bool:
    has_swa = any(isinstance(layer, SlidingWindow) for layer in spec.layers)
    return has_swa and not disabled and spec.architecture not in SGLANG_NO_HYBRID_SWA


def windows_as_full(spec: ModelSpec) -> ModelSpec:
    """The same model with its sliding-window and chunked layers keeping every token, as an
    engine that does not drop out-of-window KV stores them."""
    types = {}
    for name, layer in spec.layer_types.items():
        if isinstance(layer, (SlidingWindow, ChunkedAttention)):
            layer = FullAttention(
                num_kv_heads=layer.num_kv_heads, head_dim=layer.head_dim, head_dim_v=layer.head_dim_v
            )
        types[name] = layer
    return ModelSpec.model_validate(
        {**spec.model_dump(), "layer_types": {k: v.model_dump() for k, v in types.items()}}
    )


def _sglang_cells(layers: list[Layer], fmt: Format, tp: int) -> tuple[int, int, int, bool]:
    """(K bytes, V bytes per token per layer-set, cache layers, MLA?) on one rank."""
    k_bits = v_bits = 0
    n = 0
    mla = False
    for layer in layers:
        if isinstance(layer, LatentAttention):
            k_bits += fmt.vector_bits(layer.latent_dim)
            mla = True
            n += 1
        elif isinstance(layer, FullAttention):
            heads = kv.kv_heads_per_rank(layer.num_kv_heads, tp)
            k_bits += heads * fmt.vector_bits(layer.head_dim)
            v_bits += heads * fmt.vector_bits(layer.v_dim)
            n += 1
        elif isinstance(layer, (RecurrentState, CompressedAttention)):
            raise EngineUnsupported("recurrent-state and compressed-KV layers are not modelled for SGLang")
    return ceil_div(k_bits, 8), ceil_div(v_bits, 8), n, mla


def sglang_report(
    stage_layer_lists: list[list[Layer]],
    fmt: Format,
    tp: int,
    page_size: int,
    stage_budgets: list[int],
    max_model_len: int,
    version: tuple[int, int],
    hybrid_swa: bool,
    swa_full_tokens_ratio: float,
    mem: SglangMemory,
) -> EngineReport:
    """SGLang's max_total_num_tokens and its KV-pool log line (engines.md, SGLang)."""
    best: tuple[int, int | None] | None = None
    best_stage = 0
    for s, (layers, budget) in enumerate(zip(stage_layer_lists, stage_budgets, strict=True)):
        k, v, n, _ = _sglang_cells(layers, fmt, tp)
        cell = k + v
        # engines.md: max_total_num_tokens = available // cell_size, floored to the page size
        tokens = budget // cell if cell else 0
        swa_tokens = None
        if hybrid_swa:
            n_swa = sum(1 for layer in layers if isinstance(layer, SlidingWindow))
            n_full = n - n_swa
            total = tokens * n
            # SGLang set_num_token_hybrid: swa * n_swa + full * n_full = total, swa = ratio * full
            full = int(total / (swa_full_tokens_ratio * n_swa + n_full))
            swa_tokens = int(full * swa_full_tokens_ratio) // page_size * page_size
            tokens = full
        tokens = tokens // page_size * page_size
        if best is None or tokens < best[0]:
            best, best_stage = (tokens, swa_tokens), s
    assert best is not None
    tokens, swa_tokens = best
    layers = stage_layer_lists[best_stage]
    lines = []
    dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}.get(
        fmt.name, "torch.float8_e5m2" if fmt.name == "fp8_e5m2" else "torch.float8_e4m3fn"
    )

    def pool(pool_layers: list[Layer], size: int) -> tuple[str, int, int]:
        """The pool's log line and its K and V buffer bytes (MLA: one KV buffer, V = 0)."""
        k, v, _, mla = _sglang_cells(pool_layers, fmt, tp)
        # SGLang allocates size + page_size slots (slot 0 is a padding slot); "GB" is 2**30 bytes
        slots = size + page_size
        if mla:
            line = (
                f"KV Cache is allocated. dtype: {dtype}, #tokens: {size}, KV size: {slots * k / GiB:.2f} GB"
            )
        else:
            line = (
                f"KV Cache is allocated. dtype: {dtype}, #tokens: {size}, "
                f"K size: {slots * k / GiB:.2f} GB, V size: {slots * v / GiB:.2f} GB"
            )
        return line, slots * k, slots * v

    if hybrid_swa and swa_tokens is not None:
        full_layers = [la for la in layers if not isinstance(la, SlidingWindow)]
        swa_layers = [la for la in layers if isinstance(la, SlidingWindow)]
        lines.append(
            f"Use sliding window memory pool. full_layer_tokens={tokens}, swa_layer_tokens={swa_tokens}"
        )
        line, k_bytes, v_bytes = pool(full_layers, tokens)
        lines += [line, pool(swa_layers, swa_tokens)[0]]
    else:
        line, k_bytes, v_bytes = pool(layers, tokens)
        lines.append(line)
    return EngineReport(
        engine="sglang",
        version=fmt_version(version),
        supported=True,
        num_blocks=tokens // page_size,
        kv_cache_tokens=tokens,
        # SGLang prints no concurrency; requests of max_model_len tokens that fit its pool
        max_concurrency=tokens / (ceil_div(max_model_len, page_size) * page_size),
        available_kv_bytes=min(stage_budgets),
        log_lines=lines,
        details={
            "mem_fraction_static": mem.mem_fraction_static,
            "mem_fraction_static_given": mem.given,
            "reserved_mib": mem.reserved_mib,
            "chunked_prefill_size": mem.chunked_prefill_size,
            "cuda_graph_max_bs": mem.cuda_graph_max_bs,
            "page_size": page_size,
            "hybrid_swa": hybrid_swa,
            "swa_full_tokens_ratio": swa_full_tokens_ratio if hybrid_swa else None,
            "swa_kv_cache_tokens": swa_tokens,
            "k_buffer_bytes": k_bytes,  # the (full-attention) pool's K buffer; MLA: the whole latent
            "v_buffer_bytes": v_bytes,
        },
    )


def unsupported(engine: str, version: tuple[int, int], reason: str) -> EngineReport:
    return EngineReport(engine=engine, version=fmt_version(version), supported=False, reason=reason)
