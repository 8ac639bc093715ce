"""The event loop: requests enter as the client sends them, the engine steps, time jumps ahead
over idle gaps and over runs of identical decode steps."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from kvplan.errors import UsageError
from kvplan.limits import MAX_SIM_STEPS
from kvplan.simulator.deployment import Deployment
from kvplan.simulator.metrics import Recorder
from kvplan.simulator.request import SimRequest
from kvplan.simulator.step import EngineSim
from kvplan.simulator.steptime import context_bucket, step_seconds
from kvplan.simulator.workload import Workload
from kvplan.units import ceil_div

MAX_STEPS = 20_000_000  # engine steps one run may take (runs of identical decodes count once)
MAX_SIMULATED_S = 30 * 86400.0


class Run:
    """One simulation: the engine, the client's gate, the clock."""

    def __init__(
        self, deployment: Deployment, workload: Workload, progress: Callable[[int, int], None] | None = None
    ) -> None:
        self.d = deployment
        self.rec = Recorder()
        self.engine: EngineSim = deployment.new_engine(self.rec)
        self.reqs = [SimRequest(i, spec) for i, spec in enumerate(workload.requests)]
        self.cap = workload.max_concurrency
        self.failed: dict[str, int] = {}
        self.pending: deque[SimRequest] = deque()
        self.in_flight = 0
        self.slot_free_s = 0.0  # when the client's last slot came free
        self.done_before = 0
        self.now = 0.0
        self.steps = 0  # loop iterations (a run of identical decodes counts once)
        self.engine_steps = 0
        self.stretched_steps = 0
        self.progress = progress
        for req in self.reqs:
            reason = self._refusal(req)
            if reason:
                self.failed[reason] = self.failed.get(reason, 0) + 1
            else:
                self.pending.append(req)
        self.to_serve = len(self.pending)

    def _refusal(self, req: SimRequest) -> str | None:
        """What the engine refuses outright (the client counts it as failed)."""
        d, spec = self.d, req.spec
        if spec.prompt_tokens + spec.output_tokens > d.max_model_len:
            return f"prompt + output over max-model-len {d.max_model_len:,}"
        if d.blocks_for(spec.prompt_tokens + spec.output_tokens) > d.num_gpu_blocks - 1:
            return f"longer than the KV pool ({d.pool_tokens:,} tokens)"
        return None

    # --- the client ------------------------------------------------------------------------------

    def _admit(self) -> None:
        """Requests whose send time has come enter, at most `cap` in flight (the benchmark's
        semaphore: vllm/benchmarks/serve.py), in order."""
        while self.pending and self.pending[0].spec.arrival_s <= self.now:
            if self.cap is not None and self.in_flight >= self.cap:
                return
            req = self.pending.popleft()
            req.enter_s = max(req.spec.arrival_s, self.slot_free_s) if self.cap else req.spec.arrival_s
            self.in_flight += 1
            self.engine.add(req)

    def _next_entry_s(self) -> float | None:
        if not self.pending or (self.cap is not None and self.in_flight >= self.cap):
            return None
        return self.pending[0].spec.arrival_s

    # --- the loop ------------------------------------------------------------------------------------

    def run(self) -> None:
        while self.pending or self.engine.has_work():
            self._admit()
            if not self.engine.has_work():
                nxt = self._next_entry_s()
                if nxt is None:
                    raise UsageError("the simulation stalled: requests wait but none can enter")
                self.now = max(self.now, nxt)
                continue
            self._one_step()
            self._release_slots()
            self._admit()
            self._stretch()
            self._release_slots()
            self._check_bounds()

    def _release_slots(self) -> None:
        finished = self.rec.finished_reqs
        if len(finished) == self.done_before:
            return
        for req in finished[self.done_before :]:
            self.in_flight -= 1
            self.slot_free_s = max(self.slot_free_s, req.finish_s or self.now)
        self.done_before = len(finished)
        if self.progress is not None:
            self.progress(self.done_before, self.to_serve)

    def _one_step(self) -> None:
        step = self.engine.schedule()
        if step.empty:
            raise UsageError(
                f"the simulation stalled at {self.now:.3f} s: no request can be scheduled "
                f"({self.d.engine}, pool {self.d.pool_tokens:,} tokens); give a larger KV pool or shorter requests"
            )
        self.now += step_seconds(self.d.steps, step)
        self.steps += 1
        self.engine_steps += 1
        self.engine.complete(step, self.now)
        self.rec.kv_usage(self.now, self.engine.kv_used_fraction())

    def _stretch(self) -> None:
        """Runs of decode steps of the same requests, timed in one go per context bucket."""
        n, arrival_ends = self.engine.stretch_limit()
        if n < 2:
            return
        limit = self._next_entry_s() if arrival_ends else None
        running = list(self.engine.running)
        batch = len(running)
        total = sum(r.num_tokens for r in running)
        done = 0
        t = self.now
        while done < n:
            mean = total // batch + done
            _, hi = context_bucket(mean)
            dt = self.d.steps.decode_seconds(batch, mean)
            m = min(n - done, max(1, hi - mean))
            if limit is not None:  # stop with the step during which the next request arrives
                m = min(m, max(1, int((limit - t) // dt) + 1))
            for req in running:
                self.rec.tokens(req, t, dt, m)
            # KV grows through the run: its middle stands for the run, its end for the peak
            self.rec.kv_usage(t, self.engine.kv_used_fraction_ahead(done + m // 2))
            t += m * dt
            done += m
            self.rec.kv_usage(t, self.engine.kv_used_fraction_ahead(done))
            if limit is not None and t >= limit:
                break
        self.now = t
        self.engine.advance(done, t)
        self.steps += 1
        self.engine_steps += done
        self.stretched_steps += done
        self.rec.kv_usage(t, self.engine.kv_used_fraction())

    def _check_bounds(self) -> None:
        if self.steps > MAX_STEPS:
            raise UsageError(f"the simulation ran past {MAX_STEPS:,} engine steps; simulate fewer requests")
        if self.now > MAX_SIMULATED_S:
            raise UsageError(
                f"the simulation ran past {MAX_SIMULATED_S / 86400:.0f} days of simulated time with requests still "
                "waiting: the deployment cannot keep up with this workload (lower --request-rate or simulate "
                "fewer requests)"
            )


def _days(seconds: float) -> str:
    """A span in days, readable however long: 1e300 s is '1.16e+295', not 295 digits."""
    days = seconds / 86400
    return f"{days:,.1f}" if days < 1e6 else f"{days:.3g}"


def _check_steps(deployment: Deployment, workload: Workload) -> None:
    """Refuse, before any work, a run whose prompts alone need more than MAX_SIM_STEPS engine steps:
    each step prefills at most the step's token budget (vLLM --max-num-batched-tokens, SGLang
    --chunked-prefill-size)."""
    if deployment.engine == "sglang":
        budget, flag = deployment.chunked_prefill_size, "--chunked-prefill-size"
    else:
        budget, flag = deployment.max_num_batched_tokens, "--max-num-batched-tokens"
    span = max((r.arrival_s for r in workload.requests), default=0.0)
    if span > MAX_SIMULATED_S:
        raise UsageError(
            f"the workload sends its requests over {_days(span)} days, more than the "
            f"{MAX_SIMULATED_S / 86400:.0f} days of simulated time kvplan runs; send them faster (--request-rate), "
            "send fewer (--num-prompts) or replay a shorter part of a trace"
        )
    if not budget:
        return
    prompt = sum(r.prompt_tokens for r in workload.requests)
    steps = ceil_div(prompt, budget)
    if steps > MAX_SIM_STEPS:
        raise UsageError(
            f"{flag} {budget:,}: the {prompt:,} prompt tokens one scheduler is dealt need at least {steps:,} engine "
            f"steps, more than the {MAX_SIM_STEPS:,} kvplan simulates (README, Limits); raise {flag} "
            "or simulate fewer or shorter prompts"
        )


def simulate_run(
    deployment: Deployment, workload: Workload, progress: Callable[[int, int], None] | None = None
) -> tuple[Run, float]:
    """Run the simulation; (the finished run, wall seconds it took)."""
    _check_steps(deployment, workload)
    start = time.perf_counter()
    r = Run(deployment, workload, progress)
    r.run()
    return r, time.perf_counter() - start
