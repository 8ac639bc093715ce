"""`kvplan solve --request-rate R` and `--max-rate`: the load questions, answered by simulation.

--request-rate R --ttft-ms T --tpot-ms P: the fewest (or cheapest) GPUs, as data-parallel replicas of
the layouts `solve` searches (TP inside a node, PP only when the weights need it, whole nodes unless
--partial-nodes), whose TTFT and TPOT at the --percentile meet the targets when R requests/s are
spread evenly over the replicas: one replica is simulated at R / replicas (kvplan.simulator, Poisson
arrivals or a trace stretched to that rate) and the replica count is bisected (feasibility is taken
as monotone in the replicas: fewer requests/s per replica never slows one down).
--max-rate on -g NxGPU: the highest request rate whose percentiles meet the targets, bisected on the
rate (geometrically, to RATE_TOLERANCE), over the layouts those GPUs take.

Each replica's deployment (its plan, from_plan) is built once per layout, the workload's lengths once
(a rate only rescales the send times: vLLM's bench draws the same gaps, scaled by 1 / rate), and each
simulated (layout, rate) is kept, so a search runs few simulations.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from kvplan.errors import InfeasibleError, NoAnswer, UsageError
from kvplan.search.solve import _PLANS as PLANS
from kvplan.search.solve import (
    ENGINE_DTYPES,
    PLAIN,
    Answer,
    Parallel,
    Query,
    _answer,
    _cost,
    _label,
    _replica,
    _request,
    rented,
    shapes,
    unit_gpus,
)
from kvplan.search.solve import _max_dp as max_replicas
from kvplan.simulator import Deployment, SimResult, Workload, from_plan, simulate
from kvplan.simulator.metrics import Stats
from kvplan.units import ordinal

SCHEMA = "kvplan.solve-rate/1"
PERCENTILES = {50: "median", 90: "p90", 99: "p99"}
RATE_TOLERANCE = 0.02  # --max-rate: the bisection stops when the bracket is within 2%
SOLO_PROMPTS = 10  # the "tiny load" check: this many requests, one at a time


MAX_TARGET_MS = 1e9  # 11.6 days: past any latency target


def check_target_ms(name: str, v: float) -> None:
    """A latency target: more than 0 and under MAX_TARGET_MS milliseconds (NaN is neither)."""
    if not 0 < v < MAX_TARGET_MS:
        raise UsageError(f"{name} must be more than 0 and under {MAX_TARGET_MS:.0e} milliseconds, got {v:g}")


# the TPOT "target" of a pool whose requests emit one token each (a disaggregated prefill pool): none applies
NO_TPOT_MS = 1e8


@dataclass(frozen=True)
class LoadTargets:
    ttft_ms: float
    tpot_ms: float
    percentile: int = 90

    def __post_init__(self) -> None:
        for name, v in (("--ttft-ms", self.ttft_ms), ("--tpot-ms", self.tpot_ms)):
            check_target_ms(name, v)
        if self.percentile not in PERCENTILES:
            raise UsageError(f"--percentile must be 50, 90 or 99, got {self.percentile}")

    def of(self, s: Stats) -> float:
        return float(getattr(s, PERCENTILES[self.percentile]))

    def to_dict(self) -> dict[str, Any]:
        tpot = None if self.tpot_ms >= NO_TPOT_MS else self.tpot_ms  # null: no TPOT target applies
        return {"ttft_ms": self.ttft_ms, "tpot_ms": tpot, "percentile": self.percentile}


class ScaledWorkload:
    """A workload's requests, sent at any mean rate: the base send times rescaled (cached per rate)."""

    def __init__(self, base: Workload) -> None:
        self.base = base
        last = base.requests[-1].arrival_s
        self.base_rate = len(base.requests) / last if last > 0 else math.inf

    def check_spread(self) -> None:
        """Refuse a workload whose requests all go out at t = 0: there are no gaps to rescale."""
        if math.isinf(self.base_rate):
            n = len(self.base.requests)
            raise UsageError(
                f"the workload sends {'its one request' if n == 1 else f'all {n:,} requests'} at t = 0 "
                f"({self.base.description}): there are no gaps to rescale to a rate; give a trace whose requests "
                "are spread in time, or a synthetic workload (--num-prompts, --input-len, --output-len)"
            )

    def at(self, rate: float) -> Workload:
        self.check_spread()
        k = self.base_rate / rate
        reqs = tuple(dataclasses.replace(r, arrival_s=r.arrival_s * k) for r in self.base.requests)
        what = self.base.description.split(", sent ")[0]  # the synthetic workload's send rule is replaced
        return Workload(reqs, None, f"{what}, sent at {rate:.4g} requests/s (the workload's gaps rescaled)")

    def dealt(self, rate: float, replicas: int) -> Workload:
        """What one of `replicas` deployments receives of a stream at `rate` requests/s, dealt round-robin
        (every N-th request, as `simulate -dp N` and SGLang's round-robin router deal them; vLLM's DP
        front end balances at least as evenly). The stream is the workload cycled, its gaps rescaled to
        `rate` (where it wraps round, the mean gap between distinct send times); this replica takes stream
        positions N - 1, 2N - 1, ... n x N - 1, each request with its own lengths and prefixes at its own
        slot, so every request of the workload reaches it once: where N and n share a factor g, each
        lcm(n, N) positions of the stream move on by one request (at most g - 1 away from its slot)."""
        if replicas <= 1:
            return self.at(rate)
        self.check_spread()
        base = self.base.requests
        n = len(base)
        gaps = [base[0].arrival_s] + [base[i].arrival_s - base[i - 1].arrival_s for i in range(1, n)]
        if (
            gaps[0] <= 0
        ):  # a trace starts at 0: where it wraps round, the mean gap between distinct send times
            apart = [g for g in gaps[1:] if g > 0]  # (a burst's requests share one time: its gaps are 0)
            gaps[0] = sum(apart) / len(apart) if apart else 0.0
        k = n / rate / (sum(gaps) or 1.0)  # the cycled stream's mean rate is `rate` exactly
        period = math.lcm(n, replicas)
        reqs, t = [], 0.0
        for j in range(n):  # this replica's j-th request is the stream's position j N + N - 1: N gaps on
            t += k * sum(gaps[(j * replicas + m) % n] for m in range(replicas))
            pos = j * replicas + replicas - 1
            reqs.append(dataclasses.replace(base[(pos + pos // period) % n], arrival_s=t))
        what = self.base.description.split(", sent ")[0]
        return Workload(
            tuple(reqs), None,
            f"{what}: every {ordinal(replicas)} request of a stream at {rate:.4g} requests/s (the workload "
            "cycled, its gaps rescaled)",
        )  # fmt: skip

    def solo(self) -> Workload:
        """The first requests, one at a time: what a target costs at no load."""
        reqs = tuple(dataclasses.replace(r, arrival_s=0.0) for r in self.base.requests[:SOLO_PROMPTS])
        return Workload(reqs, 1, f"{len(reqs)} of the workload's requests, one at a time")


@dataclass
class Point:
    """One simulated load on one replica."""

    rate: float  # requests/s, all replicas together
    per_replica: float
    ttft_ms: float  # at the percentile
    tpot_ms: float
    meets: bool
    failed: int


@dataclass
class Candidate:
    gpu: Any  # GpuSpec
    tp: int
    pp: int
    dtype: str
    deployment: Deployment
    plan: Any  # Plan
    results: dict[tuple[float, int], SimResult] = field(default_factory=dict)  # (per-replica rate, replicas)
    par: Parallel = PLAIN  # an expert-parallel unit (DP attention ranks / vLLM DP engine cores)
    unit: int = 0  # GPUs of one deployment (unit_gpus); simulate deals its requests over its schedulers
    layout: str = ""  # solve's label of the layout (TP x PP, or the expert-parallel unit)

    @property
    def label(self) -> str:
        return f"{self.gpu.name} {self.layout or f'TP {self.tp} x PP {self.pp}'}, KV {self.dtype}"


@dataclass
class RateAnswer:
    mode: str  # min-gpus-at-rate | max-rate
    layout: Answer  # GPUs, layout, KV dtype, launch lines
    request_rate: float  # all replicas together
    per_replica_rate: float
    targets: LoadTargets
    result: SimResult  # one replica at per_replica_rate
    points: list[Point]  # every load simulated for this layout, by rate
    simulations: int  # runs in the whole search
    wall_s: float
    limited_by: str  # what bounds the answer

    def __repr__(self) -> str:
        """One line, as `solve --request-rate` / `--max-rate` sums it up (not every simulated point)."""
        a = self.layout
        return (
            f"{self.mode}: {a.num_gpus}x {a.gpu} (TP {a.tensor_parallel_size} x PP {a.pipeline_parallel_size} x "
            f"DP {a.data_parallel_size}), KV {a.kv_cache_dtype} at {self.request_rate:.4g} requests/s: "
            f"p{self.targets.percentile} TTFT {self.targets.of(self.result.ttft_ms):,.1f} ms, TPOT "
            f"{self.targets.of(self.result.tpot_ms):,.1f} ms; bounded by {self.limited_by}"
        )

    @property
    def goodput(self) -> float:
        """Requests/s meeting both targets, all replicas together: at most the rate sent (one replica's short
        sample, scaled by the replicas, can finish its requests in less time than they were sent over)."""
        return min((self.result.goodput or 0.0) * self.layout.data_parallel_size, self.request_rate)

    def to_dict(self) -> dict[str, Any]:
        a = self.layout.to_dict()
        for k in (
            "margins",
            "decode_step",
            "tpot_ms",
            "tpot_source",
            "tpot_context_tokens",
            "tpot_context_source",
        ):
            a.pop(k, None)
        r = self.result
        return {
            "schema": SCHEMA,
            "mode": self.mode,
            "targets": self.targets.to_dict(),
            "request_rate": self.request_rate,
            "per_replica_rate": self.per_replica_rate,
            "answer": a,
            "ttft_ms": r.ttft_ms.to_dict(),
            "tpot_ms": r.tpot_ms.to_dict(),
            "goodput": self.goodput,
            "output_token_throughput": r.output_token_throughput * self.layout.data_parallel_size,
            "limited_by": self.limited_by,
            "workload": r.workload,
            "points": [dataclasses.asdict(p) for p in self.points],
            "simulations": self.simulations,
            "wall_s": self.wall_s,
            "assumptions": list(r.assumptions),
            "chart": None,  # the file --plot wrote (the command line fills it in)
        }


def check_lengths(q: Query, workload: Workload) -> None:
    """Refuse a workload with requests the engine turns away (prompt + output over the context): every run
    would count them failed, and the search would blame the targets or the GPUs."""
    ctx = q.max_model_len or q.model.max_context
    over = [
        r.prompt_tokens + r.output_tokens
        for r in workload.requests
        if r.prompt_tokens + r.output_tokens > ctx
    ]
    if over:
        n = len(workload.requests)
        raise UsageError(
            f"{len(over):,} of the workload's {n:,} requests need more than {ctx:,} tokens (prompt + output, the "
            f"longest {max(over):,}), which the engine refuses whatever the GPUs: "
            + (
                f"give --max-model-len {max(over)} or more, or leave them out of the workload"
                if max(over) <= q.model.max_context
                else f"{q.model.name}'s context is {q.model.max_context:,} tokens, so no GPUs serve them with "
                "this model: leave them out of the workload, or plan a model with a longer context"
            )
        )


# told the count of simulated loads after each one (the CLI's progress line); None: nobody listens
ON_SIMULATION: ContextVar[Callable[[int], None] | None] = ContextVar(
    "kvplan_rate_on_simulation", default=None
)


class Search:
    """The layouts to try, their deployments, and every simulation run (kept)."""

    def __init__(self, q: Query, workload: Workload, targets: LoadTargets) -> None:
        check_lengths(q, workload)
        self.q = q
        self.work = ScaledWorkload(workload)
        self.work.check_spread()
        self.targets = targets
        self.simulations = 0
        self.reasons: list[str] = []

    def candidates(self) -> list[Candidate]:
        """Every (GPU, KV dtype, TP, PP) solve would consider, and for an MoE model its expert-parallel
        units (solve.ep_layouts: DP attention ranks, vLLM's DP engine cores over EP), cheapest
        deployment first; at equal cost plain TP first, as `solve --users` ranks them."""
        out = []
        q = self.q
        for gpu in q.gpus:
            for dtype in q.kv_dtypes:
                for tp, pp, par in shapes(q, gpu, dtype):
                    unit = unit_gpus(q, tp, pp, par)
                    fixed = q.fixed_num_gpus
                    if fixed is not None and (unit > fixed or fixed % unit):
                        continue
                    if fixed is None and max_replicas(q, gpu, unit) < 1:
                        continue
                    ctx = q.max_model_len or q.model.max_context
                    try:
                        plan = _replica(q, gpu, tp, pp, dtype, ctx, par)
                        dep = from_plan(plan, _request(q, gpu, tp, pp, dtype, ctx, par))
                    except InfeasibleError as exc:
                        self.reasons.append(f"{gpu.name} {_label(q, tp, pp, par)} ({dtype}): {exc}")
                        continue
                    out.append(
                        Candidate(gpu, tp, pp, dtype, dep, plan, {}, par, unit, _label(q, tp, pp, par))
                    )
        quality = {d: i for i, d in enumerate(ENGINE_DTYPES)}
        out.sort(key=lambda c: (_cost(q, c.gpu, rented(q, c.gpu, c.unit, 1)[1]),
                                c.par.on, quality.get(c.dtype, 9), c.pp, c.tp))  # fmt: skip
        return out

    def run(self, c: Candidate, per_replica: float, replicas: int = 1) -> SimResult:
        """One deployment of `replicas`, at `per_replica` requests/s: dealt every N-th request of the whole
        stream (ScaledWorkload.dealt), as `simulate -dp N` deals them."""
        key = (per_replica, replicas if per_replica else 1)
        if key not in c.results:
            self.simulations += 1
            w = self.work.solo() if per_replica == 0 else self.work.dealt(per_replica * replicas, replicas)
            c.results[key] = simulate(c.deployment, w, self.targets.ttft_ms, self.targets.tpot_ms)
            if (hook := ON_SIMULATION.get()) is not None:
                hook(self.simulations)
        return c.results[key]

    def meets(self, r: SimResult) -> bool:
        t = self.targets
        return (
            not r.failed and r.completed > 0 and t.of(r.ttft_ms) <= t.ttft_ms and t.of(r.tpot_ms) <= t.tpot_ms
        )

    def points(self, c: Candidate, dp: int) -> list[Point]:
        t = self.targets
        return [
            Point(rate * dp, rate, t.of(r.ttft_ms), t.of(r.tpot_ms), self.meets(r), sum(r.failed.values()))
            for (rate, n), r in sorted(c.results.items())
            if rate > 0 and n == dp
        ]

    def solo_verdict(self, cands: list[Candidate]) -> str | None:
        """When even a lone request misses a target on every layout: which, and by how much."""
        t, p = self.targets, self.targets.percentile
        best: tuple[float, float, Candidate, SimResult] | None = None
        for c in cands:
            r = self.run(c, 0)
            if r.failed:
                self.reasons.append(f"{c.label}: {', '.join(r.failed)}")
                continue
            if self.meets(r):
                return None
            key = (max(t.of(r.ttft_ms) / t.ttft_ms, t.of(r.tpot_ms) / t.tpot_ms), 0.0)
            if best is None or key[0] < best[0]:
                best = (key[0], 0.0, c, r)
        if best is None:
            return "no layout can serve these requests: " + "; ".join(self.reasons[:3])
        _, _, c, r = best
        if t.of(r.ttft_ms) > t.ttft_ms:
            return (
                f"--ttft-ms {t.ttft_ms:g}: even one prompt alone takes {t.of(r.ttft_ms):,.1f} ms to its first "
                f"token (p{p}, {c.label}, the fastest layout); relax the target or shorten the prompts"
            )
        return (
            f"--tpot-ms {t.tpot_ms:g}: even one request alone decodes at {t.of(r.tpot_ms):,.2f} ms per token "
            f"(p{p}, {c.label}, the fastest layout); relax the target or use faster GPUs"
        )


def _answer_for(s: Search, c: Candidate, dp: int, n: int, nodes: int, rate: float, mode: str, start: float,
                limited_by: str) -> RateAnswer:  # fmt: skip
    per = rate / dp
    r = s.run(c, per, dp)
    _check_steady(s, per, r, dp)
    held = dp * c.deployment.max_num_seqs * c.deployment.shares
    layout = _answer(
        dataclasses.replace(s.q, users=held),
        c.gpu, c.plan, c.tp, c.pp, dp, c.dtype, s.targets.of(r.tpot_ms), n, nodes, c.par,
    )  # fmt: skip
    return RateAnswer(mode, layout, rate, per, s.targets, r, s.points(c, dp), s.simulations,
                      time.perf_counter() - start, limited_by)  # fmt: skip


def _check_steady(s: Search, per_replica: float, r: SimResult, replicas: int = 1) -> None:
    """An answer stands only on a run that reached the load it names: the requests must arrive over at
    least one request's mean end-to-end latency (Little's law: fewer than that are a burst drained by an
    idle deployment, not a rate it keeps up with)."""
    n = len(s.work.base.requests)
    span = s.work.dealt(per_replica * replicas, replicas).requests[-1].arrival_s
    e2e = r.e2el_ms.mean / 1000.0
    if r.completed == 0 or not math.isfinite(e2e) or span >= e2e:
        return
    need = _nice_up(n * e2e / span)
    raise UsageError(
        f"--num-prompts {n}: at {per_replica:,.4g} requests/s per deployment "
        + ("it is sent at once" if n == 1 else f"they are all sent within {span:,.3g} s")
        + f", less than a request's mean {e2e:,.3g} s end to end, so the run is a burst, not a steady load; "
        f"give --num-prompts {need} or more"
    )


def _nice_up(x: float) -> int:
    """x rounded up to 1, 2 or 5 times a power of ten."""
    p = 10 ** math.floor(math.log10(max(x, 1.0)))
    return next(int(m * p) for m in (1, 2, 5, 10) if m * p >= x)


def min_gpus_at_rate(q: Query, workload: Workload, targets: LoadTargets, rate: float) -> RateAnswer:
    """The cheapest replicas of a layout meeting the targets at `rate` requests/s."""
    if not (0 < rate < math.inf):
        raise UsageError(f"--request-rate must be a positive number of requests/s, got {rate}")
    start = time.perf_counter()
    PLANS.clear()
    try:
        s = Search(q, workload, targets)
        cands = s.candidates()
        best: tuple[tuple, Candidate, int, int, int, str] | None = None
        last_fail: tuple[tuple[int, float], Candidate, int, int, SimResult] | None = None  # the closest miss
        for c in cands:
            replica = c.unit
            options = sorted(
                {rented(q, c.gpu, replica, k) for k in range(1, max_replicas(q, c.gpu, replica) + 1)}
            )
            rank = lambda o, c=c: (_cost(q, c.gpu, o[1]), o[1])  # noqa: E731
            if best is not None:  # only what could beat the best so far
                options = [o for o in options if rank(o) < best[0]]
            if not options:
                continue
            top = options[-1]
            r = s.run(c, rate / top[0], top[0])
            if not s.meets(r):
                score = (
                    -top[1],
                    max(targets.of(r.ttft_ms) / targets.ttft_ms, targets.of(r.tpot_ms) / targets.tpot_ms),
                )
                if last_fail is None or score < last_fail[0]:
                    last_fail = (score, c, top[0], top[1], r)
                continue
            lo, hi = -1, len(options) - 1  # options[hi] meets; options[lo] (lo >= 0) does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if s.meets(s.run(c, rate / options[mid][0], options[mid][0])):
                    hi = mid
                else:
                    lo = mid
            dp, n, nodes = options[hi]
            best = (rank(options[hi]), c, dp, n, nodes, _why_size(c, n, hi))
        if best is None:
            verdict = s.solo_verdict(cands) if cands else None
            figures: dict[str, Any] = {}
            if verdict is None and last_fail is not None:
                _, c, dp, n, r = last_fail
                p = targets.percentile
                figures = {
                    "gpus": n, "gpu": c.gpu.name, "layout": c.label, "replicas": dp, "request_rate_per_s": rate,
                    f"ttft_p{p}_ms": targets.of(r.ttft_ms), f"tpot_p{p}_ms": targets.of(r.tpot_ms),
                    "requests_refused": sum(r.failed.values()),
                }  # fmt: skip
                verdict = (
                    f"at {rate:g} requests/s the most replicas within --max-gpus {q.max_gpus} ({n}x {c.gpu.name}, "
                    f"{c.label}, DP {dp}: {rate / dp:,.4g} requests/s each deployment) reach TTFT p{p} "
                    f"{targets.of(r.ttft_ms):,.0f} ms, TPOT p{p} {targets.of(r.tpot_ms):,.1f} ms"
                    + (f", {sum(r.failed.values())} requests refused" if r.failed else "")
                    + f" (targets {targets.ttft_ms:g} / {targets.tpot_ms:g} ms); allow more GPUs or relax the targets"
                )
            raise NoAnswer(verdict or "no layout meets the targets: " + "; ".join(s.reasons[:3]), **figures)
        _, c, dp, n, nodes, why = best
        return _answer_for(s, c, dp, n, nodes, rate, "min-gpus-at-rate", start, why)
    finally:
        PLANS.clear()


def _too_short(n: int, what: str) -> NoAnswer:
    """--max-rate on a workload too short to load the GPUs: what shows it, and how many requests to give."""
    return NoAnswer(
        f"{what}; too few to load the GPUs: give --num-prompts {_nice_up(max(1000, 10 * n))} or more "
        "(or a longer trace)"
    )


def _why_size(c: Candidate, n: int, index: int) -> str:
    """What sets the answer's size: the targets (a size smaller misses them), or the smallest rental of the
    layout, which already meets them."""
    if index > 0:
        return "the targets (the next size down misses them)"
    if n > c.unit:
        return (
            f"whole nodes: {n} GPUs is this layout's smallest rental ({c.unit} a replica), and it meets the targets "
            "with room; --partial-nodes rents part of a node"
        )
    return "the smallest deployment of this layout: one replica meets the targets"


def max_rate(q: Query, workload: Workload, targets: LoadTargets) -> RateAnswer:
    """On q.fixed_num_gpus GPUs: the highest request rate (all replicas) meeting the targets."""
    assert q.fixed_num_gpus is not None
    start = time.perf_counter()
    PLANS.clear()
    try:
        s = Search(q, workload, targets)
        cands = s.candidates()
        if not cands:
            raise NoAnswer(
                f"no layout fits {q.fixed_num_gpus}x {q.gpus[0].name}: " + "; ".join(s.reasons[:3])
            )
        verdict = s.solo_verdict(cands)
        if verdict is not None:
            raise NoAnswer(verdict)
        best: tuple[float, Candidate, str] | None = None
        for c in cands:
            if s.meets(s.run(c, 0)) is False:
                continue
            dp = q.fixed_num_gpus // c.unit
            got = _max_rate_of(s, c, dp, None if best is None else best[0])
            if got is not None and (best is None or got[0] > best[0]):
                best = (got[0], c, got[1])
        if best is None:
            # one request alone meets them, but requests the workload sends together (a trace's bursts stay bursts
            # whatever its gaps are rescaled to) miss them at every rate
            raise NoAnswer(
                "no rate meets the targets on these GPUs: one request alone meets them, but the workload's requests "
                "sent at the same moment (a trace's bursts stay bursts at any rate) miss them even with everything "
                "else far apart; relax --ttft-ms, or run kvplan simulate on the trace to see its TTFT"
            )
        rate, c, why = best
        dp = q.fixed_num_gpus // c.unit
        n = q.fixed_num_gpus
        nodes = -(-n // c.gpu.gpus_per_node)
        return _answer_for(s, c, dp, n, nodes, rate, "max-rate", start, why)
    finally:
        PLANS.clear()


def _max_rate_of(s: Search, c: Candidate, dp: int, beat: float | None) -> tuple[float, str] | None:
    """The highest rate (all replicas) at which `c` meets the targets, or None when it cannot beat `beat`.
    The bracket's top is the replica's throughput with every request sent at once (a higher rate only
    queues); the bisection is geometric, to RATE_TOLERANCE."""
    n = len(s.work.base.requests)
    flood = Workload(
        tuple(dataclasses.replace(r, arrival_s=0.0) for r in s.work.base.requests), None, "all at t = 0"
    )
    s.simulations += 1
    at_once = simulate(c.deployment, flood, s.targets.ttft_ms, s.targets.tpot_ms)
    if s.meets(at_once):  # no rate loads the replicas past the targets: the workload is too short to ask
        t, p = s.targets, s.targets.percentile
        sent = (
            "the workload's one request sent at once still reaches"
            if n == 1
            else f"all {n:,} of the workload's requests sent at once still reach"
        )
        raise _too_short(
            n, f"every rate meets the targets on {c.label}: {sent} TTFT p{p} {t.of(at_once.ttft_ms):,.0f} ms and "
            f"TPOT p{p} {t.of(at_once.tpot_ms):,.1f} ms"
        )  # fmt: skip
    saturated = at_once.request_throughput
    cap = saturated * dp
    if cap <= 0:
        return None
    if beat is not None:  # to replace the best so far (a better KV dtype, fewer stages), beat it clearly
        lo = beat * (1 + RATE_TOLERANCE)
        if lo >= cap or not s.meets(s.run(c, lo / dp, dp)):
            return None
    else:
        lo = cap / 2 ** max(4, math.ceil(math.log2(max(n, 2))))
        while True:  # the solo check passed: a low enough rate meets them, unless requests sent together miss
            try:
                if s.meets(s.run(c, lo / dp, dp)):
                    break
            except UsageError:  # spread past the simulator's bound: no rate it can run meets them
                return None
            lo /= 4
            if lo < cap * 1e-9:
                return None
    hi = cap
    if s.meets(s.run(c, hi / dp, dp)):
        # the flood's throughput is the replicas' only for a workload long enough to fill them: a short one
        # drains before it does, so look above it until a rate misses
        lo, hi = hi, 2 * hi
        while s.meets(s.run(c, hi / dp, dp)):
            lo, hi = hi, 2 * hi
            if hi > cap * 2**6:
                raise _too_short(
                    n, f"every rate up to {lo:,.4g} requests/s meets the targets on {c.label}, {lo / cap:.0f}x what "
                    f"the replicas get through with all {n:,} requests sent at once"
                )  # fmt: skip
    while hi / lo > 1 + RATE_TOLERANCE:
        mid = math.sqrt(lo * hi)
        if s.meets(s.run(c, mid / dp, dp)):
            lo = mid
        else:
            hi = mid
    if lo >= cap / (1 + RATE_TOLERANCE) and lo <= cap * (1 + RATE_TOLERANCE):
        return lo, f"the replicas' throughput ({saturated:.3g} requests/s each): a higher rate only queues"
    return lo, f"the targets (within {RATE_TOLERANCE:.0%} of the rate)"
