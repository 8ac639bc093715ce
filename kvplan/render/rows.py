"""`kvplan compare table|ladder` as text: a rich table, Markdown, CSV or JSON, from the same rows."""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import TYPE_CHECKING, Any

from kvplan.units import fmt_bytes, fmt_gib

if TYPE_CHECKING:
    from rich.console import Console

    from kvplan.comparisons import LadderResult, TableResult

FORMATS = ("table", "md", "csv", "json")

# (header, key in the row's dict, how to format it: None is text, aligned left)
Columns = list[tuple[str, str, str | None]]

TABLE_COLUMNS: Columns = [
    ("model", "model", None),
    ("variant", "variant", None),
    ("KV/token", "kv_bytes_per_token", "bytes"),
    ("KV/token/GPU", "kv_bytes_per_token_per_gpu", "bytes"),
    ("vs MHA", "ratio_to_mha", "ratio"),
    ("KV/request", "kv_bytes_per_request", "gib"),
    ("state/request", "state_bytes_per_request", "bytes"),
    ("max requests", "max_concurrency", "int"),
    ("KV read/step, 1 req", "decode_kv_read_ms_one_request", "ms"),
    ("KV read/step, all", "decode_kv_read_ms", "ms"),
    ("offload read/step", "offload_read_ms", "ms"),
    ("quality (seeds)", "quality", None),
]

LADDER_COLUMNS: Columns = [
    ("step", "step", None),
    ("variant", "variant", None),
    ("max requests", "max_concurrency", "int"),
    ("factor", "factor", "ratio"),
    ("cumulative", "cumulative", "ratio"),
    ("how", "how", None),
]


def cell(kind: str | None, value: Any) -> str:
    if value is None:
        return "-"
    if kind == "bytes":
        return fmt_bytes(value)
    if kind == "gib":
        return fmt_gib(value)
    if kind == "ratio":
        return f"{value:.3f}x"
    if kind == "int":
        return f"{value:,}"
    if kind == "ms":
        return f"{value:,.2f} ms"
    return str(value)


def csv_text(rows: list[dict[str, Any]], columns: Columns) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([key for _, key, _ in columns])
    for r in rows:
        w.writerow(["" if r[key] is None else r[key] for _, key, _ in columns])
    return buf.getvalue()


def markdown_text(rows: list[dict[str, Any]], columns: Columns, title: str, notes: list[str]) -> str:
    lines = [f"**{title}**", "", "| " + " | ".join(h for h, _, _ in columns) + " |"]
    lines.append("|" + "|".join(" --- " for _ in columns) + "|")
    for r in rows:
        lines.append("| " + " | ".join(cell(k, r[key]).replace("|", "/") for _, key, k in columns) + " |")
    lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines)


def print_table(
    rows: list[dict[str, Any]], columns: Columns, title: str, notes: list[str], console: Console
) -> None:
    from rich.table import Table

    t = Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    for i, (h, _, kind) in enumerate(columns):
        t.add_column(h, justify="left" if kind is None else "right", no_wrap=i < 2)
    for r in rows:
        t.add_row(*[cell(k, r[key]) for _, key, k in columns])
    console.print(t)
    for n in notes:
        console.print(f"- {n}", highlight=False)


def table_json(result: TableResult) -> dict[str, Any]:
    from kvplan.compare import SCHEMA

    return {
        "schema": SCHEMA,
        "kind": "table",
        "cluster": result.cluster,
        "rows": [r.to_dict() for r in result.rows],
        "notes": result.notes,
    }


def table_title(result: TableResult) -> str:
    c = result.cluster
    return (
        f"{c.get('num_gpus', '?')}x {result.base.gpu.name}, TP {c.get('tensor_parallel_size', '?')}, "
        f"{c.get('max_model_len', 0):,} tokens per request"
    )


def ladder_json(result: LadderResult) -> dict[str, Any]:
    from kvplan.compare import SCHEMA

    return {
        "schema": SCHEMA,
        "kind": "ladder",
        "model": result.base.model.name,
        "cluster": dataclasses.asdict(result.shipped.cluster),
        "max_model_len": result.max_model_len,
        "avg_context_tokens": result.avg_context_tokens,
        "shared_prefix_tokens": result.shared_prefix_tokens,
        "prefix_hit_rate": result.prefix_hit_rate,
        "kv_budget_bytes_per_gpu": result.shipped.kv_budget_bytes_per_gpu,
        "steps": [dataclasses.asdict(s) for s in result.steps],
        "notes": result.notes,
    }


def ladder_title(result: LadderResult) -> str:
    base = result.base
    return (
        f"{base.model.name} on {result.shipped.cluster.num_gpus}x {base.gpu.name}: the ladder (seed 000 15.8)"
    )


def _text(
    rows: list[dict[str, Any]], columns: Columns, fmt: str, title: str, notes: list[str]
) -> tuple[str, bool]:
    if fmt == "csv":
        return csv_text(rows, columns), False  # CSV ends in a newline already
    return markdown_text(rows, columns, title, notes), True


# shown only when a row has one: recurrent state and image K/V a request holds whatever its length
_OPTIONAL = {"state_bytes_per_request"}


def _table_columns(rows: list[dict[str, Any]]) -> Columns:
    return [c for c in TABLE_COLUMNS if c[1] not in _OPTIONAL or any(r.get(c[1]) for r in rows)]


def table_text(result: TableResult, fmt: str) -> tuple[str, bool]:
    """The json, md or csv text of a comparison table, and whether a newline must follow it."""
    if fmt == "json":
        from kvplan.render.jsonout import to_json

        return to_json(table_json(result)), True
    rows = [r.to_dict() for r in result.rows]
    return _text(rows, _table_columns(rows), fmt, table_title(result), result.notes)


def print_comparison(result: TableResult, console: Console) -> None:
    rows = [r.to_dict() for r in result.rows]
    print_table(rows, _table_columns(rows), table_title(result), result.notes, console)


def ladder_text(result: LadderResult, fmt: str) -> tuple[str, bool]:
    """As table_text, for the ladder."""
    if fmt == "json":
        from kvplan.render.jsonout import to_json

        return to_json(ladder_json(result)), True
    rows = [dataclasses.asdict(s) for s in result.steps]
    return _text(rows, LADDER_COLUMNS, fmt, ladder_title(result), result.notes)


def print_ladder(result: LadderResult, console: Console) -> None:
    rows = [dataclasses.asdict(s) for s in result.steps]
    print_table(rows, LADDER_COLUMNS, ladder_title(result), result.notes, console)
