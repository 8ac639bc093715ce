"""The calibration profile without torch: the step model's lookups against hand-worked figures,
the all-reduce fit, the /2 schema's checks (and /1 still read), and the device check."""

from __future__ import annotations

import math

import pytest
import yaml

from helpers import run_cli
from kvplan.calibrate import calibration
from kvplan.calibrate.calibration import AllreduceFit, AllreducePoint, GemmPoint, Launch, Profile

PEAK = 4.0e12  # bytes/s a large bf16 weight streams at in the synthetic profile
LATENCY, BYTES_PER_S = 12e-6, 150e9


def _gemm_points() -> list[GemmPoint]:
    """bf16: sizes 1M and 16M elements; memory-bound (flat) to batch 64, then linear."""
    pts = []
    for elems, k, n in ((1 << 20, 1024, 1024), (1 << 24, 4096, 4096)):
        t_stream = elems * 2 / PEAK
        for batch in (1, 8, 64, 256):
            seconds = t_stream * max(1.0, batch / 64)
            pts.append(GemmPoint("bf16", batch, k, n, seconds, elems * 2 / seconds))
    return pts


def _allreduce() -> AllreduceFit:
    sizes = [8192 << i for i in range(12)]
    pts = [AllreducePoint(b, LATENCY + b / BYTES_PER_S) for b in sizes]
    return AllreduceFit("nccl", 8, 1, "bf16", LATENCY, BYTES_PER_S, BYTES_PER_S * 2 * 7 / 8, 0.0, pts)


def _profile(**kw) -> Profile:
    base = {
        "device": "cuda",
        "device_name": "NVIDIA H200",
        "gpu_spec": "H200",
        "memory_bytes": 150_000_000_000,
        "sm_count": 132,
        "driver": "570.0",
        "torch": "2.x",
        "triton": None,
        "measured_on": "2026-11-30T00:00:00+00:00",
        "quick": True,
        "gemm": _gemm_points(),
        "allreduce": [_allreduce()],
        "launch": Launch(5e-6, 1.5e-6, "test"),
        "gemm_timing": "graph",
    }
    return Profile(**{**base, **kw})


def test_gemm_seconds_at_between_and_past_the_measured_points():
    prof = _profile()
    t1 = (1 << 20) * 2 / PEAK
    t16 = (1 << 24) * 2 / PEAK
    assert prof.gemm_seconds("bf16", 8, 1024, 1024) == pytest.approx(t1)  # a measured point
    assert prof.gemm_seconds("bf16", 128, 4096, 4096) == pytest.approx(t16 * 2)  # log-log in batch
    assert prof.gemm_seconds("bf16", 32, 2048, 2048) == pytest.approx(math.sqrt(t1 * t16))  # in size
    # past the largest size: that size's bandwidth; past batch 256: the last slope (linear here)
    assert prof.gemm_seconds("bf16", 1, 8192, 8192) == pytest.approx(t16 * 4)
    assert prof.gemm_seconds("bf16", 1024, 4096, 4096) == pytest.approx(t16 * 16)
    assert prof.gemm_seconds("bf16", 1, 512, 512) == pytest.approx(t1 / 4)
    assert prof.gemm_seconds("fp8", 1, 4096, 4096) is None  # not measured: None, never a guess
    with pytest.raises(ValueError):
        prof.gemm_seconds("bf16", 0, 4096, 4096)


def test_batch_extrapolation_slope_is_held_between_flat_and_linear():
    rows = [(1, 1.0), (2, 0.5)]  # faster with more rows: noise, held flat
    assert calibration._along_batch(rows, 8) == pytest.approx(0.5)
    rows = [(1, 1.0), (2, 8.0)]  # steeper than linear: held linear
    assert calibration._along_batch(rows, 4) == pytest.approx(16.0)


def test_allreduce_fit_recovers_latency_and_bandwidth():
    pts = [(8192 << i, LATENCY + (8192 << i) / BYTES_PER_S) for i in range(12)]
    latency, bytes_per_s, err = calibration.fit_latency_bandwidth(pts)
    assert latency == pytest.approx(LATENCY, rel=1e-6) and bytes_per_s == pytest.approx(BYTES_PER_S, rel=1e-6)
    assert err < 1e-9
    noisy = [(b, t * (1.1 if i % 2 else 0.9)) for i, (b, t) in enumerate(pts)]
    latency, bytes_per_s, err = calibration.fit_latency_bandwidth(noisy)
    assert latency >= 0 and bytes_per_s > 0 and 0.05 < err < 0.15
    flat = [(b, 1e-3) for b, _ in pts]  # latency only (a CPU's noise can look so): still positive
    assert calibration.fit_latency_bandwidth(flat)[1] > 0


def test_allreduce_and_launch_lookups():
    prof = _profile()
    assert prof.allreduce_seconds(1 << 20, 8) == pytest.approx(LATENCY + (1 << 20) / BYTES_PER_S)
    assert prof.allreduce_seconds(1 << 20, 4) is None and prof.allreduce_seconds(1 << 20, 1) == 0.0
    assert prof.launch_seconds == 5e-6 and prof.launch_graph_seconds == 1.5e-6 and prof.device_kind == "cuda"
    bare = _profile(gemm=[], allreduce=[], launch=None)
    assert bare.gemm_seconds("bf16", 1, 4096, 4096) is None and bare.launch_seconds is None
    two_nodes = AllreduceFit(**{**_allreduce().__dict__, "world_size": 16, "nodes": 2})
    merged = prof.with_allreduce([two_nodes, _allreduce()])
    assert [(a.world_size, a.nodes) for a in merged.allreduce] == [(8, 1), (16, 2)]


def test_profile_round_trips(tmp_path):
    prof = _profile()
    path = tmp_path / "p.yaml"
    calibration.save(prof, path)
    assert yaml.safe_load(path.read_text())["schema"] == "kvplan.calibration/2"
    assert calibration.load(path) == prof


def test_version_1_profiles_are_still_read(tmp_path):
    path = tmp_path / "v1.yaml"
    data = yaml.safe_load(_profile().to_yaml())
    for part in ("gemm", "allreduce", "launch"):
        del data[part]
    data.update(
        schema="kvplan.calibration/1",
        layout={"q_heads": 32},
        ceilings={"bytes": 1.0},
        points=[
            {"kv_dtype": "bf16", "batch": 1, "context": 16, "bytes": 10, "seconds": 1e-6, "bytes_per_s": 1e7}
        ],
        fit={"peak_bytes_per_s": 3e12, "half_bytes": 1e6, "rms_relative_error": 0.01},
    )
    path.write_text(yaml.safe_dump(data))
    prof = calibration.load(path)
    assert prof.fit is not None and prof.fit.peak_bytes_per_s == 3e12
    assert prof.gemm == [] and prof.allreduce_seconds(1024, 8) is None and prof.launch_seconds is None


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["gemm"][3].update(seconds=-1.0), "gemm[3].seconds"),
        (lambda d: d["gemm"][0].update(dtype="fp4"), "gemm[0].dtype"),
        (lambda d: d["gemm"][1].update(batch=1.5), "gemm[1].batch"),
        (lambda d: d["gemm"][0].pop("k"), "gemm[0].k"),
        (lambda d: d["allreduce"][0].update(world_size=1), "allreduce[0].world_size"),
        (lambda d: d["allreduce"][0].update(bytes_per_s=float("inf")), "allreduce[0].bytes_per_s"),
        (lambda d: d["allreduce"][0]["points"][2].update(seconds="fast"), "allreduce[0].points[2].seconds"),
        (lambda d: d["launch"].update(seconds=float("nan")), "launch.seconds"),
        (lambda d: d.update(gemm={"dtype": "bf16"}), "gemm"),
        (lambda d: d.update(device="tpu"), "device"),
        # finite but past any measurement (fuzz H4): 1e300 s overflowed the curve fit into a traceback
        (
            lambda d: d["gemm"][3].update(seconds=1e300),
            "gemm[3].seconds: expected a time in seconds, above 0",
        ),
        (lambda d: d["allreduce"][0].update(latency_seconds=5.0), "allreduce[0].latency_seconds"),
        (lambda d: d["allreduce"][0].update(bytes_per_s=1e300), "allreduce[0].bytes_per_s"),
        (lambda d: d.update(surprise=1), "unknown field 'surprise'"),
    ],
)
def test_bad_fields_are_one_line_errors_naming_file_and_field(tmp_path, edit, field):
    data = yaml.safe_load(_profile().to_yaml())
    edit(data)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    r = run_cli("estimate", "-m", "llama3-8b", "-g", "H200", "--calibration-file", str(path))
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "p.yaml" in r.stderr and field in r.stderr, r.stderr


def test_another_gpus_profile_is_refused_unless_forced(tmp_path):
    path = tmp_path / "h200.yaml"
    calibration.save(_profile(), path)
    ok = run_cli("estimate", "-m", "llama3-8b", "-g", "H200", "--calibration-file", str(path), "--json")
    assert ok.exit_code == 0 and ok.stderr == ""
    use = ok.json()["calibration"]
    assert use["matches_gpu"] and not use["forced"] and use["warning"] is None
    # no kernel part in this profile: attention keeps the datasheet curve; its graph-timed GEMMs count,
    # its launch floor (one trivial kernel, not a layer's small ops) does not
    sources = ok.json()["decode"]["batch_1"]["sources"]
    assert sources["attention"] != "measured on this machine"
    assert sources["weights"] == "measured on this machine"
    assert sources["launch"] == "fitted to published runs"
    # the same GEMM points timed one eager launch at a time are not taken
    eager = tmp_path / "eager.yaml"
    calibration.save(_profile(gemm_timing="eager"), eager)
    j = run_cli(
        "estimate", "-m", "llama3-8b", "-g", "H200", "--calibration-file", str(eager), "--json"
    ).json()
    assert j["decode"]["batch_1"]["sources"]["weights"] == "fitted to published runs"
    assert j["decode"]["batch_1"]["weights_ms"] != ok.json()["decode"]["batch_1"]["weights_ms"]
    other = run_cli("estimate", "-m", "llama3-8b", "-g", "H100", "--calibration-file", str(path))
    assert other.exit_code == 2 and "measured on NVIDIA H200 (H200), not H100-SXM" in other.stderr
    # the same when a stray profile sits under this GPU's name in kvplan's data dir
    calibration.save(_profile(), calibration.default_path("H100-SXM"))
    auto = run_cli("estimate", "-m", "llama3-8b", "-g", "H100")
    assert auto.exit_code == 2 and "--force-calibration" in auto.stderr
    forced = run_cli("estimate", "-m", "llama3-8b", "-g", "H100", "--force-calibration", "--json")
    assert forced.exit_code == 0 and forced.json()["calibration"]["forced"]
    assert "warning: calibration" in forced.stderr
    assert run_cli("estimate", "-m", "llama3-8b", "-g", "H100", "--no-calibration").exit_code == 0


def test_rank_zero_merges_allreduces_into_an_existing_profile(tmp_path):
    from kvplan.calibrate import dist
    from kvplan.errors import UsageError

    path = tmp_path / "p.yaml"
    calibration.save(_profile(), path)
    remeasured = AllreduceFit(**{**_allreduce().__dict__, "latency_seconds": 20e-6})
    two_nodes = AllreduceFit(**{**_allreduce().__dict__, "world_size": 16, "nodes": 2})
    dist.write(path, [remeasured, two_nodes], "cuda", quick=True)
    prof = calibration.load(path)
    assert prof.gemm == _profile().gemm and prof.launch == _profile().launch  # the rest kept
    assert [(a.world_size, a.nodes, a.latency_seconds) for a in prof.allreduce] == [
        (8, 1, 20e-6),
        (16, 2, LATENCY),
    ]
    with pytest.raises(UsageError, match="a cuda profile; these all-reduces run on cpu"):
        dist.write(path, [remeasured], "cpu", quick=True)
