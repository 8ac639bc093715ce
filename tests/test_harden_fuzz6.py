"""Issue 24: findings of the sixth fuzz pass (J-series) fixed this session, each test failing on the code before."""

from __future__ import annotations

from tests.helpers import plan, run_cli


def test_solve_prints_no_kv_dtype_the_engines_do_not_take():
    # J6: --kv-cache-dtype bf16,fp16 printed `vllm serve ... --kv-cache-dtype bf16`, which vLLM rejects
    r = run_cli("solve", "-m", "llama3-70b", "-u", "50", "--max-model-len", "8K", "-g", "H100",
                "--kv-cache-dtype", "bf16,fp16")  # fmt: skip
    assert (
        r.exit_code == 2
        and "--kv-cache-dtype bf16: the engines' launch flag" in r.stderr
        and "use auto or fp8" in r.stderr
    )


def test_solve_goodput_is_at_most_the_rate_sent():
    # J13: "goodput 5.15 requests/s of 5" from one replica's short sample scaled by 8
    r = run_cli("solve", "-m", "llama3.1-8b", "--max-model-len", "8K", "-g", "H100", "--request-rate", "5",
                "--tpot-ms", "30", "--ttft-ms", "500", "--percentile", "99", "--num-prompts", "50", "--json")  # fmt: skip
    assert r.exit_code == 0 and 0 < r.json()["goodput"] <= 5


def test_the_gpu_table_and_assumptions_do_not_call_a_binary_capacity_gb():
    # J17: "80 GB" beside "79.19 GiB" read as gigabytes (85.0 GB): it is the datasheet's label
    out = run_cli("gpus").stdout
    assert "datasheet label" in out and "runtime total" in out
    p = plan("llama3.1-8b", "H100")
    assert any(
        "H100-SXM memory 79.19 GiB as the CUDA runtime reports it (the datasheet's label '80 GB HBM3' is its marketing "
        "capacity, not a count of 10^9 bytes)" in a
        for a in p.assumptions
    )


def test_padding_layers_say_how_many_requests_vllm_blocks_hold():
    # J1: kvplan said 462 users for gemma3-27b on 8x H100 at 8K where vLLM's blocks hold 435 (8 padding layers)
    p = plan("gemma3-27b", "H100", num_gpus=8, max_model_len=8192)
    note = next(n for n in p.engine.differences if "padding layers" in n)
    assert note.endswith(f"vLLM's blocks hold 435 requests at full length, not {p.max_concurrency:,}")
    assert p.max_concurrency == 462


def test_simulate_pool_of_a_grouped_vllm_layout_holds_what_vllms_blocks_hold():
    # J2: gemma3-27b on one H100 at 8K: vLLM's 14,952 blocks are shared by 7 KV-cache groups (a full-length
    # request holds 902 of them), yet the simulator gave a request one block per 16 tokens of all 14,952
    # (239,216 tokens, ~7x the engine's pool). Scaled by 512/902: 8,487 blocks, 16 full-length requests as vLLM
    import kvplan

    r = kvplan.simulate("gemma3-27b", gpus="H100", max_model_len="8K", num_prompts=20)
    d = r.to_dict()["deployment"]
    assert d["pool_tokens"] == (14952 * 512 // 902 - 1) * 16
    assert any(
        "14,952 shared by 7 KV-cache groups, scaled by 512/902" in a for a in r.to_dict()["assumptions"]
    )
    plain = kvplan.simulate("llama3.1-8b", gpus="H100", max_model_len="8K", num_prompts=20).to_dict()[
        "deployment"
    ]
    assert (
        plain["pool_tokens"] == (plan("llama3.1-8b", "H100", max_model_len=8192).engine.num_blocks - 1) * 16
    )


def test_check_log_reads_the_logged_max_num_seqs():
    # J3: a real H100 log of vLLM with 'max_num_seqs': 256 was refused ("one request ... does not fit"): check-log
    # sized the sampler's profiling run for the default 1,024 sequences
    from pathlib import Path

    root = Path(__file__).resolve().parent / "fixtures"
    log = root / "logs" / "real" / "vllm_0.11.0rc2.dev113_qwen3-vl-30b-a3b-instruct_h100_tp1.log"
    model = root / "hf" / "corpus" / "qwen3-vl-30b-a3b-instruct.json"
    r = run_cli("check-log", str(log), "--model", str(model), "--gpus", "H100", "--json")
    assert r.exit_code == 0, r.stderr
    rows = {row["quantity"]: row for row in r.json()["arithmetic"]}
    assert rows["KV cache tokens"]["log"] == 95824 and abs(rows["KV cache tokens"]["kvplan"] - 95824) <= 64
    assert rows["maximum concurrency"]["kvplan"] == 1.46


def test_nodes_of_four_gpus_default_tp_to_four():
    # J7: --gpus 2x4xH100 was refused ("TP 8 x PP 2 = 16 does not divide") as if a node held the catalog's 8
    p = plan("llama3-70b", "H100", num_gpus=8, nodes=2, max_model_len=8192)
    assert (p.cluster.tensor_parallel_size, p.cluster.pipeline_parallel_size) == (4, 2)
    r = run_cli("estimate", "-m", "llama3-70b", "--gpus", "2x4xH100", "--max-model-len", "8K")
    assert r.exit_code == 0 and "(TP 4, PP 2, DP 1)" in r.stdout
    whole = plan("llama3-70b", "H100", num_gpus=16, nodes=2, max_model_len=8192)
    assert (whole.cluster.tensor_parallel_size, whole.cluster.pipeline_parallel_size) == (8, 2)


def test_solve_lists_name_each_entry_once_and_none_empty():
    # J15: --kv-cache-dtype fp8,fp8 printed every answer twice; -g ,H100 dropped the empty entry silently
    base = ["solve", "-m", "llama3-70b", "-u", "50", "--max-model-len", "8K"]
    r = run_cli(*base, "--kv-cache-dtype", "fp8,fp8")
    assert r.exit_code == 2 and "--kv-cache-dtype: fp8 named twice; give each KV dtype once" in r.stderr
    r = run_cli(*base, "-g", ",H100")
    assert r.exit_code == 2 and "an empty entry in the list" in r.stderr


def test_solve_for_sglang_puts_no_sglang_page_size_in_the_vllm_line():
    # J16: `vllm serve ... --block-size 1`, SGLang's page size, which vLLM's attention backends do not take
    d = run_cli(
        "solve", "-m", "gemma3-27b", "-u", "50", "--max-model-len", "8K", "--engine", "sglang", "--json"
    ).json()
    lines = [a["vllm_flags"] for a in d["answers"] if a["vllm_flags"]]
    assert lines and not any("--block-size" in line for line in lines)
    v = run_cli("solve", "-m", "gemma3-27b", "-u", "50", "--max-model-len", "8K", "--json").json()
    assert all("--block-size 16" in a["vllm_flags"] for a in v["answers"] if a["vllm_flags"])


def test_vllm_only_flags_are_refused_under_sglang():
    # J9: --enforce-eager, --usage and --runner were taken under --engine sglang and changed nothing
    for flag in (["--enforce-eager"], ["--usage", "offline"], ["--runner", "pooling"]):
        r = run_cli(
            "estimate",
            "-m",
            "llama3.1-8b",
            "-g",
            "H100",
            "--max-model-len",
            "8K",
            "--engine",
            "sglang",
            *flag,
        )
        assert r.exit_code == 2 and f"{flag[0]} is a vllm flag; add --engine vllm or drop it" in r.stderr
    assert (
        run_cli(
            "estimate", "-m", "llama3.1-8b", "-g", "H100", "--max-model-len", "8K", "--enforce-eager"
        ).exit_code
        == 0
    )


def test_flags_for_layers_the_model_lacks_are_refused_but_a_logs_printed_defaults_are_not():
    # J19: --disable-hybrid-kv-cache-manager, --swa-full-tokens-ratio and --disable-hybrid-swa-memory on a model
    # without sliding-window/state layers changed nothing without a word
    base = ["estimate", "-m", "llama3.1-8b", "-g", "H100", "--max-model-len", "8K"]
    for flags, says in (
        (["--disable-hybrid-kv-cache-manager"], "has no sliding-window, chunked or state layers to group"),
        (["--engine", "sglang", "--swa-full-tokens-ratio", "0.3"], "has no sliding-window layers"),
        (["--engine", "sglang", "--disable-hybrid-swa-memory"], "has no sliding-window layers"),
    ):
        r = run_cli(*base, *flags)
        assert r.exit_code == 2 and says in r.stderr and "drop the flag" in r.stderr, r.stderr
    assert run_cli("estimate", "-m", "gemma3-27b", "-g", "H100", "--max-model-len", "8K", "--engine", "sglang",
                   "--swa-full-tokens-ratio", "0.3").exit_code == 0  # fmt: skip


def test_spec_mlp_fields_that_contradict_each_other_are_refused(tmp_path):
    # J10: mlp_pattern [moe] without a moe section lost the MLP (1.15 -> 0.40 GiB); a moe section no layer used,
    # and an mlp_pattern longer than the model, were planned without a word
    from pathlib import Path

    base = (
        Path(__file__).resolve().parent.parent / "model_specs" / "models" / "mixtral-8x7b.yaml"
    ).read_text()
    cases = [
        ("mlp_pattern: [none]\n", "the moe section applies to no layer"),
        (
            "mlp_pattern: [" + ", ".join(["moe"] * 40) + "]\n",
            "mlp_pattern has 40 entries but num_layers is 32",
        ),
    ]
    for extra, says in cases:
        p = tmp_path / "m.yaml"
        p.write_text(base + extra)
        r = run_cli("estimate", "-m", str(p), "-g", "H200", "--max-model-len", "4096")
        assert r.exit_code == 2 and says in r.stderr, r.stderr
    dense = "\n".join(line for line in base.splitlines() if not line.startswith(("moe:", "  num_experts", "  experts_per_token", "  expert_intermediate_size", "active_params", "total_params")))  # fmt: skip
    p = tmp_path / "d.yaml"
    p.write_text(dense + "\nmlp_pattern: [moe]\n")
    r = run_cli("estimate", "-m", str(p), "-g", "H200", "--max-model-len", "4096")
    assert r.exit_code == 2 and "mlp_pattern names 'moe' layers but there is no moe section" in r.stderr, (
        r.stderr
    )


def test_sglang_memory_rows_compute_as_printed():
    # J14: "x mem-fraction-static 0.743255 | 57.35 GiB" was (79.19 - 1.76) x f less 0.20 GiB of weight loading
    # shown nowhere: neither product of the rows above
    out = run_cli(
        "estimate", "-m", "gemma3-27b", "-g", "8xH100", "--max-model-len", "8K", "--engine", "sglang"
    ).stdout
    rows = {}
    for line in out.splitlines():
        if "│" in line and "GiB" in line:
            label, value = line.split("│")[0].strip(), line.split("│")[1].strip()
            rows[label] = float(value.removesuffix(" GiB"))
    total, startup = rows["GPU memory (runtime total)"], rows["- in use at startup (estimated)"]
    frac = next(k for k in rows if k.startswith("x mem-fraction-static"))
    f = float(frac.split()[-1])
    assert abs((total - startup) * f - rows[frac]) <= 0.01
    kv = rows[frac] - rows["- taken by weight loading (estimated)"] - rows["- weights (bf16)"]
    assert abs(kv - rows["= KV cache budget"]) <= 0.01
    # the JSON carries the same figure: requested + loading = (memory - in use at startup) x fraction
    d = run_cli("estimate", "-m", "gemma3-27b", "-g", "8xH100", "--max-model-len", "8K", "--engine", "sglang",
                "--json").json()  # fmt: skip
    loading = d["reserve"]["weight_loading_bytes"]
    assert loading > 0 and abs(loading / 2**30 - rows["- taken by weight loading (estimated)"]) < 0.01
    scaled = (d["memory_bytes_per_gpu"] - d["reserve_bytes_per_gpu"]) * d["settings"]["mem_fraction_static"]
    assert abs(d["requested_bytes_per_gpu"] + loading - scaled) <= 1


def test_a_shared_layer_must_read_an_attention_layers_kv(tmp_path):
    # J11: a `shared` layer after a state (or cross-attention) layer was planned; a recurrent state has no K/V
    spec = """name: tiny-shared
sources: [test]
num_layers: 4
hidden_size: 1024
num_attention_heads: 8
intermediate_size: 2048
vocab_size: 1000
max_context: 4096
layer_types:
  attn: {kind: full, num_kv_heads: 8, head_dim: 128}
  ssm: {kind: state, mixer: mamba2, conv_channels: 1024, conv_kernel: 4, ssm_heads: 8, ssm_head_dim: 64, ssm_state_dim: 64}
  reuse: {kind: shared, source: -1}
layer_pattern: [attn, ssm, reuse, attn]
"""
    p = tmp_path / "s.yaml"
    p.write_text(spec)
    r = run_cli("estimate", "-m", str(p), "-g", "H100")
    assert r.exit_code == 2 and "layer 2 shares KV with layer 1, a RecurrentState layer" in r.stderr, r.stderr
    p.write_text(
        spec.replace("layer_pattern: [attn, ssm, reuse, attn]", "layer_pattern: [ssm, attn, reuse, attn]")
    )
    assert run_cli("estimate", "-m", str(p), "-g", "H100").exit_code == 0
