"""Reading spec files and validating their data: one line per problem, naming the file and field.

Shared by the registry (YAML specs) and the config.json reader (hf.py), which import it and not
each other.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from kvplan.errors import SpecError
from kvplan.limits import MAX_FILE_BYTES, MAX_YAML_NODES, check_nesting, read_regular
from kvplan.specs.record import Record

if TYPE_CHECKING:
    from pydantic import ValidationError

try:  # the C loader is ~10x faster; planning time matters (see benchmarks/)
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _Loader = yaml.SafeLoader

T = TypeVar("T", bound=Record)

# YAML 1.1's base-60 (1:00 is 60) and leading-zero octal (010 is 8) numbers are read as text, which the
# spec's integer fields then refuse; every other number reads as PyYAML reads it
_INT = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)


class _SpecLoader(_Loader):
    """kvplan's YAML: a key given twice in one mapping is an error (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                twice = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: PyYAML refuses it itself
                continue
            if twice:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


_SpecLoader.yaml_implicit_resolvers = {
    first: [
        (tag, _INT if tag.endswith(":int") else _FLOAT if tag.endswith(":float") else rx) for tag, rx in rules
    ]
    for first, rules in _Loader.yaml_implicit_resolvers.items()
}


def read_text(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """A regular file of at most `limit` bytes (limits.py), as UTF-8 text."""
    try:
        return read_regular(path, limit).decode("utf-8-sig")  # a byte-order mark (Windows editors) dropped
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a UTF-8 text file") from None


def _not_empty(text: str, path: Path | str) -> None:
    if not text.strip():
        raise SpecError(f"{path}: the file is empty")


def _check_expansion(root: yaml.Node, path: Path | str) -> None:
    """Refuse YAML whose aliases expand past MAX_YAML_NODES nodes, or refer to themselves: the
    size of each node is counted once (iteratively), so the check costs the file's size."""
    size: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            kids = _children(node)
            size[id(node)] = min(1 + sum(size[id(k)] for k in kids), MAX_YAML_NODES + 1)
            continue
        if id(node) in size:
            if size[id(node)] < 0:
                raise SpecError(f"{path}: a YAML alias refers to itself; write the values out")
            continue
        size[id(node)] = -1  # on the path from the root
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node))
    if size[id(root)] > MAX_YAML_NODES:
        raise SpecError(
            f"{path}: YAML aliases expand to over {MAX_YAML_NODES:,} values (an alias bomb?); write the values out"
        )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_yaml_text(text: str, path: Path | str) -> Any:
    """YAML text, nested at most MAX_NESTING deep; any problem is one SpecError naming the file."""
    _not_empty(text, path)
    try:
        loader = _SpecLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return check_nesting(None, path)
            if "*" in text:  # aliases: refuse a "billion laughs" before it is built
                _check_expansion(node, path)
            return check_nesting(loader.construct_document(node), path)
        finally:
            loader.dispose()
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply; is it the right file?") from None
    except ValueError as exc:  # an integer over Python's 4,300-digit conversion limit
        raise SpecError(f"{path}: unreadable YAML ({str(exc).split(';')[0]})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{path}:{where}: malformed YAML ({problem}); fix the file's syntax") from None


def read_yaml(path: Path) -> Any:
    return load_yaml_text(read_text(path), path)


def load_json_text(text: str, path: Path | str) -> Any:
    """JSON text, nested at most MAX_NESTING deep, integers of at most 4,300 digits."""
    _not_empty(text, path)
    try:
        return check_nesting(json.loads(text), path)
    except json.JSONDecodeError as exc:
        raise SpecError(
            f"{path}: line {exc.lineno}, column {exc.colno}: malformed JSON ({exc.msg})"
        ) from None
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply; is it the right file?") from None
    except ValueError as exc:  # an integer over Python's 4,300-digit conversion limit
        raise SpecError(f"{path}: unreadable JSON ({str(exc).split(';')[0]})") from None


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
        elif err["type"] in ("int_type", "int_parsing", "int_from_float"):  # strict: no "32", true, 32.0
            msg = f"expected an integer, got {err.get('input')!r:.40}"
        elif err["type"] == "value_error":  # a record's own check: its message names the field
            msg = msg.removeprefix("Value error, ")
            if not err["loc"]:
                lines.append(f"{path}: {msg}")
                continue
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
