"""Time reading a checkpoint folder whose quantization config lists hundreds of modules.

Target (issue 24): nvidia/DeepSeek-V3.2-NVFP4's folder (hf_quant_config.json excludes 307 modules)
plans in under 1 s; matching each weight's module names against the list took 10 s as one regex.
Prints the median of N in-process loads of the folder, and of a whole `kvplan estimate` run, in
milliseconds; then the slowest loads of every config in the corpus (a ModelOpt MIXED_PRECISION config
listing 401 modules, qwen3.6-27b-nvfp4.json, took 8 s tried group by group).
Run: python benchmarks/bench_checkpoint_folder.py [N]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

FOLDER = (
    Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf" / "corpus" / "deepseek-v3.2-nvfp4"
)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    from kvplan.specs.registry import load_model

    load_model(str(FOLDER))  # imports and caches warm
    loads = []
    for _ in range(runs):
        start = time.perf_counter()
        load_model(str(FOLDER))
        loads.append(time.perf_counter() - start)
    whole = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "kvplan", "estimate", "-m", str(FOLDER), "-g", "8xB200", "--json"],
            check=True,
            capture_output=True,
        )
        whole.append(time.perf_counter() - start)
    print(f"load the folder:           {statistics.median(loads) * 1e3:8.1f} ms (median of {runs})")
    print(f"kvplan estimate on it:     {statistics.median(whole) * 1e3:8.1f} ms (median of {runs})")
    print("target: under 1,000 ms for the whole run")
    corpus = FOLDER.parent
    times = []
    for path in sorted(corpus.rglob("*.json")):
        if path.name in ("hf_quant_config.json", "model.safetensors.index.json", "modules.json") or (
            path.parent != corpus and path.name != "config.json"
        ):
            continue
        start = time.perf_counter()
        try:
            load_model(str(path))
        except Exception:  # a config kvplan refuses: its refusal is timed too
            pass
        times.append((time.perf_counter() - start, path.relative_to(corpus)))
    times.sort(reverse=True)
    print(f"corpus, {len(times)} configs loaded once each; the slowest:")
    for t, name in times[:5]:
        print(f"  {t * 1e3:8.1f} ms  {name}")


if __name__ == "__main__":
    main()
