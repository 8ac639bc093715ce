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

from kvplan.commands.inputs import parse_network  # noqa: E402
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
    net = parse_network(None, 200.0)  # the docs' 200 GB/s a node (4 x 400GbE), 200 Gb/s a GPU
    assert net is not None
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


# llm-d's guide (guides/pd-disaggregation/README.md @027a0532; disagg_runs.tsv, disagg_quotes.md): gpt-oss-120b
# on 16 H200, 8 prefill instances at TP 1 and 2 decode instances at TP 4, 45 requests/s of 5,000 in / 250 out
LLMD_SETUP = {"gpus": 16, "rate": 45.0, "input": 5000, "output": 250}


def llmd_published() -> dict[str, float]:
    """llm-d's measured figures, read from disagg_runs.tsv: requests/s, TTFT p90 (ms), TPOT p90 (ms)."""
    with TSV.open(encoding="utf-8") as fh:
        got = {
            r["metric_name"]: float(r["metric_value"])
            for r in csv.DictReader(fh, delimiter="\t")
            if "llm-d/llm-d" in r["source_url"]
        }
    return {
        "requests_per_s": got["request throughput"],
        "ttft_p90_ms": got["TTFT p90"] * 1e3,
        "tpot_p90_ms": got["TPOT p90"] * 1e3,
    }


def llmd_check() -> dict:
    """`solve --disaggregated` asked for llm-d's rate with its measured p90s as the targets (TTFT 1.6 s,
    TPOT 8 ms): the GPUs and layout it answers, and its requests/s per GPU against the measured."""
    from kvplan import api

    r = api.solve(
        "gpt-oss-120b", gpus="H200", request_rate=LLMD_SETUP["rate"], ttft_ms=1600, tpot_ms=8,
        input_len=LLMD_SETUP["input"], output_len=LLMD_SETUP["output"], max_model_len="8K", num_prompts=1000,
        disaggregated=True,
    )  # fmt: skip
    d = r.to_dict()
    pre, dec = d["prefill"]["answer"], d["decode"]
    pub = llmd_published()
    per_gpu = LLMD_SETUP["rate"] / d["num_gpus"]
    measured = pub["requests_per_s"] / LLMD_SETUP["gpus"]
    return {
        "num_gpus": d["num_gpus"],
        "prefill": [pre["data_parallel_size"], pre["tensor_parallel_size"]],
        "decode": [dec["data_parallel_size"], dec["tensor_parallel_size"]],
        "requests_per_s_per_gpu": per_gpu,
        "published_requests_per_s_per_gpu": measured,
        "requests_per_s_per_gpu_error": per_gpu / measured - 1,
        "ttft_p90_ms": d["ttft_ms"],
        "published_ttft_p90_ms": pub["ttft_p90_ms"],
        "tpot_ms": dec["tpot_ms"],
        "published_tpot_p90_ms": pub["tpot_p90_ms"],
    }


def llmd_estimate() -> dict:
    """`estimate --disaggregated` on llm-d's own layout (8 x TP 1 prefill, 2 x TP 4 decode on 16 H200):
    what each pool sustains by kvplan's arithmetic (bare prefill one prompt after another; decode at the
    pool's full concurrency, not at a latency target) against the measured requests/s."""
    from kvplan import api

    d = api.estimate(
        "gpt-oss-120b", disaggregated=True, prefill_gpus="8xH200", decode_gpus="8xH200",
        prefill_tensor_parallel_size=1, decode_tensor_parallel_size=4, input_len=LLMD_SETUP["input"],
        output_len=LLMD_SETUP["output"], max_model_len="8K",
    )  # fmt: skip
    return {
        "prefill_replicas": d.prefill.replicas,
        "decode_replicas": d.decode.replicas,
        "prefill_requests_per_s": d.prefill.requests_per_s,
        "decode_requests_per_s": d.decode.requests_per_s,
        "binding_pool": d.binding_pool,
        "requests_per_s": d.requests_per_s,
        "published_requests_per_s": llmd_published()["requests_per_s"],
        "error": d.requests_per_s / llmd_published()["requests_per_s"] - 1,
    }


def _err(rec: dict, what: str) -> float:
    """kvplan's figure against the published one (every Mooncake length publishes all three)."""
    return rec[what] / rec[f"published_{what}"] - 1


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
    llmd = llmd_check()
    print(
        f"llm-d gpt-oss-120b at 45 req/s: kvplan answers {llmd['num_gpus']} H200 (prefill {llmd['prefill'][0]} x TP "
        f"{llmd['prefill'][1]}, decode {llmd['decode'][0]} x TP {llmd['decode'][1]}; llm-d ran 16: 8 x TP 1, 2 x TP 4), "
        f"{llmd['requests_per_s_per_gpu']:.2f} req/s per GPU against {llmd['published_requests_per_s_per_gpu']:.2f} "
        f"measured ({llmd['requests_per_s_per_gpu_error']:+.1%}); TTFT p90 {llmd['ttft_p90_ms']:.0f} ms "
        f"(measured {llmd['published_ttft_p90_ms']:.0f}), TPOT {llmd['tpot_ms']:.1f} ms (measured p90 "
        f"{llmd['published_tpot_p90_ms']:.1f})"
    )
    est = llmd_estimate()
    print(
        f"estimate --disaggregated on llm-d's layout: the {est['binding_pool']} "
        f"{'' if est['binding_pool'] == 'link' else 'pool '}binds at "
        f"{est['requests_per_s']:.1f} req/s against {est['published_requests_per_s']:.1f} measured "
        f"({est['error']:+.0%}: a bare forward pass a prompt, no serving overhead)"
    )
    OUT.write_text(
        "# kvplan's disaggregated arithmetic against Mooncake's published 1P1D runs and llm-d's 16 x H200 guide\n"
        "# (benchmarks/disagg_check.py)\n"
        + yaml.safe_dump(
            {
                "schema": "kvplan.disagg-check/1",
                "summary": summary,
                "llm_d": llmd,
                "llm_d_estimate": est,
                "records": recs,
            },
            sort_keys=False,
        ),
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
