"""`kvplan calibrate`: measure the bandwidth kvplan's own paged decode kernel reaches on this
machine, fit it, and save a versioned profile that `kvplan estimate` uses for decode speed.

Only this module (and kernels/) import torch and triton, and only when calibrating; profiles
are read without them. Profiles are YAML, written atomically.
"""

from __future__ import annotations

import datetime
import math
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvplan.errors import KvplanError, SpecError, UsageError
from kvplan.specs.io import load_yaml_text, read_text
from kvplan.userdata import profile_path, write_atomic

SCHEMA = "kvplan.calibration/1"
STANDARD_LAYOUT = {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "v_dim": 128}  # Llama-3-8B/70B-like GQA
PAGE = 16
CALIBRATE_DTYPES = ("bf16", "fp16", "fp8", "int8")

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


@dataclass
class Point:
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
    layout: dict[str, Any]
    ceilings: dict[str, float]
    points: list[Point]
    fit: Fit
    datasheet_bytes_per_s: float | None = None
    schema: str = SCHEMA
    notes: list[str] = field(default_factory=list)

    def to_yaml(self) -> str:
        data = asdict(self)
        data = {"schema": data.pop("schema"), **data}
        return yaml.safe_dump(data, sort_keys=False)

    def describe(self, path: Path) -> str:
        what = "CPU profile" if self.device == "cpu" else self.device_name
        return f"bandwidth measured by kvplan calibrate on {what} ({self.measured_on[:10]}; {path})"


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


# --- running (torch/triton imported here only) ------------------------------------------------


def _require_torch(device: str):
    try:
        import torch
    except ImportError:
        raise UsageError("kvplan calibrate needs torch and triton: pip install 'kvplan[calibrate]'") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            "no CUDA GPU here (torch.cuda.is_available() is False); run on the GPU machine, "
            "or pass --device cpu to measure this CPU with the torch implementation"
        )
    return torch


def _driver() -> str | None:
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            .stdout.strip()
            .splitlines()
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


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
    """A device-to-device copy (bytes read + written) and a read-only streaming reduction."""
    torch = _require_torch(device)
    n = nbytes // 4
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    copy_s = _median_seconds(lambda: dst.copy_(src), device, runs)
    read_s = _median_seconds(lambda: src.sum(), device, runs)
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
        raise UsageError(f"--kv-dtype {name!r}: use bf16, fp16, fp8 or int8")
    return table[name]


def measure_point(device: str, layout: dict, kv_dtype: str, batch: int, context: int, runs: int) -> Point:
    torch = _require_torch(device)
    dt = _kv_dtype(torch, kv_dtype)
    hq, hkv, d, dv = layout["q_heads"], layout["kv_heads"], layout["head_dim"], layout["v_dim"]
    mla = layout.get("mla", False)
    pages = -(-context // PAGE)
    blocks = batch * pages
    k = torch.randn(blocks, PAGE, hkv, d, device=device).to(dt)
    v = k if mla else torch.randn(blocks, PAGE, hkv, dv, device=device).to(dt)
    table = torch.randperm(blocks, device=device, dtype=torch.int64).to(torch.int32).reshape(batch, pages)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, hq, d, device=device, dtype=torch.bfloat16)
    v_dim = dv if mla else None
    if device == "cuda":
        from kvplan.kernels.paged_decode import paged_decode

        def fn():
            return paged_decode(q, k, v, table, lens, v_dim=v_dim, max_seq_len=context)
    else:
        from kvplan.kernels.reference import paged_decode_reference

        def fn():
            return paged_decode_reference(q, k, v, table, lens, v_dim=v_dim)

    seconds = _median_seconds(fn, device, runs)
    kv_bytes = blocks * PAGE * hkv * (d + (0 if mla else dv)) * k.element_size()
    nbytes = kv_bytes + q.numel() * q.element_size() + batch * hq * dv * 2
    return Point(kv_dtype, batch, context, nbytes, seconds, nbytes / seconds)


def kv_bytes(layout: dict, batch: int, context: int, elem: int) -> int:
    pages = -(-context // PAGE)
    extra = 0 if layout.get("mla") else layout["v_dim"]
    return batch * pages * PAGE * layout["kv_heads"] * (layout["head_dim"] + extra) * elem


def run(
    device: str,
    quick: bool,
    layout: dict,
    kv_dtypes: list[str],
    gpu_specs: list,
    progress: Callable[[str], None],
) -> Profile:
    torch = _require_torch(device)
    import platform

    triton_version = None
    try:
        import triton

        triton_version = str(triton.__version__)
    except ImportError:
        if device == "cuda":
            raise UsageError(
                "kvplan calibrate needs triton on a GPU: pip install 'kvplan[calibrate]'"
            ) from None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        name, memory, sms = props.name, int(props.total_memory), props.multi_processor_count
        free = torch.cuda.mem_get_info()[0]
        budget = int(free * 0.4)
        ceiling_bytes = 1 << 30
    else:
        name, memory, sms = f"CPU {platform.processor() or platform.machine()}", 0, None
        budget = 256 << 20
        ceiling_bytes = 64 << 20
    runs = 20 if quick else 50
    progress(f"{name}: ceilings over {ceiling_bytes / 2**20:,.0f} MiB")
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
    fit = fit_curve([(p.bytes, p.bytes_per_s) for p in points])
    spec = match_gpu(name, memory, gpu_specs) if device == "cuda" else None
    notes = [
        "bytes counted: Q + K/V read in whole pages + output; decimal GB/s",
        f"{skipped} of {len(grid)} points skipped: their caches exceed {budget / 2**30:.1f} GiB",
    ]
    if device == "cpu":
        notes.append("CPU profile: the torch reference on this CPU, not a GPU kernel; for tests and dry runs")
    return Profile(
        device=device,
        device_name=name,
        gpu_spec=spec.name if spec else None,
        memory_bytes=memory,
        sm_count=sms,
        driver=_driver() if device == "cuda" else None,
        torch=str(torch.__version__),
        triton=triton_version,
        measured_on=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        quick=quick,
        layout=layout,
        ceilings=ceilings,
        points=points,
        fit=fit,
        datasheet_bytes_per_s=spec.hbm_bytes_per_s if spec else None,
        notes=notes,
    )


def kv_dtypes_for(device: str, requested: str | None) -> list[str]:
    """The KV dtypes to sweep: those asked for (a comma list), else bf16, and fp8 where the GPU
    has it: Triton's fp8e4nv needs sm89 or newer (kernels.md)."""
    if requested:
        return [d.strip() for d in requested.split(",") if d.strip()]
    torch = _require_torch(device)
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
) -> tuple[Profile, Path]:
    """`kvplan calibrate`: sweep this device with the model's head layout (or the standard one),
    save the profile (default: kvplan's data dir, by GPU spec name) and say where."""
    from kvplan.specs.registry import all_gpus, load_model

    if device not in ("cuda", "cpu"):
        raise UsageError(f"--device must be cuda or cpu, got {device!r}")
    # every argument is checked before minutes of measuring
    if output:
        check_output(Path(output), force)
    if kv_dtype:
        _check_kv_dtypes(kv_dtype)
    layout = model_layout(load_model(model)) if model else dict(STANDARD_LAYOUT)
    _require_torch(device)  # before the dtypes: a missing torch is the error to report
    dtypes = kv_dtypes_for(device, kv_dtype)
    prof = run(device, quick, layout, dtypes, all_gpus(), progress)
    path = Path(output) if output else default_path(prof.gpu_spec or prof.device_name)
    check_output(path, force or not output)  # kvplan's own data dir: its profiles only
    save(prof, path)
    return prof, path


def _check_kv_dtypes(requested: str) -> None:
    names = [d.strip() for d in requested.split(",") if d.strip()]
    bad = [d for d in names if d not in CALIBRATE_DTYPES]
    if not names or bad:
        raise UsageError(
            f"--kv-dtype: {', '.join(bad) or repr(requested)}: choose from {', '.join(CALIBRATE_DTYPES)}"
        )


def check_output(path: Path, force: bool) -> None:
    """--output: a .yaml name; an existing file is replaced only if it is a kvplan profile, or
    with --force."""
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise UsageError(f"--output {path}: profiles are YAML; name it .yaml")
    if path.is_symlink() or path.exists() and not path.is_file():
        raise UsageError(f"--output {path}: not a regular file; choose another path")
    if force or not path.exists():
        return
    try:
        load(path)
    except KvplanError:
        raise UsageError(
            f"--output {path}: exists and is not a kvplan calibration profile; "
            "choose another path or pass --force to replace it"
        ) from None


def match_gpu(device_name: str, memory_bytes: int, gpus: list):
    """The shipped spec a CUDA device name matches ('NVIDIA H200' -> H200), by name then memory."""
    low = device_name.lower()
    named = [g for g in gpus if any(n.lower() == low for n in g.all_names)]
    if named:
        return named[0]
    tokens = set(re.findall(r"[a-z]*\d+[a-z]*", low))
    cands = [g for g in gpus if g.name.split("-")[0].lower() in tokens]
    if len(cands) > 1:
        cands.sort(key=lambda g: abs(g.memory_bytes - memory_bytes))
    return cands[0] if cands else None


# --- profiles on disk --------------------------------------------------------------------------


def default_path(name: str) -> Path:
    return profile_path(name)


def save(profile: Profile, path: Path) -> None:
    write_atomic(path, profile.to_yaml())


def load(path: Path) -> Profile:
    def bad(what: str) -> SpecError:
        return SpecError(f"{path}: {what}; re-run `kvplan calibrate` or pass another --calibration")

    if not path.exists() and not path.is_symlink():
        raise SpecError(f"{path}: no such calibration profile; run `kvplan calibrate` first")
    try:
        data = load_yaml_text(read_text(path), path)
    except SpecError as exc:
        raise bad(
            str(exc).removeprefix(f"{path}:").strip().replace("malformed YAML", "not valid YAML")
        ) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise bad(f"not a kvplan calibration profile (schema {found!r}, expected {SCHEMA!r})")
    _check_fields(data, bad)
    try:
        fit = Fit(**data["fit"])
        points = [Point(**p) for p in data["points"]]
        prof = Profile(**{**data, "fit": fit, "points": points})
    except (KeyError, TypeError) as exc:
        raise bad(f"malformed ({exc})") from None
    if prof.device not in ("cuda", "cpu"):
        raise bad(f"device {prof.device!r} is neither cuda nor cpu")
    if not (fit.peak_bytes_per_s > 0 and fit.half_bytes >= 0) or not points:
        raise bad("fit or points missing or not positive")
    return prof


_TEXT = (str,)
_NUMBER = (int, float)
_PROFILE_FIELDS: dict[str, tuple[type, ...]] = {
    "device": _TEXT,
    "device_name": _TEXT,
    "measured_on": _TEXT,
    "torch": _TEXT,
    "memory_bytes": (int,),
    "quick": (bool,),
    "layout": (dict,),
    "ceilings": (dict,),
    "points": (list,),
    "fit": (dict,),
}
_FIT_FIELDS = ("peak_bytes_per_s", "half_bytes", "rms_relative_error")
_POINT_FIELDS = ("batch", "context", "bytes", "seconds", "bytes_per_s")


def _finite(value: Any) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool) and math.isfinite(value)


def _check_fields(data: dict, bad: Callable[[str], SpecError]) -> None:
    """Every field a plan reads, of the right type and finite: a corrupt profile is one line
    naming the field, never a crash in every estimate on that GPU."""
    for name, types in _PROFILE_FIELDS.items():
        if name not in data:
            raise bad(f"malformed: {name}: required field is missing")
        if not isinstance(data[name], types):
            raise bad(f"{name}: expected {types[0].__name__}, got {data[name]!r}"[:200])
    for name in ("gpu_spec", "driver", "triton"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise bad(f"{name}: expected text, got {data[name]!r}"[:200])
    fit = data["fit"]
    for name in _FIT_FIELDS:
        if not _finite(fit.get(name)):
            raise bad(f"fit.{name}: expected a finite number, got {fit.get(name)!r}"[:200])
    if data.get("datasheet_bytes_per_s") is not None and not _finite(data["datasheet_bytes_per_s"]):
        raise bad(f"datasheet_bytes_per_s: expected a finite number, got {data['datasheet_bytes_per_s']!r}")
    for i, point in enumerate(data["points"]):
        if not isinstance(point, dict):
            raise bad(f"points[{i}]: expected a mapping")
        for name in _POINT_FIELDS:
            if not _finite(point.get(name)):
                raise bad(f"points[{i}].{name}: expected a finite number, got {point.get(name)!r}"[:200])
    for name, value in data["ceilings"].items():
        if not _finite(value):
            raise bad(f"ceilings.{name}: expected a finite number, got {value!r}"[:200])


def find_for(gpu_name: str) -> tuple[Profile, Path] | None:
    """A saved GPU profile for this shipped GPU (CPU profiles are only used when named)."""
    path = default_path(gpu_name)
    if not path.exists():
        return None
    prof = load(path)
    if prof.device != "cuda" or prof.gpu_spec != gpu_name:
        return None
    return prof, path


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
