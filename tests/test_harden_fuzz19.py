"""Session 15 hardening: fuzz pass 19's findings (each test failing on the code before)."""

from __future__ import annotations

import pytest

from tests.helpers import REPO, run_cli

LOGS = REPO / "tests" / "fixtures" / "logs"
SGLANG_LLAMA = LOGS / "sglang_v05_llama3_8b_h100.log"


def _rows(result, key: str) -> dict[str, dict]:
    return {r["quantity"]: r for r in result.json()[key]}


def _without_kv_line(tmp_path, tokens: int | None = None):
    text = "".join(
        line
        for line in SGLANG_LLAMA.read_text().splitlines(keepends=True)
        if "KV Cache is allocated" not in line
    )
    if tokens is not None:
        assert "max_total_num_tokens=423395" in text
        text = text.replace("max_total_num_tokens=423395", f"max_total_num_tokens={tokens}")
    path = tmp_path / "pasted.log"
    path.write_text(text)
    return path


def test_sglang_log_with_its_token_count_alone_is_not_checked_against_itself(tmp_path):
    # F1: without SGLang's "KV Cache is allocated" line the log's only KV figure is max_total_num_tokens; kvplan
    # turned it into memory with its own bytes per token and back into tokens, and printed "matches" for any count
    r = run_cli("check-log", str(_without_kv_line(tmp_path)), "-g", "H100", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["arithmetic"] == []  # nothing of the log's own to put through kvplan's arithmetic
    rows = _rows(r, "rows")
    assert rows["KV cache memory"]["cause"].startswith("the log prints no KV memory")
    assert rows["KV cache tokens"]["log"] == 423_395 and rows["KV cache tokens"]["cause"] == "matches"
    edited = run_cli("check-log", str(_without_kv_line(tmp_path, 1000)), "-g", "H100", "--json")
    tokens = _rows(edited, "rows")["KV cache tokens"]
    assert tokens["log"] == 1000 and tokens["difference"] > 100
    assert tokens["cause"].startswith("kvplan's pool differs")
    assert edited.json()["arithmetic"] == []


def test_azure_times_without_a_zone_do_not_depend_on_the_machines_zone(tmp_path, monkeypatch):
    # X3: zone-less timestamps were read in local time: across a daylight-saving change a 20-minute trace took
    # 80 minutes (TZ=America/New_York), and one the clocks go forward in was refused as unsorted
    import datetime
    import time

    from kvplan.simulator import read_trace

    path = tmp_path / "dst.csv"
    t = datetime.datetime(2023, 11, 5, 1, 50)
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for _ in range(121):  # 01:50 to 2:10 local on the night the US clocks went back, 10 s apart
        rows.append(f"{t.strftime('%Y-%m-%d %H:%M:%S.%f')}0,500,50")
        t += datetime.timedelta(seconds=10)
    path.write_text("\n".join(rows) + "\n")
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        w = read_trace(path)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    times = [r.arrival_s for r in w.requests]
    assert times[-1] - times[0] == 1200.0
    assert all(b - a == 10.0 for a, b in zip(times, times[1:], strict=False))


def test_burstiness_whose_gaps_underflow_is_refused_not_hung():
    # X6: --burstiness 1e-4 drew gaps that underflowed: send times of NaN, and the loop never advanced (a hang)
    from kvplan.errors import UsageError
    from kvplan.simulator import synthetic

    for b in (1e-6, 1e-4):
        with pytest.raises(UsageError, match=r"--burstiness .*underflow to 0; give 0\.01 or more"):
            synthetic(num_prompts=5, request_rate=4.0, burstiness=b, seed=37)
    w = synthetic(num_prompts=50, request_rate=4.0, burstiness=0.05, seed=1)
    assert w.requests[-1].arrival_s == pytest.approx(50 / 4.0)  # the last send at n / rate, as vLLM scales it


def test_length_histogram_reads_every_data_row_and_refuses_weights_that_overflow(tmp_path):
    # X8: a first row starting '+2048' or '-5' was taken for a header and dropped without a word; weights whose sum
    # overflows raised a traceback from random.choices
    plus = tmp_path / "plus.csv"
    plus.write_text("+2048,512,1\n1024,128,1\n")
    d = run_cli("simulate", "-m", "llama3-8b", "--max-model-len", "8K", "--num-prompts", "400", "--request-rate", "5",
                "--length-histogram", str(plus), "--json").json()  # fmt: skip
    assert 1400 < d["workload"]["input_tokens_mean"] < 1700  # both rows drawn, about half each
    neg = tmp_path / "neg.csv"
    neg.write_text("-5,128,1\n1024,128,1\n")
    r = run_cli("simulate", "-m", "llama3-8b", "--length-histogram", str(neg), "--num-prompts", "10")
    assert r.exit_code == 2 and r.stderr.strip() == f"error: {neg}:1: lengths must be 1 to 16,777,216 tokens"
    header = tmp_path / "header.csv"
    header.write_text("input_len,output_len,weight\n1024,128,1\n")
    d = run_cli("simulate", "-m", "llama3-8b", "--length-histogram", str(header), "--num-prompts", "10",
                "--json").json()  # fmt: skip
    assert d["workload"]["input_tokens_mean"] == 1024
    huge = tmp_path / "huge.csv"
    huge.write_text("1024,128,1e308\n2048,256,1e308\n")
    r = run_cli(
        "simulate", "-m", "llama3-8b", "--length-histogram", str(huge), "--num-prompts", "10", "--json"
    )
    assert r.exit_code == 2 and "the weights add up past the largest number; scale them down" in r.stderr
    assert "Traceback" not in r.stderr


def test_solve_refuses_a_workload_the_engine_turns_away_in_its_own_words(tmp_path):
    # X5: one request over --max-model-len made every run 'fail', and solve advised more GPUs or looser targets
    # while printing latencies that met them
    path = tmp_path / "one_long.csv"
    rows = [f"2024-05-10 00:{i // 60:02d}:{i % 60:02d},{9000 if i == 7 else 1000},100" for i in range(200)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    # llama3-8b's own context is 8,192 (fuzz 28 S8: a --max-model-len above it is no remedy)
    want = ("error: 1 of the workload's 200 requests need more than 8,192 tokens (prompt + output, the longest "
            "9,100), which the engine refuses whatever the GPUs: llama3-8b's context is 8,192 tokens, so no GPUs "
            "serve them with this model: leave them out of the workload, or plan a model with a longer context")  # fmt: skip
    longer = run_cli("solve", "-m", "llama3.1-8b", "--max-model-len", "8K", "--ttft-ms", "500", "--tpot-ms", "30",
                     "--trace", str(path), "--request-rate", "5")  # fmt: skip
    assert longer.exit_code == 2 and longer.stderr.strip().endswith(
        "the engine refuses whatever the GPUs: give --max-model-len 9100 or more, or leave them out of the workload"
    )
    for mode in (
        ("--request-rate", "5"),
        ("--max-rate", "-g", "8xH100"),
        ("--request-rate", "5", "--disaggregated"),
    ):
        r = run_cli("solve", "-m", "llama3-8b", "--max-model-len", "8K", "--ttft-ms", "500", "--tpot-ms", "30",
                    "--trace", str(path), *mode)  # fmt: skip
        assert r.exit_code == 2 and r.stderr.strip() == want, mode
    one = tmp_path / "one.csv"
    one.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00,1000,100\n")
    r = run_cli("solve", "-m", "llama3-8b", "--max-model-len", "8K", "--ttft-ms", "500", "--tpot-ms", "30",
                "--trace", str(one), "--request-rate", "5")  # fmt: skip
    assert r.exit_code == 2
    assert r.stderr.startswith("error: the workload sends its one request at t = 0 (Azure LLM trace one.csv: 1 "
                               "request at its timestamp)")  # fmt: skip


def test_max_rate_on_a_workload_too_short_to_load_the_gpus_says_so():
    # X4: 5 requests sent at once drain in ~1.7 s, so their "throughput" (2.95 requests/s) was answered as the
    # GPU's capacity, "a higher rate only queues", where 1,000 requests meet the targets at 17 requests/s
    r = run_cli("solve", "-m", "llama3-8b", "--max-model-len", "8K", "--max-rate", "-g", "1xH100", "--ttft-ms", "500",
                "--tpot-ms", "30", "--num-prompts", "5", "--input-len", "1000", "--output-len", "200",
                "--kv-cache-dtype", "auto")  # fmt: skip
    assert r.exit_code == 3
    assert (
        "every rate meets the targets on H100-SXM TP 1 x PP 1, KV auto: all 5 of the workload's requests"
        in r.stderr
    )
    assert "give --num-prompts 1000 or more" in r.stderr


def test_dealt_replica_gets_every_request_once_at_its_own_slot():
    # X7: a replica of N was given the workload's requests in their own order at the stream's every N-th time, so a
    # trace's lengths and prefixes left the times they were sent at; now request s of the cycled stream at slot s
    from kvplan.search.rate import ScaledWorkload
    from kvplan.simulator.request import RequestSpec
    from kvplan.simulator.workload import Workload

    for n, replicas in ((10, 3), (10, 2), (12, 8), (7, 7)):
        w = Workload(tuple(RequestSpec(float(i), 100 + i, 5) for i in range(n)), None, "t")
        got = [r.prompt_tokens - 100 for r in ScaledWorkload(w).dealt(1.0, replicas).requests]
        assert sorted(got) == list(range(n)), (n, replicas)
    w = Workload(tuple(RequestSpec(float(i), 100 + i, 5) for i in range(10)), None, "t")
    # 10 requests 1 s apart, 3 replicas: this one takes stream positions 2, 5, 8, 11 (= request 1 of the 2nd cycle)
    assert [r.prompt_tokens - 100 for r in ScaledWorkload(w).dealt(1.0, 3).requests][:4] == [2, 5, 8, 1]


def test_simulate_says_an_int4_kv_cache_is_a_what_if():
    # X10: estimate said vLLM has no int4 KV cache; simulate planned it without a word
    d = run_cli("simulate", "-m", "llama3-70b", "--max-model-len", "8K", "-g", "2xH100", "-tp", "2",
                "--kv-cache-dtype", "int4", "--num-prompts", "20", "--json").json()  # fmt: skip
    assert "vLLM 0.33 has no int4 KV cache; kvplan's figures are a what-if" in d["assumptions"]


def test_disaggregated_colocated_line_names_dp_attention():
    # X9: the colocated answer (8x H200, DP attention 8) was printed as "(TP 8 x PP 1 x DP 1)"
    args = ("solve", "-m", "deepseek-v3", "--max-model-len", "8K", "--request-rate", "20", "--ttft-ms", "2000",
            "--tpot-ms", "60", "--engine", "sglang", "-g", "H200", "--num-prompts", "400", "--disaggregated")  # fmt: skip
    a = run_cli(*args, "--json").json()["colocated"]["answer"]
    assert a["attention_dp_size"] > 1
    text = " ".join(run_cli(*args).stdout.split())
    want = (f"colocated (solve --request-rate): {a['num_gpus']}x H200 (TP {a['tensor_parallel_size']} x PP 1 x DP "
            f"{a['data_parallel_size']}, DPA {a['attention_dp_size']})")  # fmt: skip
    assert want in text


def test_compare_table_header_is_the_context_asked_for_and_a_capped_first_model_is_said():
    # F2 (fuzz 19b): the header took the first row's context, so with llama3-8b (8K maximum) first a 32K table
    # said "8,192 tokens per request" while the 70B row was at 32K, and the cap note never fired
    for models in ("llama3-8b,llama3.1-70b", "llama3.1-70b,llama3-8b"):
        d = run_cli("compare", "table", "--models", models, "--max-model-len", "32K", "--json").json()
        assert d["cluster"]["max_model_len"] == 32768
        ctx = {r["model"]: r["max_model_len"] for r in d["rows"]}
        assert ctx == {"llama3-8b": 8192, "llama3.1-70b": 32768}
        assert "llama3-8b: context capped at its maximum, 8,192 tokens" in d["notes"]


def test_check_log_on_too_small_a_gpu_names_the_gpu_not_a_flag_never_given():
    # F4 (fuzz 19b): the 2x H200 log checked with --gpus H100 blamed "--kv-cache-memory", which the user never gave
    r = run_cli("check-log", str(LOGS / "vllm_v033_llama3_70b_tp2_h200.log"), "--gpus", "H100")
    assert r.exit_code == 2 and "--kv-cache-memory" not in r.stderr
    assert r.stderr.strip().endswith("exceed H100-SXM's 79.19 GiB: pass the GPU the log ran on (--gpus)")


def test_check_log_never_promises_to_keep_a_non_kv_figure_it_will_not(tmp_path):
    # F5 (fuzz 19b): on the wrong GPU, or with a negative figure (-16.58 GiB), the row still said
    # "--save-calibration keeps the log's" and --json carried the negative figure as measured
    wrong = run_cli("check-log", str(LOGS / "vllm_v07_llama2_7b_l40s.log"), "--gpus", "H100", "--json").json()
    assert wrong["measured_reserve_bytes"] is None
    assert _rows_of(wrong)["non-KV memory"]["cause"] == "not kept (see the notes)"
    edited = tmp_path / "util050.log"
    text = (LOGS / "vllm_v07_llama2_7b_l40s.log").read_text()
    assert "gpu_memory_utilization (0.90)" in text
    edited.write_text(text.replace("gpu_memory_utilization (0.90)", "gpu_memory_utilization (0.50)"))
    neg = run_cli("check-log", str(edited), "--gpus", "L40S", "--json").json()
    row = _rows_of(neg)["non-KV memory"]
    assert (
        row["log"] < 0
        and row["cause"] == "not kept (see the notes)"
        and neg["measured_reserve_bytes"] is None
    )
    assert any(n.startswith("the log's KV memory exceeds what kvplan's budget leaves") for n in neg["notes"])


def _rows_of(d: dict) -> dict[str, dict]:
    return {r["quantity"]: r for r in d["rows"]}


def test_check_log_refuses_another_engines_flag_without_advising_engine():
    # F9 (fuzz 19b): "add --engine sglang", an option check-log does not have
    r = run_cli(
        "check-log", str(LOGS / "vllm_v011_llama31_8b_h100.log"), "-g", "H100", "--mem-fraction-static", "0.5"
    )
    assert r.exit_code == 2
    assert r.stderr.strip() == "error: --mem-fraction-static is SGLang's flag and this is a vLLM log; drop it"


def test_check_log_says_when_a_log_names_two_releases(tmp_path):
    # F8 (fuzz 19b): an API-server line of 0.33.0 before an engine line of v0.11.0 was read by 0.33's rules silently
    path = tmp_path / "spliced.log"
    path.write_text(
        (LOGS / "vllm_v011_llama31_8b_h100.log").read_text().replace("version 0.11.0", "version 0.33.0")
    )
    d = run_cli("check-log", str(path), "-g", "H100", "--json").json()
    assert any(n.startswith("the log names vLLM 0.33.0 and then 0.11.0") for n in d["notes"])
    plain = run_cli("check-log", str(LOGS / "vllm_v011_llama31_8b_h100.log"), "-g", "H100", "--json").json()
    assert not any("and then" in n for n in plain["notes"])


def test_solve_kv_dtype_any_in_a_list_is_refused_for_what_it_is():
    # F10 (fuzz 19b): 'any,int3' was refused for 'any', and 'any,fp8' with advice to use 'any'
    for value in ("any,int3", "any,fp8"):
        r = run_cli(
            "solve", "-m", "llama3-8b", "--users", "10", "--max-model-len", "8K", "--kv-cache-dtype", value
        )
        assert r.exit_code == 2
        assert r.stderr.strip() == (
            f"error: --kv-cache-dtype '{value}': 'any' already means every dtype the engines serve (auto, fp8); "
            "give it alone, or name the dtypes"
        )


HF = REPO / "tests" / "fixtures" / "hf" / "corpus"


def _edited_config(tmp_path, name: str, **fields) -> str:
    import json

    cfg = json.loads((HF / name).read_text())
    cfg.update(fields)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_longrope_model_starts_at_vllms_default_not_the_long_factors_reach(tmp_path):
    # fuzz 20b F1: a LongRoPE config (Phi-3.5 / Phi-4-mini: max_position_embeddings 131,072, original 4,096) was
    # planned at 131,072 where vLLM 0.12+ starts at 4,096 when no --max-model-len is given
    head = 5120 // 40
    path = _edited_config(
        tmp_path, "phi-4.json", max_position_embeddings=131072, original_max_position_embeddings=4096,
        rope_scaling={"type": "longrope", "long_factor": [1.5] * (head // 2), "short_factor": [1.0] * (head // 2)},
    )  # fmt: skip
    d = run_cli("estimate", "-m", path, "-g", "H100", "--json").json()
    assert d["settings"]["max_model_len"] == 4096 and d["model"]["max_context"] == 131072
    assert any(
        a.startswith("--max-model-len 4,096: vLLM's default for a LongRoPE model") for a in d["assumptions"]
    )
    assert "Maximum concurrency for 4,096 tokens per request" in d["engine"]["log_lines"][1]
    # vLLM 0.11.0 predates the default (PR #27431); a length given is kept; SGLang serves the model's maximum
    assert (
        run_cli("estimate", "-m", path, "-g", "H100", "--engine-version", "0.11", "--json").json()[
            "settings"
        ]["max_model_len"]
        == 131072
    )
    for extra in (("--max-model-len", "131072"), ("--engine", "sglang")):
        assert (
            run_cli("estimate", "-m", path, "-g", "H100", *extra, "--json").json()["settings"][
                "max_model_len"
            ]
            == 131072
        ), extra


def test_sglang_plans_its_own_context_for_a_yarn_block_it_does_not_scale(tmp_path):
    # fuzz 20b F3: Qwen's documented YaRN block on Qwen2.5: vLLM derives 32,768 x 4 = 131,072, SGLang 0.5.2's
    # get_context_length leaves a block naming original_max_position_embeddings unscaled, 32,768; the SGLang plan
    # (and solve's --context-length) took vLLM's
    path = _edited_config(
        tmp_path, "qwen2.5-7b.json", max_position_embeddings=32768,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    )  # fmt: skip
    sglang = run_cli("estimate", "-m", path, "-g", "H100", "--engine", "sglang", "--json").json()
    assert sglang["settings"]["max_model_len"] == 32768
    assert any(
        a.startswith("--max-model-len 32,768: SGLang's default for this model") for a in sglang["assumptions"]
    )
    vllm = run_cli("estimate", "-m", path, "-g", "H100", "--json").json()
    assert vllm["settings"]["max_model_len"] == 131072
    longer = run_cli("estimate", "-m", path, "-g", "H100", "--engine", "sglang", "--max-model-len", "131072",
                     "--json").json()  # fmt: skip
    assert any("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in a for a in longer["assumptions"])


def test_compare_keeps_every_column_and_its_note_at_80_columns():
    # fuzz 20b F4: "KV read/step: ..." stayed though both KV read/step columns were left out at 80 columns; the
    # columns now stack below the table at 80 columns, so both and their note are shown
    from typer.testing import CliRunner

    from kvplan.cli import app

    runner = CliRunner(env={"COLUMNS": "80", "NO_COLOR": "1"})
    both = runner.invoke(
        app, ["compare", "table", "-m", f"llama3-70b,{HF / 'llama-2-13b.json'}", "--max-model-len", "32K"]
    )
    assert both.exit_code == 0 and "(continued)" in both.stdout
    assert "1 req" in both.stdout and "all" in both.stdout  # the two KV read/step headers, wrapped
    assert "- KV read/step:" in both.stdout


def test_max_concurrency_not_divisible_by_the_schedulers_keeps_c_in_flight():
    # fuzz 20a F1: requests were dealt evenly but the C slots unevenly, so at C = 15 on -dp 8 seven schedulers
    # drained early and one request was in flight for half the run (8.0 requests/s, below one H100's 10.0)
    def run(n_gpus: int, cap: int) -> dict:
        return run_cli("simulate", "-m", "llama3-8b", "-g", f"{n_gpus}xH100", "-tp", "1", "-dp", str(n_gpus),
                       "--num-prompts", "400", "--max-concurrency", str(cap), "--json").json()  # fmt: skip

    for cap in (9, 15):
        d = run(8, cap)
        in_flight = d["request_throughput"] * d["e2el_ms"]["mean"] / 1e3  # Little's law
        assert cap - 1 < in_flight <= cap + 0.01, (cap, in_flight)
    assert run(8, 15)["request_throughput"] > run(1, 15)["request_throughput"]


def test_idle_attention_dp_ranks_add_no_tokens_to_the_busy_ranks_steps():
    # fuzz 20a F2: with one request in flight on 8 DP-attention ranks, its step was timed as if all 8 ranks held a
    # batch like its own (TPOT 15.14 ms at C = 1, 2 and 8 alike)
    def tpot(cap: int) -> float:
        return run_cli("simulate", "-m", "deepseek-v3", "-g", "8xH200", "--engine", "sglang", "-tp", "8",
                       "--enable-dp-attention", "--dp-size", "8", "--max-model-len", "8K", "--num-prompts", "40",
                       "--max-concurrency", str(cap), "--json").json()["tpot_ms"]["median"]  # fmt: skip

    one, two, eight = tpot(1), tpot(2), tpot(8)
    assert one < two < eight


def test_disaggregated_colocated_answer_is_solves_own(tmp_path):
    # fuzz 20a F3: the colocated search reused the pools' query narrowed to the decode pool's KV dtype, so it
    # answered 16 GPUs where solve --request-rate answers 8 (fp8 KV)
    args = ("-m", "llama3-8b", "--request-rate", "60", "--ttft-ms", "300", "--tpot-ms", "20", "--input-len", "2048",
            "--output-len", "256", "--max-model-len", "8K")  # fmt: skip
    alone = run_cli("solve", *args, "--json").json()["answer"]
    both = run_cli("solve", *args, "--disaggregated", "--json").json()["colocated"]["answer"]
    assert (both["num_gpus"], both["kv_cache_dtype"]) == (alone["num_gpus"], alone["kv_cache_dtype"])


def test_solve_says_when_whole_nodes_not_the_targets_set_the_size():
    # fuzz 20a F4: 8 GPUs for 1 request/s "limited by the targets", where one GPU meets them and whole nodes set 8
    base = ("solve", "-m", "llama3-8b", "--max-model-len", "8K", "--request-rate", "1", "--ttft-ms", "500",
            "--tpot-ms", "30", "--num-prompts", "100", "--json")  # fmt: skip
    whole = run_cli(*base).json()
    assert whole["answer"]["num_gpus"] == 8
    assert whole["limited_by"].startswith(
        "whole nodes: 8 GPUs is this layout's smallest rental (1 a replica)"
    )
    part = run_cli(*base, "--partial-nodes").json()
    assert part["answer"]["num_gpus"] == 1
    assert part["limited_by"] == "the smallest deployment of this layout: one replica meets the targets"


def test_solve_messages_about_one_request_say_one():
    # fuzz 20a F5: "all 1 of the workload's requests sent at once"
    r = run_cli("solve", "-m", "llama3-8b", "--max-model-len", "8K", "--max-rate", "-g", "1xH100", "--ttft-ms", "500",
                "--tpot-ms", "30", "--num-prompts", "1", "--kv-cache-dtype", "auto")  # fmt: skip
    assert r.exit_code == 3 and "the workload's one request sent at once still reaches TTFT" in r.stderr
    assert "all 1 of" not in r.stderr


def test_max_context_is_the_smallest_length_key_unless_model_max_length_names_it(tmp_path):
    # fuzz 20b F5: kvplan read the first of four keys; vLLM takes the smallest of nine (vllm/config.py v0.11.0
    # _get_and_verify_max_len) and then a config's model_max_length (Command-R / Cohere)
    seq = _edited_config(tmp_path, "llama-2-13b.json", max_position_embeddings=4096, seq_length=2048)
    d = run_cli("estimate", "-m", seq, "-g", "H100", "--json").json()
    assert d["model"]["max_context"] == 2048
    assert any(a.startswith("max context 2,048 from seq_length (the smallest") for a in d["assumptions"])
    cohere = _edited_config(
        tmp_path, "llama-2-13b.json", max_position_embeddings=8192, model_max_length=131072
    )
    assert (
        run_cli("estimate", "-m", cohere, "-g", "8xH100", "--json").json()["model"]["max_context"] == 131072
    )
    plain = run_cli("estimate", "-m", str(HF / "llama-2-13b.json"), "-g", "H100", "--json").json()
    assert plain["model"]["max_context"] == 4096 and not any(
        a.startswith("max context") for a in plain["assumptions"]
    )


def test_mllama_prefill_charges_causal_attention_in_its_self_attention_layers_only():
    # fuzz 20b F6: Llama 3.2 Vision's 8 cross-attention layers (attending to the image, skipped without one) were
    # charged as causal self-attention over the prompt: 40 layers, 44.45 ms where its 32 self-attention layers
    # take 35.56 ms (an 8,192-token prompt on one H100, at the assumed 50% of the bf16 peak)
    d = run_cli("estimate", "-m", str(HF / "llama-3.2-11b-vision.json"), "--engine-version", "0.10",
                "--max-model-len", "8K", "--json").json()  # fmt: skip
    assert d["prefill"]["work"]["attention_layers"] == 32
    want = 4 * 8192 * 4096 * 32 * 4096 / (989.4e12 * 0.5) * 1e3  # 4 x T x T/2 x layers x width at 50% of peak
    assert d["prefill"]["terms"]["attention_ms"] == pytest.approx(want)


def test_qwen_moe_config_with_no_experts_is_the_dense_model_vllm_builds(tmp_path):
    # fuzz 20b F7: 'num_experts: must be >= 1, got 0', where vLLM's qwen3_moe.py builds Qwen3MoeMLP at
    # intermediate_size in every layer (`config.num_experts > 0` fails): 48 x (attention + 3 x 2,048 x 6,144) + the
    # untied embedding and head
    path = _edited_config(tmp_path, "qwen3-30b-a3b.json", num_experts=0)
    d = run_cli("estimate", "-m", path, "-g", "H100", "--max-model-len", "8K", "--json").json()
    # q, k, v, o (kvplan leaves out the 2 x 128 q/k norm weights a layer)
    attention = 2048 * (32 * 128) + 2 * 2048 * (4 * 128) + (32 * 128) * 2048
    layer = attention + 3 * 2048 * 6144 + 2 * 2048  # + the two RMS norms
    assert d["params_total"] == 48 * layer + 2 * 151936 * 2048 + 2048


def test_kv_usage_over_time_spans_the_whole_run_of_every_scheduler(tmp_path):
    # fuzz 20a F6: the KV chart and mean covered the busiest scheduler's own span, not the run's: on -dp 2, a long
    # prompt at 0 s (scheduler 1, the busiest) and a short one at 30 s (scheduler 2) charted 0-1 s of a 30 s run
    trace = tmp_path / "two.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00,7000,10\n"
                     "2024-05-10 00:00:30,100,10\n")  # fmt: skip
    d = run_cli("simulate", "-m", "llama3-8b", "-g", "2xH100", "-tp", "1", "-dp", "2", "--max-model-len", "8K",
                "--trace", str(trace), "--json").json()  # fmt: skip
    assert d["completed"] == 2 and d["duration_s"] > 30
    assert d["kv_usage"]["series"][-1]["t_s"] >= d["duration_s"] - 1e-9
    # the mean is over the whole run: the long prompt's blocks held for about a second of 30
    assert d["kv_usage"]["mean"] < d["kv_usage"]["peak"] / 10
