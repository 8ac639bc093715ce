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


# --- fuzz pass 22 ---------------------------------------------------------------------------------------------


def _index_folder(tmp_path, index: str):
    import shutil

    folder = tmp_path / "ckpt"
    shutil.copytree(HF / "llama-3.1-70b-instruct-fp8", folder)
    (folder / "model.safetensors.index.json").write_text(index)
    return folder


@pytest.mark.parametrize("metadata", ["null", "[]", '"abc"'])
def test_an_index_whose_metadata_is_not_a_mapping_is_one_line(tmp_path, metadata):
    # fuzz 22 G1: AttributeError traceback
    folder = _index_folder(tmp_path, f'{{"metadata": {metadata}, "weight_map": {{}}}}')
    r = run_cli("estimate", "-m", str(folder), "-g", "8xH100", "--max-model-len", "8K")
    assert r.exit_code == 2
    assert f"{folder / 'model.safetensors.index.json'}: metadata: expected a mapping" in r.stderr


def test_an_index_total_size_out_of_reach_names_the_index_field(tmp_path):
    # fuzz 22 G13: the messages named a checkpoint_weight_bytes field no file holds (and config.json)
    index = (
        _index_folder(tmp_path, '{"metadata": {"total_size": 1}, "weight_map": {}}')
        / "model.safetensors.index.json"
    )
    r = run_cli("estimate", "-m", str(index.parent), "-g", "8xH100", "--max-model-len", "8K")
    assert r.exit_code == 2 and f"{index}: metadata.total_size 1 is 1.4e-11x" in r.stderr
    big = _index_folder(
        tmp_path / "b", '{"metadata": {"total_size": 100000000000000000000000}, "weight_map": {}}'
    )
    r = run_cli("estimate", "-m", str(big), "-g", "8xH100", "--max-model-len", "8K")
    assert r.exit_code == 2 and "model.safetensors.index.json: metadata.total_size: 100,000" in r.stderr


@pytest.mark.parametrize(("engine", "length", "refused"), [("vllm", 1, True), ("vllm", 2, False),
                                                          ("sglang", 6, True), ("sglang", 7, False)])  # fmt: skip
def test_a_context_no_request_fits_is_refused(engine, length, refused):
    # fuzz 22 G2: --max-model-len 1 planned 414,464 requests, and SGLang's max_req_input_len came out -5 (SGLang
    # does not start: managers/tp_worker.py asserts max_req_input_len > 0)
    r = run_cli("estimate", "-m", "llama3-8b", "--engine", engine, "--max-model-len", str(length), "--json")
    assert (r.exit_code == 2) == refused, r.stderr
    if not refused and engine == "sglang":
        assert r.json()["engine"]["details"]["max_req_input_len"] == 1


def test_compare_variants_rewrite_latent_layers_or_refuse_them():
    # fuzz 22 G3/G4: mha/mqa/mla512 left DeepSeek-V4's compressed layers as they were (an "mha" row at 0.009x of
    # MHA); mla512 on DeepSeek-V3.2 dropped its DSA indexer; window4096 did nothing to MLA layers
    def rows(model: str, variants: str) -> dict[str, dict]:
        d = run_cli("compare", "table", "--models", model, "-g", "8xH200", "--variants", variants, "--max-model-len",
                    "8K", "--json").json()  # fmt: skip
        return {r["variant"]: r for r in d["rows"]}

    v4 = rows("deepseek-v4-flash", "shipped,mha,mla512")
    assert v4["mha"]["ratio_to_mha"] == pytest.approx(1.0)
    assert (
        v4["mla512"]["kv_bytes_per_token"] == 61 * 0 + v4["mla512"]["kv_bytes_per_token"]
    )  # planned, not shipped
    assert len({v4[k]["kv_bytes_per_token"] for k in v4}) == 3
    for model in ("deepseek-v3", "deepseek-v3.2"):  # their latent is 512 + 64 already: the same plan
        r = rows(model, "shipped,mla512")
        assert r["mla512"]["kv_bytes_per_token"] == r["shipped"]["kv_bytes_per_token"]
        assert r["mla512"]["max_concurrency"] == r["shipped"]["max_concurrency"]
    d = run_cli("compare", "table", "--models", "deepseek-v3,llama3-70b", "-g", "8xH200", "--variants",
                "shipped,window4096", "--max-model-len", "8K", "--json").json()  # fmt: skip
    w = {(r["model"], r["variant"]): r for r in d["rows"]}  # the row says why; the others stand
    assert w[("deepseek-v3", "window4096")]["max_concurrency"] is None
    assert (
        "not applicable: variant window4096: deepseek-v3's 61 latent (MLA) layers"
        in w[("deepseek-v3", "window4096")]["error"]
    )
    assert (
        w[("llama3-70b", "window4096")]["max_concurrency"] > w[("llama3-70b", "shipped")]["max_concurrency"]
    )


def _profile(tmp_path, edit) -> str:
    import yaml

    d = yaml.safe_load((REPO / "benchmarks" / "results" / "h200" / "calibrate_profile.yaml").read_text())
    edit(d)
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return str(path)


def test_a_profile_point_with_an_unknown_kv_dtype_or_a_rate_in_another_unit_is_refused(tmp_path):
    # fuzz 22 G7/G8: 'fp4' points were read as 16-bit ones; seconds x 1000 gave a 28.6 s decode step
    def rename(d):
        for p in d["points"]:
            p["kv_dtype"] = "fp4" if p["kv_dtype"] == "fp8" else p["kv_dtype"]

    def millis(d):
        for p in d["points"]:
            p["seconds"] *= 1000

    def gemm_millis(d):
        for p in d["gemm"]:
            p["seconds"] *= 1000

    base = ("estimate", "-m", "llama3-8b", "-g", "H200", "--max-model-len", "8K", "--calibration-file")
    assert (
        run_cli(*base, str(REPO / "benchmarks" / "results" / "h200" / "calibrate_profile.yaml")).exit_code
        == 0
    )
    r = run_cli(*base, _profile(tmp_path, rename))
    assert r.exit_code == 2 and "kv_dtype: expected one of bf16, fp16, fp8, int8, got 'fp4'" in r.stderr
    r = run_cli(*base, _profile(tmp_path, millis))
    assert (
        r.exit_code == 2 and "points[0].bytes_per_s: 2.096e+11 but bytes / seconds is 2.096e+08" in r.stderr
    )
    r = run_cli(*base, _profile(tmp_path, gemm_millis))
    assert r.exit_code == 2 and "gemm[0].weight_bytes_per_s" in r.stderr


def test_a_length_histogram_is_read_by_its_header(tmp_path):
    # fuzz 22 G9: the columns were read by position whatever the header named
    swapped = tmp_path / "swapped.csv"
    swapped.write_text("output_len,input_len,weight\n128,1024,1\n")
    args = ("simulate", "-m", "llama3-8b", "--max-model-len", "8K", "--num-prompts", "50", "--json")
    d = run_cli(*args, "--length-histogram", str(swapped)).json()
    assert d["prefill_tokens"] == 50 * 1024
    other = tmp_path / "other.csv"
    other.write_text("a,b,c\n128,1024,1\n")
    r = run_cli(*args, "--length-histogram", str(other))
    assert r.exit_code == 2 and "the header must name the columns input_len,output_len,weight" in r.stderr


def test_chart_titles_wrap_at_words():
    # fuzz 22 G12: the title was cut at 120 characters, inside a word
    from kvplan.simulator.render import _title

    text = "llama3-8b on 1x H100-SXM (TP 1, PP 1), vllm: 1000 random prompts of 1,024 in / 128 out tokens sent 8 " \
           "requests/s (burstiness 1); seed 0"  # fmt: skip
    lines = _title(text).split("\n")
    assert len(lines) == 2 and " ".join(lines) == text and all(len(x) <= 110 for x in lines)


def test_an_unknown_short_option_is_named_as_typed():
    # fuzz 22 G14: `compare ladder -dp 2` said "No such option: -d"
    r = run_cli("compare", "ladder", "-m", "llama3-8b", "-g", "H100", "-dp", "2")
    assert r.exit_code == 2 and "No such option: -dp;" in r.stderr


def test_solve_load_tells_its_listener_each_simulated_load():
    # fuzz 22 G15: a 6-9 s --max-rate search showed nothing while it ran; the CLI listens through ON_SIMULATION
    from kvplan.commands import inputs
    from kvplan.search.rate import ON_SIMULATION

    seen: list[int] = []
    token = ON_SIMULATION.set(seen.append)
    try:
        inputs.solve_load(
            inputs.SolveFlags(model="llama3-8b", users=1, max_model_len="8K", gpus="1xH100", tpot_ms=50),
            inputs.LoadFlags(ttft_ms=500, max_rate=True, num_prompts=300),
        )
    finally:
        ON_SIMULATION.reset(token)
    assert len(seen) >= 3 and seen == sorted(set(seen))  # the running count, after each load


def test_vllm_0_10_0_named_to_the_patch_reads_the_rules_before_0_10_1(tmp_path):
    # fuzz 22 G5/G6: 0.10.0 got 0.10.1's chunked-local gate and its float32 rule; and one plan said both float16
    # (the engine's rule) and "served in bf16" (the config reader's)
    def conc(version: str) -> int:
        return run_cli("estimate", "-m", "llama4-scout", "-g", "8xH100", "--max-model-len", "64K", "--engine-version",
                       version, "--json").json()["max_concurrency"]  # fmt: skip

    assert conc("0.10.0") > conc("0.10.1") == conc("0.10")  # the gate (default 0) came with 0.10.1
    cfg = json.loads((HF / "llama-3.2-3b-instruct.json").read_text())
    cfg["torch_dtype"] = "float32"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    for version, dtype, word in (("0.10.0", "fp16", "before 0.10.1"), ("0.10.1", "bf16", "from 0.10.1")):
        d = run_cli(
            "estimate", "-m", str(path), "--max-model-len", "8K", "--engine-version", version, "--json"
        ).json()
        assert d["settings"]["dtype"] == dtype
        said = [a for a in d["assumptions"] if "float32" in a]
        assert any(word in a for a in said)
        assert not any("served in bf16" in a for a in said)


def test_a_quantized_checkpoints_weights_are_labelled_as_stored():
    # fuzz 22 G10: an FP8 checkpoint's weights row said "weights (bf16)"
    out = run_cli("estimate", "-m", str(HF / "qwen3-32b-fp8-static-pertensor.json"), "-g", "8xH200",
                  "--max-model-len", "8K").stdout  # fmt: skip
    assert "- weights (fp8-t32, embedding and LM head bf16)" in out
    assert "- weights (bf16)" in run_cli("estimate", "-m", "llama3-8b", "--max-model-len", "8K").stdout


def test_rows_computed_at_sglangs_capped_request_say_so():
    # fuzz 22 G11: with --max-total-tokens 100 the rows said "at 8,192 tokens" and were computed at 99
    out = " ".join(run_cli("estimate", "-m", "llama3-8b", "--max-model-len", "8K", "--max-total-tokens", "100",
                           "--engine", "sglang").stdout.split())  # fmt: skip
    assert "per GPU, in whole blocks (at max_req_len 99)" in out
    assert "max concurrent requests at 99 tokens (SGLang's max_req_len)" in out
    assert "1 request at 99 tokens" in out


def test_vllm_0_10_0_is_named_to_the_patch_in_the_plan():
    # fuzz 22 G5: settings.engine_version said 0.10 for 0.10.0 and 0.10.1 alike, though they plan differently
    d = run_cli(
        "estimate", "-m", "llama3-8b", "--max-model-len", "8K", "--engine-version", "0.10.0", "--json"
    ).json()
    assert d["settings"]["engine_version"] == d["engine"]["version"] == "0.10.0"
    d = run_cli(
        "estimate", "-m", "llama3-8b", "--max-model-len", "8K", "--engine-version", "0.10.2", "--json"
    ).json()
    assert d["settings"]["engine_version"] == "0.10"


# --- fuzz pass 23 ---------------------------------------------------------------------------------------------


def test_disaggregated_rate_is_bound_by_the_kv_link_when_it_carries_fewer_requests():
    # fuzz 23 H1: the link carried 46.6 req/s and the headline said the prefill pool binds at 63.75
    d = run_cli("estimate", "-m", "llama3-8b", "--max-model-len", "8K", "--disaggregated", "--input-len", "4K",
                "--output-len", "256", "--prefill-gpus", "8xH100", "--prefill-tp", "1", "--decode-gpus", "8xH100",
                "--network", "25G", "--json").json()["disaggregated"]  # fmt: skip
    assert d["binding_pool"] == "link"
    assert d["requests_per_s"] == pytest.approx(d["transfer_requests_per_s"])
    assert d["requests_per_s"] < d["prefill"]["requests_per_s"]


def test_a_request_beyond_sglangs_capped_length_is_refused_as_infeasible_by_both_paths():
    # fuzz 23 H2/H3: --avg-context 100K planned a batch-1 decode at 102,400 tokens though SGLang caps requests at
    # 23,799; the disaggregated decode pool refused the same with exit 2 under SGLang and 3 under vLLM
    r = run_cli("estimate", "-m", "llama3.1-8b", "--engine", "sglang", "--max-model-len", "128K", "-g", "L4",
                "--avg-context", "100K")  # fmt: skip
    assert r.exit_code == 3 and "--avg-context 102,400 is above SGLang's max_req_len 23,799" in r.stderr
    args = ("estimate", "-m", "llama3.1-8b", "--max-model-len", "128K", "--disaggregated", "--input-len", "100K",
            "--output-len", "256", "--prefill-gpus", "1xH100", "--decode-gpus", "1xL4")  # fmt: skip
    assert run_cli(*args, "--engine", "sglang").exit_code == run_cli(*args).exit_code == 3


def test_moe_imbalance_is_at_most_the_ep_size():
    # fuzz 23 H4: --moe-imbalance 64 on EP 2 made the MoE term 4x the physical worst case (one rank doing it all)
    base = (
        "estimate",
        "-m",
        "mixtral-8x7b",
        "-g",
        "2xH100",
        "--enable-expert-parallel",
        "--max-model-len",
        "8K",
    )
    r = run_cli(*base, "--moe-imbalance", "64")
    assert r.exit_code == 2 and "--moe-imbalance 64 is above the EP size 2" in r.stderr
    assert run_cli(*base, "--moe-imbalance", "2").exit_code == 0


def test_a_prepared_workload_takes_no_workload_flags_beside_it():
    # fuzz 23 H5: kvplan.simulate(workload=w, max_concurrency=1, trace="/nonexistent") ignored them all
    import kvplan
    from kvplan.errors import UsageError
    from kvplan.simulator import synthetic

    w = synthetic(num_prompts=20, request_rate=4)
    with pytest.raises(UsageError, match=r"give either a workload or its flags \(trace, max_concurrency\)"):
        kvplan.simulate(
            "llama3-8b", max_model_len="8K", workload=w, trace="/nonexistent.jsonl", max_concurrency=1
        )
    assert kvplan.simulate("llama3-8b", max_model_len="8K", workload=w).completed == 20


def test_an_eagle_draft_of_another_width_is_refused(tmp_path):
    # fuzz 23 H6: a draft config with hidden_size 8192 was sized beside llama3-8b (hidden 4096)
    d = json.loads((REPO / "tests" / "fixtures" / "draft" / "eagle-llama3-8b.json").read_text())
    path = tmp_path / "eagle.json"
    path.write_text(json.dumps(dict(d, hidden_size=8192, num_attention_heads=64, intermediate_size=28672)))
    args = ("estimate", "-m", "llama3-8b", "--max-model-len", "8K", "--speculative-config",
            '{"method":"eagle","num_speculative_tokens":3}', "--acceptance-length", "2.5",
            "--speculative-draft-config")  # fmt: skip
    r = run_cli(*args, str(path))
    assert r.exit_code == 2 and "hidden_size 8,192 differs from llama3-8b's 4,096" in r.stderr
    assert run_cli(*args, str(REPO / "tests" / "fixtures" / "draft" / "eagle-llama3-8b.json")).exit_code == 0


def test_empty_variants_are_refused_as_empty_models_are():
    # fuzz 23 H7: --variants "" (and variants=[] in the API) gave the shipped row alone
    import kvplan
    from kvplan.errors import UsageError

    r = run_cli("compare", "table", "--models", "llama3-8b", "--variants", "")
    assert r.exit_code == 2 and "--variants is empty" in r.stderr
    with pytest.raises(UsageError, match="variants is empty"):
        kvplan.compare(models="llama3-8b", variants=[])


def test_sglang_ngram_needs_no_draft_steps_and_refuses_them():
    # fuzz 23 H8: NGRAM required --speculative-num-steps, which then changed nothing but the echoed draft_steps
    base = ("estimate", "-m", "llama3-8b", "--max-model-len", "8K", "--engine", "sglang", "--speculative-algorithm",
            "NGRAM", "--acceptance-length", "2")  # fmt: skip
    d = run_cli(*base, "--json").json()["decode"]["speculative"][0]
    assert (d["draft_steps"], d["verify_tokens"]) == (11, 12)
    r = run_cli(*base, "--speculative-num-steps", "20")
    assert r.exit_code == 2 and "--speculative-num-steps would change nothing for NGRAM" in r.stderr


# --- fuzz pass 24 ---------------------------------------------------------------------------------------------


def test_solves_sglang_line_states_the_fraction_its_users_figure_rests_on():
    # fuzz 24 K1: for a VLM the line said --mem-fraction-static 0.852 (before SGLang's VLM adjustment) beside "holds
    # 67 users" (at the adjusted 0.775); SGLang takes a given fraction as it is, so the copied line ran 74
    a = run_cli("solve", "-m", "gemma3-27b", "--users", "50", "--max-model-len", "32K", "-g", "B200", "--top", "1",
                "--json").json()["answers"][0]  # fmt: skip
    assert (a["num_gpus"], a["tensor_parallel_size"], a["data_parallel_size"]) == (8, 8, 1)
    fraction = a["sglang_flags"].split("--mem-fraction-static ")[1].split()[0]
    assert fraction != "0.852"
    d = run_cli("estimate", "-m", "gemma3-27b", "-g", "8xB200", "--engine", "sglang", "--max-model-len", "32K",
                "--mem-fraction-static", fraction, "--json").json()  # fmt: skip
    assert d["max_concurrency"] == a["sglang_max_concurrency"] == 67


def test_every_gpus_count_is_bounded_before_any_search():
    # fuzz 24 K2: solve --max-context -g 999999999999999999999xH100 printed a table (estimate refused 4,097)
    for g in ("4097xH100", "999999999999999999999xH100"):
        r = run_cli("solve", "-m", "llama3-8b", "--users", "10", "--max-context", "-g", g)
        assert r.exit_code == 2 and "--gpus (GPU count) must be at most 4,096" in r.stderr


def test_check_log_refuses_flags_that_contradict_the_log():
    # fuzz 24 K4: --kv-cache-dtype bf16 on an fp8 log halved the arithmetic's tokens without a word
    real = str(REAL_LOGS / "vllm_0.10.0_qwen3-32b_h100_tp8.log")
    r = run_cli("check-log", real, "-m", "qwen3-32b", "-g", "H100", "--kv-cache-dtype", "bf16")
    assert (
        r.exit_code == 2
        and "--kv-cache-dtype bf16, but the log ran with fp8; drop --kv-cache-dtype" in r.stderr
    )
    assert (
        run_cli("check-log", real, "-m", "qwen3-32b", "-g", "H100", "--kv-cache-dtype", "fp8").exit_code == 0
    )
    sglang = str(REPO / "tests" / "fixtures" / "logs" / "sglang_v05_llama3_8b_h100.log")
    r = run_cli("check-log", sglang, "-g", "H100", "--page-size", "16")
    assert r.exit_code == 2 and "--page-size 16, but the log ran with 1" in r.stderr
    # fuzz 24 K6: SGLang's step budget is its chunked_prefill_size: --max-num-batched-tokens was kept in the saved
    # calibration's key, which no estimate could then match
    r = run_cli("check-log", sglang, "-g", "H100", "--max-num-batched-tokens", "4096")
    assert r.exit_code == 2 and "--max-num-batched-tokens is vLLM's flag and this is a SGLang log" in r.stderr


def test_compare_ladder_refuses_a_zero_context():
    # fuzz 24 K5: --max-model-len 0 was taken as the model's maximum
    r = run_cli("compare", "ladder", "-m", "llama3-8b", "--max-model-len", "0")
    assert r.exit_code == 2 and "--max-model-len must be >= 1" in r.stderr


def test_a_second_saved_calibration_says_what_it_replaces(tmp_path, monkeypatch):
    # fuzz 24 K7: a measured 2.20 GiB was replaced by 6.31 GiB without a word
    monkeypatch.setenv("KVPLAN_DATA_DIR", str(tmp_path / "data"))
    log = REPO / "tests" / "fixtures" / "logs" / "vllm_v011_llama31_8b_h100.log"
    first = run_cli("check-log", str(log), "-g", "H100", "--save-calibration", "--json").json()
    assert not any("replaces" in n for n in first["notes"])
    edited = tmp_path / "edited.log"
    edited.write_text(log.read_text().replace("54.11 GiB", "50.00 GiB").replace("443,264 tokens", "409,600 tokens")
                      .replace("13.53x", "12.50x"))  # fmt: skip
    second = run_cli("check-log", str(edited), "-g", "H100", "--save-calibration", "--json").json()
    said = [n for n in second["notes"] if n.startswith("--save-calibration replaces 2.20 GiB measured from")]
    assert len(said) == 1
