"""Every golden case gives the output recorded before the redesign (tests/golden/).

JSON may gain keys (additions are allowed, nothing else); text and errors must be byte-identical.
An infeasible plan under --json may now print a JSON error object where it printed nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))

from runner import run  # noqa: E402

ROWS = json.loads((GOLDEN / "golden.json").read_text(encoding="utf-8"))


def _contains(old, new, where: str = "$") -> None:
    """`new` holds everything `old` holds, with the same values; dicts may have more keys."""
    if isinstance(old, dict):
        assert isinstance(new, dict), f"{where}: was an object"
        for key, value in old.items():
            assert key in new, f"{where}.{key}: missing"
            _contains(value, new[key], f"{where}.{key}")
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), f"{where}: list changed length"
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            _contains(a, b, f"{where}[{i}]")
    else:
        assert type(old) is type(new) and old == new, f"{where}: {old!r} -> {new!r}"


def test_corpus_is_large():
    assert len(ROWS) >= 200
    assert {r["args"][0] for r in ROWS} >= {"estimate", "check-log", "compare", "solve", "models", "gpus"}


@pytest.mark.parametrize("row", ROWS, ids=[" ".join(r["args"])[:90] for r in ROWS])
def test_golden(row):
    got = run(row["args"])
    assert got["exit_code"] == row["exit_code"]
    assert got["stderr"] == row["stderr"]
    if "--json" in row["args"] or row["args"][-2:] == ["--format", "json"]:
        if row["stdout"] == "" and row["exit_code"] != 0:
            if got["stdout"]:
                assert "error" in json.loads(got["stdout"])
            return
        _contains(json.loads(row["stdout"]), json.loads(got["stdout"]))
    else:
        assert got["stdout"] == row["stdout"]
