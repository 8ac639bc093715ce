"""Every config.json fixture plans or is refused in one line: never a traceback.

The real ones are in tests/fixtures/hf/corpus/ (SOURCES.tsv names where each file was copied from);
the trimmed test inputs in tests/fixtures/hf/synthetic/ (README.md there says what each is).
"""

from __future__ import annotations

import json

import pytest

from helpers import REPO, run_cli
from kvplan.specs.hf.vision_tower import PROCESSOR_FILES

CORPUS = REPO / "tests" / "fixtures" / "hf"
SIDECARS = ("hf_quant_config.json", *PROCESSOR_FILES)  # read beside a config.json, not planned alone
CONFIGS = sorted(p for p in CORPUS.rglob("*.json") if p.name not in SIDECARS and p.name != "SOURCES.tsv")


def test_corpus_is_large():
    assert len(CONFIGS) >= 40


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(CORPUS)) for p in CONFIGS])
def test_config_plans_or_is_refused_in_one_line(path):
    # a cluster large enough for the biggest checkpoints, a context every model allows
    r = run_cli("estimate", "-m", str(path), "-g", "4x8xH200", "--max-model-len", "2048", "--json")
    errors = [line for line in r.stderr.splitlines() if not line.startswith("warning: ")]
    if r.exit_code == 0:
        plan = r.json()
        assert plan["kv_bytes_per_token"] > 0 and plan["weight_bytes_per_gpu"] > 0
        assert plan["model"]["warnings"] == [w[len("warning: ") :] for w in r.stderr.splitlines() if w]
    else:
        assert r.exit_code in (2, 3), r.stderr
        assert len(errors) == 1 and errors[0].startswith("error: "), r.stderr
        assert json.loads(r.stdout)["error_type"]


def test_unknown_memory_field_is_named_on_stderr(tmp_path):
    cfg = json.loads((CORPUS / "synthetic" / "llama3-70b.json").read_text())
    cfg["kv_compression_ratio"] = 4  # not a field kvplan knows, shaped like one that changes memory
    cfg["mtp_num_hidden_layers"] = 1  # known: loaded only for speculative decoding
    cfg["mlp_only_layers"] = []  # written-out "none"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = run_cli("estimate", "-m", str(path), "-g", "8xH100", "--json")
    assert r.exit_code == 0
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "kv_compression_ratio" in warnings[0]
    assert r.json()["model"]["warnings"] == [warnings[0][len("warning: ") :]]
