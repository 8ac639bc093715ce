"""Fuzz pass 19's findings about reading Hugging Face config.json files, each test failing on the code before.

Real configs from tests/fixtures/hf/ (corpus/SOURCES.tsv), edited in tmp_path the way the fuzz cases edited them:
the YaRN block Qwen3's model card tells users to add, a Mixtral without its expert count, quantization blocks
that vLLM or transformers refuse, an unknown quant_method.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import REPO, run_cli
from kvplan.errors import SpecError
from kvplan.model.params import param_breakdown
from kvplan.specs.registry import load_model

HF = REPO / "tests" / "fixtures" / "hf"


def _edited(tmp_path: Path, fixture: str, edit: Callable[[dict], object], name: str = "model") -> Path:
    cfg = json.loads((HF / fixture).read_text())
    edit(cfg)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return path


def _refused(path: Path) -> str:
    with pytest.raises(SpecError) as exc:
        load_model(str(path))
    text = str(exc.value)
    assert "\n" not in text and text.startswith(f"{path}: ")
    return text


# --- 1. rope_scaling / rope_parameters scale the maximum context as vLLM derives it ------------------------


def _qwen3_rope(tmp_path: Path, rope: object, name: str = "qwen3-32b-rope") -> Path:
    return _edited(tmp_path, "corpus/qwen3-32b.json", lambda c: c.update(rope_scaling=rope), name)


def test_yarn_gives_original_positions_times_the_factor(tmp_path):
    # Qwen3-32B: max_position_embeddings 40,960; its card's YaRN block: factor 4 over 32,768 -> 131,072, vLLM's
    # default --max-model-len (vllm/config/model.py v0.11.0 _get_and_verify_max_len); it was 40,960
    path = _qwen3_rope(
        tmp_path, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    )
    spec = load_model(str(path))
    assert spec.max_context == 131_072
    (note,) = [n for n in spec.assumptions if n.startswith("max context")]
    assert note.startswith(
        "max context 131,072: original_max_position_embeddings 32,768 x rope_scaling.factor 4 (yarn), as vLLM "
        "derives it (max_position_embeddings says 40,960)"
    )
    assert "SGLang 0.5.2 derives 40,960" in note  # get_context_length ignores the factor beside original_...


def test_a_yarn_context_is_planned_at_its_full_length(tmp_path):
    # the fuzz case: --max-model-len 131072 was refused as beyond "the maximum context of 40,960 tokens"
    path = _qwen3_rope(
        tmp_path, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    )
    r = run_cli("estimate", "-m", str(path), "-g", "8xH100", "--max-model-len", "131072", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["model"]["max_context"] == 131_072


def test_only_the_rope_types_vllm_scales_change_the_context(tmp_path):
    # `if rope_type not in ("su", "longrope", "llama3")`: the factor multiplies max_position_embeddings (40,960);
    # "default" (and mrope, read as default) has no factor; the legacy `type` key is read as rope_type
    cases = {
        "dynamic": {"rope_type": "dynamic", "factor": 2.0},
        "linear-legacy-type": {"type": "linear", "factor": 3},
        "default": {"rope_type": "default"},
        "mrope": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "llama3": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },  # fmt: skip
        "longrope": {"rope_type": "longrope", "factor": 4.0, "short_factor": [1.0], "long_factor": [1.0]},
        "su": {"type": "su", "factor": 4.0, "short_factor": [1.0], "long_factor": [1.0]},
    }
    got = {k: load_model(str(_qwen3_rope(tmp_path, rope, k))).max_context for k, rope in cases.items()}
    assert got == {"dynamic": 81_920, "linear-legacy-type": 122_880, "default": 40_960, "mrope": 40_960,
                   "llama3": 40_960, "longrope": 40_960, "su": 40_960}  # fmt: skip
    # Gemma 3's 131,072 is already scaled: its linear factor 8 is not applied again (`"gemma3" not in model_type`)
    assert load_model(str(HF / "corpus" / "gemma-3-27b-it.json")).max_context == 131_072


def test_transformers5_rope_parameters_scale_the_context_too(tmp_path):
    # vLLM 0.12.0 reads rope_parameters, per layer type when nested: Laguna's full_attention YaRN block (8,192 x
    # 32 = its 262,144) edited to factor 64 -> 524,288; Devstral-2's flat block, factor 64 -> 128 over 4,096
    def laguna(c: dict) -> None:
        c["rope_parameters"]["full_attention"]["factor"] = 64.0

    spec = load_model(str(_edited(tmp_path, "corpus/laguna-s-2.1-fp8.json", laguna)))
    assert spec.max_context == 524_288
    assert any(n.startswith("max context 524,288: original_max_position_embeddings 8,192 x "
                            "rope_parameters.full_attention.factor 64 (yarn)") for n in spec.notes)  # fmt: skip
    path = _edited(
        tmp_path, "corpus/devstral-2-123b-instruct.json", lambda c: c["rope_parameters"].update(factor=128)
    )
    assert load_model(str(path)).max_context == 524_288


@pytest.mark.parametrize(
    ("rope", "field", "says"),
    [
        ({"rope_type": "yarn", "factor": 0, "original_max_position_embeddings": 32768}, "rope_scaling.factor",
         "expected a number above 0"),
        ({"rope_type": "dynamic", "factor": -2.0}, "rope_scaling.factor", "expected a number above 0"),
        ({"rope_type": "dynamic", "factor": "4"}, "rope_scaling.factor", "got '4'"),
        ({"rope_type": "dynamic", "factor": True}, "rope_scaling.factor", "got True"),
        ({"rope_type": "yarn", "factor": 4.0}, "rope_scaling.original_max_position_embeddings", "missing"),
        ({"factor": 4.0}, "rope_scaling", "has no rope_type"),
        ({"rope_type": "yarn", "type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 32768},
         "rope_scaling.rope_type", "vLLM refuses the conflict"),
        ("yarn", "rope_scaling", "expected an object"),
        ({"rope_type": "dynamic", "factor": 1e9}, "max_position_embeddings", "fix the factor"),
    ],
)  # fmt: skip
def test_a_rope_block_vllm_cannot_use_is_refused_in_one_line(tmp_path, rope, field, says):
    path = _qwen3_rope(tmp_path, rope)
    text = _refused(path)
    assert text.startswith(f"{path}: {field}: ") and says in text


# --- 2. an MoE whose expert count is absent or 1 is planned as the engine builds it, or refused ------------

MIXTRAL = "corpus/mixtral-8x7b.json"


def test_mixtral_without_its_expert_count_takes_mixtral_configs_defaults(tmp_path):
    # MixtralConfig (transformers 4.57.0): num_local_experts 8, num_experts_per_tok 2; it was planned as a dense
    # 7,241,732,096-parameter model
    def drop(c: dict) -> None:
        del c["num_local_experts"], c["num_experts_per_tok"]

    spec = load_model(str(_edited(tmp_path, MIXTRAL, drop)))
    assert spec.moe is not None and (spec.moe.num_experts, spec.moe.experts_per_token) == (8, 2)
    assert (
        param_breakdown(spec).total == param_breakdown(load_model(str(HF / MIXTRAL))).total == 46_702_792_704
    )
    assert "absent from the config, taken at MixtralConfig (configuration_mixtral.py)'s defaults: " \
        "num_local_experts 8, num_experts_per_tok 2" in spec.notes  # fmt: skip


@pytest.mark.parametrize(
    ("fixture", "edit", "says"),
    [
        (MIXTRAL, {"num_local_experts": 1}, "num_experts_per_tok: 2 experts a token, but num_local_experts gives "
         "1 routed expert; fix the config"),
        ("synthetic/deepseek-v3.json", {"n_routed_experts": 1}, "num_experts_per_tok: 8 experts a token, but "
         "n_routed_experts gives 1 routed expert; fix the config"),
        (MIXTRAL, {"num_experts_per_tok": 9}, "num_experts_per_tok: 9 experts a token, but num_local_experts gives "
         "8 routed experts; fix the config"),
    ],
)  # fmt: skip
def test_more_experts_a_token_than_the_config_has_is_refused_naming_the_fields(tmp_path, fixture, edit, says):
    # 2 of 1 and 8 of 1 were planned as dense models; 9 of 8 was refused naming the spec's fields, not the config's
    path = _edited(tmp_path, fixture, lambda c: c.update(edit))
    assert _refused(path) == f"{path}: {says}"


def test_one_routed_expert_is_planned_as_vllm_builds_it(tmp_path):
    # vLLM's Mixtral builds FusedMoE(num_experts=config.num_local_experts) whatever the count: one expert and its
    # router (32 layers x 4,096 x 1 = 131,072 parameters over the dense 7,241,732,096); it was a dense MLP
    spec = load_model(
        str(_edited(tmp_path, MIXTRAL, lambda c: c.update(num_local_experts=1, num_experts_per_tok=1)))
    )
    assert spec.moe is not None and (spec.moe.num_experts, spec.moe.experts_per_token) == (1, 1)
    assert param_breakdown(spec).total == 7_241_732_096 + 32 * 4096
    assert "num_local_experts 1: planned as vLLM builds it, an MoE layer of one routed expert (and its router), " \
        "not a dense MLP" in spec.notes  # fmt: skip
    # Jamba's layer is a dense MLP at one expert (vLLM jamba.py `if num_experts > 1`)
    jamba = _edited(
        tmp_path, "corpus/jamba-v0.1-reduced-test.json", lambda c: c.update(num_experts=1), "jamba"
    )
    assert load_model(str(jamba)).moe is None


# --- 3. quantization blocks the engine (or transformers) refuses -------------------------------------------

LLAMA = "synthetic/llama3-70b.json"


@pytest.mark.parametrize(
    ("quant", "field", "says"),
    [
        ({"quant_method": "awq", "bits": 3, "group_size": 128}, "bits", "3: vLLM serves AWQ checkpoints at 4 bits only"),
        ({"quant_method": "awq", "w_bit": 8, "q_group_size": 128}, "bits", "8: vLLM serves AWQ checkpoints at 4 bits"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 0}, "group_size", "0: expected -1 (one group a row) or a "
         "positive group size"),
        ({"quant_method": "gptq", "bits": 4, "group_size": -2}, "group_size", "-2: expected -1"),
        ({"quant_method": "awq", "bits": 4, "group_size": 0}, "group_size", "0: expected -1"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": True}, "load_in_8bit",
         "true, and so is load_in_4bit"),
    ],
)  # fmt: skip
def test_a_quantization_config_the_engine_refuses_is_refused_in_one_line(tmp_path, quant, field, says):
    path = _edited(tmp_path, LLAMA, lambda c: c.update(quantization_config=quant))
    assert _refused(path).startswith(f"{path}: quantization_config.{field}: {says}")


# --- 4. the unknown-quant_method warning names the file once ----------------------------------------------


def test_an_unknown_quant_method_warning_names_the_config_once(tmp_path):
    path = _edited(tmp_path, LLAMA, lambda c: c.update(quantization_config={"quant_method": "hqq"}))
    (warning,) = [w for w in load_model(str(path)).warnings if "quant_method" in w]
    assert warning == (
        f"{path}: quantization_config.quant_method 'hqq' not modelled: weights counted at the model dtype; "
        "the checkpoint is likely smaller (give --weight-dtype)"
    )
    r = run_cli("estimate", "-m", str(path), "-g", "8xH100", "--max-model-len", "8192")
    assert r.exit_code == 0 and r.stderr.count(str(path)) == 1, r.stderr
