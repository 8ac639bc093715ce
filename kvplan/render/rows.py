"""`kvplan compare table|ladder` as text: a rich table, Markdown, CSV or JSON, from the same rows."""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import TYPE_CHECKING, Any

from kvplan.units import fmt_bytes, fmt_gib

if TYPE_CHECKING:
    from rich.console import Console

    from kvplan.commands.comparisons import LadderResult, TableResult

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
    ("KV read/step, 1 req (datasheet BW)", "decode_kv_read_ms_one_request", "ms"),
    ("KV read/step, all (datasheet BW)", "decode_kv_read_ms", "ms"),
    ("offload read/step", "offload_read_ms", "ms"),
    ("quality (source)", "quality", None),
]
# the lesser columns, in the order they go at a narrow terminal (max requests and KV/token stay)
DROP_FIRST = (
    "quality",
    "offload_read_ms",
    "decode_kv_read_ms_one_request",
    "kv_bytes_per_token_per_gpu",
    "ratio_to_mha",
    "decode_kv_read_ms",
)

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
    from kvplan.render.layout import stacked_tables

    headers = [h for h, _, _ in columns]
    cells = [[cell(k, r[key]) for _, key, k in columns] for r in rows]
    # at a narrow terminal the lesser columns go (the last ones first); cells are never cut
    texts = tuple(i for i, (_, _, kind) in enumerate(columns) if kind is None and i >= 2)
    keys = [key for _, key, _ in columns]
    drop = [keys.index(k) for k in DROP_FIRST if k in keys]
    tables = stacked_tables(
        title, headers, cells, console.width, drop_order=drop, wraps=texts, left=(0, 1, *texts), breaks=(1,),
        keys=(0, 1),
    )  # fmt: skip
    for t in tables:
        console.print(t)
    for n in notes:
        console.print(f"- {n}", highlight=False, markup=False)


def table_json(result: TableResult) -> dict[str, Any]:
    return result.to_dict()


def table_title(result: TableResult) -> str:
    c = result.cluster.layout
    base = result.base
    if c is None:  # no row could run: say what was asked for
        gpus = f"{base.num_gpus}x " if base.num_gpus else ""
        tp = f", TP {base.tp}" if base.tp else ""
        return f"{gpus}{base.gpu.name}{tp}, {base.max_model_len or 0:,} tokens per request"
    dp = f", DP {c.data_parallel_size}" if c.data_parallel_size > 1 else ""
    ep = (
        f", MoE rows EP {c.tensor_parallel_size * c.data_parallel_size}"
        if base.enable_expert_parallel
        else ""
    )
    return (
        f"{c.num_gpus}x {base.gpu.name}, TP {c.tensor_parallel_size}{dp}{ep}, "
        f"{result.cluster.max_model_len or 0:,} tokens per request"
    )


def ladder_json(result: LadderResult) -> dict[str, Any]:
    from kvplan.search.compare import SCHEMA

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
    return f"{base.model.name} on {result.shipped.cluster.num_gpus}x {base.gpu.name}: the ladder (README, Comparing models and techniques)"


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
    columns = _table_columns(rows)
    if fmt == "csv" and any(r.error for r in result.rows):
        columns = [*columns, ("error", "error", None)]  # why a row has no figures
    return _text(rows, columns, fmt, table_title(result), result.notes)


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
