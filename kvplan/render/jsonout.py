"""What each command prints under --json (compare's tables: render_rows). Never imports rich."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvplan.calibrate.run import Profile
    from kvplan.commands.comparisons import PlotResult
    from kvplan.logs.checklog import CheckResult
    from kvplan.search.solve import Answer, Query
    from kvplan.specs.models import GpuSpec, ModelSpec


def to_json(data: Any) -> str:
    """The --json text of every command: two-space indent, keys in the order kvplan built them.
    Strict JSON: a NaN or Infinity is refused here (the edge refuses the inputs that make them)."""
    try:
        return json.dumps(data, indent=2, sort_keys=False, allow_nan=False)
    except ValueError:
        from kvplan.errors import UsageError

        raise UsageError("a result is not a finite number; check the inputs for nan/inf values") from None


def models_json(specs: list[ModelSpec]) -> list[dict[str, Any]]:
    from kvplan.formats import KV_DTYPES
    from kvplan.model.kv import model_bits_per_token

    bf16 = KV_DTYPES["bf16"]
    return [
        {
            "name": m.name,
            "hf_id": m.hf_id,
            "aliases": m.aliases,
            "num_layers": m.num_layers,
            "attention": m.attention_summary,
            "kv_bytes_per_token_bf16": model_bits_per_token(m.layers, bf16) // 8,
            "kv_bytes_per_token_growing_bf16": model_bits_per_token(m.layers, bf16, growing_only=True) // 8,
            "max_context": m.max_context,
            "sources": m.sources,
        }
        for m in specs
    ]


def gpus_json(specs: list[GpuSpec]) -> list[dict[str, Any]]:
    return [g.model_dump() for g in specs]


def check_json(result: CheckResult, saved: Path | None) -> dict[str, Any]:
    return {**result.to_dict(), "calibration_saved": str(saved) if saved else None}


def profile_json(prof: Profile, path: Path) -> dict[str, Any]:
    return {**dataclasses.asdict(prof), "path": str(path)}


def solve_json(q: Query, answers: list[Answer], max_context: bool) -> dict[str, Any]:
    from kvplan.search.solve import SCHEMA

    return {
        "schema": SCHEMA,
        "mode": "max-context" if max_context else "min-gpus",
        "model": q.model.name,
        "targets": {
            "users": q.users,
            "max_model_len": q.max_model_len,
            "tpot_ms": q.tpot_ms,
            "max_gpus": q.max_gpus,
            "gpus": [g.name for g in q.gpus],
            "kv_cache_dtypes": list(q.kv_dtypes),
            "num_gpus": q.fixed_num_gpus,
        },
        "answers": [a.to_dict() for a in answers],
    }


def plot_json(result: PlotResult, chart: Path | None) -> dict[str, Any]:
    """`compare plot --json`: the curves and the memory bars as numbers, and the chart written, if any."""
    from kvplan.search.compare import SCHEMA

    return {
        "schema": SCHEMA,
        "kind": "plot",
        "budget": result.budget,
        "contexts": result.contexts,
        "series": [{"label": label, "max_concurrency": ys} for label, ys in result.series],
        "memory_per_gpu": [
            {
                "label": label,
                "weight_bytes_per_gpu": weights,
                "kv_budget_bytes_per_gpu": kv,
                "reserve_bytes_per_gpu": reserve,
                "memory_bytes_per_gpu": memory,
            }
            for label, weights, kv, reserve, memory in result.bars
        ],
        "chart": str(chart) if chart else None,
        "notes": list(result.notes),
    }
