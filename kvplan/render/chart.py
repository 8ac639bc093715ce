"""`kvplan compare plot`: max concurrency vs context as a terminal table of sparklines, and as a
PNG/SVG chart with the memory per GPU beside it (matplotlib, imported only to write a file)."""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING, Any

from kvplan.errors import UsageError
from kvplan.units import GiB, plain_text
from kvplan.userdata import write_atomic

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from kvplan.commands.comparisons import PlotResult

_BARS = "▁▂▃▄▅▆▇█"


def _context_label(c: int) -> str:
    return f"{c // 1024}K" if c % 1024 == 0 else f"{c:,}"


def tick_contexts(ctxs: list[int]) -> list[int]:
    """The contexts to label on a log2 axis: the last always, and none closer than 1.5x to the next
    labelled one (a model's odd maximum, 160K, beside 128K would print "128K160K")."""
    kept: list[int] = []
    for c in reversed(ctxs):
        if not kept or kept[-1] >= 1.5 * c:
            kept.append(c)
    return kept[::-1]


def _spark(ys: list[int | None], top: int) -> str:
    """One bar per context, its height the log of the concurrency against the largest anywhere."""
    return "".join(
        " "
        if not y
        else _BARS[min(len(_BARS) - 1, int(math.log(y) / math.log(top) * (len(_BARS) - 1))) if top > 1 else 0]
        for y in ys
    )


def print_curve(result: PlotResult, console: Console) -> None:
    """The curve table; too wide for the terminal, its context columns continue in further tables
    (each row named again) rather than any number being cut."""
    from kvplan.render.layout import plain_table

    top = max((v for _, ys in result.series for v in ys if v), default=1)
    labels = [label for label, _ in result.series]
    sparks = [plain_text(_spark(ys, top), console.encoding) for _, ys in result.series]
    cells = [["-" if y is None else f"{y:,}" for y in ys] for _, ys in result.series]
    heads = [_context_label(c) for c in result.contexts]
    name_w = max([len("model / variant"), *map(len, labels)])
    used = name_w + 3 + max([len("curve"), *map(len, sparks)])
    chunks: list[list[int]] = [[]]
    for i, head in enumerate(heads):
        need = 3 + max([len(head), *(len(row[i]) for row in cells)])
        if chunks[-1] and used + need > console.width:
            chunks.append([])
            used = name_w
        chunks[-1].append(i)
        used += need
    for n, cols in enumerate(chunks):
        t = plain_table(f"Max concurrent requests vs context ({result.budget})" if n == 0 else "")
        if n:
            console.print(f"continued, {heads[cols[0]]} and longer:", highlight=False, markup=False)
        t.add_column("model / variant", no_wrap=True)
        if n == 0:
            t.add_column("curve", no_wrap=True)
        for i in cols:
            t.add_column(heads[i], justify="right", no_wrap=True)
        for label, spark, row in zip(labels, sparks, cells, strict=True):
            t.add_row(label, *([spark] if n == 0 else []), *[row[i] for i in cols])
        console.print(t)
    for note in result.notes:
        console.print(f"- {note}", highlight=False, markup=False)


def write_chart(path: Path, result: PlotResult) -> None:
    """Both panels into `path` (.png or .svg), through a temporary file so a failure leaves none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--output needs matplotlib: pip install 'kvplan[plot]'") from None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    _curves(ax1, result)
    _memory_bars(ax2, result)
    fig.suptitle(f"kvplan: {result.budget}")
    fig.tight_layout()
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format=path.suffix.lower().lstrip("."))
    finally:
        plt.close(fig)
    write_atomic(path, buffer.getvalue())  # exclusive temp file, then a rename: no planted symlink


def _curves(ax1: Any, result: PlotResult) -> None:
    ctxs = result.contexts
    for label, ys in result.series:
        pts = [(c, y) for c, y in zip(ctxs, ys, strict=True) if y]
        if pts:
            ax1.plot([c for c, _ in pts], [y for _, y in pts], marker="o", label=label)
    ax1.set_xscale("log", base=2)
    ticks = tick_contexts(ctxs)
    ax1.set_xticks(ticks, [_context_label(c) for c in ticks], fontsize=8)
    ax1.minorticks_off()
    ax1.set_yscale("log")
    ax1.set_xlabel("context per request (tokens)")
    ax1.set_ylabel("max concurrent requests")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)


def _memory_bars(ax2: Any, result: PlotResult) -> None:
    """Stacked per GPU: weights, KV cache, the estimated reserve, and what is left unused."""
    bars = result.bars
    labels = [b[0] for b in bars]
    weights = [b[1] / GiB for b in bars]
    kvb = [b[2] / GiB for b in bars]
    res = [b[3] / GiB for b in bars]
    rest = [max(b[4] / GiB - w - k - r, 0) for b, w, k, r in zip(bars, weights, kvb, res, strict=True)]
    xs = range(len(bars))
    ax2.bar(xs, weights, label="weights")
    ax2.bar(xs, kvb, bottom=weights, label="KV cache")
    ax2.bar(xs, res, bottom=[w + k for w, k in zip(weights, kvb, strict=True)], label="reserve (estimated)")
    ax2.bar(
        xs,
        rest,
        bottom=[w + k + r for w, k, r in zip(weights, kvb, res, strict=True)],
        label="not used",
        color="lightgrey",
    )
    ax2.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=8)
    ax2.set_ylabel("GiB per GPU")
    ax2.legend(fontsize=8)
