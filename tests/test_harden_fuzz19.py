"""Session 15 hardening: fuzz pass 19's findings (each test failing on the code before)."""

from __future__ import annotations

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
