"""Spec records: immutable objects with the slice of pydantic's model API kvplan uses, without
importing pydantic. Shipped specs (checked by the test suite) are built with `model_construct`;
anything else goes through `model_validate`, which models.py defines with the pydantic schema
built on first use (kvplan/specs/schema.py). Importing pydantic and building its classes cost ~45 ms a command.
"""

from __future__ import annotations

import copy
import json
from typing import Any, ClassVar, TypeVar

S = TypeVar("S", bound="Record")

_REQUIRED = object()


class Record:
    """Fields are the class's annotations, in declaration order, parents first (as pydantic)."""

    record_fields: ClassVar[dict[str, Any]] = {}  # field name -> default (or _REQUIRED)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            for name, annotation in vars(klass).get("__annotations__", {}).items():
                if "ClassVar" in str(annotation):
                    continue
                fields[name] = vars(klass).get(name, fields.get(name, _REQUIRED))
        cls.record_fields = fields

    def __init__(self, **data: Any) -> None:
        """Validates, as a pydantic model would (raises pydantic's ValidationError)."""
        self.__dict__.update(type(self).model_validate(data).__dict__)

    @classmethod
    def model_validate(cls: type[S], data: Any) -> S:
        """Validated; each family of records says how (models.py: kvplan/specs/schema.py)."""
        raise NotImplementedError(f"{cls.__name__} records are built with model_construct only")

    @classmethod
    def model_construct(cls: type[S], **data: Any) -> S:
        """Trusted data, no checks; missing fields take their defaults, unknown ones are dropped."""
        obj = cls.__new__(cls)
        values = obj.__dict__
        for name, default in cls.record_fields.items():
            if name in data:
                values[name] = data[name]
            elif default is not _REQUIRED:
                values[name] = copy.copy(default) if isinstance(default, list | dict) else default
        return obj

    def model_copy(self: S, update: dict[str, Any] | None = None) -> S:
        """A copy with `update` applied, unvalidated (as pydantic); cached properties are recomputed."""
        fields = {name: self.__dict__[name] for name in self.record_fields if name in self.__dict__}
        return type(self).model_construct(**{**fields, **(update or {})})

    def model_dump(self) -> dict[str, Any]:
        return {name: dump_value(self.__dict__.get(name)) for name in self.record_fields}

    def model_dump_json(self) -> str:
        return json.dumps(self.model_dump(), separators=(",", ":"))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: {name} cannot be set")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: {name} cannot be deleted")

    def _values(self) -> tuple[Any, ...]:
        return tuple(self.__dict__.get(name) for name in self.record_fields)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Record)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self), self._values()))

    def __repr__(self) -> str:
        body = ", ".join(f"{name}={self.__dict__.get(name)!r}" for name in self.record_fields)
        return f"{type(self).__name__}({body})"


def dump_value(value: Any) -> Any:
    if isinstance(value, Record):
        return value.model_dump()
    if isinstance(value, dict):
        return {k: dump_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [dump_value(v) for v in value]
    return value
