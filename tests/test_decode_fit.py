"""The decode step model against published runs (benchmarks/fit_decode.py, decode_runs.tsv).

Splits are by source (the publisher's harness), fixed before the model was fitted: a frozen test set
chosen by a hash of each source's key, never fitted; the dev sources, on which the shipped
coefficients are fitted and each source is predicted by a fit that left it out (leave-one-source-out,
kept in decode_fit.yaml). These tests recompute every figure decode_fit.yaml and the README quote
from those fits, and check the step model's arithmetic on named rows."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from helpers import load_benchmark
from kvplan.speed import step_model
from kvplan.speed.prefill import prefill_coefficients, prefill_time

ROOT = Path(__file__).resolve().parent.parent
FIT_YAML = ROOT / "kvplan" / "data" / "decode_fit.yaml"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("fit_decode")


@pytest.fixture(scope="module")
def rows(bench):
    cases, excluded = bench.read_rows()
    dev_cases, frozen_cases = bench.split(cases)
    dev, unplanned = bench.prepare_all(dev_cases)
    frozen, unplanned_frozen = bench.prepare_all(frozen_cases)
    return {"dev": dev, "frozen": frozen, "excluded": excluded + unplanned + unplanned_frozen}


@pytest.fixture(scope="module")
def evaluation():
    return yaml.safe_load(FIT_YAML.read_text(encoding="utf-8"))["evaluation"]


def test_splits_are_by_source_and_the_frozen_rule_is_a_hash(bench, rows, evaluation):
    dev = {bench.source_of(p.case.row.source) for p in rows["dev"]}
    frozen = {bench.source_of(p.case.row.source) for p in rows["frozen"]}
    assert dev and frozen and not dev & frozen  # no source on both sides
    assert all(bench.is_frozen(s) for s in frozen) and not any(bench.is_frozen(s) for s in dev)
    assert evaluation["frozen_rule"] == bench.FROZEN_RULE
    assert evaluation["dev"] == {"rows": len(rows["dev"]), "sources": len(dev)}
    assert evaluation["frozen"] == {"rows": len(rows["frozen"]), "sources": len(frozen)}
    # every excluded row says why, and no rule names a source: exclusions are by kind of row
    assert rows["excluded"] and all(why for _, _, why in rows["excluded"])
    assert not hasattr(bench, "ANOMALOUS")


def test_every_source_says_what_it_measures(bench, rows):
    kinds = {p.case.row.metric for p in rows["dev"] + rows["frozen"]}
    assert kinds == {bench.STEP, bench.SERVING, bench.BATCH}
    assert all(quote for _, quote in bench.METRICS.values())


def test_leave_one_source_out_figures_are_what_the_fits_give(bench, rows, evaluation):
    fits = bench.shipped_loso()
    assert set(fits) == {bench.source_of(p.case.row.source) for p in rows["dev"]}
    errs = bench.loso_errors(rows["dev"], fits)
    med, worst = bench.summary(errs)
    assert med == pytest.approx(evaluation["loso"]["median_abs"], abs=5e-4)
    assert worst == pytest.approx(evaluation["loso"]["worst_abs"], abs=5e-4)
    assert statistics.median(errs) == pytest.approx(evaluation["loso"]["median_signed"], abs=5e-4)
    buckets = bench.bucket_stats(rows["dev"], errs)
    assert len(buckets) == len(evaluation["loso_buckets"])
    for b, want in zip(buckets, evaluation["loso_buckets"], strict=True):
        assert b.bucket == (want["gpu"], want["engine"], want["kind"])
        assert (b.rows, b.sources) == (want["rows"], want["sources"])
        assert b.median_abs == pytest.approx(want["median_abs"], abs=5e-4)
        assert b.median_signed == pytest.approx(want["median_signed"], abs=5e-4)


def test_frozen_test_set_figures(bench, rows, evaluation):
    errs = bench.errors(rows["frozen"], step_model.coefficients())
    med, worst = bench.summary(errs)
    assert med == pytest.approx(evaluation["frozen_test"]["median_abs"], abs=5e-4)
    assert worst == pytest.approx(evaluation["frozen_test"]["worst_abs"], abs=5e-4)


def test_one_left_out_fit_is_reproduced(bench, rows):
    # refit one source's leave-one-out fit from scratch: the stored one is what the search gives
    fits = bench.shipped_loso()
    src = sorted(fits)[0]
    rest = [p for p in rows["dev"] if bench.source_of(p.case.row.source) != src]
    again = bench.fit(rest, bench.start_coefficients())
    for name in bench.FITTED:
        assert getattr(again, name) == pytest.approx(getattr(fits[src], name), rel=1e-3), name


def test_the_readme_quotes_the_leave_one_source_out_figures(bench, evaluation):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert bench.readme_block(evaluation) in text
    loso = evaluation["loso"]
    assert f"median |error| {loso['median_abs']:.1%}, worst {loso['worst_abs']:.1%}" in text


def test_labels_say_fitted_clamped_or_assumed(bench):
    c = step_model.coefficients()
    for name in step_model.COEFFICIENTS:
        source = c.sources[name]
        if name in bench.FITTED:
            lo, hi = bench.BOUNDS[name]
            at_bound = getattr(c, name) in (pytest.approx(lo, rel=1e-3), pytest.approx(hi, rel=1e-3))
            assert source.startswith("clamped at its") == at_bound, name
            assert at_bound or source.startswith("fitted on"), name
        else:
            assert source.startswith("assumed"), name


def _row(bench, rows, line: int):
    for p in rows["dev"] + rows["frozen"]:
        if p.case.row.line == line:
            return p, bench.predict(p, step_model.coefficients())
    raise AssertionError(f"row {line} is not usable")


def test_weights_term_is_the_gemm_roofline(bench, rows):
    # vLLM 0.11, Qwen3-8B bf16, 1x H100 SXM, batch 1 (ShareGPT means 233 in / 221 out): 36 layers x 4
    # GEMMs + the LM head = 145 GEMMs, 15.14 GB, each streamed at eff x 3.35 TB/s after its fixed cost
    c = step_model.coefficients()
    p, step = _row(bench, rows, 32)
    assert p.case.row.tpot_ms == 7.22
    gemms = p.inputs.stages[0].gemms
    assert sum(g.count for g in gemms) == 145
    nbytes = sum(g.weight_bytes * g.count for g in gemms)
    assert nbytes == pytest.approx(15.14e9, rel=0.002)
    want = (nbytes + 145 * c.gemm_half_bytes) / (c.gemm_efficiency * 3.35e12) * 1e3
    assert step.weights_ms == pytest.approx(want, rel=1e-6)
    assert step.launch_ms == pytest.approx(36 * c.launch_per_layer_s * 1e3, rel=1e-9)
    assert bench.published_ms(p, c) == step.tpot_ms  # concurrency 1: no other prompts


def test_moe_experts_are_one_grouped_gemm_per_projection(bench, rows):
    # SGLang 0.5.12, DeepSeek-R1-0528 fp8, 8x H200 TP 8, 4 concurrent requests, 1k/1k: 58 MoE layers, each
    # a routing cost plus the touched experts' bytes (1 - (1 - 8/256)^4 of 256) streamed as two grouped
    # GEMMs, each paying the GEMM fixed cost once
    c = step_model.coefficients()
    p, step = _row(bench, rows, 39)
    e = p.inputs.stages[0].experts
    touched = 256 * (1 - (1 - 8 / 256) ** 4)
    eff = c.gemm_efficiency * c.lowbit_gemm_efficiency
    per_layer = sum(
        (g.weight_bytes * touched + c.gemm_half_bytes) / (eff * 4.8e12) for g in (e.gate_up, e.down)
    )
    assert step.moe_ms == pytest.approx(58 * (per_layer + c.moe_layer_s) * 1e3, rel=1e-3)


def test_static_batch_includes_its_context_phase_and_pre_xqa_reads(bench, rows):
    # TensorRT-LLM v0.6.1 gptSessionBenchmark, Llama-2-70B fp8, 2x H100, batch 64, 2048 in / 2048 out:
    # KV at 3072 tokens (2048 + 2048 / 2): 64 x 3072 x 81,920 B/GPU, read once per query head (8 per KV
    # head, masked MHA before XQA); the run: (the 64 prompts in one pass + 2047 x step) / 2048
    c, pc = step_model.coefficients(), prefill_coefficients()
    p, step = _row(bench, rows, 82)
    assert p.case.row.metric == bench.BATCH and p.case.row.kv_reads_per_head
    assert step.kv_bytes_read == 64 * 3072 * 81920 * 8
    # the batch's prompts: 64 x 2048 tokens of GEMM FLOPs at the fp8 peak, attention per prompt
    batch = p.batch_prefill_ms(c)
    gemm = 2 * p.work.active_params * 64 * 2048 / (2 * 1978.9e12 * pc.gemm_mfu) * 1e3
    attention = 4 * 64 * 2048 * 1024 * 80 * 64 * 128 / (2 * 989.4e12 * pc.attention_mfu) * 1e3
    assert batch > gemm + attention
    assert bench.published_ms(p, c) == pytest.approx((batch + 2047 * step.tpot_ms) / 2048, rel=1e-9)


def test_served_itl_includes_the_other_prompts(bench, rows):
    # NIM 1.8.0, Llama-3.3-70B fp8, 2x H100, 5000 in / 500 out at concurrency 50: the step plus the
    # other 49 requests' 5000-token prompts, one per slot every 500 steps
    c = step_model.coefficients()
    p, step = _row(bench, rows, 9)
    chunk = p.chunk_ms(c)  # a 5000-token prompt's FLOPs and all-reduce bytes riding in decode steps
    alone = prefill_time(p.inputs, p.work, 5000, served=False).total_ms
    assert 0 < chunk < alone  # the steps already stream the weights and pay the launches and latencies
    assert bench.published_ms(p, c) == pytest.approx(step.tpot_ms + 49 * chunk / 500, rel=1e-9)


def test_the_frozen_sets_history_holds_the_current_figures(evaluation):
    rows = (ROOT / "benchmarks" / "results" / "frozen_history.tsv").read_text(encoding="utf-8").splitlines()
    decode = [r.split("\t") for r in rows[1:] if r.split("\t")[1] == "decode"]
    assert decode, "no frozen evaluation of the decode fit recorded"
    last = decode[-1]
    frozen = evaluation["frozen_test"]
    # the fit records what it computed with its unrounded coefficients; decode_fit.yaml keeps them to six
    # significant figures, which can move the third decimal by one
    assert float(last[5]) == pytest.approx(frozen["median_abs"], abs=1.5e-3)
    assert float(last[6]) == pytest.approx(frozen["worst_abs"], abs=1.5e-3)
