"""Validating spec records with pydantic: the classes are built from the records' own annotations
on first use, so that planning with shipped specs never imports pydantic's model machinery
(pydantic is imported inside these functions, on the first validation).

The records' module (models.py) calls validate_record with its record classes; this module
imports no record class itself, so the records may import it.

Errors are pydantic's ValidationError, located by field as ever (io.validation_message).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional, TypeVar, Union

from kvplan import limits
from kvplan.specs.record import _REQUIRED, Record, dump_value

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationInfo

R = TypeVar("R", bound=Record)
Records = tuple[type[Record], ...]


@cache
def _strict() -> type[BaseModel]:
    from pydantic import BaseModel, ConfigDict

    class _Strict(BaseModel):
        # .inf/.nan in a spec would reach the plan (and --json) as Infinity/NaN
        model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    return _Strict


def _bounded(cls: Any, value: Any, info: ValidationInfo) -> Any:
    limit = limits.limit_for(info.field_name or "")
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > limit:
            raise ValueError(f"{v:,} is over kvplan's limit of {limit:,} (README, Limits)")
    return value


def _annotation(record: type[Record], name: str) -> Any:
    """The field's annotation as written, from the most derived class that declares it."""
    for klass in record.__mro__:
        annotations = vars(klass).get("__annotations__", {})
        if name in annotations:
            return annotations[name]
    raise KeyError(name)


def _after(record: type[Record], layers: Records, others: Records) -> Any:
    """The record's `_check`, run on the validated values (pydantic's mode="after")."""
    from pydantic import model_validator

    def check(self: BaseModel) -> BaseModel:
        record._check(to_record(self, layers, others))  # type: ignore[attr-defined]
        return self

    return model_validator(mode="after")(check)


def _build(
    record: type[Record], namespace: dict[str, Any], layers: Records, others: Records
) -> type[BaseModel]:
    from pydantic import create_model, field_validator

    fields: dict[str, Any] = {}
    for name, default in record.record_fields.items():
        annotation = _annotation(record, name)
        if isinstance(annotation, str):
            annotation = eval(annotation, namespace)  # noqa: S307 - our own annotations, not user input
        fields[name] = (annotation, ... if default is _REQUIRED else default)
    validators: dict[str, Any] = {"_bounded": field_validator("*", mode="after")(classmethod(_bounded))}
    if hasattr(record, "_check"):
        validators["_after_check"] = _after(record, layers, others)
    return create_model(record.__name__, __base__=_strict(), __validators__=validators, **fields)


@cache
def _schemas(layers: Records, others: Records) -> dict[type[Record], type[BaseModel]]:
    """Pydantic classes of `layers` (the members of the union annotations call Layer) and `others`."""
    from pydantic import Field, PositiveInt

    namespace: dict[str, Any] = {
        "Annotated": Annotated,
        "Literal": Literal,
        "Optional": Optional,
        "Field": Field,
        "PositiveInt": PositiveInt,
    }
    out: dict[type[Record], type[BaseModel]] = {}
    for record in layers + others:  # layers first: ModelSpec's annotations name their union
        out[record] = namespace[record.__name__] = _build(record, namespace, layers, others)
        if record is layers[-1]:
            layer_models = tuple(out[r] for r in layers)
            namespace["Layer"] = Annotated[Union[layer_models], Field(discriminator="kind")]  # noqa: UP007
    return out


@cache
def _records(layers: Records, others: Records) -> dict[type[BaseModel], type[Record]]:
    return {model: record for record, model in _schemas(layers, others).items()}


def to_record(value: Any, layers: Records, others: Records) -> Any:
    """Validated pydantic objects (and the lists/dicts holding them) as spec records."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        record = _records(layers, others)[type(value)]
        return record.model_construct(
            **{f: to_record(getattr(value, f), layers, others) for f in record.record_fields}
        )
    if isinstance(value, dict):
        return {k: to_record(v, layers, others) for k, v in value.items()}
    if isinstance(value, list):
        return [to_record(v, layers, others) for v in value]
    return value


def validate_record(record: type[R], data: Any, layers: Records, others: Records) -> R:
    """`record.model_validate(data)`, `record` one of `layers` or `others` (every record class a
    spec holds): pydantic checks every field, the result is a record."""
    model = _schemas(layers, others)[record]
    return to_record(model.model_validate(dump_value(data)), layers, others)
