"""`kvplan calibrate`: the fit, GPU matching, profiles on disk, and the whole CPU pipeline with real
measurements (sweep -> fit -> save -> estimate reads it)."""

from __future__ import annotations

import math

import pytest
import yaml

from helpers import run_cli
from kvplan.calibrate import calibration, dist, gemm
from kvplan.calibrate import run as calibrate
from kvplan.calibrate.device import match_gpu
from kvplan.specs.registry import all_gpus


def test_fit_recovers_a_known_curve():
    peak, half = 3.0e12, 5.0e6
    pts = [(b, peak * b / (b + half)) for b in (1e5, 1e6, 4e6, 1.6e7, 6.4e7, 2.56e8, 1e9)]
    fit = calibrate.fit_curve(pts)
    assert fit.peak_bytes_per_s == pytest.approx(peak, rel=0.05)
    assert fit.half_bytes == pytest.approx(half, rel=0.1)
    assert fit.rms_relative_error < 0.02
    assert fit.bandwidth(1e12) == pytest.approx(fit.peak_bytes_per_s, rel=1e-3)


@pytest.mark.parametrize(
    ("device_name", "memory_gib", "expected"),
    [
        ("NVIDIA H200", 139.8, "H200"),
        ("NVIDIA H100 80GB HBM3", 79.2, "H100-SXM"),
        ("NVIDIA A100-SXM4-80GB", 79.15, "A100-80GB"),
        ("NVIDIA L40S", 44.5, "L40S"),
        ("NVIDIA GeForce RTX 3090", 23.56, "RTX3090"),
        ("Tesla T4", 14.6, "T4"),  # Turing: the arch the catalog's oldest card needs
        ("Some Future GPU", 200, None),
    ],
)
def test_device_names_match_shipped_gpus(device_name, memory_gib, expected):
    spec = match_gpu(device_name, int(memory_gib * 2**30), all_gpus())
    assert (spec.name if spec else None) == expected


def test_cpu_pipeline_measures_every_part_saves_and_estimate_reads_it(tmp_path):
    """Real measurements on this CPU: the kernel sweep, decode GEMMs, the launch floor, and a gloo
    all-reduce over two processes started by torchrun (the GPU path's launcher)."""
    pytest.importorskip("torch")
    path = tmp_path / "cpu.yaml"
    r = run_cli(
        "calibrate", "--device", "cpu", "--quick", "--only", "kernel,gemm,launch,allreduce",
        "--output", str(path),
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert "saved" in r.stdout and "CPU profile" in r.stdout
    assert "[4/4]" in r.stderr and "allreduce: gloo x2" in r.stderr  # progress while it runs
    data = yaml.safe_load(path.read_text())
    assert data["schema"] == "kvplan.calibration/2" and data["device"] == "cpu"
    assert {"torch", "triton", "measured_on", "layout", "ceilings", "points", "fit"} <= set(data)
    assert len(data["points"]) == 4 and all(p["seconds"] > 0 for p in data["points"])
    assert data["ceilings"]["copy_bytes_per_s"] > 0 and data["ceilings"]["read_bytes_per_s"] > 0
    shapes = gemm.GEMM_SHAPES[("cpu", True)]
    dtypes = {g["dtype"] for g in data["gemm"]}
    assert len(data["gemm"]) == len(dtypes) * len(shapes) * len(gemm.GEMM_BATCHES)
    # fp8 wherever torch._scaled_mm runs (this torch's CPU build has one), else skipped with a note
    assert dtypes == {"bf16", "fp16", "fp8"} or any("fp8 skipped" in n for n in data["notes"])
    (ar,) = data["allreduce"]
    assert (ar["backend"], ar["world_size"], ar["nodes"]) == ("gloo", 2, 1)
    assert [p["bytes"] for p in ar["points"]] == list(dist.QUICK_MESSAGE_BYTES)
    assert ar["bytes_per_s"] > 0 and ar["latency_seconds"] >= 0
    assert data["launch"]["seconds"] > 0 and data["launch"]["graph_seconds"] is None
    assert [p.name for p in tmp_path.iterdir()] == ["cpu.yaml"]  # written atomically, nothing left over

    # round trip: the loaded profile gives back the very figures on disk
    prof = calibration.load(path)
    again = tmp_path / "again.yaml"
    calibration.save(prof, again)
    assert calibration.load(again) == prof and yaml.safe_load(again.read_text()) == data
    g = data["gemm"][0]
    assert prof.gemm_seconds(g["dtype"], g["batch"], g["k"], g["n"]) == pytest.approx(g["seconds"])
    assert (prof.gemm_seconds("fp8", 1, 4096, 4096) is None) == ("fp8" not in dtypes)
    big = ar["points"][-1]["bytes"]
    assert prof.allreduce_seconds(big, 2) == pytest.approx(ar["latency_seconds"] + big / ar["bytes_per_s"])
    assert prof.allreduce_seconds(big, 8) is None and prof.allreduce_seconds(big, 1) == 0.0
    assert prof.launch_seconds == data["launch"]["seconds"] and prof.device_kind == "cpu"

    # a CPU profile never describes an H100 silently: refused in one line, or used when forced
    est = (
        "estimate",
        "-m",
        "llama3-8b",
        "--gpus",
        "1xH100",
        "--context",
        "8K",
        "--calibration-file",
        str(path),
    )
    refused = run_cli(*est, "--json")
    assert (
        refused.exit_code == 2
        and "a CPU profile" in refused.stderr
        and "--force-calibration" in refused.stderr
    )
    assert len(refused.stderr.strip().splitlines()) == 1 and "cpu.yaml" in refused.stderr
    forced = run_cli(*est, "--force-calibration", "--json")
    assert forced.exit_code == 0, forced.stderr
    assert forced.stderr.startswith("warning: calibration") and "--force-calibration" in forced.stderr
    j = forced.json()
    assert j["calibration"]["forced"] and not j["calibration"]["matches_gpu"]
    assert j["calibration"]["device"] == "cpu" and j["calibration"]["path"] == str(path)
    d = j["decode"]
    assert d["measured"] and "CPU profile" in d["bandwidth_source"]
    one = d["batch_1"]
    # the profile's measured kernel points replace the attention term, at the batch and bytes one layer's
    # call reads (32 layers), and its measured GEMMs and launch floor replace the fitted weight and
    # launch terms: the round trip
    kv = one["kv_bytes_read"]
    forced_label = f"measured on {j['calibration']['device_name']}, used for this GPU by --force-calibration"
    assert one["sources"]["attention"] == forced_label
    assert one["attention_ms"] == pytest.approx(32 * prof.attention_seconds(16, 1, kv / 32) * 1e3, rel=1e-6)
    assert one["sources"]["weights"] == forced_label
    # the launch floor (one trivial op) is not a layer's small ops: the fitted per-layer cost stays
    assert one["sources"]["launch"] == "fitted to published runs"
    # CPU GEMMs run as plain ops, as a CPU engine would: taken (gemm_timing: cpu)
    assert data["gemm_timing"] == "cpu" and prof.gemm_as_engine_runs
    # a CPU profile is never picked up by GPU name, only when named
    auto = run_cli("estimate", "-m", "llama3-8b", "--context", "8K", "--json").json()
    assert not auto["decode"]["measured"] and auto["calibration"] is None


def test_saved_gpu_profile_is_found_by_gpu_name(tmp_path):
    fit = calibrate.Fit(peak_bytes_per_s=3.0e12, half_bytes=1.0e7, rms_relative_error=0.01)
    point = calibrate.Point("bf16", 64, 8192, 10**9, 1e9 / 2.9e12, 2.9e12)
    prof = calibrate.Profile(
        device="cuda",
        device_name="NVIDIA H100 80GB HBM3",
        gpu_spec="H100-SXM",
        memory_bytes=85027979264,
        sm_count=132,
        driver="999.0",
        torch="x",
        triton="y",
        measured_on="2026-11-30T00:00:00+00:00",
        quick=True,
        layout=dict(calibrate.STANDARD_LAYOUT),
        ceilings={"bytes": 1.0, "copy_bytes_per_s": 1.0, "read_bytes_per_s": 1.0},
        points=[point],
        fit=fit,
    )
    calibrate.save(prof, calibrate.default_path("H100-SXM"))  # in the test's own data dir
    j = run_cli("estimate", "-m", "llama3-8b", "-g", "H100", "--context", "8K", "--json").json()
    assert j["decode"]["measured"] and "NVIDIA H100 80GB HBM3" in j["decode"]["bandwidth_source"]
    assert j["decode"]["batch_1"]["sources"]["attention"] == "measured on this machine"
    off = run_cli(
        "estimate", "-m", "llama3-8b", "-g", "H100", "--context", "8K", "--no-calibration", "--json"
    )
    assert not off.json()["decode"]["measured"]
    other = run_cli("estimate", "-m", "llama3-8b", "-g", "A100-80GB", "--context", "8K", "--json").json()
    assert not other["decode"]["measured"]  # an H100 profile says nothing of an A100
    # solve times decode with each GPU's own saved profile, and only that GPU's
    ask = ("solve", "-m", "llama3-8b", "-u", "8", "--max-model-len", "8K", "--gpus", "H100,H200", "--json")
    answers = run_cli(*ask).json()["answers"]
    by_gpu = {a["gpu"]: a["decode_step"]["sources"]["attention"] for a in answers}
    assert by_gpu["H100-SXM"] == "measured on this machine"
    assert by_gpu["H200"] != "measured on this machine"  # the H100's profile says nothing of an H200
    off = run_cli(*ask, "--no-calibration").json()["answers"]
    assert all(a["decode_step"]["sources"]["attention"] != "measured on this machine" for a in off)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("points: [\n", "not valid YAML"),
        ("schema: kvplan.overheads/1\nentries: []\n", "not a kvplan calibration profile"),
        ("schema: kvplan.calibration/1\ndevice: cuda\n", "malformed"),
    ],
)
def test_corrupt_or_foreign_profile_is_a_one_line_error(tmp_path, content, message):
    path = tmp_path / "p.yaml"
    path.write_text(content)
    r = run_cli("estimate", "-m", "llama3-8b", "--calibration-file", str(path))
    assert r.exit_code == 2 and message in r.stderr and "p.yaml" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    missing = run_cli("estimate", "-m", "llama3-8b", "--calibration-file", str(tmp_path / "none.yaml"))
    assert missing.exit_code == 2 and "run `kvplan calibrate` first" in missing.stderr


def test_no_gpu_is_a_clear_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = run_cli("calibrate", "--quick")
    assert r.exit_code == 2 and "no CUDA GPU here" in r.stderr and "--device cpu" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    bad = run_cli("calibrate", "--device", "tpu")
    assert bad.exit_code == 2 and "--device must be cuda or cpu" in bad.stderr


def test_model_layouts():
    from kvplan.specs.registry import load_model

    assert calibrate.model_layout(load_model("llama3-70b"))["kv_heads"] == 8
    mla = calibrate.model_layout(load_model("deepseek-v3"))
    assert (mla["kv_heads"], mla["head_dim"], mla["v_dim"], mla["mla"]) == (1, 576, 512, True)
    assert math.isclose(
        calibrate.kv_bytes({"kv_heads": 8, "head_dim": 128, "v_dim": 128}, 2, 17, 2), 2 * 32 * 8 * 256 * 2
    )  # 17 tokens occupy two 16-token pages


def test_parts_and_processes_are_checked_before_measuring(monkeypatch):
    pytest.importorskip("torch")

    def boom(*a, **k):
        raise AssertionError("measured before checking the arguments")

    monkeypatch.setattr(calibrate, "run", boom)
    bad = run_cli("calibrate", "--device", "cpu", "--only", "gemm,flops")
    assert bad.exit_code == 2 and "--only: flops" in bad.stderr
    one = run_cli("calibrate", "--device", "cpu", "--only", "allreduce", "--nproc-per-node", "1")
    assert one.exit_code == 2 and "at least 2 processes" in one.stderr
    assert calibrate.parts_for("cpu", None, None) == (("kernel", "gemm", "launch"), 2)


def test_calibrate_dist_outside_torchrun_says_how_to_run_it(tmp_path, capsys):
    assert dist.main(["--device", "cpu", "--output", str(tmp_path / "p.yaml")]) == 2
    assert "torchrun --nproc-per-node" in capsys.readouterr().err
    assert dist.world_sizes(8) == [2, 4, 8] and dist.world_sizes(12) == [2, 4, 8, 12]
    assert dist.world_sizes(1) == []


def test_gemm_points_can_be_timed_as_graph_replays_over_rotated_weights():
    """The GPU path's shape, on the CPU with a stand-in timer: every call of a point gets its own
    weight (as many copies as the rotation asks for), and the timer's figure is the point's."""
    torch = pytest.importorskip("torch")
    seen: list[int] = []

    def timer(calls):
        seen.append(len(calls))
        for c in calls:
            c()
        return 2.5e-5

    points, notes = gemm.measure_gemms(torch, "cpu", True, lambda _: None, (timer, lambda nbytes: 3))
    shapes = gemm.GEMM_SHAPES[("cpu", True)]
    assert seen and set(seen) == {3}  # three independent weights in every replayed graph
    assert all(p.seconds == 2.5e-5 for p in points)
    assert len(points) == len({p.dtype for p in points}) * len(shapes) * len(gemm.GEMM_BATCHES)
    assert any("CUDA-graph replays over L2-rotated weights" in n for n in notes)


def _cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch


def test_gpu_gemm_and_launch_parts(tmp_path):
    """On a GPU: GEMMs of every dtype the card has (fp8 on sm89+), the launch floor with and
    without a CUDA graph, and large bf16 weights streaming at a plausible share of the datasheet."""
    torch = _cuda()
    path = tmp_path / "gpu.yaml"
    r = run_cli("calibrate", "--quick", "--only", "gemm,launch", "--output", str(path), "--json")
    assert r.exit_code == 0, r.stderr
    prof = calibration.load(path)
    assert prof.gemm_timing == "graph" and prof.gemm_as_engine_runs  # timed as CUDA-graph replays
    fp8 = torch.cuda.get_device_capability(0) >= (8, 9)
    assert {p.dtype for p in prof.gemm} == ({"bf16", "fp16", "fp8"} if fp8 else {"bf16", "fp16"})
    assert prof.launch is not None and prof.launch.graph_seconds is not None
    assert 0 < prof.launch.graph_seconds < prof.launch.seconds < 1e-3
    big = max(p for p in prof.gemm if p.dtype == "bf16" and p.batch == 1 and p.k * p.n >= 8192 * 28672)
    if prof.datasheet_bytes_per_s:
        share = big.weight_bytes_per_s / prof.datasheet_bytes_per_s
        print(
            f"bf16 {big.k}x{big.n} batch 1: {big.weight_bytes_per_s / 1e9:,.0f} GB/s, {share:.0%} of datasheet"
        )
        assert 0.3 < share < 1.05


def test_gpu_allreduce_over_every_gpu(tmp_path):
    torch = _cuda()
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two or more GPUs")
    path = tmp_path / "ar.yaml"
    r = run_cli("calibrate", "--quick", "--only", "allreduce", "--output", str(path))
    assert r.exit_code == 0, r.stderr
    prof = calibration.load(path)
    assert prof.allreduce and all(a.backend == "nccl" for a in prof.allreduce)
    assert prof.allreduce_seconds(1 << 20, torch.cuda.device_count()) is not None
