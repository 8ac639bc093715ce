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
    assert len(ok) + len(excluded) == 68
    assert all(why for _, why in excluded)
    # EP 'unknown (default)' is SGLang's ep_size 1: the DeepSeek-V3.1 bench_one_batch rows are used
    # issue 21: TensorRT-LLM performance.md low-latency rows (46-51; A100 52-55 have no stated variant), DataCrunch
    # DeepSeek-R1 bench_one_batch (56), Vultr B200 c=1 TTFTs (57-58); lmdeploy A100-80G static FTL at batch 1 (59-66),
    # SGLang PR #5432 DeepSeek-V3 bench_one_batch on 8x H200 (67-68)
    assert {p.row.line for p in ok} == {35, 36, 43, 44, 46, 47, 48, 49, 50, 51, 56, 57, 58, *range(59, 69)}


def test_the_fit_does_not_beat_the_assumed_coefficients_so_they_stay(bench, rows):
    """Enough rows now to fit (21 dev rows from 6 sources), but the fit's leave-one-source-out error does
    not beat the assumed coefficients on the same rows, so they stay; the rejected fit is recorded."""
    import statistics

    import yaml

    ok, _ = rows
    dev, _ = bench.split(ok)
    assert len(dev) >= bench.MIN_ROWS and len(bench.by_source(dev)) >= bench.MIN_SOURCES
    pc = prefill_coefficients()
    assert all(pc.sources[k].startswith("assumed") for k in bench.FITTED)
    assert (pc.gemm_mfu, pc.attention_mfu, pc.ttft_overhead_s) == (0.5, 0.5, 0.0)
    loso = bench.loso_errors(dev, bench.shipped_loso())
    assumed = bench.errors(dev, bench.ASSUMED)
    med_loso = statistics.median(abs(e) for e in loso)
    med_assumed = statistics.median(abs(e) for e in assumed)
    assert med_loso >= med_assumed
    data = yaml.safe_load((ROOT / "kvplan" / "data" / "prefill_fit.yaml").read_text())
    assert data["evaluation"]["loso"]["median_abs"] == pytest.approx(med_loso, abs=1e-4)
    assert data["evaluation"]["assumed_on_dev"]["median_abs"] == pytest.approx(med_assumed, abs=1e-4)
    assert data["rejected_fit"]["attention_mfu"]["source"].startswith("clamped at its upper bound")


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
