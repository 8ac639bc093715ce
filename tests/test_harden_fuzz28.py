"""Session 18 hardening: fuzz pass 28's findings (each test failing on the code before)."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvplan
from kvplan.errors import UsageError
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "tests" / "fixtures" / "logs" / "real"
MTP = '{"method":"mtp","num_speculative_tokens":3}'


def test_served_tpot_under_speculative_decoding_is_the_speculative_step_plus_the_prompts():
    # S1: the served TPOT line added the prompts to the plain decode step (22.77 ms) beside a speculative TPOT
    # of 10.68 ms at the same 20 requests; simulate gives about 12
    args = ("estimate", "-m", "deepseek-v3", "-g", "8xH200", "--max-model-len", "32K", "--input-len", "2000",
            "--output-len", "500", "--speculative-config", MTP, "--json")  # fmt: skip
    d = run_cli(*args).json()["decode"]
    sv, sp = d["served"], d["speculative"][-1]
    assert sv["speculative"] is True and sp["batch"] == sv["batch"]
    assert sv["step_ms"] == pytest.approx(sp["tpot_ms"])
    assert sv["tpot_ms"] == pytest.approx(sp["tpot_ms"] + (sv["batch"] - 1) * sv["chunk_ms"] / 500)
    assert sv["tpot_ms"] < 0.7 * d["at_max_concurrency"]["tpot_ms"]
    text = " ".join(run_cli(*args[:-1]).stdout.split())
    assert f"{sv['tpot_ms']:,.2f} ms (the {sp['tpot_ms']:,.2f} ms speculative TPOT (below) +" in text
    # without speculation the served line is the decode step's, as before
    plain = run_cli(*args[:-3], "--json").json()["decode"]["served"]
    assert plain["speculative"] is False and plain["tpot_ms"] > 2 * sv["tpot_ms"] * 0.8


def test_compare_takes_no_network_flags():
    # S2: compare accepted --network and printed byte-identical figures for 25G and 800G, even across nodes
    r = run_cli("compare", "table", "-g", "2x8xH100", "--network", "25G")
    assert r.exit_code == 2 and "No such option: --network" in r.stderr
    with pytest.raises(UsageError, match="network plays no part in its figures"):
        kvplan.compare(network="25G")


@pytest.mark.parametrize(
    ("args", "offered", "not_offered"),
    [
        (("simulate", "-m", "deepseek-v3", "-g", "8xH100", "--num-prompts", "10"),
         ["a smaller --weight-dtype", "`kvplan estimate --cpu-offload-gb`"], ["or --cpu-offload-gb"]),
        (("compare", "ladder", "-m", "deepseek-v3"),
         ["`kvplan estimate --cpu-offload-gb`"], ["--weight-dtype", "or --cpu-offload-gb"]),
        (("estimate", "-m", "deepseek-v3", "-g", "8xH100"),
         ["a smaller --weight-dtype", "or --cpu-offload-gb to keep some"], ["kvplan estimate"]),
    ],
)  # fmt: skip
def test_a_weights_refusal_names_only_flags_the_command_takes(args, offered, not_offered):
    # S3: simulate and compare told the user to pass --cpu-offload-gb / --weight-dtype, which they do not take
    r = run_cli(*args)
    assert r.exit_code == 3 and len(r.stderr.strip().splitlines()) == 1
    for words in offered:
        assert words in r.stderr
    for words in not_offered:
        assert words not in r.stderr


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("estimate", "-m", "llama3-8b", "--kv-cache-memory", ""), "--kv-cache-memory"),
        (("estimate", "-m", "llama3-8b", "--reserve-memory", " "), "--reserve-memory"),
        (("estimate", "-m", "llama3-8b", "--max-model-len", ""), "--max-model-len"),
        (("estimate", "-m", "llama3-8b", "--avg-context", ""), "--avg-context"),
        (("estimate", "-m", "llama3-8b", "--max-num-batched-tokens", ""), "--max-num-batched-tokens"),
        (("estimate", "-m", "llama3-8b", "--calibration-file", ""), "--calibration-file"),
        (("solve", "-m", "llama3-8b", "-u", "10", "--max-model-len", "8K", "--avg-context", ""), "--avg-context"),
        (("compare", "table", "--models", "llama3-8b", "--kv-cache-memory", ""), "--kv-cache-memory"),
        (("check-log", str(ROOT / "tests/fixtures/logs/vllm_v011_llama31_8b_h100.log"), "--gpus", ""), "--gpus"),
        (("simulate", "-m", "llama3-8b", "--trace", ""), "--trace"),
    ],
)  # fmt: skip
def test_an_empty_flag_value_is_refused_not_read_as_left_out(args, flag):
    # S4: '' ($KV unset) ran as if the flag were left out (exit 0) for these flags
    r = run_cli(*args)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith(f"error: {flag}: empty"), r.stderr


def test_compare_with_empty_models_is_refused():
    r = run_cli("compare", "table", "--models", "")
    assert r.exit_code == 2 and "--models: no model named in ''" in r.stderr


def test_max_num_seqs_above_vllms_default_budget_is_refused_as_vllm_refuses_it():
    # S5: vLLM fills in its default --max-num-batched-tokens (8,192 for `vllm serve` on an H100) before it checks
    # max_num_batched_tokens >= max_num_seqs; kvplan checked only a budget typed out
    r = run_cli("estimate", "-m", "llama3-8b", "--max-model-len", "64", "--max-num-seqs", "10000")
    assert r.exit_code == 2
    assert (
        "--max-num-seqs 10,000 is above vLLM's default --max-num-batched-tokens for this card and usage, 8,192"
        in r.stderr
    )
    assert "give --max-num-batched-tokens 10,000 or more" in r.stderr
    ok = run_cli("estimate", "-m", "llama3-8b", "--max-model-len", "64", "--max-num-seqs", "10000",
                 "--max-num-batched-tokens", "10000", "--json")  # fmt: skip
    assert ok.exit_code == 0 and ok.json()["max_concurrency"] > 4000
    # SGLang has no such rule
    assert run_cli("estimate", "-m", "llama3-8b", "--max-model-len", "64", "--engine", "sglang",
                   "--max-running-requests", "10000").exit_code == 0  # fmt: skip


def test_solve_launch_lines_name_a_budget_that_holds_the_running_cap():
    for engine in ("vllm", "sglang"):
        a = run_cli("solve", "-m", "llama3-8b", "-u", "20000", "--max-model-len", "256", "--top", "1",
                    "--engine", engine, "--json").json()["answers"][0]  # fmt: skip
        flags = a["vllm_flags"]
        cap = int(flags.split("--max-num-seqs ")[1].split()[0])
        assert cap > 8192 and f"--max-num-batched-tokens {cap}" in flags
    small = run_cli("solve", "-m", "llama3-8b", "-u", "100", "--max-model-len", "8K", "--top", "1", "--json")
    assert "--max-num-batched-tokens" not in small.json()["answers"][0]["vllm_flags"]


def test_check_log_blames_the_weight_format_when_the_logs_own_weights_fit_its_gpu():
    # S6: an SGLang GLM-5-FP8 log on its own MI355X was told to pass the GPU it ran on
    log = str(REAL / "sglang_0.5.9_glm-5-fp8_mi355x_tp8.md")
    cfg = str(ROOT / "tests/fixtures/hf/corpus/glm-5.1.json")
    r = run_cli("check-log", log, "-m", cfg, "-g", "MI355X")
    assert r.exit_code == 2
    assert "the log loaded 89.20 GiB of weights, which fit beside it" in r.stderr
    assert r.stderr.strip().endswith("give --weight-dtype")
    assert run_cli("check-log", log, "-m", cfg, "-g", "MI355X", "--weight-dtype", "fp8").exit_code == 0
    # on a card too small for the log, the GPU is still what is blamed
    small = run_cli("check-log", log, "-m", cfg, "-g", "H200")
    assert small.exit_code == 2 and "the log ran on" in small.stderr and "--weight-dtype" not in small.stderr


def test_data_parallel_on_several_nodes_keeps_the_replicas_asked_for():
    # S7: -g 2x8xH100 -dp 2 planned TP 4 x DP 4 (TP = one node's GPUs / DP)
    p = run_cli("estimate", "-m", "llama3-70b", "-g", "2x8xH100", "-dp", "2", "--json").json()["cluster"]
    assert (p["tensor_parallel_size"], p["data_parallel_size"]) == (8, 2)
    ep = run_cli(
        "estimate", "-m", "deepseek-v3", "-g", "2x8xH100", "--enable-expert-parallel", "-dp", "2", "--json"
    )
    assert ep.exit_code == 0 and ep.json()["cluster"]["tensor_parallel_size"] == 8
    # with a TP given, more replicas than asked are said
    r = run_cli("estimate", "-m", "llama3-70b", "-g", "8xH100", "-tp", "2", "-dp", "2", "--json").json()
    assert r["cluster"]["data_parallel_size"] == 4
    assert any("--data-parallel-size 2: the 8 GPUs hold 4 replicas" in n for n in r["assumptions"])


def test_solve_does_not_offer_a_context_above_the_models_maximum():
    # S8: a trace with 121K-token requests on llama3-8b (8K) was told to give --max-model-len 121213
    r = run_cli("solve", "-m", "llama3-8b", "--request-rate", "5", "--ttft-ms", "1000", "--tpot-ms", "50",
                "--max-model-len", "8K", "--trace", str(ROOT / "tests/fixtures/traces/mooncake_conversation_trace.jsonl"),
                "--num-prompts", "300")  # fmt: skip
    assert r.exit_code == 2
    assert "llama3-8b's context is 8,192 tokens, so no GPUs serve them with this model" in r.stderr
    assert "--max-model-len 121213" not in r.stderr
