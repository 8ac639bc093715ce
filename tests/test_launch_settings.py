"""The kernel's launch settings per GPU architecture (kernels/launch.yaml, measured on an H200 with
benchmarks/tune_kernel.py). Needs triton (the calibrate extra); skipped without it."""

from __future__ import annotations

import pytest

tl = pytest.importorskip("triton.language")

from kvplan.kernels import paged_decode as pd  # noqa: E402


@pytest.mark.parametrize(
    ("head_dim", "v_dim", "elem", "arch", "block_n", "warps", "stages"),
    [
        (128, 128, 2, 90, 128, 4, 2),  # launch.yaml sm90 gqa16
        (128, 128, 1, 90, 128, 4, 3),  # sm90 gqa8
        (576, 512, 2, 90, 64, 8, 2),  # sm90 mla
        (256, 256, 2, 90, 64, 4, 2),  # a 512-byte row: half the tuned 256-byte row's tile
        (128, 128, 4, 90, 64, 4, 2),  # fp32 KV: likewise
        (576, 512, 4, 90, 32, 8, 2),  # fp32 MLA (on the H200 64 x 576 x 4 B needed 319 KB of shared memory)
        (128, 128, 2, 80, 64, 4, 3),  # no sm80 entry: the defaults
        (256, 256, 2, None, 32, 4, 3),  # the defaults' rule before the table: 32 for head_dim > 128
        (576, 512, 2, None, 32, 8, 3),
    ],
)
def test_launch_settings_by_architecture(head_dim, v_dim, elem, arch, block_n, warps, stages):
    cfg = pd.launch_config(
        batch=32,
        q_heads=16 if v_dim != head_dim else 32,
        kv_heads=1 if v_dim != head_dim else 8,
        head_dim=head_dim,
        page=16,
        v_dim=v_dim,
        max_len=8192,
        sms=132,
        compute=tl.bfloat16,
        kv_element_bytes=elem,
        arch=arch,
    )
    assert (cfg.split_constexprs["BLOCK_N"], cfg.num_warps, cfg.num_stages) == (block_n, warps, stages)


def test_split_target_follows_the_table():
    # GQA 32/8 at batch 32 on 132 SMs: 256 programs; sm90's 2 programs an SM want 264, so 2 splits of
    # 4,096 tokens; the default 4 an SM want 528: 3 splits of 2,752 (a multiple of the 64-token tile)
    common = {"batch": 32, "q_heads": 32, "kv_heads": 8, "head_dim": 128, "page": 16, "v_dim": 128}
    tuned = pd.launch_config(**common, max_len=8192, sms=132, compute=tl.bfloat16, arch=90)
    default = pd.launch_config(**common, max_len=8192, sms=132, compute=tl.bfloat16, arch=None)
    assert (tuned.splits, tuned.tokens) == (2, 4096)
    assert (default.splits, default.tokens) == (3, 2752)
