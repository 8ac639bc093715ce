"""Time `kvplan estimate` against the bare imports of its stack.

Target (issue 2): a whole `kvplan estimate` run at most ~1.5x the time of
`python -c "import typer, rich, pydantic, yaml"`. Prints medians of N runs of
each command, in milliseconds, and the ratio. Run: python benchmarks/bench_estimate.py [N]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

BASELINE = [sys.executable, "-c", "import typer, rich, pydantic, yaml"]


def kvplan(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvplan.cli", "estimate", *args]


COMMANDS = {
    "estimate (table)": kvplan("--model", "llama3-70b", "--gpus", "8xH100"),
    "estimate --json": kvplan("--model", "llama3-70b", "--gpus", "8xH100", "--json"),
    "estimate alias lookup": kvplan("--model", "meta-llama/Meta-Llama-3-70B", "--gpus", "8xH100", "--json"),
    "estimate gemma3 hybrid": kvplan(
        "--model", "gemma3-27b", "--gpus", "2xH100", "--max-model-len", "32K", "--json"
    ),
}


def median_ms(cmd: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    median_ms(BASELINE, 2)  # warm the file cache
    base = median_ms(BASELINE, runs)
    print(f"{'command':28} {'median ms':>10} {'x baseline':>11}   ({runs} runs each, wall clock)")
    print(f"{'import typer,rich,pydantic,yaml':28} {base:10.0f} {1.0:11.2f}")
    for name, cmd in COMMANDS.items():
        ms = median_ms(cmd, runs)
        print(f"{name:28} {ms:10.0f} {ms / base:11.2f}")


if __name__ == "__main__":
    main()
