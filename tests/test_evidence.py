"""What kvplan prints of its own accuracy beside a plan's time figures (kvplan/speed/evidence.py): the
held-out errors of the plan's bucket (GPU x engine x kind), from decode_fit.yaml's leave-one-source-out
buckets and served_evidence.yaml (benchmarks/serving_check.py), or every bucket's where it has none."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from kvplan.speed.evidence import bucket_accuracy
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parent.parent


def _decode_bucket(gpu: str, engine: str, kind: str) -> dict:
    fit = yaml.safe_load((ROOT / "kvplan" / "data" / "decode_fit.yaml").read_text(encoding="utf-8"))
    (b,) = [
        b
        for b in fit["evaluation"]["loso_buckets"]
        if (b["gpu"], b["engine"], b["kind"]) == (gpu, engine, kind)
    ]
    return b


def test_a_bucket_with_rows_gives_its_own_figures():
    b = _decode_bucket("H200", "SGLang", "moe")
    ev = bucket_accuracy("H200", "sglang", "moe")
    assert (ev.decode.rows, ev.decode.sources, ev.decode.bucket) == (b["rows"], b["sources"], True)
    assert ev.decode.median_abs == b["median_abs"] and ev.decode.median_signed == b["median_signed"]
    assert ev.served_tpot is not None and ev.served_tpot.bucket and ev.served_tpot.rows == 4
    line = ev.tpot_line()
    assert "MoE models on H200 under SGLang" in line
    assert (
        f"decode step {b['median_abs']:.0%} off at the median, kvplan slower ({b['rows']} runs, 2 sources)"
        in line
    )
    assert "served TPOT 20% off at the median, kvplan faster (4 runs, 1 source)" in line


def test_a_bench_rows_gpu_name_matches_the_spec_it_plans_on():
    # the bench files say 'H100'; kvplan's spec is H100-SXM
    b = _decode_bucket("H100", "vLLM", "dense")
    ev = bucket_accuracy("H100-SXM", "vllm", "dense")
    assert ev.decode.bucket and ev.decode.rows == b["rows"]


def test_an_empty_bucket_says_so_and_gives_every_buckets_figure():
    fit = yaml.safe_load((ROOT / "kvplan" / "data" / "decode_fit.yaml").read_text(encoding="utf-8"))
    ev = bucket_accuracy("B300", "vllm", "moe")
    assert not ev.decode.bucket and ev.decode.rows == fit["evaluation"]["dev"]["rows"]
    assert ev.decode.median_abs == fit["evaluation"]["loso"]["median_abs"]
    line = ev.tpot_line()
    assert (
        "no published decode step or served TPOT of MoE models on B300 under vLLM; over every bucket" in line
    )
    # the decode fit's median signed error over every row (+0.9%) is within LEAN
    assert "no lean (245 runs, 25 sources)" in line


def test_tensor_parallel_across_nodes_is_its_own_bucket():
    one = bucket_accuracy("A100-40GB", "vllm", "dense")
    across = bucket_accuracy("A100-40GB", "vllm", "dense", across_nodes=True)
    assert one.served_tpot is not None and not one.served_tpot.bucket
    assert across.served_tpot is not None and across.served_tpot.bucket and across.served_tpot.rows == 8
    # no published decode row crosses nodes
    assert not across.decode.bucket
    assert "tensor parallel across nodes" in across.tpot_line()


def test_estimate_prints_and_returns_its_buckets_accuracy():
    args = ["estimate", "-m", "deepseek-v3", "-g", "8xH200", "--engine", "sglang", "--weight-dtype", "fp8",
            "--max-model-len", "2048", "--no-calibration"]  # fmt: skip
    text = run_cli(*args).stdout
    flat = " ".join(text.split())
    assert (
        "accuracy (each source held out): published runs of MoE models on H200 under SGLang: decode step"
        in flat
    )
    assert "served TTFT 45% off at the median, kvplan faster (4 runs, 1 source)" in flat
    got = json.loads(run_cli(*args, "--json").stdout)["decode"]["held_out"]
    assert got["bucket"] == {"gpu": "H200", "engine": "sglang", "kind": "moe", "across_nodes": False}
    assert got["decode_step"]["rows"] == 19 and got["decode_step"]["scope"] == "this bucket"
    assert got["served_tpot"]["median_signed_error"] < 0


def test_a_measured_profile_gets_no_fitted_models_accuracy():
    # a measured profile's terms (the H200 sweep kept in benchmarks/results) are not what the held-out rows judged
    profile = str(ROOT / "benchmarks" / "results" / "h200" / "calibrate_profile.yaml")
    args = [
        "estimate",
        "-m",
        "llama3.1-8b",
        "-g",
        "H200",
        "--max-model-len",
        "8192",
        "--calibration-file",
        profile,
    ]
    got = json.loads(run_cli(*args, "--json").stdout)["decode"]
    assert got["measured"] is True and got["held_out"] is None
    assert "accuracy (each source held out)" not in run_cli(*args).stdout
    # without it, the same plan has its bucket's figures
    fitted = json.loads(run_cli(*args[:-2], "--json").stdout)["decode"]
    assert fitted["measured"] is False and fitted["held_out"]["bucket"]["gpu"] == "H200"


def test_simulate_notes_its_buckets_accuracy():
    args = ["simulate", "-m", "llama3.1-8b", "-g", "H100", "--max-model-len", "8192", "--input-len", "500",
            "--output-len", "50", "--num-prompts", "20", "--max-concurrency", "4", "--json"]  # fmt: skip
    notes = json.loads(run_cli(*args).stdout)["assumptions"]
    tpot = [n for n in notes if n.startswith("TPOT accuracy")]
    assert len(tpot) == 1 and "dense models on H100-SXM under vLLM" in tpot[0]
    assert any(n.startswith("TTFT accuracy") for n in notes)


def test_solve_gives_each_answers_bucket_accuracy():
    out = run_cli("solve", "-m", "qwen3-235b", "-u", "100", "--max-model-len", "8K", "-g", "H100,H200",
                  "--tpot-ms", "50", "--json").json()  # fmt: skip
    for a in out["answers"]:
        assert a["held_out"]["bucket"]["gpu"] == a["gpu"] and a["held_out"]["bucket"]["kind"] == "moe"
    first = out["answers"][0]
    text = " ".join(run_cli("solve", "-m", "qwen3-235b", "-u", "100", "--max-model-len", "8K", "-g", "H100,H200",
                            "--tpot-ms", "50").stdout.split())  # fmt: skip
    assert (
        f"#1's TPOT accuracy (each source held out): published runs of MoE models on {first['gpu']}" in text
    )
