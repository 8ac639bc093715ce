"""What a KV pool holds: block-rounded request bytes, the binding stage, the longest context that
fits, prefix sharing and preallocation waste. Pure functions of the stages' layers and budgets."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvplan.errors import UsageError
from kvplan.formats import Format
from kvplan.model import kv
from kvplan.specs.models import Layer, RecurrentState


def request_bytes(
    layers: list[Layer],
    fmt: Format,
    context: int,
    block_size: int,
    tp: int,
    state_copies: int = 1,
    charge: list[float] | None = None,
) -> int:
    """Block-rounded bytes one request of `context` tokens holds on one GPU; `state_copies`: the copies of
    each recurrent state a request holds (vLLM: one page per speculative token, and one more for prefix
    caching's 'align' mode); `charge`: each layer's bytes as the engine charges them, a multiple of its own
    (Engine.request_charge: vLLM's padding layers and padded state pages)."""
    if charge is None:
        return sum(
            n
            * kv.layer_request_bytes(layer, fmt, context, block_size, tp)
            * (state_copies if isinstance(layer, RecurrentState) else 1)
            for layer, n in kv.grouped(layers)
        )
    own = {id(la): kv.layer_request_bytes(la, fmt, context, block_size, tp) for la, _ in kv.grouped(layers)}
    total = sum(
        own[id(la)] * scale * (state_copies if isinstance(la, RecurrentState) else 1)
        for la, scale in zip(layers, charge, strict=True)
    )
    return math.ceil(total - 1e-6)


@dataclass(frozen=True)
class StagePlan:
    stage: int
    first_layer: int
    num_layers: int
    weight_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int
    kv_bits_per_token_per_gpu: int
    block_bytes_per_gpu: int
    num_blocks: int | None


@dataclass(frozen=True)
class Shared:
    """A shared prefix: bytes stored once per stage, and bytes it saves each request per stage."""

    once: list[int]
    per_request: list[float]


@dataclass(frozen=True)
class Pool:
    """The KV pools of one replica's pipeline stages, in blocks of `block_size` tokens."""

    stages: list[StagePlan]
    layers: list[list[Layer]]  # each stage's layers
    fmt: Format
    block_size: int
    tp: int
    state_copies: int = 1  # copies of each recurrent state a request holds (Engine.state_blocks)
    charges: list[list[float] | None] | None = None  # per stage, Engine.request_charge

    @property
    def num_blocks(self) -> int | None:
        counts = [s.num_blocks for s in self.stages if s.num_blocks is not None]
        return min(counts) if counts else None

    def usable_bytes(self, stage: int, reserved_blocks: int) -> int:
        s, n = self.stages[stage], self.num_blocks
        if n is None or not s.block_bytes_per_gpu:
            return s.kv_budget_bytes_per_gpu
        return max(n - reserved_blocks, 0) * s.block_bytes_per_gpu

    def request_bytes(self, stage: int, context: int) -> int:
        charge = self.charges[stage] if self.charges else None
        return request_bytes(
            self.layers[stage], self.fmt, context, self.block_size, self.tp, self.state_copies, charge
        )

    def read_bytes(self, stage: int, context: int) -> int:
        """Bytes a decode step reads for one request: each recurrent state once, however many copies the
        engine holds (the copies are the speculative and prefix-caching pages, not read every step); a
        sparse (DSA) layer its top-k tokens' latents (kv.layer_read_bytes)."""
        return sum(
            n * kv.layer_read_bytes(layer, self.fmt, context, self.block_size, self.tp)
            for layer, n in kv.grouped(self.layers[stage])
        )

    def requests_fitting(
        self, context: int, reserved_blocks: int = 0, shared: Shared | None = None
    ) -> tuple[float, int]:
        """(requests of `context` tokens that fit, index of the binding stage)."""
        best, best_i = math.inf, 0
        for i in range(len(self.stages)):
            per_req: float = self.request_bytes(i, context)
            pool: float = self.usable_bytes(i, reserved_blocks)
            if shared is not None:
                pool -= shared.once[i]
                per_req -= shared.per_request[i]
            f = pool / per_req if per_req > 0 else math.inf
            if f < best:
                best, best_i = f, i
        return best, best_i

    def largest_fitting_len(self, stage: int, pool_bytes: int, upper: int) -> int:
        lo, hi = 0, upper
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.request_bytes(stage, mid) <= pool_bytes:
                lo = mid
            else:
                hi = mid - 1
        return lo


@dataclass(frozen=True)
class PrefixCaching:
    shared_prefix_tokens: int
    prefix_hit_rate: float
    shared_blocks: int
    shared_tokens_cached: int
    shared_bytes_per_gpu: int
    max_concurrency_per_replica: int
    max_concurrency: int
    gain: float | None
    memory_saved_bytes_per_gpu: int
    prefill_tokens_saved_per_request: float


def prefix_caching(
    pool: Pool,
    shared_prefix_tokens: int,
    hit_rate: float,
    max_len: int,
    null_blocks: int,
    max_num_seqs: int | None,
    dp: int,
    base_factor: float,
    attn_dp: int = 1,
) -> PrefixCaching:
    """Shared prefix: only full blocks are shared, stored once (vLLM vllm/v1/core/kv_cache_utils.py at v0.11.0);
    `max_num_seqs` and the pool are one attention rank's, the concurrency the replica's (attn_dp ranks)."""
    bs = pool.block_size
    shared_blocks = shared_prefix_tokens // bs
    if shared_blocks * bs >= max_len:  # a hit never covers the request's last token
        shared_blocks = (max_len - 1) // bs
    once = [
        sum(
            n
            * kv.page_bytes(layer, pool.fmt, bs, pool.tp)
            * kv.shared_full_blocks(layer, shared_blocks * bs, bs)
            for layer, n in kv.grouped(layers)
            if kv.is_growing(layer)
        )
        for layers in pool.layers
    ]
    shared = Shared(once, [hit_rate * b for b in once])
    f, bind = pool.requests_fitting(max_len, null_blocks, shared)
    if not math.isfinite(f):  # a request would hold nothing of its own: no count of requests follows
        raise UsageError(
            f"--shared-prefix-tokens {shared_prefix_tokens:,}: the shared prefix covers every block a "
            f"{max_len:,}-token request holds, so the pool bounds no count of requests; use a shorter prefix"
        )
    with_prefix = math.floor(f)
    if max_num_seqs is not None:
        with_prefix = min(with_prefix, max_num_seqs)
    saved = max(with_prefix * shared.per_request[bind] - once[bind], 0)
    return PrefixCaching(
        shared_prefix_tokens=shared_prefix_tokens,
        prefix_hit_rate=hit_rate,
        shared_blocks=shared_blocks,
        shared_tokens_cached=shared_blocks * bs,
        shared_bytes_per_gpu=once[bind],
        max_concurrency_per_replica=with_prefix * attn_dp,
        max_concurrency=with_prefix * attn_dp * dp,
        gain=with_prefix / math.floor(base_factor) if base_factor >= 1 else None,
        memory_saved_bytes_per_gpu=int(saved),
        prefill_tokens_saved_per_request=hit_rate * shared_blocks * bs,
    )


@dataclass(frozen=True)
class AvgContext:
    """The pool at --avg-context-tokens: what one request holds, and how many fit."""

    avg_context_tokens: int
    kv_bytes_per_request_per_gpu: int
    max_concurrency_per_replica: int
    max_concurrency: int


@dataclass(frozen=True)
class Fragmentation:
    context_tokens: int
    prealloc_max_concurrency_per_replica: int | None
    prealloc_waste_bytes_per_request_per_gpu: int
    prealloc_utilization: float
    paged_max_concurrency_per_replica: int | None
    paged_waste_bytes_per_request_per_gpu: int
    paged_utilization: float


def fragmentation(pool: Pool, stage: int, context: int, max_len: int, usable_bytes: int) -> Fragmentation:
    """Preallocating max_model_len per request vs paged blocks (the vLLM paper, arXiv:2309.06180)."""
    layers, fmt, tp = pool.layers[stage], pool.fmt, pool.tp
    exact_rank = kv.sequence_bytes(layers, fmt, context, tp)
    # both in the engine's accounting (its padding slots and state pages, Pool.request_bytes): preallocating
    # reserves what a max_model_len request is charged, paging what one of `context` tokens is
    exact_max = (
        pool.request_bytes(stage, max_len) if pool.charges else kv.sequence_bytes(layers, fmt, max_len, tp)
    )
    paged = pool.request_bytes(stage, context)
    budget = pool.usable_bytes(stage, 0)  # the pool's own bytes (a draft's share split off), no null block
    return Fragmentation(
        context_tokens=context,
        prealloc_max_concurrency_per_replica=budget // exact_max
        if exact_max
        else None,  # no null block unpaged
        prealloc_waste_bytes_per_request_per_gpu=exact_max - exact_rank,
        prealloc_utilization=exact_rank / exact_max if exact_max else 1.0,
        paged_max_concurrency_per_replica=usable_bytes // paged if paged else None,
        paged_waste_bytes_per_request_per_gpu=paged - exact_rank,
        paged_utilization=exact_rank / paged if paged else 1.0,
    )
