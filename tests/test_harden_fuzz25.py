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
    first = out["answers"][0]
    assert (first["max_model_len"], first["data_parallel_size"], first["kv_cache_dtype"]) == (
        131072,
        2,
        "fp8",
    )
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
