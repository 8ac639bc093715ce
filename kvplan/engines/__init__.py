"""The serving engines kvplan reproduces, behind one interface (base.Engine).

A third engine is one more module with an `Engine` subclass and one more entry in ENGINES.
Owns each engine's memory rules (vllm_memory.py, sglang_memory.py) and kvplan's estimate of
the non-KV reserve (budget.py). May import: the base modules, kvplan.specs, kvplan.model,
kvplan.calibrate (the profile) and kvplan.request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.engines.base import (
    ENGINE_KV_DTYPES,
    Budget,
    Engine,
    EngineDefaults,
    EngineReport,
    EngineUnsupported,
    GroupSummary,
    SglangDetails,
    StageCache,
    Version,
    VllmDetails,
    fmt_version,
)
from kvplan.engines.sglang import Sglang
from kvplan.engines.vllm import Vllm
from kvplan.errors import UsageError
from kvplan.specs.models import ChunkedAttention, FullAttention, ModelSpec, RecurrentState, SlidingWindow

if TYPE_CHECKING:
    from kvplan.request import PlanRequest

ENGINES: dict[str, type[Engine]] = {cls.name: cls for cls in (Vllm, Sglang)}

__all__ = [
    "ENGINES",
    "ENGINE_KV_DTYPES",
    "Budget",
    "Engine",
    "EngineDefaults",
    "EngineReport",
    "EngineUnsupported",
    "GroupSummary",
    "SglangDetails",
    "StageCache",
    "Version",
    "VllmDetails",
    "engine_class",
    "fmt_version",
    "for_request",
    "parse_version",
    "windows_as_full",
    "with_engine_states",
]


def engine_class(name: str) -> type[Engine]:
    if name not in ENGINES:
        raise UsageError(f"--engine must be one of {', '.join(ENGINES)}, got {name!r}")
    return ENGINES[name]


def parse_version(text: str | None, engine: str) -> Version:
    """'0.11', '0.11.2', 'v0.10.1.1' -> (0, 11); None or 'latest' -> the newest kvplan knows."""
    return engine_class(engine).parse_version(text)


def for_request(req: PlanRequest) -> Engine:
    """The request's engine, bound to it; refuses flags that belong to another engine."""
    cls = engine_class(req.engine)
    for other in ENGINES.values():
        if other is cls:
            continue
        for flag, attr in other.own_flags.items():
            value = getattr(req, attr)
            if value not in (None, False, other.own_flag_defaults.get(attr)):
                raise UsageError(f"{flag} is a {other.name} flag; add --engine {other.name} or drop it")
    for name, _ in req.env:
        if name in cls.own_env:
            continue
        owner = next((e for e in ENGINES.values() if name in e.own_env), None)
        if owner is not None:
            raise UsageError(f"--env {name} is a {owner.name} setting; add --engine {owner.name} or drop it")
        known = ", ".join(n for e in ENGINES.values() for n in e.own_env)
        raise UsageError(f"--env {name}: kvplan models no such variable; it knows {known}")
    engine = cls(req, cls.parse_version(req.engine_version))
    engine.check_flags()
    return engine


def windows_as_full(spec: ModelSpec) -> ModelSpec:
    """The same model with its sliding-window and chunked layers keeping every token, as an
    engine that does not drop out-of-window KV stores them."""
    types = {}
    for name, layer in spec.layer_types.items():
        if isinstance(layer, (SlidingWindow, ChunkedAttention)):
            layer = FullAttention(
                num_kv_heads=layer.num_kv_heads, head_dim=layer.head_dim, head_dim_v=layer.head_dim_v
            )
        types[name] = layer
    return ModelSpec.model_validate(
        {**spec.model_dump(), "layer_types": {k: v.model_dump() for k, v in types.items()}}
    )


def with_engine_states(spec: ModelSpec, engine: Engine, notes: list[str]) -> ModelSpec:
    """The model with every recurrent state as this engine holds it: "auto" dtypes resolved, and the
    convolution rows it adds (vLLM under speculative decoding)."""
    types = dict(spec.layer_types)
    changed = False
    for name, layer in spec.layer_types.items():
        if not isinstance(layer, RecurrentState) or layer.mixer == "fixed":
            continue
        conv, ssm, why = engine.state_dtypes(spec, layer)
        if why and why not in notes:
            notes.append(f"{why}; pass --mamba-ssm-cache-dtype to change it")
        update: dict[str, object] = {}
        if (conv, ssm) != (layer.conv_dtype, layer.ssm_dtype):
            update.update(conv_dtype=conv, ssm_dtype=ssm)
        rows = engine.state_conv_rows(layer)
        if rows and layer.conv_kernel:
            update["conv_kernel"] = layer.conv_kernel + rows
            line = (
                f"{engine.label} widens each Gated DeltaNet layer's convolution state by the {rows} "
                "speculative tokens (mamba_utils.py gated_delta_net_state_shape: conv_kernel - 1 + num_spec rows)"
            )
            if line not in notes:
                notes.append(line)
        if update:
            types[name] = layer.model_copy(update=update)
            changed = True
    return spec.model_copy(update={"layer_types": types}) if changed else spec
