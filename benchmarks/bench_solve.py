"""Time `kvplan solve` (issue 6 target: a typical solve under 1 s).

Prints, for a few typical questions, the median wall time of the whole command (process start,
imports, search, output) and of the search alone in-process, in milliseconds, and how many
layouts were planned. Run: python benchmarks/bench_solve.py [N]
"""

from __future__ import annotations

import importlib
import statistics
import subprocess
import sys
import time

from kvplan.plan import plan as plan_module
from kvplan.search.solve import Query, solve
from kvplan.specs.registry import load_gpu, load_model

CASES = {
    "llama3-70b, 500 users, 8K, TPOT<=50ms, H100": (
        {"model": "llama3-70b", "gpus": ("H100",), "users": 500, "max_model_len": 8192, "tpot_ms": 50.0},
        ["-m", "llama3-70b", "--users", "500", "--context", "8K", "--tpot-ms", "50"],
    ),
    "llama3-8b, 300 users, 8K, H100": (
        {"model": "llama3-8b", "gpus": ("H100",), "users": 300, "max_model_len": 8192},
        ["-m", "llama3-8b", "--users", "300", "--context", "8K"],
    ),
    "deepseek-v3, 200 users, 32K, H200,B200 priced": (
        {
            "model": "deepseek-v3",
            "gpus": ("H200", "B200"),
            "users": 200,
            "max_model_len": 32768,
            "prices": {"H200": 3.8, "B200": 5.5},
        },
        [
            "-m",
            "deepseek-v3",
            "--users",
            "200",
            "--context",
            "32K",
            "--gpu",
            "H200,B200",
            "--price",
            "3.8,5.5",
        ],
    ),
    "llama3.1-70b, longest context for 200 users on 8xH200": (
        {
            "model": "llama3.1-70b",
            "gpus": ("H200",),
            "users": 200,
            "max_model_len": None,
            "fixed_num_gpus": 8,
        },
        ["-m", "llama3.1-70b", "--users", "200", "--max-context", "-g", "8xH200"],
    ),
}


def main(n: int) -> None:
    print(f"{'case':55s} {'search ms':>10s} {'plans':>6s} {'command ms':>11s}")
    for name, (kw, argv) in CASES.items():
        q = Query(**{**kw, "model": load_model(kw["model"]), "gpus": tuple(load_gpu(g) for g in kw["gpus"])})
        calls = 0
        real = plan_module.estimate

        def counting(req, _real=real):
            nonlocal calls
            calls += 1
            return _real(req)

        times = []
        for _ in range(n):
            calls = 0
            solve_module = importlib.import_module("kvplan.search.solve")

            solve_module.estimate = counting
            t = time.perf_counter()
            solve(q)
            times.append((time.perf_counter() - t) * 1e3)
            solve_module.estimate = real
        wall = []
        for _ in range(max(3, n // 2)):
            t = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "kvplan.cli", "solve", *argv], check=True, capture_output=True
            )
            wall.append((time.perf_counter() - t) * 1e3)
        print(f"{name:55s} {statistics.median(times):10.0f} {calls:6d} {statistics.median(wall):11.0f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
