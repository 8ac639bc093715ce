"""`solve --disaggregated --request-rate` (issue 23): a simulated prefill pool, a decode pool by Little's
law, the KV transfer between them, and the colocated answer beside it."""

from __future__ import annotations

import math

import pytest

from helpers import run_cli
from kvplan.commands import inputs
from kvplan.errors import NoAnswer
from kvplan.search.disagg_rate import _little

ARGS = ("solve", "-m", "llama3-70b", "--request-rate", "4", "--ttft-ms", "1000", "--tpot-ms", "50",
        "--max-model-len", "8K", "--input-len", "2048", "--output-len", "256", "--num-prompts", "300",
        "-g", "H100", "--disaggregated")  # fmt: skip


@pytest.fixture(scope="module")
def answer():
    f = inputs.SolveFlags(model="llama3-70b", users=1, max_model_len="8K", gpus="H100", tpot_ms=50)
    load = inputs.LoadFlags(ttft_ms=1000, tpot_ms=50, request_rate=4, num_prompts=300, input_len="2048",
                            output_len="256", disaggregated=True)  # fmt: skip
    return inputs.solve_load(f, load)


def test_both_pools_meet_their_targets_and_add_up(answer):
    t = answer.targets
    pre, d = answer.prefill, answer.decode
    assert answer.ttft_ms == pytest.approx(t.of(pre.result.ttft_ms) + answer.transfer_ms)
    assert answer.ttft_ms <= 1000 and d.tpot_ms <= 50
    assert answer.num_gpus == pre.layout.num_gpus + d.num_gpus
    assert answer.num_gpus % 8 == 0  # whole nodes each
    # the prefill pool emits first tokens only: no TPOT to speak of
    assert pre.result.tpot_ms.p90 == 0.0 and pre.result.completed == 300
    # the KV moved: 2,048 tokens x the model's bytes a token, over 50 GB/s a GPU of the prefill replica
    kv = pre.layout.plan.kv_bytes_per_token * 2048
    gpus = pre.layout.tensor_parallel_size * pre.layout.pipeline_parallel_size
    assert answer.transfer_ms == pytest.approx(kv / (50e9 * gpus) * 1e3)
    assert answer.colocated is not None and answer.colocated.layout.num_gpus >= 8


def test_the_decode_pool_is_at_its_littles_law_point(answer):
    d = answer.decode
    # N = rate per replica x output tokens x TPOT(N)
    assert d.concurrency_per_replica == pytest.approx(
        d.requests_per_s_per_replica * 256 * d.tpot_ms / 1e3, rel=0.05
    )
    assert d.concurrency_per_replica <= d.capacity_per_replica
    assert d.step_context_tokens == 2048 + 256 // 2
    assert f"--max-num-seqs {d.capacity_per_replica}" in d.launch and d.launch.startswith("vllm serve")


def test_little_has_no_answer_when_the_replica_cannot_keep_up():
    import kvplan

    plan = kvplan.estimate("llama3-8b", gpus="H100", max_model_len="8K", input_len=1024, output_len=128)
    kv, ctx = plan.decode.kv_bytes_per_request_per_gpu, plan.decode.context_tokens
    step = plan.decode.step(64, kv, ctx).tpot_ms
    assert _little(plan, 1000.0, 128, 64, ctx, kv) is None  # 1000 req/s x 128 tokens >> 64 / step
    n, tpot = _little(plan, 1.0, 128, 64, ctx, kv)
    assert n == pytest.approx(1.0 * 128 * plan.decode.step(math.ceil(n), kv, ctx).tpot_ms / 1e3, rel=0.2)
    assert tpot < step


def test_cli_table_json_and_refusals():
    r = run_cli(*ARGS)
    assert r.exit_code == 0, r.stderr
    assert "disaggregated prefill/decode for 4 requests/s" in r.stdout and "colocated" in r.stdout
    assert "decode pool by Little's law, not simulated" in " ".join(r.stdout.split())
    d = run_cli(*ARGS, "--json").json()
    assert d["schema"] == "kvplan.solve-disaggregated/1" and d["num_gpus"] >= 16
    assert d["prefill"]["answer"]["num_gpus"] + d["decode"]["num_gpus"] == d["num_gpus"]
    bad = run_cli("solve", "-m", "llama3-70b", "--users", "3", "--max-model-len", "8K", "--disaggregated")
    assert bad.exit_code == 2 and "--disaggregated goes with --request-rate" in bad.stderr
    bad = run_cli("solve", "-m", "llama3-70b", "--max-rate", "-g", "8xH100", "--ttft-ms", "1000", "--tpot-ms", "50",
                  "--max-model-len", "8K", "--disaggregated")  # fmt: skip
    assert bad.exit_code == 2 and "not --max-rate" in bad.stderr


def test_an_unreachable_ttft_is_refused_in_one_line():
    f = inputs.SolveFlags(model="llama3-70b", users=1, max_model_len="8K", gpus="H100", tpot_ms=50,
                          network="25G")  # fmt: skip
    load = inputs.LoadFlags(ttft_ms=1, tpot_ms=50, request_rate=1, num_prompts=50, input_len="8000",
                            output_len="64", disaggregated=True)  # fmt: skip
    with pytest.raises(NoAnswer, match=r"--ttft-ms 1: even one prompt alone takes"):
        inputs.solve_load(f, load)


def test_max_gpus_bounds_both_pools_together():
    base = {"model": "llama3-8b", "users": 1, "max_model_len": "8K", "gpus": "H100", "tpot_ms": 50}
    load = inputs.LoadFlags(ttft_ms=500, tpot_ms=50, request_rate=5, num_prompts=100, disaggregated=True)
    with pytest.raises(NoAnswer, match=r"--max-gpus 1: the decode pool alone takes 1 H100-SXM"):
        inputs.solve_load(inputs.SolveFlags(**base, max_gpus=1), load)
    two = inputs.solve_load(inputs.SolveFlags(**base, max_gpus=2), load)
    assert two.num_gpus == 2 and two.prefill.layout.num_gpus == 1 and two.decode.num_gpus == 1


def test_an_moe_decode_pool_may_be_an_expert_parallel_unit():
    """DeepSeek-V3 at 32K, 8K in / 1K out: at 3 requests/s TP 8 holds the ~137 decoding requests (151 fit
    in fp8); at 5 requests/s (~222) only DP attention's 424 keep one node."""
    f = inputs.SolveFlags(model="deepseek-v3", users=1, max_model_len="32K", gpus="H200", tpot_ms=60)

    def pool(req_rate: float):
        load = inputs.LoadFlags(ttft_ms=5000, tpot_ms=60, request_rate=req_rate, num_prompts=100,
                                input_len="8192", output_len="1024", disaggregated=True)  # fmt: skip
        return inputs.solve_load(f, load).decode

    low = pool(3)
    assert low.num_gpus == 8 and (low.expert_parallel_size, low.attention_dp_size) == (1, 1)
    d = pool(5)
    assert d.num_gpus == 8 and (d.expert_parallel_size, d.attention_dp_size) == (8, 8)
    assert d.capacity_per_replica > 2 * low.capacity_per_replica
    assert "--data-parallel-size 8 --enable-expert-parallel" in d.launch
    assert d.concurrency_per_replica <= d.capacity_per_replica and d.tpot_ms <= 60


@pytest.mark.parametrize("extra", [(), ("--disaggregated",)])
def test_a_context_beyond_the_model_is_one_line_before_any_simulation(extra):
    # it was "no layout meets the targets: H100-SXM TP 8 x PP 2 (auto): --max-model-len 16,384 exceeds ..."
    r = run_cli("solve", "-m", "llama3-8b", "--max-model-len", "16K", "--request-rate", "1", "--ttft-ms", "1000",
                "--tpot-ms", "50", "--num-prompts", "50", *extra)  # fmt: skip
    assert r.exit_code == 3
    assert r.stderr.strip() == (
        "error: --max-model-len 16,384 exceeds llama3-8b's maximum context of 8,192 tokens; "
        "use --max-model-len 8192 or less"
    )
