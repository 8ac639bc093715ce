"""Issue 23: speculative decoding in the decode step (speed only; the draft's memory is not counted yet)."""

from __future__ import annotations

import pytest

import kvplan
from kvplan.errors import UsageError
from kvplan.speed import step_model

MTP1 = '{"method": "mtp", "num_speculative_tokens": 1}'


def plan(model: str = "deepseek-v3", **flags):
    return kvplan.estimate(model, **{"gpus": "8xH200", "max_model_len": "32K", "calibration": False, **flags})


def test_verify_step_reads_each_request_kv_once_and_runs_every_token_through_the_gemms():
    d = plan("llama3-8b", gpus="H100", max_model_len="8K").decode
    kv = d.kv_bytes_per_request_per_gpu
    one = step_model.decode_step(d.inputs, 64, kv, d.context_tokens)
    four = step_model.decode_step(d.inputs, 64, kv, d.context_tokens, queries=4)
    wide = step_model.decode_step(d.inputs, 256, kv, d.context_tokens)
    assert four.kv_bytes_read == one.kv_bytes_read and four.attention_ms == pytest.approx(one.attention_ms)
    assert four.weights_ms == pytest.approx(wide.weights_ms)  # 64 x 4 tokens through each GEMM
    assert four.tpot_ms > one.tpot_ms


def test_mtp_default_acceptance_and_tpot_by_hand():
    p = plan(speculative_config=MTP1)
    d = p.decode
    one, full = d.speculative
    assert one.batch == 1 and full.batch == d.at_max_concurrency.batch
    # DeepSeek-V3 report: second token accepted 85-90%; kvplan takes 85%: 1 + 0.85 tokens a step
    assert one.acceptance_length == pytest.approx(1.85) and "arXiv:2412.19437" in one.acceptance_source
    layers = sum(s.layers for s in d.inputs.stages)
    draft = (d.batch_1.tpot_ms - d.batch_1.overhead_ms) / layers
    assert one.draft_ms == pytest.approx(draft)
    assert one.tpot_ms == pytest.approx((one.verify_ms + one.draft_ms) / 1.85)
    assert one.tpot_ms < d.batch_1.tpot_ms  # memory-bound at batch 1: speculation pays
    assert any("draft's weights and KV" in a and "not counted" in a for a in p.assumptions)
    three = plan(speculative_config='{"method": "mtp", "num_speculative_tokens": 3}').decode.speculative[0]
    assert three.acceptance_length == pytest.approx(1 + 0.85 + 0.85**2 + 0.85**3)
    assert three.verify_tokens == 4 and three.draft_ms == pytest.approx(3 * draft)
    assert p.to_dict()["decode"]["speculative"][0]["tpot_ms"] == pytest.approx(one.tpot_ms)
    assert plan().to_dict()["decode"]["speculative"] is None


def test_given_acceptance_and_sglang_flags():
    p = plan("llama3-8b", gpus="H100", max_model_len="8K", engine="sglang", speculative_algorithm="EAGLE3",
             speculative_num_steps=3, acceptance_length=2.5)  # fmt: skip
    one = p.decode.speculative[0]
    assert (one.method, one.draft_steps, one.verify_tokens) == ("eagle3", 3, 4)
    assert one.acceptance_source == "--acceptance-length"
    assert one.tpot_ms == pytest.approx((one.verify_ms + one.draft_ms) / 2.5)
    ngram = plan("llama3-8b", gpus="H100", max_model_len="8K", acceptance_length=1.5,
                 speculative_config='{"method": "ngram", "num_speculative_tokens": 4}').decode.speculative[0]  # fmt: skip
    assert ngram.draft_ms == 0 and ngram.verify_tokens == 5


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            {"speculative_config": '{"method": "eagle", "num_speculative_tokens": 3}'},
            "--acceptance-length: give",
        ),
        (
            {"speculative_config": MTP1, "acceptance_length": 3.0},
            "--acceptance-length must be between 1 and 2",
        ),
        (
            {"speculative_config": '{"model": "x/y", "num_speculative_tokens": 3}'},
            "method 'draft_model' is not",
        ),
        ({"speculative_config": "{method"}, "--speculative-config: not JSON"),
        ({"speculative_config": '{"method": "mtp"}'}, "give num_speculative_tokens"),
        ({"speculative_config": MTP1, "engine": "sglang"}, "--speculative-config is a vllm flag"),
        (
            {"speculative_algorithm": "NEXTN", "speculative_num_steps": 1},
            "--speculative-algorithm is an sglang flag",
        ),
        ({"speculative_algorithm": "NEXTN", "engine": "sglang"}, "--speculative-num-steps: give"),
        ({"speculative_algorithm": "MEDUSA", "engine": "sglang"}, "--speculative-algorithm must be"),
        ({"acceptance_length": 2.0}, "--acceptance-length needs speculative decoding"),
    ],
)
def test_refusals_name_the_flag(flags, message):
    with pytest.raises(UsageError, match=message):
        plan(**flags)
