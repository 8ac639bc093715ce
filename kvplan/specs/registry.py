"""Finding and loading specs: shipped YAML by name/alias/HF id, or a user's file."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, cast

from kvplan.errors import SpecError, UsageError
from kvplan.limits import MAX_NAME_CHARS
from kvplan.specs.io import load_json_text, read_text, read_yaml, validate
from kvplan.specs.models import (
    LAYER_CLASSES,
    GpuSpec,
    Interconnect,
    ModelSpec,
    MoE,
    VisionTower,
)
from kvplan.specs.record import Record

_LAYER_CLASSES = {cls.record_fields["kind"]: cls for cls in LAYER_CLASSES}

T = TypeVar("T", bound=Record)


def _spec_dir(kind: str) -> Path:
    """model_specs/<kind>, as installed (kvplan.model_specs) or in a source checkout."""
    import kvplan.model_specs as pkg

    return Path(pkg.__file__).resolve().parent / kind


@cache
def _raw_specs(kind: str) -> tuple[tuple[Path, dict], ...]:
    out = []
    for path in sorted(_spec_dir(kind).glob("*.yaml")):
        data = read_yaml(path)
        out.append((path, data if isinstance(data, dict) else {}))
    return tuple(out)


def _names(data: dict) -> Iterator[str]:
    for key in ("name", "hf_id"):
        if isinstance(data.get(key), str):
            yield data[key]
    for alias in data.get("aliases") or []:
        yield str(alias)


def _shipped(cls: type[T], data: dict) -> T:
    """A shipped spec built without re-validation: the test suite validates every shipped file
    (tests/test_packaging.py) and checks that this path builds the identical object. Skipping
    pydantic (importing it and building its classes) saves ~45 ms on every command."""
    if cls is ModelSpec:
        layers = {
            name: _LAYER_CLASSES[layer["kind"]].model_construct(**layer)
            for name, layer in data["layer_types"].items()
        }
        moe = MoE.model_construct(**data["moe"]) if data.get("moe") else None
        tower = VisionTower.model_construct(**data["vision_tower"]) if data.get("vision_tower") else None
        return cast(
            T, ModelSpec.model_construct(**{**data, "layer_types": layers, "moe": moe, "vision_tower": tower})
        )
    ic = data.get("interconnect")
    return cast(
        T,
        GpuSpec.model_construct(
            **{**data, "interconnect": Interconnect.model_construct(**ic) if ic else None}
        ),
    )


def _find_shipped(kind: str, ref: str, cls: type[T], what: str, flag: str) -> T:
    key = ref.strip().lower()
    exact = _spec_dir(kind) / f"{key}.yaml"
    if exact.is_file():  # fast path: the canonical name is the file name
        return _shipped(cls, read_yaml(exact))
    for _path, data in _raw_specs(kind):
        if any(n.lower() == key for n in _names(data)):
            return _shipped(cls, data)
    canonical = {n.lower(): str(data.get("name")) for _, data in _raw_specs(kind) for n in _names(data)}
    close: list[str] = []
    for match in difflib.get_close_matches(key, list(canonical), n=12, cutoff=0.5):
        if canonical[match] not in close:
            close.append(canonical[match])
    close = close[:4]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UsageError(f"{flag}: unknown {what} {ref!r}{hint} (`kvplan {kind}` lists them)")


def find_shipped_model(ref: str) -> ModelSpec | None:
    """The shipped model a name/alias/HF id names, or None (no file read beyond the shipped specs)."""
    if not ref.strip() or len(ref) > MAX_NAME_CHARS:
        return None
    try:
        return _find_shipped("models", ref, ModelSpec, "model", "--model")
    except UsageError:
        return None


def _checked_ref(ref: str, flag: str) -> str:
    if not ref.strip() or len(ref) > MAX_NAME_CHARS:
        raise UsageError(f"{flag}: give a name or a file path of 1 to {MAX_NAME_CHARS} characters")
    return ref


def load_model(ref: str, flag: str = "--model") -> ModelSpec:
    """A shipped model by name/alias/HF id, a YAML spec file, a Hugging Face config.json or a folder
    holding one, else a Hugging Face Hub id (org/name[@revision]) fetched into the Hub's cache."""
    path = Path(_checked_ref(ref, flag)).expanduser()
    if path.suffix.lower() in (".yaml", ".yml"):
        return validate(ModelSpec, read_yaml(path), path)
    if path.suffix.lower() == ".json" or (path.is_dir() and (path / "config.json").is_file()):
        cfg_path = path / "config.json" if path.is_dir() else path
        return _from_config(cfg_path)
    try:
        return _find_shipped("models", ref, ModelSpec, "model", flag)
    except UsageError as unknown:
        from kvplan.specs import hub

        if path.is_dir():
            raise SpecError(f"{path}: a folder without a config.json in it") from None
        if path.is_symlink() and not path.exists():
            read_text(path)  # refused with the reason: a dangling link or a link loop
        if path.exists() and not path.is_file():  # /dev/null, a FIFO, a socket
            raise SpecError(f"{path}: not a regular file; give a .yaml spec or a config.json") from None
        if path.is_file():
            raise SpecError(
                f"{path}: {flag} takes a .yaml spec, a config.json (or a folder holding one) or a model name"
            ) from None
        if path.exists() or not hub.looks_like_hub_id(ref):
            raise
        return _from_config(hub.fetch_folder(ref, str(unknown)) / hub.CONFIG, name=ref.strip())


def _from_config(cfg_path: Path, name: str | None = None) -> ModelSpec:
    """A config.json (its sidecars read from the same folder); `name` replaces the folder's name,
    which for a Hub cache snapshot is a commit hash."""
    from kvplan.specs.hf import model_from_config

    cfg = _read_json(cfg_path)
    if name is not None and isinstance(cfg, dict):
        cfg = {**cfg, "_name_or_path": name}
    return model_from_config(cfg, cfg_path)


def load_gpu(ref: str) -> GpuSpec:
    path = Path(_checked_ref(ref, "--gpus")).expanduser()
    if path.suffix.lower() in (".yaml", ".yml"):
        return validate(GpuSpec, read_yaml(path), path)
    return _find_shipped("gpus", ref, GpuSpec, "GPU", "--gpus")


def all_models() -> list[ModelSpec]:
    return [validate(ModelSpec, data, path) for path, data in _raw_specs("models")]


def all_gpus() -> list[GpuSpec]:
    return [validate(GpuSpec, data, path) for path, data in _raw_specs("gpus")]


def _read_json(path: Path) -> Any:
    return load_json_text(read_text(path), path)
