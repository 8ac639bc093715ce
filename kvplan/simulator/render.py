"""`kvplan simulate` in the terminal (rich tables and a KV-usage chart that reads at 80 columns)
and as a chart file (matplotlib, imported only here)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.errors import UsageError
from kvplan.units import fmt_rate, plain_text, plural
from kvplan.userdata import chart_path, write_atomic

if TYPE_CHECKING:
    from rich.console import Console

    from kvplan.simulator.result import SimResult

CHART_ROWS = 8
BLOCKS = " ▁▂▃▄▅▆▇█"


def _title(text: str, width: int = 110) -> str:
    """A chart title wrapped at word boundaries, never cut inside a word or a number."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False))


def kv_chart(result: SimResult, width: int = 60) -> list[str]:
    """KV usage over time as one line of block characters per level band, `width` columns."""
    series = result.kv_usage
    if not series:
        return []
    end = series[-1][0]
    cols: list[float] = []
    for i in range(width):  # the highest usage within each column's time slice
        lo, hi = end * i / width, end * (i + 1) / width
        vals = [f for t, f in series if lo < t <= hi] or [cols[-1] if cols else 0.0]
        cols.append(max(vals))
    lines = []
    for row in range(CHART_ROWS, 0, -1):
        top, bottom = row / CHART_ROWS, (row - 1) / CHART_ROWS
        cells = []
        for f in cols:
            frac = (f - bottom) / (top - bottom)
            cells.append(BLOCKS[max(0, min(8, round(frac * 8)))] if f > bottom else " ")
        label = f"{top:>4.0%} │" if row in (CHART_ROWS, CHART_ROWS // 2) else "     │"
        lines.append(label + "".join(cells))
    lines.append("     └" + "─" * width)
    lines.append(f"      0 s{'':>{width - 12}}{end:>8,.1f} s")
    return lines


def render(result: SimResult, console: Console) -> None:
    from rich.table import Table

    d, w = result.deployment, result.workload
    dp, ranks = d.get("data_parallel_size", 1) or 1, d.get("attention_dp_ranks", 1) or 1
    unit = "token" if d["block_size"] == 1 else "tokens"
    scheds = dp * ranks
    where = (f" x DP {dp}" if dp > 1 else "") + (f", DP attention {ranks}" if ranks > 1 else "")
    each = f"each of {scheds} schedulers: " if scheds > 1 else ""
    console.print(
        f"{d['model']} on {d['gpus']}{where}, {d['engine']} {d['engine_version']}: {each}{d['num_gpu_blocks']:,} "
        f"KV blocks of {d['block_size']} {unit} ({d['pool_tokens']:,} tokens), max {d['max_num_seqs']:,} running, "
        f"prefix caching {'on' if d['enable_prefix_caching'] else 'off'}",
        highlight=False,
    )
    console.print(f"workload: {w['description']}", highlight=False)
    failed = sum(result.failed.values())
    console.print(
        f"completed {plural(result.completed, 'request')} in {result.duration_s:,.2f} s (simulated)"
        + (
            f"; {failed:,} refused: " + "; ".join(f"{n:,} {why}" for why, n in result.failed.items())
            if failed
            else ""
        ),
        highlight=False,
    )
    lat = Table(title="Latency (ms)", title_justify="left")
    for col in ("", "mean", "median", "p90", "p99"):
        lat.add_column(col, justify="right" if col else "left")
    for name, s in (
        ("TTFT", result.ttft_ms),
        ("TPOT", result.tpot_ms),
        ("ITL", result.itl_ms),
        ("end-to-end", result.e2el_ms),
    ):
        lat.add_row(name, *(f"{v:,.1f}" for v in (s.mean, s.median, s.p90, s.p99)))
    console.print(lat)
    tput = Table(title="Throughput and cache", title_justify="left")
    tput.add_column("quantity")
    tput.add_column("value", justify="right")
    tput.add_row("requests", f"{fmt_rate(result.request_throughput, 2)} req/s")
    tput.add_row("output tokens", f"{fmt_rate(result.output_token_throughput, 0)} tok/s")
    tput.add_row("prompt + output tokens", f"{fmt_rate(result.total_token_throughput, 0)} tok/s")
    if result.goodput is not None:
        slo = ", ".join(f"{k.replace('_ms', '').upper()} <= {v:g} ms" for k, v in result.slo.items())
        tput.add_row(f"goodput ({slo})", f"{fmt_rate(result.goodput, 2)} req/s")
    tput.add_row(
        "prefix-cache hits",
        f"{result.prefix_cache_hit_rate:.1%} of {result.prefix_cache_query_tokens:,} prompt tokens",
    )
    tput.add_row("preemptions", f"{result.preemptions:,} ({result.preempted_requests:,} requests)")
    tput.add_row("prefill tokens computed", f"{result.prefill_tokens:,} tokens")
    tput.add_row(
        "KV usage peak / mean", f"{result.kv_usage_peak:.0%} / {result.kv_usage_mean:.0%} of the pool"
    )
    console.print(tput)
    chart = kv_chart(result)
    if chart:
        console.print("KV cache usage over simulated time (fraction of the pool)", highlight=False)
        for line in chart:
            console.print(plain_text(line, console.encoding), highlight=False)
    console.print("Assumptions", highlight=False)
    for a in result.assumptions:
        console.print(f"- {a}", highlight=False)


def plot_target(path: str) -> Path:
    """The chart file --plot names: a .png or .svg, new or a regular file (checked before any work)."""
    return chart_path(path, "--plot")


def _pyplot(path: str) -> tuple[Path, Any]:
    """The chart file (a .png or .svg) and matplotlib's pyplot, imported only here, headless."""
    out = plot_target(path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'kvplan[plot]'") from None
    return out, plt


def _save(plt: Any, fig: Any, out: Path, path: str) -> str:
    """Write the chart through a temporary file and a rename (refused in one line if it cannot be written)
    and free the figure."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format=out.suffix.lower().lstrip("."))
    finally:
        plt.close(fig)
    write_atomic(out, buffer.getvalue())
    return str(out)


def plot(result: SimResult, path: str) -> str:
    """KV usage over time and the latency percentiles, as PNG or SVG by the suffix."""
    out, plt = _pyplot(path)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot([t for t, _ in result.kv_usage], [f * 100 for _, f in result.kv_usage])
    ax1.set_xlabel("simulated time (s)")
    ax1.set_ylabel("KV cache in use (% of the pool)")
    ax1.set_ylim(0, 105)
    names = ("TTFT", "TPOT", "ITL", "E2E")
    stats = (result.ttft_ms, result.tpot_ms, result.itl_ms, result.e2el_ms)
    for k, label in (("median", "p50"), ("p90", "p90"), ("p99", "p99")):
        ax2.plot(names, [getattr(s, k) for s in stats], marker="o", label=label)
    ax2.set_yscale("log")
    ax2.set_ylabel("latency (ms)")
    ax2.legend()
    d = result.deployment
    fig.suptitle(
        _title(f"{d['model']} on {d['gpus']}, {d['engine']}: {result.workload['description']}"), fontsize=9
    )
    fig.tight_layout()
    return _save(plt, fig, out, path)


def plot_load(
    points: list[tuple[float, float, float]],
    percentile: int,
    targets: tuple[float, float],
    title: str,
    path: str,
) -> str:
    """TTFT and TPOT at a percentile against the request rate (each point one simulated load), with the
    targets as dashed lines: `solve --max-rate --plot`."""
    out, plt = _pyplot(path)
    pts = sorted(points)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, k, name, target in ((axes[0], 1, "TTFT", targets[0]), (axes[1], 2, "TPOT", targets[1])):
        ax.plot([p[0] for p in pts], [p[k] for p in pts], marker="o")
        ax.axhline(target, linestyle="--", color="gray", label=f"target {target:g} ms")
        ax.set_xlabel("request rate (requests/s)")
        ax.set_ylabel(f"{name} p{percentile} (ms)")
        ax.set_yscale("log")
        ax.legend()
    fig.suptitle(_title(title), fontsize=9)
    fig.tight_layout()
    return _save(plt, fig, out, path)
