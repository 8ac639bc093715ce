"""The decode step model against published runs (benchmarks/fit_decode.py, decode_runs.tsv).

The shipped coefficients (kvplan/data/decode_fit.yaml) were fitted on two thirds of the usable rows;
these tests replay the held-out third and a few named rows with them."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path

import pytest

from kvplan import speed

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    path = ROOT / "benchmarks" / "fit_decode.py"
    spec = importlib.util.spec_from_file_location("fit_decode", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fit_decode"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rows(bench):
    cases, excluded = bench.read_rows()
    fit, held = bench.split(cases)
    return {
        "fit": [bench.prepare(c) for c in fit],
        "held": [bench.prepare(c) for c in held],
        "excluded": excluded,
    }


def _abs_errors(bench, prepared):
    return [abs(e) for e in bench.errors(prepared, speed.coefficients())]


def test_split_and_exclusions_are_stated(rows):
    assert (len(rows["fit"]), len(rows["held"])) == (43, 21)
    # every excluded row says why: EP, unknown layout, GB200, unstated A100 variant, prefill interference
    assert len(rows["excluded"]) == 26
    assert all(why for _, _, why in rows["excluded"])


def test_held_out_errors(bench, rows):
    held = _abs_errors(bench, rows["held"])
    # benchmarks/fit_decode.py prints the same: median 9.3%, worst 53.8% (TensorRT-LLM v0.6.1's
    # Llama-2-70B fp8 static-batching row, 58.5 ms published vs 27.0 ms: the 35% target is missed there)
    assert statistics.median(held) == pytest.approx(0.093, abs=0.002)
    assert max(held) == pytest.approx(0.538, abs=0.002)
    assert statistics.median(held) <= 0.15
    assert sum(e > 0.35 for e in held) == 1
    fit = _abs_errors(bench, rows["fit"])
    assert statistics.median(fit) == pytest.approx(0.104, abs=0.002)


def _row(bench, rows, line: int):
    for p in rows["fit"] + rows["held"]:
        if p.case.row.line == line:
            return p, bench.predict(p, speed.coefficients())
    raise AssertionError(f"row {line} is not usable")


def test_qwen3_8b_on_one_h100(bench, rows):
    # vLLM 0.11, Qwen3-8B bf16, 1x H100 SXM, batch 1, ShareGPT means 233 in / 221 out -> 343 tokens:
    # weights: 36 layers x 4 GEMMs + the LM head = 145 GEMMs, 15.14 GB;
    #   (15.136e9 + 145 x 28.42e6 half-bytes) / (0.8261 x 3.35e12) = 6.96 ms
    # attention 0.14 ms + launch 36 x 10.35 us = 0.37 ms + overhead 0.05 ms = 7.52 ms; published 7.22 (+4%)
    p, step = _row(bench, rows, 32)
    assert p.case.row.tpot_ms == 7.22
    assert step.weights_ms == pytest.approx(6.96, abs=0.01)
    assert step.tpot_ms == pytest.approx(7.52, abs=0.01)
    assert step.tpot_ms == pytest.approx(7.22, rel=0.06)


def test_fp8_weights_are_faster_but_not_twice(bench, rows):
    # SGLang Qwen3-8B batch 4: bf16 7.14 ms, fp8 5.58 ms published (x 0.78); kvplan 7.57 -> 5.39 (x 0.71):
    # half the bytes at 0.885 x the efficiency, the same fixed costs per GEMM, layer and step
    _, bf16 = _row(bench, rows, 37)
    _, fp8 = _row(bench, rows, 38)
    assert fp8.tpot_ms == pytest.approx(5.58, rel=0.05)
    assert 0.6 < fp8.tpot_ms / bf16.tpot_ms < 0.85


def test_moe_at_tp8_small_batch(bench, rows):
    # SGLang 0.5.12, DeepSeek-R1-0528 fp8, 8x H200 TP 8, batch 4, 1k/1k: published 9.70 ms;
    # kvplan: weights 3.55 + MoE 4.38 (58 layers x (touched experts' bytes + 11.4 us)) + all-reduce
    # 2 x 61 x 15.6 us = 1.90 + attention 0.25 + launch 0.63 + overhead 0.05 = 10.75 ms (+11%)
    p, step = _row(bench, rows, 39)
    assert p.case.row.tpot_ms == 9.70
    assert step.moe_ms == pytest.approx(4.38, abs=0.02)
    assert step.communication_ms == pytest.approx(1.90, abs=0.02)
    assert step.tpot_ms == pytest.approx(9.70, rel=0.15)
