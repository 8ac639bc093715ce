"""Sweep the paged-decode kernel's launch settings on the local GPU; the measured best go in kernels/launch.yaml.

For GQA 32/8 x 128 (bf16 and fp8 KV) and MLA 16 heads x 576/512 (DeepSeek-V3 at TP 8), over the shapes
below, every combination of tile (block_n), warps, software-pipelining stages and split-K target
(programs per SM) is timed, and torch SDPA on the same K/V made contiguous beside it.

Timing (device METHOD: graph replay for small launches, inputs rotated past the L2): each measurement
captures one CUDA graph that runs the kernel over N independent input sets, N sized so that together
they are at least 4x the L2, and reports the median replay time / N over 20 replays (events). SDPA is
timed the same way, so neither pays Python launch overhead.

    python benchmarks/tune_kernel.py [--out FILE] [--quick]     # on a CUDA GPU
    python benchmarks/tune_kernel.py --smoke                     # CPU interpreter: checks the script
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

HQ, HKV, D, PAGE = 32, 8, 128, 16
MLA_HEADS, MLA_D, MLA_V = 16, 576, 512
SHAPES = [  # (kind, batch, context)
    ("gqa16", 1, 32768),
    ("gqa16", 32, 8192),
    ("gqa16", 32, 32768),
    ("gqa16", 128, 8192),
    ("gqa8", 1, 32768),
    ("gqa8", 32, 8192),
    ("gqa8", 32, 32768),
    ("gqa8", 128, 8192),
    ("mla", 32, 8192),
    ("mla", 128, 8192),
]
GRID = {
    "gqa16": {"block_n": (32, 64, 128), "num_warps": (4, 8), "num_stages": (2, 3, 4)},
    "gqa8": {"block_n": (32, 64, 128), "num_warps": (4, 8), "num_stages": (2, 3, 4)},
    "mla": {"block_n": (16, 32, 64), "num_warps": (8,), "num_stages": (1, 2, 3)},
}
PPS = (2, 4, 8)


def warm(torch) -> None:
    """Half a second of bf16 matrix products: the clocks leave idle before anything is timed."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = time.perf_counter()
    while time.perf_counter() - t < 0.5:
        a @ a
    torch.cuda.synchronize()


def make_sets(torch, kind: str, batch: int, context: int, device: str):
    """Independent input sets (q, k, v, table, lens, v_dim) whose K/V together exceed 4x the L2."""
    mla = kind == "mla"
    hq, hkv, d = (MLA_HEADS, 1, MLA_D) if mla else (HQ, HKV, D)
    pages = -(-context // PAGE)
    elt = 1 if kind == "gqa8" else 2
    per_set = batch * pages * PAGE * hkv * d * elt * (1 if mla else 2)
    from kvplan.calibrate import run as calibrate

    n = calibrate.rotation(torch, per_set) if device == "cuda" else 1
    sets = []
    for _ in range(n):
        k = torch.randn(batch * pages, PAGE, hkv, d, device=device, dtype=torch.bfloat16)
        v = k if mla else torch.randn_like(k)
        if kind == "gqa8":
            k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        table = torch.randperm(batch * pages, device=device).to(torch.int32).reshape(batch, pages)
        lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        q = torch.randn(batch, hq, d, device=device, dtype=torch.bfloat16)
        sets.append((q, k, v, table, lens, MLA_V if mla else None))
    return sets, per_set


def sdpa_calls(torch, sets, context: int):
    """SDPA over each set's K/V gathered into contiguous bf16 tensors beforehand (MLA: the latent as K,
    its first 512 values as V, one KV head shared by every query head)."""
    calls = []
    for q, k, v, table, _lens, v_dim in sets:
        b = q.shape[0]
        pages = table.shape[1]
        kg = k[table.long()].reshape(b, pages * PAGE, k.shape[2], k.shape[3])[:, :context].to(torch.bfloat16)
        vg = v[table.long()].reshape(b, pages * PAGE, v.shape[2], v.shape[3])[:, :context].to(torch.bfloat16)
        if v_dim:
            vg = vg[..., :v_dim]
        kg, vg = kg.transpose(1, 2).contiguous(), vg.transpose(1, 2).contiguous()
        qs = q.unsqueeze(2)
        calls.append(
            lambda qs=qs, kg=kg, vg=vg: torch.nn.functional.scaled_dot_product_attention(
                qs, kg, vg, enable_gqa=True
            )
        )
    return calls


def report(best: dict, log: list[str], out: str | None) -> list[str]:
    head = [
        "| kind | batch | context | block_n | warps | stages | programs/SM | splits | ms | GB/s | vs SDPA |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    summary = [
        "| kind | batch | context | best: block_n/warps/stages/pps (splits) | ms | GB/s | SDPA ms | vs SDPA |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (kind, batch, context), (sec, bn, w, st, p, sp, sdpa, gbs) in best.items():
        summary.append(
            f"| {kind} | {batch} | {context:,} | {bn}/{w}/{st}/{p} ({sp}) | {sec * 1e3:.4f} | {gbs:,.0f} | "
            f"{sdpa * 1e3:.4f} | {sdpa / sec:.2f}x |"
        )
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write("\n".join(["## Best per shape", *summary, "", "## Every setting", *head, *log]) + "\n")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true", help="stages 3 only and two split targets")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    args = ap.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from kvplan.calibrate import run as calibrate
    from kvplan.kernels import paged_decode as pd

    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("tune_kernel: no CUDA GPU (use --smoke to check the script on the CPU)")
    shapes = [(k, 1, 64) for k in ("gqa16", "mla")] if args.smoke else SHAPES
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        sms, arch = props.multi_processor_count, 10 * props.major + props.minor
        warm(torch)
        timer = lambda calls: calibrate.graph_seconds(torch, calls)  # noqa: E731
    else:
        sms, arch = 2, None

        def timer(calls):
            t = time.perf_counter()
            for c in calls:
                c()
            return (time.perf_counter() - t) / len(calls)

    log: list[str] = []
    best: dict[tuple, tuple] = {}
    summary: list[str] = []
    for kind, batch, context in shapes:
        sets, per_set = make_sets(torch, kind, batch, context, device)
        sdpa = timer(sdpa_calls(torch, sets, context)) if device == "cuda" else float("nan")
        grid = GRID[kind]
        stages = (3,) if args.quick or args.smoke else grid["num_stages"]
        pps = (4, 8) if args.quick else PPS
        seen = set()
        for bn, warps, st, p in itertools.product(grid["block_n"], grid["num_warps"], stages, pps):
            q0, k0, v0, _t0, _l0, vd0 = sets[0]
            cfg = pd.launch_config(
                batch=batch,
                q_heads=q0.shape[1],
                kv_heads=k0.shape[2],
                head_dim=k0.shape[3],
                page=PAGE,
                v_dim=vd0 or k0.shape[3],
                max_len=context,
                sms=sms,
                compute=pd.compute_dtype(q0.dtype, k0.dtype),
                kv_element_bytes=k0.element_size(),
                arch=arch,
                block_n=bn,
                num_warps=warps,
                num_stages=st,
                programs_per_sm=p,
            )
            key = (bn, cfg.num_warps, st, cfg.splits)
            if key in seen:  # another split target that gives the same grid
                continue
            seen.add(key)
            calls = [
                lambda q=q, k=k, v=v, t=t, n=n, vd=vd, bn=bn, w=warps, st=st, p=p, c=context: pd.paged_decode(
                    q,
                    k,
                    v,
                    t,
                    n,
                    v_dim=vd,
                    max_seq_len=c,
                    block_n=bn,
                    num_warps=w,
                    num_stages=st,
                    programs_per_sm=p,
                )
                for q, k, v, t, n, vd in sets
            ]
            try:
                sec = timer(calls)
            except Exception as e:  # a setting that does not compile or launch (shared memory)
                log.append(
                    f"| {kind} | {batch} | {context:,} | {bn} | {warps} | {st} | {p} | - | - | - | "
                    f"{type(e).__name__}: {str(e).splitlines()[0][:60] if str(e) else ''} |"
                )
                continue
            gbs = per_set / sec / 1e9
            log.append(
                f"| {kind} | {batch} | {context:,} | {bn} | {cfg.num_warps} | {st} | {p} | {cfg.splits} | "
                f"{sec * 1e3:.4f} | {gbs:,.0f} | {sdpa / sec:.2f}x |"
            )
            shape = (kind, batch, context)
            if shape not in best or sec < best[shape][0]:
                best[shape] = (sec, bn, cfg.num_warps, st, p, cfg.splits, sdpa, gbs)
        print(f"{kind} b{batch} c{context}: {len(seen)} settings, {len(sets)} input sets", flush=True)
        del sets
        if device == "cuda":
            torch.cuda.empty_cache()
        summary = report(best, log, args.out)  # after every shape: a run cut short keeps what it measured
    print("\n".join(summary))


if __name__ == "__main__":
    main()
