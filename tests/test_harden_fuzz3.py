"""Issue 24: the findings of the third fuzz pass that session 10 left open (F4-F16).

Each test fails on the code before its fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvplan.errors import UsageError
from kvplan.logs import logparse
from tests.helpers import plan, run_cli


def _simulate_trace(tmp_path, stamps: list[str]):
    """simulate on a Mooncake trace of two-block prompts sent at these timestamps (ms)."""
    p = tmp_path / "trace.jsonl"
    p.write_text(
        "".join(
            f'{{"timestamp": {t}, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}}\n'
            for t in stamps
        )
    )
    return run_cli("simulate", "-m", "qwen3-8b", "--max-model-len", "8K", "--trace", str(p))


def test_a_trace_spanning_years_prints_its_days_in_a_few_digits(tmp_path):
    # (a 1e300 ms timestamp is refused on its own line since fuzz 25: test_harden_fuzz25)
    r = _simulate_trace(tmp_path, ["0", "1e13"])
    assert r.exit_code == 2
    line = r.stderr.strip()
    assert "sends its requests over 115,740.7 days, more than the 30 days" in line and len(line) < 250, line


def test_a_nan_timestamp_is_called_nan_not_inf(tmp_path):
    r = _simulate_trace(tmp_path, ["0", "NaN"])
    assert r.exit_code == 2
    assert r.stderr.strip().endswith("trace.jsonl:2: the timestamp must be a finite number >= 0, got nan")
    r = _simulate_trace(
        tmp_path, ["0", "1" + "0" * 400]
    )  # an integer past float's range is infinite, said so
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


CORPUS = Path(__file__).resolve().parent / "fixtures" / "hf" / "corpus"


def _with_last_layer_type(tmp_path, name: str, kind: str) -> str:
    cfg = json.loads((CORPUS / name).read_text())
    text = cfg.get("text_config", cfg)
    types = list(text.get("layer_types") or ["full_attention"] * text["num_hidden_layers"])
    types[-1] = kind
    text["layer_types"] = types
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def test_an_unknown_layer_type_in_a_hybrid_model_is_one_line_naming_the_known_ones(tmp_path):
    r = run_cli("estimate", "-m", _with_last_layer_type(tmp_path, "qwen3.5-9b.json", "weird_attention"), "-g", "H200",
                "--max-model-len", "4096")  # fmt: skip
    assert r.exit_code == 2
    assert r.stderr.strip().endswith(
        "text_config.layer_types[31]: layer type 'weird_attention' is not one kvplan can plan (attention, conv, "
        "full_attention, linear_attention, mamba)"
    ), r.stderr  # and not a second line blaming num_hidden_layers for the layer it dropped
    assert r.stderr.count("\n") == 1


def test_layer_types_a_family_does_not_read_are_warned_of_when_they_say_more_than_attention(tmp_path):
    path = _with_last_layer_type(tmp_path, "kimi-k2-instruct.json", "weird_attention")
    r = run_cli("estimate", "-m", path, "-g", "8xH200", "--max-model-len", "4096")
    assert r.exit_code == 0
    assert (
        "layer_types names weird_attention but model_type 'kimi_k2' lays out its layers from its own fields; "
        "planned from those" in r.stderr
    )
    plain = run_cli("estimate", "-m", _with_last_layer_type(tmp_path, "kimi-k2-instruct.json", "full_attention"),
                    "-g", "8xH200", "--max-model-len", "4096")  # fmt: skip
    assert plain.exit_code == 0 and "layer_types" not in plain.stderr


def test_expert_parallel_where_it_places_nothing_says_so():
    dense = plan("llama3.1-8b", "H100", num_gpus=2, enable_expert_parallel=True)
    assert (
        "vLLM --enable-expert-parallel: llama3.1-8b has no routed experts, so the flag changes nothing"
        in (dense.assumptions)
    )
    assert dense.kv_pool_tokens == plan("llama3.1-8b", "H100", num_gpus=2).kv_pool_tokens
    one = plan("mixtral-8x7b", "H200", max_model_len=4096, enable_expert_parallel=True)
    assert any(
        "at TP x DP = 1 the one GPU holds every expert, so the flag changes nothing" in a
        for a in one.assumptions
    )
    assert not any(
        "--enable-expert-parallel" in a for a in plan("llama3.1-8b", "H100", num_gpus=2).assumptions
    )


def test_a_kv_group_size_that_does_not_divide_the_head_is_said_with_what_is_counted():
    odd = plan("llama3.1-8b", "H100", kv_cache_dtype="int4", kv_quant_group_size=7)
    note = (
        "--kv-quant-group-size 7 does not divide the 128-value KV vectors: each ends in a group of 2 values"
    )
    assert any(a.startswith(note) for a in odd.assumptions)
    # 128 values at 4 bits + ceil(128 / 7) = 19 groups of a 16-bit scale and a 16-bit zero point, K and V, 8 heads,
    # 32 layers
    assert odd.kv_bytes_per_token == 32 * 8 * 2 * (128 * 4 + 19 * 32) // 8
    assert not any(
        "does not divide" in a for a in plan("llama3.1-8b", "H100", kv_cache_dtype="int4").assumptions
    )


def test_auto_fit_refusal_names_the_flag_that_sized_the_kv_memory():
    r = run_cli(
        "estimate", "-m", "llama3.1-8b", "-g", "L4", "--max-model-len", "auto", "--kv-cache-memory", "1MiB"
    )
    assert r.exit_code == 3
    assert r.stderr.strip().endswith("use a smaller --kv-cache-dtype, or raise --kv-cache-memory"), r.stderr


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
@pytest.mark.parametrize(
    "command",
    [
        ("compare", "plot", "-m", "llama3.1-8b", "-o"),
        ("simulate", "-m", "llama3.1-8b", "--max-model-len", "8K", "--num-prompts", "20", "--plot"),
    ],
)
def test_a_chart_is_never_written_over_a_fifo_a_symlink_or_a_directory(tmp_path, kind, command):
    pytest.importorskip("matplotlib")
    target = tmp_path / "chart.png"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        target.symlink_to(tmp_path / "elsewhere.png")
    else:
        target.mkdir()
    r = run_cli(*command, str(target))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert (
        "a symbolic link; name the file itself" if kind == "symlink" else "not a regular file"
    ) in r.stderr
    assert not (tmp_path / "elsewhere.png").exists()
    assert (
        target.is_symlink()
        if kind == "symlink"
        else (target.is_fifo() if kind == "fifo" else target.is_dir())
    )
    plain = tmp_path / "plain.png"
    # a chart drawn before (matplotlib's PNG names itself) is replaced, whole; any other file is not (fuzz 29 T10)
    plain.write_bytes(b"\x89PNG\r\n\x1a\n tEXtSoftware Matplotlib version3, old chart")
    ok = run_cli(*command, str(plain))
    assert ok.exit_code == 0 and plain.read_bytes().startswith(b"\x89PNG")


def test_files_saved_with_a_utf8_byte_order_mark_are_read(tmp_path):
    bom = b"\xef\xbb\xbf"
    cfg = tmp_path / "config.json"
    cfg.write_bytes(bom + (CORPUS / "qwen3-32b.json").read_bytes())
    r = run_cli("estimate", "-m", str(cfg), "-g", "H100", "--max-model-len", "8K", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["model"]["num_layers"] == 64
    trace = tmp_path / "trace.csv"
    trace.write_bytes(bom + b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,600,20\n1,600,20\n")
    r = run_cli("simulate", "-m", "qwen3-8b", "--max-model-len", "8K", "--trace", str(trace), "--json")
    assert r.exit_code == 0 and r.json()["completed"] == 2, r.stderr


def test_solve_says_why_ep_within_80_columns_and_keeps_launch_lines_whole():
    from typer.testing import CliRunner

    from kvplan.cli import app

    out = CliRunner(env={"COLUMNS": "80", "NO_COLOR": "1"}).invoke(
        app, ["solve", "-m", "deepseek-v3", "-g", "H200", "--users", "256", "--max-model-len", "8K"]
    )
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    why = [i for i, line in enumerate(lines) if line.startswith("    why EP: ")]
    assert why, out.stdout
    # the reason wraps onto indented lines; a launch line stays one line, to be copied
    assert all(
        len(line) <= 80 for line in lines if "vllm serve" not in line and "sglang.launch_server" not in line
    )
    assert lines[why[0] + 1].startswith("    ") and not lines[why[0] + 1].startswith("    why")
    assert any(len(line) > 80 for line in lines if "vllm serve" in line)


def test_sglang_context_length_minus_one_is_not_read_as_vllm_auto():
    text = SGLANG.replace("context_length=8192", "context_length=-1")
    assert text != SGLANG
    with pytest.raises(UsageError, match="the log's context_length=-1 is negative"):
        logparse.parse(
            text
        )  # it said "--max-model-len auto is vLLM's ... give --max-model-len", a flag check-log lacks
    vllm_auto = VLLM.replace("'max_model_len': 32768}", "'max_model_len': -1}")
    assert logparse.parse(vllm_auto).get("max_model_len_auto") is True
