"""vLLM v1's scheduler, step by step, on the block pool (blocks.py).

Each rule is read from vLLM v0.11.0, vllm/v1/core/sched/scheduler.py (`Scheduler.schedule`) and
vllm/v1/core/kv_cache_manager.py (`get_computed_blocks`, `allocate_slots`), cited where it applies.
"""

from __future__ import annotations

from collections import deque

from kvplan.simulator.blocks import BlockPool, block_keys
from kvplan.simulator.request import SimRequest
from kvplan.simulator.step import Recorder, SpecDecode, Step, emit_token, emit_tokens
from kvplan.units import ceil_div


class VllmEngine:
    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        enable_prefix_caching: bool,
        recorder: Recorder,
        speculative: SpecDecode | None = None,
        fixed_blocks: int = 0,
    ) -> None:
        self.pool = BlockPool(num_gpu_blocks, enable_prefix_caching)
        # a hybrid model's recurrent-state pages: a request holds them from its first allocation to its end,
        # whatever its length (kv_cache_interface.py MambaSpec.max_memory_usage_bytes)
        self.fixed_blocks = fixed_blocks
        self.spec = speculative
        self.block_size = block_size
        self.token_budget = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.caching = enable_prefix_caching
        self.rec = recorder
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.blocked_by_memory = False  # the waiting queue's head found no blocks last step
        self._preempted_this_step = False

    def add(self, req: SimRequest) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def kv_used_fraction(self) -> float:
        return self.pool.num_used / self.pool.num_blocks

    def kv_used_fraction_ahead(self, n: int) -> float:
        bs = self.block_size
        grown = sum(max(0, ceil_div(r.num_tokens + n - 1, bs) - len(r.blocks)) for r in self.running)
        return min(1.0, (self.pool.num_used + grown) / self.pool.num_blocks)

    # --- allocation (kv_cache_manager.py: allocate_slots) ------------------------------------------

    def _allocate(
        self, req: SimRequest, num_new_tokens: int, hit_keys: list[int] | None = None, lookahead: int = 0
    ) -> bool:
        hits = len(hit_keys) if hit_keys else 0
        # num_tokens_need_slot = min(computed + new hits + new tokens + lookahead, max_model_len)
        need_tokens = min(
            req.num_computed + hits * self.block_size + num_new_tokens + lookahead, self.max_model_len
        )
        num_new_blocks = ceil_div(need_tokens, self.block_size) - hits - len(req.blocks)
        state = self.fixed_blocks if not req.state_blocks else 0
        evictable = self.pool.evictable_among(hit_keys) if hit_keys else 0
        if num_new_blocks + state + evictable > self.pool.num_free:
            return False  # "Cannot allocate new blocks"
        if state:
            self.pool.take(state)
            req.state_blocks = state
        if hit_keys:
            self.pool.touch(hit_keys)
            req.blocks.extend(hit_keys)
            req.num_cached_blocks = hits
            req.num_computed += hits * self.block_size
        if num_new_blocks > 0:
            self.pool.take(num_new_blocks)
            req.blocks.extend([None] * num_new_blocks)
        # cache_blocks up to computed + new tokens, capped at the request's tokens
        self.pool.cache(req, self.block_size, min(req.num_computed + num_new_tokens, req.num_tokens))
        return True

    def _release_state(self, req: SimRequest) -> None:
        if req.state_blocks:
            self.pool.release([None] * req.state_blocks)
            req.state_blocks = 0

    def _preempt(self, victim: SimRequest) -> None:
        # scheduler.py: kv_cache_manager.free(preempted_req); num_computed_tokens = 0;
        # waiting.prepend_request(preempted_req)
        self.pool.release(victim.blocks)
        victim.blocks = []
        self._release_state(victim)
        victim.num_cached_blocks = 0
        victim.num_computed = 0
        victim.preemptions += 1
        self.waiting.appendleft(victim)
        self.rec.preempted(victim)

    # --- one step (scheduler.py: Scheduler.schedule) ---------------------------------------------

    def schedule(self) -> Step:
        step = Step()
        budget = self._schedule_running(step)
        self.blocked_by_memory = False
        if budget > 0 and not self._preempted_this_step:  # "if not preempted_reqs:"
            self._schedule_waiting(step, budget)
        return step

    def _schedule_running(self, step: Step) -> int:
        """First the RUNNING requests, in order: each gets what it still needs (1 token when
        decoding, the rest of its prompt when prefilling), capped by the token budget; when its
        blocks cannot be allocated, the last running request is preempted (running.pop()) until
        they can, or until it is itself preempted."""
        budget = self.token_budget
        self._preempted_this_step = False
        i = 0
        running = self.running
        while i < len(running) and budget > 0:
            req = running[i]
            # num_tokens_with_spec - num_computed_tokens: a decoding request also verifies its drafts
            drafts = self.spec.draft_tokens if self.spec and self._decoding(req) else 0
            n = min(
                req.num_tokens + drafts - req.num_computed, budget, self.max_model_len - 1 - req.num_computed
            )
            if n <= 0:
                i += 1
                continue
            lookahead = self.spec.lookahead if self.spec else 0  # allocate_slots(num_lookahead_tokens)
            while not self._allocate(req, n, lookahead=lookahead):
                victim = running.pop()
                self._preempt(victim)
                self._preempted_this_step = True
                if victim is req:
                    return budget
            self._record(step, req, n)
            budget -= n
            i += 1
        return budget

    def _schedule_waiting(self, step: Step, budget: int) -> None:
        """Then the WAITING requests, first come first served, only when nobody was preempted this
        step and fewer than max_num_seqs run: cached blocks first (get_computed_blocks, at most
        num_tokens - 1 tokens so that the last is recomputed for its logits), then a chunk of what
        the budget leaves; stop at the first that cannot get its blocks."""
        waiting = self.waiting
        while waiting and budget > 0:
            if len(self.running) == self.max_num_seqs:
                break
            req = waiting[0]
            hit_keys = self._lookup(req) if req.num_computed == 0 else None
            hits = len(hit_keys) if hit_keys else 0
            n = min(req.num_tokens - req.num_computed - hits * self.block_size, budget)
            if not self._allocate(req, n, hit_keys):
                self.blocked_by_memory = True
                break
            waiting.popleft()
            self.running.append(req)
            self._record(step, req, n)
            budget -= n

    def _lookup(self, req: SimRequest) -> list[int] | None:
        if not self.caching:
            self._count_query(req, 0)
            return None
        max_blocks = (req.num_tokens - 1) // self.block_size  # max_cache_hit_length = num_tokens - 1
        keys = block_keys(req, self.block_size, max_blocks) if max_blocks else []
        hits = self.pool.longest_hit(keys, max_blocks)
        self._count_query(req, hits * self.block_size)
        return keys[:hits] if hits else None

    @staticmethod
    def _count_query(req: SimRequest, hit_tokens: int) -> None:
        if not req.looked_up:  # the hit rate counts each prompt once, at its first admission attempt
            req.looked_up = True
            req.queried_tokens = req.spec.prompt_tokens
            req.hit_tokens = min(hit_tokens, req.spec.prompt_tokens)

    @staticmethod
    def _decoding(req: SimRequest) -> bool:
        return req.num_computed >= req.num_tokens - 1 and req.num_output > 0

    def _record(self, step: Step, req: SimRequest, n: int) -> None:
        if self._decoding(req):
            step.decodes.append(req)
        else:
            step.prefills.append((req, req.num_computed, n))

    # --- after the step (scheduler.py: update_from_output) ---------------------------------------

    def complete(self, step: Step, t_s: float) -> None:
        done: list[SimRequest] = []
        for req in step.decodes:
            # update_from_output: the verified token plus the accepted drafts stay computed
            n = self.spec.accepted(req) if self.spec else 1
            req.num_computed += n
            emit_tokens(self.rec, req, n, t_s, done)
        for req, _, n in step.prefills:
            req.num_computed += n
            req.prefill_tokens += n
            if req.num_computed >= req.num_tokens:  # the last chunk samples a token
                emit_token(self.rec, req, t_s, done)
        for req in done:
            self._finish(req, t_s)

    def _finish(self, req: SimRequest, t_s: float) -> None:
        self.running.remove(req)
        self.pool.release(req.blocks)
        req.blocks = []
        self._release_state(req)
        self.rec.finished(req, t_s)

    # --- many identical decode steps at once -----------------------------------------------------

    def stretch_limit(self) -> tuple[int, bool]:
        """(steps that would be pure decodes of the same requests with nothing else changing,
        whether an arrival would end that): every running request decodes, all fit the budget,
        and nothing waiting can start (none waits, max_num_seqs are running, or the head found no
        blocks: decodes only take blocks, so it stays blocked until a request finishes)."""
        running = self.running
        if not running or len(running) > self.token_budget or self.spec is not None:
            return 0, False  # speculative steps keep a varying number of tokens: stepped one by one
        if any(r.num_computed != r.num_tokens - 1 or not r.num_output for r in running):
            return 0, False
        full = len(running) >= self.max_num_seqs
        if self.waiting and not (full or self.blocked_by_memory):
            return 0, False
        n = min(r.remaining_output for r in running)
        n = min(n, self._steps_with_blocks(n))
        return n, not self.waiting and not full

    def _steps_with_blocks(self, n_max: int) -> int:
        """The most decode steps (up to n_max) whose new blocks the free queue covers."""
        bs, free = self.block_size, self.pool.num_free
        lens = [(r.num_tokens, len(r.blocks)) for r in self.running]

        def need(n: int) -> int:
            return sum(max(0, ceil_div(t + n - 1, bs) - held) for t, held in lens)

        if need(n_max) <= free:
            return n_max
        lo, hi = 0, n_max  # need(lo) <= free < need(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if need(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def advance(self, n: int, t_s: float) -> None:
        """n decode steps of every running request at once (the loop has timed and recorded their
        tokens); requests that reach their output length finish at `t_s`."""
        bs = self.block_size
        done = []
        for req in self.running:
            new_blocks = ceil_div(req.num_tokens + n - 1, bs) - len(req.blocks)
            if new_blocks > 0:
                self.pool.take(new_blocks)
                req.blocks.extend([None] * new_blocks)
            req.num_computed += n
            req.num_output += n
            self.pool.cache(req, bs, req.num_computed)
            if req.num_output >= req.spec.output_tokens:
                done.append(req)
        for req in done:
            self._finish(req, t_s)
