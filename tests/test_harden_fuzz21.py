"""Session 16 hardening: the items left open by fuzz passes 19-20 and pass 21's findings (each test failing on
the code before)."""

from __future__ import annotations

import json

import pytest

from kvplan.specs.registry import load_model
from tests.helpers import REPO, run_cli

HF = REPO / "tests" / "fixtures" / "hf" / "corpus"
REAL_LOGS = REPO / "tests" / "fixtures" / "logs" / "real"


def _without(tmp_path, name: str, *keys: str) -> str:
    cfg = json.loads((HF / name).read_text())
    for k in keys:
        cfg.pop(k, None)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_idle_vllm_dp_engine_cores_route_no_tokens_through_the_busy_cores_experts():
    # fuzz 20a: under --enable-expert-parallel one request on 8 DP engine cores was timed as if all 8 cores held a
    # batch like its own (TPOT 17.7 ms at C = 1, 2 and 8 alike); idle cores step with dummy batches
    def tpot(cap: int) -> float:
        return run_cli("simulate", "-m", "deepseek-v3", "-g", "8xH200", "--engine", "vllm", "-tp", "1", "-dp", "8",
                       "--enable-expert-parallel", "--max-model-len", "8K", "--num-prompts", "40",
                       "--max-concurrency", str(cap), "--json").json()["tpot_ms"]["median"]  # fmt: skip

    one, two, eight = tpot(1), tpot(2), tpot(8)
    assert one < two < eight


@pytest.mark.parametrize(
    ("name", "dropped", "experts", "top_k", "width"),
    [
        ("qwen3-30b-a3b.json", ("num_experts",), 128, 8, 768),  # Qwen3MoeConfig: was planned dense
        ("qwen3-30b-a3b.json", ("num_experts", "moe_intermediate_size"), 128, 8, 768),
        (
            "gpt-oss-120b.json",
            ("num_local_experts", "num_experts_per_tok", "experts_per_token"),
            128,
            4,
            2880,
        ),
    ],
)
def test_moe_families_missing_expert_fields_take_their_config_class_defaults(
    tmp_path, name, dropped, experts, top_k, width
):
    # fuzz 19b: only Mixtral had class defaults; a Qwen3-MoE config without num_experts was planned as a dense
    # model (transformers 4.57 configuration_qwen3_moe.py: num_experts=128, num_experts_per_tok=8,
    # moe_intermediate_size=768; configuration_gpt_oss.py: num_local_experts=128, num_experts_per_tok=4)
    path = _without(tmp_path, name, *dropped)
    moe = load_model(path).moe
    assert moe is not None
    assert (moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size) == (experts, top_k, width)
    d = run_cli("estimate", "-m", path, "-g", "8xH100", "--json").json()
    said = [a for a in d["assumptions"] if a.startswith("absent from the config, taken at")]
    assert len(said) == 1 and all(k in said[0] for k in dropped if k != "experts_per_token")


def test_vllm_engine_config_naming_another_max_model_len_than_its_arguments_is_said(tmp_path):
    # fuzz 19b: the arguments' max_model_len was read and the engine config's max_seq_len ignored, without a word
    real = REAL_LOGS / "vllm_0.10.0_qwen3-32b_h100_tp8.log"
    text = real.read_text()
    assert text.count("max_seq_len=32768") == 1 and "'max_model_len': 32768" in text
    spliced = tmp_path / "spliced.log"
    spliced.write_text(text.replace("max_seq_len=32768", "max_seq_len=16384"))
    args = ("-m", "qwen3-32b", "-g", "8xH100", "--json")
    notes = run_cli("check-log", str(spliced), *args).json()["notes"]
    said = [n for n in notes if "max_model_len 32,768 and then 16,384" in n]
    assert len(said) == 1 and "spliced from two startups" in said[0]
    assert not any("and then" in n for n in run_cli("check-log", str(real), *args).json()["notes"])


def test_cpu_offload_copies_the_offloaded_weights_over_pcie_in_every_step():
    # J5 (fuzz round 6): --cpu-offload-gb moved weights to CPU memory and the decode step still streamed
    # them from HBM; vLLM's maybe_offload_to_cpu copies them to the GPU in every forward pass
    base = ("estimate", "-m", "llama3.1-70b", "-g", "4xL40S", "--max-model-len", "8K", "--json")
    kept = run_cli(*base, "--cpu-offload-gb", "0").json()
    off = run_cli(*base, "--cpu-offload-gb", "10").json()
    moved = kept["weight_bytes_per_gpu"] - off["weight_bytes_per_gpu"]
    assert moved >= 10 * 2**30  # whole layers until the limit is reached
    one = off["decode"]["batch_1"]
    assert one["offload_ms"] == pytest.approx(moved / 32e9 * 1e3)  # the L40S's PCIe Gen4 x16, one direction
    assert (
        kept["decode"]["batch_1"]["offload_ms"] == 0 and "offload" not in kept["decode"]["batch_1"]["sources"]
    )
    assert one["tpot_ms"] > kept["decode"]["batch_1"]["tpot_ms"] + one["offload_ms"] * 0.99
    assert "datasheet PCIe rate" in one["sources"]["offload"]
    assert off["prefill"]["terms"]["offload_ms"] == pytest.approx(one["offload_ms"])


def _check_log_stdin(data: bytes, *args: str):
    from typer.testing import CliRunner

    from kvplan.cli.app import app

    r = CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1"}).invoke(app, ["check-log", "-", *args], input=data)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r


def test_a_windows_copy_of_a_hard_wrapped_log_reads_as_the_original(tmp_path):
    # fuzz 21 F1: with CRLF line endings the hard-wrapped 'non-default args' joined with CRs inside and split again:
    # TP 2 and gpu_memory_utilization 0.5 were lost, and the log was checked at TP 1, 0.9 (weights +99%, KV +81%)
    real = REAL_LOGS / "vllm_0.10.1.1_qwen2-7b-instruct_a100-40gb_tp2.log"
    crlf = tmp_path / "crlf.log"
    crlf.write_bytes(real.read_bytes().replace(b"\n", b"\r\n"))
    args = ("-m", str(HF / "qwen2.5-7b.json"), "-g", "2xA100-40GB", "--json")
    lf, cr = run_cli("check-log", str(real), *args).json(), run_cli("check-log", str(crlf), *args).json()
    assert cr["setup"]["tensor_parallel_size"] == lf["setup"]["tensor_parallel_size"] == 2
    assert cr["setup"]["gpu_memory_utilization"] == lf["setup"]["gpu_memory_utilization"] == 0.5
    assert cr["rows"] == lf["rows"]


def test_a_utf16_log_piped_in_reads_as_the_same_file_does(tmp_path):
    # fuzz 21 F6: PowerShell's `>` writes UTF-16 with a byte-order mark; from a file it was read, from stdin refused
    text = (REPO / "tests" / "fixtures" / "logs" / "vllm_v011_llama31_8b_h100.log").read_text()
    u16 = tmp_path / "u16.log"
    u16.write_bytes(text.encode("utf-16"))
    from_file = run_cli("check-log", str(u16), "-g", "H100", "--json")
    piped = _check_log_stdin(text.encode("utf-16"), "-g", "H100", "--json")
    assert from_file.exit_code == piped.exit_code == 0, piped.stderr
    assert json.loads(piped.stdout)["rows"] == from_file.json()["rows"]


def test_check_log_takes_tp_from_gpus_when_the_log_names_no_layout(tmp_path):
    # fuzz 21 F2: a log without TP/PP/DP was checked at TP 1 whatever --gpus said, and the note claimed the log
    # "ran on 1 (TP x PP x DP as it logs them)"
    log = tmp_path / "min.log"
    log.write_text(
        "INFO 11-28 10:01:05 [api_server.py:1805] vLLM API server version 0.11.0\n"
        "INFO 11-28 10:01:30 [gpu_worker.py:298] Available KV cache memory: 54.11 GiB\n"
        "INFO 11-28 10:01:30 [kv_cache_utils.py:1087] GPU KV cache size: 443,264 tokens\n"
    )
    two = run_cli("check-log", str(log), "-m", "llama3.1-8b", "-g", "2xH100", "--json").json()
    assert two["setup"]["tensor_parallel_size"] == 2 and two["setup"]["num_gpus"] == 2
    assert two["notes"][0].startswith("the log names no parallel layout (TP, PP, DP): checked at TP 2")
    assert not any("as it logs them" in n for n in two["notes"])
    one = run_cli("check-log", str(log), "-m", "llama3.1-8b", "-g", "H100", "--json").json()
    assert one["setup"]["tensor_parallel_size"] == 1 and "checked on one GPU, TP 1" in one["notes"][0]
    nodes = run_cli("check-log", str(log), "-m", "llama3.1-8b", "-g", "16xH100")
    assert nodes.exit_code == 2 and "spans 2 nodes" in nodes.stderr
    # a log that names its layout keeps it, and the --gpus mismatch note says so
    named = run_cli("check-log", str(REAL_LOGS / "vllm_0.10.0_qwen3-32b_h100_tp8.log"), "-m", "qwen3-32b",
                    "-g", "4xH100", "--json").json()  # fmt: skip
    assert named["setup"]["tensor_parallel_size"] == 8
    assert any("names 4 GPUs but the log ran on 8" in n for n in named["notes"])


def test_solve_launch_line_leaves_a_hybrid_models_raised_block_to_vllm():
    # fuzz 21 F3: the launch line said --block-size 4128 (the attention block vLLM raises to itself), which
    # `vllm serve` refuses (vllm/config/cache.py BlockSize: 1, 8, 16, 32, 64, 128, 256)
    d = run_cli("solve", "-m", "nemotron-h-56b", "--users", "100", "--max-model-len", "8K", "-g", "A100-80GB",
                "--json").json()  # fmt: skip
    first = d["answers"][0]
    assert first["block_size"] > 256  # the plan's block: what vLLM runs with
    assert "--block-size" not in first["vllm_flags"]
    dense = run_cli("solve", "-m", "llama3-8b", "--users", "100", "--max-model-len", "8K", "--json").json()
    assert dense["answers"][0]["vllm_flags"].endswith("--block-size 16")


def test_sglang_chunked_prefill_on_the_radix_cache_is_linear_in_its_chunks():
    # fuzz 21 F4: each chunk re-inserted the whole prompt from the root, one more node deep each time: 8,000
    # one-token chunks took 40 s. The tree it leaves is the same (RadixCache.extend below the last chunk's node).
    from kvplan.simulator.radix import RadixCache

    def tree_after(chunks: int, extend: bool) -> tuple[int, int, int]:
        tree = RadixCache()
        key = ((7, 0, chunks),)
        node = None
        for n in range(1, chunks + 1):
            part = ((7, 0, n),)
            if extend and node is not None:
                new = tree.extend(node, ((7, n - 1, 1),))
                tree.relock(node, new)
            else:
                new = tree.insert(part)[1]
                tree.lock(new)
                if node is not None:
                    tree.unlock(node)
            node = new
        assert node is not None and tree.match(key, chunks)[0] == chunks
        return tree.num_nodes, tree.total_tokens, tree.evictable_tokens

    assert tree_after(300, True) == tree_after(300, False) == (300, 300, 0)
    import time

    start = time.perf_counter()
    r = run_cli("simulate", "-m", "llama3-8b", "--max-model-len", "8K", "--engine", "sglang", "--chunked-prefill-size",
                "1", "--num-prompts", "1", "--input-len", "8000", "--output-len", "100", "--json")  # fmt: skip
    assert r.exit_code == 0 and r.json()["completed"] == 1
    assert time.perf_counter() - start < 20  # was 40 s: quadratic in the chunks


def test_compare_variants_refuses_empty_and_repeated_entries():
    # fuzz 21 F5: --variants 'shipped,,gqa8+int8,gqa8+int8' gave three rows, one twice; --models refuses both
    empty = run_cli("compare", "table", "-m", "llama3-70b", "--variants", "shipped,,gqa8+int8")
    assert empty.exit_code == 2 and "--variants: an empty entry between commas" in empty.stderr
    twice = run_cli("compare", "table", "-m", "llama3-70b", "--variants", "gqa8+int8,gqa8+int8")
    assert twice.exit_code == 2 and "gqa8+int8 given twice" in twice.stderr
    ok = run_cli("compare", "table", "-m", "llama3-70b", "--variants", "shipped,gqa8+int8", "--json")
    assert ok.exit_code == 0


def test_solve_load_modes_refuse_flags_that_change_nothing():
    # fuzz 21 F7: --max-rate ignored --max-gpus and --top without a word
    base = ("solve", "-m", "llama3-8b", "--max-model-len", "8K", "--ttft-ms", "500", "--tpot-ms", "50",
            "--num-prompts", "50")  # fmt: skip
    r = run_cli(*base, "--max-rate", "-g", "1xH100", "--max-gpus", "4", "--top", "3")
    assert r.exit_code == 2
    assert "--top, --max-gpus would change nothing: --max-rate answers for the GPUs given" in r.stderr
    r = run_cli(*base, "--request-rate", "5", "--top", "2")
    assert r.exit_code == 2 and "--top would change nothing: --request-rate gives one answer" in r.stderr


def test_solve_refuses_a_price_below_a_cent():
    # fuzz 21 F8: --price 1e-300 printed every cost as 0.00
    r = run_cli(
        "solve",
        "-m",
        "llama3-70b",
        "--users",
        "100",
        "--max-model-len",
        "8K",
        "-g",
        "H100",
        "--price",
        "1e-300",
    )
    assert r.exit_code == 2 and "below 0.01 per GPU-hour" in r.stderr
    assert (
        run_cli(
            "solve", "-m", "llama3-8b", "--users", "10", "--max-model-len", "8K", "--price", "0.5"
        ).exit_code
        == 0
    )
