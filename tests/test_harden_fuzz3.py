"""Issue 24: the findings of the third fuzz pass that session 10 left open (F4-F16).

Each test fails on the code before its fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.errors import UsageError
from kvplan.logs import logparse
from tests.helpers import run_cli


def _mooncake(tmp_path, stamps: list[str]):
    p = tmp_path / "trace.jsonl"
    p.write_text(
        "".join(
            f'{{"timestamp": {t}, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}}\n'
            for t in stamps
        )
    )
    return p


def test_a_trace_spanning_1e300_ms_prints_its_days_in_a_few_digits(tmp_path):
    r = run_cli(
        "simulate",
        "-m",
        "qwen3-8b",
        "--max-model-len",
        "8K",
        "--trace",
        str(_mooncake(tmp_path, ["0", "1e300"])),
    )
    assert r.exit_code == 2
    line = r.stderr.strip()
    assert "sends its requests over 1.16e+292 days, more than the 30 days" in line and len(line) < 250, line


def test_a_nan_timestamp_is_called_nan_not_inf(tmp_path):
    r = run_cli(
        "simulate",
        "-m",
        "qwen3-8b",
        "--max-model-len",
        "8K",
        "--trace",
        str(_mooncake(tmp_path, ["0", "NaN"])),
    )
    assert r.exit_code == 2
    assert r.stderr.strip().endswith("trace.jsonl:2: the timestamp must be a finite number >= 0, got nan")
    huge = "1" + "0" * 400  # an integer past float's range is infinite, said so
    r = run_cli(
        "simulate",
        "-m",
        "qwen3-8b",
        "--max-model-len",
        "8K",
        "--trace",
        str(_mooncake(tmp_path, ["0", huge])),
    )
    assert r.exit_code == 2 and r.stderr.strip().endswith("got inf"), r.stderr


LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
VLLM = (LOGS / "vllm_v011_llama31_8b_h100.log").read_text()
SGLANG = (LOGS / "sglang_v05_llama3_8b_h100.log").read_text()


def _check_log(tmp_path, text: str):
    p = tmp_path / "startup.log"
    p.write_text(text)
    return run_cli("check-log", str(p), "--gpus", "H100")


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        (
            "mem usage=14.99 GB",
            "mem usage=-14.99 GB",
            "'mem usage=-14.99 GB.': kvplan reads a size in GB there (a negative",
        ),
        ("mem usage=14.99 GB", "mem usage=nan GB", "'mem usage=nan GB.': kvplan reads a size in GB there"),
        (
            "begin. avail mem=78.44 GB",
            "begin. avail mem=-78.44 GB",
            "'avail mem=-78.44 GB': kvplan reads a size in GB",
        ),
    ],
)
def test_sglang_weight_lines_kvplan_cannot_read_are_refused_not_dropped(tmp_path, old, new, says):
    assert old in SGLANG
    r = _check_log(tmp_path, SGLANG.replace(old, new))
    assert r.exit_code == 2 and says in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_token_count_with_a_decimal_point_is_refused_not_truncated(tmp_path):
    r = _check_log(tmp_path, VLLM.replace("443,264 tokens", "443.264 tokens"))
    assert r.exit_code == 2
    assert r.stderr.strip() == (
        "error: startup.log: the log's count '443.264' is not a whole number (the engines print counts as 93,872); "
        "paste the engine's own log"
    )


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("'max_num_seqs': 0", "the log's max_num_seqs=0 is not a setting the engine starts with"),
        ("'max_num_seqs': 'x'", "the log's max_num_seqs=x is not a number"),
        ("'tensor_parallel_size': 0", "the log's tensor_parallel_size=0 is not a setting"),
        ("'gpu_memory_utilization': -0.9", "the log's gpu_memory_utilization=-0.9 is negative"),
        (
            "'enable_prefix_caching': 'maybe'",
            "the log's enable_prefix_caching=maybe is neither True nor False",
        ),
    ],
)
def test_odd_values_in_the_logged_args_are_refused_not_skipped(tmp_path, arg, says):
    text = VLLM.replace("'max_model_len': 32768}", f"'max_model_len': 32768, {arg}}}")
    assert text != VLLM
    r = _check_log(tmp_path, text)
    assert r.exit_code == 2 and says in r.stderr and r.stderr.count("\n") == 1, r.stderr
    fine = _check_log(
        tmp_path, VLLM.replace("'max_model_len': 32768}", "'max_model_len': 32768, 'max_num_seqs': 64}")
    )
    assert fine.exit_code == 0, fine.stderr


AUTOFIT = (LOGS / "real" / "vllm_0.1.dev20058_qwen3.8-27b-exl3_16gib_tp1_autofit.log").read_text()


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        (
            "reduced from 262144 to 172032",
            "reduced from 262144 to 170000",
            "gives max_model_len 170,000 but its concurrency line 172,032",
        ),
        (
            "reduced from 262144 to 172032",
            "reduced from 100000 to 172032",
            "raises max_model_len from 100,000 to 172,032",
        ),
    ],
)
def test_auto_fit_lines_that_contradict_each_other_are_refused(old, new, says):
    assert old in AUTOFIT
    with pytest.raises(UsageError, match=says):
        logparse.parse(AUTOFIT.replace(old, new))
    assert logparse.parse(AUTOFIT).get("auto_fit_to") == 172_032


def test_an_sglang_log_from_another_gpu_is_said_and_its_memory_not_kept(tmp_path):
    path = tmp_path / "h100.log"
    path.write_text(SGLANG)  # "Load weight begin. avail mem=78.44 GB": an 80 GB H100
    d = run_cli("check-log", str(path), "--gpus", "H200", "--json").json()
    assert d["measured_reserve_bytes"] is None
    assert any(
        n.startswith("the log's free memory at startup 78.44 GiB per GPU does not fit H200's 139.80 GiB")
        for n in d["notes"]
    ), d["notes"]
    saved = run_cli("check-log", str(path), "--gpus", "H200", "--save-calibration")
    assert saved.exit_code == 2 and "nothing to save: the log's GPU memory is not --gpus'" in saved.stderr
    right = run_cli("check-log", str(path), "--gpus", "H100", "--json").json()
    assert right["measured_reserve_bytes"] > 0 and not any("does not fit" in n for n in right["notes"])
