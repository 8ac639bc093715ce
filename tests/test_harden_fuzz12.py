"""Issues 22/23: findings of the twelfth fuzz pass (Q-series: hybrid models and prefix sharing under load), each
test failing on the code before."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.helpers import run_cli


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
        steps.add(r["steps"])
    assert len(steps) == 1  # the same schedule whatever --max-model-len


def test_sglang_without_the_radix_cache_runs_one_request_a_state_slot():
    # Q3: with the radix cache off SGLang takes one state slot a request (3 with it on): kvplan kept the //3 cap
    # (226 of 679 slots for qwen3-next on 2x H200)
    args = ("-m", "qwen3-next-80b-a3b", "-g", "2xH200", "--max-model-len", "4K", "--engine", "sglang")
    on = run_cli("estimate", *args, "--json").json()
    off = run_cli("estimate", *args, "--no-enable-prefix-caching", "--json").json()
    slots = on["engine"]["details"]["mamba_cache_slots"]
    assert on["max_concurrency"] == slots // 3 and on["limited_by"] == "state_pool"
    assert off["max_concurrency"] > slots // 3 and off["limited_by"] != "state_pool"
    sim = run_cli("simulate", *args, "--no-enable-prefix-caching", "--num-prompts", "10", "--json").json()
    assert sim["deployment"]["max_num_seqs"] == slots


def test_shipped_qwen35_specs_keep_their_mtp_layer():
    # Q5: the shipped qwen3.5-9b spec dropped the checkpoint's MTP layer (config.json mtp_num_hidden_layers 1):
    # --speculative-config mtp was refused as 'has no MTP layers'
    r = run_cli("estimate", "-m", "qwen3.5-9b", "-g", "H100", "--max-model-len", "8K", "--speculative-config",
                '{"method":"mtp","num_speculative_tokens":2}', "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert r.json()["speculative_memory"]["layers"] == 1
