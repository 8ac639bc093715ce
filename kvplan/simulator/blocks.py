"""vLLM v1's block pool: the blocks of one KV-cache group, prefix caching by chained block hashes.

Read from vLLM v0.11.0: vllm/v1/core/block_pool.py (free queue, touch, cache_full_blocks, the null
block), vllm/v1/core/kv_cache_utils.py (FreeKVCacheBlockQueue: LRU order), and
vllm/v1/core/single_type_kv_cache_manager.py (allocation, reversed free). A block is named by its
hash key when it is in the prefix cache, else it is anonymous; block ids themselves never matter.
"""

from __future__ import annotations

from collections import OrderedDict

from kvplan.simulator.request import MASK, SimRequest


def block_keys(req: SimRequest, block_size: int, upto_blocks: int) -> list[int]:
    """The chained hashes of the request's first `upto_blocks` full blocks (extended lazily).
    A block's key hashes its parent's key with its own content, as vLLM's hash_block_tokens does
    (vllm/v1/core/kv_cache_utils.py), so equal keys mean equal prefixes."""
    keys = req.keys
    if len(keys) >= upto_blocks:
        return keys
    spec = req.spec
    units = spec.units
    prev = keys[-1] if keys else 0
    j = len(keys)
    salt = (1 << 48) + req.rid  # this request's own content (not -1: hash(-1) == hash(-2))
    if units is None:
        keys.extend(hash((salt, i)) & MASK for i in range(j, upto_blocks))
        return keys
    prompt_full = spec.prompt_tokens // block_size
    # walk the units to block j's first token
    pos = j * block_size
    u, start = 0, 0
    while u < len(units) and start + units[u][1] <= pos:
        start += units[u][1]
        u += 1
    while j < upto_blocks:
        if j >= prompt_full:  # past the prompt's full blocks: content only this request has
            prev = hash((prev, salt, j)) & MASK
        else:
            parts = []
            need, at = block_size, j * block_size
            while need:
                uid, length = units[u]
                take = min(need, start + length - at)
                parts.append((uid, at - start))
                need -= take
                at += take
                if at == start + length:
                    start += length
                    u += 1
            prev = hash((prev, *parts)) & MASK
        keys.append(prev)
        j += 1
    return keys


class BlockPool:
    """Free blocks in LRU order (least recent at the front), cached blocks by key, reference counts.

    vllm/v1/core/block_pool.py: one block is the null block, never handed out; new blocks come off
    the front of the free queue, evicting the cached key a block held; a freed request's blocks go
    to the back in reverse order, so its tail is evicted first; a prefix-cache hit on a free block
    takes it out of the queue (touch)."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        self.num_blocks = num_gpu_blocks - 1  # the null block (block_pool.py: free_block_queue.popleft())
        self.enable_caching = enable_caching
        self.fresh = self.num_blocks  # never-used blocks, at the front of the queue in id order
        self.free: OrderedDict[int, None] = (
            OrderedDict()
        )  # freed blocks: cached keys (>= 0) or anonymous (< 0)
        self.cached: set[int] = set()  # keys with a block in the cache, in use or free
        self.ref: dict[int, int] = {}  # in-use cached blocks: how many requests hold each
        self._anon = 0
        self.evicted_blocks = 0

    @property
    def num_free(self) -> int:
        return self.fresh + len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def longest_hit(self, keys: list[int], max_blocks: int) -> int:
        """Leading blocks whose keys are cached (find_longest_cache_hit)."""
        cached = self.cached
        n = 0
        for key in keys[:max_blocks]:
            if key not in cached:
                break
            n += 1
        return n

    def evictable_among(self, keys: list[int]) -> int:
        """Hit blocks that sit in the free queue: taking them costs free blocks
        (single_type_kv_cache_manager.py: get_num_blocks_to_allocate)."""
        ref = self.ref
        return sum(1 for k in keys if k not in ref)

    def touch(self, keys: list[int]) -> None:
        ref, free = self.ref, self.free
        for k in keys:
            if k in ref:
                ref[k] += 1
            else:
                del free[k]
                ref[k] = 1

    def take(self, n: int) -> None:
        """n new blocks off the front of the queue; cached keys there are evicted."""
        from_fresh = min(n, self.fresh)
        self.fresh -= from_fresh
        n -= from_fresh
        if not n:
            return
        popitem, cached = self.free.popitem, self.cached
        for _ in range(n):
            key, _v = popitem(last=False)
            if key >= 0:
                cached.discard(key)
                self.evicted_blocks += 1

    def release(self, blocks: list[int | None]) -> None:
        """A request's blocks back to the queue, tail first (single_type_kv_cache_manager.free)."""
        free, ref = self.free, self.ref
        for key in reversed(blocks):
            if key is None:
                self._anon -= 1
                free[self._anon] = None
            else:
                left = ref[key] - 1
                if left:
                    ref[key] = left
                else:
                    del ref[key]
                    free[key] = None

    def cache(self, req: SimRequest, block_size: int, num_tokens: int) -> None:
        """Register the request's full blocks up to `num_tokens` under their keys
        (block_pool.py: cache_full_blocks). A key already cached by another block leaves this one
        uncached: vLLM keeps both copies, kvplan keeps the first (a hit finds the first either way)."""
        if not self.enable_caching:
            return
        full = min(num_tokens // block_size, len(req.blocks))
        if full <= req.num_cached_blocks:
            return
        keys = block_keys(req, block_size, full)
        blocks, cached, ref = req.blocks, self.cached, self.ref
        for j in range(req.num_cached_blocks, full):
            if blocks[j] is None:
                key = keys[j]
                if key not in cached:
                    cached.add(key)
                    ref[key] = 1
                    blocks[j] = key
        req.num_cached_blocks = full
