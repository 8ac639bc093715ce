"""Session 16 hardening: the items left open by fuzz passes 19-20 and pass 21's findings (each test failing on
the code before)."""

from __future__ import annotations

import json

import pytest

from kvplan.specs.registry import load_model
from tests.helpers import REPO, run_cli

HF = REPO / "tests" / "fixtures" / "hf" / "corpus"
REAL_LOGS = REPO / "tests" / "fixtures" / "logs" / "real"


def _without(tmp_path, name: str, *keys: str) -> str:
    cfg = json.loads((HF / name).read_text())
    for k in keys:
        cfg.pop(k, None)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_idle_vllm_dp_engine_cores_route_no_tokens_through_the_busy_cores_experts():
    # fuzz 20a: under --enable-expert-parallel one request on 8 DP engine cores was timed as if all 8 cores held a
    # batch like its own (TPOT 17.7 ms at C = 1, 2 and 8 alike); idle cores step with dummy batches
    def tpot(cap: int) -> float:
        return run_cli("simulate", "-m", "deepseek-v3", "-g", "8xH200", "--engine", "vllm", "-tp", "1", "-dp", "8",
                       "--enable-expert-parallel", "--max-model-len", "8K", "--num-prompts", "40",
                       "--max-concurrency", str(cap), "--json").json()["tpot_ms"]["median"]  # fmt: skip

    one, two, eight = tpot(1), tpot(2), tpot(8)
    assert one < two < eight


@pytest.mark.parametrize(
    ("name", "dropped", "experts", "top_k", "width"),
    [
        ("qwen3-30b-a3b.json", ("num_experts",), 128, 8, 768),  # Qwen3MoeConfig: was planned dense
        ("qwen3-30b-a3b.json", ("num_experts", "moe_intermediate_size"), 128, 8, 768),
        (
            "gpt-oss-120b.json",
            ("num_local_experts", "num_experts_per_tok", "experts_per_token"),
            128,
            4,
            2880,
        ),
    ],
)
def test_moe_families_missing_expert_fields_take_their_config_class_defaults(
    tmp_path, name, dropped, experts, top_k, width
):
    # fuzz 19b: only Mixtral had class defaults; a Qwen3-MoE config without num_experts was planned as a dense
    # model (transformers 4.57 configuration_qwen3_moe.py: num_experts=128, num_experts_per_tok=8,
    # moe_intermediate_size=768; configuration_gpt_oss.py: num_local_experts=128, num_experts_per_tok=4)
    path = _without(tmp_path, name, *dropped)
    moe = load_model(path).moe
    assert moe is not None
    assert (moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size) == (experts, top_k, width)
    d = run_cli("estimate", "-m", path, "-g", "8xH100", "--json").json()
    said = [a for a in d["assumptions"] if a.startswith("absent from the config, taken at")]
    assert len(said) == 1 and all(k in said[0] for k in dropped if k != "experts_per_token")


def test_vllm_engine_config_naming_another_max_model_len_than_its_arguments_is_said(tmp_path):
    # fuzz 19b: the arguments' max_model_len was read and the engine config's max_seq_len ignored, without a word
    real = REAL_LOGS / "vllm_0.10.0_qwen3-32b_h100_tp8.log"
    text = real.read_text()
    assert text.count("max_seq_len=32768") == 1 and "'max_model_len': 32768" in text
    spliced = tmp_path / "spliced.log"
    spliced.write_text(text.replace("max_seq_len=32768", "max_seq_len=16384"))
    args = ("-m", "qwen3-32b", "-g", "8xH100", "--json")
    notes = run_cli("check-log", str(spliced), *args).json()["notes"]
    said = [n for n in notes if "max_model_len 32,768 and then 16,384" in n]
    assert len(said) == 1 and "spliced from two startups" in said[0]
    assert not any("and then" in n for n in run_cli("check-log", str(real), *args).json()["notes"])
