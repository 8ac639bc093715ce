"""SGLang's KV accounting: --mem-fraction-static, the token pool, the SWA pools, the lines it logs.

Sources (README, How the engines size their KV cache): SGLang 0.5.x, python/sglang/srt/server_args.py
(GPU memory settings) and python/sglang/srt/model_executor/model_runner.py (profile_max_num_token).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvplan.engines import sglang_memory
from kvplan.engines.base import (
    Budget,
    Engine,
    EngineReport,
    EngineUnsupported,
    SglangDetails,
    StageCache,
    Version,
    fmt_version,
)
from kvplan.engines.budget import Reserve
from kvplan.engines.sglang_memory import Release
from kvplan.errors import UsageError
from kvplan.formats import Format
from kvplan.model import kv
from kvplan.model.parallel import Sharding, has_nvls, plain_sharding, with_eplb_rule
from kvplan.request import SGLANG_REQ_RESERVE
from kvplan.specs.models import (
    CompressedAttention,
    CompressedLatent,
    CrossAttention,
    FullAttention,
    GpuSpec,
    LatentAttention,
    Layer,
    ModelSpec,
    RecurrentState,
    SlidingWindow,
)
from kvplan.units import GiB, MiB, ceil_div, fmt_gib, plural

# server_args.py _handle_speculative_decoding (0.5.x): --max-running-requests when not given under speculative decoding
SPECULATIVE_MAX_RUNNING = 48

# DeepSeek-V4's pools (window, C4, C128, compress-state rings) are sized by DSV4PoolConfigurator
# from --swa-full-tokens-ratio and max_running_requests (model_executor/pool_configurator.py)
V4_UNSUPPORTED = (
    "SGLang sizes DeepSeek-V4's window, C4/C128 and compress-state pools with DSV4PoolConfigurator "
    "(python/sglang/srt/model_executor/pool_configurator.py); not modelled, kvplan's own figure stands"
)

SHARED_INDEXER_UNSUPPORTED = (
    "layers that share another layer's DSA indexer (GLM-5.2 indexer_types 'shared'): SGLang's "
    "indexer pool for them is not established here; kvplan's own figure stands"
)

# SGLang server_args: --swa-full-tokens-ratio default
SWA_FULL_TOKENS_RATIO = 0.8
# server_args.py --mamba-full-memory-ratio default: state pool / full-attention KV pool
MAMBA_FULL_MEMORY_RATIO = 0.9
# model_runner.py MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO: state slots a request may need
# with the radix cache on (the running one and its cached prefixes)
MAMBA_SLOTS_PER_REQUEST = 3

# SGLang disables its hybrid SWA pool for these architectures (server_args, 0.5.x).
NO_HYBRID_SWA = {
    "GptOssForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration",
}


@dataclass(frozen=True)
class SglangMemory:
    mem_fraction_static: float
    given: bool
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    reserved_mib: float | None  # the reserve behind the default fraction
    source: str | None = None  # the release's rule behind the default fraction


# server_args.py: --max-prefill-tokens default; what the activation reserve is sized by when
# --chunked-prefill-size -1 turns chunking off
MAX_PREFILL_TOKENS = 16384


def _chunk_and_graph_bs(gpu_mib: float, tp: int) -> tuple[int, int]:
    """server_args.py _handle_gpu_memory_settings: chunked_prefill_size and cuda_graph_max_bs by card
    size. Not re-read by release: the 0.5.3-0.5.13 wheels give cuda_graph_max_bs 8 under 20 GiB, and
    16 (0.5.3-0.5.5) or 24 (0.5.6+) with TP < 4 at 20-35 GiB."""
    if gpu_mib < 20 * 1024:
        return 2048, 16 if tp < 4 else 64
    if gpu_mib < 35 * 1024:
        return 2048, 24 if tp < 4 else 80
    if gpu_mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def memory_settings(
    memory_bytes: int,
    tp: int,
    pp: int,
    mem_fraction_static: float | None = None,
    chunked_prefill_size: int | None = None,
    release: Release | None = None,
    dp_attention: int = 1,
    vit: list[int] | None = None,
) -> SglangMemory:
    """SGLang's default --mem-fraction-static for this card and release (None: the newest rule).
    From 0.5.3 (server_args.py _handle_gpu_memory_settings): chunked_prefill_size and cuda_graph_max_bs
    by card size where not given, then a reserve sized by them; earlier: sglang_memory.legacy_fraction."""
    gpu_mib = memory_bytes / MiB
    newest = sglang_memory.is_newest_rule(release)
    if newest or release is None:
        chunk, graph_bs = _chunk_and_graph_bs(gpu_mib, tp)
    else:
        chunk, graph_bs = sglang_memory.legacy_chunk_and_graph_bs(release, gpu_mib, tp)
    chunk = chunk if chunked_prefill_size is None else chunked_prefill_size
    if mem_fraction_static is not None:
        return SglangMemory(mem_fraction_static, True, chunk, graph_bs, None)
    if not newest and release is not None:
        fraction, reserved_mib, source = sglang_memory.legacy_fraction(release, gpu_mib, tp, pp)
    else:
        # reserved MiB: metadata 512 + activations 1.5 x chunk (chunking off: x --max-prefill-tokens)
        # + CUDA graphs 2 x max bs + parallelism
        prefill = chunk if chunk > 0 else MAX_PREFILL_TOKENS
        reserved_mib = 512 + max(prefill, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
        if dp_attention > 1:  # server_args.py 0.5.3+: DP attention's padding, more for large graph batches
            reserved_mib += graph_bs * dp_attention * 3 + (
                graph_bs * dp_attention * 1.5 if graph_bs > 300 else 0
            )
        if gpu_mib > 60 * 1024:
            reserved_mib = max(reserved_mib, 10 * 1024)
        source = "server_args.py 0.5.3+: (card - reserve from chunked_prefill_size, cuda_graph_max_bs) / card"
        fraction = round((gpu_mib - reserved_mib) / gpu_mib, 3)
    if vit is not None and (release is None or release >= VLM_FRACTION_FROM):
        factor = vlm_fraction_factor(*vit)
        fraction, source = fraction * factor, f"{source}; x {factor:.4f} {VLM_FRACTION_SOURCE}"
    return SglangMemory(fraction, False, chunk, graph_bs, reserved_mib, source)


# server_args.py v0.5.2 adjust_mem_fraction_for_vlm (arg_groups/memory_hook.py by 0.5.23, unchanged where the
# pool is sized before graph capture): a multimodal model's default fraction x 0.95 x clamp(1 - 0.1 x
# (layers x hidden^2 / (24 x 1024^2) - 1), 0.8, 1.05), from its vision_config (ViT-L/14 as the baseline)
VLM_FRACTION_FROM: Release = (0, 5, 2, 0)
VLM_FRACTION_SOURCE = "for the vision encoder (server_args.py v0.5.2 adjust_mem_fraction_for_vlm)"


def vlm_fraction_factor(layers: int, hidden: int) -> float:
    """What SGLang multiplies a multimodal model's default --mem-fraction-static by."""
    ratio = layers * hidden**2 / (24 * 1024**2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def startup_bytes(gpu: GpuSpec, tp: int, pp: int) -> int:
    """Estimated memory already taken when SGLang reads the free memory it calls total."""
    return sglang_memory.startup_bytes(tp, pp, has_nvls(gpu), gpu.vendor == "amd")


def hybrid_swa(spec: ModelSpec, disabled: bool) -> bool:
    has_swa = any(isinstance(layer, SlidingWindow) for layer in spec.layers)
    return has_swa and not disabled and spec.architecture not in NO_HYBRID_SWA


def _cells(layers: Sequence[Layer], fmt: Format, tp: int) -> tuple[int, int, int, bool]:
    """(K bytes, V bytes per token per layer-set, cache layers, MLA?) on one rank."""
    k_bits = v_bits = 0
    n = 0
    mla = False
    if kv.mixed_indexers(layers):
        raise EngineUnsupported(SHARED_INDEXER_UNSUPPORTED)
    for layer in layers:
        if isinstance(layer, CompressedLatent):
            raise EngineUnsupported(V4_UNSUPPORTED)
        if isinstance(layer, LatentAttention):
            # DSA: fp8 is the 656-B scaled layout (calculate_mla_kv_cache_dim)
            k_bits += kv.latent_bits(layer, fmt)
            mla = True
            n += 1
        elif isinstance(layer, FullAttention):
            heads = kv.kv_heads_per_rank(layer.num_kv_heads, tp)
            k_bits += heads * fmt.vector_bits(layer.head_dim)
            v_bits += heads * fmt.vector_bits(layer.v_dim)
            n += 1
        elif isinstance(layer, CompressedAttention):
            raise EngineUnsupported("compressed-KV layers are not modelled for SGLang")
        elif isinstance(layer, CrossAttention):
            raise EngineUnsupported("cross-attention layers (image K/V) are not modelled for SGLang")
    return ceil_div(k_bits, 8), ceil_div(v_bits, 8), n, mla


@dataclass(frozen=True)
class MambaPool:
    """SGLang's recurrent-state pool (mem_cache/memory_pool.py MambaPool) on one GPU."""

    slots: int  # max_mamba_cache_size: sequences whose state it holds
    conv_bytes_per_request: int  # all state layers of the stage
    ssm_bytes_per_request: int

    @property
    def bytes_per_request(self) -> int:
        return self.conv_bytes_per_request + self.ssm_bytes_per_request

    def max_running_requests(self, radix: bool = True) -> int:
        return state_running_cap(self.slots, radix)


def max_running_requests(pool_tokens: int, context_len: int, given: int | None) -> int:
    """The requests one scheduler runs at once: tp_worker.py min(--max-running-requests (already // dp_size under
    DP attention), else max_total_num_tokens // 2, the request pool); model_runner.py sizes the request pool
    min(max(pool / context_len x 512, 2048), 4096) (0.5.x)."""
    req_pool = min(max(int(pool_tokens / max(context_len, 1) * 512), 2048), 4096)
    return max(1, min(pool_tokens // 2 if given is None else given, req_pool))


def state_running_cap(slots: int, radix: bool) -> int:
    """model_runner.py: max_num_reqs <= max_mamba_cache_size // 3 with the radix cache on (a request may hold
    3 state slots), // 1 with it off: the requests SGLang runs at once for a model with recurrent states (0: it
    refuses to start, tp_worker.py asserting "max_running_request is zero")."""
    return slots // (MAMBA_SLOTS_PER_REQUEST if radix else 1)


def _mamba_pool(
    layers: list[Layer], budget: int, tp: int, radix_off_cap: int | None = None
) -> MambaPool | None:
    """model_runner_kv_cache_mixin.py handle_max_mamba_cache: the rest memory R is split so that
    state memory / full-attention KV memory = --mamba-full-memory-ratio (0.9): R x r / (1 + r). With the
    radix cache off and --max-running-requests given, the pool holds one slot per running request
    (max_mamba_cache_size = max_running_requests // the DP-attention ranks), no more than that split holds."""
    states = [la for la in layers if isinstance(la, RecurrentState)]
    if not states:
        return None
    parts = [
        kv.state_parts_per_rank(la, tp) if la.mixer != "fixed" else (0, kv.layer_state_bytes(la, tp))
        for la in states
    ]
    conv, ssm = sum(p[0] for p in parts), sum(p[1] for p in parts)
    ratio = MAMBA_FULL_MEMORY_RATIO
    slots = int(budget * ratio / (1 + ratio) // (conv + ssm)) if conv + ssm else 0
    if radix_off_cap is not None:
        slots = min(slots, radix_off_cap)
    return MambaPool(slots, conv, ssm)


def _cell_bytes(layers: Sequence[Layer], fmt: Format, tp: int) -> int:
    """Bytes of one token in the stage's KV pool on one GPU (model_runner.py get_cell_size_per_token)."""
    k, v, _, _ = _cells(layers, fmt, tp)
    # DSA models add the indexer key per layer (index_head_dim + index_head_dim // 128 * 4)
    return k + v + ceil_div(sum(kv.indexer_bits(layer) for layer in layers), 8)


def _pool_tokens(
    layers: list[Layer],
    budget: int,
    fmt: Format,
    tp: int,
    page: int,
    swa: bool,
    ratio: float,
    max_total_tokens: int | None = None,
    radix_off_cap: int | None = None,
):
    """(full-attention pool tokens, SWA pool tokens or None, state pool or None) of one stage."""
    mamba = _mamba_pool(layers, budget, tp, radix_off_cap)
    if mamba is not None:
        budget -= mamba.slots * mamba.bytes_per_request  # the KV pool gets the rest
    _, _, n, _ = _cells(layers, fmt, tp)
    cell = _cell_bytes(layers, fmt, tp)
    # README, How the engines size their KV cache: max_total_num_tokens = available // cell_size, floored to the page size
    tokens = budget // cell if cell else 0
    if max_total_tokens is not None:
        # model_runner.py: --max-total-tokens caps the profiled figure before the page floor
        tokens = min(tokens, max_total_tokens)
    swa_tokens = None
    if swa:
        n_swa = sum(1 for layer in layers if isinstance(layer, SlidingWindow))
        n_full = n - n_swa
        total = tokens * n
        # SGLang set_num_token_hybrid: swa * n_swa + full * n_full = total, swa = ratio * full
        full = int(total / (ratio * n_swa + n_full))
        swa_tokens = int(full * ratio) // page * page
        tokens = full
    return tokens // page * page, swa_tokens, mamba


def _torch_dtype(fmt: Format) -> str:
    return {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}.get(
        fmt.name, "torch.float8_e5m2" if fmt.name == "fp8_e5m2" else "torch.float8_e4m3fn"
    )


def _pool_line(layers: Sequence[Layer], size: int, fmt: Format, tp: int, page: int) -> tuple[str, int, int]:
    """The pool's log line and its K and V buffer bytes (MLA: one KV buffer, V = 0; DSA: the indexer's
    key buffer counted in it)."""
    k, v, _, mla = _cells(layers, fmt, tp)
    # SGLang allocates size + page_size slots (slot 0 is a padding slot); "GB" is 2**30 bytes
    slots = size + page
    head = f"KV Cache is allocated. dtype: {_torch_dtype(fmt)}, #tokens: {size}, "
    if mla:
        # the whole cell: a DSA pool's KV size adds the indexer's key buffers, a slot each per layer
        # (mem_cache/memory_pool.py v0.5.23 DSATokenToKVPool.get_kv_size_bytes; NSATokenToKVPool in v0.5.8 logs)
        k = _cell_bytes(layers, fmt, tp)
        return head + f"KV size: {slots * k / GiB:.2f} GB", slots * k, 0
    return head + f"K size: {slots * k / GiB:.2f} GB, V size: {slots * v / GiB:.2f} GB", slots * k, slots * v


def request_limits(context_len: int, max_total_num_tokens: int) -> tuple[int, int]:
    """(max_req_len, max_req_input_len): the longest request SGLang serves and the longest prompt
    its scheduler takes. managers/tp_worker.py: max_req_len = min(context_len - 1,
    max_total_num_tokens - 1), max_req_input_len = max_req_len - 5; SGLang starts whenever both are
    > 0 ("Memory pool size is too small" otherwise), so a pool smaller than one request caps it."""
    max_req_len = min(context_len - 1, max_total_num_tokens - 1)
    return max_req_len, max_req_len - SGLANG_REQ_RESERVE


def sglang_report(
    stage_layer_lists: list[list[Layer]],
    fmt: Format,
    tp: int,
    page_size: int,
    stage_budgets: list[int],
    max_model_len: int,
    version: Version,
    swa: bool,
    swa_full_tokens_ratio: float,
    mem: SglangMemory,
    max_total_tokens: int | None = None,
    radix: bool = True,
    running_cap: int | None = None,
) -> EngineReport:
    """SGLang's max_total_num_tokens and its KV-pool log line (README, How the engines size their KV cache).
    `running_cap`: --max-running-requests as one attention rank takes it (it sizes the state pool with the
    radix cache off)."""
    radix_off_cap = running_cap if not radix else None
    pools = [
        _pool_tokens(
            layers, budget, fmt, tp, page_size, swa, swa_full_tokens_ratio, max_total_tokens, radix_off_cap
        )
        for layers, budget in zip(stage_layer_lists, stage_budgets, strict=True)
    ]
    best_stage = min(range(len(pools)), key=lambda s: pools[s][0])  # the first stage with the fewest
    tokens, swa_tokens, mamba = pools[best_stage]
    layers = stage_layer_lists[best_stage]
    lines = []
    if mamba is not None:
        n = mamba.slots + 1  # memory_pool.py: one more (padding) slot
        lines.append(
            f"Mamba Cache is allocated. max_mamba_cache_size: {mamba.slots}, conv_state size: "
            f"{n * mamba.conv_bytes_per_request / GiB:.2f}GB, ssm_state size: {n * mamba.ssm_bytes_per_request / GiB:.2f}GB"
        )
    if swa and swa_tokens is not None:
        full_layers = [la for la in layers if not isinstance(la, SlidingWindow)]
        swa_layers = [la for la in layers if isinstance(la, SlidingWindow)]
        lines.append(
            f"Use sliding window memory pool. full_layer_tokens={tokens}, swa_layer_tokens={swa_tokens}"
        )
        line, k_bytes, v_bytes = _pool_line(full_layers, tokens, fmt, tp, page_size)
        lines += [line, _pool_line(swa_layers, swa_tokens, fmt, tp, page_size)[0]]
    else:
        line, k_bytes, v_bytes = _pool_line(layers, tokens, fmt, tp, page_size)
        lines.append(line)
    details = SglangDetails(
        mem_fraction_static=mem.mem_fraction_static,
        mem_fraction_static_given=mem.given,
        reserved_mib=mem.reserved_mib,
        chunked_prefill_size=mem.chunked_prefill_size,
        cuda_graph_max_bs=mem.cuda_graph_max_bs,
        page_size=page_size,
        hybrid_swa=swa,
        swa_full_tokens_ratio=swa_full_tokens_ratio if swa else None,
        swa_kv_cache_tokens=swa_tokens,
        k_buffer_bytes=k_bytes,
        v_buffer_bytes=v_bytes,
        mamba_cache_slots=mamba.slots if mamba else None,
        mamba_state_bytes_per_request=mamba.bytes_per_request if mamba else None,
        max_total_tokens=max_total_tokens,
        max_req_len=request_limits(max_model_len, tokens)[0],
        max_req_input_len=request_limits(max_model_len, tokens)[1],
    )
    # a request longer than the pool is capped to max_req_len tokens (request_limits)
    request_tokens = min(max_model_len, max(tokens - 1, 1))
    per_request_tokens = ceil_div(request_tokens, page_size) * page_size
    concurrency = tokens / per_request_tokens
    if mamba is not None:  # requests also need state slots: 3 a request with the radix cache, else 1
        concurrency = min(concurrency, mamba.max_running_requests(radix))
    return EngineReport(
        engine="sglang",
        version=fmt_version(version),
        supported=True,
        num_blocks=tokens // page_size,
        kv_cache_tokens=tokens,
        # SGLang prints no concurrency; requests of max_model_len tokens that fit its pools
        max_concurrency=concurrency,
        available_kv_bytes=min(stage_budgets),
        log_lines=lines,
        details=details,
    )


def _logged_pool_bytes(facts: dict[str, Any], pred: Any) -> int | None:
    """The KV pool's bytes as the log prints them ('K size: 1.42 GB, V size: 1.42 GB' or 'KV size'; SGLang's GB
    are GiB), for a model with one pool of per-token layers (windowed or state pools print lines of their own)."""
    if pred.kv_bytes_per_sequence_windowed_cap or pred.kv_bytes_per_request_fixed:
        return None
    if facts.get("k_size_bytes") is not None and facts.get("v_size_bytes") is not None:
        return int(facts["k_size_bytes"] + facts["v_size_bytes"])
    if facts.get("kv_size_bytes") is not None:
        return int(facts["kv_size_bytes"])
    return None


class Sglang(Engine):
    name = "sglang"
    display_name = "SGLang"
    latest = (0, 5)
    null_blocks = (
        0  # README, How the engines size their KV cache: SGLang's padding slot lies outside its pool
    )
    own_flags = {
        "--mem-fraction-static": "mem_fraction_static",
        "--disable-hybrid-swa-memory": "disable_hybrid_swa_memory",
        "--swa-full-tokens-ratio": "swa_full_tokens_ratio",
        "--max-total-tokens": "max_total_tokens",
        "--max-running-requests": "max_running_requests",
        "--chunked-prefill-size": "chunked_prefill_size",
        "--enable-dp-attention": "enable_dp_attention",
        "--ep-size": "ep_size",
        "--moe-a2a-backend": "moe_a2a_backend",
    }
    own_flag_defaults = {"swa_full_tokens_ratio": SWA_FULL_TOKENS_RATIO}
    launch_command = "python -m sglang.launch_server --model-path {model}"
    launch_flags = ("--tp-size", "--pp-size", "--dp-size", "--context-length", "--max-running-requests")

    memory: SglangMemory | None = None
    profiled_tokens: int | None = None  # the pool before --max-total-tokens (fewest over stages)

    @classmethod
    def auto_dtype(cls, spec: ModelSpec, version: Version, gpu: GpuSpec) -> tuple[str, str | None]:
        # python/sglang/srt/configs/model_config.py _get_and_verify_dtype: "auto" serves a float32
        # checkpoint in float16 ("Following the common practice")
        if spec.config_dtype == "fp32":
            return "fp16", "--dtype auto: SGLang serves a float32 checkpoint in float16"
        return spec.activation_dtype, None

    @property
    def release(self) -> Release | None:
        """The release to the patch (--engine-version 0.4.3.post4); SGLang's defaults change within a minor."""
        return sglang_memory.parse_release(self.req.engine_version)

    def request_cap(self, attn_dp: int = 1) -> int | None:
        # managers/tp_worker.py: max_running_requests = min(--max-running-requests, the request pool); under DP
        # attention each rank's scheduler takes --max-running-requests // dp_size (model_runner.py, 0.5.x)
        caps = [c for c in (self.req.max_num_seqs, self.req.max_running_requests) if c is not None]
        if caps and min(caps) // attn_dp < 1:
            raise UsageError(
                f"--max-running-requests {min(caps):,} over {attn_dp} attention-DP ranks gives 0 a rank: SGLang "
                f"refuses to start (tp_worker.py: 'max_running_request is zero'); give at least {attn_dp}"
            )
        return min(caps) // attn_dp if caps else None

    def running_cap(self, pool_tokens: int, max_len: int, attn_dp: int = 1) -> tuple[int, str, bool]:
        given = self.request_cap(attn_dp)
        cap = max_running_requests(pool_tokens, max_len, given)
        if given is not None and cap == given:
            return cap, "--max-running-requests", True
        if cap < (pool_tokens // 2 if given is None else given):  # the request pool binds: no flag lifts it
            return cap, "SGLang's request pool (model_runner.py: at most 4,096 requests)", False
        return cap, "SGLang's default max_running_requests, the pool's tokens // 2 (tp_worker.py)", True

    def oversized_request(self, max_len: int, fitting_len: int | None) -> tuple[int, str] | None:
        # the pool holds `fitting_len` tokens (SGLang has no null block); tp_worker.py asserts
        # max_req_len > 0 and max_req_input_len > 0 ("Memory pool size is too small")
        limit, prompt = request_limits(max_len, fitting_len or 0)
        if prompt <= 0:
            return None
        return limit, (
            f"SGLang starts although one request of --context-length {max_len:,} tokens does not fit its "
            f"KV pool of {fitting_len:,} tokens: it caps each request at max_req_len {limit:,} tokens "
            f"(prompts at {prompt:,}; longer ones are refused unless --allow-auto-truncate; "
            "managers/tp_worker.py, managers/scheduler.py)"
        )

    def kv_budget_cap(self, kv_bytes: int, layers: list[Layer], fmt: Format, tp: int) -> int:
        cap = self.req.max_total_tokens
        if cap is None:
            return kv_bytes
        try:
            cell = _cell_bytes(layers, fmt, tp)
        except EngineUnsupported:
            return kv_bytes  # no SGLang pool modelled: the cap has nothing to act on
        if not cell:
            return kv_bytes
        profiled = kv_bytes // cell
        self.profiled_tokens = (
            profiled if self.profiled_tokens is None else min(self.profiled_tokens, profiled)
        )
        return min(kv_bytes, cap * cell)

    def defaults_applied(self) -> dict[str, Any]:
        mem = self.memory
        if mem is None:
            return {}
        out: dict[str, Any] = {"cuda_graph_max_bs": mem.cuda_graph_max_bs}
        if self.req.chunked_prefill_size is None:
            out["chunked_prefill_size"] = mem.chunked_prefill_size
        if not mem.given:
            out["mem_fraction_static"] = mem.mem_fraction_static
            out["mem_fraction_static_source"] = mem.source
        return out

    @property
    def dp_attention_size(self) -> int:
        """Attention-DP ranks: --dp-size under --enable-dp-attention (server_args.py turns DP attention
        off at --dp-size 1), else 1."""
        dp = self.req.data_parallel_size or 1
        return dp if self.req.enable_dp_attention and dp > 1 else 1

    def sharding(self, spec: ModelSpec, tp: int) -> Sharding:
        req = self.req
        out = sglang_sharding(spec, tp, self.dp_attention_size, req.ep_size, req.moe_a2a_backend,
                              req.num_redundant_experts)  # fmt: skip
        if req.speculative is not None and req.speculative.method == "ngram" and self.dp_attention_size > 1:
            # server_args.py _handle_speculative_decoding: 'Currently ngram speculative decoding does not support dp
            # attention.'
            raise UsageError(
                "--speculative-algorithm NGRAM: SGLang does not run n-gram speculative decoding under DP attention "
                "('Currently ngram speculative decoding does not support dp attention', server_args.py)"
            )
        if req.enable_eplb and out.ep <= 1:
            # server_args.py _handle_eplb_and_dispatch: assert self.ep_size > 1
            raise UsageError(
                "--enable-eplb needs expert parallelism (SGLang asserts ep_size > 1): give --ep-size"
            )
        return with_eplb_rule(out, req.enable_eplb, req.moe_imbalance)

    @property
    def swa_ratio(self) -> float:
        ratio = self.req.swa_full_tokens_ratio
        return SWA_FULL_TOKENS_RATIO if ratio is None else ratio

    @classmethod
    def log_settings(cls, facts: dict[str, Any]) -> dict[str, Any]:
        out = {
            "mem_fraction_static": facts.get("mem_fraction_static"),
            "disable_hybrid_swa_memory": facts.get("disable_hybrid_swa_memory", False),
        }
        if "swa_full_tokens_ratio" in facts:
            out["swa_full_tokens_ratio"] = facts["swa_full_tokens_ratio"]
        for key in ("max_total_tokens", "chunked_prefill_size"):  # ServerArgs(...)
            if facts.get(key) is not None:
                out[key] = facts[key]
        return out

    @classmethod
    def arithmetic_budget(cls, facts: dict[str, Any], pred: Any) -> tuple[dict[str, Any], int] | None:
        found = super().arithmetic_budget(facts, pred)
        if found is not None:
            return found
        if (sizes := _logged_pool_bytes(facts, pred)) is not None:
            # K and V sizes are printed to 0.01 "GB" (GiB) each: up to 0.01 GiB of tokens either way
            per_token = pred.kv_bytes_per_token_per_gpu or 1
            return {"kv_cache_memory_bytes": sizes}, math.ceil(0.01 * GiB / per_token)
        # a log with its token count alone (no K/V sizes) gives no KV figure of its own: its tokens
        # through kvplan's bytes per token and back would only check the count against itself
        return None

    @classmethod
    def logged_kv_bytes(cls, facts: dict[str, Any], pred: Any) -> int | None:
        found = super().logged_kv_bytes(facts, pred)
        if found is not None:
            return found
        if (sizes := _logged_pool_bytes(facts, pred)) is not None:
            return sizes
        if facts.get("kv_cache_tokens"):
            return int(facts["kv_cache_tokens"] * pred.kv_bytes_per_token_per_gpu)
        return None

    @classmethod
    def logged_kv_derived(cls, facts: dict[str, Any], pred: Any) -> bool:
        return (
            facts.get("available_kv_bytes") is None
            and _logged_pool_bytes(facts, pred) is None
            and bool(facts.get("kv_cache_tokens"))
        )

    @classmethod
    def measured_reserve(
        cls, facts: dict[str, Any], pred: Any, logged_kv: int
    ) -> tuple[int, str, str | None]:
        if facts.get("free_at_start_bytes") is not None:  # SGLang logs its free memory before loading
            return pred.memory_bytes_per_gpu - facts["free_at_start_bytes"], "memory in use at startup", None
        mfs = pred.settings.mem_fraction_static
        measured = round(pred.memory_bytes_per_gpu - (logged_kv + pred.weight_bytes_per_gpu) / mfs)
        return measured, "memory in use at startup", None

    def check_flags(self) -> None:
        mfs = self.req.mem_fraction_static
        if mfs is not None and not 0 < mfs < 1:
            raise UsageError(f"--mem-fraction-static must be in (0, 1), got {mfs}")
        if not 0 < self.swa_ratio <= 1:
            raise UsageError(f"--swa-full-tokens-ratio must be in (0, 1], got {self.swa_ratio}")

    def block_size(self, spec: ModelSpec, gpu: GpuSpec) -> tuple[int, str | None]:
        return 1, "SGLang page size 1 (its default; FlashMLA forces 64: pass --block-size 64)"

    def state_dtypes(self, spec: ModelSpec, layer: RecurrentState) -> tuple[str, str, str | None]:
        # configs/mamba_utils.py mamba2_state_dtype: conv bf16 (SGLANG_MAMBA_CONV_DTYPE), SSM
        # --mamba-ssm-dtype, default float32, overridden by the config's mamba_ssm_dtype
        conv = layer.conv_dtype if layer.conv_dtype != "auto" else "bf16"
        if self.req.mamba_ssm_dtype:
            return conv, self.req.mamba_ssm_dtype, None
        if layer.ssm_dtype != "auto":
            return conv, layer.ssm_dtype, None
        return conv, "fp32", "SGLang's default --mamba-ssm-dtype is float32"

    def windows_kept(self, spec: ModelSpec) -> str | None:
        if hybrid_swa(spec, self.req.disable_hybrid_swa_memory):
            return None
        if self.req.disable_hybrid_swa_memory:
            return "--disable-hybrid-swa-memory"
        return f"SGLang has no windowed pool for {spec.architecture or 'this model'}"

    def budget(self, spec: ModelSpec, gpu: GpuSpec, tp: int, pp: int) -> Budget:
        # a vision encoder kvplan has no tower for: SGLang loads its weights, kvplan does not count them
        self.vision_uncounted = bool(spec.vision_encoder) and spec.vision_tower is None
        self.memory = mem = memory_settings(
            gpu.memory_bytes,
            tp,
            pp,
            self.req.mem_fraction_static,
            self.req.chunked_prefill_size,
            self.release,
            self.dp_attention_size,
            spec.vision_vit,
        )
        given = self.req.reserve_bytes
        reserve = (
            Reserve(given, 0, 0, 0, given=True)
            if given is not None
            else Reserve(0, 0, startup_bytes(gpu, tp, pp), 0, False)
        )
        # SGLang (model_runner.py profile_max_num_token): available = free_after_weights - free_at_start x (1 - mem_fraction_static)
        requested = math.floor((gpu.memory_bytes - reserve.total) * mem.mem_fraction_static)
        # what loading takes beside the parameters comes out of free_after_weights
        loading = sglang_memory.WEIGHT_LOAD_BYTES if given is None else 0
        label = f"{gpu.name} x mem-fraction-static {mem.mem_fraction_static:g}"
        return Budget(
            requested - loading, reserve, False, None, mem.mem_fraction_static, label, loading_bytes=loading
        )

    def budget_notes(self, budget: Budget, gpu: GpuSpec, tp: int, pp: int) -> list[str]:
        r = budget.reserve
        if r.given:
            source = f" ({self.req.reserve_source})" if self.req.reserve_source else ""
            notes = [f"memory in use at startup per GPU given as {fmt_gib(r.total)}{source}"]
        else:
            amd = gpu.vendor == "amd"
            what = ("HIP context, RCCL" if amd else "CUDA context, NCCL") if tp * pp > 1 else (
                "HIP context" if amd else "CUDA context")  # fmt: skip
            seen = f" ({sglang_memory.ROCM_STARTUP_SOURCE})" if amd else ""
            notes = [
                f"memory in use when SGLang starts ({what}) estimated at {fmt_gib(r.total)} per GPU{seen}, and "
                f"{fmt_gib(sglang_memory.WEIGHT_LOAD_BYTES)} taken by weight loading beside the parameters; "
                "override with --reserve-memory or calibrate with check-log"
            ]
        mem = self.memory
        if mem is not None and not mem.given:
            reserves = f", reserves {mem.reserved_mib:,.0f} MiB" if mem.reserved_mib is not None else ""
            notes.append(
                f"--mem-fraction-static {mem.mem_fraction_static:g}: SGLang's default for "
                f"{gpu.memory_bytes / GiB:,.1f} GiB and TP {tp} x PP {pp} ({mem.source}{reserves})"
            )
        notes += self._release_notes()
        if getattr(self, "vision_uncounted", False):
            notes.append(
                "WARNING: kvplan does not count this model's vision tower weights, which SGLang loads beside the "
                "language model, so the KV memory here is an upper bound: give --reserve-memory, or run check-log "
                "on a startup log"
            )
        return notes

    def _release_notes(self) -> list[str]:
        text, release = self.req.engine_version, self.release
        if self.memory is None or self.memory.given:
            return []
        if (
            release is not None
            and text is not None
            and text.count(".") == 1
            and release[:2] in ((0, 4), (0, 5))
        ):
            return [
                f"--engine-version {text} reads as {text}.0; SGLang's default --mem-fraction-static changed "
                "within 0.4 (0.4.6, 0.4.6.post2, 0.4.7.post1) and 0.5 (0.5.3): give the release, e.g. 0.4.3.post4"
            ]
        if release is None or release >= sglang_memory.PIECEWISE_GRAPHS:
            return [
                "SGLang 0.5.10+ also reserves memory for piecewise CUDA graphs and 0.5.16+ can size the pool "
                "after graph capture; not modelled (the 0.5.3 rule applied)"
            ]
        return []

    def budget_formula(self, budget: Budget, gpu: GpuSpec) -> tuple[str, str]:
        return (
            "(memory - in use at startup) x mem_fraction_static - weights",
            f"{gpu.name} memory_bytes {gpu.memory_bytes:,}; mem_fraction_static {budget.mem_fraction_static:g}; "
            "SGLang python/sglang/srt/model_executor/model_runner.py at v0.5.0",
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
        _cells(
            layers, fmt, tp
        )  # the draft has a pool of its own (plan._draft_pool)  # refuses layer kinds SGLang's pool is not modelled for

    def report(
        self, stages: list[StageCache], fmt: Format, block_size: int, tp: int, max_len: int
    ) -> EngineReport:
        if self.memory is None:
            raise EngineUnsupported("no SGLang memory settings")
        report = sglang_report(
            [s.layers for s in stages],
            fmt,
            tp,
            block_size,
            [s.kv_budget_bytes for s in stages],
            max_len,
            self.version,
            hybrid_swa(self.req.model, self.req.disable_hybrid_swa_memory),
            self.swa_ratio,
            self.memory,
            self.req.max_total_tokens,
            self.req.enable_prefix_caching,
            self.request_cap(self.dp_attention_size),
        )
        dp = self.dp_attention_size
        if dp > 1 and isinstance(report.details, SglangDetails):
            # server_args.py 0.5.x _handle_data_parallelism: chunked_prefill_size //= dp_size, with this warning;
            # each attention-DP rank then logs its own max_total_num_tokens (the pool above is one rank's)
            chunk = report.details.chunked_prefill_size
            chunk = chunk // dp if chunk > 0 else chunk
            line = f"DP attention is enabled. The chunked prefill size is adjusted to {chunk} to avoid MoE kernel issues. "
            report = dataclasses.replace(
                report,
                details=dataclasses.replace(report.details, chunked_prefill_size=chunk),
                log_lines=[line, *report.log_lines],
            )
        cap, profiled = self.req.max_total_tokens, self.profiled_tokens
        if cap is None or profiled is None or cap <= profiled:
            return report
        # model_runner.py logs this and keeps the profiled figure
        line = f"max_total_tokens={cap} is larger than the profiled value {profiled}. Use the profiled value instead."
        return dataclasses.replace(report, log_lines=[line, *report.log_lines])

    def differences(self, report: EngineReport, kvplan_concurrency: int) -> list[str]:
        notes = []
        d = report.details
        if isinstance(d, SglangDetails) and d.hybrid_swa:
            notes.append(
                f"SGLang splits its pool into full-attention and sliding-window pools "
                f"(--swa-full-tokens-ratio {d.swa_full_tokens_ratio:g}); kvplan pools all layers together"
            )
        if isinstance(d, SglangDetails) and d.mamba_cache_slots is not None:
            notes.append(
                f"SGLang keeps recurrent states in a pool of their own ({plural(d.mamba_cache_slots, 'sequence')}, "
                f"--mamba-full-memory-ratio {MAMBA_FULL_MEMORY_RATIO:g}; {MAMBA_SLOTS_PER_REQUEST} per running "
                "request with the radix cache); kvplan pools states with the KV"
            )
        notes.append("SGLang prints no concurrency; kvplan's figure is its pool tokens / max-model-len")
        return notes


# --moe-a2a-backend values (python/sglang/srt/server_args.py, 0.5.x) and those that set ep_size = tp_size
A2A_BACKENDS = ("none", "deepep", "mooncake", "flashinfer")
A2A_FORCES_EP = ("deepep", "mooncake", "flashinfer")


def sglang_sharding(
    spec: ModelSpec, tp: int, dp_attn: int, ep_size: int | None, backend: str | None, redundant: int
) -> Sharding:
    """SGLang's placement: attention over tp / dp GPUs under --enable-dp-attention, routed experts over
    --ep-size GPUs (each sliced over tp / ep), the input embedding replicated under DP attention."""
    experts = spec.moe.num_experts if spec.moe is not None else 0
    rules: list[str] = []
    if backend is not None and backend not in A2A_BACKENDS:
        raise UsageError(f"--moe-a2a-backend must be {', '.join(A2A_BACKENDS)}, got {backend!r}")
    ep = ep_size or 1
    if backend in A2A_FORCES_EP:
        # server_args.py 0.5.x: `if self.moe_a2a_backend == "deepep": self.ep_size = self.tp_size` (mooncake too)
        rules.append(
            f"--moe-a2a-backend {backend}: SGLang sets --ep-size to --tp-size {tp} (server_args.py 0.5.x)"
        )
        ep = tp
    elif backend is not None:
        rules.append(f"--moe-a2a-backend {backend}: the MoE layer keeps its all-reduce (no all-to-all)")
    if dp_attn > 1 and tp % dp_attn:
        # server_args.py 0.5.x _handle_data_parallelism: assert self.tp_size % self.dp_size == 0
        raise UsageError(
            f"--dp-size {dp_attn} must divide --tp-size {tp} under --enable-dp-attention (SGLang server_args.py)"
        )
    if ep > 1 and not experts:
        raise UsageError(f"--ep-size {ep}: {spec.name} has no routed experts")
    if redundant and (ep == 1 or not experts):
        raise UsageError(
            "--ep-num-redundant-experts needs --ep-size > 1 (SGLang's EPLB places whole experts)"
        )
    if tp % ep:
        # distributed/parallel_state.py 0.5.x: moe_tp_size = tp_size // moe_ep_size
        raise UsageError(f"--ep-size {ep} must divide --tp-size {tp} (SGLang: MoE TP size = tp / ep)")
    physical = experts + redundant
    if ep > 1 and physical % ep:
        # layers/moe/ep_moe/layer.py 0.5.x: num_local_experts = num_experts // ep_size, asserted whole
        raise UsageError(
            f"--ep-size {ep} must divide the {physical} routed experts of {spec.name}"
            + (f" ({experts} + {redundant} redundant)" if redundant else "")
            + " (SGLang layers/moe/ep_moe)"
        )
    attn_tp = tp // dp_attn
    if dp_attn > 1:
        rules.append(
            f"SGLang --enable-dp-attention --dp-size {dp_attn}: attention TP size = tp / dp = {attn_tp} "
            f"(layers/dp_attention.py compute_dp_attention_world_info, 0.5.x): each of the {dp_attn} attention-DP "
            "ranks runs its own requests with its own KV pool and prints its own max_total_num_tokens; attention "
            f"weights replicated {dp_attn}x, the input embedding whole on every GPU (VocabParallelEmbedding "
            "enable_tp=not is_dp_attention_enabled() in models/deepseek_v2.py, qwen2_moe.py), the LM head and "
            "dense MLPs still over the full TP group (no --enable-dp-lm-head, --moe-dense-tp-size)"
        )
    if not experts:
        if dp_attn == 1:
            return plain_sharding(spec, tp)
        return Sharding(tp, attn_tp, dp_attn, 1, tp, 0, 0, embedding_replicated=True, a2a_backend=backend,
                        rules=tuple(rules))  # fmt: skip
    local = physical // ep
    if ep > 1:
        extra = f" + {redundant} redundant (EPLB)" if redundant else ""
        rules.append(
            f"SGLang --ep-size {ep}: each GPU holds {local} of the {experts}{extra} routed experts per MoE layer, "
            f"each sliced over tp / ep = {tp // ep} GPU(s) (layers/moe/ep_moe/layer.py, 0.5.x)"
        )
    a2a = ep > 1 and backend in A2A_FORCES_EP
    if ep > 1 and not a2a:
        rules.append(
            f"SGLang --ep-size {ep} without an all-to-all --moe-a2a-backend: the experts' outputs are all-reduced "
            "over TP (no dispatch/combine)"
        )
    return Sharding(tp, attn_tp, dp_attn, ep, tp // ep, experts, local, redundant,
                    embedding_replicated=dp_attn > 1, a2a_backend=backend, all_to_all=a2a,
                    rules=tuple(rules))  # fmt: skip
