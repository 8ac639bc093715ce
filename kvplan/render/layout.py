"""What every rich table shares: text from files is never markup, and at a narrow terminal the
lesser columns go before any cell is cut (a cell never shrinks to `0.…`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table

_SEPARATOR_CELLS = 3  # " │ " between columns (no edge, no edge padding)


class SafeTable(Table):
    """A rich Table whose string cells are shown as typed: a model named `evil[/]model[bold]` stays so."""

    left_out: list[str] = []  # the headers of columns fitted_table left out at a narrow width

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        super().add_row(*[escape(r) if isinstance(r, str) else r for r in renderables], **kwargs)


def plain_table(title: str) -> SafeTable:
    return SafeTable(
        title=escape(title), title_justify="left", title_style="bold", show_edge=False, pad_edge=False
    )


def _needed_cells(header: str, cells: list[str], wraps: bool) -> int:
    """Cells a column needs: its widest cell (a wrapping column: its longest word), at least the header's
    longest word."""
    words = [w for c in cells for w in (c.split() if wraps else c.splitlines() or [c])]
    return max([len(w) for w in words + header.split()] or [1])


def fit_columns(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    drop_order: Sequence[int],
    wraps: Sequence[int] = (),
) -> tuple[list[int], list[int]]:
    """(the columns to show at `width`, dropping those in `drop_order` first as needed; each column's
    minimum width, so that no cell is cut)."""
    needed = [_needed_cells(h, [r[i] for r in rows], i in wraps) for i, h in enumerate(headers)]
    keep = list(range(len(headers)))

    def total(cols: list[int]) -> int:
        return sum(needed[i] for i in cols) + _SEPARATOR_CELLS * (len(cols) - 1)

    for i in drop_order:
        if total(keep) <= width:
            break
        keep.remove(i)
    return keep, needed


def fitted_table(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    drop_order: Sequence[int] = (),
    wraps: Sequence[int] = (),
    left: Sequence[int] = (0,),
    breaks: Sequence[int] = (),
) -> SafeTable:
    """A table of `rows` that fits `width`: columns in `drop_order` go first; a cell is never cut
    (the columns in `wraps` wrap at spaces, headers wrap at spaces)."""
    keep, needed = fit_columns(headers, rows, width, drop_order, wraps)
    if breaks and sum(needed[i] for i in keep) + _SEPARATOR_CELLS * (len(keep) - 1) > width:
        # still too wide with every lesser column gone: a composite name (int4+window4096) goes on
        # one line per part, each part whole
        rows = [[c.replace("+", "+\n") if i in breaks else c for i, c in enumerate(r)] for r in rows]
        keep, needed = fit_columns(headers, rows, width, drop_order, wraps)
    natural = [
        max([len(line) for h in (headers[i], *(r[i] for r in rows)) for line in h.splitlines() or [""]])
        for i in keep
    ]
    fits = sum(natural) + _SEPARATOR_CELLS * (len(keep) - 1) <= width
    t = plain_table(title)
    t.left_out = [headers[i] for i in range(len(headers)) if i not in keep]
    for i in keep:
        t.add_column(
            headers[i],
            justify="left" if i in left else "right",
            no_wrap=fits and i not in wraps,
            # too narrow for every header on one line: fixed widths, so no cell is cut, headers wrap
            width=None if fits or i in wraps else needed[i],
            # narrower still (every lesser column gone): a long name or header folds onto the next
            # line whole, never cut to an ellipsis
            overflow="fold",
        )
    for r in rows:
        t.add_row(*[r[i] for i in keep])
    return t


def left_out_line(t: SafeTable, width: int) -> str | None:
    """The line that says which columns a narrow terminal left out, and how to see them."""
    if not t.left_out:
        return None
    names = ", ".join(" ".join(h.split()) for h in t.left_out)
    return f"not shown at {width} columns: {names} (COLUMNS=160 or --json shows them)"


def kept_notes(notes: Sequence[str], t: SafeTable) -> list[str]:
    """The notes, less those that explain a column the table left out (`name: ...` or `name ...`), or a family
    of columns all left out (`KV read/step: ...` for `KV read/step, 1 req (...)` and `KV read/step, all (...)`)."""
    gone = [" ".join(h.split()).rstrip(" *") for h in t.left_out]
    shown = [" ".join(str(c.header).split()) for c in t.columns]
    stems = {g.split(",")[0] for g in gone if "," in g} - {h.split(",")[0] for h in shown}
    return [n for n in notes if not any(n.startswith((f"{g}:", f"{g} ")) for g in [*gone, *stems])]
