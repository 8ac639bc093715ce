"""Issue 24, round four: startup logs read wrong without a word (a fuzz pass's findings).

Two startups in one file were blended (the smallest KV figure of either, and --save-calibration kept
the blend); a vLLM log pasted after an SGLang one was read as SGLang; a version the reader did not
know, or none at all, was read by the newest rules silently, and the version regex took digits out of
the model's name; --engine-version and --model could contradict the log; weights larger than the GPU
were shown as a -100% row. Each test fails on the code before the fix. The logs here are the repo's
real fixture logs, concatenated or with one figure changed, as the test says.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.logs import logparse
from kvplan.units import GiB
from tests.helpers import run_cli

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
VLLM = (LOGS / "vllm_v011_llama31_8b_h100.log").read_text()
SGLANG = (LOGS / "sglang_v05_llama3_8b_h100.log").read_text()
KIMI = LOGS / "real" / "sglang_0.5.8.post1_kimi-k2.5_mi355x_tp8.md"


def _second_run() -> str:
    """The same deployment restarted with less memory: KV 50.11 GiB, 410,496 tokens, 12.53x (25,656 blocks of
    16 tokens, 2,048 a 32K request), a non-KV figure an engine keeps (4 GiB more than the first run's)."""
    out = VLLM.replace("54.11 GiB", "50.11 GiB").replace("443,264", "410,496").replace("13.53x", "12.53x")
    assert out != VLLM
    return out


def _write(tmp_path, text: str, name: str = "startup.log") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_two_startups_are_not_blended_the_last_is_read_and_said(tmp_path):
    path = _write(tmp_path, VLLM + _second_run())
    d = run_cli("check-log", path, "--gpus", "H100", "--json").json()
    first_line = VLLM.count("\n") + 2  # the second copy's "vLLM API server version" line, its second
    assert (
        f"the log holds 2 startups with different figures; only the last, from line {first_line}, is read"
        in (d["notes"])
    )
    logged = {r["quantity"]: r["log"] for r in d["arithmetic"]}
    assert logged["KV cache tokens"] == 410_496 and logged["maximum concurrency"] == 12.53
    alone = run_cli(
        "check-log", _write(tmp_path, _second_run(), "alone.log"), "--gpus", "H100", "--json"
    ).json()
    assert d["measured_reserve_bytes"] == alone["measured_reserve_bytes"]
    saved = run_cli("check-log", path, "--gpus", "H100", "--save-calibration")
    assert saved.exit_code == 0 and "only the last, from line" in saved.stdout


def test_a_log_repeated_line_for_line_is_one_startup(tmp_path):
    d = run_cli("check-log", _write(tmp_path, VLLM + VLLM), "--gpus", "H100", "--json").json()
    once = run_cli(
        "check-log", str(LOGS / "vllm_v011_llama31_8b_h100.log"), "--gpus", "H100", "--json"
    ).json()
    assert not any("startups" in n for n in d["notes"]) and d["rows"] == once["rows"]


def test_a_real_log_of_three_launches_is_read_from_the_last():
    # the issue this log comes from pasted three launches (default, Triton and NSA attention backends)
    log = logparse.parse(KIMI.read_text())
    assert (log.facts["startups"], log.facts["startup_line"]) == (3, 1194)
    assert log.evidence["kv_cache_tokens"].startswith("[2026-02-26 16:46:14 TP")


def test_vllm_and_sglang_lines_in_one_log_are_refused(tmp_path):
    r = run_cli("check-log", _write(tmp_path, SGLANG + VLLM, "both.log"), "--gpus", "H100")
    assert r.exit_code == 2
    assert r.stderr.strip() == (
        "error: both.log: the log holds both vLLM's and SGLang's KV-cache lines; check one engine's startup "
        "log at a time"
    )


def test_a_version_newer_than_kvplan_knows_is_said(tmp_path):
    path = _write(tmp_path, VLLM.replace("0.11.0", "9.0.0"))
    d = run_cli("check-log", path, "--gpus", "H100", "--json").json()
    assert d["engine_version"] == "0.33"
    assert (
        "the log is from vLLM 9.0.0, newer than the newest release kvplan knows; read by 0.33's rules"
        in (d["notes"])
    )


def test_no_version_is_said_and_a_model_name_is_not_read_as_one(tmp_path):
    text = VLLM.replace("vLLM API server version 0.11.0", "vLLM API server version banana")
    text = text.replace("LLM engine (v0.11.0)", "LLM engine (vbanana)")
    assert logparse.parse(text).get("version") is None  # was '3.1-8B-Instruct', from the model's name
    d = run_cli("check-log", _write(tmp_path, text), "--gpus", "H100", "--json").json()
    assert (
        "the log names no vLLM release; read by 0.33's rules (give --engine-version to say which)"
        in d["notes"]
    )
    given = run_cli(
        "check-log", _write(tmp_path, text), "--gpus", "H100", "--engine-version", "0.11", "--json"
    )
    assert not any("names no vLLM release" in n for n in given.json()["notes"])


def test_engine_version_contradicting_the_log_is_refused():
    r = run_cli(
        "check-log", str(LOGS / "vllm_v011_llama31_8b_h100.log"), "--gpus", "H100", "--engine-version", "0.7"
    )
    assert r.exit_code == 2
    assert r.stderr.strip() == (
        "error: vllm_v011_llama31_8b_h100.log: --engine-version 0.7, but the log is from vLLM 0.11.0; drop "
        "--engine-version"
    )
    same = run_cli("check-log", str(LOGS / "vllm_v011_llama31_8b_h100.log"), "--gpus", "H100", "--engine-version",
                   "0.11.2")  # fmt: skip
    assert same.exit_code == 0


def test_a_log_older_than_kvplan_reads_is_refused(tmp_path):
    r = run_cli("check-log", _write(tmp_path, VLLM.replace("0.11.0", "0.0.4")), "--gpus", "H100")
    assert (
        r.exit_code == 2
        and "the log is from vLLM 0.0.4, older than the first release kvplan reads" in r.stderr
    )


def test_model_contradicting_the_log_is_refused_a_same_shape_one_passes(tmp_path):
    log = str(LOGS / "vllm_v011_llama31_8b_h100.log")
    spec = Path(__file__).resolve().parent.parent / "model_specs" / "models" / "llama3.1-8b.yaml"
    renamed = tmp_path / "my-finetune.yaml"
    renamed.write_text(spec.read_text().replace("name: llama3.1-8b", "name: my-finetune", 1))
    r = run_cli("check-log", log, "--gpus", "H100", "-m", "qwen3-8b")
    assert r.exit_code == 2
    assert (
        "--model qwen3-8b, but the log serves meta-llama/Llama-3.1-8B-Instruct (llama3.1-8b: 32 layers"
        in r.stderr
    )
    assert run_cli("check-log", log, "--gpus", "H100", "-m", str(renamed)).exit_code == 0  # the same shape


def test_weights_or_kv_larger_than_the_gpu_are_refused(tmp_path):
    text = VLLM.replace("Model loading took 14.9889 GiB", "Model loading took 149889 GiB")
    assert text != VLLM
    r = run_cli("check-log", _write(tmp_path, text), "--gpus", "H100")
    assert r.exit_code == 2
    assert r.stderr.strip() == (
        "error: startup.log: the log's weights, 149,889.00 GiB per GPU, exceeds the H100-SXM's 79.19 GiB: pass "
        "the --gpus the log ran on"
    )
    assert 149_889 * GiB > 80e9


# --- a figure kvplan cannot read, an empty pool, two lengths (fuzz report findings 16-18) ----------


@pytest.mark.parametrize(
    ("old", "new", "shown", "why"),
    [
        ("Available KV cache memory: 54.11 GiB", "Available KV cache memory: -54.11 GiB",
         "Available KV cache memory: -54.11 GiB", "a size in GiB there (a negative figure"),
        ("Available KV cache memory: 54.11 GiB", "Available KV cache memory: 54.11 TiB",
         "Available KV cache memory: 54.11 TiB", "a size in GiB there;"),
        ("per request: 13.53x", "per request: nanx",
         "Maximum concurrency for 32,768 tokens per request: nanx", "tokens per request and a factor"),
        ("Model loading took 14.9889 GiB", "Model loading took -14.9889 GiB",
         "Model loading took -14.9889 GiB and 4.12 seconds", "a size in GiB there"),
        ("GPU KV cache size: 443,264 tokens", "GPU KV cache size: lots of tokens",
         "GPU KV cache size: lots of tokens", "a count of tokens"),
    ],
)  # fmt: skip
def test_a_figure_that_cannot_be_read_is_refused_not_dropped(tmp_path, old, new, shown, why):
    # the row used to vanish from the table with no word (rc 0)
    text = VLLM.replace(old, new)
    assert text != VLLM
    r = run_cli("check-log", _write(tmp_path, text), "--gpus", "H100")
    assert r.exit_code == 2
    err = r.stderr.strip()
    assert err.startswith(f"error: startup.log: cannot read the line {shown!r}: kvplan reads {why}")
    assert len(err.splitlines()) == 1


def test_a_negative_sglang_pool_names_its_line(tmp_path):
    text = SGLANG.replace("#tokens: ", "#tokens: -", 1)
    assert text != SGLANG
    r = run_cli("check-log", _write(tmp_path, text), "--gpus", "H100")
    assert r.exit_code == 2 and "cannot read the line 'KV Cache is allocated. #tokens: -" in r.stderr
    assert "(a negative figure: the engine stops before serving)" in r.stderr  # was: no KV lines found


@pytest.mark.parametrize(
    ("old", "new", "what"),
    [
        ("GPU KV cache size: 443,264 tokens", "GPU KV cache size: 0 tokens", "KV cache size is 0 tokens"),
        ("Available KV cache memory: 54.11 GiB", "Available KV cache memory: 0.00 GiB",
         "KV cache memory is 0.00 GiB"),
    ],
)  # fmt: skip
def test_an_empty_kv_pool_is_refused_as_a_failed_startup(tmp_path, old, new, what):
    # 0 tokens was compared as a '-' row; 0.00 GiB blamed a flag never given ("--kv-cache-memory must
    # be positive"). vLLM raises before printing such a pool (kv_cache_utils.py check_enough_kv_cache_memory)
    r = run_cli("check-log", _write(tmp_path, VLLM.replace(old, new)), "--gpus", "H100")
    assert r.exit_code == 2
    assert r.stderr.startswith(f"error: startup.log: the log's {what}: the engine stops before serving")
    assert "--kv-cache-memory" not in r.stderr


def test_arguments_and_concurrency_line_naming_two_lengths_are_said(tmp_path):
    text = VLLM.replace("Maximum concurrency for 32,768 tokens", "Maximum concurrency for 8,192 tokens")
    d = run_cli("check-log", _write(tmp_path, text), "--gpus", "H100", "--json").json()
    assert d["setup"]["max_model_len"] == 8_192
    assert (
        "the engine's arguments give max_model_len 32,768 but its concurrency line 8,192; read as 8,192, "
        "the length it reports serving"
    ) in d["notes"]
    plain = run_cli(
        "check-log", str(LOGS / "vllm_v011_llama31_8b_h100.log"), "--gpus", "H100", "--json"
    ).json()
    assert not any("two" in n or "arguments give" in n for n in plain["notes"])


def test_weights_of_zero_are_refused_not_divided_by(tmp_path):
    # fuzz round 3, F1: "Model loading took 0 GiB" raised ZeroDivisionError in the prediction rows
    text = VLLM.replace("Model loading took 14.9889 GiB", "Model loading took 0 GiB")
    assert text != VLLM
    for extra in ((), ("--json",)):
        r = run_cli("check-log", _write(tmp_path, text), "--gpus", "H100", *extra)
        assert r.exit_code == 2
        assert (
            r.stderr.strip()
            .splitlines()[-1]
            .startswith("error: startup.log: the log's weights are 0 GiB per GPU (line ")
        )


def test_a_hard_wrapped_args_line_is_read_whole():
    # fuzz round 3, F3: this real log's 'non-default args' dict wraps 'gpu_memory_utilization': 0.25 onto the
    # next line; read without it, check-log took vLLM's default 0.9 and measured 52 GiB of non-KV memory
    text = (LOGS / "real" / "vllm_0.10.1.1_qwen2-7b-instruct_a100-80gb_tp1.log").read_text()
    assert "'max_model_len': 16384, 'gpu_memory_utilization': 0.25}" in text.splitlines()[3]
    facts = logparse.parse(text).facts
    assert facts["gpu_memory_utilization"] == 0.25
    assert facts["max_model_len"] == 16384
