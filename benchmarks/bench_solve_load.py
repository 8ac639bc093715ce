"""Wall time of `kvplan solve --request-rate` and `--max-rate` (planning, simulations and all), with the
simulations each search ran: python benchmarks/bench_solve_load.py"""

from __future__ import annotations

import time

from kvplan.commands import inputs

CASES = (
    ("--request-rate 20, llama3-8b 8K, H100, --partial-nodes", {"partial_nodes": True}, {"request_rate": 20.0}),
    ("--request-rate 20, llama3-8b 8K, H100 (whole nodes)", {}, {"request_rate": 20.0}),
    ("--request-rate 100, llama3.1-70b 8K, H100,H200 --price 2.5,3.8", {"model": "llama3.1-70b", "gpus": "H100,H200", "price": "2.5,3.8"}, {"request_rate": 100.0}),
    ("--max-rate -g 1xH100, llama3-8b 8K", {"gpus": "1xH100"}, {"max_rate": True}),
    ("--max-rate -g 8xH100, llama3-8b 8K", {"gpus": "8xH100"}, {"max_rate": True}),
)  # fmt: skip


def main() -> None:
    for label, solve_kw, load_kw in CASES:
        f = inputs.SolveFlags(
            **{"model": "llama3-8b", "users": 1, "max_model_len": "8K", "tpot_ms": 30.0, **solve_kw}
        )
        load = inputs.LoadFlags(ttft_ms=500.0, num_prompts=1000, **load_kw)
        start = time.perf_counter()
        ans = inputs.solve_load(f, load)
        wall = time.perf_counter() - start
        a = ans.layout
        print(f"{label}: {a.num_gpus}x {a.gpu} TP {a.tensor_parallel_size} DP {a.data_parallel_size} KV "
              f"{a.kv_cache_dtype} at {ans.request_rate:.3g} req/s; {ans.simulations} simulations of 1,000 "
              f"requests, {wall:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
