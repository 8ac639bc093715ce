"""`kvplan simulate` against published serving runs (benchmarks/serving_check.py, serving_runs.tsv).

benchmarks/results/serving_check.yaml holds each replayed row's flags, its published and simulated
figures, and each excluded row's reason; README.md quotes its per-bucket figures. These tests check
that the file's figures follow from its rows, that the README block is the file's, that the
exclusions are the script's rules applied now, and replay a fixed handful of rows (a few seconds)
against the file. A change to the simulator or the step model fails them until
`python benchmarks/serving_check.py` is re-run and its figures committed."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REPLAYED = (13, 36, 87, 93, 245)  # a dense vLLM row on A100, SGLang at a Poisson rate on H200, a MoE


@pytest.fixture(scope="module")
def check():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("serving_check", ROOT / "benchmarks" / "serving_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["serving_check"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def data(check):
    return check.load()


def test_the_summary_follows_from_the_rows(check, data):
    assert check.summarize(data["records"]) == data["summary"]
    assert data["replayed"] == len(data["records"])
    assert data["rows"] == data["replayed"] + data["excluded"] + data["refused"]


def test_the_readme_quotes_the_file(check, data):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert check.readme_block(data) in text


def test_the_exclusions_are_the_rules_applied_now(check, data):
    cases, excluded = check.read_rows()
    assert [e["line"] for e in data["excluded_rows"]] == [line for line, _, _ in excluded]
    assert [e["reason"] for e in data["excluded_rows"]] == [why for _, _, why in excluded]
    kept = {r["line"] for r in data["records"]} | {r["line"] for r in data["refused_rows"]}
    assert kept == {c.line for c in cases}
    assert all(c.source in check.frozen_sources() for c in cases if c.frozen)
    reasons = " ".join(e["reason"] for e in data["excluded_rows"])
    for rule in ("ShareGPT", "speculative decoding", "--ignore-eos", "layout not stated"):
        assert rule in reasons


@pytest.mark.parametrize("line", REPLAYED)
def test_a_replayed_row_gives_the_files_figures(check, data, line):
    case = next(c for c in check.read_rows()[0] if c.line == line)
    rec = check.run_case(case)
    saved = next(r for r in data["records"] if r["line"] == line)
    assert rec["flags"] == saved["flags"] and rec["completed"] == saved["completed"]
    for metric, m in saved["metrics"].items():
        got = rec["metrics"][metric]
        assert got["published"] == m["published"]
        assert math.isclose(got["simulated"], m["simulated"], rel_tol=1e-9), (line, metric)


def test_dp_attention_and_stated_mtp_rows_replay_with_their_launch_flags(check, data):
    recs = {r["line"]: r for r in data["records"]}
    # gpustack's DeepSeek-R1 SGLang rows launched '--tp 8 --enable-dp-attention' (no --dp: SGLang's 1)
    for line in (247, 248, 249, 250):
        assert recs[line]["flags"]["enable_dp_attention"] is True
        assert recs[line]["flags"]["data_parallel_size"] == 1
    # the GLM-5.1 recipe: MTP with 3 speculative tokens, acceptance length 1.64 stated by its block
    glm = recs[85]["flags"]
    assert glm["speculative_config"] == '{"method": "mtp", "num_speculative_tokens": 3}'
    assert glm["acceptance_length"] == 1.64
    # the Step-3.5-Flash recipe does not say whether its block ran MTP: still excluded
    why = {e["line"]: e["reason"] for e in data["excluded_rows"]}
    assert why[83].startswith("speculative decoding: its method, draft tokens or acceptance length")
    assert check._speculative("MTP with 2 speculative tokens; acceptance length 2.5") == (2, 2.5)
    assert check._speculative("MTP with 2 speculative tokens") is None


def test_the_no_p2p_rule_rests_on_the_logs_it_names(check):
    # the rule cites the source's own startup logs: each holds vLLM's warning, word for word (one of them
    # wraps it over two lines)
    logs = ROOT / "tests" / "fixtures" / "logs" / "real"
    for source, files in check.NO_P2P.items():
        for name in files:
            text = " ".join((logs / name).read_text(encoding="utf-8").split())
            assert check.NO_P2P_LINE in text, (source, name)
    data = check.load()
    pcie = [r for r in data["records"] if r["source"] in check.NO_P2P and "PCIe" in r["flags"]["gpus"]]
    # every same-node TP 2 row of that source, none of its TP 1 or cross-node rows
    assert pcie and all(
        r["flags"]["tensor_parallel_size"] == 2 and "1x" not in r["flags"]["gpus"] for r in pcie
    )
    assert not any(
        r["flags"]["tensor_parallel_size"] == 1 and "PCIe" in r["flags"]["gpus"]
        for r in data["records"]
        if r["source"] in check.NO_P2P
    )


def test_the_shipped_served_evidence_is_the_files(check, data):
    """kvplan/data/served_evidence.yaml (what estimate and simulate print of a plan's bucket) follows from
    serving_check.yaml's records; a re-run that moves a figure must rewrite it."""
    import yaml

    shipped = yaml.safe_load((ROOT / "kvplan" / "data" / "served_evidence.yaml").read_text(encoding="utf-8"))
    assert check.held_out_evidence(data) == shipped
    # rows whose tensor-parallel group crossed nodes (one GPU per pod) are a bucket of their own
    across = [b for b in shipped["buckets"] if b["across_nodes"]]
    assert [(b["gpu"], b["engine"], b["kind"]) for b in across] == [("A100-40GB", "vllm", "dense")]
    assert across[0]["tpot"]["rows"] == 8 and across[0]["tpot"]["median_signed"] < -0.5
