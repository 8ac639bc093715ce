"""The prefill model (kvplan/speed/prefill.py) against published prefill times (benchmarks/fit_prefill.py,
tests/fixtures/bench/prefill_runs.tsv). Its coefficients are fitted only from enough dev rows and sources
(a rule fixed before any fit) and shipped only when they beat the assumed ones held out, at the median and
in every bucket, group by group (rules added as the fits were run, each before the fit it judged); the MoE
term's second form must also do so on CONFIRM, sources found after it was written. Today no group does,
so the coefficients stay assumed, and these tests hold the assumed model against every usable row."""

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
    assert len(ok) + len(excluded) == 111
    assert all(why for _, why in excluded)
    # EP 'unknown (default)' is SGLang's ep_size 1: the DeepSeek-V3.1 bench_one_batch rows are used
    # issue 21: TensorRT-LLM performance.md low-latency rows (46-51; A100 52-55 have no stated variant), DataCrunch
    # DeepSeek-R1 bench_one_batch (56), Vultr B200 c=1 TTFTs (57-58); lmdeploy A100-80G static FTL at batch 1 (59-66),
    # SGLang PR #5432 DeepSeek-V3 bench_one_batch on 8x H200 (67-68); the sgl-cookbook's c=1 TTFTs on 8x B200
    # (69-82): DeepSeek-R1, gpt-oss-120b, Qwen3-235B used; GLM-4.6 (no spec) and Kimi-K2 (DP attention) not;
    # CONFIRM (83-88): sariekr/gpu_conc's gpt-oss-20b on four GPUs used, the two SGLang PRs name no GPU;
    # 2026-12-07 (89-111): the cookbook's twelve round-4/5 pages, of which DeepSeek-V3.1 on 8x MI300X (106-108) is used
    assert {p.row.line for p in ok} == {
        35, 36, 43, 44, 46, 47, 48, 49, 50, 51, 56, 57, 58, *range(59, 72), *range(76, 87), 106, 107, 108
    }  # fmt: skip
    why = dict(excluded)
    assert why[72] == "zai-org/GLM-4.6 on B200: no kvplan spec for zai-org/GLM-4.6"
    assert why[75].endswith("dp-attention in the run: kvplan's prefill is a plain TP forward pass")
    assert why[87].endswith("GPU 'unknown': no shipped GPU spec") and why[88].endswith("no shipped GPU spec")


def test_one_publishers_pages_are_one_source(bench, rows):
    """The sgl-cookbook's pages (two commits, two paths of its Qwen3 page) share one harness and machine:
    one source, on one side of the split and held out together."""
    ok, _ = rows
    cookbook = [p for p in ok if "sgl-cookbook" in p.row.source]
    assert len(cookbook) == 13 and len({p.row.source for p in cookbook}) == 5
    assert {bench.source_of(p) for p in cookbook} == {"https://github.com/sgl-project/sgl-cookbook/"}
    # the row's input length is the run's mean: 6101 tokens over 10 prompts at --random-input-len 1000
    assert {p.row.input_len for p in cookbook} == {610, 4194, 332}


def test_no_fitted_group_beats_the_assumed_coefficients_so_they_stay(bench, rows):
    """Enough rows to fit (31 dev rows from 7 sources, 4 CONFIRM rows from one more). The shared
    coefficients fitted on the dense rows are worse held out (33.4% against 24.7%, 3 of 4 dense buckets).
    moe_gemm_eff, the routed experts' GEMMs at a share of a dense GEMM's rate, fits 0.12 on the MoE rows and
    wins there held out (23.9% against 77.5%, no bucket worse), but on CONFIRM (gpt-oss-20b on one GPU,
    found after the rule was written) it is worse on the H100 PCIe and the H200 (+91% and +121% where 1
    is -66% and -62%, prompt FLOPs without the embedding and the LM head): so it does not ship either."""
    import dataclasses
    import statistics

    import yaml

    ok, _ = rows
    dev, _, confirm = bench.split(ok)
    assert len(dev) >= bench.MIN_ROWS and len(bench.by_source(dev)) >= bench.MIN_SOURCES
    assert (len(dev), len(bench.by_source(dev)), len(confirm), len(bench.by_source(confirm))) == (34, 7, 4, 1)
    pc = prefill_coefficients()
    assert all(pc.sources[k].startswith("assumed") for k in bench.FITTED)
    assert (pc.gemm_mfu, pc.attention_mfu, pc.ttft_overhead_s, pc.moe_gemm_eff) == (0.5, 0.5, 0.0, 1.0)
    data = yaml.safe_load((ROOT / "kvplan" / "data" / "prefill_fit.yaml").read_text())
    eff = data["rejected_fit"]["moe_gemm_eff"]["value"]
    assert eff == pytest.approx(0.117, abs=1e-3)
    # the shared coefficients' own fit on the dense rows, recorded though it did not ship
    assert data["rejected_fit"]["gemm_mfu"]["value"] == pytest.approx(0.4667, abs=1e-4)
    assert data["rejected_fit"]["attention_mfu"]["source"].startswith("clamped at its upper bound")
    # the held-out fits on the routed-expert rows, replayed: the shared coefficients as shipped (assumed)
    fits = bench.shipped_loso()
    assert len(fits) == 7 and all(f.gemm_mfu == 0.5 for f in fits.values())
    moe = [p for p in dev if bench.routed(p)]
    held = bench.loso_errors(moe, fits)
    base = bench.loso_errors(moe, {s: dataclasses.replace(f, moe_gemm_eff=1.0) for s, f in fits.items()})
    assert statistics.median(abs(e) for e in held) == pytest.approx(0.251, abs=0.001)
    assert statistics.median(abs(e) for e in base) == pytest.approx(0.787, abs=0.001)
    ok_moe, _ = bench._judge(moe, held, base, "routed-expert rows")
    assert ok_moe
    # CONFIRM: the fit on every dev row, once
    fitted = dataclasses.replace(bench.ASSUMED, moe_gemm_eff=eff)
    c_err = {p.row.gpu: e for p, e in zip(confirm, bench.errors(confirm, fitted), strict=True)}
    c_base = {p.row.gpu: e for p, e in zip(confirm, bench.errors(confirm, bench.ASSUMED), strict=True)}
    assert c_err["H100-PCIe"] == pytest.approx(0.945, abs=0.003) and c_base["H100-PCIe"] == pytest.approx(
        -0.658, abs=0.002
    )
    assert c_err["H200"] == pytest.approx(1.250, abs=0.003) and c_base["H200"] == pytest.approx(
        -0.623, abs=0.002
    )
    ok_c, why = bench._judge(confirm, list(c_err.values()), list(c_base.values()), "CONFIRM rows")
    assert not ok_c and "2 of 4 buckets worse" in why
    text = (ROOT / "kvplan" / "data" / "prefill_fit.yaml").read_text()
    assert (
        "# shared coefficients NOT SHIPPED: dense rows: held-out median |error| 33.4% against 24.7%, 3 of 4"
        in text
    )
    assert "# moe_gemm_eff NOT SHIPPED" in text
    assert data["evaluation"]["assumed_on_dev"]["median_abs"] == pytest.approx(
        statistics.median(abs(e) for e in bench.errors(dev, bench.ASSUMED)), abs=1e-4
    )


def test_the_assumed_model_on_the_usable_rows(bench, rows):
    ok, _ = rows
    err = {p.row.line: bench.predict_ms(p, prefill_coefficients()) / p.row.prefill_ms - 1 for p in ok}
    # NIM 1.8.0, Llama-3.3-70B fp8 on 2x H100, TTFT at concurrency 1: 406.8 ms at 5,000 tokens, 47.8 at 500
    # (README, Prefill: +1.9% and -7.9%)
    assert err[35] == pytest.approx(0.019, abs=0.005) and err[36] == pytest.approx(-0.079, abs=0.005)
    # SGLang bench_one_batch, DeepSeek-V3.1 fp8 on 8x H200, 16 x 512 tokens: 288.9 ms published; kvplan's
    # dense-GEMM efficiency makes the MoE prefill far too fast (256 tokens per expert run below a large
    # GEMM's efficiency); the fused MoE's activation buffers took it from below -40% to -39%, leaving the
    # embedding gather and the LM head out of the prompt FLOPs back to -41%: a known miss, asserted so a
    # change to it is seen
    assert err[43] == pytest.approx(-0.406, abs=0.005) and err[44] == pytest.approx(-0.404, abs=0.005)


def test_the_evidence_per_model_kind_is_the_shipped_model_against_every_usable_row(bench, rows):
    """prefill_fit.yaml's `evidence` is what fit_prefill.py computes: each dev row by a model that never
    saw its source (here the assumed coefficients, nothing fitted), each frozen row by the shipped ones."""
    import yaml

    ok, _ = rows
    dev, frozen, confirm = bench.split(ok)
    kinds = bench.evidence(
        dev + frozen + confirm,
        bench.errors(dev, bench.ASSUMED)
        + bench.errors(frozen, bench.ASSUMED)
        + bench.errors(confirm, bench.ASSUMED),
    )
    data = yaml.safe_load((ROOT / "kvplan" / "data" / "prefill_fit.yaml").read_text())
    assert [(k["kind"], k["rows"], k["sources"], k["gpus"]) for k in kinds] == [
        (e["kind"], e["rows"], e["sources"], e["gpus"]) for e in data["evidence"]
    ]
    for k, e in zip(kinds, data["evidence"], strict=True):
        assert k["median_signed"] == pytest.approx(e["median_signed"], abs=1e-4)
    by = {e["kind"]: e for e in data["evidence"]}
    # the SGLang DeepSeek bench_one_batch rows on 8x H200 (lines 43/44, 56, 67/68), the sgl-cookbook's
    # TTFTs on 8x B200 and DeepSeek-V3.1's on 8x MI300X, and sariekr/gpu_conc's gpt-oss-20b on four GPUs:
    # published 4.7x kvplan's
    assert (by["moe"]["rows"], by["moe"]["sources"], by["moe"]["gpus"]) == (
        22,
        5,
        ["B200", "H100-PCIe", "H200", "MI300X"],
    )
    assert by["moe"]["median_signed"] == pytest.approx(-0.787, abs=0.001)
    assert by["dense"]["median_signed"] == pytest.approx(-0.135, abs=0.001)


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
    # the shipped evidence: MoE yes (5 rows), dense no (-12%), hybrid no (2 rows), an unknown kind no
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
        "rows": 22,
        "sources": 5,
        "gpus": ["B200", "H100-PCIe", "H200", "MI300X"],
        "median_signed": -0.7871,
    }
    assert pf["caveat"] is not None
    dense = estimate("llama3-70b", gpus="4xH100", max_model_len=8192)
    assert dense.prefill.caveat is None and dense.prefill.evidence is not None
    assert dense.prefill.evidence.median_signed == pytest.approx(-0.1346)
    sim = simulate(
        "qwen3-235b-a22b", gpus="8xH100", max_model_len=4096, num_prompts=20, input_len=500, output_len=50,
        max_concurrency=4,
    )  # fmt: skip
    assert any(n.startswith("prefill: published prefill times of MoE models") for n in sim.assumptions)
