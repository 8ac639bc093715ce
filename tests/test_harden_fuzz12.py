"""Issues 22/23: findings of the twelfth fuzz pass (Q-series: hybrid models and prefix sharing under load), each
test failing on the code before."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.helpers import draft_for, run_cli


def _shared_prefix_trace(path: Path, n: int, seed: int, gap_ms: int) -> Path:
    """A Mooncake trace whose prompts share 512-token blocks: a few system prompts, later turns extending
    earlier prompts, some prompts of their own, half with a partial last block."""
    rng = random.Random(seed)
    next_id = 1000

    def new(k: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + k))
        next_id += k
        return ids

    systems = [new(rng.randint(2, 8)) for _ in range(5)]
    history: list[list[int]] = []
    lines = []
    for i in range(n):
        r = rng.random()
        if history and r < 0.4:
            ids = rng.choice(history) + new(rng.randint(1, 4))
        elif r < 0.85:
            ids = rng.choice(systems) + new(rng.randint(1, 6))
        else:
            ids = new(rng.randint(1, 10))
        length = len(ids) * 512
        if rng.random() < 0.5:
            length -= rng.randint(1, 511)
        history.append(ids if length == len(ids) * 512 else ids[:-1])
        lines.append(json.dumps({"timestamp": i * gap_ms, "input_length": length, "output_length": 16,
                                 "hash_ids": ids}))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def test_sglang_admission_rechecks_once_the_prefix_is_locked(tmp_path):
    # Q1: the admission test counted the request's own matched prefix as evictable and never re-checked after
    # locking it (schedule_policy.py add_one_req does): KV usage reached 109% of a 11,468-token pool
    trace = _shared_prefix_trace(tmp_path / "t.jsonl", 80, 2, 200)
    for seed_trace in (trace, _shared_prefix_trace(tmp_path / "t3.jsonl", 80, 3, 200)):
        r = run_cli("simulate", "-m", "llama3.1-8b", "-g", "H100", "--max-model-len", "16K", "--engine", "sglang",
                    "--trace", str(seed_trace), "--kv-cache-memory", "1.4GiB", "--json").json()  # fmt: skip
        assert r["deployment"]["pool_tokens"] == 11468
        assert r["kv_usage"]["peak"] <= 1.0
        assert all(p["fraction"] <= 1.0 for p in r["kv_usage"]["series"])
        assert r["completed"] == 80


def test_vllm_simulation_charges_a_hybrids_state_pages_per_request():
    # Q2: qwen3.5-9b's 6 state pages (3 GDN groups x 2) were charged pro rata to the context, so the same
    # 256-in / 64-out workload ran 1,000 requests at once at --max-model-len 32K but 464 at 320; vLLM's pool
    # (3,249 blocks of 528) and a request's 7 blocks are the same at both: (3,249 - 1) // 7 = 464
    steps = set()
    for length in ("320", "32K"):
        r = run_cli("simulate", "-m", "qwen3.5-9b", "-g", "H100", "--max-model-len", length, "--num-prompts",
                    "1000", "--input-len", "256", "--output-len", "64", "--json").json()  # fmt: skip
        assert r["deployment"]["num_gpu_blocks"] == 3249
        assert any("6 state page(s) a request" in a for a in r["assumptions"])
        # 464 at once: the KV usage peak is 464 x 7 of the 3,249 blocks and the null block (one more would
        # need 465 x 7 = 3,255)
        assert round(r["kv_usage"]["peak"] * 3249) == 464 * 7 + 1
        steps.add(r["steps"])
    assert len(steps) == 1  # the same schedule whatever --max-model-len


def test_sglang_without_the_radix_cache_runs_one_request_a_state_slot():
    # Q3: with the radix cache off SGLang takes one state slot a request (3 with it on): kvplan kept the //3 cap
    # (226 of 679 slots for qwen3-next on 2x H200)
    args = ("-m", "qwen3-next-80b-a3b", "-g", "2xH200", "--max-model-len", "4K", "--engine", "sglang")
    on = run_cli("estimate", *args, "--json").json()
    off = run_cli("estimate", *args, "--no-enable-prefix-caching", "--json").json()
    slots = on["engine"]["details"]["mamba_cache_slots"]
    assert slots == 679
    assert on["max_concurrency"] == 226 and on["limited_by"] == "state_pool"  # 679 // 3
    # radix off: 679 slots bind no more; SGLang's own figure is its pool / 4,096 tokens a request
    assert off["limited_by"] == "kv_cache" and off["engine"]["max_concurrency"] == pytest.approx(
        2371976 / 4096
    )
    sim = run_cli("simulate", *args, "--no-enable-prefix-caching", "--num-prompts", "10", "--json").json()
    assert sim["deployment"]["max_num_seqs"] == slots


def test_shipped_qwen35_specs_keep_their_mtp_layer():
    # Q5: the shipped qwen3.5-9b spec dropped the checkpoint's MTP layer (config.json mtp_num_hidden_layers 1):
    # --speculative-config mtp was refused as 'has no MTP layers'
    r = run_cli("estimate", "-m", "qwen3.5-9b", "-g", "H100", "--max-model-len", "8K", "--speculative-config",
                '{"method":"mtp","num_speculative_tokens":2}', "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert r.json()["speculative_memory"]["layers"] == 1


def test_review_a_draft_in_a_kv_group_of_its_own_is_split_off_the_budget(tmp_path):
    # review: qwen3-next's EAGLE draft (a Llama head, another page size) forms a KV-cache group of its own that no
    # target layer's charge carried: kvplan said 89 requests (vLLM's own figure 79.8) and the draft's KV 0 bytes
    r = run_cli("estimate", "-m", "qwen3-next-80b-a3b", "-g", "2xH200", "--max-model-len", "32K",
                "--speculative-config", '{"method":"eagle","num_speculative_tokens":3}', "--speculative-draft-config",
                draft_for("qwen3-next-80b-a3b", tmp_path), "--acceptance-length",
                "2", "--json").json()  # fmt: skip
    assert r["max_concurrency"] <= int(r["engine"]["max_concurrency"])
    assert r["speculative_memory"]["kv_bytes_per_gpu"] > 0


def test_review_the_running_caps_bind_at_the_average_context_too():
    # review: --avg-context (and the disaggregated decode pool built on it) ignored SGLang's state-pool cap when
    # the KV pool bound at max-model-len: 876 where SGLang runs 226
    r = run_cli("estimate", "-m", "qwen3-next-80b-a3b", "--engine", "sglang", "--disaggregated", "--prefill-gpus",
                "2xH200", "--decode-gpus", "2xH200", "--max-model-len", "256K", "--input-len", "1000",
                "--output-len", "1000", "--json").json()["disaggregated"]  # fmt: skip
    assert r["decode"]["concurrency_per_replica"] == 226


def test_review_the_prefix_caching_row_counts_every_attention_rank():
    # review: under SGLang DP attention the shared-prefix row gave one rank's requests (8) beside the replica's (56)
    r = run_cli("estimate", "-m", "deepseek-v3", "-g", "8xH200", "--engine", "sglang", "--enable-dp-attention",
                "-dp", "8", "--max-model-len", "32K", "--shared-prefix-tokens", "2K", "--json").json()  # fmt: skip
    assert r["max_concurrency"] == 56 and r["prefix_caching"]["max_concurrency_per_replica"] == 64


@pytest.mark.parametrize(
    "layout",
    [
        ("gemma2-27b", "2xH100", "2", "1"),
        ("qwen3-next-80b-a3b", "4xH100", "2", "2"),
        ("gpt-oss-20b", "2xH100", "2", "1"),
    ],
)
def test_round13_a_separate_draft_group_under_pp_is_held_to_vllms_count(layout, tmp_path):
    # R1: PP 2 with an EAGLE draft whose layers form a KV-cache group of their own: kvplan said 37 / 194 / 560
    # requests where vLLM's (blocks - 1) // held gives 18 / 118 / 280
    model, gpus, pp, tp = layout
    r = run_cli("estimate", "-m", model, "-g", gpus, "-pp", pp, "-tp", tp, "--max-model-len", "8K",
                "--speculative-config", '{"method":"eagle","num_speculative_tokens":2}', "--acceptance-length", "2",
                "--speculative-draft-config", draft_for(model, tmp_path), "--json").json()  # fmt: skip
    d = r["engine"]["details"]
    assert (
        r["max_concurrency_per_replica"]
        == (min(d["num_blocks_per_stage"]) - 1) // d["held_blocks_per_request"]
    )


def test_round13_vllm_v0_has_prefix_caching_off_unless_asked():
    # R3: simulate --engine-version 0.5 ran with prefix caching on; V0 enabled it only with --enable-prefix-caching
    args = ("simulate", "-m", "llama3.1-8b", "-g", "H100", "--max-model-len", "8K", "--num-prompts", "5",
            "--json")  # fmt: skip
    assert run_cli(*args, "--engine-version", "0.7").json()["deployment"]["enable_prefix_caching"] is False
    asked = run_cli(*args, "--engine-version", "0.7", "--enable-prefix-caching").json()
    assert asked["deployment"]["enable_prefix_caching"] is True
    assert run_cli(*args).json()["deployment"]["enable_prefix_caching"] is True  # V1's default


def test_round13_lfm2_defaults_and_older_keys(tmp_path):
    # R4/R5: without block_auto_adjust_ff_dim (Lfm2Config's default True) the MLP was 12,288 wide (1.573B for
    # 1.170B); tie_embedding: false (LFM2's older key) was read as tied
    from tests.helpers import plan

    base = json.loads(
        (Path(__file__).parent / "fixtures" / "hf" / "corpus" / "lfm2.5-vl-1.6b.json").read_text()
    )
    text = base.get("text_config", base)
    text.pop("block_auto_adjust_ff_dim", None)
    (tmp_path / "a.json").write_text(json.dumps(base))
    assert plan(str(tmp_path / "a.json"), "H100", max_model_len=8192).params_total == 1_170_339_840
    text["tie_embedding"] = False
    (tmp_path / "b.json").write_text(json.dumps(base))
    assert (
        plan(str(tmp_path / "b.json"), "H100", max_model_len=8192).params_total
        == 1_170_339_840 + 65536 * 2048
    )
