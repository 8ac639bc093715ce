"""kvplan's disaggregated-serving arithmetic against Mooncake's published 1P1D measurements.

Rows: tests/fixtures/bench/disagg_runs.tsv (quotes: disagg_quotes.md), the two Mooncake performance docs
whose every figure is per prompt length at concurrency 1:
  SGLang   Qwen3-235B-A22B-Instruct-2507 bf16, TP 8 -> TP 8 on H20-3e, 4 x 400GbE a node (200 Gb/s a GPU)
  vLLM     Qwen3-8B, TP 8 -> TP 8 on H800 (planned as H100-SXM: the same HBM and FLOP/s, NVLink not used
           here), "~200 GB/s for the 8x RoCE connections" (200 Gb/s a GPU)
For each prompt length: the KV a request moves (kvplan.plan.disagg.kv_moved_bytes_per_token), its
transfer at the link's line rate (kv_transfer_seconds), and TTFT = the bare prefill of the prompt
(prefill_time) + the transfer. Nothing is fitted. The published sizes are read in the unit each doc
uses: SGLang's doc prints decimal MB/GB (12.62 GB = 32,768 x 385,024 bytes), vLLM's binary (4.50 GB =
32,768 x 147,456 bytes = 4.50 GiB); the chat template's few tokens are not counted.

Run:  python benchmarks/disagg_check.py     # prints the table, writes benchmarks/results/disagg_check.yaml
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvplan.model.parallel import Network  # noqa: E402
from kvplan.plan.disagg import kv_moved_bytes_per_token, kv_transfer_seconds  # noqa: E402
from kvplan.plan.plan import PlanRequest, estimate  # noqa: E402
from kvplan.specs.registry import load_gpu, load_model  # noqa: E402
from kvplan.speed.prefill import prefill_time  # noqa: E402

TSV = REPO / "tests" / "fixtures" / "bench" / "disagg_runs.tsv"
OUT = REPO / "benchmarks" / "results" / "disagg_check.yaml"
GIB = 2**30

# doc -> (engine, kvplan model, GPU, TP, the unit the doc's "MB"/"GB" mean, note)
DOCS = {
    "sglang-benchmark-results-v1.md": ("sglang", "qwen3-235b-a22b", "H20", 8, 10**3, ""),
    "vllm-v1-pd-performance.md": ("vllm", "qwen3-8b", "H100-SXM", 8, 2**10, "H800 planned as H100-SXM"),
}
SIZE_METRIC = ("KV size transferred per request",)
TIME_METRICS = ("KV transfer time", "Actual KV transfer time")
TTFT_METRICS = ("TTFT", "Mean TTFT")


# the docs' own model (the SGLang doc also holds an older A10 section with another model)
MODELS = {"sglang-benchmark-results-v1.md": "Qwen3-235B-A22B", "vllm-v1-pd-performance.md": "Qwen3-8B"}


def _doc(row: dict[str, str]) -> str | None:
    text = row["source_url"] + " " + row["notes"]
    doc = next((d for d in DOCS if d in text), None)
    return doc if doc is not None and row["model"].startswith(MODELS[doc]) else None


def _size_bytes(text: str, unit: int) -> float:
    value, suffix = text.split()
    return float(value) * {"MB": unit**2, "GB": unit**3}[suffix]


def _less_half(text: str) -> str:
    """The printed size less half a unit of its last digit ('1.58 GB' -> '1.575 GB'): the rounding."""
    value, suffix = text.split()
    decimals = len(value.split(".")[1]) if "." in value else 0
    return f"{float(value) - 0.5 * 10**-decimals} {suffix}"


def rows() -> list[dict[str, str]]:
    with TSV.open(encoding="utf-8") as fh:
        return [r for r in csv.DictReader(fh, delimiter="\t") if _doc(r)]


def check() -> list[dict]:
    net = Network("200G", 200.0, None, "a 200 Gb/s share of the node's RoCE links per GPU (200 GB/s a node)")
    out: dict[tuple[str, int], dict] = {}
    for r in rows():
        doc = _doc(r)
        assert doc is not None
        engine, model, gpu, tp, unit, note = DOCS[doc]
        inp = int(r["input_len"].split()[0].replace(",", ""))
        key = (doc, inp)
        if key not in out:
            p = estimate(
                PlanRequest(
                    model=load_model(model),
                    gpu=load_gpu(gpu),
                    num_gpus=tp,
                    tp=tp,
                    pp=1,
                    engine=engine,
                    max_model_len=max(inp + 1024, 4096),
                    input_len=inp,
                    output_len=1,
                    kv_cache_memory_bytes=16 * GIB,
                )  # fmt: skip
            )
            moved = kv_moved_bytes_per_token(p) * inp
            transfer_ms = kv_transfer_seconds(p, inp, net) * 1e3
            prefill_ms = prefill_time(p.decode.inputs, p.prefill.work, inp, 0, served=False).total_ms
            out[key] = {
                "engine": engine, "model": model, "gpu": gpu, "note": note, "input_len": inp,
                "kv_bytes": moved, "transfer_ms": transfer_ms, "ttft_ms": prefill_ms + transfer_ms,
            }  # fmt: skip
        rec = out[key]
        name, value = r["metric_name"], r["metric_value"]
        if name in SIZE_METRIC:
            rec["published_kv_bytes"] = _size_bytes(value, unit)
            rec["published_kv_half_digit"] = _size_bytes(value, unit) - _size_bytes(_less_half(value), unit)
        elif name in TIME_METRICS:
            rec["published_transfer_ms"] = float(value)
        elif name in TTFT_METRICS:
            rec["published_ttft_ms"] = float(value.replace(",", ""))
    return sorted(out.values(), key=lambda x: (x["engine"], x["input_len"]))


def _err(rec: dict, what: str) -> float | None:
    pub = rec.get(f"published_{what}")
    return None if pub is None else rec[what] / pub - 1


def main() -> None:
    import yaml

    recs = check()
    print(f"{'engine':7} {'input':>6} {'KV moved':>10} {'pub.':>10} {'err':>6} {'xfer ms':>8} {'pub.':>7} "
          f"{'err':>6} {'TTFT ms':>8} {'pub.':>8} {'err':>6}")  # fmt: skip
    for x in recs:
        e = {w: _err(x, w) for w in ("kv_bytes", "transfer_ms", "ttft_ms")}
        print(
            f"{x['engine']:7} {x['input_len']:>6,} {x['kv_bytes'] / 1e9:>8.3f}GB {x.get('published_kv_bytes', 0) / 1e9:>8.3f}GB "
            f"{e['kv_bytes']:>+6.1%} {x['transfer_ms']:>8.2f} {x.get('published_transfer_ms', 0):>7.2f} "
            f"{e['transfer_ms']:>+6.1%} {x['ttft_ms']:>8.1f} {x.get('published_ttft_ms', 0):>8.1f} {e['ttft_ms']:>+6.1%}"
        )
    summary = {}
    for engine in ("sglang", "vllm"):
        sub = [x for x in recs if x["engine"] == engine]
        summary[engine] = {
            w: {"median_abs": statistics.median(abs(_err(x, w)) for x in sub), "median_signed": statistics.median(_err(x, w) for x in sub)}
            for w in ("kv_bytes", "transfer_ms", "ttft_ms")
        }  # fmt: skip
    for engine, s in summary.items():
        print(
            engine,
            ", ".join(
                f"{w} median |err| {v['median_abs']:.1%} (signed {v['median_signed']:+.1%})"
                for w, v in s.items()
            ),
        )
    OUT.write_text(
        "# kvplan's disaggregated arithmetic against Mooncake's published 1P1D runs (benchmarks/disagg_check.py)\n"
        + yaml.safe_dump(
            {"schema": "kvplan.disagg-check/1", "summary": summary, "records": recs}, sort_keys=False
        ),
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
