"""Print what a `kvplan calibrate` profile holds for the decode step model, as markdown.

Counts: GEMM bandwidth is the weight's bytes only (K x N x element bytes / median time), against
the GPU spec's datasheet HBM figure; all-reduce bandwidth is message bytes / (time - latency), the
bus bandwidth (x 2 (n - 1) / n) beside it; the launch floor per kernel. Then the step model's
lookups for Llama-3-8B's layer matrices at TP 1 (q/k/v 4096x6144, o 4096x4096, gate/up
4096x28672, down 14336x4096), interpolated from the measured points. No torch needed.

    python benchmarks/bench_calibration.py PROFILE.yaml [--out FILE]
"""

from __future__ import annotations

import argparse
from pathlib import Path

LLAMA3_8B_LAYER = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--out")
    args = ap.parse_args()
    from kvplan.calibrate import calibration

    prof = calibration.load(Path(args.profile))
    sheet = prof.datasheet_bytes_per_s
    lines = [f"# {prof.device_name} ({prof.gpu_spec or prof.device}), measured {prof.measured_on}", ""]
    if prof.gemm:
        batches = sorted({p.batch for p in prof.gemm})
        lines += [
            "## GEMM weight streaming, GB/s" + (f" (datasheet {sheet / 1e9:,.0f})" if sheet else ""),
            "",
            "| dtype | K x N | " + " | ".join(f"B={b}" for b in batches) + " |",
            "|---|---|" + "---|" * len(batches),
        ]
        rows: dict[tuple[str, int, int], dict[int, float]] = {}
        for p in prof.gemm:
            rows.setdefault((p.dtype, p.k, p.n), {})[p.batch] = p.weight_bytes_per_s
        for (dtype, k, n), by in rows.items():
            cells = [_cell(by.get(b), sheet) for b in batches]
            lines.append(f"| {dtype} | {k}x{n} | " + " | ".join(cells) + " |")
        lines += ["", "## Step model lookups: Llama-3-8B layer at TP 1, microseconds", ""]
        lines += ["| dtype | batch | " + " | ".join(LLAMA3_8B_LAYER) + " | layer |", "|---|---|" + "---|" * 5]
        for dtype in sorted({p.dtype for p in prof.gemm}):
            for batch in (1, 32, 256):
                us = [prof.gemm_seconds(dtype, batch, k, n) or 0.0 for k, n in LLAMA3_8B_LAYER.values()]
                lines.append(
                    f"| {dtype} | {batch} | "
                    + " | ".join(f"{u * 1e6:,.1f}" for u in us)
                    + f" | {sum(us) * 1e6:,.1f} |"
                )
    for a in prof.allreduce:
        lines += [
            "",
            f"## All-reduce, {a.backend}, {a.world_size} ranks on {a.nodes} node(s)",
            f"fit: {a.latency_seconds * 1e6:,.1f} us + bytes / {a.bytes_per_s / 1e9:,.1f} GB/s "
            f"(bus {a.bus_bytes_per_s / 1e9:,.1f} GB/s), rms relative error {a.rms_relative_error:.1%}",
            "",
            "| bytes | measured us | fit us |",
            "|---|---|---|",
            *(
                f"| {p.bytes:,} | {p.seconds * 1e6:,.1f} | {a.seconds(p.bytes) * 1e6:,.1f} |"
                for p in a.points
            ),
        ]
    if prof.launch:
        graph = prof.launch.graph_seconds
        lines += [
            "",
            f"launch floor: {prof.launch.seconds * 1e6:,.2f} us eager"
            + (f", {graph * 1e6:,.2f} us in a CUDA graph" if graph else "")
            + f" ({prof.launch.method})",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


def _cell(bytes_per_s: float | None, sheet: float | None) -> str:
    if bytes_per_s is None:
        return "-"
    gb = f"{bytes_per_s / 1e9:,.0f}" if bytes_per_s >= 1e11 else f"{bytes_per_s / 1e9:.3g}"
    return f"{gb} ({bytes_per_s / sheet:.0%})" if sheet else gb


if __name__ == "__main__":
    main()
