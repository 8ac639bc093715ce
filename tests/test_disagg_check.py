"""The KV a disaggregated request moves, held against Mooncake's published 1P1D measurements
(tests/fixtures/bench/disagg_runs.tsv; benchmarks/disagg_check.py)."""

from __future__ import annotations

import sys

import pytest

import kvplan
from helpers import REPO, run_cli
from kvplan.errors import UsageError

sys.path.insert(0, str(REPO / "benchmarks"))

import disagg_check  # noqa: E402


@pytest.fixture(scope="module")
def records():
    return disagg_check.check()


def test_every_mooncake_row_is_read(records):
    # nine prompt lengths (128 ... 32,768) in each doc, each with a size, a transfer time and a TTFT
    assert [x["input_len"] for x in records if x["engine"] == "sglang"] == [128 << i for i in range(9)]
    assert [x["input_len"] for x in records if x["engine"] == "vllm"] == [128 << i for i in range(9)]
    assert all(
        {"published_kv_bytes", "published_transfer_ms", "published_ttft_ms"} <= set(x) for x in records
    )


def test_kv_moved_matches_the_measured_bytes(records):
    # SGLang, Qwen3-235B at TP 8: 4 KV heads on 8 ranks, each head held (and sent) twice: 385,024 bytes a
    # token, the doc's printed size to its last digit at every length (12.62 GB at 32,768)
    for x in (r for r in records if r["engine"] == "sglang"):
        assert x["kv_bytes"] == 385_024 * x["input_len"]
        # within the rounding of the printed figure (half a unit of its last digit)
        assert abs(x["kv_bytes"] - x["published_kv_bytes"]) <= x["published_kv_half_digit"] * 1.0001, x
    # vLLM, Qwen3-8B at TP 8 (8 KV heads, one a rank): 147,456 bytes a token; from 4,096 tokens on the
    # chat template's few tokens are below the printed precision
    for x in (r for r in records if r["engine"] == "vllm"):
        assert x["kv_bytes"] == 147_456 * x["input_len"]
        if x["input_len"] >= 4096:
            assert x["kv_bytes"] / x["published_kv_bytes"] - 1 == pytest.approx(0, abs=0.005), x


def test_line_rate_transfer_is_faster_than_measured_and_says_so(records):
    # kvplan charges the link at its line rate with no per-transfer latency: below every measured time
    # (Mooncake reached 82% of the line at 32K, less on small transfers), which the output states
    assert all(x["transfer_ms"] < x["published_transfer_ms"] for x in records)
    d = kvplan.estimate(
        "qwen3-235b-a22b", disaggregated=True, prefill_gpus="8xH20", decode_gpus="8xH20", input_len=32768,
        output_len=128, max_model_len="40K", engine="sglang", network_gbps=200,
    )  # fmt: skip
    assert d.kv_bytes_per_token == 385_024 and d.kv_bytes_per_request == 385_024 * 32768
    assert d.transfer_ms == pytest.approx(385_024 * 32768 / 200e9 * 1e3)
    notes = " ".join(d.assumptions)
    assert "its latency and any overlap with compute not counted" in notes
    assert "2 x the model's 192,512 bytes" in notes
    assert repr(d) == (
        "Disaggregated(qwen3-235b-a22b: prefill 8xH20, decode 8xH20; 32,768 in / 128 out; KV moved 12.62 GB "
        f"a request in 63.1 ms; the prefill pool binds at {d.requests_per_s:,.2f} req/s)"
    )
    with pytest.raises(UsageError, match="need disaggregated=True"):
        kvplan.estimate("qwen3-8b", prefill_gpus="8xH20", decode_gpus="8xH20")


def test_mla_latent_is_moved_once_per_tp_rank_and_once_under_dp_attention():
    from kvplan.commands import inputs
    from kvplan.plan.disagg import kv_moved_bytes_per_token
    from kvplan.plan.plan import estimate

    def plan(**kw):
        return estimate(inputs.plan_request(inputs.EstimateFlags(model="deepseek-v3", gpus="8xH200",
                                                                 max_model_len="8K", **kw)))  # fmt: skip

    tp8 = plan()
    # DeepSeek-V3's latent: 61 layers x (512 + 64) x 2 bytes = 70,272 bytes a token, whole on each of 8 ranks
    assert tp8.kv_bytes_per_token == 70_272
    assert kv_moved_bytes_per_token(tp8) == 8 * 70_272
    dpa = plan(engine="sglang", enable_dp_attention=True, data_parallel_size=8)
    assert kv_moved_bytes_per_token(dpa) == 70_272  # a request's KV lives on its one attention rank


def test_solve_disaggregated_answers_llm_ds_published_layout():
    # llm-d ran gpt-oss-120b on 16 H200 (8 prefill x TP 1, 2 decode x TP 4) at 45 requests/s of 5,000 in /
    # 250 out and measured 42.58 requests/s, TTFT p90 1.59 s, TPOT p90 7.8 ms; asked for that rate and
    # those targets, solve answers the same 16 GPUs split 8 + 8, the prefill pool as llm-d's (8 x TP 1),
    # within 20% of the measured requests/s per GPU
    r = disagg_check.llmd_check()
    assert r["num_gpus"] == 16 and r["prefill"] == [8, 1]
    assert r["decode"][0] * r["decode"][1] == 8
    assert abs(r["requests_per_s_per_gpu_error"]) < 0.2
    assert r["published_requests_per_s_per_gpu"] == pytest.approx(42.58097793003138 / 16)


def test_estimate_takes_each_pools_tp_and_sizes_llm_ds_layout():
    est = disagg_check.llmd_estimate()
    assert (est["prefill_replicas"], est["decode_replicas"]) == (8, 2)
    # kvplan's arithmetic is a ceiling: the bare prefill of one prompt after another on each of the 8
    # prefill GPUs binds above the 42.6 requests/s llm-d served (no serving overhead counted)
    assert est["binding_pool"] == "prefill" and est["requests_per_s"] > est["published_requests_per_s"]
    r = run_cli("estimate", "-m", "gpt-oss-120b", "--decode-tp", "4")
    assert r.exit_code == 2 and "--decode-tp needs --disaggregated" in r.stderr
    r = run_cli("estimate", "-m", "gpt-oss-120b", "--disaggregated", "--prefill-gpus", "8xH200",
                "--decode-gpus", "8xH200", "--prefill-tp", "0", "--input-len", "1K", "--output-len", "64")  # fmt: skip
    assert r.exit_code == 2 and "--prefill-tp must be between 1 and 1,024" in r.stderr
