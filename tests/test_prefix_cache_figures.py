"""README's prefix-cache figures (benchmarks/prefix_cache.py) recomputed: the Mooncake conversation
trace's first requests through vLLM's pool at three sizes, an unbounded pool, and an exact replay."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from helpers import REPO


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("prefix_cache", REPO / "benchmarks" / "prefix_cache.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["prefix_cache"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_figures_are_the_files_and_the_readmes(bench):
    saved = bench.load()
    got = bench.figures()
    for p in got["pools"]:
        p.pop("wall_s")
    for p in saved["pools"]:
        p.pop("wall_s")
    assert got["pools"] == saved["pools"]
    for k in ("exact_replay_hit_rate", "unbounded_hit_rate", "requests", "block_size"):
        assert got[k] == pytest.approx(saved[k], rel=1e-12)
    assert saved["unbounded_hit_rate"] == pytest.approx(saved["exact_replay_hit_rate"], abs=1e-3)
    rates = [p["hit_rate"] for p in saved["pools"]]
    assert rates == sorted(rates) and rates[-1] <= saved["unbounded_hit_rate"]
    assert bench.readme_block(saved) in (REPO / "README.md").read_text(encoding="utf-8")
