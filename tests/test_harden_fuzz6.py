"""Issue 24: findings of the sixth fuzz pass (J-series) fixed this session, each test failing on the code before."""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize(
    ("model", "held"),
    [("gemma3-27b", 434), ("nemotron-h-56b", 199)],  # 8 and 6 padding layers; nemotron's state pages padded
)
def test_padding_layers_are_charged_as_vllm_charges_them(model, held):
    # J1: kvplan said 462 users for gemma3-27b on 8x H100 at 8K (218 for nemotron-h-56b) where vLLM's blocks
    # hold 435 (199; gemma3-27b 434 since its SigLIP tower's weights are counted): it counted the padding slots'
    # pages as usable. Now its figure is vLLM's:
    # (blocks - null block) // blocks a full-length request holds
    p = plan(model, "H100", num_gpus=8, max_model_len=8192)
    d = p.engine.details
    assert p.max_concurrency == held == (p.engine.num_blocks - 1) // d.held_blocks_per_request
    assert d.padding_layers > 0
    note = next(n for n in p.engine.differences if "padding layers" in n)
    assert note.endswith("kvplan charges a request for them as vLLM does")


def test_simulate_pool_of_a_grouped_vllm_layout_holds_what_vllms_blocks_hold():
    # J2: gemma3-27b on one H100 at 8K: vLLM's 14,307 blocks (14,952 before its SigLIP tower's weights were
    # counted) are shared by 7 KV-cache groups (a full-length request holds 902 of them), yet the simulator gave a
    # request one block per 16 tokens of all of them (~7x the engine's pool). Scaled by 512/902: 16 full-length
    # requests as vLLM
    import kvplan

    r = kvplan.simulate("gemma3-27b", gpus="H100", max_model_len="8K", num_prompts=20)
    d = r.to_dict()["deployment"]
    assert d["pool_tokens"] == (14307 * 512 // 902 - 1) * 16
    assert any(
        "14,307 shared by 7 KV-cache groups, scaled by 512/902" in a for a in r.to_dict()["assumptions"]
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


def test_vllm_before_0_8_prints_v0s_block_lines():
    # J8: --engine-version 0.5 printed V1's "Available KV cache memory" / "GPU KV cache size" lines. V0 logs
    # '# GPU blocks: N, # CPU blocks: M' and blocks x block size / max_model_len (the 0.7.2 log in
    # tests/fixtures/logs: 3365 blocks, 512 CPU blocks, 13.14x); it keeps no null block
    p = plan("llama2-7b", "L40S", engine_version="0.7.2", max_model_len=4096, dtype="fp16")
    n = p.engine.num_blocks
    # Llama-2-7B block: 16 tokens x 32 layers x 2 x 32 heads x 128 x 2 B = 8 MiB; 4 GiB of swap = 512
    assert p.engine.log_lines == [
        f"# GPU blocks: {n}, # CPU blocks: 512",
        f"Maximum concurrency for 4096 tokens per request: {n * 16 / 4096:.2f}x",
    ]
    assert p.max_concurrency == n * 16 // 4096  # no null block
    assert "V0 engine" in p.engine.differences[0]
    assert not any("Available KV cache memory" in line for line in p.engine.log_lines)


def test_vllm_before_0_8_refuses_engine_figures_for_hybrid_models():
    # J8: gemma3-27b at 0.5 printed V1's "Add 8 padding layers" line; V0 had no KV-cache groups
    p = plan("gemma3-27b", "H100", engine_version="0.7", max_model_len=8192)
    assert not p.engine.supported
    assert "V0 engine" in p.engine.reason and "--engine-version 0.8" in p.engine.reason
    v1 = plan("gemma3-27b", "H100", engine_version="0.8", max_model_len=8192)
    assert v1.engine.supported
    # V0's figure is kvplan's own (no padding charged); V1's charges the padding slots
    assert p.max_concurrency >= v1.max_concurrency


@pytest.mark.parametrize("command", [("estimate",), ("simulate", "--num-prompts", "5")])
def test_max_num_batched_tokens_is_refused_under_sglang(command):
    # J9: SGLang's step budget is --chunked-prefill-size; the flag was dropped silently (simulate's output
    # was byte-identical with and without it, estimate only lost an assumption line)
    r = run_cli(*command, "-m", "llama3.1-8b", "-g", "H100", "--max-model-len", "8K", "--engine", "sglang",
                "--max-num-batched-tokens", "2048")  # fmt: skip
    assert r.exit_code == 2
    assert r.stderr.strip() == (
        "error: --max-num-batched-tokens is a vllm flag; SGLang's step budget is --chunked-prefill-size: "
        "give that, or add --engine vllm"
    )
    sglang = plan("llama3.1-8b", "H100", max_model_len=8192, engine="sglang")
    assert not any("--max-num-batched-tokens" in a for a in sglang.assumptions)


def test_network_on_one_node_is_said_to_play_no_part():
    # J19: --network 25G on one H100 was accepted with byte-identical output
    r = run_cli("estimate", "-m", "llama3.1-8b", "-g", "H100", "--network", "25G", "--json")
    assert r.exit_code == 0
    assert (
        "--network 25G: every link of this layout stays inside one node, so the fabric plays no part"
        in (r.json()["assumptions"])
    )
    across = run_cli("estimate", "-m", "llama3.1-70b", "-g", "16xH100", "-tp", "8", "-pp", "2",
                     "--network", "25G", "--json").json()  # fmt: skip
    assert not any("plays no part" in a for a in across["assumptions"])
    assert any("(--network)" in a for a in across["assumptions"])


def test_a_started_log_whose_weights_kvplan_cannot_fit_asks_for_the_weight_format():
    # J3: an L40S log of an llm-compressor FP8 checkpoint (quantization=compressed-tensors, 32.20 GiB loaded) was
    # refused with "use more GPUs (-tp/-pp), a smaller --weight-dtype, or a larger GPU": check-log takes no
    # -tp/-pp, and the log already ran on that GPU; compressed-tensors names no format
    from pathlib import Path

    logs = Path(__file__).parent / "fixtures" / "logs" / "real"
    hf = Path(__file__).parent / "fixtures" / "hf" / "corpus"
    log = str(logs / "vllm_0.11.0_deepseek-r1-distill-qwen-32b-fp8_l40s_tp1.log")
    args = ("check-log", log, "--model", str(hf / "qwen2.5-32b-instruct.json"), "--gpus", "L40S")
    r = run_cli(*args)
    assert r.exit_code == 3
    assert r.stderr.strip() == (
        "error: weights need 61.03 GiB per GPU (stage 0, TP 1, PP 1) but L40S x 0.9 gives 40.07 GiB (the log "
        "loaded 32.20 GiB); the log's quantization compressed-tensors does not say its format: give "
        "--weight-dtype as the checkpoint's quantization_config says (fp8, int8, int4 or nvfp4)"
    )
    assert run_cli(*args, "--weight-dtype", "fp8").exit_code == 0


_TINY = """name: tiny
sources: [fuzz]
num_layers: 8
hidden_size: 2048
num_attention_heads: 16
intermediate_size: 8192
vocab_size: 32000
max_context: 8192
layer_types:
  full: {kind: full, num_kv_heads: 4, head_dim: 128}
"""


def _tiny(tmp_path, extra: str, pattern: str):
    path = tmp_path / "tiny.yaml"
    path.write_text(_TINY + f"  {extra}\nlayer_pattern: {pattern}\n")
    return path


@pytest.mark.parametrize(
    ("extra", "pattern", "message"),
    [
        # J11: a state of (conv_kernel - 1) = 0 rows held 0 bytes and printed as '4x mamba2()'
        ("s: {kind: state, mixer: mamba2, conv_channels: 4096, conv_kernel: 1}", "[s, full]",
         "layer_types.s.state: mixer mamba2: the state holds nothing (conv_kernel - 1 = 0 rows, ssm 0 x 0 x 0): "
         "give conv_kernel >= 2 with conv_channels, or ssm_heads, ssm_head_dim and ssm_state_dim"),
        # J18: windows, chunks and ratios beyond the context planned silently
        ("sw: {kind: sliding, window: 100000, num_kv_heads: 4, head_dim: 128}", "[sw, full]",
         "layer_types.sw: window 100,000 >= max_context 8,192: every token is kept; write it as kind: full"),
        ("ch: {kind: chunked, chunk: 8192, num_kv_heads: 4, head_dim: 128}", "[ch, full]",
         "layer_types.ch: chunk 8,192 >= max_context 8,192: every token is kept; write it as kind: full"),
        ("c: {kind: compressed, ratio: 100000, num_kv_heads: 4, head_dim: 128}", "[c, full]",
         "layer_types.c.ratio 100,000 is beyond max_context 8,192: no request fills one entry"),
    ],
)  # fmt: skip
def test_spec_layers_that_hold_nothing_or_everything_are_refused(tmp_path, extra, pattern, message):
    path = _tiny(tmp_path, extra, pattern)
    r = run_cli("estimate", "-m", str(path), "-g", "H100")
    assert r.exit_code == 2
    assert r.stderr.strip() == f"error: {path}: {message}"


def test_a_specs_images_per_request_is_used_and_decode_reads_the_image_kv(tmp_path):
    # J12: the spec's images_per_request: 3 was overridden by the CLI default of 1; a cross-only model's decode
    # read "0 B" of KV though each request holds its images' K/V
    path = _tiny(tmp_path, "x: {kind: cross, num_kv_heads: 4, head_dim: 128, image_tokens: 6404, images_per_request: 3}",
                 "[full, full, full, x]")  # fmt: skip
    p = plan(str(path), "H100", max_model_len=4096)
    assert any(
        a.startswith("3 image(s) per request in the cross-attention layers (the spec's")
        for a in p.assumptions
    )
    # two cross layers, each K and V of 6,404 image tokens x 3 images x 4 heads x 128 x 2 B
    image = 2 * (2 * 6404 * 3 * 4 * 128 * 2)
    assert p.kv_bytes_per_request_fixed == image
    given = plan(str(path), "H100", max_model_len=4096, images_per_request=1)
    assert given.kv_bytes_per_request_fixed == image // 3
    only = _tiny(tmp_path, "x: {kind: cross, num_kv_heads: 4, head_dim: 128, image_tokens: 1601}", "[x]")
    q = plan(str(only), "H100", max_model_len=4096)
    assert q.decode.batch_1.kv_bytes_read == q.kv_bytes_per_request_per_gpu > 0
