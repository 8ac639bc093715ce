"""AMD Instinct (ROCm) rules of vLLM's weight loading, read in the released wheels' source (no public
MoE startup log on MI300X/MI325X/MI355X was found, so the figures here are hand-computed from that
source, not checked against a log): the unquantized fused-MoE padding of VLLM_ROCM_MOE_PADDING and the
MXFP4 expert padding on ROCm (kvplan/engines/vllm_memory.py)."""

from __future__ import annotations

import pytest

from helpers import REPO, plan
from kvplan.engines import vllm_memory as vm

CORPUS = REPO / "tests" / "fixtures" / "hf" / "corpus"


@pytest.mark.parametrize(
    ("hidden", "inter", "factor"),
    [
        # Qwen3-30B-A3B, TP 1: w13 rows of 2,048 x 2 B = 4,096 B and w2 rows of 768 x 2 B = 1,536 B are
        # both multiples of 512, so both grow by 128 elements: (1,536 x 2,176 + 2,048 x 896) /
        # (1,536 x 2,048 + 2,048 x 768) = 5,177,344 / 4,718,592
        (2048, 768, 5177344 / 4718592),  # +9.7%
        # the same at TP 8: w2 rows of 96 x 2 = 192 B are not a multiple of 512, only w13 grows
        (2048, 96, (192 * 2176 + 2048 * 96) / (192 * 2048 + 2048 * 96)),  # +4.2%
        # Mixtral-8x7B, TP 1: rows of 4,096 and 14,336 both padded by 128
        (4096, 14336, (28672 * 4224 + 4096 * 14464) / (28672 * 4096 + 4096 * 14336)),  # +2.4%
        # DeepSeek-V2-Lite: w2 rows of 1,408 x 2 = 2,816 B (not a multiple of 512) stay
        (2048, 1408, (2816 * 2176 + 2048 * 1408) / (2816 * 2048 + 2048 * 1408)),  # +4.2%
    ],
)
def test_rocm_moe_padding_factor_from_maybe_pad_weight(hidden, inter, factor):
    assert vm.rocm_moe_padding_factor(hidden, inter, 2) == pytest.approx(factor, rel=1e-12)


def test_rocm_moe_padding_kept_by_release():
    # kept: 0.10-0.19 (.data = padded view), 0.25-0.29 (the ROCm Triton path skips .contiguous());
    # lost: 0.20-0.24 (.contiguous() in convert_to_unquantized_kernel_format), 0.30 on (.data.copy_)
    kept = {v: vm.rocm_moe_padding_kept((0, v)) for v in range(10, 34)}
    assert [v for v, k in kept.items() if k] == [*range(10, 20), *range(25, 30)]


def _experts_extra(amd, nvidia):
    return amd.weight_bytes_per_gpu - nvidia.weight_bytes_per_gpu


def test_qwen3_moe_bf16_experts_padded_on_mi300x_not_on_h100():
    # Qwen3-Coder-30B-A3B (Qwen3-30B-A3B's shapes: 48 layers x 128 experts, hidden 2,048, expert
    # intermediate 768), bf16, TP 1: the routed experts grow by 9.7% on MI300X under vLLM 0.10-0.19
    cfg = str(CORPUS / "qwen3-coder-30b-a3b-instruct.json")
    kw = {"num_gpus": 1, "max_model_len": 4096}
    amd = plan(cfg, "MI300X", engine_version="0.11", **kw)
    nv = plan(cfg, "H200", engine_version="0.11", **kw)
    experts = 48 * 128 * 3 * 2048 * 768 * 2  # bytes stored
    assert _experts_extra(amd, nv) == pytest.approx(experts * (5177344 / 4718592 - 1), rel=1e-6)
    assert any("bf16 experts load 9.7% larger" in a for a in amd.assumptions)
    # 0.23 copies the experts compactly again (.contiguous()): no padding, as on CUDA
    assert (
        plan(cfg, "MI300X", engine_version="0.23", **kw).weight_bytes_per_gpu
        == plan(cfg, "H200", engine_version="0.23", **kw).weight_bytes_per_gpu
    )
    # switched off, or AITER's fused MoE (which re-lays the weights out compactly): no padding
    for env in ((("VLLM_ROCM_MOE_PADDING", "0"),), (("VLLM_ROCM_USE_AITER", "1"),)):
        assert plan(cfg, "MI300X", engine_version="0.11", env=env, **kw).weight_bytes_per_gpu == (
            nv.weight_bytes_per_gpu
        )


@pytest.mark.parametrize(
    ("gpu", "version", "pct"),
    [
        # gpt-oss-120b (hidden 2,880, expert intermediate 2,880), TP 1: ROCm rounds both up alike
        ("MI300X", "0.10", "4.5%"),  # mxfp4.py@v0.10.2: to 128 -> 2,944^2 / 2,880^2
        ("MI300X", "0.12", "4.5%"),  # get_padding_alignment: 128 off gfx950
        ("MI355X", "0.12", "13.8%"),  # 256 on gfx950 (CDNA4) -> 3,072^2 / 2,880^2
        ("MI300X", "0.23", "13.8%"),  # fused_moe/oracle/mxfp4.py: ROCm 256
    ],
)
def test_gpt_oss_mxfp4_experts_on_rocm(gpu, version, pct):
    # before: CUDA's Marlin rule (intermediate to 128, hidden to 256: +9.0%) on every AMD card
    p = plan("gpt-oss-120b", gpu, num_gpus=1, engine_version=version, max_model_len=4096)
    assert any(f"MXFP4 experts load {pct} larger" in a and "ROCm Triton" in a for a in p.assumptions)
