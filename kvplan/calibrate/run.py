"""`kvplan calibrate`: measure the bandwidth kvplan's own paged decode kernel reaches on this
machine, fit it, and save a versioned profile that `kvplan estimate` uses for decode speed.

Only this module (and kernels/) import torch and triton, and only when calibrating; profiles
are read without them. Profiles are YAML, written atomically.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvplan.calibrate.calibration import (
    SCHEMA,
    Fit,
    Point,
    Profile,
    default_path,
    find_for,
    fit_curve,
    load,
    save,
)
from kvplan.calibrate.device import blank_profile, check_output, require_torch, triton_version
from kvplan.errors import UsageError

__all__ = ["SCHEMA", "Fit", "Point", "Profile", "default_path", "find_for", "fit_curve", "load", "save"]
STANDARD_LAYOUT = {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "v_dim": 128}  # Llama-3-8B/70B-like GQA
PAGE = 16
CALIBRATE_DTYPES = ("bf16", "fp16", "fp8", "int8")
PARTS = ("kernel", "gemm", "launch", "allreduce")

# (batches, contexts) per sweep; points whose caches do not fit the memory budget are skipped
SWEEPS = {
    ("cuda", True): ([1, 8, 32, 128], [1024, 8192, 32768]),
    ("cuda", False): (
        [1, 2, 4, 8, 16, 32, 64, 128, 256],
        [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072],
    ),
    ("cpu", True): ([1, 4], [128, 512]),
    ("cpu", False): ([1, 4, 16], [128, 512, 2048]),
}


# --- running (torch/triton imported here only) ------------------------------------------------


def _median_seconds(fn: Callable[[], Any], device: str, runs: int) -> float:
    if device == "cuda":
        from triton.testing import do_bench

        # device events, L2 flushed before each run, median of the runs
        return do_bench(fn, warmup=10, rep=max(25, runs), return_mode="median") / 1e3
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure_ceilings(device: str, nbytes: int, runs: int) -> dict[str, float]:
    """A device-to-device copy (bytes read + written) and a read-only streaming reduction (the fastest
    of three)."""
    torch = require_torch(device)
    n = nbytes // 4
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    copy_s = _median_seconds(lambda: dst.copy_(src), device, runs)
    # the fastest of three read-only reductions over the same bytes: one sum, row sums (more blocks
    # in flight, no final tree), the largest value
    rows = src.view(-1, 4096) if n % 4096 == 0 else src.view(1, -1)
    read_s = min(
        _median_seconds(lambda: src.sum(), device, runs),
        _median_seconds(lambda: rows.sum(dim=1), device, runs),
        _median_seconds(lambda: src.amax(), device, runs),
    )
    return {
        "bytes": float(nbytes),
        "copy_bytes_per_s": 2 * nbytes / copy_s,
        "read_bytes_per_s": nbytes / read_s,
    }


def _kv_dtype(torch, name: str):
    table = {
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp8": getattr(torch, "float8_e4m3fn", None),
        "int8": torch.int8,
    }
    if name not in table or table[name] is None:
        raise UsageError(f"--kv-cache-dtype {name!r}: use bf16, fp16, fp8 or int8")
    return table[name]


def graph_seconds(torch, calls: Sequence[Callable[..., Any]], reps: int = 20) -> float:
    """Median replay time of one CUDA graph holding every call, divided by the number of calls: how a
    decode step runs in an engine (vLLM captures its decode steps in CUDA graphs), so Python launch
    overhead stays out (device METHOD: graph replay for small launches)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:  # compile, allocate, warm
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del g
    return statistics.median(times) / len(calls)


def rotation(torch, set_bytes: int) -> int:
    """How many independent input sets of `set_bytes` make at least 4x the GPU's L2 (at most 32), so
    that timing one after another measures memory, not the cache."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(32, -(-4 * l2 // max(1, set_bytes))))


def measure_point(device: str, layout: dict, kv_dtype: str, batch: int, context: int, runs: int) -> Point:
    torch = require_torch(device)
    dt = _kv_dtype(torch, kv_dtype)
    hq, hkv, d, dv = layout["q_heads"], layout["kv_heads"], layout["head_dim"], layout["v_dim"]
    mla = layout.get("mla", False)
    pages = -(-context // PAGE)
    blocks = batch * pages
    kv_bytes = blocks * PAGE * hkv * (d + (0 if mla else dv)) * dt.itemsize
    v_dim = dv if mla else None

    def inputs():
        k = torch.randn(blocks, PAGE, hkv, d, device=device).to(dt)
        v = k if mla else torch.randn(blocks, PAGE, hkv, dv, device=device).to(dt)
        table = torch.randperm(blocks, device=device, dtype=torch.int64).to(torch.int32).reshape(batch, pages)
        lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        q = torch.randn(batch, hq, d, device=device, dtype=torch.bfloat16)
        return q, k, v, table, lens

    if device == "cuda":
        from kvplan.kernels.paged_decode import paged_decode

        sets = [inputs() for _ in range(rotation(torch, kv_bytes))]
        calls = [
            lambda q=q, k=k, v=v, t=t, n=n: paged_decode(q, k, v, t, n, v_dim=v_dim, max_seq_len=context)
            for q, k, v, t, n in sets
        ]
        seconds = graph_seconds(torch, calls, reps=max(20, runs))
        q = sets[0][0]
    else:
        from kvplan.kernels.reference import paged_decode_reference

        q, k, v, table, lens = inputs()
        seconds = _median_seconds(
            lambda: paged_decode_reference(q, k, v, table, lens, v_dim=v_dim), device, runs
        )
    nbytes = kv_bytes + q.numel() * q.element_size() + batch * hq * dv * 2
    return Point(kv_dtype, batch, context, nbytes, seconds, nbytes / seconds)


def kv_bytes(layout: dict, batch: int, context: int, elem: int) -> int:
    pages = -(-context // PAGE)
    extra = 0 if layout.get("mla") else layout["v_dim"]
    return batch * pages * PAGE * layout["kv_heads"] * (layout["head_dim"] + extra) * elem


def measure_kernel(
    prof: Profile, layout: dict, kv_dtypes: list[str], progress: Callable[[str], None]
) -> None:
    """The paged decode kernel's part: ceilings, the batch x context sweep, the bandwidth fit."""
    device, quick = prof.device, prof.quick
    torch = require_torch(device)
    triton_version(required=device == "cuda")
    if device == "cuda":
        budget = int(torch.cuda.mem_get_info()[0] * 0.4)
        ceiling_bytes = 1 << 30
    else:
        budget = 256 << 20
        ceiling_bytes = 64 << 20
    runs = 20 if quick else 50
    progress(f"{prof.device_name}: ceilings over {ceiling_bytes / 2**20:,.0f} MiB")
    ceilings = measure_ceilings(device, ceiling_bytes, runs)
    progress(
        f"  copy {ceilings['copy_bytes_per_s'] / 1e9:,.1f} GB/s (read + write), "
        f"read {ceilings['read_bytes_per_s'] / 1e9:,.1f} GB/s"
    )
    batches, contexts = SWEEPS[(device, quick)]
    grid = [(dt, b, c) for dt in kv_dtypes for b in batches for c in contexts]
    points: list[Point] = []
    skipped = 0
    for i, (dt, b, c) in enumerate(grid, 1):
        elem = 1 if dt in ("fp8", "int8") else 2
        if kv_bytes(layout, b, c, elem) > budget:
            skipped += 1
            continue
        p = measure_point(device, layout, dt, b, c, runs)
        points.append(p)
        progress(
            f"  [{i}/{len(grid)}] {dt} batch {b:>3} context {c:>6,}: {p.seconds * 1e3:8.3f} ms, "
            f"{p.bytes_per_s / 1e9:8.1f} GB/s"
        )
    prof.layout, prof.ceilings, prof.points = layout, ceilings, points
    # the profile's headline curve is the 16-bit KV one where measured; Profile.fit_for(bits) gives
    # each width its own (the fp8 path is another kernel)
    sixteen = prof.points_of_width(16)
    prof.fit = fit_curve(
        [(float(p.bytes), p.bytes_per_s) for p in (sixteen if len(sixteen) >= 3 else points)]
    )
    prof.notes += [
        "decode kernel bytes counted: Q + K/V read in whole pages + output; decimal GB/s",
        f"{skipped} of {len(grid)} kernel points skipped: their caches exceed {budget / 2**30:.1f} GiB",
    ]


def run(
    device: str,
    quick: bool,
    layout: dict,
    kv_dtypes: list[str],
    gpu_specs: list,
    progress: Callable[[str], None],
    parts: tuple[str, ...] = ("kernel",),
    nproc: int = 2,
) -> Profile:
    """Measure `parts` of this device (kernel, gemm, launch, allreduce) into one profile. On a CPU
    with one torch thread: OpenMP threads that wait on each other stall for a scheduler tick when
    another process holds a core, which made the figures depend on the machine's other load."""
    torch = require_torch(device)
    prof = blank_profile(device, quick, gpu_specs)
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
        prof.notes.append("CPU: measured with one torch thread (torchrun's ranks too)")
    try:
        _measure_parts(torch, prof, parts, layout, kv_dtypes, nproc, progress)
    finally:
        torch.set_num_threads(threads)
    return prof


def _measure_parts(
    torch,
    prof: Profile,
    parts: tuple[str, ...],
    layout: dict,
    kv_dtypes: list[str],
    nproc: int,
    progress: Callable[[str], None],
) -> None:
    from kvplan.calibrate import dist, gemm

    device, quick = prof.device, prof.quick
    if "kernel" in parts:
        measure_kernel(prof, layout, kv_dtypes, progress)
    if "gemm" in parts:
        batches = ", ".join(map(str, gemm.GEMM_BATCHES))
        progress(f"{prof.device_name}: decode GEMMs, batch {batches}")
        timer = None
        if device == "cuda":  # timed as an engine replays its decode step: a CUDA graph, L2-rotated
            timer = (lambda calls: graph_seconds(torch, calls), lambda nbytes: rotation(torch, nbytes))
        prof.gemm, notes = gemm.measure_gemms(torch, device, quick, progress, timer)
        prof.gemm_timing = "graph" if device == "cuda" else "cpu"
        prof.notes += notes
    if "launch" in parts:
        prof.launch = gemm.measure_launch(torch, device)
        graph = prof.launch.graph_seconds
        progress(
            f"  launch floor: {prof.launch.seconds * 1e6:,.2f} us eager"
            + (f", {graph * 1e6:,.2f} us in a CUDA graph" if graph else "")
        )
    if "allreduce" in parts:
        if device == "cuda":
            torch.cuda.empty_cache()  # the ranks want GPU 0's memory too
        prof.allreduce = prof.with_allreduce(dist.spawn(device, nproc, quick, progress)).allreduce


def _check_parts(only: str | None, nproc: int | None) -> None:
    """--only and --nproc-per-node as far as they can be read without torch (before the device is asked for)."""
    if only is not None:
        wanted = [p.strip() for p in only.split(",") if p.strip()]
        bad = [p for p in wanted if p not in PARTS]
        if not wanted or bad:
            raise UsageError(f"--only: {', '.join(bad) or repr(only)}: choose from {', '.join(PARTS)}")
    if nproc is not None and nproc < 2:
        raise UsageError(f"--nproc-per-node: an all-reduce needs at least 2 processes, got {nproc}")


def parts_for(device: str, only: str | None, nproc: int | None) -> tuple[tuple[str, ...], int]:
    """(parts to measure, processes for the all-reduce). Default: kernel, gemm and launch, and on
    a machine with several GPUs the all-reduce over all of them; --only picks parts."""
    torch = require_torch(device)
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    procs = nproc if nproc is not None else (gpus if device == "cuda" else 2)
    if only is None:
        wanted = ["kernel", "gemm", "launch"] + (["allreduce"] if device == "cuda" and procs >= 2 else [])
    else:
        wanted = [p.strip() for p in only.split(",") if p.strip()]
        bad = [p for p in wanted if p not in PARTS]
        if not wanted or bad:
            raise UsageError(f"--only: {', '.join(bad) or repr(only)}: choose from {', '.join(PARTS)}")
    if nproc is not None and "allreduce" not in wanted:
        raise UsageError(
            "--nproc-per-node sizes the all-reduce, which this run does not measure; add --only allreduce"
        )
    if "allreduce" in wanted:
        if procs < 2:
            raise UsageError(f"--nproc-per-node: an all-reduce needs at least 2 processes, got {procs}")
        if device == "cuda" and procs > gpus:
            raise UsageError(f"--nproc-per-node {procs}: this machine has {gpus} GPU(s)")
        cores = os.cpu_count() or 1
        if device != "cuda" and procs > cores:  # each process is a torch runtime of its own (~130 MB)
            raise UsageError(
                f"--nproc-per-node {procs}: this machine has {cores} CPU core(s); give at most {cores}"
            )
    return tuple(p for p in PARTS if p in wanted), procs


def kv_dtypes_for(device: str, requested: str | None) -> list[str]:
    """The KV dtypes to sweep: those asked for (a comma list), else bf16, and fp8 where the GPU
    has it: Triton's fp8e4nv needs sm89 or newer (assumed from Triton's fp8 support)."""
    if requested:
        return [d.strip() for d in requested.split(",") if d.strip()]
    torch = require_torch(device)
    if device == "cuda" and torch.cuda.get_device_capability(0) >= (8, 9):
        return ["bf16", "fp8"]
    return ["bf16"]


def measure_and_save(
    device: str,
    quick: bool,
    model: str | None,
    kv_dtype: str | None,
    output: str | None,
    progress: Callable[[str], None],
    force: bool = False,
    only: str | None = None,
    nproc: int | None = None,
) -> tuple[Profile, Path]:
    """`kvplan calibrate`: measure this device (the kernel with the model's head layout, or the
    standard one; GEMMs; the launch floor; all-reduces), save the profile (default: kvplan's data
    dir, by GPU spec name) and say where."""
    from kvplan.specs.registry import all_gpus, load_model

    if device not in ("cuda", "cpu"):
        raise UsageError(f"--device must be cuda or cpu, got {device!r}")
    # every argument is checked before minutes of measuring
    if output:
        check_output(Path(output), force)
        if not Path(output).parent.is_dir():  # a mistyped directory is not created as a new tree
            raise UsageError(
                f"--output {output}: no directory {Path(output).parent}; create it first or name another"
            )
    _check_parts(only, nproc)
    if kv_dtype:
        _check_kv_dtypes(kv_dtype)
    layout = model_layout(load_model(model)) if model else dict(STANDARD_LAYOUT)
    require_torch(device)  # before the dtypes: a missing torch is the error to report
    parts, procs = parts_for(device, only, nproc)
    dtypes = kv_dtypes_for(device, kv_dtype)
    prof = run(device, quick, layout, dtypes, all_gpus(), progress, parts, procs)
    path = Path(output) if output else default_path(prof.gpu_spec or prof.device_name)
    check_output(path, force or not output)  # kvplan's own data dir: its profiles only
    save(prof, path)
    return prof, path


def _check_kv_dtypes(requested: str) -> None:
    names = [d.strip() for d in requested.split(",") if d.strip()]
    bad = [d for d in names if d not in CALIBRATE_DTYPES]
    if not names or bad:
        raise UsageError(
            f"--kv-cache-dtype: {', '.join(bad) or repr(requested)}: choose from {', '.join(CALIBRATE_DTYPES)}"
        )


def model_layout(spec) -> dict[str, Any]:
    """The per-GPU head layout at TP 1 of a model's first attention layer."""
    from kvplan.specs.models import HeadLayer, LatentAttention

    for layer in spec.layers:
        if isinstance(layer, LatentAttention):
            return {
                "q_heads": spec.num_attention_heads,
                "kv_heads": 1,
                "head_dim": layer.latent_dim,
                "v_dim": layer.kv_lora_rank,
                "mla": True,
                "model": spec.name,
            }
        if isinstance(layer, HeadLayer):
            return {
                "q_heads": spec.num_attention_heads,
                "kv_heads": layer.num_kv_heads,
                "head_dim": layer.head_dim,
                "v_dim": layer.v_dim,
                "model": spec.name,
            }
    raise UsageError(f"{spec.name} has no attention layer to calibrate with")
