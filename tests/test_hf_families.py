"""Model families read from their real config.json (tests/fixtures/hf/corpus/), each figure worked by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan import kv
from kvplan.formats import KV_DTYPES
from kvplan.params import param_breakdown
from kvplan.specs.hf.decilm import ffn_mult_to_intermediate_size
from kvplan.specs.registry import load_model

CORPUS = Path(__file__).parent / "fixtures" / "hf" / "corpus"
BF16 = KV_DTYPES["bf16"]


def corpus(name: str):
    return load_model(str(CORPUS / f"{name}.json"))


def kv_bytes_per_token(spec) -> int:
    return kv.model_bits_per_token(spec.layers, BF16) // 8


def test_nemotron_super_49b_kv_from_block_configs():
    spec = corpus("llama-3.3-nemotron-super-49b-v1")
    # 49 blocks with attention (n_heads_in_group 8: 64 / 8 = 8 KV heads), 31 with attention no_op:
    # 49 x 8 heads x 128 x 2 (K, V) x 2 B = 200,704 B/token (read as 80 x 64 heads it was 2,621,440)
    assert kv_bytes_per_token(spec) == 49 * 8 * 128 * 2 * 2 == 200_704
    assert sum(1 for x in spec.layers if type(x).__name__ == "NoCache") == 31


def test_nemotron_super_49b_params_from_ffn_mult():
    # ffn_mult -> int(2 x mult x 8192 / 3) rounded up to 256: 5.25 -> 28672, 2.625 -> 14336, 0.5 -> 2816
    assert ffn_mult_to_intermediate_size(5.25, 8192) == 28672
    assert ffn_mult_to_intermediate_size(2.625, 8192) == 14336
    assert ffn_mult_to_intermediate_size(0.5, 8192) == 2816  # int(2730.67) = 2730, up to 11 x 256
    total = param_breakdown(corpus("llama-3.3-nemotron-super-49b-v1")).total
    assert total == pytest.approx(49.87e9, rel=0.002)  # the model card: 49.9B
