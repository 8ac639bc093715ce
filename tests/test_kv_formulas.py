"""Per-layer KV formulas: every attention kind, quantized formats, blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from helpers import REPO, plan
from kvplan.errors import UsageError
from kvplan.formats import KV_DTYPES, kv_format
from kvplan.model import kv
from kvplan.specs.models import (
    ChunkedAttention,
    CompressedAttention,
    FullAttention,
    LatentAttention,
    RecurrentState,
    SharedKV,
    SlidingWindow,
)
from kvplan.specs.registry import all_models, load_model

BF16 = KV_DTYPES["bf16"]


def test_full_attention_is_2_x_heads_x_dim_x_bytes():
    layer = FullAttention(num_kv_heads=8, head_dim=128)
    assert kv.layer_bits_per_token(layer, BF16) == 2 * 8 * 128 * 16


def test_different_k_and_v_head_dims():
    layer = FullAttention(num_kv_heads=4, head_dim=192, head_dim_v=128)
    assert kv.layer_bits_per_token(layer, BF16) // 8 == 4 * (192 + 128) * 2


def test_mla_latent_is_replicated_across_tp():
    layer = LatentAttention(kv_lora_rank=512, qk_rope_head_dim=64)
    assert kv.layer_bits_per_token(layer, BF16, tp=1) // 8 == 576 * 2
    assert kv.layer_bits_per_token(layer, BF16, tp=8) // 8 == 576 * 2


@pytest.mark.parametrize(
    ("kv_heads", "tp", "per_rank"), [(8, 1, 8), (8, 2, 4), (8, 8, 1), (4, 8, 1), (1, 8, 1)]
)
def test_kv_heads_split_then_replicated(kv_heads, tp, per_rank):
    assert kv.kv_heads_per_rank(kv_heads, tp) == per_rank
    layer = FullAttention(num_kv_heads=kv_heads, head_dim=128)
    assert kv.layer_bits_per_token(layer, BF16, tp) == per_rank * 2 * 128 * 16


def test_sliding_and_chunked_stop_growing_at_their_window():
    sw = SlidingWindow(num_kv_heads=8, head_dim=64, window=128)
    ch = ChunkedAttention(num_kv_heads=8, head_dim=128, chunk=8192)
    assert kv.layer_entries(sw, 100) == 100
    assert kv.layer_entries(sw, 100_000) == 128
    assert kv.layer_entries(ch, 100_000) == 8192
    # blocks: the last 128 tokens can straddle 9 blocks of 16
    assert kv.layer_blocks(sw, 100_000, 16) == 9
    assert kv.layer_blocks(sw, 64, 16) == 4
    assert kv.layer_blocks(ch, 100_000, 16) == 512


def test_compressed_layer_keeps_one_entry_per_m_tokens():
    layer = CompressedAttention(num_kv_heads=1, head_dim=512, ratio=4)
    assert kv.layer_entries(layer, 1000) == 250
    assert kv.layer_entries(layer, 1001) == 251
    assert kv.layer_blocks(layer, 1001, 16) == 16  # ceil(251 / 16)


def test_shared_and_state_layers():
    assert kv.layer_bits_per_token(SharedKV(source=-1), BF16) == 0
    state = RecurrentState(state_bytes=1_000_000)
    assert kv.layer_bits_per_token(state, BF16) == 0
    assert kv.layer_state_bytes(state, tp=1) == 1_000_000
    assert kv.layer_state_bytes(state, tp=4) == 250_000
    # the state does not grow with context
    assert kv.sequence_bytes([state], BF16, 10) == kv.sequence_bytes([state], BF16, 100_000)


def test_cross_layer_sharing_halves_the_cache(tmp_path: Path):
    spec = yaml.safe_load((Path(__file__).parent.parent / "model_specs/models/llama3-8b.yaml").read_text())
    spec["name"] = "llama3-8b-cla2"
    spec["layer_types"]["shared"] = {"kind": "shared", "source": -1}
    spec["layer_pattern"] = ["attn", "shared"]
    path = tmp_path / "cla.yaml"
    path.write_text(yaml.safe_dump(spec))
    cla = load_model(str(path))
    base = load_model("llama3-8b")
    assert kv.sequence_bytes(cla.layers, BF16, 4096) * 2 == kv.sequence_bytes(base.layers, BF16, 4096)


def test_request_charged_whole_blocks():
    layer = FullAttention(num_kv_heads=8, head_dim=128)
    assert kv.layer_blocks(layer, 16, 16) == 1
    assert kv.layer_blocks(layer, 17, 16) == 2
    assert kv.layer_blocks(layer, 1, 16) == 1
    assert kv.page_bytes(layer, BF16, 16) == 16 * 4096


def test_int4_group_64_with_fp16_scale_and_zero_is_4_5_bits():
    fmt = kv_format("int4", "bf16")
    assert float(fmt.bits_per_value) == 4.5
    assert fmt.vector_bits(128) == 128 * 4 + 2 * 32


def test_fp8_is_8_bits_with_no_in_block_scales():
    for name in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        fmt = kv_format(name, "bf16")
        assert fmt.bits_per_value == 8 and fmt.vector_bits(128) == 1024


def test_quant_group_options_change_the_overhead():
    assert float(kv_format("int8", "bf16", group_size=128).bits_per_value) == 8 + 32 / 128
    assert float(kv_format("int4", "bf16", group_size=32, zero_point=False).bits_per_value) == 4 + 16 / 32
    assert float(kv_format("int4", "bf16", group_size=0).bits_per_value) == 4
    with pytest.raises(UsageError):
        kv_format("bf16", "bf16", group_size=64)


def test_auto_follows_the_activation_dtype_even_with_quantized_weights():
    p = plan("deepseek-v3", "H200", num_gpus=8, max_model_len=8192)
    assert p.settings.weight_dtype == "fp8"
    assert p.settings.kv_cache_dtype == "bf16"
    assert p.kv_bytes_per_token == 70272


FACTS = yaml.safe_load((REPO / "tests" / "fixtures" / "reference" / "model_facts.yaml").read_text())
# models shipped after the sheet was written are checked against their config.json instead
# (tests/test_hybrid.py, test_sparse_attention.py, test_hf_families.py)
IN_SHEET = [m for m in all_models() if m.name in FACTS]


def test_the_fact_sheet_covers_the_models_it_was_written_for():
    assert len(IN_SHEET) >= 22


@pytest.mark.parametrize("spec", IN_SHEET, ids=lambda m: m.name)
def test_shipped_models_match_the_reference_fact_sheet(spec):
    """KV figures derived in the fact sheet (tests/fixtures/reference/model_facts.yaml, each figure
    with its public source) match kvplan's, in bf16."""
    fact = FACTS[spec.name]
    k = fact["kv_cache"]
    layers = spec.layers
    all_bits = sum(kv.layer_bits_per_token(x, BF16) for x in layers)
    growing = sum(kv.layer_bits_per_token(x, BF16) for x in layers if kv.is_growing(x))
    cap = sum(
        kv.layer_bits_per_token(x, BF16) * kv.layer_entries(x, 1 << 40)
        for x in layers
        if not kv.is_growing(x)
    )
    assert all_bits // 8 == k["bf16_bytes_per_token_if_all_layers_full"]
    assert growing // 8 == k["bf16_bytes_per_token_full_layers_only"]
    assert cap // 8 == k.get("bf16_bytes_cap_per_sequence_windowed_layers", 0)
    for ours, theirs in [
        (spec.num_layers, "num_hidden_layers"),
        (spec.vocab_size, "vocab_size"),
        (spec.hidden_size, "hidden_size"),
        (spec.num_attention_heads, "num_attention_heads"),
        (spec.tie_word_embeddings, "tie_word_embeddings"),
    ]:
        if isinstance(fact.get(theirs), (int, bool)):  # "unverified" entries are skipped
            assert ours == fact[theirs], theirs
