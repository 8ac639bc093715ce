"""benchmarks/ep_spec_check.py (issue 23): published runs with expert parallelism, DP attention and
speculative decoding, held against the decode step by coefficients that never saw their source."""

from __future__ import annotations

import pytest

from helpers import load_benchmark


@pytest.fixture(scope="module")
def check():
    return load_benchmark("ep_spec_check")


@pytest.fixture(scope="module")
def rows(check):
    got, excluded = check.read_ep_spec()
    return got, excluded


def test_rows_are_kept_or_excluded_by_the_written_rules(rows):
    got, excluded = rows
    assert len(got) + len(excluded) == 20
    # the queued high-throughput cells (concurrency 1024 > --max-running-requests 256)
    assert any("ep_spec_runs.tsv:5: concurrency 1024 above --max-running-requests 256" in e for e in excluded)
    # the TensorRT-LLM MTP ablation and the InferenceX pair state no MoE layout and no server command
    for line in range(11, 21):
        assert any(e.startswith(f"ep_spec_runs.tsv:{line}: MoE layout (EP) not stated") for e in excluded)


def test_speculative_configs_are_read_as_published(rows):
    got, _ = rows
    by = {r.where: r for r in got}
    low = by["ep_spec_runs.tsv:1"]  # GLM-5.2 H200 low-latency: EAGLE MTP 5 steps, 6 draft tokens, ~5.96/6
    assert low.spec == ("mtp", 5, 6, 5.96) and low.ep == 1 and low.dp_attention == 1
    bal = by["ep_spec_runs.tsv:3"]  # balanced: DP attention 8 + DeepEP, MTP 1-1-2, acceptance not stated
    assert bal.spec == ("mtp", 1, 2, None) and bal.dp_attention == 8 and bal.a2a == "deepep"
    assert bal.metric == "serving" and bal.batch == 64


def test_a_prediction_is_the_step_model_with_the_held_out_coefficients(check, rows):
    from kvplan.speed import step_model as speed

    ep_rows = check.read_decode_ep([])
    row = next(r for r in ep_rows if r.where == "decode_runs.tsv:61")  # R1 FP4 8x B200, TP 8 x EP 8, batch 1
    assert (row.tp, row.ep, row.batch) == (8, 8, 1)
    p = check.prepare(row)
    c = check.fd.shipped_loso()[row.source]
    step = speed.decode_step(p.inputs, 1, p.kv, p.ctx, None, c).tpot_ms
    assert check.predict(p, c) == pytest.approx(step)  # serving at concurrency 1: no other prompts
    assert p.inputs.parallel.ep == 8 and not p.inputs.parallel.all_to_all  # SGLang --ep-size: all-reduce


def test_the_glm_mtp_rows_plan(check, rows):
    got, _ = rows
    p = check.prepare(next(r for r in got if r.where == "ep_spec_runs.tsv:3"))
    assert p.speculative is not None and p.speculative.acceptance_length == pytest.approx(1.85)
    assert p.inputs.parallel.attn_dp == 8


def test_the_results_file_and_the_readme_are_what_the_script_computes(check):
    import yaml

    from helpers import REPO

    saved = yaml.safe_load(
        (REPO / "benchmarks" / "results" / "ep_spec_check.yaml").read_text(encoding="utf-8")
    )
    now = check.evaluate()
    assert [r["where"] for r in now["records"]] == [r["where"] for r in saved["records"]]
    for a, b in zip(now["records"], saved["records"], strict=True):
        assert a["predicted_ms"] == pytest.approx(b["predicted_ms"], rel=1e-3), a["where"]
    assert now["summary"] == saved["summary"]
    assert check.readme_block(saved) in (REPO / "README.md").read_text(encoding="utf-8")
