"""Session 14 hardening: fuzz pass 16's findings (disaggregated pools, file names, flag conflicts), each test
failing on the code before."""

from __future__ import annotations

import re

import pytest

from tests.helpers import REPO, run_cli

REAL = REPO / "tests" / "fixtures" / "logs" / "real"

DISAGG = ("-m", "llama3-70b", "--max-model-len", "8K", "--disaggregated", "--input-len", "2K", "--output-len", "256",
          "--prefill-gpus", "4xH100", "--decode-gpus", "8xH100", "-tp", "2", "--json")  # fmt: skip


def test_estimate_disaggregated_times_the_decode_pool_at_its_speculative_step():
    # U2: the decode pool's step and rate ignored --speculative-config: 36.73 ms and 4.68 req/s, decode binding,
    # where kvplan's own speculative step (verify 37.05 ms / 3 kept) is 12.35 ms a token and 13.92 req/s
    plain = run_cli("estimate", *DISAGG).json()["disaggregated"]
    spec = run_cli("estimate", *DISAGG, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}',
                   "--acceptance-length", "3").json()["disaggregated"]  # fmt: skip
    assert plain["decode"]["speculative"] is None and spec["decode"]["speculative"].startswith("ngram")
    assert spec["decode"]["step_ms"] == pytest.approx(plain["decode"]["step_ms"] / 3, rel=0.02)
    assert spec["decode"]["requests_per_s"] == pytest.approx(13.92, abs=0.05)
    assert plain["binding_pool"] == "decode" and spec["binding_pool"] == "prefill"


def test_solve_disaggregated_keeps_one_kv_dtype_across_the_pools():
    # U1: a KV-auto prefill pool was paired with an fp8 decode pool (vLLM's NixlConnector refuses peers whose cache
    # dtype differs), where the same 16 GPUs hold an auto decode pool (TP 4 x DP 2) within the target
    r = run_cli("solve", "-m", "llama3-70b", "--max-model-len", "8K", "--request-rate", "8", "--ttft-ms", "1000",
                "--tpot-ms", "50", "--input-len", "2048", "--output-len", "256", "--disaggregated", "--json")  # fmt: skip
    d = r.json()
    assert d["prefill"]["answer"]["kv_cache_dtype"] == d["decode"]["kv_cache_dtype"] == "auto"
    assert (d["decode"]["tensor_parallel_size"], d["decode"]["data_parallel_size"]) == (4, 2)
    assert d["num_gpus"] == 16


@pytest.mark.parametrize(("max_gpus", "answer"), [("2", 2), ("8", None), ("9", None), ("16", 16)])
def test_solve_disaggregated_applies_the_node_rule_to_both_pools(max_gpus, answer):
    # U7: --max-gpus 9 answered a 1-GPU prefill pool beside an 8-GPU decode node, although partial nodes were not
    # asked for (the pool's own share below a node turned them on for it alone)
    r = run_cli("solve", "-m", "llama3-8b", "--max-model-len", "8K", "--request-rate", "4", "--ttft-ms", "1000",
                "--tpot-ms", "50", "--input-len", "2048", "--output-len", "256", "--disaggregated", "--num-prompts",
                "300", "--max-gpus", max_gpus)  # fmt: skip
    if answer is None:
        assert r.exit_code == 3 and "whole nodes; --partial-nodes" in r.stderr
    else:
        assert r.exit_code == 0 and r.stdout.count(f"{answer} GPUs") >= 1


def test_a_pool_flag_without_disaggregated_is_named_not_gpus():
    # U4: '--decode-tp 4 -g 8xH100' said '--gpus: with --disaggregated ...' although --disaggregated was not given
    r = run_cli("estimate", "-m", "llama3-70b", "--max-model-len", "8K", "--decode-tp", "4", "-g", "8xH100")
    assert r.exit_code == 2 and "--decode-tp needs --disaggregated" in r.stderr


def test_a_file_name_over_255_bytes_is_one_line(tmp_path):
    # U6: ENAMETOOLONG from Path.exists() was a traceback for --plot, compare plot --output, --trace and check-log
    long = str(tmp_path / ("x" * 300))
    sim = ("simulate", "-m", "llama3-8b", "--max-model-len", "8K")
    for args in (
        (*sim, "--num-prompts", "5", "--plot", long + ".png"),
        (*sim, "--trace", long + ".jsonl"),
        ("check-log", long + ".log", "-g", "H100"),
        ("compare", "plot", "--output", long + ".png"),
    ):
        r = run_cli(*args)
        assert r.exit_code == 2 and "too long" in r.stderr and "Traceback" not in r.stderr + r.stdout, args


def test_length_histogram_refuses_the_length_flags_it_replaces(tmp_path):
    # U8: --input-len, --output-len and --range-ratio were dropped without a word beside --length-histogram
    hist = tmp_path / "h.csv"
    hist.write_text("input_len,output_len,weight\n100,10,1\n")
    r = run_cli("simulate", "-m", "llama3-8b", "--max-model-len", "8K", "--length-histogram", str(hist),
                "--input-len", "500", "--range-ratio", "0.5", "--num-prompts", "5")  # fmt: skip
    assert r.exit_code == 2 and "--input-len, --range-ratio does not apply" in r.stderr


def test_disaggregated_link_rows_under_dp_attention_say_what_they_hold():
    # U3: the link row said 'x 8 GPU(s)' for one GPU's 50 GB/s, the sustain row '1 replica(s) / transfer' for 8 ranks'
    args = ("estimate", "-m", "deepseek-v3", "--max-model-len", "32K", "--disaggregated", "--input-len", "4K",
            "--output-len", "512", "--prefill-gpus", "8xH200", "--decode-gpus", "8xH200", "--engine", "sglang",
            "--enable-dp-attention", "--dp-size", "8", "-tp", "8")  # fmt: skip
    d = run_cli(*args, "--json").json()["disaggregated"]
    assert (d["link_gpus"], d["attention_ranks"]) == (1, 8)
    assert d["link_bytes_per_s"] == pytest.approx(50e9)  # one GPU's 400G link
    assert d["transfer_requests_per_s"] == pytest.approx(8 / (d["transfer_ms"] / 1e3))
    text = " ".join(run_cli(*args).stdout.split())
    assert "x 1 GPU(s) of a prefill replica's attention-DP rank" in text
    assert "1 replica(s) x 8 attention-DP ranks / transfer" in text


def test_solve_by_rate_deals_requests_to_a_replica_as_simulate_does():
    # U5: solve fed one of 2 replicas its own Poisson stream at R / 2 (TTFT p90 103.2 ms) where simulate -dp 2 deals
    # it every 2nd request of one stream at R (67.7 ms), more regular arrivals; now solve deals them the same way
    solve = run_cli("solve", "-m", "llama3-8b", "--max-model-len", "8K", "--request-rate", "20", "--ttft-ms", "500",
                    "--tpot-ms", "30", "--partial-nodes", "--json").json()  # fmt: skip
    assert solve["answer"]["data_parallel_size"] == 2
    sim = run_cli("simulate", "-m", "llama3-8b", "--max-model-len", "8K", "-g", "2xH100", "-tp", "1", "-dp", "2",
                  "--request-rate", "20", "--json").json()  # fmt: skip
    assert solve["ttft_ms"]["p90"] == pytest.approx(sim["ttft_ms"]["p90"], rel=0.05)
    assert solve["tpot_ms"]["p90"] == pytest.approx(sim["tpot_ms"]["p90"], rel=0.05)
    assert "every 2nd request of a stream at 20 requests/s" in solve["workload"]["description"]


def test_dealt_workload_arrivals_are_every_nth_of_the_stream():
    from kvplan.search.rate import ScaledWorkload
    from kvplan.simulator.request import RequestSpec
    from kvplan.simulator.workload import Workload

    base = Workload(
        tuple(RequestSpec(float(t), 10, 5) for t in (1, 2, 4, 7)), None, "four"
    )  # gaps 1, 1, 2, 3
    w = ScaledWorkload(base)  # base rate 4 / 7 s
    one = w.dealt(base.requests.__len__() / 7, 1)
    assert [r.arrival_s for r in one.requests] == [1, 2, 4, 7]
    two = w.dealt(
        4 / 7, 2
    )  # the same stream, every 2nd: stream arrivals 1, 2, 4, 7, 8, 9, 11, 14 -> 1, 4, 8, 11
    assert [r.arrival_s for r in two.requests] == pytest.approx([2, 7, 9, 14])


# --- fuzz pass 17 ------------------------------------------------------------------------------------------


def test_sglang_speculative_log_keeps_the_draft_free_memory_apart():
    # V4: the draft's later "Load weight begin. avail mem" was read as the free memory at startup (125.79 GiB "in use"
    # on a NEXTN log, and a wrong-GPU note); the target's line is the startup's
    from kvplan.logs.logparse import parse

    text = (REAL / "sglang_unknownver_llama-3.1-8b-instruct_unknowngpu_tp1_eagle3.log").read_text()
    f = parse(text.replace("speculative_algorithm='EAGLE3'", "speculative_algorithm='NEXTN'")).facts
    assert f["free_at_start_bytes"] == round(78.58 * 2**30)
    assert f["draft_free_at_start_bytes"] == round(60.11 * 2**30)


@pytest.mark.parametrize(
    ("flags", "refused"),
    [
        # fused_moe/layer.py: under EPLB the experts divide evenly over the EP ranks; 256 + 3 over 8 do not
        (("deepseek-v3", "--num-redundant-experts", "3"), "do not divide over EP 8"),
        # quantization/mxfp4.py: 'EPLB is not supported for mxfp4'
        (("gpt-oss-120b",), "MXFP4 experts do not run under EPLB"),
    ],
)
def test_vllm_eplb_refuses_what_vllm_refuses(flags, refused):
    r = run_cli("estimate", "-m", flags[0], "-g", "8xH200", "--max-model-len", "8K", "--enable-expert-parallel",
                "--enable-eplb", *flags[1:])  # fmt: skip
    assert r.exit_code == 2 and refused in r.stderr


def test_vllm_moe_replicas_are_launched_as_separate_servers():
    # V2: plain TP replicas of an MoE model were printed as one `--data-parallel-size N` line, which makes vLLM slice
    # every expert over TP x DP (fused_moe/config.py FusedMoEParallelConfig.make): not the layout planned
    r = run_cli(
        "solve", "-m", "gpt-oss-120b", "--max-model-len", "8K", "--users", "900", "-g", "H100", "--json"
    )
    lines = [a["vllm_flags"] for a in r.json()["answers"] if a["data_parallel_size"] > 1 and a["vllm_flags"]]
    assert lines and all("--data-parallel-size" not in v.split("#")[0] and "# run " in v for v in lines)
    dense = run_cli(
        "solve", "-m", "llama3-8b", "--max-model-len", "8K", "--users", "2000", "-g", "H100", "--json"
    )
    assert any(
        "--data-parallel-size" in a["vllm_flags"]
        for a in dense.json()["answers"]
        if a["data_parallel_size"] > 1
    )


def test_solve_disaggregated_no_answer_names_the_users_targets_and_budget():
    # V1: the message printed the prefill search's internal targets ('3000 / 1e+08 ms'), 'TPOT p90 0.0 ms' and a
    # '--max-gpus 8' the user never set, and blamed the TTFT where the decode pool's TPOT took the GPUs
    r = run_cli("solve", "-m", "deepseek-v3", "--max-model-len", "32K", "--request-rate", "8", "--ttft-ms", "3000",
                "--tpot-ms", "32", "--input-len", "16K", "--output-len", "1024", "--disaggregated", "--engine", "vllm",
                "-g", "H200", "--num-prompts", "200")  # fmt: skip
    assert r.exit_code == 3
    assert "the decode pool within --tpot-ms 32 takes 56 H200, leaving 8 of --max-gpus 64" in r.stderr
    assert "1e+08" not in r.stderr and "TPOT p90 0.0" not in r.stderr


def test_dealt_trace_wraps_round_at_its_own_spacing_not_into_the_first_burst():
    # V5: a trace starting at 0 wrapped with a gap of 0, merging its last burst into its first
    from kvplan.search.rate import ScaledWorkload
    from kvplan.simulator.request import RequestSpec
    from kvplan.simulator.workload import Workload

    bursts = Workload(
        tuple(RequestSpec(float(t), 10, 5) for t in (0, 0, 2, 2)), None, "two bursts"
    )  # 2 s apart
    got = [r.arrival_s for r in ScaledWorkload(bursts).dealt(2.0, 2).requests]
    # the stream cycles the trace with its 2 s spacing at the wrap, the cycle (4 requests in 4 s) rescaled to 2
    # requests/s: 1, 1, 2, 2, 3, 3, 4, 4; this replica takes every 2nd, one per burst, not two bursts merged
    assert got == pytest.approx([1, 2, 3, 4])


def test_max_rate_on_a_bursty_trace_no_rate_meets_is_exit_3(tmp_path):
    # V7: bursts of 20 simultaneous ~3K-token prompts miss TTFT p90 500 ms at any rate (a rescaled trace keeps its
    # bursts); the bisection ran the rate down until the sends spanned 62 days and stopped on the simulator's bound
    # with a usage error (exit 2) telling a --max-rate user to pass --request-rate
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for burst in range(20):
        rows += [f"2023-11-16 18:00:{2 * burst:02d}.0000000,3072,{128 + 64 * (i % 3)}" for i in range(20)]
    trace = tmp_path / "bursts.csv"
    trace.write_text("\n".join(rows) + "\n")
    r = run_cli("solve", "-m", "llama3-8b", "--max-model-len", "8K", "--max-rate", "-g", "2xH100", "--ttft-ms", "500",
                "--tpot-ms", "30", "--trace", str(trace))  # fmt: skip
    assert r.exit_code == 3 and "sent at the same moment" in r.stderr and "days" not in r.stderr


def test_solve_disaggregated_decode_no_answer_names_the_closest_miss():
    # V6: the refusal named only TP 1 and TP 2, whose weights do not fit, and advised more GPUs per replica; the limit
    # is the TPOT the layouts that fit reach
    r = run_cli("solve", "-m", "qwen3-235b-a22b", "--max-model-len", "16K", "--request-rate", "20", "--ttft-ms",
                "2000", "--tpot-ms", "30", "--input-len", "4K", "--output-len", "512", "--disaggregated", "--engine",
                "sglang", "-g", "H100", "--num-prompts", "300")  # fmt: skip
    assert (
        r.exit_code == 3 and "the fastest that holds the weights" in r.stderr and "reaches TPOT" in r.stderr
    )
    assert "weights need" not in r.stderr


def test_solve_disaggregated_labels_the_prefill_pools_unit():
    # V9: the decode row said DPA 8, the prefill row (whose launch line runs --enable-dp-attention) did not
    r = run_cli("solve", "-m", "deepseek-v3", "--max-model-len", "32K", "--request-rate", "10", "--ttft-ms", "3000",
                "--tpot-ms", "60", "--input-len", "16K", "--output-len", "1024", "--disaggregated", "--engine",
                "sglang", "-g", "H200", "--num-prompts", "200")  # fmt: skip
    rows = r.stdout.split("decode  │")[0]
    assert r.exit_code == 0 and "prefill │" in rows and re.search(r"DPA \d+", rows)


# --- fuzz pass 18 ------------------------------------------------------------------------------------------


def test_sglang_speculative_decoding_caps_running_requests_at_48():
    # W1: SGLang sets max_running_requests to 48 under speculative decoding when it is not given (server_args.py
    # _handle_speculative_decoding), 48 // 8 = 6 a rank under DP attention; kvplan printed 202 and 992
    base = (
        "estimate",
        "-m",
        "llama3.1-8b",
        "-g",
        "H100",
        "--engine",
        "sglang",
        "--max-model-len",
        "2K",
        "--json",
    )
    plain = run_cli(*base).json()
    ngram = run_cli(*base, "--speculative-algorithm", "NGRAM", "--acceptance-length",
                    "2").json()  # fmt: skip
    assert plain["max_concurrency"] > 48 and ngram["max_concurrency"] == 48
    assert any(
        a.startswith("--max-running-requests 48: SGLang's default under speculative")
        for a in ngram["assumptions"]
    )
    given = run_cli(*base, "--speculative-algorithm", "NGRAM", "--acceptance-length",
                    "2", "--max-running-requests", "100").json()  # fmt: skip
    assert given["max_concurrency"] == 100
    # solve states --max-running-requests in its launch lines, so it plans without the default
    solved = run_cli("solve", "-m", "llama3.1-8b", "--engine", "sglang", "--max-model-len", "2K", "--users", "500", "-g",
                     "H100", "--speculative-algorithm", "NGRAM", "--acceptance-length",
                     "2", "--json").json()  # fmt: skip
    assert (
        solved["answers"][0]["num_gpus"] == 8
        and "--max-running-requests 500" in solved["answers"][0]["sglang_flags"]
    )


def test_sglang_ngram_draft_tokens_are_its_own_not_eagles_rule():
    # W2: NGRAM's draft tokens default to speculative_ngram_max_match_window_size (12) and may be any count; the
    # steps + 1 rule is EAGLE's at top-k 1 (server_args.py)
    base = ("estimate", "-m", "llama3.1-8b", "-g", "H100", "--engine", "sglang", "--max-model-len", "2K",
            "--speculative-algorithm", "NGRAM", "--acceptance-length", "2", "--json")  # fmt: skip
    for extra, verify in (((), 12), (("--speculative-num-draft-tokens", "8"), 8)):
        r = run_cli(*base, *extra)
        assert r.exit_code == 0, r.stderr
        assert r.json()["decode"]["speculative"][0]["verify_tokens"] == verify


def test_check_log_reads_sglang_ngram_draft_tokens():
    # an SGLang NGRAM log verifies its speculative_num_draft_tokens (32 here), not steps + 1 (EAGLE's rule)
    from kvplan.logs.checklog import _log_speculative
    from kvplan.logs.logparse import parse

    text = (REAL / "sglang_unknownver_llama-3.1-8b-instruct_unknowngpu_tp1_eagle3.log").read_text()
    spec = _log_speculative(
        parse(text.replace("speculative_algorithm='EAGLE3'", "speculative_algorithm='NGRAM'")).facts
    )
    assert (spec.method, spec.draft_steps, spec.verify_tokens) == ("ngram", 5, 32)


def test_sglang_refuses_ngram_under_dp_attention():
    # server_args.py _handle_speculative_decoding: 'Currently ngram speculative decoding does not support dp attention.'
    r = run_cli("estimate", "-m", "qwen3-235b-a22b", "-g", "8xH200", "--engine", "sglang", "--max-model-len", "8K",
                "--enable-dp-attention", "--dp-size", "8", "--speculative-algorithm", "NGRAM", "--acceptance-length",
                "2")  # fmt: skip
    assert r.exit_code == 2 and "does not run n-gram speculative decoding under DP attention" in r.stderr
    ok = run_cli("estimate", "-m", "qwen3-235b-a22b", "-g", "8xH200", "--engine", "sglang", "--max-model-len", "8K",
                 "--speculative-algorithm", "NGRAM", "--acceptance-length", "2")  # fmt: skip
    assert ok.exit_code == 0, ok.stderr
