"""Measured non-KV overheads, learnt from engine startup logs by `kvplan check-log`.

A calibration entry says: for this model on this GPU with this engine, layout and batch
budget, the engine kept `reserve_bytes` per GPU for things other than weights and KV
(vLLM: activations, workspaces, CUDA graphs; SGLang: memory in use at startup).
`kvplan estimate` then uses it in place of its own estimate, and says so.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kvplan.errors import SpecError, UsageError
from kvplan.limits import MAX_BYTES
from kvplan.specs.io import load_yaml_text, read_text
from kvplan.units import GiB, printable
from kvplan.userdata import locked, overheads_path, present, write_atomic

if TYPE_CHECKING:
    from kvplan.logs.checklog import CheckResult

SCHEMA = "kvplan.overheads/1"
KEY_FIELDS = (
    "model",
    "gpu",
    "engine",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_num_batched_tokens",
)
REQUIRED = (*KEY_FIELDS, "reserve_bytes", "engine_version", "measured_on", "source")


def default_path() -> Path:
    return overheads_path()


@dataclass(frozen=True)
class Overhead:
    model: str
    gpu: str
    engine: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_num_batched_tokens: int
    reserve_bytes: int
    engine_version: str
    measured_on: str  # ISO date
    source: str  # the log it came from

    @property
    def key(self) -> tuple:
        return tuple(getattr(self, f) for f in KEY_FIELDS)

    def describe(self, path: Path) -> str:
        return (
            f"measured from a {printable(self.engine)} {printable(self.engine_version)} log "
            f"({printable(self.source)}) on {printable(self.measured_on)}; calibration {printable(str(path))}"
        )


def _bad(path: Path, what: str) -> SpecError:
    return SpecError(
        f"{path}: {what}; fix or delete it (or pass --no-calibration), then re-run `kvplan check-log LOG --save-calibration`"
    )


def load(path: Path) -> list[Overhead]:
    """All entries of a calibration file; a missing file has none, a corrupt one is an error."""
    if not present(path):  # a dangling link or a loop is read (and refused)
        return []
    try:
        data = load_yaml_text(read_text(path), path)
    except SpecError as exc:
        raise _bad(
            path, str(exc).removeprefix(f"{path}:").strip().replace("malformed YAML", "not valid YAML")
        ) from None
    if data is None:
        raise _bad(path, "holds nothing but comments, not a kvplan overhead calibration")
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise _bad(path, f"not a kvplan overhead calibration (schema {found!r}, expected {SCHEMA!r})")
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise _bad(path, "entries: expected a list")
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise _bad(path, f"entries[{i}]: expected a mapping")
        missing = [f for f in REQUIRED if f not in e]
        if missing:
            raise _bad(path, f"entries[{i}]: missing {', '.join(missing)}")
        ints = ("tensor_parallel_size", "pipeline_parallel_size", "max_num_batched_tokens", "reserve_bytes")
        for f in ints:
            if not isinstance(e[f], int) or isinstance(e[f], bool) or not 0 <= e[f] <= MAX_BYTES:
                raise _bad(path, f"entries[{i}].{f}: expected a non-negative integer, got {e[f]!r}")
        for f in REQUIRED:
            if f not in ints and not isinstance(e[f], (str, int, float)):
                raise _bad(path, f"entries[{i}].{f}: expected text, got {e[f]!r}")
        fields: dict[str, Any] = {f: e[f] if f in ints else str(e[f]) for f in REQUIRED}
        out.append(Overhead(**fields))
    return out


def find(
    path: Path, model: str, gpu: str, engine: str, tp: int, pp: int, max_num_batched_tokens: int
) -> Overhead | None:
    key = (model, gpu, engine, tp, pp, max_num_batched_tokens)
    for entry in load(path):
        if entry.key == key:
            return entry
    return None


def save(path: Path, entry: Overhead) -> Overhead | None:
    """Add or replace the entry with the same key; the file is rewritten atomically. The entry replaced, if any."""
    with locked(path.parent):  # two runs saving at once: each reads the other's entry
        old = load(path)
        replaced = next((e for e in old if e.key == entry.key), None)
        entries = [e for e in old if e.key != entry.key]
        entries.append(entry)
        data: dict[str, Any] = {
            "schema": SCHEMA,
            "entries": [{f: getattr(e, f) for f in REQUIRED} for e in entries],
        }
        write_atomic(path, yaml.safe_dump(data, sort_keys=False))
    return replaced


def save_measured(result: CheckResult, model: str, gpu: str, source: str) -> Path:
    """Keep what a checked log measured (`check-log --save-calibration`) in the default file;
    the entry replaces one with the same model, GPU, engine, layout and batch budget."""
    if result.measured_reserve_bytes is None:
        raise UsageError(f"{source}: nothing to save: {result.unmeasured_reason}")
    if result.measured_reserve_bytes < 0:
        raise UsageError(
            f"{source}: the log's KV memory exceeds kvplan's budget before any reserve; "
            "fix --gpus/--gpu-memory-utilization/--weight-dtype first"
        )
    path = default_path()
    setup = result.setup
    entry = Overhead(
        model=model,
        gpu=gpu,
        engine=result.engine,
        tensor_parallel_size=setup.tensor_parallel_size,
        pipeline_parallel_size=setup.pipeline_parallel_size,
        max_num_batched_tokens=setup.max_num_batched_tokens,
        reserve_bytes=result.measured_reserve_bytes,
        engine_version=result.version,
        measured_on=datetime.date.today().isoformat(),
        source=printable(source),
    )
    replaced = save(path, entry)
    if replaced is not None and replaced.reserve_bytes != entry.reserve_bytes:
        result.notes.append(
            f"--save-calibration replaces {replaced.reserve_bytes / GiB:,.2f} GiB measured from {replaced.source} on "
            f"{replaced.measured_on} for this model, GPU, engine and layout"
        )
    return path
