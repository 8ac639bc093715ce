"""Issue 24, round four: load inputs that were read wrong or answered from nothing (a fuzz pass's findings).

Each test fails on the code before the fix: a rate answered from a burst, trace flags ignored, a run
where every request was refused reported as 0.0 ms latencies, an unsorted Azure trace called negative,
an idle trace blamed on the deployment.
"""

from __future__ import annotations

import re

import pytest

import kvplan
from kvplan.errors import InfeasibleError, UsageError
from kvplan.simulator import read_trace
from tests.helpers import run_cli

AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _azure(tmp_path, rows: list[str]):
    p = tmp_path / "trace.csv"
    p.write_text(AZ_HEADER + "".join(r + "\n" for r in rows))
    return p


def test_solve_rate_from_a_burst_is_refused_naming_the_prompts_needed():
    # 30 prompts at 1e6 requests/s all arrive within 0.1 ms: the answer (8x H100) came from a burst
    # drained by idle GPUs, while the same output said "goodput 60.1 requests/s of 1e+06"
    r = run_cli("solve", "-m", "qwen3-8b", "--max-model-len", "8K", "--request-rate", "1e6", "--ttft-ms", "500",
                "--tpot-ms", "50", "--num-prompts", "30")  # fmt: skip
    assert r.exit_code == 2, r.stdout
    line = r.stderr.strip()
    assert line.startswith("error: --num-prompts 30: at ") and "not a steady load" in line
    # enough prompts that sending them takes one mean end-to-end latency at the deployment's rate
    m = re.search(r"at ([\d.e+]+) requests/s per deployment .* mean ([\d.]+) s end to end.* give --num-prompts "
                  r"([\d,]+) or more$", line)  # fmt: skip
    assert m is not None and "\n" not in line, line
    rate, e2e, needed = float(m.group(1)), float(m.group(2)), int(m.group(3).replace(",", ""))
    assert rate * e2e <= needed < 2 * rate * e2e


def test_solve_rate_with_enough_prompts_still_answers():
    ans = kvplan.solve("llama3-8b", gpus="H100", max_model_len="8K", num_prompts=300, request_rate=10.0,
                       ttft_ms=500, tpot_ms=30)  # fmt: skip
    assert ans.layout.num_gpus >= 1 and ans.result.completed == 300


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (("--input-len", "5"), "--input-len does not apply with it"),
        (("--request-rate", "5", "--range-ratio", "0.5"), "--range-ratio, --request-rate do not apply"),
        (("--burstiness", "0.5"), "--burstiness does not apply"),
        (("--seed", "4"), "--seed does not apply"),
    ],
)
def test_simulate_trace_refuses_the_synthetic_flags(tmp_path, extra, named):
    trace = _azure(tmp_path, ["0,600,20", "1,600,20"])
    r = run_cli("simulate", "-m", "qwen3-8b", "--max-model-len", "8K", "--trace", str(trace), *extra)
    assert r.exit_code == 2 and named in r.stderr, r.stderr
    ok = run_cli("simulate", "-m", "qwen3-8b", "--max-model-len", "8K", "--trace", str(trace), "--json")
    assert ok.exit_code == 0 and ok.json()["completed"] == 2


def test_solve_trace_refuses_lengths_and_users_mode_refuses_load_flags(tmp_path):
    trace = _azure(tmp_path, ["0,600,20", "1,600,20"])
    r = run_cli("solve", "-m", "qwen3-8b", "--max-model-len", "8K", "--request-rate", "2", "--ttft-ms", "500",
                "--tpot-ms", "50", "--trace", str(trace), "--output-len", "64")  # fmt: skip
    assert r.exit_code == 2 and "--output-len does not apply with it" in r.stderr
    with pytest.raises(UsageError, match="solve: num_prompts, seed: only with request_rate or max_rate"):
        kvplan.solve("qwen3-8b", users=10, max_model_len="8K", num_prompts=50, seed=2)


def test_simulate_with_every_request_refused_is_an_error_not_zero_latency(tmp_path):
    r = run_cli(
        "simulate", "-m", "qwen3-8b", "--max-model-len", "8K", "--num-prompts", "5", "--input-len", "9K"
    )
    assert r.exit_code == 3
    assert r.stderr.strip() == (
        "error: no request completed: the engine refuses all 5 (prompt + output over max-model-len 8,192: 5)"
    )
    with pytest.raises(InfeasibleError, match="refuses all 5"):
        kvplan.simulate("qwen3-8b", max_model_len="8K", num_prompts=5, input_len="9K")


def test_unsorted_azure_trace_is_called_unsorted(tmp_path):
    trace = _azure(tmp_path, ["2023-11-16 18:15:50.0000000,600,20", "2023-11-16 18:15:46.0000000,600,20"])
    r = run_cli("simulate", "-m", "qwen3-8b", "--max-model-len", "8K", "--trace", str(trace))
    assert r.exit_code == 2
    assert r.stderr.strip().endswith(
        "trace.csv:3: timestamps must not go backwards (this one is earlier than the line before); sort the "
        "trace by time"
    )


def test_azure_trace_mixing_timestamp_forms_is_refused(tmp_path):
    trace = _azure(tmp_path, ["2023-11-16 18:15:46.0000000,600,20", "1700000001,600,20"])
    r = run_cli("simulate", "-m", "qwen3-8b", "--max-model-len", "8K", "--trace", str(trace))
    assert (
        r.exit_code == 2
        and "trace.csv:3: this timestamp is a plain number, line 2's is a date-time" in r.stderr
    )


def test_azure_zoned_timestamps_are_ordered_in_utc(tmp_path):
    # 18:15:46Z then 18:15:47+05:00 (13:15:47 UTC): five hours earlier, so backwards
    trace = _azure(tmp_path, ["2023-11-16T18:15:46Z,600,20", "2023-11-16T18:15:47+05:00,600,20"])
    r = run_cli("simulate", "-m", "qwen3-8b", "--max-model-len", "8K", "--trace", str(trace))
    assert r.exit_code == 2 and "timestamps must not go backwards" in r.stderr
    fine = _azure(tmp_path, ["2023-11-16T18:15:46.5+00:00,600,20", "2023-11-16T23:15:48.25+05:00,600,20"])
    assert [r.arrival_s for r in read_trace(fine).requests] == pytest.approx([0.0, 1.75])


def test_a_sparse_workload_is_not_blamed_on_the_deployment(tmp_path):
    trace = _azure(tmp_path, ["2023-11-16 18:15:46.0000000,600,20", "2024-11-16 18:15:46.0000000,600,20"])
    r = run_cli("simulate", "-m", "qwen3-8b", "--max-model-len", "8K", "--trace", str(trace))
    assert r.exit_code == 2
    line = r.stderr.strip()
    assert (
        "sends its requests over 366.0 days, more than the 30 days" in line and "cannot keep up" not in line
    )
    r = run_cli(
        "simulate", "-m", "qwen3-8b", "--max-model-len", "8K", "--num-prompts", "20", "--request-rate", "1e-9"
    )
    assert r.exit_code == 2 and "send them faster (--request-rate)" in r.stderr
