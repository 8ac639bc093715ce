"""`kvplan solve`: answers meet every target when fed back into estimate, smaller layouts do not,
and an infeasible ask names the constraint that binds."""

from __future__ import annotations

import itertools
import math

import pytest

from helpers import plan, run_cli
from kvplan.errors import InfeasibleError
from kvplan.model.parallel import valid_tps
from kvplan.search.solve import Query, solve, verdict
from kvplan.specs.registry import load_gpu, load_model
from kvplan.speed import step_model


def _meets(model, gpu, n, tp, pp, dtype, length, users, tpot_ms) -> bool:
    """Check a layout independently of solve: estimate it and apply the speed model."""
    try:
        p = plan(model, gpu, num_gpus=n, tp=tp, pp=pp, max_model_len=length, kv_cache_dtype=dtype)
    except InfeasibleError:
        return False
    if p.max_concurrency < users:
        return False
    if tpot_ms is None:
        return True
    dp = p.cluster.data_parallel_size
    step = step_model.decode_step(p.decode.inputs, math.ceil(users / dp), p.kv_bytes_per_request_per_gpu)
    return step.tpot_ms <= tpot_ms


def test_answers_meet_the_targets_and_no_smaller_layout_does():
    model, gpu, users, length, tpot = "llama3-8b", "H100", 300, 8192, 30.0
    answers, _ = solve(
        Query(
            model=load_model(model),
            gpus=(load_gpu(gpu),),
            users=users,
            max_model_len=length,
            tpot_ms=tpot,
            max_gpus=16,
            partial_nodes=True,  # any GPU count below a node: the brute force below can check every one
        )
    )
    best = answers[0]
    assert [a.num_gpus for a in answers] == sorted(a.num_gpus for a in answers)
    for a in answers:  # fed back into estimate, each answer meets both targets
        assert _meets(
            model,
            gpu,
            a.num_gpus,
            a.tensor_parallel_size,
            a.pipeline_parallel_size,
            a.kv_cache_dtype,
            length,
            users,
            tpot,
        )
        assert a.margins.users >= 0 and (a.margins.tpot or 0) >= 0
    # every layout on fewer GPUs fails a target (brute force over TP x PP x DP and KV dtype)
    spec = load_model(model)
    for n in range(1, best.num_gpus):
        for tp, pp in itertools.product(valid_tps(spec, 8), range(1, n + 1)):
            if n % (tp * pp):
                continue
            for dtype in ("auto", "fp8"):
                assert not _meets(model, gpu, n, tp, pp, dtype, length, users, tpot), (n, tp, pp, dtype)


def test_fp8_is_chosen_only_when_bf16_cannot_do_it_on_as_few_gpus():
    spec = load_model("llama3-70b")
    for users in (150, 300):
        answers, _ = solve(Query(model=spec, gpus=(load_gpu("H100"),), users=users, max_model_len=8192))
        best = answers[0]
        same = [a for a in answers if a.num_gpus == best.num_gpus]
        if any(a.kv_cache_dtype == "auto" for a in same):
            assert best.kv_cache_dtype == "auto"  # equal GPUs: full-precision KV first
        if best.kv_cache_dtype == "fp8":
            n = best.num_gpus
            for tp, pp in itertools.product(valid_tps(spec, 8), range(1, n + 1)):
                if n % (tp * pp) == 0:
                    assert not _meets("llama3-70b", "H100", n, tp, pp, "auto", 8192, users, None)


def test_max_context_mode_finds_the_boundary():
    q = Query(
        model=load_model("llama3.1-70b"),
        gpus=(load_gpu("H200"),),
        users=200,
        max_model_len=None,
        fixed_num_gpus=8,
    )
    answers, _ = solve(q)
    a = answers[0]
    assert a.num_gpus == 8 and a.max_concurrency >= 200
    kw = {
        "num_gpus": 8,
        "tp": a.tensor_parallel_size,
        "pp": a.pipeline_parallel_size,
        "kv_cache_dtype": a.kv_cache_dtype,
        # the launch line's cap, which also sizes vLLM's sampler profiling run: the server it starts
        "max_num_seqs": -(-200 // a.data_parallel_size),
    }
    assert plan("llama3.1-70b", "H200", max_model_len=a.max_model_len, **kw).max_concurrency >= 200
    assert plan("llama3.1-70b", "H200", max_model_len=a.max_model_len + 1, **kw).max_concurrency < 200
    assert [x.max_model_len for x in answers] == sorted((x.max_model_len for x in answers), reverse=True)


def test_price_ranks_by_cost():
    q = Query(
        model=load_model("llama3-70b"),
        gpus=(load_gpu("H100"), load_gpu("H200")),
        users=300,
        max_model_len=8192,
        prices={"H100-SXM": 2.5, "H200": 3.8},
    )
    answers, _ = solve(q)
    costs = [a.cost_per_hour for a in answers]
    assert costs == sorted(costs)
    assert all(a.cost_per_hour == a.num_gpus * {"H100-SXM": 2.5, "H200": 3.8}[a.gpu] for a in answers)


def test_launch_flags():
    answers, _ = solve(
        Query(
            model=load_model("llama3-70b"),
            gpus=(load_gpu("H100"),),
            users=500,
            max_model_len=8192,
            tpot_ms=50,
        )
    )
    a = answers[0]
    assert f"--tensor-parallel-size {a.tensor_parallel_size}" in a.vllm_flags
    assert "--max-model-len 8192" in a.vllm_flags and f"--kv-cache-dtype {a.kv_cache_dtype}" in a.vllm_flags
    assert f"--max-num-seqs {math.ceil(500 / a.data_parallel_size)}" in a.vllm_flags
    assert "--gpu-memory-utilization 0.92" in a.vllm_flags and "--block-size 16" in a.vllm_flags
    assert (
        f"--tp-size {a.tensor_parallel_size}" in a.sglang_flags and "--context-length 8192" in a.sglang_flags
    )
    assert "--mem-fraction-static 0." in a.sglang_flags and "--max-running-requests" in a.sglang_flags


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # 405B bf16 ~ 810 GB: at 72.85 GiB usable per H100 the weights alone need 11, and so 2 whole
        # nodes of 8 (TP 8 in each, one pipeline stage per node)
        (
            {"model": "llama3.1-405b", "users": 10, "max_gpus": 8},
            "weights alone need 16 H100-SXM (2 nodes: TP 8 x PP 2)",
        ),
        # 2 nodes, each TP 8 (one copy of the weights per node holds the most KV)
        ({"model": "llama3-70b", "users": 5000, "max_gpus": 16}, "at most 662 users fit at 8,192 tokens"),
        ({"model": "llama3-70b", "users": 100, "tpot_ms": 5.0}, "--tpot-ms 5: the fastest layout"),
    ],
)
def test_infeasible_targets_name_the_binding_constraint(query, expected):
    kw = {"max_model_len": 8192, **query, "model": load_model(query["model"])}
    q = Query(gpus=(load_gpu("H100"),), **kw)
    answers, bounds = solve(q)
    assert answers == []
    assert expected in verdict(q, bounds)[0]


def test_cli_json_and_errors():
    j = run_cli("solve", "-m", "llama3-8b", "--users", "100", "--context", "8K", "--json").json()
    assert j["schema"] == "kvplan.solve/1" and j["mode"] == "min-gpus"
    first = j["answers"][0]
    assert {
        "num_gpus",
        "gpu",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "kv_cache_dtype",
        "max_concurrency",
        "margins",
        "vllm_flags",
        "sglang_flags",
    } <= set(first)
    r = run_cli("solve", "-m", "llama3.1-405b", "--users", "10", "--context", "8K", "--max-gpus", "8")
    assert r.exit_code == 3 and "weights alone need" in r.stderr and "Traceback" not in r.stderr
    assert run_cli("solve", "-m", "llama3-8b", "--users", "10", "--max-context").exit_code == 2
    assert run_cli("solve", "-m", "llama3-8b", "--users", "10").exit_code == 2
    assert (
        run_cli("solve", "-m", "llama3-8b", "--users", "10", "--context", "8K", "--price", "1,2").exit_code
        == 2
    )
    ok = run_cli(
        "solve", "-m", "llama3.1-70b", "--users", "200", "--max-context", "-g", "8xH200", "--top", "2"
    )
    assert ok.exit_code == 0 and "the longest context for 200 users" in ok.stdout


def test_pipeline_stages_are_not_free_and_solve_says_why():
    # 405B in bf16 needs 11+ H100s. Before the step model, PP stages cost nothing and the fastest layout
    # for one user was TP 8 x PP 7 on 56 GPUs; a token crosses the stages one after another, so PP only
    # adds hops: the fastest layout is the fewest stages that hold the weights, with one replica.
    q = Query(
        model=load_model("llama3.1-405b"), gpus=(load_gpu("H100"),), users=1, max_model_len=8192, tpot_ms=1.0
    )
    answers, bounds = solve(q)
    assert answers == [] and bounds.best_tpot is not None
    assert "16x H100-SXM (TP 8 x PP 2, DP 1" in verdict(q, bounds)[0]
    loose = Query(model=load_model("llama3.1-405b"), gpus=(load_gpu("H100"),), users=1, max_model_len=8192)
    answers, _ = solve(loose)
    # PP only because one node cannot hold the weights; one stage per node, TP 8 in each
    assert answers[0].pipeline_parallel_size == 2 and "the weights do not fit" in (
        answers[0].why_pipeline or ""
    )
    for a in answers:
        assert (
            a.tensor_parallel_size == 8 and a.num_gpus == 8 * a.pipeline_parallel_size * a.data_parallel_size
        )
        assert "between nodes, over the network 400G" in (a.why_pipeline or "")
        assert a.tpot_source.startswith(step_model.FITTED)
        assert a.decode_step.tpot_ms == pytest.approx(a.tpot_ms)
    pp = [a for a in answers if a.pipeline_parallel_size > 1]
    assert pp and all(a.decode_step.pp_hop_ms > 0 for a in pp)
    # one stage fewer at the same TP is never slower for one user
    tp8 = plan("llama3-70b", "H100", num_gpus=8, tp=8, pp=1, max_model_len=8192)
    tp8pp2 = plan("llama3-70b", "H100", num_gpus=16, nodes=2, tp=8, pp=2, max_model_len=8192)
    assert tp8pp2.decode.batch_1.tpot_ms > tp8.decode.batch_1.tpot_ms
    r = run_cli("solve", "-m", "llama3.1-405b", "--users", "1", "--context", "8K")
    assert (
        r.exit_code == 0
        and "why PP: PP" in r.stdout
        and "fitted to published runs" in " ".join(r.stdout.split())
    )


def test_tpot_at_the_mean_decode_context_when_the_workload_is_given():
    # with --input-len/--output-len, solve's TPOT is estimate's: each request at input + output / 2
    # (2,000 + 500 / 2 = 2,250 tokens), not at --max-model-len; without them, at the full 32K
    args = ("solve", "-m", "llama3.1-70b", "-u", "64", "--max-model-len", "32K", "-g", "H100", "--top", "1")
    full = run_cli(*args, "--json").json()["answers"][0]
    mean = run_cli(*args, "--input-len", "2000", "--output-len", "500", "--json").json()["answers"][0]
    assert (full["tpot_context_tokens"], mean["tpot_context_tokens"]) == (32768, 2250)
    assert mean["tpot_context_source"].startswith("input 2,000 + output 500 / 2")
    assert mean["tpot_ms"] < full["tpot_ms"]
    assert mean["max_concurrency"] == full["max_concurrency"]  # capacity is still at --max-model-len
    p = plan("llama3.1-70b", "H100", num_gpus=8, tp=8, max_model_len=32768, kv_cache_dtype="fp8",
             input_len=2000, output_len=500)  # fmt: skip
    if mean["tensor_parallel_size"] == 8 and mean["data_parallel_size"] == 1:
        step = p.decode.step(64, p.decode.kv_bytes_per_request_per_gpu, p.decode.context_tokens)
        assert mean["tpot_ms"] == pytest.approx(step.tpot_ms)
    avg = run_cli(*args, "--avg-context", "4K", "--json").json()["answers"][0]
    assert (avg["tpot_context_tokens"], avg["tpot_context_source"]) == (4096, "--avg-context")
    text = run_cli(*args, "--input-len", "2000", "--output-len", "500").stdout
    assert "each request at input 2,000 + output 500 / 2" in " ".join(text.split())
