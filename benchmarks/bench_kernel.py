"""Benchmark kvplan's paged decode kernel against the card's ceilings, its datasheet and PyTorch SDPA.

For GQA 32/8 x 128 in bf16 and fp8 at batch 1/32/128 and context 1k/8k/32k: the kernel's useful
bandwidth (Q + K/V pages + O bytes / median time, L2 flushed), the read-only stream ceiling, the
datasheet figure, and torch's scaled_dot_product_attention on the same K/V gathered into contiguous
tensors (SDPA's time excludes the gather). Prints a markdown table; --out writes it to a file.

    python benchmarks/bench_kernel.py [--out FILE]          # on a CUDA GPU (issue 4's targets)
    python benchmarks/bench_kernel.py --smoke                 # tiny shapes, CPU interpreter: checks the script
"""

from __future__ import annotations

import argparse
import os
import statistics
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

    from kvplan import calibrate
    from kvplan.kernels.paged_decode import paged_decode
    from kvplan.specs.registry import all_gpus

    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_kernel: no CUDA GPU (use --smoke to check the script on the CPU)")
    if device == "cuda":
        from triton.testing import do_bench

        def bench(fn):
            return do_bench(fn, warmup=10, rep=50, return_mode="median") / 1e3

        props = torch.cuda.get_device_properties(0)
        spec = calibrate.match_gpu(props.name, props.total_memory, all_gpus())
        name, sheet = props.name, spec.hbm_bytes_per_s if spec else None
        read = calibrate.measure_ceilings("cuda", 1 << 30, 30)["read_bytes_per_s"]
        fp8 = torch.cuda.get_device_capability(0) >= (8, 9)
    else:

        def bench(fn):
            fn()
            ts = []
            for _ in range(3):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            return statistics.median(ts)

        name, sheet, read, fp8 = "CPU (interpreter smoke run)", None, None, True
    hq, hkv, d, page = 32, 8, 128, 16
    batches, contexts = ([1, 2], [64]) if args.smoke else ([1, 32, 128], [1024, 8192, 32768])
    dtypes = ["bf16"] + (["fp8"] if fp8 else [])
    rows = []
    for dt in dtypes:
        for b in batches:
            for c in contexts:
                pages = -(-c // page)
                k = torch.randn(b * pages, page, hkv, d, device=device, dtype=torch.bfloat16)
                v = torch.randn_like(k)
                if dt == "fp8":
                    k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
                table = torch.randperm(b * pages, device=device).to(torch.int32).reshape(b, pages)
                lens = torch.full((b,), c, dtype=torch.int32, device=device)
                q = torch.randn(b, hq, d, device=device, dtype=torch.bfloat16)
                t = bench(
                    lambda q=q, k=k, v=v, t=table, n=lens, c=c: paged_decode(q, k, v, t, n, max_seq_len=c)
                )
                nbytes = 2 * b * pages * page * hkv * d * k.element_size() + 2 * q.numel() * q.element_size()
                # SDPA on contiguous K/V (gathered beforehand, so its time is attention only)
                kg = (
                    k[table.long()].reshape(b, pages * page, hkv, d)[:, :c].to(torch.bfloat16).transpose(1, 2)
                )
                vg = (
                    v[table.long()].reshape(b, pages * page, hkv, d)[:, :c].to(torch.bfloat16).transpose(1, 2)
                )
                kg, vg = kg.contiguous(), vg.contiguous()
                qs = q.unsqueeze(2)
                sdpa = bench(
                    lambda qs=qs, kg=kg, vg=vg: torch.nn.functional.scaled_dot_product_attention(
                        qs, kg, vg, enable_gqa=True
                    )
                )
                bw = nbytes / t
                rows.append(
                    (
                        dt,
                        b,
                        c,
                        t * 1e3,
                        bw / 1e9,
                        bw / read if read else None,
                        bw / sheet if sheet else None,
                        sdpa * 1e3,
                        sdpa / t,
                    )
                )
    head = [
        f"Paged decode kernel on {name}: GQA {hq}/{hkv} x {d}, page {page}",
        f"(useful GB/s = (Q + K/V pages + O) / median time; read ceiling {read / 1e9:,.0f} GB/s; datasheet "
        f"{sheet / 1e9:,.0f} GB/s)"
        if read and sheet
        else "(smoke run: no ceilings)",
        "",
        "| KV | batch | context | kernel ms | GB/s | of read ceiling | of datasheet | SDPA ms | kernel speed-up vs SDPA |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    lines = head + [
        f"| {dt} | {b} | {c:,} | {ms:.3f} | {gbs:,.0f} | {fmt(rc, '.0%')} | {fmt(ds, '.0%')} | {sd:.3f} | {sp:.2f}x |"
        for dt, b, c, ms, gbs, rc, ds, sd, sp in rows
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
