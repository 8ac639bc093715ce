"""Benchmark kvplan's paged decode kernel against the card's ceilings, its datasheet and PyTorch SDPA.

For GQA 32/8 x 128 in bf16 and fp8 at batch 1/32/128 and context 1k/8k/32k, and MLA (16 heads x
576/512, DeepSeek-V3 at TP 8) at batch 32/128 and context 8k/32k: the kernel's useful bandwidth
(Q + K/V pages + O bytes / median time), the read-only stream ceiling, the datasheet figure, and
torch's scaled_dot_product_attention on the same K/V gathered into contiguous tensors (SDPA's time
excludes the gather). Both are timed as CUDA-graph replays over input sets rotated past the L2
(kvplan/calibrate/run.py graph_seconds), after half a second of warm-up. Prints a markdown table;
--out writes it to a file.

    python benchmarks/bench_kernel.py [--out FILE]          # on a CUDA GPU (issue 4's targets)
    python benchmarks/bench_kernel.py --smoke                 # tiny shapes, CPU interpreter: checks the script
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument(
        "--smoke", action="store_true", help="tiny shapes on the CPU through Triton's interpreter"
    )
    args = ap.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tune_kernel as tk

    from kvplan.calibrate import run as calibrate
    from kvplan.calibrate.device import match_gpu
    from kvplan.kernels.paged_decode import paged_decode
    from kvplan.specs.registry import all_gpus

    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_kernel: no CUDA GPU (use --smoke to check the script on the CPU)")
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        spec = match_gpu(props.name, props.total_memory, all_gpus())
        name, sheet = props.name, spec.hbm_bytes_per_s if spec else None
        tk.warm(torch)
        read = calibrate.measure_ceilings("cuda", 1 << 31, 30)["read_bytes_per_s"]
        fp8 = torch.cuda.get_device_capability(0) >= (8, 9)

        def bench(calls):
            return calibrate.graph_seconds(torch, calls)
    else:
        name, sheet, read, fp8 = "CPU (interpreter smoke run)", None, None, True

        def bench(calls):
            t = time.perf_counter()
            for c in calls:
                c()
            return (time.perf_counter() - t) / len(calls)

    batches, contexts = ([1, 2], [64]) if args.smoke else ([1, 32, 128], [1024, 8192, 32768])
    shapes = [
        (kind, b, c) for kind in ["gqa16"] + (["gqa8"] if fp8 else []) for b in batches for c in contexts
    ]
    shapes += [("mla", b, c) for b in ([2] if args.smoke else [32, 128]) for c in contexts[-2:]]
    rows = []
    for kind, b, c in shapes:
        sets, per_set = tk.make_sets(torch, kind, b, c, device)
        t = bench(
            [
                lambda q=q, k=k, v=v, tb=tb, n=n, vd=vd, c=c: paged_decode(
                    q, k, v, tb, n, v_dim=vd, max_seq_len=c
                )
                for q, k, v, tb, n, vd in sets
            ]
        )
        q = sets[0][0]
        nbytes = per_set + 2 * q.numel() * q.element_size()  # K/V pages read, Q in, O out
        # SDPA on the same K/V gathered into contiguous bf16 beforehand (its time is attention only); none
        # for MLA, where SDPA has no kernel for a 576-wide K with a 512-wide V and falls back to math
        sdpa = bench(tk.sdpa_calls(torch, sets, c)) if kind != "mla" and device == "cuda" else None
        bw = nbytes / t
        label = {"gqa16": "bf16", "gqa8": "fp8", "mla": "MLA bf16"}[kind]
        rows.append(
            (
                label,
                b,
                c,
                t * 1e3,
                bw / 1e9,
                bw / read if read else None,
                bw / sheet if sheet else None,
                sdpa * 1e3 if sdpa else None,
                sdpa / t if sdpa else None,
            )
        )
        del sets
    head = [
        f"Paged decode kernel on {name}: GQA {tk.HQ}/{tk.HKV} x {tk.D} and MLA {tk.MLA_HEADS} heads x "
        f"{tk.MLA_D}/{tk.MLA_V}, page {tk.PAGE}",
        f"(useful GB/s = (Q + K/V pages + O) / median time; read ceiling {read / 1e9:,.0f} GB/s; datasheet "
        f"{sheet / 1e9:,.0f} GB/s; CUDA-graph replays over input sets rotated past the L2)"
        if read and sheet
        else "(smoke run: no ceilings)",
        "",
        "| KV | batch | context | kernel ms | GB/s | of read ceiling | of datasheet | SDPA ms | kernel speed-up vs SDPA |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    lines = head + [
        f"| {dt} | {b} | {c:,} | {ms:.3f} | {gbs:,.0f} | {fmt(rc, '.0%')} | {fmt(ds, '.0%')} | "
        f"{fmt(sd, '.3f')} | {'-' if sp is None else f'{sp:.2f}x'} |"
        for dt, b, c, ms, gbs, rc, ds, sd, sp in rows
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
