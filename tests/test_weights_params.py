"""Parameter counts and weight bytes per GPU."""

from __future__ import annotations

import pytest

from helpers import plan
from kvplan.formats import WEIGHT_DTYPES, weight_format
from kvplan.model.params import architecture_params, param_breakdown
from kvplan.model.weights import param_bytes, stage_weights
from kvplan.specs.registry import all_models, load_model


@pytest.mark.parametrize("spec", [m for m in all_models() if m.total_params], ids=lambda m: m.name)
def test_architecture_count_agrees_with_stated_totals(spec):
    assert sum(architecture_params(spec)) == pytest.approx(spec.total_params, rel=0.005)


# Totals published by the model makers (model cards / READMEs); the specs do not state them.
@pytest.mark.parametrize(
    ("model", "published", "rel"),
    [
        ("deepseek-v3", 671e9, 0.005),
        ("kimi-k2", 1.0e12, 0.05),
        ("gpt-oss-20b", 21e9, 0.01),
        ("gpt-oss-120b", 117e9, 0.005),
        ("qwen3-235b-a22b", 235e9, 0.005),
        ("deepseek-v2-lite", 15.7e9, 0.005),
        ("qwen3-32b", 32.8e9, 0.005),
        ("llama4-scout", 109e9, 0.02),  # 109B includes the vision encoder
    ],
)
def test_architecture_count_matches_published_totals(model, published, rel):
    assert param_breakdown(load_model(model)).total == pytest.approx(published, rel=rel)


def test_moe_active_params():
    assert param_breakdown(load_model("mixtral-8x7b")).active == pytest.approx(12.9e9, rel=0.01)
    # not stated in a spec -> derived from top-k of the routed experts
    spec = load_model("qwen3-235b-a22b").model_copy(update={"active_params": None})
    assert param_breakdown(spec).active == pytest.approx(22e9, rel=0.03)


def test_weight_formats_bits():
    assert float(WEIGHT_DTYPES["int4"].bits_per_value) == pytest.approx(4 + 20 / 128)
    assert float(WEIGHT_DTYPES["mxfp4"].bits_per_value) == 4.25
    assert param_bytes(1000, weight_format("bf16")) == 2000


def test_tp_splits_weights():
    p1 = plan("llama3-8b", "H100", num_gpus=1, max_model_len=8192)
    p2 = plan("llama3-8b", "H100", num_gpus=2, tp=2, max_model_len=8192)
    assert p1.weight_bytes_per_gpu == 8030261248 * 2
    assert p2.weight_bytes_per_gpu == pytest.approx(p1.weight_bytes_per_gpu / 2, abs=1)


def test_tied_embeddings_stored_once_but_twice_under_pp():
    spec = load_model("gemma2-27b")
    pb = param_breakdown(spec)
    bf16 = weight_format("bf16")
    one = stage_weights(spec, pb, bf16, bf16, tp=1, pp=1)
    two = stage_weights(spec, pb, bf16, bf16, tp=1, pp=2)
    assert one[0].bytes_per_gpu == pytest.approx(pb.total * 2, abs=2)
    assert sum(s.bytes_per_gpu for s in two) == pytest.approx((pb.total + pb.embedding) * 2, abs=4)


def test_untied_head_sits_on_the_last_stage():
    spec = load_model("llama3-70b")
    pb = param_breakdown(spec)
    bf16 = weight_format("bf16")
    first, last = stage_weights(spec, pb, bf16, bf16, tp=1, pp=2)
    assert first.bytes_per_gpu == pytest.approx((pb.body / 2 + pb.embedding) * 2, abs=2)
    assert last.bytes_per_gpu == pytest.approx((pb.body / 2 + pb.lm_head) * 2, abs=2)


def test_quantized_weights_fit_where_bf16_does_not():
    # gpt-oss-120b: MXFP4 experts fit one 80 GB H100 (as OpenAI ships it)
    p = plan("gpt-oss-120b", "H100", num_gpus=1, max_model_len=8192)
    assert 55e9 < p.weight_bytes_per_gpu < 70e9
    # llama3-70b in int4 fits one H100; in bf16 it does not
    p4 = plan("llama3-70b", "H100", num_gpus=1, weight_dtype="int4", max_model_len=8192)
    # int4 (group 128, 20 bits of scale and zero a group) covers the blocks' linear layers; the embedding
    # and the LM head (128,256 x 8,192 each) stay bf16, as AWQ/GPTQ checkpoints keep them
    edges = 2 * 128256 * 8192
    expected = (70553706496 - edges) * (4 + 20 / 128) / 8 + edges * 2
    assert p4.weight_bytes_per_gpu == pytest.approx(expected, rel=1e-6)
