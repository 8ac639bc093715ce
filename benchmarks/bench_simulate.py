"""Wall time of `kvplan simulate`'s engine on one core: the whole Mooncake conversation trace
(12,031 requests; target under 30 s) and a 1,000-request random workload (target under 2 s).

It counts the simulation alone (kvplan.simulator.simulate on a prepared deployment and workload),
not planning or reading the trace, and prints the simulated figures beside the wall time.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvplan.commands import inputs
from kvplan.plan.plan import estimate
from kvplan.simulator import from_plan, read_trace, simulate, synthetic

TRACE = (
    Path(__file__).resolve().parent.parent
    / "tests"
    / "fixtures"
    / "traces"
    / "mooncake_conversation_trace.jsonl"
)


def deployment(model: str, gpus: str, max_model_len: str, engine: str):
    req = inputs.plan_request(
        inputs.EstimateFlags(model=model, gpus=gpus, max_model_len=max_model_len, engine=engine)
    )
    return from_plan(estimate(req), req)


def timed(label: str, d, w) -> float:
    start = time.perf_counter()
    r = simulate(d, w)
    wall = time.perf_counter() - start
    print(f"{label}: {wall:.2f} s wall, {r.steps:,} engine steps simulated; {r!r}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="llama3.1-8b")
    ap.add_argument("--gpus", default="8xH200")
    ap.add_argument("--max-model-len", default="128K")
    ap.add_argument("--engine", default="vllm", choices=["vllm", "sglang", "both"])
    args = ap.parse_args()
    engines = ["vllm", "sglang"] if args.engine == "both" else [args.engine]
    trace = read_trace(TRACE)
    random_1k = synthetic(num_prompts=1000, request_rate=20.0, seed=0)
    for engine in engines:
        d = deployment(args.model, args.gpus, args.max_model_len, engine)
        print(f"{engine}: {d.model} on {d.gpus}, {d.num_gpu_blocks:,} blocks of {d.block_size}")
        t1 = timed(f"  Mooncake conversation trace ({len(trace.requests):,} requests)", d, trace)
        t2 = timed("  1,000 random requests (1,024 in / 128 out, 20 req/s)", d, random_1k)
        print(f"  targets: trace < 30 s ({'met' if t1 < 30 else 'MISSED'}), 1,000 requests < 2 s "
              f"({'met' if t2 < 2 else 'MISSED'})")  # fmt: skip


if __name__ == "__main__":
    main()
