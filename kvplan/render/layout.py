"""What every rich table shares: text from files is never markup, and at a narrow terminal the columns
that do not fit follow in a "(continued)" table: no name or figure is cut (a cell never shrinks to `0.…`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len
from rich.markup import escape
from rich.table import Table

_SEPARATOR_CELLS = 3  # " │ " between columns (no edge, no edge padding)


class SafeTable(Table):
    """A rich Table whose string cells are shown as typed: a model named `evil[/]model[bold]` stays so."""

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
    return max(
        [cell_len(w) for w in words + header.split()] or [1]
    )  # screen cells: a CJK character takes two


def _table(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    wraps: Sequence[int],
    left: Sequence[int],
    caps: dict[int, int],
) -> SafeTable:
    """A table of every column of `rows` at `width`: at its natural widths where they fit; else each column at the
    cells it needs (so no cell is cut; headers wrap at spaces), the columns in `wraps` wrapping at spaces and a
    column in `caps` held to that width, its text wrapping or folding onto further lines."""
    needed = [_needed_cells(h, [r[i] for r in rows], i in wraps) for i, h in enumerate(headers)]
    for i, w in caps.items():
        needed[i] = min(needed[i], w)
    natural = [
        max([cell_len(line) for h in (headers[i], *(r[i] for r in rows)) for line in h.splitlines() or [""]])
        for i in range(len(headers))
    ]
    fits = sum(natural) + _SEPARATOR_CELLS * (len(headers) - 1) <= width
    t = plain_table(title)
    for i, header in enumerate(headers):
        t.add_column(
            header,
            justify="left" if i in left else "right",
            no_wrap=fits and i not in wraps,
            width=None if fits or i in wraps else needed[i],
            overflow="fold",  # a long name or header folds onto the next line whole, never cut to an ellipsis
        )
    for r in rows:
        t.add_row(*r)
    return t


def stacked_tables(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    drop_order: Sequence[int] = (),
    wraps: Sequence[int] = (),
    left: Sequence[int] = (0,),
    breaks: Sequence[int] = (),
    keys: Sequence[int] = (0,),
    texts: Sequence[int] = (),
) -> list[SafeTable]:
    """The table at `width`; where its columns do not all fit, the rest follow in further tables, titled
    "(continued)", that repeat the `keys` columns: a narrow terminal stacks columns, it loses none. The first
    table takes the columns not in `drop_order` first, then those in it, the first named last; a figure is
    never narrower than its widest cell (where the names leave no room for it, the widest name folds; a
    column of text (`texts`, `wraps`) wider than the room left wraps)."""
    cells = [list(r) for r in rows]
    needed = [_needed_cells(h, [r[i] for r in cells], i in wraps) for i, h in enumerate(headers)]
    everything = list(range(len(headers)))
    if sum(needed) + _SEPARATOR_CELLS * (len(headers) - 1) <= width:
        return [_table(title, headers, cells, width, wraps, left, {})]
    others = [i for i in everything if i not in keys]
    figures = [needed[i] for i in others if i not in wraps and i not in texts] or [1]

    def room() -> int:
        return width - sum(needed[k] for k in keys) - _SEPARATOR_CELLS * len(keys)

    if breaks and room() < max(figures):  # composite names one part a line (int4+ / window4096), each whole
        cells = [[c.replace("+", "+\n") if i in breaks else c for i, c in enumerate(r)] for r in cells]
        needed = [_needed_cells(h, [r[i] for r in cells], i in wraps) for i, h in enumerate(headers)]
    caps: dict[int, int] = {}
    if room() < max(figures):  # the names leave no room for the widest figure: the widest name folds
        k = max(keys, key=lambda j: needed[j])
        caps[k] = needed[k] = max(needed[k] - (max(figures) - room()), 4)
    order = [i for i in others if i not in drop_order] + [i for i in reversed(drop_order) if i in others]
    groups: list[list[int]] = [[]]
    for i in order:
        used = sum(needed[j] + _SEPARATOR_CELLS for j in groups[-1])
        if groups[-1] and used + needed[i] > room():
            groups.append([])
        groups[-1].append(i)
    tables = []
    for n, group in enumerate(groups):
        cols = sorted([*keys, *group])
        held = {cols.index(i): w for i, w in caps.items() if i in cols}
        # a text column wider than the room left beside the names (a list of aliases) wraps to it
        held.update({cols.index(i): max(room() - 1, 4) for i in group if needed[i] > room()})
        tables.append(
            _table(
                title if n == 0 else "(continued)", [headers[i] for i in cols], [[r[i] for i in cols] for r in cells],
                width, [cols.index(i) for i in wraps if i in cols], [cols.index(i) for i in left if i in cols], held,
            )
        )  # fmt: skip
    return tables
