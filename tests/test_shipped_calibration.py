"""kvplan's shipped H200 profile (measured on an H200 with benchmarks/device_check.sh) and the kernel's
per-architecture launch settings (kernels/launch.yaml, measured with benchmarks/tune_kernel.py)."""

from __future__ import annotations

import statistics

import pytest
import triton.language as tl
import yaml

from helpers import run_cli
from kvplan.calibrate import calibration
from kvplan.kernels import paged_decode as pd
from kvplan.specs.registry import load_gpu
from kvplan.userdata import profile_path, shipped_profile_path

EST = ("estimate", "-m", "llama3-8b", "-g", "H200", "--context", "8K", "--json")


def test_shipped_h200_profile_is_a_full_gpu_sweep():
    path = shipped_profile_path("H200")
    prof = calibration.load(path)
    assert prof.device == "cuda" and prof.gpu_spec == "H200" and not prof.quick
    assert calibration.mismatch(prof, load_gpu("H200")) is None
    dtypes = {p.kv_dtype for p in prof.points}
    assert dtypes == {"bf16", "fp8"} and len(prof.points) >= 150  # 2 x 9 x 9 less the caches over 40%
    assert {g.dtype for g in prof.gemm} == {"bf16", "fp16", "fp8"}
    assert prof.launch is not None and prof.launch.graph_seconds < prof.launch.seconds


def test_each_kv_width_gets_its_own_kernel_curve():
    prof = calibration.load(shipped_profile_path("H200"))
    sixteen, eight = prof.fit_for(16), prof.fit_for(8)
    # the headline fit is the 16-bit one (calibrate.measure_kernel)
    assert sixteen == prof.fit
    # on the H200 the fp8 path reads half the bytes in about the same time: its useful bandwidth
    # peaks far lower (bench_kernel.md: 2,285 vs 4,264 GB/s at batch 128 x 32K)
    assert eight.peak_bytes_per_s < 0.7 * sixteen.peak_bytes_per_s
    # each curve fits its own points better than one curve over both would
    both = calibration.fit_curve([(p.bytes, p.bytes_per_s) for p in prof.points])
    assert sixteen.rms_relative_error < both.rms_relative_error
    assert eight.rms_relative_error < both.rms_relative_error
    # a profile of one width serves the other with the overall fit
    only16 = calibration.Profile(
        **{**prof.__dict__, "points": [p for p in prof.points if p.kv_dtype == "bf16"]}
    )
    assert only16.fit_for(8) == only16.fit


def test_estimate_on_h200_uses_the_shipped_profile_and_says_so():
    j = run_cli(*EST).json()
    assert j["calibration"]["shipped"] and j["calibration"]["matches_gpu"]
    assert j["calibration"]["path"] == "model_specs/calibrations/H200.yaml"  # the same on every machine
    src = j["decode"]["batch_1"]["sources"]
    assert src["attention"] == src["weights"] == src["launch"] == "measured on NVIDIA H200"
    assert src["overhead"] == "fitted to published runs"
    assert "kvplan's shipped profile, 2026-12-01" in j["decode"]["bandwidth_source"]
    off = run_cli(*EST, "--no-calibration").json()
    assert off["calibration"] is None and not off["decode"]["measured"]
    # an fp8 cache is timed on the fp8 curve: slower per byte than bf16's
    fp8 = run_cli(*EST, "--kv-cache-dtype", "fp8").json()["decode"]["batch_1"]
    bf16 = j["decode"]["batch_1"]
    assert fp8["kv_bytes_read"] * 2 == bf16["kv_bytes_read"]
    assert fp8["attention_ms"] > 0.65 * bf16["attention_ms"]  # half the bytes, far from half the time
    # other GPUs have no shipped profile
    h100 = run_cli("estimate", "-m", "llama3-8b", "-g", "H100", "--context", "8K", "--json").json()
    assert h100["calibration"] is None


def test_a_users_own_profile_comes_before_the_shipped_one():
    mine = profile_path("H200")
    mine.parent.mkdir(parents=True, exist_ok=True)
    text = shipped_profile_path("H200").read_text()
    data = yaml.safe_load(text)
    data["measured_on"] = "2027-01-02T00:00:00+00:00"
    mine.write_text(yaml.safe_dump(data))
    try:
        j = run_cli(*EST).json()
        assert not j["calibration"]["shipped"] and j["calibration"]["path"] == str(mine)
        assert j["decode"]["batch_1"]["sources"]["attention"] == "measured on this machine"
    finally:
        mine.unlink()


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


def test_kernel_time_interpolates_the_measured_grid():
    prof = calibration.load(shipped_profile_path("H200"))
    p = next(q for q in prof.points if (q.kv_dtype, q.batch, q.context) == ("bf16", 32, 8192))
    assert prof.attention_seconds(16, 32, p.bytes) == pytest.approx(p.seconds, rel=1e-9)  # a measured point
    # leave each interior point out and interpolate it from the others (batch x bytes per sequence):
    # the grid predicts the held-out kernel times better than one curve in bytes fitted to all of them
    grid, curve = [], []
    for bits in (16, 8):
        pts = prof.points_of_width(bits)
        batches, contexts = sorted({q.batch for q in pts}), sorted({q.context for q in pts})
        for q in pts:
            if q.batch in (batches[0], batches[-1]) or q.context in (contexts[0], contexts[-1]):
                continue
            rows = [(r.bytes / r.batch, r.batch, r.seconds) for r in pts if r is not q]
            grid.append(abs(calibration.grid_seconds(rows, q.batch, q.bytes / q.batch) / q.seconds - 1))
            curve.append(abs(q.bytes / prof.fit_for(bits).bandwidth(q.bytes) / q.seconds - 1))
    assert len(grid) == 98
    # measured: median 3.1% held out (worst 23.0%) against the curve's 6.5% (worst 20.9%)
    assert statistics.median(grid) < 0.04 and statistics.median(grid) < statistics.median(curve)
    # an estimate times its attention from the grid: at 111 users of 8K on an H200, 4.2 TB/s, where the
    # 16-bit curve would give 3.6 (calibrate_full.txt: batch 128 x 8K read at 4,180 GB/s)
    d = run_cli(*EST).json()["decode"]["at_max_concurrency"]
    assert d["sources"]["attention"] == "measured on NVIDIA H200"
    assert 4.0e12 < d["kv_bytes_read"] / (d["attention_ms"] / 1e3) < 4.4e12
