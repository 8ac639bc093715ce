"""vLLM's --max-model-len auto (or -1): estimate plans the length vLLM fits, check-log reads a log of it.

vLLM 0.14 (PR #29431) fits max_model_len after profiling to the longest one request of which the KV
memory holds (vllm/v1/core/kv_cache_utils.py _auto_fit_max_model_len) and logs "Auto-fit
max_model_len: reduced from X to Y ...". check-log refused such a log ("the log's max_model_len=-1 is
negative"), and estimate could not be asked the question at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.errors import RequestDoesNotFit
from kvplan.logs import checklog, logparse
from tests.helpers import plan, run_cli

REAL = Path(__file__).resolve().parent / "fixtures" / "logs" / "real"
AUTOFIT_LOG = REAL / "vllm_0.1.dev20058_qwen3.8-27b-exl3_16gib_tp1_autofit.log"


def test_auto_fits_the_longest_request_the_pool_holds():
    fitted = plan("llama3.1-8b", "L4", max_model_len_auto=True)
    n = fitted.settings.max_model_len
    assert fitted.settings.max_model_len_auto_from == 131_072 and 1_000 < n < 131_072
    assert fitted.max_concurrency == 1  # one request of the fitted length fills the pool
    # the fit is the boundary of kvplan's own refusal: one token more does not fit
    assert plan("llama3.1-8b", "L4", max_model_len=n).settings.max_model_len == n
    with pytest.raises(RequestDoesNotFit):
        plan("llama3.1-8b", "L4", max_model_len=n + 1)
    kv = fitted.engine.available_kv_bytes / 2**30
    assert fitted.engine.log_lines[:3] == [
        f"Available KV cache memory: {kv:.2f} GiB",
        f"Auto-fit max_model_len: reduced from 131072 to {n} to fit in available GPU memory "
        f"({kv:.2f} GiB available for KV cache)",
        fitted.engine.log_lines[2],
    ]
    assert f"Maximum concurrency for {n:,} tokens per request" in fitted.engine.log_lines[2]
    assert any(a.startswith(f"--max-model-len auto: vLLM fits {n:,} tokens") for a in fitted.assumptions)


def test_auto_keeps_the_full_context_where_it_fits():
    p = plan("llama3.1-8b", "H100", max_model_len_auto=True)
    assert p.settings.max_model_len == 131_072 == p.settings.max_model_len_auto_from
    assert "Auto-fit max_model_len: full model context length 131072 fits in available GPU memory" in (
        p.engine.log_lines
    )
    same = plan("llama3.1-8b", "H100")
    assert p.max_concurrency == same.max_concurrency and p.engine.num_blocks == same.engine.num_blocks


def test_cli_takes_auto_and_minus_one_alike():
    auto = run_cli("estimate", "-m", "llama3.1-8b", "-g", "L4", "--max-model-len", "auto", "--json").json()
    minus = run_cli("estimate", "-m", "llama3.1-8b", "-g", "L4", "--max-model-len=-1", "--json").json()
    assert auto["settings"]["max_model_len"] == minus["settings"]["max_model_len"] < 131_072
    assert auto["settings"]["max_model_len_auto_from"] == 131_072
    text = run_cli("estimate", "-m", "llama3.1-8b", "-g", "L4", "--max-model-len", "auto").stdout
    assert f"max-model-len {auto['settings']['max_model_len']:,} tokens (auto)" in text
    fixed = run_cli("estimate", "-m", "llama3.1-8b", "-g", "L4", "--max-model-len", "8K", "--json").json()
    assert fixed["settings"]["max_model_len_auto_from"] is None


@pytest.mark.parametrize(
    ("flags", "code", "message"),
    [
        (["--engine", "sglang"], 2, "--max-model-len auto is vLLM's; SGLang serves the context length given"),
        (["--engine-version", "0.13"], 2, "--max-model-len auto came in vLLM 0.14; vLLM 0.13 takes a length"),
        (["--kv-cache-memory", "1MiB"], 3, "vLLM cannot auto-fit --max-model-len: 1 MiB of KV memory"),
    ],
)
def test_auto_refused_where_the_engine_has_none_or_nothing_fits(flags, code, message):
    r = run_cli("estimate", "-m", "llama3.1-8b", "-g", "L4", "--max-model-len", "auto", *flags)
    assert r.exit_code == code
    assert r.stderr.strip().startswith(f"error: {message}")
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_real_auto_fit_log_is_read_not_refused():
    # a real startup launched with --max-model-len auto (tests/fixtures/logs/real/SOURCES.tsv): the
    # arguments say -1, the engine config the model's 262,144, the concurrency line the fitted length
    text = AUTOFIT_LOG.read_text()
    assert "'max_model_len': -1" in text and "max_seq_len=262144" in text
    log = logparse.parse(text)
    assert log.get("max_model_len_auto") is True
    assert (log.get("auto_fit_from"), log.get("auto_fit_to"), log.get("max_model_len")) == (
        262_144,
        172_032,
        172_032,
    )
    assert log.get("version") is None and log.get("untagged_version") == "0.1.dev20058+g1f1617e26"
    assert checklog._max_model_len_note(log.facts) == (
        "vLLM --max-model-len auto: the engine fitted 172,032 tokens (from 262,144)"
    )


def test_check_log_reproduces_the_fit_from_the_logged_kv_memory(tmp_path):
    # kvplan's own predicted startup lines for an auto launch, read back: the arithmetic from the
    # logged KV memory fits the same length and the note names it
    p = plan("llama3.1-8b", "L4", max_model_len_auto=True)
    lines = [
        "INFO 12-01 10:00:00 [api_server.py:1] vLLM API server version 0.33.0",
        "INFO 12-01 10:00:00 [utils.py:1] non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B-Instruct', "
        "'model': 'meta-llama/Llama-3.1-8B-Instruct', 'max_model_len': -1}",
        *(f"INFO 12-01 10:00:10 [kv_cache_utils.py:1] {line}" for line in p.engine.log_lines),
    ]
    path = tmp_path / "auto.log"
    path.write_text("\n".join(lines) + "\n")
    d = run_cli("check-log", str(path), "-g", "L4", "--json").json()
    n = p.settings.max_model_len
    row = next(r for r in d["arithmetic"] if r["quantity"] == "max-model-len (auto-fit)")
    # the logged 4.60 GiB is rounded to 0.01 GiB: one block (16 tokens) either way is that rounding
    assert row["log"] == n and abs(row["kvplan"] - n) <= 16
    assert row["cause"].startswith("matches")
    assert f"vLLM --max-model-len auto: the engine fitted {n:,} tokens (from 131,072)" in d["notes"]
    assert d["setup"]["max_model_len"] == n


def test_python_api_takes_auto():
    import kvplan

    p = kvplan.estimate("llama3.1-8b", gpus="L4", max_model_len="auto")
    assert p.settings.max_model_len_auto_from == 131_072
    assert (
        p.settings.max_model_len == plan("llama3.1-8b", "L4", max_model_len_auto=True).settings.max_model_len
    )
