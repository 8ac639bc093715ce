"""Issue 24: findings of the tenth fuzz pass (N-series: check-log on edited and mislabelled vLLM logs, the --json
error contract, calibrate's argument checks), each test failing on the code before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_cli

LOGS = Path(__file__).parent / "fixtures" / "logs" / "real"
L4 = LOGS / "vllm_0.11.0_llama-3.1-8b-instruct_l4_tp1.log"
H200 = LOGS / "vllm_0.11.2_llama-3-8b-instruct_h200_tp1.log"
TP8 = LOGS / "vllm_0.10.0_qwen3-32b_h100_tp8.log"


def _rows(result: dict, table: str = "rows") -> dict[str, dict]:
    return {r["quantity"]: r for r in result[table]}


def test_a_non_kv_figure_carrying_kvplans_weight_error_is_not_saved():
    # N1: with kvplan's weights 6.5 GiB under the log's (--weight-dtype fp8 on a bf16 log), the 'non-KV memory'
    # (requested - kvplan's weights - KV) was 7.06 GiB, saved, and then made estimate refuse the launch the log ran
    args = ("check-log", str(L4), "-m", "llama3.1-8b", "-g", "L4")
    r = run_cli(*args, "--weight-dtype", "fp8", "--json").json()
    assert r["measured_reserve_bytes"] is None
    assert any(
        n.startswith("kvplan's weights (8.46 GiB per GPU) are not the log's (14.99)") for n in r["notes"]
    )
    assert _rows(r)["non-KV memory"]["cause"] == "not kept (see the notes)"
    saved = run_cli(*args, "--weight-dtype", "fp8", "--save-calibration")
    assert saved.exit_code == 2 and "nothing to save: kvplan's weights" in saved.stderr
    # with the weights right the figure is measured and kept as before
    ok = run_cli(*args, "--json").json()
    assert ok["measured_reserve_bytes"] == pytest.approx(0.53 * 2**30, rel=0.1)


def test_a_non_kv_figure_no_engine_keeps_is_not_saved():
    # N2: the H200 log (it prints no total memory) checked with -g B200 measured 39.82 GiB of non-KV memory for
    # an 8B model, blamed kvplan's estimate and saved it as the B200's reserve
    r = run_cli("check-log", str(H200), "-m", "llama3-8b", "-g", "B200", "--json").json()
    assert r["measured_reserve_bytes"] is None
    assert any(
        n.startswith("the log implies 39.82 GiB of non-KV memory per GPU (22% of B200's") for n in r["notes"]
    )
    right = run_cli("check-log", str(H200), "-m", "llama3-8b", "-g", "H200", "--json").json()
    assert right["measured_reserve_bytes"] == pytest.approx(4.89 * 2**30, rel=0.01)


def test_a_log_from_a_bigger_gpu_is_refused_as_the_wrong_gpu_not_the_wrong_weights():
    # N3: an H200 log (139.81 GiB total) checked with -g H100 blamed the weight format ('give --weight-dtype')
    r = run_cli("check-log", str(LOGS / "vllm_0.10.2_qwen3-next-80b-a3b_h200_tp2.log"), "-m", "qwen3-next-80b-a3b",
                "-g", "H100")  # fmt: skip
    assert r.exit_code == 2
    assert r.stderr.strip().endswith(
        "the log's total GPU memory 139.81 GiB per GPU is not H100-SXM's 79.19 GiB: pass the GPU the log ran on (--gpus)"
    )


def _edit(tmp_path: Path, log: Path, old: str, new: str, lines: int | None = None) -> str:
    text = log.read_text()
    assert old in text
    text = text.replace(old, new)
    if lines is not None:
        text = "\n".join(text.splitlines()[:lines]) + "\n"
    out = tmp_path / log.name
    out.write_text(text)
    return str(out)


def test_an_edited_token_count_is_not_blamed_on_the_kv_memory(tmp_path):
    # N4: with the KV memory row at +0.0%, a 13% gap in the tokens was put down to 'follows the KV memory'
    path = _edit(tmp_path, H200, "GPU KV cache size: 868,080 tokens", "GPU KV cache size: 768,080 tokens")
    r = run_cli("check-log", path, "-m", "llama3-8b", "-g", "H200", "--json").json()
    rows = _rows(r)
    assert abs(rows["KV cache memory"]["difference"]) < 0.005
    assert rows["KV cache tokens"]["cause"].startswith("not the KV memory (it agrees)")
    assert rows["maximum concurrency"]["cause"] == "follows the KV memory"  # +0.1%: it does


def test_a_kv_memory_line_out_of_step_with_its_tokens_is_said_to_be_the_log(tmp_path):
    # N5: only 'Available KV cache memory' edited (105.97 -> 95.97 GiB): the arithmetic blamed the page size and
    # the blocks a request holds, though the log's tokens / concurrency = 1,024 tokens a request, as kvplan's
    path = _edit(
        tmp_path, H200, "Available KV cache memory: 105.97 GiB", "Available KV cache memory: 95.97 GiB"
    )
    r = run_cli("check-log", path, "-m", "llama3-8b", "-g", "H200", "--json").json()
    arith = _rows(r, "arithmetic")
    for q in ("KV cache tokens", "maximum concurrency"):
        assert arith[q]["cause"].startswith(
            "the log's tokens and concurrency agree with each other but not with its"
        )


def test_two_layouts_in_one_startup_are_refused(tmp_path):
    # N6: the non-default args edited to TP 4 while the engine config line and 8 workers say TP 8: check-log planned
    # TP 4, blamed quantization for weights exactly half, and saved a TP 4 'non-KV memory'
    path = _edit(tmp_path, TP8, "'tensor_parallel_size': 8", "'tensor_parallel_size': 4")
    r = run_cli("check-log", path, "-m", "qwen3-32b", "-g", "H100")
    assert r.exit_code == 2
    assert "the log names tensor_parallel_size 4 and then 8" in r.stderr
    assert r.stderr.strip().endswith("paste one startup's log as the engine printed it")


@pytest.mark.parametrize(
    "argv",
    [
        ("simulate", "-m", "llama3-8b", "--num-prompts", "abc", "--json"),
        ("estimate", "-m", "llama3-8b", "--bogus", "--json"),
        ("estimate", "--json"),
        ("estimate", "-m", "llama3-8b", "--json", "extra_arg"),
        ("compare", "table", "--format", "json", "--bogus"),
    ],
)
def test_a_parser_error_under_json_prints_the_error_object(argv):
    # N7: errors raised by the flag parser printed nothing on stdout under --json, where the README promises
    # that a script reading stdout always gets a kvplan.error/1 object
    r = run_cli(*argv)
    assert r.exit_code == 2
    obj = json.loads(r.stdout)
    assert obj["schema"] == "kvplan.error/1" and obj["exit_code"] == 2 and obj["error_type"] == "UsageError"
    assert r.stderr.strip() == f"error: {obj['error']}"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--only", "foo"), "--only: foo: choose from kernel, gemm, launch, allreduce"),
        (
            ("--only", "allreduce", "--nproc-per-node", "0"),
            "--nproc-per-node: an all-reduce needs at least 2",
        ),
    ],
)
def test_calibrate_checks_its_arguments_before_the_device(extra, message):
    # N9: without a GPU these were answered only with 'no CUDA GPU here'
    r = run_cli("calibrate", *extra)
    assert r.exit_code == 2 and message in r.stderr


def test_calibrate_refuses_an_output_in_a_missing_directory(tmp_path):
    # N9: -o in a missing directory created the whole tree (as root: /nonexistent/dir/)
    target = tmp_path / "typo" / "a" / "profile.yaml"
    r = run_cli("calibrate", "--device", "cpu", "--only", "launch", "-o", str(target))
    assert r.exit_code == 2
    assert f"--output {target}: no directory {target.parent}; create it first or name another" in r.stderr
    assert not (tmp_path / "typo").exists()
