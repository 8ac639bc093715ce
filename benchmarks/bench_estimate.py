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
    return [sys.executable, "-m", "kvplan", "estimate", *args]


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
    for cmd in COMMANDS.values():  # every command must really run (exit 0, some output)
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        assert len(out) > 100, f"{cmd} printed nothing"
    print(
        f"{'command':28} {'median ms':>10} {'x baseline':>11}   ({runs} runs each, interleaved with the baseline)"
    )
    for name, cmd in COMMANDS.items():
        base, ms = [], []
        for _ in range(runs):  # alternate, so that load on the machine hits both alike
            base.append(median_ms(BASELINE, 1))
            ms.append(median_ms(cmd, 1))
        b, m = statistics.median(base), statistics.median(ms)
        print(f"{name:28} {m:10.0f} {m / b:11.2f}   (baseline {b:.0f} ms)")


if __name__ == "__main__":
    main()
