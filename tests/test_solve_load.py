"""`solve --request-rate` / `--max-rate`: the load questions answered by simulation, checked against
direct `kvplan.simulate` runs of the same replica and workload; `--plot` of both commands."""

from __future__ import annotations

import math
import re
import shlex

import pytest

import kvplan
from helpers import REPO, run_cli

BASE = ("-m", "llama3-8b", "--max-model-len", "8K", "--kv-cache-dtype", "auto", "--num-prompts", "300")
TARGETS = ("--ttft-ms", "500", "--tpot-ms", "30")


def direct(rate: float, gpus: str = "H100"):
    """One replica of the answer's layout at `rate` requests/s, as `kvplan simulate` runs it."""
    return kvplan.simulate(
        "llama3-8b", gpus=gpus, max_model_len="8K", num_prompts=300, request_rate=rate, calibration=True
    )


def meets(r, ttft=500.0, tpot=30.0) -> bool:
    return r.ttft_ms.p90 <= ttft and r.tpot_ms.p90 <= tpot and not r.failed


@pytest.fixture(scope="module")
def at_rate():
    # one H100 holds 20.2 requests/s within the targets (solve --max-rate -g 1xH100): 24 needs two
    res = run_cli("solve", *BASE, "--partial-nodes", "--request-rate", "24", *TARGETS, "--json")
    assert res.exit_code == 0, res.stderr
    return res.json()


def test_a_rate_one_replica_cannot_serve_takes_two(at_rate):
    a = at_rate["answer"]
    assert (a["num_gpus"], a["tensor_parallel_size"], a["data_parallel_size"]) == (2, 1, 2)
    assert at_rate["per_replica_rate"] == 12
    one = direct(24.0)
    assert not meets(one) and one.tpot_ms.p90 > 30  # one replica at 24 requests/s misses its TPOT
    # the answer's figures are those of a direct run of one replica dealt every 2nd request of the stream at
    # 24 requests/s (the search rescales one workload's gaps and deals them, as simulate -dp 2 does)
    from kvplan.search.rate import ScaledWorkload
    from kvplan.simulator import synthetic

    base = synthetic(num_prompts=300, input_len=1024, output_len=128, range_ratio=0.0, request_rate=24.0,
                     burstiness=1.0, max_concurrency=None, seed=0)  # fmt: skip
    two = kvplan.simulate("llama3-8b", gpus="H100", max_model_len="8K", workload=ScaledWorkload(base).dealt(24.0, 2),
                          calibration=True, ttft_ms=500, tpot_ms=30)  # fmt: skip
    assert meets(two)
    assert math.isclose(at_rate["tpot_ms"]["p90"], two.tpot_ms.p90, rel_tol=1e-6)
    assert math.isclose(at_rate["ttft_ms"]["p90"], two.ttft_ms.p90, rel_tol=1e-6)
    assert math.isclose(at_rate["goodput"], 2 * two.goodput, rel_tol=1e-6)
    assert at_rate["schema"] == "kvplan.solve-rate/1" and at_rate["mode"] == "min-gpus-at-rate"
    assert "--data-parallel-size 2" in a["vllm_flags"]
    assert at_rate["simulations"] <= 8  # bisection, not a sweep


def test_whole_nodes_by_default_fill_the_node():
    res = run_cli("solve", *BASE, "--request-rate", "20", *TARGETS, "--json")
    a = res.json()["answer"]
    assert res.exit_code == 0 and a["num_gpus"] == 8 and a["data_parallel_size"] == 8


def test_the_max_rate_meets_the_targets_and_a_little_more_does_not(tmp_path):
    png = tmp_path / "rate.png"
    res = run_cli("solve", *BASE, "--max-rate", "-g", "1xH100", *TARGETS, "--plot", str(png), "--json")
    assert res.exit_code == 0, res.stderr
    d = res.json()
    rate = d["request_rate"]
    assert d["mode"] == "max-rate" and d["answer"]["num_gpus"] == 1
    above = [p for p in d["points"] if p["rate"] > rate]
    assert above and not any(p["meets"] for p in above)
    nearest = min(p["rate"] for p in above)
    assert nearest <= rate * 1.021  # the bracket closed within 2%
    assert meets(direct(rate))
    assert not meets(direct(nearest))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and d["chart"] == str(png)


def test_a_target_one_prompt_alone_misses_is_one_line():
    res = run_cli("solve", *BASE, "--request-rate", "5", "--ttft-ms", "1", "--tpot-ms", "30")
    assert res.exit_code == 3
    assert (
        "--ttft-ms 1: even one prompt alone takes" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    )
    res = run_cli("solve", *BASE, "--max-rate", "-g", "8xH100", "--ttft-ms", "500", "--tpot-ms", "1")
    assert res.exit_code == 3 and "--tpot-ms 1: even one request alone decodes at" in res.stderr


def test_a_rate_beyond_the_gpus_allowed_names_the_closest_miss():
    res = run_cli("solve", *BASE, "--request-rate", "500", *TARGETS, "--max-gpus", "1")
    assert res.exit_code == 3
    assert "at 500 requests/s the most replicas within --max-gpus 1" in res.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--request-rate", "5", "--tpot-ms", "30"), "need both targets"),
        (("--users", "5", "--request-rate", "5", *TARGETS), "not with --users"),
        (("--max-rate", "-g", "H100", *TARGETS), "--max-rate needs the GPUs you have"),
        (("--request-rate", "0", *TARGETS), "--request-rate must be a positive"),
        (("--request-rate", "5", *TARGETS, "--percentile", "95"), "--percentile must be 50, 90 or 99"),
        (("--users", "5", "--ttft-ms", "5"), "--ttft-ms, --num-prompts go with --request-rate or --max-rate"),
        (
            ("--users", "5", "--seed", "3", "--range-ratio", "0.5"),
            "--range-ratio, --seed go with --request-rate",
        ),
        ((), "give --users N"),
    ],
)
def test_usage_errors(args, says):
    res = run_cli("solve", *BASE, *args)
    assert res.exit_code == 2 and says in res.stderr


def test_the_human_output_names_the_answer_and_its_percentiles():
    res = run_cli("solve", *BASE, "--partial-nodes", "--request-rate", "24", *TARGETS)
    assert res.exit_code == 0
    assert "2x H100-SXM" in res.stdout and "TTFT (ms)" in res.stdout and "goodput" in res.stdout


def test_simulate_plot_writes_a_png(tmp_path):
    png = tmp_path / "load.png"
    res = run_cli(
        "simulate", "-m", "llama3-8b", "--num-prompts", "50", "--request-rate", "10", "--plot", str(png)
    )
    assert res.exit_code == 0 and f"chart: {png}" in res.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_readmes_load_examples_answer(tmp_path):
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = re.findall(r"^kvplan solve (.+-rate .+)$", text, flags=re.MULTILINE)
    assert len(lines) >= 2
    for line in lines:
        args = [str(tmp_path / a) if a.endswith(".png") else a for a in shlex.split(line)]
        res = run_cli("solve", *args, "--num-prompts", "200", "--json")
        assert res.exit_code == 0, (line, res.stderr)
        d = res.json()
        if "--disaggregated" in args:  # a prefill pool and a decode pool
            assert d["num_gpus"] == d["prefill"]["answer"]["num_gpus"] + d["decode"]["num_gpus"] >= 2
            continue
        assert d["goodput"] > 0 and d["answer"]["num_gpus"] >= 1
