"""Session 18 hardening: fuzz pass 29's findings (each test failing on the code before)."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvplan
from kvplan.errors import UsageError
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parent.parent
LOAD = ("solve", "-m", "llama3.1-8b", "--request-rate", "20", "--ttft-ms", "1000", "--tpot-ms", "30",
        "--max-model-len", "8K", "--num-prompts", "100")  # fmt: skip


def test_solve_disaggregated_refuses_a_plot_it_cannot_draw(tmp_path):
    # T1: --plot with --disaggregated exited 0 and wrote nothing
    out = tmp_path / "d.png"
    r = run_cli(*LOAD, "--disaggregated", "--plot", str(out))
    assert r.exit_code == 2 and "--plot: --disaggregated draws no chart" in r.stderr and not out.exists()


def test_the_prefill_pools_tpot_target_is_null_not_a_sentinel():
    # T2: prefill.targets.tpot_ms was 100000000.0, a stand-in for "none applies"
    d = run_cli(*LOAD, "--disaggregated", "--json").json()
    assert d["targets"]["tpot_ms"] == 30.0
    assert d["prefill"]["targets"]["tpot_ms"] is None and d["prefill"]["targets"]["ttft_ms"] is not None


def test_avg_context_is_refused_under_a_simulated_load():
    # T3: --avg-context passed silently under --request-rate and moved the simulated TTFT for some values
    r = run_cli(*LOAD, "--avg-context", "100")
    assert r.exit_code == 2 and r.stderr.startswith("error: --avg-context: under --request-rate/--max-rate")
    with pytest.raises(UsageError, match="--avg-context: under --request-rate"):
        kvplan.solve("llama3.1-8b", request_rate=5.0, ttft_ms=500, tpot_ms=30, max_model_len="8K",
                     num_prompts=50, avg_context="2K")  # fmt: skip


@pytest.mark.parametrize("extra", [{"top": 3}, {"max_gpus": 4}, {"price": "2.5"}, {"partial_nodes": True}])
def test_the_api_refuses_what_the_cli_refuses_under_max_rate(extra):
    # T4: the API's solve(max_rate=True) took top, max_gpus, price and partial_nodes (price even gave a cost)
    with pytest.raises(UsageError, match="would change nothing: --max-rate answers for the GPUs given"):
        kvplan.solve("llama3.1-8b", max_rate=True, gpus="1xH100", ttft_ms=500, tpot_ms=30, max_model_len="8K",
                     num_prompts=50, **extra)  # fmt: skip


@pytest.mark.parametrize(
    "extra", [{"avg_context": "2K"}, {"shared_prefix_tokens": "1024"}, {"prefix_hit_rate": 0.5}]
)
def test_api_simulate_refuses_estimates_workload_guesses(extra):
    # T5: simulate(avg_context=..., shared_prefix_tokens=...) ran and ignored them
    with pytest.raises(UsageError, match="describe a workload for estimate; simulate serves one"):
        kvplan.simulate("llama3.1-8b", max_model_len="8K", num_prompts=20, **extra)


def test_check_log_reads_vllm_08s_model_loading_line_in_gb(tmp_path):
    # T6: vLLM 0.8.x V1 printed "Model loading took %.4f GB" of bytes / 2**30 (gpu_model_runner.py); kvplan called
    # the line an edited log
    text = (ROOT / "tests/fixtures/logs/vllm_v011_llama31_8b_h100.log").read_text()
    old = "Model loading took 14.9889 GiB and 4.12 seconds"
    assert old in text
    path = tmp_path / "v081.log"
    path.write_text(text.replace(old, "Model loading took 14.9888 GB and 28.719376 seconds"))
    r = run_cli("check-log", str(path), "-g", "H100", "--json")
    assert r.exit_code == 0, r.stderr
    weights = next(row for row in r.json()["rows"] if row["quantity"] == "weights per GPU")
    assert weights["log"] == pytest.approx(14.9888 * 2**30, rel=1e-6)


@pytest.mark.parametrize("lead", ["# lengths from our chat logs\n", "\n"])
def test_a_histogram_header_may_follow_a_comment_or_a_blank_line(tmp_path, lead):
    # T7: the header was taken on line 1 only, and one below a comment was refused as a bad data row
    path = tmp_path / "h.csv"
    path.write_text(lead + "output_len,input_len,weight\n100,1000,3\n200,2000,1\n")
    d = run_cli("simulate", "-m", "llama3.1-8b", "--max-model-len", "8K", "--num-prompts", "40",
                "--length-histogram", str(path), "--json").json()  # fmt: skip
    # the header's order is read: inputs of 1,000 and 2,000 tokens, three to one
    assert 1000 < d["workload"]["input_tokens_mean"] < 2000


def test_a_negative_seed_is_refused():
    # T8: seed -1 gave seed 1's workload (Python's Random hashes -n as n)
    r = run_cli(
        "simulate", "-m", "llama3.1-8b", "--max-model-len", "8K", "--num-prompts", "20", "--seed", "-1"
    )
    assert r.exit_code == 2 and "--seed must be 0 to 4,294,967,295, got -1" in r.stderr


def test_api_simulate_checks_the_progress_callbacks_arguments():
    # T9: a callback of the wrong signature failed mid-run with a TypeError from the simulator's loop
    with pytest.raises(UsageError, match=r"progress must take two arguments, \(done, total\)"):
        kvplan.simulate("llama3.1-8b", max_model_len="8K", num_prompts=20, progress=lambda: None)
    seen = []
    kvplan.simulate("llama3.1-8b", max_model_len="8K", num_prompts=20, progress=lambda d, t: seen.append(t))
    assert seen


def test_a_chart_never_replaces_a_file_that_is_not_a_chart(tmp_path):
    # T10: --plot and compare plot -o overwrote any .png/.svg (a text file named notes.png was lost)
    notes = tmp_path / "notes.png"
    notes.write_text("my notes, not a chart")
    r = run_cli(
        "simulate", "-m", "llama3.1-8b", "--max-model-len", "8K", "--num-prompts", "20", "--plot", str(notes)
    )
    assert r.exit_code == 2 and "exists and is not a chart kvplan drew" in r.stderr
    assert notes.read_text() == "my notes, not a chart"
    svg = tmp_path / "notes.svg"
    svg.write_text("<svg>hand drawn</svg>")
    r = run_cli("compare", "plot", "-m", "llama3.1-8b", "-o", str(svg))
    assert r.exit_code == 2 and svg.read_text() == "<svg>hand drawn</svg>"
    # a chart kvplan drew is replaced on a re-run
    chart = tmp_path / "c.png"
    for _ in range(2):
        r = run_cli(
            "simulate",
            "-m",
            "llama3.1-8b",
            "--max-model-len",
            "8K",
            "--num-prompts",
            "20",
            "--plot",
            str(chart),
        )
        assert r.exit_code == 0, r.stderr
    assert chart.read_bytes().startswith(b"\x89PNG")


def test_a_one_request_trace_reads_as_one(tmp_path):
    # T11: "1 request at their timestamps"
    path = tmp_path / "one.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 100, "output_length": 10}\n')
    d = run_cli(
        "simulate", "-m", "llama3.1-8b", "--max-model-len", "8K", "--trace", str(path), "--json"
    ).json()
    assert d["workload"]["description"] == "Mooncake trace one.jsonl: 1 request at its timestamp"
