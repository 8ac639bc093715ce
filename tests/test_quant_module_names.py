"""Quantized checkpoints whose module names kvplan spelled wrong, planned in bf16 without a word.

Gemma 4 keeps its routed experts at `layers.N.experts`, beside `layers.N.mlp` (the dense MLP); its
NVFP4 checkpoint excludes `layers.N.mlp*`, which kvplan's `mlp.experts.*` spelling matched: 5.88 GiB
per GPU on 8x H200 instead of 2.06. Qwen3.6's ModelOpt checkpoint lists its Gated DeltaNet projections
one by one as FP8 (`linear_attn.in_proj_qkv`, `in_proj_z`, `out_proj`), which kvplan's single
`linear_attn.mixer` never matched. Both configs are real (tests/fixtures/hf/corpus/SOURCES.tsv).
"""

from __future__ import annotations

import json

from helpers import REPO
from kvplan.specs.matrices import state_mixer_params, weight_matrices
from kvplan.specs.models import RecurrentState
from kvplan.specs.registry import load_model
from tests.helpers import plan, run_cli

CORPUS = REPO / "tests" / "fixtures" / "hf" / "corpus"
GEMMA4 = CORPUS / "gemma-4-26b-a4b-nvfp4.json"
QWEN36 = CORPUS / "qwen3.6-27b-nvfp4.json"
NVFP4_BYTES = (16 * 4 + 8) / 16 / 8  # 4-bit values, one fp8 scale per 16 (README, Weight formats)


def test_gemma4_routed_experts_are_not_caught_by_the_mlp_exclusion():
    cfg = json.loads(GEMMA4.read_text())
    assert "model.language_model.layers.0.mlp*" in cfg["quantization_config"]["ignore"]
    spec = load_model(str(GEMMA4))
    assert spec.weight_formats["routed_experts"] == "nvfp4"
    assert spec.weight_formats["shared_experts"] == "bf16"  # the dense `mlp`: excluded, as the config says
    routed = sum(m.params for m in weight_matrices(spec) if m.component == "routed_experts")
    t = cfg["text_config"]
    assert (
        routed
        == t["num_hidden_layers"] * t["num_experts"] * 3 * t["moe_intermediate_size"] * t["hidden_size"]
    )
    p = plan(str(GEMMA4), "H200", num_gpus=8, max_model_len=8192)
    # everything else bf16 (embedding, attention, dense MLP, router, norms), the experts NVFP4
    expected = ((p.params_total - routed) * 2 + routed * NVFP4_BYTES) / 8
    assert abs(p.weight_bytes_per_gpu / expected - 1) < 0.005
    assert p.weight_bytes_per_gpu < 2.2 * 2**30  # was 5.88 GiB


def test_gated_deltanet_projections_take_their_listed_formats():
    cfg = json.loads(QWEN36.read_text())
    listed = cfg["quantization_config"]["quantized_layers"]
    assert listed["model.language_model.layers.0.linear_attn.in_proj_qkv"]["quant_algo"] == "FP8"
    assert "model.language_model.layers.0.linear_attn.in_proj_b" not in listed
    spec = load_model(str(QWEN36))
    assert spec.weight_formats["attention"] == "fp8-t32"
    assert spec.weight_formats["attention.mixer.in_proj_ba"] == "bf16"  # not listed: the model dtype
    assert spec.weight_formats["attention.mixer.state"] == "bf16"  # conv, A, dt_bias, norm: never Linear
    gdn = [m for m in weight_matrices(spec) if m.layer == 0]
    assert {m.name: (m.rows, m.cols) for m in gdn if m.name.startswith("mixer.")} == {
        "mixer.in_proj_qkv": (10240, 5120),  # q, k: 16 heads x 128 each; v: 48 heads x 128
        "mixer.in_proj_z": (6144, 5120),
        "mixer.in_proj_ba": (96, 5120),
        "mixer.out_proj": (5120, 6144),
        "mixer.state": (10240 * 4 + 96 + 128, 1),
    }


def test_gdn_parts_sum_to_the_whole_mixer_and_plan_the_same_unquantized():
    # the split changes names, not the count: an unquantized Qwen3-Next plans byte for byte as before
    spec = load_model(str(CORPUS / "qwen3-next-80b-a3b-thinking.json"))
    layer = next(lt for lt in spec.layer_types.values() if isinstance(lt, RecurrentState))
    i = next(n for n, lt in enumerate(spec.layers) if lt is layer)
    parts = [m for m in weight_matrices(spec) if m.layer == i and m.name.startswith("mixer.")]
    assert sum(m.params for m in parts) == state_mixer_params(spec.hidden_size, layer)


# --- Laguna (poolside): mlp_only_layers and per-layer query heads ----------------------------------

LAGUNA = CORPUS / "laguna-s-2.1-fp8.json"


def test_mlp_only_layers_as_leading_dense_layers_plan():
    # was refused: "mlp_only_layers: dense layers listed among MoE layers are not modelled"
    cfg = json.loads(LAGUNA.read_text())
    assert cfg["mlp_only_layers"] == [0] and cfg["mlp_layer_types"][:2] == ["dense", "sparse"]
    spec = load_model(str(LAGUNA))
    assert [spec.mlp_kind(i) for i in range(3)] == ["dense", "moe", "moe"]
    # the per-layer query heads (48 full, 72 sliding) are not read: said, never silent
    assert any("num_attention_heads_per_layer is not read by kvplan" in w for w in spec.warnings)


def test_mlp_only_layers_beyond_a_leading_run_is_refused_with_a_way_on(tmp_path):
    cfg = json.loads(LAGUNA.read_text())
    cfg["mlp_only_layers"] = [0, 5]
    del cfg["mlp_layer_types"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = run_cli("estimate", "-m", str(path), "-g", "8xH200")
    assert r.exit_code == 2
    assert "mlp_only_layers: dense layers after the first MoE layer are not modelled" in r.stderr
    assert "describe the model in a YAML spec (model_specs/models/)" in r.stderr


def test_an_invalid_module_regex_is_refused_in_one_line(tmp_path):
    # fuzz round 3, F2: "re:((" in an ignore list raised re.error from the module matcher
    cfg = json.loads((CORPUS / "qwen3.6-27b-nvfp4.json").read_text())
    cfg["quantization_config"]["ignore"] = ["re:(("]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = run_cli("estimate", "-m", str(tmp_path), "-g", "H100")
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "module pattern 're:((' is not a valid regular expression" in lines[0]
