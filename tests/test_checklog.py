"""Reading pasted startup logs (lines in the engines' real formats, written by us) and `kvplan check-log`.

The fixture logs' KV figures were derived by hand from the engines' rules (comments below),
so kvplan's arithmetic must reproduce them exactly.
"""

from __future__ import annotations

import math

import pytest
import yaml

from helpers import REPO, run_cli
from kvplan.errors import SpecError
from kvplan.logs import overheads
from kvplan.logs.checklog import infer_gpu
from kvplan.logs.logparse import parse
from kvplan.specs.registry import all_gpus, load_gpu
from kvplan.units import GiB

LOGS = REPO / "tests" / "fixtures" / "logs"


def read(name: str) -> str:
    return (LOGS / name).read_text()


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVPLAN_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def test_parse_vllm_v1():
    log = parse(read("vllm_v011_llama31_8b_h100.log"))
    assert log.engine == "vllm" and log.get("format") == "V1"
    assert log.get("version") == "0.11.0"
    assert log.get("model") == "meta-llama/Llama-3.1-8B-Instruct"
    assert log.get("max_model_len") == 32768
    assert log.get("tensor_parallel_size") == 1
    assert log.get("available_kv_bytes") == round(54.11 * GiB)
    assert log.get("kv_cache_tokens") == 443264
    assert log.get("max_concurrency") == 13.53
    assert log.get("weights_bytes") == round(14.9889 * GiB)
    assert "GPU KV cache size" in log.evidence["kv_cache_tokens"]


def test_parse_vllm_one_line_format_takes_the_minimum_over_workers():
    log = parse(read("vllm_v033_llama3_70b_tp2_h200.log"))
    assert log.get("version") == "0.33.1"
    assert log.get("tensor_parallel_size") == 2
    assert log.get("available_kv_bytes") == round(59.88 * GiB)  # TP1 logged less than TP0
    assert log.get("kv_cache_tokens") == 392416 and log.get("max_concurrency") == 47.90
    assert log.get("gpu_memory_utilization") == 0.92
    assert log.get("cuda_graph_bytes") == round(0.61 * GiB)


def test_parse_vllm_v0_memory_profile_and_blocks():
    log = parse(read("vllm_v07_llama2_7b_l40s.log"))
    assert log.get("format") == "V0"
    assert log.get("num_gpu_blocks") == 3365
    assert log.get("total_gpu_memory_bytes") == round(44.52 * GiB)
    assert log.get("gpu_memory_utilization") == 0.90
    assert log.get("non_torch_bytes") == round(0.12 * GiB)
    assert log.get("activation_bytes") == round(1.11 * GiB)
    assert log.get("available_kv_bytes") == round(26.29 * GiB)
    assert log.get("dtype") == "float16" and log.get("enable_prefix_caching") is False


def test_parse_sglang():
    log = parse(read("sglang_v05_llama3_8b_h100.log"))
    assert log.engine == "sglang"
    assert log.get("model") == "meta-llama/Meta-Llama-3-8B"
    assert log.get("mem_fraction_static") == 0.85
    assert log.get("max_model_len") == 8192 and log.get("block_size") == 1
    assert log.get("kv_cache_tokens") == 423395
    assert log.get("k_size_bytes") == round(25.84 * GiB)
    assert log.get("free_at_start_bytes") == round(78.44 * GiB)
    assert log.get("weights_bytes") == round(14.99 * GiB)


def test_parse_sglang_mla_and_swa_lines():
    text = (
        "[2026-11-20 10:00:00] server_args=ServerArgs(model_path='deepseek-ai/DeepSeek-V3', tp_size=8, "
        "mem_fraction_static=0.9, page_size=64)\n"
        "[2026-11-20 10:01:00 TP0] KV Cache is allocated. #tokens: 763968, KV size: 48.71 GB\n"
        "[2026-11-20 10:01:00 TP3] KV Cache is allocated. #tokens: 763904, KV size: 48.70 GB\n"
    )
    log = parse(text)
    assert log.get("kv_cache_tokens") == 763904  # the smallest rank decides
    assert log.get("kv_size_bytes") == round(48.70 * GiB)
    swa = parse("Use sliding window memory pool. full_layer_tokens=728177, swa_layer_tokens=582541\nsglang")
    assert swa.get("kv_cache_tokens") == 728177 and swa.get("swa_kv_cache_tokens") == 582541


@pytest.mark.parametrize(
    ("log_name", "gpu"),
    [
        # 54.11 GiB / 2 MiB blocks = 27,704 blocks = 443,264 tokens; / 2,048 per request = 13.53x
        ("vllm_v011_llama31_8b_h100.log", "H100"),
        # TP 2: 80 x 16 x 4 x 256 x 2 = 2,621,440 B per block; 59.88 GiB -> 24,526 blocks -> 392,416 tokens, 47.90x
        ("vllm_v033_llama3_70b_tp2_h200.log", "H200"),
        # hybrid: 12 slots x 32,768 B; 56.60 GiB -> 154,555 blocks; // 2 x 16 = 1,236,432 tokens; / 2,569 = 60.16x
        ("vllm_v033_gpt_oss_20b_h100.log", "H100"),
        # V0: 3,365 blocks of 8 MiB; 4,096 tokens = 256 blocks -> 13.14x
        ("vllm_v07_llama2_7b_l40s.log", "L40S"),
        # SGLang: 423,395 tokens x 131,072 B; K size (423,395 + 1) x 65,536 B = 25.84 GB
        ("sglang_v05_llama3_8b_h100.log", "H100"),
    ],
)
def test_check_log_arithmetic_reproduces_the_log(log_name, gpu):
    r = run_cli("check-log", str(LOGS / log_name), "--gpus", gpu, "--json")
    assert r.exit_code == 0, r.stderr
    j = r.json()
    assert j["schema"] == "kvplan.checklog/1"
    assert j["arithmetic"], "no arithmetic rows"
    for row in j["arithmetic"]:
        assert row["cause"].startswith("matches") or row["cause"] == "given to kvplan", row
        assert row["kvplan"] == pytest.approx(row["log"], rel=1e-3), row


def test_check_log_prediction_rows_and_measured_overhead():
    j = run_cli("check-log", str(LOGS / "vllm_v011_llama31_8b_h100.log"), "--gpus", "H100", "--json").json()
    rows = {r["quantity"]: r for r in j["rows"]}
    # vLLM 0.11: utilization 0.9; measured non-KV = ceil(79.19 GiB x 0.9) - kvplan weights - 54.11 GiB
    h100 = load_gpu("H100").memory_bytes
    weights = rows["weights per GPU"]["kvplan"]
    assert j["measured_reserve_bytes"] == math.ceil(h100 * 0.9) - weights - round(54.11 * GiB)
    assert rows["non-KV memory"]["log"] == j["measured_reserve_bytes"]
    assert rows["KV cache memory"]["log"] == round(54.11 * GiB)
    assert j["setup"]["gpu_memory_utilization"] == 0.9
    assert j["calibration_saved"] is None


def test_check_log_sglang_measures_startup_memory():
    j = run_cli("check-log", str(LOGS / "sglang_v05_llama3_8b_h100.log"), "--gpus", "H100", "--json").json()
    assert j["measured_reserve_bytes"] == load_gpu("H100").memory_bytes - round(78.44 * GiB)
    assert j["setup"]["mem_fraction_static"] == 0.85


def test_save_calibration_makes_estimate_reproduce_the_log(data_dir):
    r = run_cli(
        "check-log", str(LOGS / "vllm_v011_llama31_8b_h100.log"), "--gpus", "H100", "--save-calibration"
    )
    assert r.exit_code == 0, r.stderr
    path = data_dir / "overheads.yaml"
    assert "saved:" in r.stdout and str(path) in r.stdout
    assert [p.name for p in data_dir.iterdir()] == ["overheads.yaml"]  # no temporary file left
    est = run_cli(
        "estimate", "-m", "llama3.1-8b", "-g", "H100", "--context", "32K", "--engine-version", "0.11"
    )
    assert "Available KV cache memory: 54.11 GiB" in est.stdout
    assert "GPU KV cache size: 443,264 tokens" in est.stdout
    assert "calibration" in est.stdout and "v011_llama31_8b_h100.log" in est.stdout
    off = run_cli("estimate", "-m", "llama3.1-8b", "-g", "H100", "--context", "32K", "--no-calibration")
    assert "443,264" not in off.stdout
    # another layout has no calibration: the estimate says "estimated"
    tp2 = run_cli("estimate", "-m", "llama3.1-8b", "-g", "2xH100", "--context", "32K", "--json").json()
    assert tp2["reserve"]["estimated"] is True


def test_saving_again_replaces_the_same_setup_and_keeps_others(data_dir):
    for _ in range(2):
        run_cli(
            "check-log", str(LOGS / "vllm_v011_llama31_8b_h100.log"), "--gpus", "H100", "--save-calibration"
        )
    run_cli("check-log", str(LOGS / "sglang_v05_llama3_8b_h100.log"), "--gpus", "H100", "--save-calibration")
    entries = overheads.load(data_dir / "overheads.yaml")
    assert sorted((e.model, e.engine) for e in entries) == [("llama3-8b", "sglang"), ("llama3.1-8b", "vllm")]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("entries: [\n", "not valid YAML"),
        ("schema: kvplan.profile/1\nentries: []\n", "not a kvplan overhead calibration"),
        ("schema: kvplan.overheads/1\nentries: {}\n", "entries: expected a list"),
        ("schema: kvplan.overheads/1\nentries:\n- {model: x}\n", "entries[0]: missing gpu"),
    ],
)
def test_corrupt_calibration_is_a_one_line_error(data_dir, content, message):
    data_dir.mkdir(parents=True)
    (data_dir / "overheads.yaml").write_text(content)
    r = run_cli("estimate", "-m", "llama3-8b")
    assert r.exit_code == 2
    assert message in r.stderr and "overheads.yaml" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert run_cli("estimate", "-m", "llama3-8b", "--no-calibration").exit_code == 0
    with pytest.raises(SpecError):
        overheads.load(data_dir / "overheads.yaml")


def test_bad_field_type_in_calibration(data_dir):
    data_dir.mkdir(parents=True)
    entry = dict.fromkeys(overheads.REQUIRED, 1) | {"reserve_bytes": "lots"}
    (data_dir / "overheads.yaml").write_text(yaml.safe_dump({"schema": overheads.SCHEMA, "entries": [entry]}))
    r = run_cli("estimate", "-m", "llama3-8b")
    assert r.exit_code == 2 and "entries[0].reserve_bytes" in r.stderr


def test_check_log_reads_stdin():
    from typer.testing import CliRunner

    from kvplan.cli import app

    result = CliRunner(env={"COLUMNS": "120"}).invoke(
        app, ["check-log", "-", "--gpus", "H100", "--json"], input=read("vllm_v011_llama31_8b_h100.log")
    )
    assert result.exit_code == 0
    assert '"engine": "vllm"' in result.stdout


def test_check_log_errors_are_one_line(tmp_path):
    junk = tmp_path / "junk.log"
    junk.write_text("hello\nworld\n")
    r = run_cli("check-log", str(junk), "--gpus", "H100")
    assert r.exit_code == 2 and "no vLLM or SGLang KV-cache lines found" in r.stderr
    r = run_cli("check-log", str(tmp_path / "missing.log"))
    assert r.exit_code == 2 and "missing.log: cannot read" in r.stderr
    unknown = tmp_path / "unknown.log"
    unknown.write_text(
        read("vllm_v011_llama31_8b_h100.log").replace("meta-llama/Llama-3.1-8B-Instruct", "acme/thing-9b")
    )
    r = run_cli("check-log", str(unknown), "--gpus", "H100")
    assert r.exit_code == 2 and "acme/thing-9b" in r.stderr and "--model" in r.stderr
    # with --model the same log checks out
    assert run_cli("check-log", str(unknown), "--gpus", "H100", "-m", "llama3.1-8b").exit_code == 0
    # V1 logs do not name the GPU
    r = run_cli("check-log", str(LOGS / "vllm_v011_llama31_8b_h100.log"))
    assert r.exit_code == 2 and "--gpus" in r.stderr
    for res in (r,):
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_gpu_is_inferred_from_a_logged_total_when_unambiguous():
    r = run_cli("check-log", str(LOGS / "vllm_v07_llama2_7b_l40s.log"), "--json")
    assert r.exit_code == 0 and r.json()["setup"]["gpu"] == "L40S"
    # 79.19 GiB fits both H100 parts (and the A100 80GB within 0.5%): no guess
    assert infer_gpu(load_gpu("H100").memory_bytes, all_gpus()) is None
    assert infer_gpu(10 * GiB, all_gpus()) is None


def test_log_naming_a_local_checkpoint_reads_its_config_json(tmp_path):
    # a model served from a local folder: the log's model path holds the config.json
    ckpt = tmp_path / "Meta-Llama-3-70B"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(
        (REPO / "tests" / "fixtures" / "hf" / "synthetic" / "llama3-70b.json").read_text()
    )
    log = tmp_path / "local.log"
    log.write_text(
        read("vllm_v033_llama3_70b_tp2_h200.log").replace("meta-llama/Meta-Llama-3-70B", str(ckpt))
    )
    j = run_cli("check-log", str(log), "--gpus", "H200", "--json").json()
    assert all(r["cause"] == "matches" for r in j["arithmetic"])
    shipped = run_cli(
        "check-log", str(LOGS / "vllm_v033_llama3_70b_tp2_h200.log"), "--gpus", "H200", "--json"
    ).json()
    assert [r["kvplan"] for r in j["arithmetic"]] == [r["kvplan"] for r in shipped["arithmetic"]]
