"""Workloads as the benchmark clients send them: vLLM's `vllm bench serve` (and SGLang's
bench_serving, which follows the same rules) with the random dataset, a length histogram, or a
replayed trace (traces.py)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from kvplan.errors import UsageError
from kvplan.limits import read_regular
from kvplan.simulator.request import RequestSpec

MAX_REQUESTS = 200_000
MAX_TOKENS_PER_REQUEST = 1 << 24  # 16M tokens: longer is not a request any engine serves
MAX_HISTOGRAM_BYTES = 8 * 2**20


@dataclass(frozen=True)
class Workload:
    """The requests (sorted by send time) and the client's concurrency cap."""

    requests: tuple[RequestSpec, ...]
    max_concurrency: int | None
    description: str

    def __post_init__(self) -> None:
        if not self.requests:
            raise UsageError("the workload has no requests")
        if len(self.requests) > MAX_REQUESTS:
            raise UsageError(f"{len(self.requests):,} requests is over kvplan's limit of {MAX_REQUESTS:,}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise UsageError("--max-concurrency must be >= 1")

    def summary(self) -> dict[str, object]:
        reqs = self.requests
        return {
            "description": self.description,
            "num_requests": len(reqs),
            "max_concurrency": self.max_concurrency,
            "input_tokens_mean": sum(r.prompt_tokens for r in reqs) / len(reqs),
            "output_tokens_mean": sum(r.output_tokens for r in reqs) / len(reqs),
            "last_send_s": reqs[-1].arrival_s,
        }


def arrival_times(n: int, request_rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """vllm/benchmarks/serve.py get_request: gaps drawn from a gamma distribution of shape
    `burstiness` and mean 1 / rate (burstiness 1: Poisson), summed, then scaled so that the last
    request goes out at n / rate; an infinite rate sends everything at t = 0."""
    if math.isinf(request_rate):
        return [0.0] * n
    theta = 1.0 / (request_rate * burstiness)
    t, times = 0.0, []
    for _ in range(n):
        t += rng.gammavariate(burstiness, theta)
        times.append(t)
    scale = (n / request_rate) / times[-1] if times[-1] > 0 else math.inf
    if not math.isfinite(scale):
        # a gamma of so small a shape draws gaps that underflow to 0 (or nearly): no send times to scale
        raise UsageError(
            f"--burstiness {burstiness:g}: the gaps drawn at this shape underflow to 0; give 0.01 or more"
        )
    return [x * scale for x in times]


def uniform_lengths(
    n: int, input_len: int, output_len: int, range_ratio: float, rng: random.Random
) -> list[tuple[int, int]]:
    """vllm/benchmarks/datasets.py RandomDataset.get_sampling_params: integers uniform in
    [floor(len x (1 - r)), ceil(len x (1 + r))], outputs at least 1."""
    if not 0.0 <= range_ratio < 1.0:
        raise UsageError(f"--range-ratio must be in [0, 1), got {range_ratio}")
    in_lo, in_hi = math.floor(input_len * (1 - range_ratio)), math.ceil(input_len * (1 + range_ratio))
    out_lo, out_hi = (
        max(1, math.floor(output_len * (1 - range_ratio))),
        math.ceil(output_len * (1 + range_ratio)),
    )
    in_lo = max(1, in_lo)
    return [(rng.randint(in_lo, in_hi), rng.randint(out_lo, out_hi)) for _ in range(n)]


HISTOGRAM_COLUMNS = ("input_len", "output_len", "weight")


def read_histogram(path: Path) -> list[tuple[int, int, float]]:
    """A length histogram: CSV lines `input_len,output_len,weight`; a header line naming those three columns
    (in any order) says which column is which."""
    text = read_regular(path, MAX_HISTOGRAM_BYTES).decode("utf-8-sig", errors="replace")
    rows: list[tuple[int, int, float]] = []
    order = [0, 1, 2]  # the columns of input_len, output_len, weight
    first = True  # the first line that is neither blank nor a comment may be the header
    for i, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if first and not _numeric(parts[0]):
            first = False
            names = [p.lower() for p in parts]
            if sorted(names) != sorted(HISTOGRAM_COLUMNS):
                raise UsageError(
                    f"{path}:{i}: the header must name the columns {','.join(HISTOGRAM_COLUMNS)}, got {line[:60]!r}"
                )
            order = [names.index(c) for c in HISTOGRAM_COLUMNS]
            continue
        first = False
        try:
            if len(parts) != 3:
                raise ValueError
            inp, out, w = int(parts[order[0]]), int(parts[order[1]]), float(parts[order[2]])
        except ValueError:
            raise UsageError(
                f"{path}:{i}: expected input_len,output_len,weight (integers and a weight), got {line[:60]!r}"
            ) from None
        if not (1 <= inp <= MAX_TOKENS_PER_REQUEST and 1 <= out <= MAX_TOKENS_PER_REQUEST):
            raise UsageError(f"{path}:{i}: lengths must be 1 to {MAX_TOKENS_PER_REQUEST:,} tokens")
        if not (math.isfinite(w) and w >= 0):
            raise UsageError(f"{path}:{i}: the weight must be a finite number >= 0")
        rows.append((inp, out, w))
    if not rows or sum(r[2] for r in rows) <= 0:
        raise UsageError(f"{path}: no rows with a positive weight; write input_len,output_len,weight lines")
    if not math.isfinite(sum(r[2] for r in rows)):
        raise UsageError(f"{path}: the weights add up past the largest number; scale them down")
    return rows


def _numeric(text: str) -> bool:
    """A first field that is not a column name: a number, or anything without a letter (a data row)."""
    try:
        float(text)
    except ValueError:
        return not any(c.isalpha() for c in text)
    return True


# vLLM's random dataset defaults (benchmarks' --random-input-len / --random-output-len)
DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN = 1024, 128


def synthetic(
    num_prompts: int = 1000,
    input_len: int = DEFAULT_INPUT_LEN,
    output_len: int = DEFAULT_OUTPUT_LEN,
    range_ratio: float = 0.0,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    seed: int = 0,
    histogram: Path | None = None,
) -> Workload:
    """Random-dataset requests (vLLM's defaults: 1,000 prompts of 1,024 in / 128 out, all at once),
    or lengths drawn from a histogram; sent at `request_rate` (requests/s) with `burstiness`."""
    if not 1 <= num_prompts <= MAX_REQUESTS:
        raise UsageError(f"--num-prompts must be 1 to {MAX_REQUESTS:,}, got {num_prompts}")
    if not (1 <= input_len <= MAX_TOKENS_PER_REQUEST and 1 <= output_len <= MAX_TOKENS_PER_REQUEST):
        raise UsageError(f"--input-len/--output-len must be 1 to {MAX_TOKENS_PER_REQUEST:,} tokens")
    if not (request_rate > 0 and not math.isnan(request_rate)):
        raise UsageError(f"--request-rate must be > 0 (inf: all at once), got {request_rate}")
    if not (0 < burstiness < 1e6):
        raise UsageError(f"--burstiness must be more than 0 and under 1e+06 (1: Poisson), got {burstiness:g}")
    if burstiness != 1.0 and math.isinf(request_rate):
        raise UsageError(
            f"--burstiness {burstiness:g} shapes the gaps between arrivals at a finite --request-rate; with every "
            "request sent at t = 0 (--request-rate inf, the default) it does not apply: give --request-rate or drop it"
        )
    if (
        not 0 <= seed < 2**32
    ):  # Python's Random takes -n as n: two seeds, one workload; vLLM's seeds are numpy's
        raise UsageError(f"--seed must be 0 to {2**32 - 1:,}, got {seed}")
    rng = random.Random(seed)
    if histogram is not None:
        rows = read_histogram(histogram)
        picks = rng.choices(rows, weights=[r[2] for r in rows], k=num_prompts)
        lengths = [(r[0], r[1]) for r in picks]
        what = f"lengths from {histogram.name}"
    else:
        lengths = uniform_lengths(num_prompts, input_len, output_len, range_ratio, rng)
        what = f"random prompts of {input_len:,} in / {output_len:,} out tokens" + (
            f" (range ratio {range_ratio:g})" if range_ratio else ""
        )
    times = arrival_times(num_prompts, request_rate, burstiness, rng)
    rate = (
        "all at t = 0"
        if math.isinf(request_rate)
        else f"{request_rate:g} requests/s (burstiness {burstiness:g})"
    )
    cap = f", at most {max_concurrency:,} in flight" if max_concurrency else ""
    reqs = tuple(RequestSpec(t, i, o) for t, (i, o) in zip(times, lengths, strict=True))
    what = what.replace("random prompts", "random prompt" if num_prompts == 1 else "random prompts", 1)
    return Workload(reqs, max_concurrency, f"{num_prompts:,} {what}, sent {rate}{cap}; seed {seed}")
