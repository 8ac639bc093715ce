"""`kvplan simulate`: a discrete-event simulation of one deployment under load, scheduled by the
engine's own rules (vLLM v1's scheduler and block pool, SGLang's scheduler and radix cache) and
timed by kvplan's step model.

    deployment = deployment.from_plan(plan, request)    # once
    workload = workload.synthetic(...) or traces.read_trace(...)
    result = simulate(deployment, workload)             # as often as a search needs
"""

from __future__ import annotations

from collections.abc import Callable

from kvplan.simulator.deployment import Deployment, from_plan
from kvplan.simulator.loop import simulate_run
from kvplan.simulator.result import SimResult, build_result
from kvplan.simulator.traces import read_trace
from kvplan.simulator.workload import Workload, synthetic

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
    simulations, scheduler i sent every N-th request from the i-th (round-robin); a client holding C < N
    requests in flight keeps C of them busy. A --max-concurrency C is shared out so that exactly C are
    in flight in all."""
    shares = deployment.shares
    cap = workload.max_concurrency
    k = max(1, shares if cap is None else min(shares, cap))
    if k == 1:
        run, _ = simulate_run(deployment, workload, progress)
        return build_result([run], deployment, workload, ttft_ms, tpot_ms)
    parts = []
    for i in range(k):
        mine = workload.requests[i::k]
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


def _offset_progress(
    progress: Callable[[int, int], None], offset: int, total: int
) -> Callable[[int, int], None]:
    return lambda done, _: progress(offset + done, total)
