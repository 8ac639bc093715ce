"""`solve` considers expert parallelism with DP attention for MoE models (issue 23) and says why."""

from __future__ import annotations

import pytest

import kvplan
from helpers import run_cli
from kvplan.search.solve import Query, solve
from kvplan.specs.registry import load_gpu, load_model


def _solve(model: str, gpu: str = "H200", **kw):
    answers, _ = solve(Query(model=load_model(model), gpus=(load_gpu(gpu),), **kw))
    return answers


def test_mla_model_on_one_node_with_dp_attention_instead_of_two_tp_nodes():
    # under TP 8 the latent KV is whole on every GPU: 64 users at 32K need 16x H200 (TP 8 x DP 2, fp8);
    # with each DP rank holding only its own requests' KV, one node holds them
    answers = _solve("deepseek-v3", users=64, max_model_len=32768)
    a = answers[0]
    assert (a.num_gpus, a.tensor_parallel_size, a.data_parallel_size) == (8, 1, 1)
    assert (a.expert_parallel_size, a.attention_dp_size) == (8, 8)
    plan = kvplan.estimate(
        "deepseek-v3", gpus="8xH200", max_model_len=32768, kv_cache_dtype=a.kv_cache_dtype,
        tensor_parallel_size=1, data_parallel_size=8, enable_expert_parallel=True,
    )  # fmt: skip
    assert a.max_concurrency == plan.max_concurrency >= 64
    assert a.decode_step.batch == 8 and a.decode_step.all_to_all_ms > 0  # 64 users over 8 DP ranks
    assert "--data-parallel-size 8 --enable-expert-parallel" in a.vllm_flags
    assert "--max-num-seqs 8" in a.vllm_flags and a.sglang_flags is None
    tp8 = kvplan.estimate(
        "deepseek-v3", gpus="8xH200", max_model_len=32768, kv_cache_dtype=a.kv_cache_dtype
    ).max_concurrency
    assert f"hold {a.max_concurrency:,} users vs {tp8:,} on TP 8" in a.why_expert_parallel
    assert tp8 * 4 < a.max_concurrency


def test_sglang_dp_attention_launch_line_carries_the_plans_memory_fraction():
    answers = _solve("deepseek-v3", users=64, max_model_len=32768, engine="sglang")
    a = next(x for x in answers if x.attention_dp_size > 1)
    assert a.tensor_parallel_size == 8 and a.vllm_flags is None
    assert f"--tp-size 8 --enable-dp-attention --dp-size {a.attention_dp_size}" in a.sglang_flags
    # DP attention makes SGLang reserve more than plain TP 8 (0.896 on H200)
    mfs = a.plan.settings.mem_fraction_static
    assert mfs < 0.896 and f"--mem-fraction-static {mfs:g}" in a.sglang_flags


def test_dense_models_get_no_expert_parallel_layouts():
    for a in _solve("llama3-70b", gpu="H100", users=300, max_model_len=8192):
        assert (a.expert_parallel_size, a.attention_dp_size, a.why_expert_parallel) == (1, 1, None)


def test_at_equal_cost_plain_tp_comes_before_expert_parallel():
    # Mixtral's 8 KV heads split over TP 8 without replication: DP attention buys 1% more users there
    answers = _solve("mixtral-8x7b", gpu="H100", users=100, max_model_len=8192)
    assert answers[0].num_gpus == 8 and answers[0].expert_parallel_size == 1
    ep = [a for a in answers if a.expert_parallel_size > 1]
    assert ep and all(a.num_gpus >= answers[0].num_gpus for a in ep)


def test_max_context_tries_dp_attention():
    answers = _solve("deepseek-v3", users=100, max_model_len=None, fixed_num_gpus=8)
    best, plain = answers[0], [a for a in answers if a.attention_dp_size == 1]
    assert best.attention_dp_size == 8
    assert not plain or best.max_model_len > 2 * plain[0].max_model_len


def test_cli_table_names_the_layout_and_why():
    r = run_cli("solve", "-m", "deepseek-v3", "--users", "64", "--max-model-len", "32K", "-g", "H200")
    assert r.exit_code == 0, r.stderr
    assert "EP 8, DPA 8" in r.stdout and "why EP: each of its DP attention ranks" in r.stdout
    assert "DPA: attention data-parallel ranks" in r.stdout


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_json_answer_fields(engine):
    import json

    r = run_cli("solve", "-m", "deepseek-v3", "--users", "64", "--max-model-len", "32K", "-g", "H200",
                "--engine", engine, "--json")  # fmt: skip
    a = json.loads(r.stdout)["answers"][0]
    assert a["attention_dp_size"] == 8 and a["why_expert_parallel"]
    assert (a["vllm_flags"] is None) == (engine == "sglang")
