"""Time the startup-log reader on logs padded to kvplan's 64 MiB limit (README, Limits) with noise:
blank lines, one-character lines, and log-like lines with digits but none of the reader's anchor words.
The target (issue 24): no input past 5 s. Prints seconds per log. Run: python benchmarks/bench_check_log.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvplan.limits import MAX_LOG_BYTES  # noqa: E402
from kvplan.logs.logparse import parse  # noqa: E402

HEAD = (REPO / "tests" / "fixtures" / "logs" / "vllm_v011_llama31_8b_h100.log").read_text(encoding="utf-8")
NOISE = {
    "blank lines": "\n",
    "one-character lines": "1\n",
    "log lines with digits": "INFO 10-01 12:00:00 [core.py:123] step 12345 took 0.5 ms\n",
    "anchor word, no figure": "INFO vLLM version unknown\n",
}


def main() -> None:
    print(f"{'noise':26} {'lines':>12} {'MiB':>6} {'seconds':>8}")
    for name, unit in NOISE.items():
        n = (MAX_LOG_BYTES - len(HEAD)) // len(unit)
        text = HEAD + unit * n
        start = time.perf_counter()
        log = parse(text)
        took = time.perf_counter() - start
        assert log.facts.get("kv_cache_tokens"), "the real log's figures must still be read"
        print(f"{name:26} {n:12,} {len(text) / 2**20:6.1f} {took:8.2f}")


if __name__ == "__main__":
    main()
