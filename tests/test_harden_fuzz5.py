"""Issue 24: the findings of the fifth fuzz pass (H1-H19), each test failing on the code before its fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import run_cli


def test_calibrate_refuses_more_all_reduce_processes_than_cores():
    # H17: --nproc-per-node 100000 on a CPU started 233 torch processes (about 130 MB each) before it was killed
    pytest.importorskip("torch")
    cores = os.cpu_count() or 1
    r = run_cli("calibrate", "--device", "cpu", "--only", "allreduce", "--nproc-per-node", str(cores + 1))
    assert r.exit_code == 2
    assert r.stderr.strip().endswith(
        f"--nproc-per-node {cores + 1}: this machine has {cores} CPU core(s); give at most {cores}"
    )


def test_an_unsearchable_data_dir_is_one_line_and_no_calibration_never_looks(tmp_path, monkeypatch):
    # H1: Path.exists() raised PermissionError (a traceback) in estimate, even with --no-calibration
    import pathlib

    data = tmp_path / "data"
    monkeypatch.setenv("KVPLAN_DATA_DIR", str(data))
    real = pathlib.Path.exists

    def exists(self, *a, **kw):
        if str(self).startswith(str(data)):
            raise PermissionError(13, "Permission denied")
        return real(self, *a, **kw)

    monkeypatch.setattr(pathlib.Path, "exists", exists)
    r = run_cli("estimate", "-m", "llama3.1-8b")
    assert r.exit_code == 2
    assert r.stderr.strip() == (
        f"error: {data}/overheads.yaml: cannot look for kvplan's saved data (Permission denied); fix the folder's "
        "permissions, set KVPLAN_DATA_DIR elsewhere, or pass --no-calibration"
    )
    assert run_cli("estimate", "-m", "llama3.1-8b", "--no-calibration").exit_code == 0


@pytest.mark.parametrize("columns", ["0", "-5", "abc", "20"])
def test_a_terminal_narrower_than_80_columns_gets_80(columns):
    # H2/H18: COLUMNS=0 printed nothing at all (an error exited 2 with an empty stderr); 20 cut numbers
    from typer.testing import CliRunner

    from kvplan.cli import app

    out = CliRunner(env={"COLUMNS": columns, "NO_COLOR": "1"}).invoke(app, ["estimate", "-m", "llama3.1-8b"])
    assert out.exit_code == 0 and "max concurrent requests at 131,072 tokens" in out.stdout
    assert "…" not in out.stdout
    bad = CliRunner(env={"COLUMNS": columns, "NO_COLOR": "1"}).invoke(app, ["estimate", "-m", "nosuch"])
    assert bad.exit_code == 2 and "unknown model 'nosuch'" in bad.stderr


def test_curves_print_in_ascii_where_the_output_is_not_utf8():
    # H3: PYTHONIOENCODING=ascii made simulate's KV chart and compare plot's curve raise UnicodeEncodeError
    from kvplan.units import plain_text

    assert plain_text("  50% │ ▁▂▄█", "ascii") == "  50% | .:=@"
    assert plain_text("  50% │ ▁▂▄█", "utf-8") == "  50% │ ▁▂▄█"
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "COLUMNS": "80"}
    import subprocess
    import sys

    for args in (["simulate", "-m", "llama3.1-8b", "--max-model-len", "8K", "--num-prompts", "20"],
                 ["compare", "plot", "-m", "llama3.1-8b"]):  # fmt: skip
        p = subprocess.run([sys.executable, "-m", "kvplan", *args], env=env, capture_output=True, timeout=120)
        assert p.returncode == 0 and b"Traceback" not in p.stderr, p.stderr[-400:]
        assert max(p.stdout) < 128  # nothing but ASCII reached the stream


def test_api_arguments_of_the_wrong_kind_are_one_line_errors(tmp_path):
    # H5-H7, H11, H15: bare TypeError/AttributeError, a float 0.10 read as vLLM 0.1, internal fields taken
    import kvplan
    from kvplan.errors import UsageError

    log = str(Path(__file__).resolve().parent / "fixtures" / "logs" / "vllm_v011_llama31_8b_h100.log")
    cases = [
        (lambda: kvplan.check_log(log, gpu_memory_utilization="0.9"), "check_log: gpu_memory_utilization must be a number"),
        (lambda: kvplan.check_log(log, block_size="16"), "check_log: block_size must be an integer"),
        (lambda: kvplan.check_log(log, engine_version=0.11), "engine_version=0.11: give the release as text"),
        (lambda: kvplan.estimate("llama3.1-8b", engine_version=0.10), "engine_version=0.1: give the release as text"),
        (lambda: kvplan.simulate("llama3.1-8b", deployment="x"), "simulate: deployment must be a kvplan.simulator.Deployment"),
        (lambda: kvplan.simulate("llama3.1-8b", workload=[1]), "simulate: workload must be a kvplan.simulator.Workload"),
        (lambda: kvplan.simulate("llama3.1-8b", progress=True), "simulate: progress must be a function"),
        (lambda: kvplan.simulate("llama3.1-8b", length_histogram=""), "simulate: length_histogram is empty"),
        (lambda: kvplan.compare(foo=1), "compare: unknown argument(s) foo; known: models, variants"),
        (lambda: kvplan.compare(models=[]), "compare: models is empty"),
        (lambda: kvplan.solve("llama3-8b", users=10, max_model_len="8K", fixed_gpus=True), "solve: unknown argument(s) fixed_gpus"),
    ]  # fmt: skip
    for call, says in cases:
        with pytest.raises(UsageError) as exc:
            call()
        assert says in str(exc.value), str(exc.value)


def test_an_overhead_larger_than_the_gpu_is_refused_naming_the_file(tmp_path, monkeypatch):
    # H10: reserve_bytes up to 1 PiB were taken and the plan blamed the GPUs
    monkeypatch.setenv("KVPLAN_DATA_DIR", str(tmp_path))
    log = Path(__file__).resolve().parent / "fixtures" / "logs" / "vllm_v011_llama31_8b_h100.log"
    assert run_cli("check-log", str(log), "-g", "H100", "--save-calibration").exit_code == 0
    path = tmp_path / "overheads.yaml"
    text = path.read_text()
    import re

    path.write_text(re.sub(r"reserve_bytes: \d+", "reserve_bytes: 1125899906842624", text))
    r = run_cli("estimate", "-m", "llama3.1-8b", "-g", "H100", "--max-model-len", "32768")
    assert (
        r.exit_code == 2
        and f"{path}: reserve_bytes 1,125,899,906,842,624 for llama3.1-8b on H100-SXM" in r.stderr
    )
    assert (
        run_cli(
            "estimate", "-m", "llama3.1-8b", "-g", "H100", "--max-model-len", "32768", "--no-calibration"
        ).exit_code
        == 0
    )


def test_data_dir_variables_and_a_symlinked_data_file(tmp_path, monkeypatch):
    # H12: a blank KVPLAN_DATA_DIR saved to './ /overheads.yaml'; a relative XDG_DATA_HOME was used
    # H13: a symlinked overheads.yaml was replaced by a plain file, its target left stale
    from kvplan.userdata import data_dir

    monkeypatch.setenv("KVPLAN_DATA_DIR", " ")
    r = run_cli("estimate", "-m", "llama3.1-8b")
    assert r.exit_code == 2 and "KVPLAN_DATA_DIR is blank" in r.stderr
    monkeypatch.delenv("KVPLAN_DATA_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", "relative/dir")
    assert data_dir() == Path.home() / ".local" / "share" / "kvplan"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "kvplan"
    target = tmp_path / "dotfiles" / "overheads.yaml"
    target.parent.mkdir()
    target.write_text("schema: kvplan.overheads/1\nentries: []\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "overheads.yaml").symlink_to(target)
    monkeypatch.setenv("KVPLAN_DATA_DIR", str(tmp_path / "data"))
    log = Path(__file__).resolve().parent / "fixtures" / "logs" / "vllm_v011_llama31_8b_h100.log"
    assert run_cli("check-log", str(log), "-g", "H100", "--save-calibration").exit_code == 0
    assert (tmp_path / "data" / "overheads.yaml").is_symlink() and "reserve_bytes" in target.read_text()


def test_disaggregated_refuses_flags_it_would_ignore():
    # H14: --avg-context, --shared-prefix-tokens and --prefix-hit-rate changed nothing
    base = ["estimate", "-m", "llama3-8b", "--disaggregated", "--prefill-gpus", "1xH100", "--decode-gpus", "1xH100",
            "--input-len", "8000", "--output-len", "192"]  # fmt: skip
    for extra in (["--avg-context", "4000"], ["--shared-prefix-tokens", "1000"]):
        r = run_cli(*base, *extra)
        assert r.exit_code == 2 and f"{extra[0]} would change nothing" in r.stderr, r.stderr
    assert run_cli(*base).exit_code == 0


def test_control_characters_in_a_saved_source_are_not_sent_to_the_terminal(tmp_path, monkeypatch):
    # H16: a log named with an escape sequence was saved as the entry's source and printed raw by every estimate
    monkeypatch.setenv("KVPLAN_DATA_DIR", str(tmp_path / "data"))
    log = tmp_path / "x\x1b[2J.log"
    log.write_text(
        (Path(__file__).resolve().parent / "fixtures" / "logs" / "vllm_v011_llama31_8b_h100.log").read_text()
    )
    assert run_cli("check-log", str(log), "-g", "H100", "--save-calibration").exit_code == 0
    assert "\x1b" not in (tmp_path / "data" / "overheads.yaml").read_text()
    r = run_cli("estimate", "-m", "llama3.1-8b", "-g", "H100", "--max-model-len", "32768")
    assert "\x1b" not in r.stdout and "x?[2J.log" in r.stdout


def test_a_comments_only_overheads_file_says_so(tmp_path, monkeypatch):
    # H19: "schema 'NoneType'"
    monkeypatch.setenv("KVPLAN_DATA_DIR", str(tmp_path))
    (tmp_path / "overheads.yaml").write_text("# nothing yet\n")
    r = run_cli("estimate", "-m", "llama3.1-8b")
    assert r.exit_code == 2 and "holds nothing but comments, not a kvplan overhead calibration" in r.stderr


def test_refusals_name_the_flag_that_sized_the_memory_and_the_pool_that_failed():
    # H19: "--kv-cache-memory 1KiB" was never named; a failing disaggregated pool did not say which, and
    # suggested -tp/-pp
    r = run_cli("estimate", "-m", "llama3.1-8b", "--kv-cache-memory", "1KiB")
    assert r.exit_code == 3 and r.stderr.strip().endswith(
        "or add GPUs, use a smaller --kv-cache-dtype, or raise --kv-cache-memory"
    )
    r = run_cli("estimate", "-m", "llama3-70b", "--disaggregated", "--prefill-gpus", "1xH100", "--decode-gpus",
                "8xH100", "--input-len", "8000", "--output-len", "192")  # fmt: skip
    assert r.exit_code == 3
    assert r.stderr.startswith("error: the prefill pool (1xH100): weights need 131.42 GiB per GPU")
    assert "use more GPUs (--prefill-gpus, --prefill-tp)" in r.stderr and "-tp/-pp" not in r.stderr
