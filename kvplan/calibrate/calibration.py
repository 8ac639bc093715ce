"""A calibration profile: what `kvplan calibrate` measured on one device, in memory and on disk.

Four optional parts (a profile may hold only some): the paged decode kernel's bandwidth curve,
decode-shaped GEMMs (weight streaming), all-reduces per world size, and the kernel launch floor.
The step model reads them through `gemm_seconds`, `allreduce_seconds` and `launch_seconds`.
Pure Python: no torch here, profiles are read on any machine. YAML, written atomically; the
loader checks every field and names the file and the field in one line.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kvplan.errors import SpecError, UsageError
from kvplan.specs.io import load_yaml_text, read_text
from kvplan.units import printable
from kvplan.userdata import present, profile_path, shipped_profile_path, write_atomic

if TYPE_CHECKING:
    from kvplan.specs.models import GpuSpec

SCHEMA = "kvplan.calibration/2"
SCHEMA_V1 = "kvplan.calibration/1"  # the decode kernel only; still read
GEMM_DTYPES = ("bf16", "fp16", "fp8")
GEMM_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}  # bytes an element of each


@dataclass
class Point:
    """One paged decode kernel call."""

    kv_dtype: str
    batch: int
    context: int
    bytes: int  # Q + K/V read (whole pages) + output
    seconds: float  # median
    bytes_per_s: float


@dataclass
class Fit:
    """useful bandwidth(B) = peak x B / (B + half), B the bytes one kernel call reads."""

    peak_bytes_per_s: float
    half_bytes: float
    rms_relative_error: float

    def bandwidth(self, nbytes: float) -> float:
        return self.peak_bytes_per_s * nbytes / (nbytes + self.half_bytes)


def fit_curve(points: list[tuple[float, float]]) -> Fit:
    """Least squares in relative error over (bytes, bytes/s) points; half searched on a log grid,
    peak in closed form for each half."""
    if not points:
        raise UsageError("calibrate: no point was measured; nothing to fit")
    best: Fit | None = None
    for k in range(0, 241):
        half = 10 ** (3 + k * 0.04)  # 1 KB .. 1 TB
        xs = [b / (b + half) for b, _ in points]
        num = sum(x / y for x, (_, y) in zip(xs, points, strict=True))
        den = sum((x / y) ** 2 for x, (_, y) in zip(xs, points, strict=True))
        peak = num / den
        err = math.sqrt(
            sum(((peak * x - y) / y) ** 2 for x, (_, y) in zip(xs, points, strict=True)) / len(points)
        )
        if best is None or err < best.rms_relative_error:
            best = Fit(peak, half, err)
    assert best is not None
    return best


@functools.lru_cache(maxsize=64)
def _fit_cached(points: tuple[tuple[float, float], ...]) -> Fit:
    return fit_curve(list(points))


EIGHT_BIT_KV = ("fp8", "int8")


@dataclass
class GemmPoint:
    """x[batch, k] @ W[k, n]: the weight streamed once per decode step."""

    dtype: str  # of x and W: bf16, fp16, fp8 (e4m3, torch._scaled_mm, bf16 out)
    batch: int
    k: int
    n: int
    seconds: float  # median
    weight_bytes_per_s: float  # k x n x element bytes / seconds (the weight only)


@dataclass
class AllreducePoint:
    bytes: int  # the message: what each rank contributes
    seconds: float  # median of the slowest rank


@dataclass
class AllreduceFit:
    """time(bytes) = latency + bytes / bytes_per_s, least squares in relative error."""

    backend: str  # nccl | gloo
    world_size: int
    nodes: int
    dtype: str  # of the message's elements
    latency_seconds: float
    bytes_per_s: float  # message bytes per second ("algorithm bandwidth")
    bus_bytes_per_s: float  # nccl-tests' bus bandwidth: bytes_per_s x 2 (n - 1) / n
    rms_relative_error: float
    points: list[AllreducePoint]

    def seconds(self, nbytes: int) -> float:
        return self.latency_seconds + nbytes / self.bytes_per_s


@dataclass
class Launch:
    """The per-kernel floor: a one-element add, launched back to back."""

    seconds: float  # eager: launched from Python (CPU: one op dispatched)
    graph_seconds: float | None  # one kernel of a replayed CUDA graph; None on CPU or if capture failed
    method: str


@dataclass
class Profile:
    device: str  # cuda | cpu
    device_name: str
    gpu_spec: str | None  # the shipped GPU spec it matches
    memory_bytes: int
    sm_count: int | None
    driver: str | None
    torch: str
    triton: str | None
    measured_on: str
    quick: bool
    # the paged decode kernel (empty when not measured)
    layout: dict[str, Any] = field(default_factory=dict)
    ceilings: dict[str, float] = field(default_factory=dict)
    points: list[Point] = field(default_factory=list)
    fit: Fit | None = None
    # the step model's parts
    gemm: list[GemmPoint] = field(default_factory=list)
    allreduce: list[AllreduceFit] = field(default_factory=list)
    launch: Launch | None = None
    datasheet_bytes_per_s: float | None = None
    schema: str = SCHEMA
    notes: list[str] = field(default_factory=list)
    # how the GEMM points were timed: "graph" (CUDA-graph replays over L2-rotated weights, as an
    # engine replays its decode steps), "eager" (one launch between two events: the host's launch
    # gap is in every point), "cpu"; null in profiles written before kvplan recorded it (eager)
    gemm_timing: str | None = None

    @property
    def gemm_as_engine_runs(self) -> bool:
        """The GEMM points time what an engine launches: CUDA-graph replays on a GPU (vLLM and SGLang
        capture their decode steps in CUDA graphs), plain ops on a CPU."""
        return bool(self.gemm) and (self.device == "cpu" or self.gemm_timing == "graph")

    @property
    def device_kind(self) -> str:
        """'cuda' or 'cpu'."""
        return self.device

    @property
    def launch_seconds(self) -> float | None:
        """One trivial kernel launched eagerly (CPU: one op dispatched); None if not measured."""
        return self.launch.seconds if self.launch else None

    @property
    def launch_graph_seconds(self) -> float | None:
        """One kernel inside a replayed CUDA graph; None if not measured."""
        return self.launch.graph_seconds if self.launch else None

    def gemm_seconds(self, dtype: str, batch: int, k: int, n: int) -> float | None:
        """Time of x[batch, k] @ W[k, n] in `dtype`, from the measured points: log-log in the
        weight's k x n and in batch; past the measured sizes at the nearest size's bandwidth.
        None when no GEMM of that dtype was measured."""
        pts = [p for p in self.gemm if p.dtype == dtype]
        if not pts:
            return None
        if batch < 1 or k < 1 or n < 1:
            raise ValueError(f"gemm_seconds: batch, k and n must be >= 1, got {batch}, {k}, {n}")
        return gemm_seconds_from(pts, batch, k * n)

    def allreduce_seconds(self, nbytes: int, world_size: int) -> float | None:
        """One all-reduce of an `nbytes` message over `world_size` ranks, from the fit for that
        world size (the one spanning the fewest nodes when several were measured); 0 for one
        rank; None when that world size was not measured."""
        if world_size == 1:
            return 0.0
        fits = sorted((f for f in self.allreduce if f.world_size == world_size), key=lambda f: f.nodes)
        return fits[0].seconds(nbytes) if fits else None

    def with_allreduce(self, fits: list[AllreduceFit]) -> Profile:
        """This profile with `fits` replacing those of the same backend, world size and nodes."""
        keys = {(f.backend, f.world_size, f.nodes) for f in fits}
        kept = [f for f in self.allreduce if (f.backend, f.world_size, f.nodes) not in keys]
        merged = sorted([*kept, *fits], key=lambda f: (f.nodes, f.world_size))
        return Profile(**{**self.__dict__, "allreduce": merged})

    def to_yaml(self) -> str:
        data = asdict(self)
        data = {"schema": SCHEMA, **{k: v for k, v in data.items() if k != "schema"}}
        return yaml.safe_dump(data, sort_keys=False)

    def points_of_width(self, kv_bits: float) -> list[Point]:
        """The kernel points of one KV width: 8-bit (fp8, int8) for kv_bits <= 8, else 16-bit (bf16, fp16)."""
        eight = kv_bits <= 8
        return [p for p in self.points if (p.kv_dtype in EIGHT_BIT_KV) == eight]

    def fit_for(self, kv_bits: float) -> Fit | None:
        """The kernel curve of this KV width alone: fitted to the 8-bit points (fp8, int8) or the
        16-bit ones (bf16, fp16) where the profile has 3 or more; else the fit over every point.
        One curve over both mixes two kernels: on an H200 the fp8 path reads half the bytes in the
        same time (benchmarks/results/h200/bench_kernel.md)."""
        pts = tuple((p.bytes, p.bytes_per_s) for p in self.points_of_width(kv_bits))
        return _fit_cached(pts) if len(pts) >= 3 else self.fit

    def attention_seconds(self, kv_bits: float, batch: int, nbytes: float) -> float | None:
        """One decode-kernel call of `batch` sequences reading `nbytes` in all, from the measured points of
        this KV width (grid_seconds over batch and bytes per sequence: the kernel's speed depends on both,
        which one curve in bytes cannot hold; on the H200 batch 8 at 128K reads at 3.0 TB/s, batch 32 at
        8K at 4.0); None when the profile measured no point of this width."""
        rows = [(p.bytes / p.batch, p.batch, p.seconds) for p in self.points_of_width(kv_bits)]
        if not rows or batch < 1 or nbytes <= 0:
            return None
        return grid_seconds(rows, batch, nbytes / batch)

    def describe(self, path: Path) -> str:
        what = "CPU profile" if self.device == "cpu" else self.device_name
        if is_shipped(path):
            return f"kvplan's shipped profile, {self.measured_on[:10]}; model_specs/calibrations/{path.name}"
        return f"bandwidth measured by kvplan calibrate on {what} ({self.measured_on[:10]}; {path})"


# --- the step model's lookups (pure) -------------------------------------------------------------


def _loglerp(x0: float, y0: float, x1: float, y1: float, x: float) -> float:
    """y at x on the straight line through (x0, y0), (x1, y1) in log-log."""
    if x1 == x0:
        return y0
    w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))


def _along_batch(pts: list[tuple[int, float]], batch: int) -> float:
    """Seconds at `batch` from (batch, seconds) points sorted by batch: log-log between two
    measured batches; below the first, the first (time does not fall with fewer rows); past the
    last, the last segment's log-log slope held to [0, 1] (flat if memory-bound, at most linear)."""
    if batch <= pts[0][0] or len(pts) == 1:
        return pts[0][1] if batch <= pts[0][0] else pts[0][1] * batch / pts[0][0]
    for (b0, s0), (b1, s1) in zip(pts, pts[1:], strict=False):
        if batch <= b1:
            return _loglerp(b0, s0, b1, s1, batch)
    (b0, s0), (b1, s1) = pts[-2], pts[-1]
    slope = min(1.0, max(0.0, math.log(s1 / s0) / math.log(b1 / b0)))
    return s1 * (batch / b1) ** slope


def gemm_seconds_from(pts: list[GemmPoint], batch: int, weight_elems: int) -> float:
    """Seconds of a GEMM whose weight holds `weight_elems` (k x n), at `batch` rows, from points of
    one dtype. Shapes of the same k x n are pooled (median per batch)."""
    return grid_seconds([(p.k * p.n, p.batch, p.seconds) for p in pts], batch, weight_elems)


def grid_seconds(rows: list[tuple[float, int, float]], batch: int, size: float) -> float:
    """Seconds at (`batch`, `size`) from measured (size, batch, seconds) rows: along batch at each
    measured size (_along_batch), then log-log between the two sizes around `size`; below or above the
    measured sizes, that size's time scaled by size (its bandwidth). Repeats are pooled (median)."""
    by_size: dict[float, dict[int, list[float]]] = {}
    for sz, b, sec in rows:
        by_size.setdefault(sz, {}).setdefault(b, []).append(sec)
    sizes = sorted(by_size)

    def at(sz: float) -> float:
        return _along_batch(sorted((b, _median(s)) for b, s in by_size[sz].items()), batch)

    if size <= sizes[0]:
        return at(sizes[0]) * size / sizes[0]
    if size >= sizes[-1]:
        return at(sizes[-1]) * size / sizes[-1]
    hi = next(i for i, s in enumerate(sizes) if s >= size)
    lo_size, hi_size = sizes[hi - 1], sizes[hi]
    return _loglerp(lo_size, at(lo_size), hi_size, at(hi_size), size)


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def fit_latency_bandwidth(points: list[tuple[int, float]]) -> tuple[float, float, float]:
    """(latency s, bytes/s, rms relative error) of time = latency + bytes / bandwidth over
    (bytes, seconds) points: weighted least squares (weights 1/t^2, so small messages count as
    much as large ones); latency held at >= 0."""
    if len(points) < 2:
        raise UsageError("calibrate: an all-reduce fit needs at least two message sizes")
    sw = sx = sy = sxx = sxy = 0.0
    for b, t in points:
        w = 1.0 / t**2
        sw, sx, sy, sxx, sxy = sw + w, sx + w * b, sy + w * t, sxx + w * b * b, sxy + w * b * t
    det = sw * sxx - sx * sx
    slope = (sw * sxy - sx * sy) / det if det > 0 else 0.0
    latency = (sy - slope * sx) / sw
    if latency < 0 or slope <= 0:
        latency = max(0.0, latency) if slope > 0 else 0.0
        slope = (sxy - latency * sx) / sxx  # the best slope for that latency
    if slope <= 0:  # times that fall with size: noise; the largest message's average rate
        big_bytes, big_s = max(points)
        slope = big_s / big_bytes
    err = math.sqrt(sum(((latency + slope * b - t) / t) ** 2 for b, t in points) / len(points))
    return latency, 1.0 / slope, err


# --- is this profile about the plan's GPU? ----------------------------------------------------------


@dataclass(frozen=True)
class CalibrationUse:
    """Which profile a plan took its measured figures from (`calibration` in estimate's JSON)."""

    path: str
    device: str
    device_name: str
    gpu_spec: str | None
    matches_gpu: bool
    forced: bool  # used for another device because of --force-calibration
    warning: str | None
    shipped: bool = False  # kvplan's own profile of this GPU (model_specs/calibrations/), not the user's


def mismatch(prof: Profile, gpu: GpuSpec) -> str | None:
    """Why `prof` does not describe `gpu`, or None when it does."""
    if prof.device != "cuda":
        return f"a CPU profile ({printable(prof.device_name)})"
    if prof.gpu_spec is None or prof.gpu_spec not in gpu.all_names:
        return (
            f"measured on {printable(prof.device_name)} ({printable(prof.gpu_spec or 'no shipped GPU spec')})"
        )
    return None


def use_for(prof: Profile, path: Path, gpu: GpuSpec, force: bool) -> CalibrationUse:
    """A profile checked against the plan's GPU: another device's is refused in one line unless
    forced, and then the use carries a warning."""
    why = mismatch(prof, gpu)
    if why and not force:
        raise UsageError(
            f"{path}: {why}, not {gpu.name}: its figures do not describe this plan's GPU; "
            f"run `kvplan calibrate` on that GPU, or pass --force-calibration to use it anyway"
        )
    warning = (
        f"calibration {path} is {why}, used for {gpu.name} because of --force-calibration: "
        "its measured figures describe that device, not this GPU"
        if why
        else None
    )
    shipped = is_shipped(path)
    # kvplan's own profile is named as it sits in the package, the same on every machine
    where = f"model_specs/calibrations/{path.name}" if shipped else str(path)
    return CalibrationUse(
        where,
        prof.device,
        prof.device_name,
        prof.gpu_spec,
        why is None,
        bool(why),
        warning,
        shipped,
    )


# --- on disk -------------------------------------------------------------------------------------


def default_path(name: str) -> Path:
    return profile_path(name)


def save(profile: Profile, path: Path) -> None:
    write_atomic(path, profile.to_yaml())


def is_shipped(path: Path) -> bool:
    return path.resolve().parent == shipped_profile_path("x").parent


def find_for(gpu_name: str) -> tuple[Profile, Path] | None:
    """The profile saved under this shipped GPU's name (the user's own `kvplan calibrate`), else the
    one kvplan ships for it, if any (whatever device it describes: the caller checks that)."""
    for path in (default_path(gpu_name), shipped_profile_path(gpu_name)):
        if present(path):  # a dangling link or a loop is read (and refused)
            return load(path, saved=True), path
    return None


def load(path: Path, saved: bool = False) -> Profile:
    """A profile file: one named by --calibration-file, or (`saved`) the one kvplan found for the GPU."""
    advice = "pass --no-calibration" if saved else "pass another --calibration-file"

    def bad(what: str) -> SpecError:
        return SpecError(f"{path}: {what}; re-run `kvplan calibrate` or {advice}")

    if not present(path):
        raise SpecError(f"{path}: no such calibration profile; run `kvplan calibrate` first")
    try:
        data = load_yaml_text(read_text(path), path)
    except SpecError as exc:
        raise bad(
            str(exc).removeprefix(f"{path}:").strip().replace("malformed YAML", "not valid YAML")
        ) from None
    if not isinstance(data, dict) or data.get("schema") not in (SCHEMA, SCHEMA_V1):
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise bad(
            f"not a kvplan calibration profile (schema {found!r}, expected {SCHEMA!r} or {SCHEMA_V1!r})"
        )
    _check_fields(data, data["schema"] == SCHEMA_V1, bad)
    try:
        prof = Profile(
            **{
                **{k: v for k, v in data.items() if k not in _PARTS},
                "schema": SCHEMA,
                "layout": data.get("layout") or {},
                "ceilings": data.get("ceilings") or {},
                "notes": data.get("notes") or [],
                "fit": Fit(**data["fit"]) if data.get("fit") is not None else None,
                "points": [Point(**p) for p in data.get("points") or []],
                "gemm": [GemmPoint(**p) for p in data.get("gemm") or []],
                "allreduce": [
                    AllreduceFit(**{**a, "points": [AllreducePoint(**p) for p in a["points"]]})
                    for a in data.get("allreduce") or []
                ],
                "launch": Launch(**data["launch"]) if data.get("launch") is not None else None,
            }
        )
    except (KeyError, TypeError) as exc:
        unknown = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        raise bad(f"unknown field {unknown[1]!r}" if unknown else f"malformed ({exc})") from None
    return prof


# --- field checks: every field a plan reads, of the right type, finite and in range ----------------

_PARTS = ("fit", "points", "gemm", "allreduce", "launch")
Check = tuple[Callable[[Any], bool], str]  # the test, and what it wants (for the message)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _maybe(check: Check) -> Check:
    test, wants = check
    return (lambda v: v is None or test(v)), f"{wants} or null"


NUMBER: Check = (_number, "a finite number")
COUNT: Check = (lambda v: _int(v) and v >= 1 and v <= 2**40, "an integer from 1 to 2^40")
# what a measurement on any machine can be: a profile outside these is edited or corrupt, and its curves would
# overflow (1e300 s) or print absurd step times
SECONDS: Check = (lambda v: _number(v) and 0 < v <= 3600, "a time in seconds, above 0 and at most 3,600")
LATENCY: Check = (lambda v: _number(v) and 0 <= v <= 1, "a time in seconds from 0 to 1")
RATE: Check = (lambda v: _number(v) and 0 < v <= 1e16, "bytes per second, above 0 and at most 1e16")
SIZE: Check = (lambda v: _number(v) and 0 < v <= 2**50, "bytes, above 0 and at most 2^50")
HALF_SIZE: Check = (lambda v: _number(v) and 0 <= v <= 2**50, "bytes from 0 to 2^50")
ERROR: Check = (lambda v: _number(v) and 0 <= v <= 100, "a relative error from 0 to 100")
TEXT: Check = (lambda v: isinstance(v, str), "text")

GEMM_TIMINGS = ("graph", "eager", "cpu")
_PROFILE_FIELDS: dict[str, Check] = {
    "device": (lambda v: v in ("cuda", "cpu"), "cuda or cpu"),
    "device_name": TEXT,
    "measured_on": TEXT,
    "torch": TEXT,
    "memory_bytes": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "quick": (lambda v: isinstance(v, bool), "true or false"),
    "gpu_spec": _maybe(TEXT),
    "driver": _maybe(TEXT),
    "triton": _maybe(TEXT),
    "sm_count": _maybe(COUNT),
    "datasheet_bytes_per_s": _maybe(RATE),
    "gemm_timing": _maybe((lambda v: v in GEMM_TIMINGS, f"one of {', '.join(GEMM_TIMINGS)}")),
}
_FIT_FIELDS = {"peak_bytes_per_s": RATE, "half_bytes": HALF_SIZE, "rms_relative_error": ERROR}
KERNEL_KV_DTYPES = ("bf16", "fp16", "fp8", "int8")  # what calibrate's kernel measures (run.py _kv_dtype)
_POINT_FIELDS = {
    "kv_dtype": (lambda v: v in KERNEL_KV_DTYPES, f"one of {', '.join(KERNEL_KV_DTYPES)}"),
    "batch": COUNT,
    "context": COUNT,
    "bytes": SIZE,
    "seconds": SECONDS,
    "bytes_per_s": RATE,
}
_GEMM_FIELDS: dict[str, Check] = {
    "dtype": (lambda v: v in GEMM_DTYPES, f"one of {', '.join(GEMM_DTYPES)}"),
    "batch": COUNT,
    "k": COUNT,
    "n": COUNT,
    "seconds": SECONDS,
    "weight_bytes_per_s": RATE,
}
_ALLREDUCE_FIELDS: dict[str, Check] = {
    "backend": TEXT,
    "world_size": (lambda v: _int(v) and v >= 2, "an integer >= 2"),
    "nodes": COUNT,
    "dtype": TEXT,
    "latency_seconds": LATENCY,
    "bytes_per_s": RATE,
    "bus_bytes_per_s": RATE,
    "rms_relative_error": ERROR,
    "points": (lambda v: isinstance(v, list) and len(v) >= 2, "a list of at least two message sizes"),
}
_ALLREDUCE_POINT_FIELDS = {"bytes": COUNT, "seconds": SECONDS}
_LAUNCH_FIELDS = {"seconds": SECONDS, "graph_seconds": _maybe(SECONDS), "method": TEXT}


def _check_record(record: Any, where: str, fields: dict[str, Check], bad: Callable[[str], SpecError]) -> None:
    if not isinstance(record, dict):
        raise bad(f"{where.rstrip('.') or 'profile'}: expected a mapping, got {record!r}"[:200])
    for name, (test, wants) in fields.items():
        if name not in record and not test(None):
            raise bad(f"malformed: {where}{name}: required field is missing")
        if not test(record.get(name)):
            raise bad(f"{where}{name}: expected {wants}, got {record.get(name)!r}"[:200])


def _check_list(data: dict, name: str, fields: dict[str, Check], bad: Callable[[str], SpecError]) -> None:
    items = data.get(name)
    if items is None:
        return
    if not isinstance(items, list):
        raise bad(f"{name}: expected a list, got {items!r}"[:200])
    for i, item in enumerate(items):
        _check_record(item, f"{name}[{i}].", fields, bad)


# a rate calibrate wrote is its bytes / its seconds, rounded to the 4 significant figures the YAML keeps: one
# that disagrees by more is a hand edit in the wrong unit (milliseconds written as seconds) or a copy gone wrong
RATE_SLACK = 0.01


def _check_rates(data: dict, bad: Callable[[str], SpecError]) -> None:
    for name, rate, nbytes in (("points", "bytes_per_s", lambda p: p["bytes"]),
                               ("gemm", "weight_bytes_per_s", lambda p: p["k"] * p["n"] * GEMM_BYTES[p["dtype"]])):  # fmt: skip
        for i, p in enumerate(data.get(name) or []):
            implied = nbytes(p) / p["seconds"]
            if abs(p[rate] / implied - 1) > RATE_SLACK:
                what = "bytes" if name == "points" else "k x n x the dtype's bytes"
                raise bad(
                    f"{name}[{i}].{rate}: {p[rate]:.4g} but {what} / seconds is {implied:.4g} (a time in another "
                    "unit?)"
                )


def _check_fields(data: dict, v1: bool, bad: Callable[[str], SpecError]) -> None:
    """A corrupt profile is one line naming the field, never a crash in every estimate on that GPU.
    /1 profiles hold the decode kernel's part only, and must; in /2 every part is optional."""
    required = ("layout", "ceilings", "points", "fit") if v1 else ()
    for name in ("device", "device_name", "measured_on", "torch", "memory_bytes", "quick", *required):
        if name not in data:
            raise bad(f"malformed: {name}: required field is missing")
    _check_record(data, "", _PROFILE_FIELDS, bad)
    for name in ("layout", "ceilings"):
        if data.get(name) is not None and not isinstance(data[name], dict):
            raise bad(f"{name}: expected a mapping, got {data[name]!r}"[:200])
    for name, value in (data.get("ceilings") or {}).items():
        if not _number(value):
            raise bad(f"ceilings.{name}: expected a finite number, got {value!r}"[:200])
    if data.get("fit") is not None:
        _check_record(data["fit"], "fit.", _FIT_FIELDS, bad)
    _check_list(data, "points", _POINT_FIELDS, bad)
    if (data.get("fit") is None) != (not data.get("points")):
        raise bad("fit or points missing: the decode kernel's part needs both")
    _check_list(data, "gemm", _GEMM_FIELDS, bad)
    _check_list(data, "allreduce", _ALLREDUCE_FIELDS, bad)
    for i, entry in enumerate(data.get("allreduce") or []):
        for j, point in enumerate(entry["points"]):
            _check_record(point, f"allreduce[{i}].points[{j}].", _ALLREDUCE_POINT_FIELDS, bad)
    if data.get("launch") is not None:
        _check_record(data["launch"], "launch.", _LAUNCH_FIELDS, bad)
    notes = data.get("notes")
    if notes is not None and not (isinstance(notes, list) and all(isinstance(n, str) for n in notes)):
        raise bad("notes: expected a list of text")
    _check_rates(data, bad)  # once every field is of its type
