"""Weight streaming and the launch floor: what a decode step's GEMMs and its many small kernels cost.

A decode GEMM is F.linear(x[B, K], W[N, K]) with B (the batch) small: it streams the weight once,
so its time is weight bytes / bandwidth until B is large enough to be compute-bound. bf16 and fp16
everywhere; fp8 (e4m3, per-tensor scales, torch._scaled_mm, bf16 out) where that runs (sm89+
GPUs, CPU builds that have it). On a GPU each point is timed as an engine runs it: replays of one
CUDA graph over enough independent weights to be 4x the L2 (the caller's `graph`), so neither the
host's launch gap nor the cache is in it; on a CPU, the median of perf_counter runs. torch is passed in by the caller (kvplan.calibrate.run), never imported at module level.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from kvplan.calibrate.calibration import GEMM_BYTES, GemmPoint, Launch

GEMM_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# (K, N) of typical decode matrices: Llama-3-8B attention/MLP (4096 x 4096, 4096 x 14336),
# Llama-3-70B (8192 x 8192, 8192 x 28672), and the small slices tensor parallelism leaves
GEMM_SHAPES = {
    ("cuda", False): ((1024, 1024), (4096, 1024), (4096, 4096), (4096, 14336), (8192, 8192), (8192, 28672)),
    ("cuda", True): ((1024, 1024), (4096, 4096), (8192, 28672)),
    ("cpu", False): ((256, 256), (512, 1024), (1024, 2048)),
    ("cpu", True): ((256, 256), (1024, 2048)),
}
ELEMENT_BYTES = GEMM_BYTES
L2_FLUSH_BYTES = 256 << 20  # larger than any GPU's L2 (H200: 50 MiB, B200: 126 MiB)
CPU_POINT_S = 0.05  # a CPU point is timed for about this long


def median_seconds(torch: Any, fn: Callable[[], Any], device: str, runs: int, flush: Any = None) -> float:
    """Median seconds of `fn`: on a GPU, CUDA events around each run after 3 warm-ups, the L2
    flushed (`flush`, a large buffer, zeroed) before each run; on a CPU, perf_counter, with as
    many runs as fit in CPU_POINT_S (at least 5, at most `runs`)."""
    if device == "cuda":
        for _ in range(3):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        for start, end in zip(starts, ends, strict=True):
            if flush is not None:
                flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)) / 1e3
    t = time.perf_counter()
    fn()  # warm-up, and a first idea of the time
    first = time.perf_counter() - t
    count = max(5, min(runs, int(CPU_POINT_S / max(first, 1e-9))))
    times = []
    for _ in range(count):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def gemm_dtypes(torch: Any, device: str) -> tuple[list[str], list[str]]:
    """(dtypes to measure, notes): bf16 and fp16; fp8 where torch._scaled_mm runs: sm89+ GPUs,
    and CPUs whose torch has an fp8 _scaled_mm (checked on a 16 x 16 product)."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return ["bf16", "fp16"], [f"GEMM fp8 skipped: torch {torch.__version__} has no _scaled_mm"]
    if device == "cuda":
        cap = torch.cuda.get_device_capability(0)
        if cap < (8, 9):
            return ["bf16", "fp16"], [f"GEMM fp8 skipped: sm{cap[0]}{cap[1]} has no fp8 tensor cores (sm89+)"]
    try:
        _gemm_fn(torch, device, "fp8", 16, _weight(torch, device, "fp8", 16, 16))()
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        return ["bf16", "fp16"], [
            f"GEMM fp8 skipped: torch._scaled_mm fails here ({str(exc).splitlines()[0][:100]})"
        ]
    return ["bf16", "fp16", "fp8"], []


def _weight(torch: Any, device: str, dtype: str, k: int, n: int) -> Any:
    """W[n, k] as a linear layer holds it (fp8: its transpose, column-major [k, n], as _scaled_mm wants)."""
    if dtype == "fp8":
        return torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()
    return torch.randn(n, k, device=device, dtype=torch.bfloat16 if dtype == "bf16" else torch.float16)


def _gemm_fn(torch: Any, device: str, dtype: str, batch: int, w: Any) -> Callable[[], Any]:
    """The decode GEMM x[batch, k] @ W^T with a fresh x."""
    if dtype == "fp8":
        x = torch.randn(batch, w.shape[0], device=device).to(torch.float8_e4m3fn)
        one = torch.ones((), device=device, dtype=torch.float32)
        return lambda: torch._scaled_mm(x, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    x = torch.randn(batch, w.shape[1], device=device, dtype=w.dtype)
    linear = torch.nn.functional.linear
    return lambda: linear(x, w)


GraphTimer = Callable[[list[Callable[[], Any]]], float]  # calls -> seconds per call, replayed as one graph
Rotation = Callable[[int], int]  # bytes of one call's weight -> independent copies that make 4x the L2


def measure_gemms(
    torch: Any,
    device: str,
    quick: bool,
    progress: Callable[[str], None],
    graph: tuple[GraphTimer, Rotation] | None = None,
) -> tuple[list[GemmPoint], list[str]]:
    """Every (dtype, K x N, batch) of the sweep; a dtype or shape torch refuses here is skipped
    with a note, never a failure. On a GPU `graph` times each point (kvplan.calibrate passes its
    CUDA-graph timer); without it, one eager launch at a time (the profile says which)."""
    dtypes, notes = gemm_dtypes(torch, device)
    shapes = GEMM_SHAPES[(device, quick)]
    runs = 20 if quick else 50
    flush = (
        torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
        if device == "cuda" and not graph
        else None
    )
    points: list[GemmPoint] = []
    for dtype in dtypes:
        for k, n in shapes:
            row = []
            weight_bytes = k * n * ELEMENT_BYTES[dtype]
            copies = graph[1](weight_bytes) if graph is not None else 1
            weights = [_weight(torch, device, dtype, k, n) for _ in range(copies)]
            for batch in GEMM_BATCHES:
                try:
                    fn = _gemm_fn(torch, device, dtype, batch, weights[0])
                    fn()
                except (RuntimeError, TypeError) as exc:  # unsupported here: say so, keep going
                    notes.append(
                        f"GEMM {dtype} {k}x{n} batch {batch} skipped: {str(exc).splitlines()[0][:120]}"
                    )
                    continue
                if graph is not None:
                    calls = [_gemm_fn(torch, device, dtype, batch, w) for w in weights]
                    seconds = graph[0](calls)
                else:
                    seconds = median_seconds(torch, fn, device, runs, flush)
                p = GemmPoint(dtype, batch, k, n, seconds, weight_bytes / seconds)
                points.append(p)
                row.append(f"{batch}:{p.weight_bytes_per_s / 1e9:.3g}")
            progress(f"  GEMM {dtype} {k}x{n} (batch:GB/s of weight) {' '.join(row)}")
    how = "CUDA-graph replays over L2-rotated weights" if graph else "one launch per run"
    notes.append(
        f"GEMM: F.linear(x[batch, K], W[N, K]) (fp8: torch._scaled_mm, per-tensor scales, bf16 out), {how}; "
        "weight_bytes_per_s counts K x N x element bytes only; decimal GB/s"
    )
    return points, notes


def measure_launch(torch: Any, device: str) -> Launch:
    """The per-kernel floor: a one-element in-place add launched back to back, per launch (median
    of 7 loops); on a GPU also one add of a replayed CUDA graph of 100 adds."""
    x = torch.zeros(1, device=device)
    count = 1000

    def loop() -> None:
        for _ in range(count):
            x.add_(1)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    loop()
    sync()
    per_launch = []
    for _ in range(7):
        t = time.perf_counter()
        loop()
        sync()
        per_launch.append((time.perf_counter() - t) / count)
    eager = statistics.median(per_launch)
    if device != "cuda":
        return Launch(eager, None, "CPU: torch op dispatch of a one-element add_, perf_counter")
    return Launch(
        eager, _graph_launch_seconds(torch, x), "CUDA: one-element add_, host-timed loop; graph: events"
    )


def _graph_launch_seconds(torch: Any, x: Any) -> float | None:
    kernels, replays = 100, 20
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the default stream, as capture wants
            for _ in range(3):
                x.add_(1)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(kernels):
                x.add_(1)
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / (kernels * replays)
    except RuntimeError:
        return None
