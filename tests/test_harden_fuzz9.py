"""Issues 22/23/24: findings of the ninth fuzz pass (M-series: checkpoints, SGLang, disaggregated pools, the README
as a contract), each test failing on the code before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import plan, run_cli

HF = Path(__file__).parent / "fixtures" / "hf"
LOGS = Path(__file__).parent / "fixtures" / "logs" / "real"


def test_a_modelopt_checkpoints_fp8_kv_is_what_auto_resolves_to():
    # M1: hf_quant_config.json's kv_cache_quant_algo FP8 makes both engines run an fp8 KV cache under
    # --kv-cache-dtype auto; kvplan planned bf16 (SGLang 205,428 tokens where it allocates 410,857)
    folder = str(HF / "corpus" / "llama-3.1-70b-instruct-fp8")
    auto = plan(folder, "H100", num_gpus=2, max_model_len=8192, engine="sglang")
    fp8 = plan(folder, "H100", num_gpus=2, max_model_len=8192, engine="sglang", kv_cache_dtype="fp8_e4m3")
    assert auto.settings.kv_cache_dtype == "fp8_e4m3"
    assert auto.engine.kv_cache_tokens == fp8.engine.kv_cache_tokens == 410857
    assert any(
        a.startswith("--kv-cache-dtype auto: fp8_e4m3, the checkpoint's KV quantization")
        for a in auto.assumptions
    )
    bf16 = plan(folder, "H100", num_gpus=2, max_model_len=8192, engine="sglang", kv_cache_dtype="bf16")
    assert bf16.engine.kv_cache_tokens < auto.engine.kv_cache_tokens


def test_simulate_under_sglang_runs_no_more_requests_than_its_state_pool_allows():
    # M2: nemotron-h-56b on 4x H100 under SGLang: 84 state slots, 84 // 3 = 28 running requests
    # (model_runner.py); estimate's headline said 130 and simulate ran all 300 prompts at once
    args = ("-m", "nemotron-h-56b", "-g", "4xH100", "--engine", "sglang", "--max-model-len", "8K")
    est = run_cli("estimate", *args, "--json").json()
    assert est["engine"]["details"]["mamba_cache_slots"] == 84
    assert est["max_concurrency"] == 28 and est["limited_by"] == "state_pool"
    sim = run_cli("simulate", *args, "--num-prompts", "40", "--input-len", "1024", "--output-len", "64",
                  "--json").json()  # fmt: skip
    assert sim["deployment"]["max_num_seqs"] == 28


def test_disaggregated_transfer_under_dp_attention_uses_one_ranks_links():
    # M3: under DP attention a request's KV sits on one attention rank, but its transfer was timed over all 8
    # GPUs' links: 0.72 ms where one GPU's 50 GB/s link takes 5.76 ms
    args = ("estimate", "-m", "deepseek-v3", "--engine", "sglang", "--disaggregated", "--prefill-gpus", "8xH200",
            "--decode-gpus", "8xH200", "--input-len", "4K", "--output-len", "256", "--json")  # fmt: skip
    tp = run_cli(*args).json()["disaggregated"]
    dpa = run_cli(*args, "--enable-dp-attention", "--dp-size", "8").json()["disaggregated"]
    assert dpa["link_bytes_per_s"] == 50e9 and tp["link_bytes_per_s"] == 400e9
    assert dpa["transfer_ms"] == pytest.approx(dpa["kv_bytes_per_request"] / 50e9 * 1e3)
    assert dpa["transfer_ms"] == pytest.approx(tp["transfer_ms"], rel=1e-6)  # one rank's copy over one link
    assert dpa["transfer_requests_per_s"] == pytest.approx(8 / (dpa["transfer_ms"] / 1e3))


def test_disaggregated_kv_moved_includes_a_hybrids_recurrent_state():
    # M4: qwen3-next's 36 Gated DeltaNet layers' states (39,518,208 B a request) were left out of the KV moved
    args = ("estimate", "-m", "qwen3-next-80b-a3b", "--disaggregated", "--prefill-gpus", "4xH100", "--decode-gpus",
            "4xH100", "--output-len", "256", "--json")  # fmt: skip
    for n in (256, 2048):
        r = run_cli(*args, "--input-len", str(n)).json()["disaggregated"]
        state = r["prefill_plan"]["kv_bytes_per_request_fixed"]
        assert state == 39518208
        assert r["kv_bytes_per_request"] == n * r["kv_bytes_per_token"] + state


def _folder(tmp_path: Path, config: dict, index: dict | None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    if index is not None:
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def test_an_index_total_of_float32_files_is_the_16_bit_weights_served(tmp_path):
    # M5: a float32 checkpoint served in bf16 took the index's total_size (the float32 files, 30.46 GB) as its
    # weights; 128 requests became 95
    cfg = json.loads((HF / "corpus" / "qwen2.5-7b.json").read_text()) | {"torch_dtype": "float32"}
    bare = plan(str(_folder(tmp_path / "a", cfg, None)), "H100", max_model_len=8192)
    indexed = plan(str(_folder(tmp_path / "b", cfg, {"metadata": {"total_size": 30461949952}, "weight_map": {}})),
                   "H100", max_model_len=8192)  # fmt: skip
    assert indexed.weight_bytes_per_gpu == bare.weight_bytes_per_gpu == 15230974976
    assert indexed.max_concurrency == bare.max_concurrency
    # the reverse: a bf16 checkpoint served in float32 loads params x 4 B
    cfg16 = cfg | {"torch_dtype": "bfloat16"}
    up = plan(str(_folder(tmp_path / "c", cfg16, {"metadata": {"total_size": 15230974976}, "weight_map": {}})),
              "H100", max_model_len=8192, dtype="float32")  # fmt: skip
    assert up.weight_bytes_per_gpu == 2 * 15230974976


def test_an_index_total_holding_the_mtp_layer_counts_it_once(tmp_path):
    # M6: DeepSeek-V3's total_size holds its MTP layer (model.layers.61.*), which the engines load only as a
    # draft; kvplan counted it in the target's weights, and again as the draft with --speculative-config mtp
    cfg = json.loads((HF / "synthetic" / "deepseek-v3.json").read_text())
    index = {"metadata": {"total_size": 688586727753}, "weight_map": {"model.layers.61.eh_proj.weight": "x"}}
    folder = str(_folder(tmp_path / "a", cfg, index))
    mtp = '{"method":"mtp","num_speculative_tokens":1}'
    plain = plan(folder, "H200", num_gpus=8, max_model_len=32768)
    r = run_cli("estimate", "-m", folder, "-g", "8xH200", "--max-model-len", "32K", "--speculative-config", mtp,
                "--json").json()  # fmt: skip
    # with the draft the weights are the target's (the total less the MTP layer) plus the draft's, once
    assert (
        r["weight_bytes_per_gpu"]
        == plain.weight_bytes_per_gpu + r["speculative_memory"]["weight_bytes_per_gpu"]
    )
    assert any("less its 1 MTP layer(s)" in a for a in plain.assumptions)
    # an index whose weight_map has no layer past the model's last: the MTP layer is not in the checkpoint
    without = _folder(
        tmp_path / "b",
        cfg,
        {"metadata": {"total_size": 673_200_000_000}, "weight_map": {"model.layers.60.x": "y"}},
    )
    assert not any(
        "MTP layer" in a for a in plan(str(without), "H200", num_gpus=8, max_model_len=32768).assumptions
    )


def test_check_log_on_sglang_takes_the_logs_own_kv_sizes(tmp_path):
    # M7: the 'log' KV memory was #tokens x kvplan's bytes per token, so the arithmetic row re-derived the log's
    # own #tokens and matched whatever it said (an edited 30,000 'matched')
    log = LOGS / "sglang_0.4.3.post4_qwq-32b_l4_tp4.log"
    args = ("--model", str(HF / "corpus" / "qwen2.5-32b-instruct.json"), "--gpus", "L4", "--json")
    r = run_cli("check-log", str(log), *args).json()
    row = next(x for x in r["rows"] if x["quantity"] == "KV cache memory")
    assert row["log"] == 2 * round(1.42 * 2**30)  # K size 1.42 GB + V size 1.42 GB (SGLang's GB are GiB)
    arith = next(x for x in r["arithmetic"] if x["quantity"] == "KV cache tokens")
    assert abs(arith["kvplan"] - 46611) <= 81  # within 0.01 GiB of tokens
    edited = tmp_path / "edited.log"
    edited.write_text(log.read_text().replace("#tokens: 46611", "#tokens: 30000"))
    r2 = run_cli("check-log", str(edited), *args).json()
    arith2 = next(x for x in r2["arithmetic"] if x["quantity"] == "KV cache tokens")
    assert arith2["log"] == 30000 and abs(arith2["kvplan"] - 30000) > 10000
    assert not arith2["cause"].startswith("matches")


def test_a_model_folder_is_named_by_itself_not_by_an_exporters_path(tmp_path):
    # M9: _name_or_path '/opt/zhiyu_hf_ckpts/Llama-3.1-70B-Instruct/' (a path on the exporter's machine) named
    # the plan and solve's launch lines
    src = HF / "corpus" / "llama-3.1-70b-instruct-fp8"
    folder = tmp_path / "llama-3.1-70b-instruct-fp8"
    shutil.copytree(src, folder)
    assert json.loads((folder / "config.json").read_text())["_name_or_path"].startswith("/opt/")
    p = plan(str(folder), "H100", num_gpus=2, max_model_len=8192)
    assert p.model.name == "llama-3.1-70b-instruct-fp8"


def test_every_estimate_flag_is_in_the_readmes_flag_table():
    # M8: the table 'kvplan estimate flags' left out 13 flags --help lists (-dp, the expert-parallel and
    # DP-attention flags, --network, --runner): the table is held to --help so they cannot drift apart again
    import re

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    start = readme.index("`kvplan estimate` flags, named as in vLLM")
    table = readme[start : readme.index("\n\n", readme.index("| flag | default | meaning |", start))]
    documented = set(re.findall(r"--[a-z][a-z0-9-]*", table))
    helped = run_cli("estimate", "--help")
    flags = set()
    for (
        line
    ) in helped.stdout.splitlines():  # the option column: '  -dp, --data-parallel-size, --dp-size <int>'
        if re.match(r"^\s{2}-", line):
            flags |= set(re.findall(r"--[a-z][a-z0-9-]*", re.split(r"\s{2,}", line.strip())[0]))
    flags -= {"--help"}
    assert len(flags) > 60
    missing = sorted(f for f in flags if f not in documented and not f.startswith("--no-"))
    assert not missing, missing
