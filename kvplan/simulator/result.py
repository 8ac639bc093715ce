"""The simulation's result: what a benchmark client would print, and what the engine saw."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvplan.simulator.deployment import Deployment
from kvplan.simulator.loop import Run
from kvplan.simulator.metrics import Stats, kv_series, weighted_stats
from kvplan.simulator.workload import Workload
from kvplan.units import plural

SCHEMA = "kvplan.simulate/1"


@dataclass(frozen=True)
class SimResult:
    deployment: dict[str, Any]
    workload: dict[str, Any]
    completed: int
    failed: dict[str, int]  # reason -> requests the engine refuses
    duration_s: float
    ttft_ms: Stats
    tpot_ms: Stats
    itl_ms: Stats
    e2el_ms: Stats
    request_throughput: float  # requests/s
    output_token_throughput: float  # tokens/s
    total_token_throughput: float  # tokens/s, prompt + output
    goodput: float | None  # requests/s meeting --ttft-ms/--tpot-ms
    slo: dict[str, float]
    prefix_cache_hit_tokens: int
    prefix_cache_query_tokens: int
    prefill_tokens: int  # computed by prefill, recomputation after preemption included
    preemptions: int
    preempted_requests: int
    kv_usage: list[tuple[float, float]]  # (s, fraction of the pool), resampled
    kv_usage_peak: float
    kv_usage_mean: float
    steps: int
    assumptions: list[str] = field(default_factory=list)

    @property
    def prefix_cache_hit_rate(self) -> float:
        return (
            self.prefix_cache_hit_tokens / self.prefix_cache_query_tokens
            if self.prefix_cache_query_tokens
            else 0.0
        )

    def __repr__(self) -> str:
        d = self.deployment
        return (
            f"SimResult({d['engine']} {d['model']}: {plural(self.completed, 'request')} in {self.duration_s:,.1f} s; "
            f"TTFT p50 {self.ttft_ms.median:,.0f} ms, TPOT p50 {self.tpot_ms.median:,.1f} ms, "
            f"{self.output_token_throughput:,.0f} output tok/s, prefix hits {self.prefix_cache_hit_rate:.1%}, "
            f"{self.preemptions:,} preemptions, KV peak {self.kv_usage_peak:.0%})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "deployment": self.deployment,
            "workload": self.workload,
            "completed": self.completed,
            "failed": self.failed,
            "duration_s": self.duration_s,
            "ttft_ms": self.ttft_ms.to_dict(),
            "tpot_ms": self.tpot_ms.to_dict(),
            "itl_ms": self.itl_ms.to_dict(),
            "e2el_ms": self.e2el_ms.to_dict(),
            "request_throughput": self.request_throughput,
            "output_token_throughput": self.output_token_throughput,
            "total_token_throughput": self.total_token_throughput,
            "goodput": self.goodput,
            "slo": self.slo,
            "prefix_cache": {
                "hit_tokens": self.prefix_cache_hit_tokens,
                "query_tokens": self.prefix_cache_query_tokens,
                "hit_rate": self.prefix_cache_hit_rate,
            },
            "prefill_tokens": self.prefill_tokens,
            "preemptions": self.preemptions,
            "preempted_requests": self.preempted_requests,
            "kv_usage": {
                "peak": self.kv_usage_peak,
                "mean": self.kv_usage_mean,
                "series": [{"t_s": t, "fraction": f} for t, f in self.kv_usage],
            },
            "steps": self.steps,
            "assumptions": self.assumptions,
            "chart": None,  # the file --plot wrote (the command line fills it in)
        }


def build_result(
    runs: Sequence[Run],
    deployment: Deployment,
    workload: Workload,
    ttft_ms: float | None,
    tpot_ms: float | None,
) -> SimResult:
    """The client's figures over every scheduler's run (one per DP replica, engine core or attention-DP
    rank, each given its share of the requests): latencies over all requests, throughput over the
    whole run; KV usage that of the busiest scheduler."""
    done = [r for run in runs for r in run.rec.finished_reqs]
    ttft, tpot, e2el = [], [], []
    good = 0
    for r in done:
        first = r.first_token_s if r.first_token_s is not None else r.finish_s or 0.0
        t_ttft = first - r.enter_s
        t_e2e = (r.finish_s or 0.0) - r.enter_s
        t_tpot = (t_e2e - t_ttft) / (r.num_output - 1) if r.num_output > 1 else 0.0
        ttft.append((t_ttft, 1))
        e2el.append((t_e2e, 1))
        if r.num_output > 1:
            tpot.append((t_tpot, 1))
        ok = (ttft_ms is None or t_ttft * 1e3 <= ttft_ms) and (tpot_ms is None or t_tpot * 1e3 <= tpot_ms)
        good += ok
    # vllm/benchmarks/serve.py: the duration runs from the benchmark's start, before the first send's
    # delay, to the last response, so throughput never exceeds the rate sent
    end = max((r.finish_s or 0.0 for r in done), default=0.0)
    duration = max(end, 1e-12) if done else 0.0
    out_tokens = sum(r.num_output for r in done)
    in_tokens = sum(r.spec.prompt_tokens for r in done)
    busiest = max(runs, key=lambda run: kv_series(run.rec.kv, run.now)[1])
    # over the whole run (the last scheduler's end), not the busiest one's own span
    series, peak, mean = kv_series(busiest.rec.kv, max(run.now for run in runs))
    reqs = [r for run in runs for r in run.reqs]
    failed: dict[str, int] = {}
    for run in runs:
        for why, n in run.failed.items():
            failed[why] = failed.get(why, 0) + n
    slo = {k: v for k, v in (("ttft_ms", ttft_ms), ("tpot_ms", tpot_ms)) if v is not None}
    assumptions = list(deployment.assumptions)
    return SimResult(
        deployment=deployment.summary(),
        workload=workload.summary(),
        completed=len(done),
        failed=failed,
        duration_s=duration,
        ttft_ms=weighted_stats(ttft),
        tpot_ms=weighted_stats(tpot),
        itl_ms=weighted_stats([x for run in runs for x in run.rec.itl]),
        e2el_ms=weighted_stats(e2el),
        request_throughput=len(done) / duration if done else 0.0,
        output_token_throughput=out_tokens / duration if done else 0.0,
        total_token_throughput=(in_tokens + out_tokens) / duration if done else 0.0,
        goodput=good / duration if slo and done else None,
        slo=slo,
        prefix_cache_hit_tokens=sum(r.hit_tokens for r in reqs),
        prefix_cache_query_tokens=sum(r.queried_tokens for r in reqs),
        prefill_tokens=sum(r.prefill_tokens for r in reqs),
        preemptions=sum(run.rec.preemptions for run in runs),
        preempted_requests=sum(1 for r in reqs if r.preemptions),
        kv_usage=series,
        kv_usage_peak=peak,
        kv_usage_mean=mean,
        steps=sum(run.engine_steps for run in runs),
        assumptions=assumptions,
    )
