"""SGLang's scheduler, step by step, on a token pool and the radix cache (radix.py).

Each rule is read from SGLang v0.5.3: python/sglang/srt/managers/scheduler.py
(get_next_batch_to_run, get_new_batch_prefill, update_running_batch), schedule_policy.py
(PrefillAdder), schedule_batch.py (check_decode_mem, retract_decode, release_req) and
python/sglang/global_config.py (the new-token-ratio constants), cited where they apply.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.simulator.radix import Node, RadixCache, Run, take_runs
from kvplan.simulator.request import SimRequest
from kvplan.simulator.step import Recorder, SpecDecode, Step, emit_token, emit_tokens
from kvplan.units import ceil_div

CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.py (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION)
INIT_NEW_TOKEN_RATIO = 0.7  # global_config.py default_init_new_token_ratio (x schedule_conservativeness 1.0)
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # global_config.py default_min_new_token_ratio_factor
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # global_config.py default_new_token_ratio_decay_steps
RETRACT_DECODE_STEPS = 20  # global_config.py retract_decode_steps
DP_ATTENTION_CONSERVATIVENESS = (
    0.3  # server_args.py _handle_data_parallelism: schedule_conservativeness *= 0.3
)


def new_token_ratios(conservativeness: float = 1.0) -> tuple[float, float, float]:
    """(initial, minimum, decay per step) of the scheduler's new-token ratio (scheduler.py __init__:
    init = min(0.7 x schedule_conservativeness, 1), min = min(init x 0.14, 1), decay over 600 steps)."""
    init = min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
    low = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
    return init, low, (init - low) / NEW_TOKEN_RATIO_DECAY_STEPS


def request_runs(req: SimRequest, num_tokens: int) -> tuple[Run, ...]:
    """The request's first num_tokens tokens as runs: its prompt, then its outputs."""
    spec = req.spec
    units = spec.units if spec.units is not None else ((-(2 * req.rid + 1), spec.prompt_tokens),)
    runs: list[Run] = []
    left = num_tokens
    for uid, length in units:
        if left <= 0:
            break
        runs.append((uid, 0, min(length, left)))
        left -= length
    if left > 0:
        runs.append((-(2 * req.rid + 2), 0, left))
    return tuple(runs)


@dataclass
class _Adder:
    """PrefillAdder's budgets for one prefill batch."""

    rem_total_offset: float
    cur_rem_offset: float
    rem_input_tokens: int
    rem_chunk_tokens: int | None


class SglangEngine:
    def __init__(
        self,
        pool_tokens: int,
        page_size: int,
        chunked_prefill_size: int | None,
        max_prefill_tokens: int,
        max_running_requests: int,
        enable_radix_cache: bool,
        recorder: Recorder,
        speculative: SpecDecode | None = None,
        schedule_conservativeness: float = 1.0,
    ) -> None:
        self.pool_tokens = pool_tokens
        self.spec = speculative
        self._kept: dict[int, int] = {}  # speculative decoding: tokens each decode of this step keeps
        self.page_size = page_size
        self.chunked_prefill_size = chunked_prefill_size
        self.max_prefill_tokens = max_prefill_tokens
        self.max_running = max_running_requests
        self.tree = RadixCache(page_size) if enable_radix_cache else None
        self.rec = recorder
        self.private_tokens = 0  # allocated outside the tree
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.chunked: SimRequest | None = None
        self.batch_is_full = False
        self.init_new_token_ratio, self.min_new_token_ratio, self.ratio_decay = new_token_ratios(
            schedule_conservativeness
        )
        self.new_token_ratio = self.init_new_token_ratio

    def add(self, req: SimRequest) -> None:
        if not self.has_work():  # scheduler.py self_check_during_idle: an idle loop resets the ratio
            self.new_token_ratio = self.init_new_token_ratio
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked)

    # --- the token pool ----------------------------------------------------------------------------

    @property
    def available(self) -> int:
        tree = self.tree.total_tokens if self.tree else 0
        return self.pool_tokens - tree - self.private_tokens

    @property
    def evictable(self) -> int:
        return self.tree.evictable_tokens if self.tree else 0

    def kv_used_fraction(self) -> float:
        return (self.pool_tokens - self.available - self.evictable) / self.pool_tokens

    def kv_used_fraction_ahead(self, n: int) -> float:
        page = self.page_size
        grown = sum(
            (ceil_div(r.num_tokens - 1 + n, page) - ceil_div(r.num_tokens - 1, page)) * page
            for r in self.running
        )
        return min(1.0, (self.pool_tokens - self.available - self.evictable + grown) / self.pool_tokens)

    def _alloc(self, req: SimRequest, n: int) -> None:
        """alloc_token_slots: evict from the tree when the free pool is short."""
        if self.available < n and self.tree:
            self.tree.evict(n - self.available)
        req.private_tokens += n
        self.private_tokens += n

    def _free_private(self, req: SimRequest) -> None:
        self.private_tokens -= req.private_tokens
        req.private_tokens = 0

    def _cache(self, req: SimRequest, num_tokens: int, chunk: bool = False) -> None:
        """cache_unfinished_req / cache_finished_req: the request's first num_tokens go into the
        tree (tokens it held privately become the tree's, duplicates are freed) and its lock
        moves to the new last node. `chunk`: a chunked prefill's next chunk, added below the node its
        earlier chunks ended at (RadixCache.extend; the same tree, without re-walking the prompt)."""
        tree = self.tree
        if tree is None:
            return
        old = req.node if isinstance(req.node, Node) else None
        if chunk and old is not None and 0 < req.prefix_len <= num_tokens:
            _, rest = take_runs(request_runs(req, num_tokens), req.prefix_len)
            node = tree.extend(old, rest)
            tree.relock(old, node)
        else:
            _, node = tree.insert(request_runs(req, num_tokens))
            tree.lock(node)
            if old is not None:
                tree.unlock(old)
        self.private_tokens -= req.private_tokens
        req.private_tokens = 0
        req.node = node
        req.prefix_len = num_tokens

    def _release(self, req: SimRequest) -> None:
        self._free_private(req)
        if self.tree is not None and isinstance(req.node, Node):
            self.tree.unlock(req.node)
        req.node = None
        req.prefix_len = 0

    # --- one step (scheduler.py: get_next_batch_to_run) ------------------------------------------

    def schedule(self) -> Step:
        """Prefill first: a prefill batch runs as its own step when one can be formed, else a decode
        step of the running batch."""
        step = self._prefill_batch()
        if step is not None:
            return step
        step = Step()
        if self.running:
            self._check_decode_memory()
            for req in self.running:
                if self.spec is None:
                    self._alloc(req, self._decode_tokens(req))
                else:  # the slots of the tokens it keeps (the rejected drafts' are freed after verify)
                    kept = self._kept[id(req)] = self.spec.accepted(req)
                    self._alloc(req, self._decode_tokens(req, kept))
            step.decodes = list(self.running)
        return step

    def _reserved(self, req: SimRequest) -> float:
        """PrefillAdder._get_running_request_total_token_offset: a running request's future tokens."""
        return min(req.spec.output_tokens - req.num_output, CLIP_MAX_NEW_TOKENS) * self.new_token_ratio

    def _prefill_batch(self) -> Step | None:
        """get_new_batch_prefill with PrefillAdder (fcfs, radix cache on, no mixed chunk)."""
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return None
        if self.max_running - len(self.running) <= 0 and self.chunked is None:
            self.batch_is_full = True
            return None
        offset = sum(self._reserved(r) for r in self.running)
        adder = _Adder(offset, 0.0, self.max_prefill_tokens, self.chunked_prefill_size)
        step = Step()
        if self.chunked is not None:
            self._add_chunked(adder, step)
        admitted: list[SimRequest] = []
        for req in self.waiting:
            if len(step.prefills) >= self.max_running - len(self.running):
                self.batch_is_full = True
                break
            added, stop = self._add_one(adder, req, step)
            if added:
                admitted.append(req)
            if stop:
                self.batch_is_full = self.batch_is_full or stop == "no-token"
                break
        if admitted:
            gone = set(map(id, admitted))
            self.waiting = [r for r in self.waiting if id(r) not in gone]
        for req, _, n in step.prefills:  # prepare_for_extend allocates once the batch is formed
            self._alloc(req, ceil_div(n, self.page_size) * self.page_size)
        return step if step.prefills else None

    def _rem_total(self, a: _Adder) -> float:
        return self.available + self.evictable - a.rem_total_offset

    def _add_chunked(self, a: _Adder, step: Step) -> None:
        """add_chunked_req: the request being prefilled in chunks continues first."""
        req = self.chunked
        assert req is not None
        extend = req.num_tokens - req.num_computed
        rem = min(a.rem_chunk_tokens if a.rem_chunk_tokens is not None else extend, int(self._rem_total(a)))
        truncated = extend > rem
        n = min(extend, rem)
        if n <= 0:
            return
        self._take_prefill(req, n, step)
        reserve = 0 if truncated else min(req.spec.output_tokens, CLIP_MAX_NEW_TOKENS)
        self._charge(a, n, reserve)
        if not truncated:
            self.chunked = None

    def _charge(self, a: _Adder, extend: int, reserve: int) -> None:
        """_update_prefill_budget."""
        extend = ceil_div(extend, self.page_size) * self.page_size
        a.rem_total_offset += extend + reserve
        a.cur_rem_offset += extend
        a.rem_input_tokens -= extend
        if a.rem_chunk_tokens is not None:
            a.rem_chunk_tokens -= extend

    def _add_one(self, a: _Adder, req: SimRequest, step: Step) -> tuple[bool, str | None]:
        """add_one_req: admit when the prompt plus its (clipped) output fits what is free or
        evictable beyond the running requests' reserve; chunk when over the chunk budget."""
        prefix, node = self._match(req)
        extend = req.num_tokens - prefix
        total = extend + min(req.spec.output_tokens, CLIP_MAX_NEW_TOKENS)
        input_tokens = ceil_div(extend, self.page_size) * self.page_size
        if total >= self._rem_total(a):
            return False, "no-token"
        if input_tokens >= a.rem_input_tokens and step.prefills:
            return False, "other"
        req.num_computed = prefix
        req.prefix_len = prefix
        if self.tree is not None and node is not None:
            self.tree.lock(node)
            req.node = node
            # schedule_policy.py add_one_req: checked again once the prefix is locked ("rem_total_tokens may
            # decrease after the lock acquisition": the prefix no longer counts as evictable)
            if total >= self._rem_total(a):
                self._release(req)
                req.num_computed = 0
                return False, "no-token"
        if a.rem_chunk_tokens is None or input_tokens <= a.rem_chunk_tokens:
            self._take_prefill(req, extend, step)
            self._charge(a, input_tokens, min(req.spec.output_tokens, CLIP_MAX_NEW_TOKENS))
        else:
            trunc = a.rem_chunk_tokens // self.page_size * self.page_size
            if trunc <= 0:
                self._release(req)
                req.num_computed = 0
                return False, "other"
            self._take_prefill(req, trunc, step)
            self.chunked = req
            self._charge(a, trunc, 0)
        return True, self._budget_state(a)

    def _budget_state(self, a: _Adder) -> str | None:
        """budget_state: whether another request may be tried."""
        if self._rem_total(a) <= 0 or self.available + self.evictable - a.cur_rem_offset <= 0:
            return "no-token"
        if a.rem_input_tokens <= 0 or (a.rem_chunk_tokens is not None and a.rem_chunk_tokens <= 0):
            return "other"
        return None

    def _match(self, req: SimRequest) -> tuple[int, Node | None]:
        """init_next_round_input: the cached prefix, at most num_tokens - 1 tokens."""
        first = not req.looked_up
        if self.tree is None:
            prefix, node = 0, None
        else:
            prefix, node = self.tree.match(request_runs(req, req.num_tokens), req.num_tokens - 1)
        if first:
            req.looked_up = True
            req.queried_tokens = req.spec.prompt_tokens
            req.hit_tokens = min(prefix, req.spec.prompt_tokens)
        return prefix, node

    @staticmethod
    def _take_prefill(req: SimRequest, n: int, step: Step) -> None:
        step.prefills.append((req, req.num_computed, n))

    def _decode_tokens(self, req: SimRequest, n: int = 1) -> int:
        """new_page_count_next_decode x page size: a page when the sequence crosses into one; for n
        tokens in one step (speculative decoding) the pages they reach."""
        t, page = req.num_tokens - 1, self.page_size
        if n == 1:
            return 1 if page == 1 else (page if t % page == 0 else 0)
        return (ceil_div(t + n, page) - ceil_div(t, page)) * page

    def _decode_need(self, req: SimRequest) -> int:
        """Slots a decode needs free this step: one token, or under speculative decoding every token it
        verifies (kvplan's reading: the drafts hold slots until verification)."""
        return self._decode_tokens(req, 1 + self.spec.draft_tokens) if self.spec else self._decode_tokens(req)

    # --- decode memory (update_running_batch, check_decode_mem, retract_decode) -------------------

    def _check_decode_memory(self) -> None:
        need = sum(self._decode_need(r) for r in self.running)
        if self._fits(need):
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_new_token_ratio)
            return
        # retract: the request with the fewest outputs (then the longest prompt) goes first
        order = sorted(self.running, key=lambda r: (r.num_output, -r.spec.prompt_tokens), reverse=True)
        first = True
        while first or not self._fits(sum(self._decode_need(r) for r in order)):
            if len(order) == 1:
                break
            first = False
            victim = order.pop()
            self._release(victim)
            if self.tree is not None:
                short = len(order) * RETRACT_DECODE_STEPS - self.available
                if short > 0:
                    self.tree.evict(short)
            victim.num_computed = 0
            victim.preemptions += 1
            self.rec.preempted(victim)
            self.waiting.append(victim)  # _add_request_to_queue(req, is_retracted=True)
        kept = set(map(id, order))
        self.running = [r for r in self.running if id(r) in kept]
        self.batch_is_full = False
        decoded = sum(r.num_output for r in self.running)
        max_new = sum(r.spec.output_tokens for r in self.running)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / max_new)

    def _fits(self, need: int) -> bool:
        if self.available < need and self.tree is not None:
            self.tree.evict(need - self.available)
        return self.available >= need

    # --- after the step ----------------------------------------------------------------------------

    def complete(self, step: Step, t_s: float) -> None:
        done: list[SimRequest] = []
        for req in step.decodes:
            n = self._kept.pop(id(req), 1)
            req.num_computed += n
            emit_tokens(self.rec, req, n, t_s, done)
        for req, _, n in step.prefills:
            req.num_computed += n
            req.prefill_tokens += n
            if req is self.chunked:
                self._cache(req, req.num_computed, chunk=True)  # cache_unfinished_req(chunked=True)
                continue
            self._cache(req, req.num_computed)  # the prompt joins the tree while it decodes
            self.running.append(req)
            emit_token(self.rec, req, t_s, done)
        for req in done:
            self._finish(req, t_s)

    def _finish(self, req: SimRequest, t_s: float) -> None:
        self.running.remove(req)
        if self.tree is not None:
            self._cache(req, req.num_tokens - 1)  # cache_finished_req: (input + output)[:-1]
        self._release(req)
        self.batch_is_full = False
        self.rec.finished(req, t_s)

    # --- many identical decode steps at once -----------------------------------------------------

    def stretch_limit(self) -> tuple[int, bool]:
        """(decode steps in a row with nothing else changing, whether an arrival would end them):
        no chunked prefill pending, and no prefill can be formed (nothing waits, or the batch is
        marked full, which only a finished or retracted request clears)."""
        if not self.running or self.chunked is not None or self.spec is not None:
            return 0, False  # speculative steps keep a varying number of tokens: stepped one by one
        if self.waiting and not self.batch_is_full:
            return 0, False
        n = min(r.remaining_output for r in self.running)
        room = self.available + self.evictable
        page = self.page_size
        lens = [r.num_tokens - 1 for r in self.running]

        def need(k: int) -> int:
            return sum((ceil_div(t + k, page) - ceil_div(t, page)) * page for t in lens)

        if need(n) > room:
            lo, hi = 0, n
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if need(mid) <= room else (lo, mid)
            n = lo
        return n, not self.waiting

    def advance(self, n: int, t_s: float) -> None:
        page = self.page_size
        done = []
        for req in self.running:
            t = req.num_tokens - 1
            self._alloc(req, (ceil_div(t + n, page) - ceil_div(t, page)) * page)
            req.num_computed += n
            req.num_output += n
            if req.num_output >= req.spec.output_tokens:
                done.append(req)
        self.new_token_ratio = max(self.new_token_ratio - n * self.ratio_decay, self.min_new_token_ratio)
        for req in done:
            self._finish(req, t_s)
