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


def test_speculative_decoding_is_timed_as_estimate_times_it():
    """solve takes the speculative flags (issue 23): TPOT is the verify step plus draft passes over the
    accepted tokens, the same figure estimate prints for that layout and batch."""
    from kvplan.commands import inputs

    flags = {"model": "deepseek-v3", "users": 64, "max_model_len": "32K", "gpus": "H200"}
    flags.update(input_len="1024", output_len="1024")
    spec = '{"method": "mtp", "num_speculative_tokens": 1}'
    q, answers = inputs.solve(inputs.SolveFlags(**flags, speculative_config=spec))
    _, plain = inputs.solve(inputs.SolveFlags(**flags))
    a = answers[0]
    assert a.speculative is not None and a.speculative.acceptance_length == pytest.approx(1.85)
    assert a.tpot_ms == pytest.approx(a.speculative.tpot_ms)
    assert a.tpot_ms < plain[0].tpot_ms / 1.4  # 1.85 tokens a step for one verify + one MTP pass
    plan = kvplan.estimate(
        "deepseek-v3", gpus="8xH200", max_model_len="32K", kv_cache_dtype=a.kv_cache_dtype, input_len=1024,
        output_len=1024, tensor_parallel_size=1, data_parallel_size=8, enable_expert_parallel=True,
        speculative_config=spec,
    )  # fmt: skip
    batch1 = plan.decode.speculative[0]
    assert batch1.batch == 1 and batch1.method == "mtp"
    # the MTP layer's memory is counted: fewer users than without it
    assert a.max_concurrency < plain[0].max_concurrency * answers[0].num_gpus // plain[0].num_gpus
    r = run_cli("solve", "-m", "deepseek-v3", "--users", "64", "--max-model-len", "32K", "-g", "H200",
                "--speculative-config", spec, "--json")  # fmt: skip
    assert r.json()["answers"][0]["speculative"]["method"] == "mtp"
    text = run_cli("solve", "-m", "deepseek-v3", "--users", "64", "--max-model-len", "32K", "-g", "H200",
                   "--speculative-config", spec).stdout  # fmt: skip
    assert "TPOT: speculative decoding (mtp): the verify step over 2 tokens" in " ".join(text.split())


def test_speculative_and_imbalance_refusals():
    r = run_cli(
        "solve", "-m", "llama3-70b", "--users", "10", "--max-model-len", "8K", "--moe-imbalance", "1.2"
    )
    assert r.exit_code == 2 and "has no routed experts" in r.stderr
    r = run_cli(
        "solve", "-m", "deepseek-v3", "--users", "10", "--max-model-len", "8K", "--moe-imbalance", "0.5"
    )
    assert r.exit_code == 2 and "--moe-imbalance must be between 1 and 64" in r.stderr


def test_moe_imbalance_slows_only_expert_parallel_layouts():
    base = _solve("deepseek-v3", users=64, max_model_len=32768)
    skewed = _solve("deepseek-v3", users=64, max_model_len=32768, moe_imbalance=2.0)
    b, s = base[0], skewed[0]
    assert (b.expert_parallel_size, s.expert_parallel_size) == (8, 8)
    # the busiest rank's tokens and all-to-all bytes double; its touched experts are capped at the 32 it holds
    assert s.decode_step.all_to_all_ms > b.decode_step.all_to_all_ms
    assert s.decode_step.moe_ms > 1.05 * b.decode_step.moe_ms and s.tpot_ms > b.tpot_ms
    assert "2 x the mean" in s.decode_step.sources["moe_imbalance"]


def test_compare_table_and_plot_take_dp_and_expert_parallel():
    """compare table/plot take vLLM's --data-parallel-size and --enable-expert-parallel (issue 23): the MLA
    model's rows hold what estimate gives for that layout; the title says the layout."""
    from kvplan.commands import comparisons

    flags = comparisons.ClusterFlags(
        "8xH200", "32K", 1, None, data_parallel_size=8, enable_expert_parallel=True
    )
    result = comparisons.table("deepseek-v3,llama3-8b", "shipped", flags, 0.0)
    ds = next(r for r in result.rows if r.model == "deepseek-v3")
    plan = kvplan.estimate("deepseek-v3", gpus="8xH200", max_model_len="32K", tensor_parallel_size=1,
                           data_parallel_size=8, enable_expert_parallel=True)  # fmt: skip
    assert ds.plan.max_concurrency == plan.max_concurrency == 120
    r = run_cli("compare", "table", "-m", "deepseek-v3", "-g", "8xH200", "--max-model-len", "32K", "-tp", "1",
                "-dp", "8", "--enable-expert-parallel")  # fmt: skip
    assert r.exit_code == 0 and "TP 1, DP 8, MoE rows EP 8" in r.stdout
    p = run_cli("compare", "plot", "-m", "deepseek-v3", "-g", "8xH200", "-tp", "1", "-dp", "8",
                "--enable-expert-parallel", "--json").json()  # fmt: skip
    plain = run_cli("compare", "plot", "-m", "deepseek-v3", "-g", "8xH200", "--json").json()
    assert p["series"][0]["max_concurrency"][0] > plain["series"][0]["max_concurrency"][0]
