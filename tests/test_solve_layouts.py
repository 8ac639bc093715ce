"""`solve` answers layouts an engineer would rent (issue 21): whole nodes, TP inside a node, PP only
across nodes and only when one node cannot hold the weights."""

from __future__ import annotations

import re
import shlex

import pytest

from helpers import REPO, run_cli
from kvplan.search.solve import Query, engine_tps, solve
from kvplan.specs.registry import load_gpu, load_model


def _solve(**kw):
    kw.setdefault("gpus", (load_gpu("H100"),))
    kw["model"] = load_model(kw["model"])
    answers, _ = solve(Query(**kw))
    return answers


def _whole_nodes(a, gpn: int = 8) -> bool:
    return a.num_gpus % gpn == 0 and a.nodes == a.num_gpus // gpn


def test_70b_at_32k_is_whole_nodes_of_tp_without_pipeline():
    # before: 10x H100 as TP 1 x PP 10, then 11x H100
    answers = _solve(model="llama3.1-70b", users=100, max_model_len=32768)
    assert answers
    for a in answers:
        assert _whole_nodes(a), (a.num_gpus, a.tensor_parallel_size, a.pipeline_parallel_size)
        assert a.pipeline_parallel_size == 1 and a.why_pipeline is None  # the weights fit one node
        assert a.tensor_parallel_size in (1, 2, 4, 8)
        assert a.tensor_parallel_size * a.data_parallel_size == a.num_gpus  # replicas fill the nodes
        assert a.max_concurrency >= 100


def test_price_ranking_never_pipelines_inside_a_node():
    # before: 6x H200 as TP 2 x PP 3 ranked first
    answers = _solve(
        model="llama3.1-70b",
        users=100,
        max_model_len=32768,
        gpus=(load_gpu("H100"), load_gpu("H200")),
        prices={"H100-SXM": 2.5, "H200": 3.8},
    )
    assert answers[0].gpu == "H200" and answers[0].num_gpus == 8
    assert all(_whole_nodes(a) and a.pipeline_parallel_size == 1 for a in answers)


def test_partial_nodes_when_asked_or_when_max_gpus_is_below_a_node():
    whole = _solve(model="llama3-8b", users=20, max_model_len=8192)
    assert whole[0].num_gpus == 8 and whole[0].nodes == 1
    assert whole[0].tensor_parallel_size * whole[0].data_parallel_size == 8
    part = _solve(model="llama3-8b", users=20, max_model_len=8192, partial_nodes=True)
    assert part[0].num_gpus == 1 and part[0].nodes == 1
    capped = _solve(model="llama3-8b", users=20, max_model_len=8192, max_gpus=4)
    assert capped[0].num_gpus == 1
    # above one node, partial nodes still rent whole ones
    big = _solve(model="llama3.1-70b", users=100, max_model_len=32768, partial_nodes=True)
    assert all(a.num_gpus < 8 or _whole_nodes(a) for a in big)
    cli = run_cli("solve", "-m", "llama3-8b", "-u", "20", "--context", "8K", "--partial-nodes", "--json")
    assert cli.json()["answers"][0]["num_gpus"] == 1


def test_pipeline_only_across_nodes_when_the_weights_need_it():
    answers = _solve(model="llama3.1-405b", users=20, max_model_len=8192)
    a = answers[0]
    assert (a.tensor_parallel_size, a.pipeline_parallel_size, a.num_gpus, a.nodes) == (8, 2, 16, 2)
    assert "the weights do not fit on TP 8 x PP 1" in (a.why_pipeline or "")
    assert "between nodes, over the network 400G" in (a.why_pipeline or "")
    hop = a.decode_step.pp_hop_ms
    slow = _solve(model="llama3.1-405b", users=20, max_model_len=8192, network=_net("25G"))[0]
    assert slow.decode_step.pp_hop_ms > hop and "network 25G" in (slow.why_pipeline or "")


def _net(name):
    from kvplan.commands.inputs import parse_network

    return parse_network(name)


def test_engine_tp_sizes_are_powers_of_two_the_heads_allow():
    q = Query(model=load_model("llama3-70b"), gpus=(load_gpu("H100"),), users=1, max_model_len=8192)
    assert engine_tps(q, load_gpu("H100")) == [1, 2, 4, 8]
    for name in ("qwen3-32b", "gemma3-27b", "llama3.1-405b", "deepseek-v3"):
        spec = load_model(name)
        q = Query(model=spec, gpus=(load_gpu("H100"),), users=1, max_model_len=8192)
        for tp in engine_tps(q, load_gpu("H100")):
            assert tp & (tp - 1) == 0 and spec.num_attention_heads % tp == 0


def test_max_context_on_two_nodes_pipelines_one_stage_per_node():
    j = run_cli("solve", "-m", "llama3.1-405b", "-u", "4", "--max-context", "-g", "2x8xH100", "--json").json()
    for a in j["answers"]:
        assert a["num_gpus"] == 16
        assert a["pipeline_parallel_size"] == 1 or a["tensor_parallel_size"] == 8


def _readme_solve_examples() -> list[list[str]]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Solving for GPUs, layout and context") :]
    section = section[: section.index("\n## ", 5)]
    lines = re.findall(r"^kvplan solve (.+?)(?:\s+#.*)?$", section, flags=re.MULTILINE)
    # the load questions (--request-rate, --max-rate) answer by simulation: tests/test_solve_load.py
    return [shlex.split(line) for line in lines if "-rate" not in line]


@pytest.mark.parametrize("args", _readme_solve_examples(), ids=lambda a: " ".join(a)[:60])
def test_readme_solve_examples_answer_whole_nodes(args):
    r = run_cli("solve", *args, "--json")
    assert r.exit_code == 0, r.stderr
    top = r.json()["answers"][0]
    gpn = load_gpu(top["gpu"]).gpus_per_node
    assert top["num_gpus"] % gpn == 0 and top["nodes"] == top["num_gpus"] // gpn
    assert top["pipeline_parallel_size"] == 1 or top["tensor_parallel_size"] == gpn


def test_readme_has_solve_examples():
    assert len(_readme_solve_examples()) >= 3
