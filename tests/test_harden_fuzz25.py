"""Session 17 hardening: fuzz 24's K3 and pass 25's findings (each test failing on the code before)."""

from __future__ import annotations

import pytest

from tests.helpers import run_cli


def test_solve_max_context_reports_the_users_memory_holds_not_the_cap_it_launches():
    # fuzz 24 K3: --max-context reported each answer's users as the --max-num-seqs its launch line writes
    # (ceil(users / DP) x DP, a +0% margin on every row) while the fewest-GPUs mode reports what the KV pool holds
    out = run_cli(
        "solve", "-m", "llama3.1-8b", "--users", "10", "-g", "2xH100", "--max-context", "--json"
    ).json()
    first = next(a for a in out["answers"] if (a["data_parallel_size"], a["kv_cache_dtype"]) == (2, "fp8"))
    assert first["max_model_len"] == 131072
    assert "--max-num-seqs 5" in first["vllm_flags"]
    # the server that line launches, planned by estimate: capped at 5 a replica, its memory holds 7 a replica
    plan = run_cli("estimate", "-m", "llama3.1-8b", "-g", "2xH100", "-tp", "1", "-dp", "2",
                   "--max-model-len", "131072", "--kv-cache-dtype", "fp8", "--max-num-seqs", "5", "--json").json()  # fmt: skip
    assert plan["max_concurrency"] == 10 and plan["limited_by"] == "max_num_seqs"
    assert first["max_concurrency"] == plan["pool_max_concurrency_per_replica"] * 2 == 14
    assert first["margins"]["users"] == pytest.approx(0.4)


def test_estimate_capped_concurrency_names_what_memory_holds():
    args = ("estimate", "-m", "llama3.1-8b", "--max-model-len", "32K", "--max-num-seqs", "4")
    held = run_cli(*args, "--json").json()["pool_max_concurrency_per_replica"]
    assert held > 4
    text = run_cli(*args).stdout
    cells = " ".join(part.strip(" │") for part in text.splitlines())  # the row wraps inside its cell
    assert f"capped by --max-num-seqs; memory holds {held})" in " ".join(cells.split())


# --- fuzz pass 25 (P1-P11) ---


def test_decode_rows_time_the_batch_the_scheduler_forms_not_what_memory_holds():
    # P1: --avg-context 110 on 8x H100 timed a batch of 38,874; vLLM runs at most its default --max-num-seqs
    # (1,024 for `vllm serve` on this card) at once, and the disaggregated decode pool the same
    args = (
        "estimate",
        "-m",
        "llama3.1-8b",
        "-g",
        "8xH100",
        "--avg-context",
        "110",
        "--no-calibration",
        "--json",
    )
    j = run_cli(*args).json()
    assert j["avg_context"]["max_concurrency_per_replica"] > 30_000  # what memory holds stays the figure
    assert j["decode"]["at_avg_context"]["batch"] == 1024
    assert any("decode speed at 1,024 running requests" in a for a in j["assumptions"])
    sg = run_cli(*args, "--engine", "sglang").json()
    assert sg["decode"]["at_avg_context"]["batch"] == 4096  # model_runner.py's request pool, at most 4,096
    d = run_cli("estimate", "-m", "llama3.1-8b", "--disaggregated", "--prefill-gpus", "8xH100", "--decode-gpus",
                "H100", "-tp", "1", "--input-len", "50", "--output-len", "200", "--kv-cache-dtype", "fp8",
                "--no-calibration", "--json").json()["disaggregated"]  # fmt: skip
    dec = d["decode"]
    assert dec["concurrency_per_replica"] == 1024
    assert any("memory holds 3,562 at 250 tokens" in a for a in d["assumptions"])


def test_sglang_state_pool_of_no_request_refuses_as_sglang_does():
    # P2: 0 state slots (3 a request with the radix cache) printed 1 concurrent request
    r = run_cli("estimate", "-m", "nemotron-h-56b", "-g", "H200", "--engine", "sglang", "--max-model-len", "4K",
                "--mem-fraction-static", "0.765", "--no-calibration")  # fmt: skip
    assert r.exit_code != 0 and "max_running_request is zero" in r.stderr and len(r.stderr.splitlines()) == 1
    ok = run_cli("estimate", "-m", "nemotron-h-56b", "-g", "H200", "--engine", "sglang", "--max-model-len", "4K",
                 "--mem-fraction-static", "0.8", "--no-calibration", "--json").json()  # fmt: skip
    assert ok["max_concurrency"] == 1 and ok["limited_by"] == "state_pool"


def test_draft_pass_pays_no_share_of_the_targets_offload_copy():
    # P3: with --cpu-offload-gb 30 each MTP pass was charged 1/61 of the target's 514 ms copy (0.35 -> 17.2 ms)
    def draft(gb: str) -> dict:
        return run_cli("estimate", "-m", "deepseek-v3", "-g", "8xH200", "--no-calibration", "--cpu-offload-gb", gb,
                       "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}',
                       "--json").json()["decode"]["speculative"][0]  # fmt: skip

    off, on = draft("0"), draft("30")
    assert on["draft_ms"] == pytest.approx(off["draft_ms"], rel=1e-6)
    assert on["verify_ms"] > 10 * off["verify_ms"]  # the target still pays its copy


REPEATED = """INFO 11-28 10:01:05 [api_server.py:1805] vLLM API server version 0.11.0
INFO 11-28 10:01:05 [utils.py:233] non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B-Instruct', 'model': 'meta-llama/Llama-3.1-8B-Instruct', 'max_model_len': 32768}
INFO 11-28 10:01:20 [gpu_model_runner.py:2602] Model loading took 14.9889 GiB and 4.12 seconds
INFO 11-28 10:01:30 [gpu_worker.py:298] Available KV cache memory: 54.11 GiB
INFO 11-28 10:01:30 [kv_cache_utils.py:1087] GPU KV cache size: 443,264 tokens
INFO 11-28 10:01:30 [kv_cache_utils.py:1091] Maximum concurrency for 32,768 tokens per request: 13.53x
INFO 11-28 10:05:30 [gpu_worker.py:298] Available KV cache memory: 30.00 GiB
INFO 11-28 10:05:30 [kv_cache_utils.py:1087] GPU KV cache size: 245,760 tokens
"""  # the fuzz report's log: KV lines repeated with other figures, one concurrency line


def test_check_log_never_pairs_a_concurrency_with_another_pool(tmp_path):
    # P4: the 30 GiB pool was set beside the 54 GiB pool's 13.53x: a -44.6% "mismatch" and wrong advice
    log = tmp_path / "rep.log"
    log.write_text(REPEATED)
    r = run_cli("check-log", str(log), "-g", "H100", "-m", "llama3.1-8b")
    assert r.exit_code == 0, r.stderr
    flat = " ".join(r.stdout.split())
    assert "maximum concurrency" not in flat and "-44.6%" not in flat
    assert "the log's 2 'GPU KV cache size' and 1 'Maximum concurrency' line(s) do not pair" in flat
    once = REPEATED.replace("30.00 GiB", "54.11 GiB").replace("245,760", "443,264")  # the same pool twice
    log.write_text(once)
    assert "maximum concurrency" in run_cli("check-log", str(log), "-g", "H100", "-m", "llama3.1-8b").stdout


def test_an_sglang_line_above_a_vllm_log_is_named_not_a_missing_kv_line(tmp_path):
    # P5: "no vLLM or SGLang KV-cache lines found" though vLLM's were there
    log = tmp_path / "mix.log"
    args = "ServerArgs(model_path='meta-llama/Llama-3.1-8B-Instruct', tp_size=1)"
    log.write_text(f"[2025-01-23 19:34:55] server_args={args}\n{REPEATED}")
    r = run_cli("check-log", str(log), "-g", "H100", "-m", "llama3.1-8b")
    assert r.exit_code == 2 and "SGLang's lines (ServerArgs(...)) and vLLM's KV-cache lines" in r.stderr


def test_trace_timestamp_past_any_clock_is_refused(tmp_path):
    # P6: 1e300 ms was accepted and printed as 300 digits
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp":1e300,"input_length":100,"output_length":5,"hash_ids":[0]}\n' * 2)
    r = run_cli("simulate", "-m", "llama3.1-8b", "--max-model-len", "8K", "--trace", str(trace))
    assert r.exit_code == 2 and f"{trace}:1: timestamp 1e+300 ms is past any trace's clock" in r.stderr
    trace.write_text('{"timestamp":1764000000000,"input_length":100,"output_length":5,"hash_ids":[0]}\n')
    assert (
        run_cli("simulate", "-m", "llama3.1-8b", "--max-model-len", "8K", "--trace", str(trace)).exit_code
        == 0
    )


def test_burstiness_without_a_rate_is_refused():
    # P7: ignored without a word under --request-rate inf
    r = run_cli("simulate", "-m", "llama3.1-8b", "--max-model-len", "8K", "--num-prompts", "50", "--burstiness",
                "0.05", "--no-calibration")  # fmt: skip
    assert r.exit_code == 2 and "--burstiness 0.05 shapes the gaps between arrivals" in r.stderr


def test_meta_llama_3_1_instruct_repo_names_are_aliases():
    # P8: a real SGLang log names meta-llama/Meta-Llama-3.1-8B-Instruct, the repo's original name
    from kvplan.specs.registry import load_model

    for size in ("8B", "70B", "405B"):
        assert load_model(f"meta-llama/Meta-Llama-3.1-{size}-Instruct").name == f"llama3.1-{size.lower()}"


def test_disaggregated_output_names_the_offload_it_times():
    # P9: prefill 18 -> 86 ms and decode 44 -> 100 ms with no word of offload
    out = run_cli("estimate", "-m", "llama3.1-8b", "--cpu-offload-gb", "4", "--disaggregated", "--prefill-gpus",
                  "2xH100", "--decode-gpus", "4xH100", "--input-len", "1000", "--output-len", "100",
                  "--no-calibration").stdout  # fmt: skip
    flat = " ".join(out.split())
    assert "- prefill pool: --cpu-offload-gb 4:" in flat and "- decode pool: --cpu-offload-gb 4:" in flat


def test_sglang_refusals_name_sglangs_flag_and_weights_refusal_names_offload():
    # P10: SGLang errors said "raise --gpu-memory-utilization" and "one kept as the null block"
    kv = run_cli("estimate", "-m", "nemotron-h-56b", "-g", "H200", "--engine", "sglang", "--max-model-len", "4K",
                 "--mem-fraction-static", "0.755", "--no-calibration").stderr  # fmt: skip
    assert (
        "raise --mem-fraction-static" in kv and "null block" not in kv and "gpu-memory-utilization" not in kv
    )
    w = run_cli("estimate", "-m", "llama3.1-70b", "-g", "2xH100", "--engine", "sglang", "--max-model-len", "8K",
                "--no-calibration").stderr  # fmt: skip
    assert "or --cpu-offload-gb to keep some in CPU memory" in w
    assert run_cli("estimate", "-m", "llama3.1-70b", "-g", "2xH100", "--engine", "sglang", "--max-model-len", "8K",
                   "--cpu-offload-gb", "1", "--no-calibration").exit_code == 0  # fmt: skip


def test_small_throughputs_keep_their_digits():
    # P11: "0.00 req/s" and "0 tok/s" for a run that served 384 tokens
    out = run_cli("simulate", "-m", "llama3.1-8b", "--max-model-len", "8K", "--num-prompts", "3", "--request-rate",
                  "0.001", "--no-calibration").stdout  # fmt: skip
    assert "0.001 req/s" in out and "0.13 tok/s" in out and "0.00 req/s" not in out


# --- issue 24 audit (2026-12-07) ---


def test_one_request_one_user_read_as_such():
    sim = run_cli(
        "simulate", "-m", "llama3-8b", "--max-model-len", "8K", "--num-prompts", "1", "--no-calibration"
    )
    assert "completed 1 request in" in sim.stdout
    solve = run_cli("solve", "-m", "llama3-8b", "-u", "1", "--max-model-len", "8K").stdout
    assert "for 1 user," in solve and "1 users" not in solve


def test_simulate_says_once_that_a_profile_is_forced_onto_another_gpu(tmp_path):
    from kvplan.calibrate import calibration
    from tests.test_calibration_profile import _profile

    path = tmp_path / "h200.yaml"
    calibration.save(_profile(), path)
    r = run_cli("simulate", "-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--num-prompts", "20",
                "--calibration-file", str(path), "--force-calibration")  # fmt: skip
    assert r.exit_code == 0
    assert r.stderr.count("warning: calibration") == 1 and "used for H100-SXM" in r.stderr
    assert "measured on NVIDIA H200, used for this GPU by --force-calibration" in " ".join(r.stdout.split())


def test_solve_takes_calibration_both_ways():
    on = run_cli(
        "solve", "-m", "llama3-8b", "-u", "10", "--max-model-len", "8K", "--calibration", "--top", "1"
    )
    off = run_cli(
        "solve", "-m", "llama3-8b", "-u", "10", "--max-model-len", "8K", "--no-calibration", "--top", "1"
    )
    assert on.exit_code == off.exit_code == 0


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_quant_sidecar_that_is_no_file_is_refused(tmp_path, kind):
    # a directory or FIFO named hf_quant_config.json was passed over: the model planned in bf16 without a word
    import os
    import shutil

    from tests.helpers import REPO

    shutil.copy(
        REPO / "tests" / "fixtures" / "hf" / "corpus" / "llama-3.1-70b.json", tmp_path / "config.json"
    )
    side = tmp_path / "hf_quant_config.json"
    side.mkdir() if kind == "directory" else os.mkfifo(side)
    r = run_cli("estimate", "-m", str(tmp_path), "-g", "2xH100")
    assert r.exit_code == 2 and str(side) in r.stderr and len(r.stderr.splitlines()) == 1


def _gemma3_4b(folder) -> str:
    """Gemma-3-4B-it's config as tests/test_engines.py builds it: its text dims over the corpus Gemma-3-27B-it
    config (the same SigLIP vision_config; the projector follows the text width)."""
    import json

    from tests.helpers import REPO

    cfg = json.loads((REPO / "tests" / "fixtures" / "hf" / "corpus" / "gemma-3-27b-it.json").read_text())
    cfg["text_config"].update(
        hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)],
    )  # fmt: skip
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


def test_gemma3_weights_count_the_siglip_tower_vllm_loads(tmp_path):
    # issue 24 audit: on the one vLLM ROCm log (Gemma-3-4B-it on an MI300X) kvplan's weights were the text model's
    # alone, 7.23 GiB against a logged checkpoint of 8.01 GiB and a load of 8.58 GiB (-15.8%)
    from tests.helpers import REPO

    folder = _gemma3_4b(tmp_path)
    j = run_cli("estimate", "-m", folder, "-g", "MI300X", "--max-model-len", "8192", "--json").json()
    assert j["settings"]["weight_formats"]["vision"] == "bf16"
    assert j["weight_bytes_per_gpu"] / 2**30 == pytest.approx(8.01, abs=0.005)  # "Checkpoint size: 8.01 GiB"
    assert not any("nor the vision tower's weights" in a for a in j["assumptions"])
    log = REPO / "tests" / "fixtures" / "logs" / "real" / "vllm_0.23.0_gemma-3-4b-it_mi300x_tp1.log"
    out = " ".join(run_cli("check-log", str(log), "-m", folder, "-g", "MI300X").stdout.split())
    assert "weights per GPU │ 8.58 GiB │ 8.01 GiB │ -6.7%" in out
    # the shipped 27B spec and its config.json agree, the tower included
    assert run_cli("estimate", "-m", "gemma3-27b", "--json").json()["params_total"] == 27_431_724_144


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("m.yaml", ("estimate", "-m", "{p}", "--gpus", "H100")),
        ("config.json", ("estimate", "-m", "{p}", "--gpus", "H100")),
        ("p.yaml", ("estimate", "-m", "qwen3-8b", "--gpus", "H100", "--calibration-file", "{p}")),
    ],
)
def test_a_file_one_byte_over_8_mib_is_refused_by_its_size(tmp_path, name, args):
    # issue 24 audit: the 8 MiB rule was tested only on a 65 MiB file
    from kvplan.limits import MAX_FILE_BYTES

    path = tmp_path / name
    with open(path, "wb") as fh:  # sparse: refused by its size before a byte is read
        fh.truncate(MAX_FILE_BYTES + 1)
    r = run_cli(*[a.format(p=path) for a in args])
    assert r.exit_code == 2 and name in r.stderr and "8" in r.stderr and len(r.stderr.splitlines()) == 1


# --- fuzz pass 26 (Q1-Q8) ---


def test_sglang_running_requests_below_the_dp_size_refuses_as_sglang_does():
    # Q1: 4 over 8 attention-DP ranks was planned as 1 a rank; SGLang asserts 'max_running_request is zero'
    r = run_cli("estimate", "-m", "deepseek-v3", "-g", "8xH200", "--engine", "sglang", "--enable-dp-attention",
                "--dp-size", "8", "--max-model-len", "8K", "--max-running-requests", "4")  # fmt: skip
    assert r.exit_code == 2 and "gives 0 a rank" in r.stderr and "give at least 8" in r.stderr
    ok = run_cli("estimate", "-m", "deepseek-v3", "-g", "8xH200", "--engine", "sglang", "--enable-dp-attention",
                 "--dp-size", "8", "--max-model-len", "8K", "--max-running-requests", "8", "--json")  # fmt: skip
    assert ok.exit_code == 0 and ok.json()["max_concurrency"] == 8


def test_check_log_reads_no_concurrency_from_lines_of_two_lengths(tmp_path):
    # Q2: a second 'Maximum concurrency' line for 8,192 gave the 32,768 line's 13.53x beside length 8,192: +300%
    from tests.helpers import REPO

    base = (REPO / "tests" / "fixtures" / "logs" / "vllm_v011_llama31_8b_h100.log").read_text()
    log = tmp_path / "two.log"
    log.write_text(
        base
        + "INFO 11-28 10:01:30 [kv_cache_utils.py:1091] Maximum concurrency for 8,192 tokens per request: 54.11x\n"
    )
    flat = " ".join(run_cli("check-log", str(log), "-g", "H100").stdout.split())
    assert "max-model-len 32,768" in flat and "maximum concurrency │" not in flat and "+299.9%" not in flat
    assert "1 'GPU KV cache size' and 2 'Maximum concurrency' line(s) do not pair" in flat


def test_sglang_request_pool_binding_is_named_and_no_larger_cap_advised():
    # Q3: "memory holds 6,000 ... (give a larger cap)" where 6,000 was the flag and the 4,096 request pool binds
    a = run_cli("estimate", "-m", "llama3.1-8b", "-g", "B200", "--max-model-len", "2K", "--avg-context", "128",
                "--engine", "sglang", "--max-running-requests", "6000", "--json").json()  # fmt: skip
    note = next(x for x in a["assumptions"] if x.startswith("decode speed at"))
    assert "SGLang's request pool" in note and "memory holds 8,807 at 128 tokens" in note
    assert "larger cap" not in note and a["decode"]["at_avg_context"]["batch"] == 4096


def test_gemma3_vision_config_oddities_are_said_or_refused(tmp_path):
    # Q4: num_channels 0 counted as 3, vision_config null dropped the tower without a word, 10^9 layers unbounded
    import json

    from tests.helpers import REPO

    cfg = json.loads((REPO / "tests" / "fixtures" / "hf" / "corpus" / "gemma-3-27b-it.json").read_text())

    def run(change) -> object:
        c = json.loads(json.dumps(cfg))
        change(c)
        path = tmp_path / "config.json"
        path.write_text(json.dumps(c))
        return run_cli("estimate", "-m", str(path), "-g", "8xH100", "--max-model-len", "32K")

    for change in (
        lambda c: c["vision_config"].update(num_channels=0),
        lambda c: c.update(vision_config=None),
    ):
        r = run(change)
        assert r.exit_code == 0 and "nor the vision tower's weights" in " ".join(r.stdout.split())
    deep = run(lambda c: c["vision_config"].update(num_hidden_layers=10**9))
    assert (
        deep.exit_code == 2
        and "vision_config.num_hidden_layers 1,000,000,000 is over kvplan's limit" in deep.stderr
    )


def test_solve_max_context_breaks_ties_by_users_and_speed():
    # Q5: at one context the fewest users and twice the TPOT ranked first (search order)
    answers = run_cli(
        "solve", "-m", "llama3.1-8b", "-u", "4", "--max-context", "-g", "8xH100", "--json"
    ).json()["answers"]
    same = [a for a in answers if (a["max_model_len"], a["kv_cache_dtype"]) == (131072, "auto")]
    assert len(same) >= 2
    assert [a["max_concurrency"] for a in same] == sorted((a["max_concurrency"] for a in same), reverse=True)


def test_compare_table_never_folds_a_figure_beside_a_long_name(tmp_path):
    # Q6: a 55- and a 73-character folder name at 80 columns printed 2,346 as `2,3`/`46` and lost some figures
    import shutil

    from tests.helpers import REPO

    for name in ("Qwen3-Coder-480B-A35B-Instruct-FP8-dynamic-quantized-ab",
                 "a-very-long-directory-name-for-testing-table-widths-llama-3.1-70b-config"):  # fmt: skip
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(
            REPO / "tests" / "fixtures" / "hf" / "corpus" / "llama-3.1-70b.json", folder / "config.json"
        )
        args = (
            "compare",
            "table",
            "-m",
            f"{folder},llama3.1-8b",
            "--variants",
            "shipped,gqa4+int4+window2048",
        )
        out = _at_80(*args)
        for figure in ("320 KiB", "128 KiB", "165", "2,346", "7,500", "531"):
            assert f" {figure} " in out or f" {figure}\n" in out, (name, figure)
        assert max(len(line.rstrip()) for line in out.splitlines()) <= 80


def _at_80(*args: str) -> str:
    return _at(80, *args)


def _at(width: int, *args: str) -> str:
    from typer.testing import CliRunner

    from kvplan.cli import app

    return CliRunner(env={"COLUMNS": str(width), "NO_COLOR": "1"}).invoke(app, list(args)).stdout


def test_gpu_names_stay_whole_beside_their_wrapped_aliases():
    # Q7: `A100-40GB-PCI` / `e` in the aliases table at 80 columns
    out = _at_80("gpus")
    cont = out.split("(continued)")[1]
    for name in ("A100-40GB-PCIe", "A100-80GB-PCIe", "H100-SXM", "RTX3090"):
        assert f"\n{name} " in cont
    assert "NVIDIA H100 80GB HBM3" in cont


def test_vllm_default_cap_lines_agree():
    # Q8: "concurrency is capped only by a --max-num-seqs you give" beside "vLLM's default --max-num-seqs ... runs
    # no more at once"
    a = run_cli("estimate", "-m", "llama3.1-8b", "-g", "B200", "--max-model-len", "2K", "--avg-context", "128",
                "--json").json()["assumptions"]  # fmt: skip
    assert not any("concurrency is capped only by" in x for x in a)
    assert any("caps the requests run at once" in x for x in a)


@pytest.mark.parametrize(("tp", "weights", "blocks"), [(1, "87.00 GiB │ 86.99 GiB │ -0.0%", "39,212"),
                                                      (2, "43.51 GiB │ 43.50 GiB │ -0.0%", "124,518")])  # fmt: skip
def test_vllm_moe_logs_on_mi300x_match_weights_and_blocks(tp, weights, blocks):
    # issue 24's AMD item: the first vLLM MoE startup logs on an MI300X (Mixtral-8x7B-Instruct, vLLM 0.6.4, offline
    # benchmark; AUGMXNT/MI300-testing): the weights as loaded and the token arithmetic given the logged blocks
    from tests.helpers import REPO

    log = (
        REPO
        / "tests"
        / "fixtures"
        / "logs"
        / "real"
        / f"vllm_0.6.4.dev9_mixtral-8x7b-instruct_mi300x_tp{tp}.log"
    )
    out = " ".join(run_cli("check-log", str(log), "-g", "MI300X").stdout.split())
    assert f"weights per GPU │ {weights}" in out
    assert f"GPU blocks │ {blocks} blocks │ {blocks} blocks │ +0.0%" in out
    assert (
        "maximum concurrency │ 19.15x │ 19.15x │ +0.0%" in out
        if tp == 1
        else "60.80x │ 60.80x │ +0.0%" in out
    )


# --- fuzz pass 27 (R1, R2) ---


def test_a_window_as_long_as_the_context_is_a_not_applicable_row():
    # R1: compare table -m gpt3-175b --variants window4096 was a pydantic traceback (window >= max_context 2,048)
    r = run_cli("compare", "table", "-m", "gpt3-175b,llama3-8b", "--variants", "shipped,window4096")
    assert r.exit_code == 0, r.stderr
    flat = " ".join(r.stdout.split())
    assert (
        "gpt3-175b window4096: not applicable: variant window4096: a window of 4,096 tokens keeps every"
        in flat
    )


def test_double_width_names_take_their_screen_cells(tmp_path):
    # R2: widths were counted in characters, so a CJK name overran the width and rich cut `320 KiB` to `3`
    import shutil

    from rich.cells import cell_len

    from tests.helpers import REPO

    folder = tmp_path / ("llama-中文微调模型-" * 4 + "final")
    folder.mkdir()
    shutil.copy(REPO / "tests" / "fixtures" / "hf" / "corpus" / "llama-3.1-70b.json", folder / "config.json")
    args = ("compare", "table", "-m", f"{folder},llama3-70b", "--variants", "shipped,gqa2,int4+window4096")
    rows = run_cli(*args, "--json").json()["rows"]
    for width in (80, 100):  # at 100 the old count of characters cut `320 KiB` to `3`
        out = _at(width, *args)
        assert max(cell_len(line) for line in out.splitlines()) <= width
        for figure in ("320 KiB", "80 KiB", "vs MHA", *(f"{r['max_concurrency']:,}" for r in rows)):
            assert figure in out, (width, figure)
        assert "final" in out  # the name folds whole, it is not cut


def test_a_text_column_longer_than_the_room_wraps_beside_a_whole_name():
    # fuzz 27's note: in `models` an HF id longer than the room beside the name was taken for a figure, so the
    # name folded to make room for it
    from rich.console import Console

    from kvplan.render.tables import render_models
    from kvplan.specs.registry import load_model

    spec = load_model("llama3-8b").model_copy(
        update={"name": "a-model-name-of-29-characters", "hf_id": "org/" + "x" * 70}
    )
    console = Console(width=80, record=True)
    render_models([spec], console)
    out = console.export_text()
    assert "\na-model-name-of-29-characters │" in out
    assert "".join(out.split("(continued)")[1].split()).count("x") >= 70
    assert max(len(line) for line in out.splitlines()) <= 80
