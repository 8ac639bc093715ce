"""Reading spec files and validating their data: one line per problem, naming the file and field.

Shared by the registry (YAML specs) and the config.json reader (hf.py), which import it and not
each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from kvplan.errors import SpecError
from kvplan.specs.record import Record

if TYPE_CHECKING:
    from pydantic import ValidationError

try:  # the C loader is ~10x faster; planning time matters (see benchmarks/)
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _Loader = yaml.SafeLoader

T = TypeVar("T", bound=Record)


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a UTF-8 text file") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror})") from None


def read_yaml(path: Path) -> Any:
    text = read_text(path)
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{path}:{where}: malformed YAML ({problem}); fix the file's syntax") from None


def validation_message(path: Path | str, exc: ValidationError) -> str:
    """One line per problem, each naming the file and the field."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field (typo?)"
        lines.append(f"{path}: {loc}: {msg}")
    return "\n".join(lines)


def validate(cls: type[T], data: Any, path: Path | str) -> T:
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}")
    from pydantic_core import ValidationError  # already loaded by typer; pydantic itself is not

    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise SpecError(validation_message(path, exc)) from None
