"""Issue 23: speculative decoding in the decode step, and the draft's weights and KV in memory."""

from __future__ import annotations

from pathlib import Path

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
    assert any(a.startswith("speculative draft (mtp)") for a in p.assumptions)
    three = plan(speculative_config='{"method": "mtp", "num_speculative_tokens": 3}').decode.speculative[0]
    assert three.acceptance_length == pytest.approx(1 + 0.85 + 0.85**2 + 0.85**3)
    assert three.verify_tokens == 4 and three.draft_ms == pytest.approx(3 * draft)
    assert p.to_dict()["decode"]["speculative"][0]["tpot_ms"] == pytest.approx(one.tpot_ms)
    assert plan().to_dict()["decode"]["speculative"] is None


DRAFT = str(Path(__file__).parent / "fixtures" / "draft" / "eagle-llama3-8b.json")


def test_given_acceptance_and_sglang_flags():
    p = plan("llama3-8b", gpus="H100", max_model_len="8K", engine="sglang", speculative_algorithm="EAGLE3",
             speculative_num_steps=3, acceptance_length=2.5, speculative_draft_config=DRAFT)  # fmt: skip
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
        (
            {
                "speculative_config": '{"method": "eagle", "num_speculative_tokens": 3}',
                "acceptance_length": 2.0,
            },
            "eagle: give --speculative-draft-config PATH",
        ),
        (
            {"speculative_config": MTP1, "speculative_draft_config": "x.json"},
            "--speculative-draft-config: mtp has no draft checkpoint",
        ),
        ({"speculative_draft_config": "x.json"}, "--speculative-draft-config needs speculative decoding"),
        (
            {"model": "llama3-8b", "gpus": "H100", "max_model_len": "8K", "speculative_config": MTP1},
            "llama3-8b has no MTP layers",
        ),
    ],
)
def test_refusals_name_the_flag(flags, message):
    with pytest.raises(UsageError, match=message):
        plan(**flags)


GIB = 2**30


def test_vllm_mtp_draft_weights_and_kv_by_hand():
    """vLLM: the MTP layer's weights join the target's; its one MLA layer of KV takes its share of the budget."""
    base = plan()
    p = plan(speculative_config=MTP1)
    d = p.speculative_memory
    assert d is not None and d.in_budget and d.layers == 1
    # one MLA layer per token: (kv_lora_rank 512 + rope 64) x 2 bytes (bf16), whole on every GPU
    assert d.kv_bytes_per_token_per_gpu == (512 + 64) * 2
    # weights: one MoE decoder layer per GPU + eh_proj 2 x 7168 x 7168 x 2 bytes
    st = base.stages[0]
    assert p.weight_bytes_per_gpu == base.weight_bytes_per_gpu + d.weight_bytes_per_gpu
    assert (
        d.weight_bytes_per_gpu > 2 * 7168 * 7168 * 2 + 1.2 * GIB
    )  # ~1.34 GiB: 1/58 of the experts + the rest
    # the KV budget: (the plain budget - the draft's weights) x 61 / (61 + 1) layers' bytes
    target = 61 * (512 + 64) * 2
    expect = (st.kv_budget_bytes_per_gpu - d.weight_bytes_per_gpu) * target / (target + 1152)
    assert p.kv_budget_bytes_per_gpu == pytest.approx(expect, abs=2)
    # the draft's share is the budget less the target's (the memory table's row): its tokens' bytes, within
    # the whole blocks the target's share rounds to
    assert d.kv_bytes_per_gpu == p.engine.available_kv_bytes - p.kv_budget_bytes_per_gpu
    assert 0 <= d.kv_bytes_per_gpu - d.pool_tokens * 1152 < p.block_bytes_per_gpu + 64 * 1152
    assert p.kv_pool_tokens < base.kv_pool_tokens
    assert p.to_dict()["speculative_memory"]["weight_bytes_per_gpu"] == d.weight_bytes_per_gpu
    assert base.to_dict()["speculative_memory"] is None


def test_sglang_draft_has_its_own_pool_beside_the_target():
    """SGLang: the target's pool is untouched; the draft's pool holds its tokens + max_num_reqs x (steps + draft tokens) + 100."""
    base = plan(engine="sglang")
    p = plan(engine="sglang", speculative_algorithm="NEXTN", speculative_num_steps=2)
    d = p.speculative_memory
    assert d is not None and not d.in_budget
    assert p.kv_pool_tokens == base.kv_pool_tokens
    # max_num_reqs is --max-running-requests, 48 under speculative decoding when not given (server_args.py); the
    # pool-derived min(max(pool / ctx x 512, 2048), 4096) only without it
    reqs = 48
    assert d.pool_tokens == base.kv_pool_tokens + reqs * (2 * 1 + 3) + 100
    given = plan(
        engine="sglang", speculative_algorithm="NEXTN", speculative_num_steps=2, max_running_requests=4096
    )
    assert given.speculative_memory.pool_tokens == base.kv_pool_tokens + 4096 * (2 * 1 + 3) + 100
    assert d.kv_bytes_per_gpu == pytest.approx(d.pool_tokens * 1152, abs=1)


def test_eagle_draft_config_sizes_the_head():
    """EAGLE: one Llama layer of its own + fc 2h x h, embedding and LM head shared; KV: one GQA layer."""
    p = plan("llama3-8b", gpus="H100", max_model_len="8K", acceptance_length=2.0, speculative_draft_config=DRAFT,
             speculative_config='{"method": "eagle", "num_speculative_tokens": 3}')  # fmt: skip
    d = p.speculative_memory
    h, inter = 4096, 14336
    layer = h * h * 2 + 2 * (h * 1024) + 3 * h * inter + 2 * h  # q, o; k, v (8 x 128); MLP; 2 norms
    own = layer + h + 2 * h * h  # + final norm + fc
    assert d.weight_bytes_per_gpu == pytest.approx(own * 2, rel=0.001)
    assert d.kv_bytes_per_token_per_gpu == 2 * 8 * 128 * 2


@pytest.mark.parametrize(
    ("config", "layers"),
    [("glm-5.2.json", 1), ("qwen3.5-9b.json", 1), ("minimax-m2.5.json", 1), ("kimi-k2.5.json", 0)],
)
def test_hf_configs_give_their_mtp_layers(config, layers):
    """num_nextn_predict_layers / mtp_num_hidden_layers / mtp_transformer_layers are read, so MTP
    speculative decoding plans from a config.json (it was refused: 'has no MTP layers')."""
    from kvplan.specs.registry import load_model

    corpus = Path(__file__).parent / "fixtures" / "hf" / "corpus"
    assert load_model(str(corpus / config)).mtp_layers == layers


def test_mtp_from_a_config_json_counts_its_layer():
    corpus = Path(__file__).parent / "fixtures" / "hf" / "corpus"
    plan = kvplan.estimate(
        str(corpus / "glm-5.2.json"), gpus="8xH200", weight_dtype="fp8", max_model_len="8K",
        speculative_config='{"method": "mtp", "num_speculative_tokens": 1}',
    )  # fmt: skip
    draft = plan.speculative_memory
    assert draft is not None and draft.method == "mtp" and draft.weight_bytes_per_gpu > 2**30
