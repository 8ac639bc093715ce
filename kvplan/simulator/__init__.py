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
from kvplan.simulator.result import SimResult, build_result, scale_shares
from kvplan.simulator.traces import read_trace
from kvplan.simulator.workload import Workload, synthetic
from kvplan.units import ceil_div, ordinal

__all__ = ["Deployment", "SimResult", "Workload", "from_plan", "read_trace", "simulate", "synthetic"]


def simulate(
    deployment: Deployment,
    workload: Workload,
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """Serve `workload` on `deployment`; the metrics a benchmark client would report. A deployment of N
    schedulers (data-parallel replicas or vLLM DP engine cores, SGLang's attention-DP ranks) has one
    simulated on every N-th request (round-robin), the others taken to carry the same load: latencies
    are that one's, throughput, goodput and completed requests the N together."""
    shares = deployment.shares
    if shares <= 1:
        run, _ = simulate_run(deployment, workload, progress)
        return build_result(run, deployment, workload, ttft_ms, tpot_ms)
    cap = workload.max_concurrency
    mine = Workload(
        workload.requests[::shares],
        None if cap is None else ceil_div(cap, shares),
        f"{workload.description}; scheduler 0 of {shares}: every {ordinal(shares)} request",
    )
    run, _ = simulate_run(deployment, mine, progress)
    return scale_shares(build_result(run, deployment, mine, ttft_ms, tpot_ms), shares)
