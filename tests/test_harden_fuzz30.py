"""Session 18 hardening: fuzz pass 30's findings on real configs and logs (each test failing on the code before)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "hf" / "corpus"
REAL = ROOT / "tests" / "fixtures" / "logs" / "real"


@pytest.mark.parametrize("model", ["qwen3.5-9b", "gemma-4-26b-a4b", "lfm2.5-vl-1.6b"])
def test_sglang_warns_of_a_vision_tower_it_does_not_count(model):
    # U1: vLLM warned that the tower's weights were not counted; SGLang planned the same configs without a word
    r = run_cli("estimate", "-m", str(CORPUS / f"{model}.json"), "-g", "H100", "--engine", "sglang",
                "--max-model-len", "8K", "--json")  # fmt: skip
    notes = r.json()["assumptions"]
    assert any(
        n.startswith("WARNING: kvplan does not count this model's vision tower weights") for n in notes
    )
    # a tower kvplan counts (Gemma 3's SigLIP) gets no such warning
    g3 = run_cli("estimate", "-m", str(CORPUS / "gemma-3-27b-it.json"), "-g", "H100", "--engine", "sglang",
                 "--max-model-len", "8K", "--json").json()["assumptions"]  # fmt: skip
    assert not any("vision tower weights" in n for n in g3)


def test_a_tp2_log_a_few_blocks_under_its_printed_rank_is_not_called_edited():
    # U2: vLLM gives every rank the smallest rank's blocks; the log prints TP0's memory only
    r = run_cli("check-log", str(REAL / "vllm_0.12.0_qwen3-vl-30b-a3b-instruct_h100_tp2_seqs256.log"),
                "-m", str(CORPUS / "qwen3-vl-30b-a3b-instruct" / "config.json"), "-g", "H100-SXM", "--json")  # fmt: skip
    tokens = next(row for row in r.json()["arithmetic"] if row["quantity"] == "KV cache tokens")
    assert tokens["log"] == 813152 and 0 < tokens["kvplan"] - tokens["log"] <= 0.001 * tokens["kvplan"]
    assert tokens["cause"].startswith("a few blocks under what the printed rank's KV memory holds")
    assert "edited" not in tokens["cause"]


@pytest.mark.parametrize(
    ("name", "cls"), [("mistral-7b-instruct-v0.3", "MistralConfig"), ("mixtral-8x7b", "MixtralConfig")]
)
def test_absent_kv_heads_take_the_config_classs_default(tmp_path, name, cls):
    # U3: without num_key_value_heads Mistral and Mixtral were planned as MHA (32 KV heads, 4x the KV)
    cfg = json.loads((CORPUS / f"{name}.json").read_text())
    assert cfg.pop("num_key_value_heads") == 8
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    got = run_cli("estimate", "-m", str(path), "-g", "8xH100", "--max-model-len", "8K", "--json").json()
    whole = run_cli("estimate", "-m", str(CORPUS / f"{name}.json"), "-g", "8xH100", "--max-model-len", "8K",
                    "--json").json()  # fmt: skip
    assert got["kv_bytes_per_token"] == whole["kv_bytes_per_token"] == 32 * 8 * 128 * 2 * 2
    assert any(cls in n and "num_key_value_heads 8" in n for n in got["assumptions"])


def test_fp8_ignored_layers_stay_in_bf16(tmp_path):
    # U4: vLLM's Fp8Config reads ignored_layers first (then modules_to_not_convert); kvplan read only the second
    cfg = json.loads((CORPUS / "qwen3-32b.json").read_text())
    weights = {}
    for key in ("ignored_layers", "modules_to_not_convert", None):
        q = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
        if key:
            q[key] = ["self_attn"]
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps({**cfg, "quantization_config": q}))
        weights[key] = run_cli("estimate", "-m", str(path), "-g", "H100", "--max-model-len", "8K",
                               "--json").json()["weight_bytes_total"]  # fmt: skip
    assert weights["ignored_layers"] == weights["modules_to_not_convert"]
    # 64 layers of attention (q, k, v, o: 94.37M parameters a layer) kept in bf16: about one byte more each
    extra = weights["ignored_layers"] - weights[None]
    assert extra == pytest.approx(64 * 94_371_840, rel=0.02)


def test_window_and_chunk_labels_name_the_v_head_size():
    # U5: MiMo-V2-Flash's sliding layers (K 192, V 128) read 'kv8x192' while the figure used 192 + 128
    out = run_cli(
        "estimate", "-m", str(CORPUS / "mimo-v2-flash.json"), "-g", "8xH100", "--max-model-len", "8K"
    ).stdout
    assert "9x full kv4x192/128 + 39x sliding(128) kv8x192/128" in " ".join(out.split())
