"""Issues 23/24: findings of the eighth fuzz pass (L-series: memory-table arithmetic, configs, speculative decoding,
DP attention), each test failing on the code before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import plan, run_cli

CORPUS = Path(__file__).parent / "fixtures" / "hf" / "corpus"
DSV3 = ("-m", "deepseek-v3", "-g", "8xH200", "--engine", "sglang", "-tp", "8", "--kv-cache-dtype", "fp8",
        "--max-model-len", "32K")  # fmt: skip


def test_sglang_divides_max_running_requests_over_dp_attention_ranks():
    # L1: with --enable-dp-attention --dp-size 8, --max-running-requests 16 was ignored: 120 requests planned and
    # the decode timed at batch 120; SGLang gives each rank 16 // 8 = 2 (simulate already did)
    r = run_cli("estimate", *DSV3, "--enable-dp-attention", "--dp-size", "8", "--max-running-requests", "16",
                "--json").json()  # fmt: skip
    assert r["max_concurrency"] == 16 and r["limited_by"] == "max_num_seqs"
    assert r["decode"]["at_max_concurrency"]["batch"] == 16
    assert any(a.startswith("--max-running-requests over 8 attention-DP ranks: 2 a rank, 16 in all")
               for a in r["assumptions"])  # fmt: skip
    text = run_cli(
        "estimate", *DSV3, "--enable-dp-attention", "--dp-size", "8", "--max-running-requests", "16"
    )
    assert "(capped by --max-running-requests; memory holds" in " ".join(text.stdout.split())
    sim = run_cli("simulate", *DSV3, "--enable-dp-attention", "--dp-size", "8", "--max-running-requests", "16",
                  "--num-prompts", "4", "--json").json()  # fmt: skip
    assert sim["deployment"]["max_num_seqs"] * sim["deployment"]["attention_dp_ranks"] == 16


def test_a_gemma3_config_without_the_tie_key_is_tied():
    # L2: transformers leaves tie_word_embeddings out of config.json where it equals the class default (True for
    # Gemma 3); kvplan read the absence as untied and counted a 262,208 x 5,376 LM head the model does not have
    from_config = plan(str(CORPUS / "gemma-3-27b-it.json"), "H100", max_model_len=8192)
    shipped = plan("gemma3-27b", "H100", max_model_len=8192)
    # the text model's 27,008,663,808 and (since session 17) the SigLIP tower and projector vLLM loads beside it
    assert from_config.params_total == shipped.params_total == 27_431_724_144
    assert from_config.max_concurrency == shipped.max_concurrency
    assert (
        "tie_word_embeddings absent: tied, gemma3_text's default (no LM head of its own)"
        in from_config.assumptions
    )
    # elsewhere the absence is read as untied, and said
    scout = plan(str(CORPUS / "llama-4-scout-17b-16e-instruct.json"), "H100", num_gpus=8, max_model_len=8192)
    assert any(a.startswith("tie_word_embeddings absent: read as untied") for a in scout.assumptions)


def test_an_eagle3_draft_head_is_sized_by_its_draft_vocabulary(tmp_path):
    # L3: the EAGLE-3 head predicts over draft_vocab_size (vLLM llama_eagle3.py ParallelLMHead(draft_vocab_size)),
    # not vocab_size: 793,784,320 parameters were counted where the head is 32,000 x 4,096
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 4096,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1,
           "vocab_size": 128256, "draft_vocab_size": 32000, "max_position_embeddings": 2048,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16"}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = run_cli("estimate", "-m", "llama3.1-8b", "-g", "H100", "--max-model-len", "8K", "--speculative-config",
                '{"method":"eagle3","num_speculative_tokens":3}', "--speculative-draft-config",
                str(tmp_path / "config.json"), "--acceptance-length", "2.5", "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    h = 4096
    attention = h * h + 2 * h * 1024 + h * h  # q, k, v (8 KV heads x 128), o
    mlp = 3 * h * 14336
    fc = 3 * h * h  # three layers' features fused
    qkv_inputs = h * (32 + 2 * 8) * 128  # the first layer's q/k/v take [embedding, hidden]: h more inputs
    head = 32000 * h
    own = attention + mlp + fc + qkv_inputs + head
    d = r.json()["speculative_memory"]
    assert own < d["weight_bytes_per_gpu"] / 2 <= own + 4 * h  # + the layer's norms
    assert "LM head over 32,000 tokens" in d["rule"]


@pytest.mark.parametrize(("steps", "tokens"), [("3", "2"), ("1", "5")])
def test_sglang_draft_tokens_other_than_steps_plus_one_are_refused(steps, tokens):
    # L4: SGLang sets --speculative-num-draft-tokens to steps + 1 when top-k is 1 (server_args.py); kvplan priced
    # combinations that never run (3 draft passes verified over 2 tokens)
    r = run_cli("estimate", *DSV3, "--speculative-algorithm", "NEXTN", "--speculative-num-steps", steps,
                "--speculative-num-draft-tokens", tokens)  # fmt: skip
    assert r.exit_code == 2
    assert r.stderr.strip() == (
        f"error: --speculative-num-draft-tokens {tokens}: with top-k 1 (the only kind kvplan models) SGLang sets it "
        f"to --speculative-num-steps + 1 = {int(steps) + 1}; give that or leave it out"
    )
    ok = ("--speculative-num-steps", steps, "--speculative-num-draft-tokens", str(int(steps) + 1))
    assert run_cli("estimate", *DSV3, "--speculative-algorithm", "NEXTN", *ok).exit_code == 0


def _rows(stdout: str) -> dict[str, float]:
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) == 3 and cells[1].endswith(" GiB"):
            rows[cells[0]] = float(cells[1].removesuffix(" GiB").replace(",", ""))
    return rows


def test_the_memory_table_computes_as_printed_with_a_draft_and_the_samplers_hidden_states():
    # L5: with an MTP draft, '= KV cache budget' (43.41 GiB) was 0.71 GiB under the rows above it (44.12): the
    # draft's share had no row. L6: 'the larger of' 0.66 and 1.96 GiB was 2.08: the forward's hidden states held
    # through the sampler had no row
    r = run_cli("estimate", "-m", "deepseek-v3", "-g", "8xH200", "--max-model-len", "8K", "--speculative-config",
                '{"method":"mtp","num_speculative_tokens":2}')  # fmt: skip
    rows = _rows(r.stdout)
    util = next(v for k, v in rows.items() if k.startswith("x gpu-memory-utilization"))
    weights = next(v for k, v in rows.items() if k.startswith("- weights"))
    reserve = rows["- activation/workspace reserve (estimated)"]
    draft = rows["- the draft's share (mtp, 1 layer(s))"]
    assert util - weights - reserve - draft == pytest.approx(rows["= KV cache budget"], abs=0.015)
    j = run_cli("estimate", "-m", "deepseek-v3", "-g", "8xH200", "--max-model-len", "8K", "--speculative-config",
                '{"method":"mtp","num_speculative_tokens":2}', "--json").json()  # fmt: skip
    assert (
        j["kv_budget_bytes_per_gpu"] + j["speculative_memory"]["kv_bytes_per_gpu"]
        == j["engine"]["available_kv_bytes"]
    )
    res = j["reserve"]
    assert res["profile_peak_bytes"] == max(
        res["activation_bytes"], res["sampler_bytes"] + res["sampler_hidden_bytes"]
    )
    assert res["sampler_hidden_bytes"] == 8192 * 7168 * 2  # batched tokens x hidden x bf16
    assert rows["+ the forward's hidden states it holds"] == pytest.approx(8192 * 7168 * 2 / 2**30, abs=0.005)


def test_dp_attention_concurrency_rows_count_in_one_unit():
    # L7: under SGLang DP attention the no-paging and paged rows gave one rank's requests (7) beside a headline of
    # the replica's (56), and the factor row said 'per replica' for one rank's figure
    r = run_cli("estimate", *DSV3, "--enable-dp-attention", "--dp-size", "8")
    lines = {ln.split("│")[0].strip(): ln.split("│")[1].strip() for ln in r.stdout.splitlines() if "│" in ln}
    head = int(next(v for k, v in lines.items() if k.startswith("max concurrent requests")).replace(",", ""))
    factor = float(lines["KV blocks / blocks one request holds, per attention-DP rank"].rstrip("x"))
    assert head == 8 * int(factor)
    paged = next(v for k, v in lines.items() if k.startswith("paged blocks at the same context"))
    assert int(paged.split()[0].replace(",", "")) == head
