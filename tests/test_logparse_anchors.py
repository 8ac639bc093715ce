"""The log reader reads only the lines that hold one of its anchor words (logparse._ANCHORS): every
fixture log must give the same facts, evidence and engine as reading every line does."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.logs import logparse

LOGS = sorted(
    p
    for p in (Path(__file__).parent / "fixtures" / "logs").rglob("*")
    if p.is_file() and p.suffix in (".log", ".md", ".txt")
)


def _every_line(text: str) -> logparse.ParsedLog:
    log = logparse.ParsedLog()
    log.engine = logparse._which_engine(text)
    if log.engine is None:
        return log
    read_line, read_text = logparse._FORMATS[log.engine]
    for line in logparse.join_wrapped_args(text).splitlines():  # a hard-wrapped args dict as one line
        read_line(log, line)
    if read_text is not None:
        read_text(log, text)
    return log


def _anchored(text: str) -> logparse.ParsedLog:
    """The anchored reader over the whole text (parse() then keeps only the last of several startups)."""
    log = logparse._parse(text, logparse._which_engine(text))
    if log.engine is not None and (read_text := logparse._FORMATS[log.engine][1]) is not None:
        read_text(log, text)
    return log


def test_there_are_fixture_logs_of_both_engines():
    engines = {logparse.parse(p.read_text(encoding="utf-8", errors="replace")).engine for p in LOGS}
    assert len(LOGS) >= 30 and {"vllm", "sglang"} <= engines


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_reading_the_anchored_lines_gives_what_reading_every_line_gives(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        want = _every_line(text)
    except Exception as exc:  # a log the reader refuses is refused the same way
        with pytest.raises(type(exc)):
            _anchored(text)
        return
    got = _anchored(text)
    assert (got.engine, got.facts, got.evidence) == (want.engine, want.facts, want.evidence)


def test_a_line_ending_in_cr_lf_or_a_form_feed_splits_as_splitlines_does():
    text = "INFO GPU KV cache size: 1,000 tokens\r\nx\x0cINFO Model loading took 15.0 GiB\r\nvllm\n"
    got = logparse.parse(text)
    assert got.facts["kv_cache_tokens"] == 1000 and got.facts["weights_bytes"] == 15 * 2**30
    assert (got.facts, got.evidence) == (_every_line(text).facts, _every_line(text).evidence)


def test_a_log_of_noise_is_scanned_not_read_line_by_line(monkeypatch):
    """16M one-character lines after a real log: the line reader sees only the real log's anchored
    lines (benchmarks/bench_estimate.py prints how long such a log takes)."""
    head = (Path(__file__).parent / "fixtures" / "logs" / "vllm_v011_llama31_8b_h100.log").read_text()
    seen: list[str] = []
    read_line, read_text = logparse._FORMATS["vllm"]
    monkeypatch.setitem(
        logparse._FORMATS, "vllm", (lambda log, line: (seen.append(line), read_line(log, line)), read_text)
    )
    log = logparse.parse(head + "1\n" * (16 * 2**20))
    assert 0 < len(seen) < len(head.splitlines()) and "1" not in seen
    assert log.facts == logparse.parse(head).facts
