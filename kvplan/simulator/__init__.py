"""`kvplan simulate`: a discrete-event simulation of one deployment under load, scheduled by the
engine's own rules (vLLM v1's scheduler and block pool, SGLang's scheduler and radix cache) and
timed by kvplan's step model.

    deployment = deployment.from_plan(plan, request)    # once
    workload = workload.synthetic(...) or traces.read_trace(...)
    result = simulate(deployment, workload)             # as often as a search needs
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kvplan.simulator.deployment import Deployment, from_plan
from kvplan.simulator.loop import simulate_run
from kvplan.simulator.result import SimResult, build_result
from kvplan.simulator.steptime import PlanSteps
from kvplan.simulator.traces import read_trace
from kvplan.simulator.workload import Workload, synthetic
from kvplan.speed import step_model as speed
from kvplan.units import ceil_div

__all__ = ["Deployment", "SimResult", "Workload", "from_plan", "read_trace", "simulate", "synthetic"]


def simulate(
    deployment: Deployment,
    workload: Workload,
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """Serve `workload` on `deployment`; the metrics a benchmark client would report. A deployment of N
    schedulers (data-parallel replicas or vLLM DP engine cores, SGLang's attention-DP ranks) is N
    simulations, scheduler i sent every N-th request from the i-th (round-robin). A --max-concurrency C
    is shared out so that C are in flight in all: C below N keeps C schedulers busy (SGLang's idle
    attention-DP ranks add no tokens to the busy ones' steps), and where N does not divide C the
    schedulers holding one slot more are dealt one request more in each C (the client sends the next
    request whenever any of its C finishes)."""
    shares = deployment.shares
    cap = workload.max_concurrency
    k = max(1, shares if cap is None else min(shares, cap))
    if shares == 1:
        run, _ = simulate_run(deployment, workload, progress)
        return build_result([run], deployment, workload, ttft_ms, tpot_ms)
    deployment = _busy_ranks(deployment, k)
    # slot s of each cycle of C (or of N without a cap) goes to scheduler s mod k: scheduler i holds
    # C // k slots, one more for i < C mod k, and is dealt requests in that proportion
    cycle = cap if cap is not None else k
    parts = []
    for i in range(k):
        mine = tuple(r for j, r in enumerate(workload.requests) if (j % cycle) % k == i)
        if mine:
            c = None if cap is None else cap // k + (1 if i < cap % k else 0)
            parts.append(Workload(mine, c, f"{workload.description}; scheduler {i + 1} of {k}"))
    total = len(workload.requests)
    runs = []
    offset = 0
    for part in parts:
        tick = None if progress is None else _offset_progress(progress, offset, total)
        run, _ = simulate_run(deployment, part, tick)
        runs.append(run)
        offset += len(part.requests)
    if progress is not None:
        progress(total, total)
    return build_result(runs, deployment, workload, ttft_ms, tpot_ms)


def _busy_ranks(deployment: Deployment, busy: int) -> Deployment:
    """A deployment of which only `busy` schedulers get requests (a --max-concurrency below the
    schedulers): a busy SGLang attention-DP rank's step carries the busy ranks' tokens, not every
    rank's; a busy vLLM DP engine core's MoE layers route the busy cores' tokens, the idle cores
    stepping with empty (dummy) batches to keep the group in step (vllm/v1/engine/core.py at v0.11.0,
    DPEngineCoreProc.run_busy_loop: an idle core runs execute_dummy_batch while the group has work)."""
    steps = deployment.steps
    if not isinstance(steps, PlanSteps):
        return deployment
    ranks = deployment.attention_ranks
    per_replica = ceil_div(busy, max(1, deployment.data_parallel_size))
    if ranks > 1 and per_replica < ranks:
        steps = dataclasses.replace(steps, ranks=per_replica, _decode_cache={})
    par = steps.inputs.parallel
    if busy < par.group_tokens:
        inputs = dataclasses.replace(steps.inputs, parallel=dataclasses.replace(par, group_tokens=busy))
        parts = steps.parts
        steps = dataclasses.replace(
            steps,
            decode_step=lambda b, kv, ctx: speed.decode_step(inputs, b, kv, ctx, parts),
            inputs=inputs,
            _decode_cache={},
        )
    return deployment if steps is deployment.steps else dataclasses.replace(deployment, steps=steps)


def _offset_progress(
    progress: Callable[[int, int], None], offset: int, total: int
) -> Callable[[int, int], None]:
    return lambda done, _: progress(offset + done, total)
