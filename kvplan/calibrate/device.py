"""This machine, for a calibration: torch (imported only here and by the measuring modules, only
when calibrating), the device's name, memory and versions, the shipped GPU spec it matches, a
profile of it with nothing measured yet, and the check on where a profile may be written."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

from kvplan.calibrate.calibration import Profile, load
from kvplan.errors import KvplanError, UsageError


def require_torch(device: str):
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


def _identify(torch, device: str) -> tuple[str, int, int | None]:
    """(name, memory bytes, SM count) of GPU 0, or of this CPU."""
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return props.name, int(props.total_memory), props.multi_processor_count
    import platform

    return f"CPU {platform.processor() or platform.machine()}", 0, None


def triton_version(required: bool) -> str | None:
    try:
        import triton
    except ImportError:
        if required:
            raise UsageError(
                "kvplan calibrate needs triton on a GPU: pip install 'kvplan[calibrate]'"
            ) from None
        return None
    return str(triton.__version__)


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


def blank_profile(device: str, quick: bool, gpu_specs: list | None = None) -> Profile:
    """A profile of this device with nothing measured yet: its name, memory, versions, date."""
    torch = require_torch(device)
    if gpu_specs is None:
        from kvplan.specs.registry import all_gpus

        gpu_specs = all_gpus()
    name, memory, sms = _identify(torch, device)
    spec = match_gpu(name, memory, gpu_specs) if device == "cuda" else None
    notes = []
    if device == "cpu":
        notes.append(
            "CPU profile: measured on this CPU (the decode kernel with the torch reference); for tests "
            "and dry runs, never a GPU's figures"
        )
    return Profile(
        device=device,
        device_name=name,
        gpu_spec=spec.name if spec else None,
        memory_bytes=memory,
        sm_count=sms,
        driver=_driver() if device == "cuda" else None,
        torch=str(torch.__version__),
        triton=triton_version(required=False),
        measured_on=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        quick=quick,
        datasheet_bytes_per_s=spec.hbm_bytes_per_s if spec else None,
        notes=notes,
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
