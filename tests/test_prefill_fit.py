"""The prefill model (kvplan/speed/prefill.py) against published prefill times (benchmarks/fit_prefill.py,
tests/fixtures/bench/prefill_runs.tsv). Its coefficients are fitted only from enough dev rows and sources
(a rule fixed before any fit) and shipped only when they beat the assumed ones held out (added after the
first fit did not); today the fit does not, so the coefficients stay assumed, and these tests hold the
assumed model against every usable row."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import load_benchmark
from kvplan.speed.prefill import prefill_coefficients

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("fit_prefill")


@pytest.fixture(scope="module")
def rows(bench):
    return bench.read_rows()


def test_every_row_is_used_or_excluded_with_its_reason(bench, rows):
    ok, excluded = rows
    assert len(ok) + len(excluded) == 82
    assert all(why for _, why in excluded)
    # EP 'unknown (default)' is SGLang's ep_size 1: the DeepSeek-V3.1 bench_one_batch rows are used
    # issue 21: TensorRT-LLM performance.md low-latency rows (46-51; A100 52-55 have no stated variant), DataCrunch
    # DeepSeek-R1 bench_one_batch (56), Vultr B200 c=1 TTFTs (57-58); lmdeploy A100-80G static FTL at batch 1 (59-66),
    # SGLang PR #5432 DeepSeek-V3 bench_one_batch on 8x H200 (67-68); the sgl-cookbook's c=1 TTFTs on 8x B200
    # (69-82): DeepSeek-R1, gpt-oss-120b, Qwen3-235B used; GLM-4.6 (no spec) and Kimi-K2 (DP attention) not
    assert {p.row.line for p in ok} == {
        35, 36, 43, 44, 46, 47, 48, 49, 50, 51, 56, 57, 58, *range(59, 72), *range(76, 83)
    }  # fmt: skip
    why = dict(excluded)
    assert why[72] == "zai-org/GLM-4.6 on B200: no kvplan spec for zai-org/GLM-4.6"
    assert why[75].endswith("dp-attention in the run: kvplan's prefill is a plain TP forward pass")


def test_one_publishers_pages_are_one_source(bench, rows):
    """The sgl-cookbook's pages (two commits, two paths of its Qwen3 page) share one harness and machine:
    one source, on one side of the split and held out together."""
    ok, _ = rows
    cookbook = [p for p in ok if "sgl-cookbook" in p.row.source]
    assert len(cookbook) == 10 and len({p.row.source for p in cookbook}) == 4
    assert {bench.source_of(p) for p in cookbook} == {"https://github.com/sgl-project/sgl-cookbook/"}
    # the row's input length is the run's mean: 6101 tokens over 10 prompts at --random-input-len 1000
    assert {p.row.input_len for p in cookbook} == {610, 4194, 332}


def test_the_fit_does_not_beat_the_assumed_coefficients_so_they_stay(bench, rows):
    """Enough rows to fit (31 dev rows from 7 sources). The fit's leave-one-source-out median (41.5%)
    beats the assumed coefficients' (44.3%), but 4 of its 6 buckets are worse at the median: a MoE
    layer's prefill cost fitted on DeepSeek's H200 rows (about 2.5 ms) is twice what the sgl-cookbook's
    B200 rows show for Qwen3-235B and gpt-oss (about 1 ms), and the other way round; so the assumed
    coefficients stay and the rejected fit is recorded."""
    import statistics

    import yaml

    ok, _ = rows
    dev, _, _ = bench.split(ok)
    assert len(dev) >= bench.MIN_ROWS and len(bench.by_source(dev)) >= bench.MIN_SOURCES
    pc = prefill_coefficients()
    assert all(pc.sources[k].startswith("assumed") for k in bench.FITTED)
    assert (pc.gemm_mfu, pc.attention_mfu, pc.ttft_overhead_s) == (0.5, 0.5, 0.0)
    loso = bench.loso_errors(dev, bench.shipped_loso())
    assumed = bench.errors(dev, bench.ASSUMED)
    med_loso = statistics.median(abs(e) for e in loso)
    med_assumed = statistics.median(abs(e) for e in assumed)
    assert med_loso < med_assumed  # the median alone would have shipped it
    worse = {
        (b["gpu"], b["tool"], b["kind"])
        for b, a in zip(bench.buckets(dev, loso), bench.buckets(dev, assumed), strict=True)
        if b["median_abs"] > a["median_abs"]
    }
    assert ("B200", "bench_serve_c1", "moe") in worse and len(worse) == 4
    assert pc.moe_layer_s == 0.0 and len(bench.shipped_loso()) == 7  # one held-out fit per dev source
    data = yaml.safe_load((ROOT / "kvplan" / "data" / "prefill_fit.yaml").read_text())
    assert data["evaluation"]["loso"]["median_abs"] == pytest.approx(med_loso, abs=1e-4)
    assert data["evaluation"]["assumed_on_dev"]["median_abs"] == pytest.approx(med_assumed, abs=1e-4)
    assert data["rejected_fit"]["attention_mfu"]["source"].startswith("clamped at its upper bound")
    assert data["rejected_fit"]["moe_layer_s"]["value"] == pytest.approx(1.111e-3, rel=1e-3)
    assert "4 of 6 buckets are worse" in (ROOT / "kvplan" / "data" / "prefill_fit.yaml").read_text()


def test_the_assumed_model_on_the_usable_rows(bench, rows):
    ok, _ = rows
    err = {p.row.line: bench.predict_ms(p, prefill_coefficients()) / p.row.prefill_ms - 1 for p in ok}
    # NIM 1.8.0, Llama-3.3-70B fp8 on 2x H100, TTFT at concurrency 1: 406.8 ms at 5,000 tokens, 47.8 at 500
    # (README, Prefill: +4.5% and -4.9%)
    assert err[35] == pytest.approx(0.045, abs=0.005) and err[36] == pytest.approx(-0.049, abs=0.005)
    # SGLang bench_one_batch, DeepSeek-V3.1 fp8 on 8x H200, 16 x 512 tokens: 288.9 ms published; kvplan's
    # dense-GEMM efficiency makes the MoE prefill far too fast (256 tokens per expert run below a large
    # GEMM's efficiency); the fused MoE's activation buffers took it from below -40% to -39%: a known
    # miss, asserted so a change to it is seen
    assert err[43] == pytest.approx(-0.393, abs=0.005) and err[44] == pytest.approx(-0.392, abs=0.005)


def test_the_evidence_per_model_kind_is_the_shipped_model_against_every_usable_row(bench, rows):
    """prefill_fit.yaml's `evidence` is what fit_prefill.py computes: each dev row by a model that never
    saw its source (here the assumed coefficients, nothing fitted), each frozen row by the shipped ones."""
    import yaml

    ok, _ = rows
    dev, frozen, _ = bench.split(ok)
    kinds = bench.evidence(
        dev + frozen, bench.errors(dev, bench.ASSUMED) + bench.errors(frozen, bench.ASSUMED)
    )
    data = yaml.safe_load((ROOT / "kvplan" / "data" / "prefill_fit.yaml").read_text())
    assert [(k["kind"], k["rows"], k["sources"], k["gpus"]) for k in kinds] == [
        (e["kind"], e["rows"], e["sources"], e["gpus"]) for e in data["evidence"]
    ]
    for k, e in zip(kinds, data["evidence"], strict=True):
        assert k["median_signed"] == pytest.approx(e["median_signed"], abs=1e-4)
    by = {e["kind"]: e for e in data["evidence"]}
    # the SGLang DeepSeek bench_one_batch rows on 8x H200 (lines 43/44, 56, 67/68) and the sgl-cookbook's
    # TTFTs on 8x B200: published 4.4x kvplan's
    assert (by["moe"]["rows"], by["moe"]["sources"], by["moe"]["gpus"]) == (15, 4, ["B200", "H200"])
    assert by["moe"]["median_signed"] == pytest.approx(-0.772, abs=0.001)
    assert by["dense"]["median_signed"] == pytest.approx(-0.113, abs=0.001)


def test_a_caveat_only_where_the_published_prefills_of_that_kind_call_for_one():
    from kvplan.speed.prefill import Evidence, prefill_caveat

    moe = Evidence("moe", 5, 3, ["H200"], -0.754)
    assert moe.caveat() == (
        "published prefill times of MoE models ran 4.1x kvplan's estimate at the median (5 rows from 3 "
        "sources on H200; prefill_fit.yaml): this TTFT is likely too low"
    )
    # a rate is the other way round
    assert moe.caveat("the rate is", rate=True).endswith("the rate is likely too high")
    # kvplan too slow: published 1 / 1.5 = 67% of the estimate
    assert (
        Evidence("dense", 4, 2, ["A100-80GB", "H100"], 0.5)
        .caveat()
        .endswith(
            "ran 33% under kvplan's estimate at the median (4 rows from 2 sources on A100-80GB, H100; "
            "prefill_fit.yaml): this TTFT is likely too high"
        )
    )
    # the rule fixed before the evidence was read: 25% at the median, 3 rows at least
    assert Evidence("dense", 16, 3, ["H100"], -0.249).caveat() is None
    assert Evidence("hybrid", 2, 1, ["B200"], -0.70).caveat() is None
    # the shipped evidence: MoE yes (5 rows), dense no (-11%), hybrid no (2 rows), an unknown kind no
    assert prefill_caveat("moe") is not None
    assert (
        prefill_caveat("dense") is None and prefill_caveat("hybrid") is None and prefill_caveat("x") is None
    )


def test_estimate_and_simulate_carry_the_moe_caveat_and_a_dense_model_none():
    import json

    from helpers import run_cli
    from kvplan import estimate, simulate

    r = run_cli("estimate", "-m", "deepseek-v3", "-g", "8xH200", "--max-model-len", "8192", "--json")
    pf = json.loads(r.stdout)["prefill"]
    assert pf["evidence"] == {
        "kind": "moe",
        "rows": 15,
        "sources": 4,
        "gpus": ["B200", "H200"],
        "median_signed": -0.7717,
    }
    assert pf["caveat"] is not None
    dense = estimate("llama3-70b", gpus="4xH100", max_model_len=8192)
    assert dense.prefill.caveat is None and dense.prefill.evidence is not None
    assert dense.prefill.evidence.median_signed == pytest.approx(-0.113)
    sim = simulate(
        "qwen3-235b-a22b", gpus="8xH100", max_model_len=4096, num_prompts=20, input_len=500, output_len=50,
        max_concurrency=4,
    )  # fmt: skip
    assert any(n.startswith("prefill: published prefill times of MoE models") for n in sim.assumptions)
