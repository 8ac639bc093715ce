"""What the benchmark client measures (vllm/benchmarks/serve.py calculate_metrics): TTFT, TPOT,
ITL, end-to-end latency, throughput and goodput; plus what the engine knows: prefix-cache hits,
preemptions, KV usage over time."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kvplan.simulator.request import SimRequest

KV_SERIES_POINTS = 240


@dataclass(frozen=True)
class Stats:
    mean: float
    median: float
    p90: float
    p99: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def weighted_stats(samples: list[tuple[float, int]], scale: float = 1e3) -> Stats:
    """Mean and percentiles of values given with counts (numpy's linear interpolation)."""
    samples = [(v, c) for v, c in samples if c > 0]
    total = sum(c for _, c in samples)
    if not total:
        return Stats(0.0, 0.0, 0.0, 0.0)
    samples.sort()
    mean = sum(v * c for v, c in samples) / total

    def pct(q: float) -> float:
        rank = q / 100 * (total - 1)
        lo, frac = int(math.floor(rank)), rank - math.floor(rank)
        seen, a = 0, None
        for v, c in samples:
            if a is None and seen + c > lo:
                a = v
                if seen + c > lo + 1 or frac == 0:
                    return v
            elif a is not None:
                return a + (v - a) * frac
            seen += c
        return samples[-1][0]

    return Stats(mean * scale, pct(50) * scale, pct(90) * scale, pct(99) * scale)


class Recorder:
    """Collects tokens, finished requests, preemptions and KV usage as the engine reports them."""

    def __init__(self) -> None:
        # ITL samples by value: the requests decoding in one step share its duration, so a run keeps about one
        # entry a step, not one a token (200,000 prompts of 128 tokens held 25M tuples)
        self.itl_counts: dict[float, int] = {}
        self.finished_reqs: list[SimRequest] = []
        self.preemptions = 0
        self.kv: list[tuple[float, float]] = []
        self.output_tokens = 0

    def token(self, req: SimRequest, t_s: float, same_chunk: bool = False) -> None:
        """One output token at t_s; `same_chunk`: a further token of the same step (speculative
        decoding), which reaches the client in the same streamed chunk and adds no ITL sample
        (vllm/benchmarks/serve.py appends one ITL per chunk)."""
        self.output_tokens += 1
        if req.first_token_s is None:
            req.first_token_s = t_s
        elif not same_chunk:
            self._itl(t_s - req.last_token_s, 1)
        req.last_token_s = t_s

    def tokens(self, req: SimRequest, t0_s: float, dt_s: float, n: int) -> None:
        """n tokens at t0 + dt, t0 + 2 dt, ...: a run of identical decode steps."""
        self.output_tokens += n
        self._itl(t0_s + dt_s - req.last_token_s, 1)
        if n > 1:
            self._itl(dt_s, n - 1)
        req.last_token_s = t0_s + n * dt_s

    def _itl(self, value: float, count: int) -> None:
        self.itl_counts[value] = self.itl_counts.get(value, 0) + count

    @property
    def itl(self) -> list[tuple[float, int]]:
        """The ITL samples as (value, how many)."""
        return list(self.itl_counts.items())

    def finished(self, req: SimRequest, t_s: float) -> None:
        req.finish_s = t_s
        self.finished_reqs.append(req)

    def preempted(self, req: SimRequest) -> None:
        self.preemptions += 1

    def kv_usage(self, t_s: float, fraction: float) -> None:
        self.kv.append((t_s, fraction))


def kv_series(
    points: list[tuple[float, float]], end_s: float
) -> tuple[list[tuple[float, float]], float, float]:
    """(KV usage resampled to at most KV_SERIES_POINTS (time, highest fraction in each slice),
    the peak, the time-weighted mean)."""
    if not points or end_s <= 0:
        return [], 0.0, 0.0
    peak = max(f for _, f in points)
    area, prev_t, prev_f = 0.0, 0.0, 0.0
    for t, f in points:
        area += prev_f * (t - prev_t)
        prev_t, prev_f = t, f
    mean = area / end_s if end_s else 0.0
    width = end_s / KV_SERIES_POINTS
    top: list[float | None] = [None] * KV_SERIES_POINTS
    last: list[float | None] = [None] * KV_SERIES_POINTS
    for t, f in points:
        i = min(KV_SERIES_POINTS - 1, int(t / width))
        top[i] = f if top[i] is None else max(f, top[i] or 0.0)
        last[i] = f
    level, series = 0.0, []
    for i in range(KV_SERIES_POINTS):  # a slice without a step holds the level before it
        hi = top[i]
        series.append(((i + 1) * width, level if hi is None else max(hi, level)))
        level = level if last[i] is None else last[i] or 0.0
    return series, peak, mean
