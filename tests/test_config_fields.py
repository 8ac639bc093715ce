"""Config fields issue 24 found missed (round two): read where their meaning is clear from the model's
public code, and a field a family reader reads is never warned about as "not read".

Real configs from tests/fixtures/hf/corpus/ (SOURCES.tsv). No real Gemma-3n config.json is in the
code index (searched for `"model_type": "gemma3n"`, `vocab_size_per_layer_input`,
`activation_sparsity_pattern`: only test stubs and ports), so its test builds one from transformers'
Gemma3nTextConfig defaults (35 layers, 4 sliding + 1 full, 15 KV-shared), nested under text_config
as the released checkpoints nest it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hf_families import CORPUS, corpus, growing_and_window_bytes

from helpers import run_cli
from kvplan.errors import SpecError
from kvplan.model.params import is_moe_layer
from kvplan.specs.registry import load_model


def _warnings(name: str) -> list[str]:
    return load_model(str(CORPUS / name)).warnings


@pytest.mark.parametrize(
    "name, field",
    [
        ("mimo-v2-flash.json", "hybrid_layer_pattern"),  # mimo.py reads it
        ("deepseek-v4-flash.json", "compress_ratios"),  # dsv4.py reads it
        ("deepseek-v4-flash.json", "num_hash_layers"),
        ("deepseek-v4-pro.json", "num_hash_layers"),
        ("glm-5.2.json", "mlp_layer_types"),
    ],
)
def test_a_field_kvplan_reads_is_not_warned_as_unread(name, field):
    assert not [w for w in _warnings(name) if field in w], _warnings(name)


def test_deepseek_v4_hash_layers_say_what_they_are():
    spec = corpus("deepseek-v4-flash")
    (note,) = [n for n in spec.notes if n.startswith("num_hash_layers")]
    # 3 layers x 129,280 tokens x 6 experts x 4 B = 9,308,160 B
    assert "first 3 MoE layers route by a token-id table" in note and "9.3 MB" in note
    assert spec.moe is not None and spec.moe.first_dense_layers == 0  # hash layers are MoE layers


def _glm(tmp_path: Path, edit) -> Path:
    cfg = json.loads((CORPUS / "glm-5.2.json").read_text())
    edit(cfg)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_glm5_mlp_layer_types_place_the_dense_layers(tmp_path):
    spec = corpus("glm-5.2")
    assert spec.moe is not None and spec.moe.first_dense_layers == 3  # dense, dense, dense, sparse ...
    assert sum(is_moe_layer(spec, i) for i in range(spec.num_layers)) == 75

    def four_dense(cfg):
        cfg["mlp_layer_types"][3] = "dense"
        del cfg["first_k_dense_replace"]

    spec = load_model(str(_glm(tmp_path, four_dense)))
    assert spec.moe is not None and spec.moe.first_dense_layers == 4

    def disagree(cfg):
        cfg["mlp_layer_types"][3] = "dense"  # first_k_dense_replace still says 3

    with pytest.raises(
        SpecError, match="mlp_layer_types: 4 leading dense layers but first_k_dense_replace is 3"
    ):
        load_model(str(_glm(tmp_path, disagree)))

    def interleaved(cfg):
        cfg["mlp_layer_types"][40] = "dense"

    with pytest.raises(SpecError, match="mlp_layer_types: dense layers after the first MoE layer"):
        load_model(str(_glm(tmp_path, interleaved)))

    def unknown(cfg):
        cfg["mlp_layer_types"][5] = "moe"

    with pytest.raises(
        SpecError, match='mlp_layer_types: expected 78 per-layer entries, each "dense" or "sparse"'
    ):
        load_model(str(_glm(tmp_path, unknown)))


def _gemma3n(tmp_path: Path) -> Path:
    layers = 35
    text = {
        "model_type": "gemma3n_text",
        "vocab_size": 262400,
        "vocab_size_per_layer_input": 262144,
        "hidden_size": 2048,
        "hidden_size_per_layer_input": 256,
        "intermediate_size": [16384] * layers,
        "num_hidden_layers": layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "max_position_embeddings": 32768,
        "sliding_window": 512,
        "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7,
        "num_kv_shared_layers": 15,
        "laurel_rank": 64,
        "altup_num_inputs": 4,
        "altup_active_idx": 0,
        "altup_coef_clip": 120.0,
        "altup_correct_scale": True,
        "activation_sparsity_pattern": [0.95] * 10 + [0.0] * 25,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
    }
    cfg = {
        "architectures": ["Gemma3nForConditionalGeneration"],
        "model_type": "gemma3n",
        "torch_dtype": "bfloat16",
        "text_config": text,
    }
    folder = tmp_path / "gemma-3n-e4b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_gemma3n_kv_shared_layers_under_text_config_store_nothing(tmp_path):
    spec = load_model(str(_gemma3n(tmp_path)))
    # layers 20..34 share (vLLM/transformers: kv_sharing_target_layer_name, the last earlier layer of
    # their type, no cache of their own); layers 0..19 keep their own: 16 sliding + 4 full, each
    # 2 KV heads x 256 x 2 (K, V) x 2 B = 2,048 B/token
    assert (
        sum(type(x).__name__ == "SharedKV" or getattr(x, "source", None) is not None for x in spec.layers)
        == 15
    )
    assert growing_and_window_bytes(spec) == (4 * 2048, 16 * 2048)
    assert not [w for w in spec.warnings if "num_kv_shared_layers" in w or "activation_sparsity" in w]
    # what kvplan does not count is said, with its size
    (ple,) = [w for w in spec.warnings if "per-layer input embeddings" in w]
    assert "2.35B parameters" in ple and "4.38 GiB in bf16" in ple
    r = run_cli("estimate", "-m", str(tmp_path / "gemma-3n-e4b"), "--max-model-len", "32K", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["kv_bytes_per_token_growing"] == 4 * 2048
    assert "per-layer input embeddings" in r.stderr and "not read" not in r.stderr
