"""Ahead-of-time compile check: every paged-decode kernel variant compiled for sm_80, sm_90 and sm_100
without a GPU, with the registers, spills and shared memory ptxas reports.

Each variant is a decode shape (KV dtype, GQA group, MLA); what gets compiled for it is what
paged_decode() would launch: the constexprs, warps and stages come from `launch_config()` in
paged_decode.py, the argument types and 16-byte divisibility from tensors of the launcher's layout
(on the `meta` device). `triton.compile(ASTSource, target=GPUTarget("cuda", arch, 32))` needs no CUDA
driver; the bundled ptxas then runs `-v` on the PTX. A variant fails on any spill, on shared memory
over the target's limit, or on a compile error; a KV dtype the target's Triton backend does not
support (fp8 e4m3 before sm_89) is reported as unsupported, not as a pass.

    python -m kvplan.kernels.aot_check                 # every variant x sm_80/sm_90/sm_100, a table
    python -m kvplan.kernels.aot_check --json          # the same as JSON lines
    python -m kvplan.kernels.aot_check --targets 90 --variants bf16-g8,mla-bf16

Run it without TRITON_INTERPRET=1 (the interpreter replaces the compiled kernels).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

# Maximum shared memory per thread block (opt-in), NVIDIA CUDA C++ Programming Guide, "Compute
# Capabilities", table "Technical Specifications per Compute Capability": 163 KB for 8.0, 227 KB for
# 9.0 and 10.0.
SMEM_LIMIT = {80: 163 * 1024, 90: 227 * 1024, 100: 227 * 1024}
# SMs of the reference part of each target (A100, H100 SXM, B200): the launcher's split heuristic
# wants 4 programs per SM
SMS = {80: 108, 90: 132, 100: 148}
TARGETS = (80, 90, 100)
# torch dtype name -> Triton's pointer type name
TYPE = {
    "float16": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "float8_e4m3fn": "fp8e4nv",
    "float8_e5m2": "fp8e5",
    "int8": "i8",
    "int32": "i32",
}


@dataclass(frozen=True)
class Variant:
    """A decode shape: one new token for each of `batch` sequences of `max_len` tokens."""

    name: str
    kv_dtype: str
    q_heads: int
    kv_heads: int
    head_dim: int
    v_dim: int
    batch: int = 1
    max_len: int = 32768
    page: int = 16

    @property
    def q_dtype(self) -> str:
        return "float16" if self.kv_dtype == "float16" else "bfloat16"


def _variants() -> tuple[Variant, ...]:
    """fp16/bf16/fp8/int8 KV x GQA groups 1/4/8/16 (8 KV heads x 128), and MLA (576-value latent,
    V its first 512, 16 query heads a GPU) in bf16 and fp8. Batch 1 at 32K: the most splits."""
    short = {"float16": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "fp8", "int8": "int8"}
    out = [Variant(f"{short[dt]}-g{g}", dt, 8 * g, 8, 128, 128) for dt in short for g in (1, 4, 8, 16)]
    out += [Variant(f"mla-{short[dt]}", dt, 16, 1, 576, 512) for dt in ("bfloat16", "float8_e4m3fn")]
    return tuple(out)


VARIANTS = _variants()


@dataclass(frozen=True)
class Result:
    variant: str
    kernel: str  # split / merge
    target: str  # sm_90a ...
    registers: int | None
    spill_bytes: int | None  # spill stores + spill loads
    shared: int | None  # Triton's dynamic shared memory + ptxas' static smem
    limit: int
    verdict: str  # ok / spills / smem / error / unsupported
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict not in ("ok", "unsupported")


def _sm(arch: int) -> str:
    return f"sm_{arch}{'a' if arch >= 90 else ''}"  # as triton.backends.nvidia.compiler names it


def _ptxas(arch: int) -> str:
    from triton.backends.nvidia import compiler as nv

    if hasattr(nv, "get_ptxas"):  # Triton >= 3.5: a separate ptxas for sm_90+
        return nv.get_ptxas(arch).path
    from triton import knobs

    return knobs.nvidia.ptxas.path


def _kernel_args(v: Variant, arch: int):
    """(kernel, argument values or dtype strings, constexprs, num_warps, num_stages) for both kernels."""
    import torch

    from kvplan.kernels import paged_decode as pd

    if pd.INTERPRETED:
        raise RuntimeError("aot_check: TRITON_INTERPRET=1 replaces the compiled kernels; unset it")
    kv_dtype, q_dtype = getattr(torch, v.kv_dtype), getattr(torch, v.q_dtype)
    cfg = pd.launch_config(
        batch=v.batch,
        q_heads=v.q_heads,
        kv_heads=v.kv_heads,
        head_dim=v.head_dim,
        page=v.page,
        v_dim=v.v_dim,
        max_len=v.max_len,
        sms=SMS[arch],
        compute=pd.compute_dtype(q_dtype, kv_dtype, interpreted=False),
        kv_element_bytes=kv_dtype.itemsize,
        arch=arch,
    )
    meta = {"device": "meta"}
    pages = math.ceil(v.max_len / v.page)
    q = torch.empty(v.batch, v.q_heads, v.head_dim, dtype=q_dtype, **meta)
    k = torch.empty(v.batch * pages, v.page, v.kv_heads, v.head_dim, dtype=kv_dtype, **meta)
    mla = v.v_dim != v.head_dim
    val = k if mla else torch.empty(k.shape[:3] + (v.v_dim,), dtype=kv_dtype, **meta)
    bt = torch.empty(v.batch, pages, dtype=torch.int32, **meta)
    seq = torch.empty(v.batch, dtype=torch.int32, **meta)
    part = torch.empty(v.batch, v.q_heads, cfg.splits, v.v_dim, dtype=torch.float32, **meta)
    lse = torch.empty(v.batch, v.q_heads, cfg.splits, dtype=torch.float32, **meta)
    out = torch.empty(v.batch, v.q_heads, v.v_dim, dtype=q_dtype, **meta)
    split = [q, k, val, bt, seq, part, lse, 1.0, *q.stride()[:2], *k.stride()[:3], *val.stride()[:3]]
    split += [bt.stride(0), *part.stride()[:3], *lse.stride()[:2], cfg.tokens]
    merge = [part, lse, out, 1.0, cfg.splits, *part.stride()[:3], *lse.stride()[:2], *out.stride()[:2]]
    return [
        ("split", pd._split_kernel, split, cfg.split_constexprs, (cfg.num_warps, cfg.num_stages)),
        ("merge", pd._merge_kernel, merge, cfg.merge_constexprs, (pd.MERGE_WARPS, pd.MERGE_STAGES)),
    ]


def _source(fn, args, constexprs):
    """Triton's ASTSource with the launcher's specialization: pointers and ints divisible by 16 marked."""
    import torch
    import triton

    sig: dict[str, str] = {}
    attrs = {}
    runtime = iter(args)
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
            continue
        a = next(runtime)
        if isinstance(a, torch.Tensor):
            sig[name] = "*" + TYPE[str(a.dtype).removeprefix("torch.")]
            aligned = True  # torch's allocations are 256-byte aligned
        elif isinstance(a, float):
            sig[name] = "fp32"
            aligned = False
        else:
            sig[name] = "i32"
            aligned = a % 16 == 0
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)


def _ptxas_v(ptx: str, arch: int) -> tuple[int, int, int]:
    """(registers, spill bytes, static smem bytes) from `ptxas -v` on the PTX."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [_ptxas(arch), "-lineinfo", "-v", f"--gpu-name={_sm(arch)}", src, "-o", src + ".o"]
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", log)
    if regs is None:
        raise RuntimeError(f"aot_check: no register count in ptxas output:\n{log}")
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    smem = re.search(r"(\d+) bytes smem", log)
    return int(regs.group(1)), spills, int(smem.group(1)) if smem else 0


def _unsupported(v: Variant, arch: int) -> str:
    """Why this target's Triton backend cannot take the variant's KV dtype, or ''."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    name = TYPE[v.kv_dtype]
    if not name.startswith("fp8"):
        return ""
    opts = make_backend(GPUTarget("cuda", arch, 32)).parse_options({})
    fp8 = getattr(opts, "supported_fp8_dtypes", ())
    return "" if name in fp8 else f"{name} KV is not supported on {_sm(arch)} (supported: {', '.join(fp8)})"


def _one(job: tuple[Variant, int]) -> list[Result]:
    import triton
    from triton.backends.compiler import GPUTarget

    v, arch = job
    limit, target = SMEM_LIMIT[arch], _sm(arch)
    why = _unsupported(v, arch)
    if why:
        return [
            Result(v.name, k, target, None, None, None, limit, "unsupported", why) for k in ("split", "merge")
        ]
    results = []
    for kernel, fn, args, constexprs, (warps, stages) in _kernel_args(v, arch):
        try:
            compiled = triton.compile(
                _source(fn, args, constexprs),
                target=GPUTarget("cuda", arch, 32),
                options={"num_warps": warps, "num_stages": stages},
            )
            regs, spills, smem = _ptxas_v(compiled.asm["ptx"], arch)
        except Exception as e:  # a compile error is a failed variant, reported with its first line
            msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
            results.append(Result(v.name, kernel, target, None, None, None, limit, "error", msg[:200]))
            continue
        shared = compiled.metadata.shared + smem
        verdict = "spills" if spills else "smem" if shared > limit else "ok"
        results.append(Result(v.name, kernel, target, regs, spills, shared, limit, verdict))
    return results


def check(targets=TARGETS, variants=VARIANTS, workers: int | None = None) -> list[Result]:
    """Compile every variant's split and merge kernels for every target (sm capability: 80, 90, 100)."""
    jobs = [(v, arch) for v in variants for arch in targets]
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    os.environ.setdefault(
        "TRITON_DEFAULT_FP_FUSION", "1"
    )  # Triton 3.9's default, stated (silences a warning)
    if workers <= 1:
        return [r for job in jobs for r in _one(job)]
    with ProcessPoolExecutor(workers) as pool:
        return [r for rs in pool.map(_one, jobs) for r in rs]


def table(results: list[Result]) -> str:
    head = ("variant", "kernel", "target", "registers", "spills", "shared", "limit", "verdict")
    rows = [head]
    for r in results:
        cells = (r.registers, r.spill_bytes, r.shared)
        shown = ["-" if c is None else str(c) for c in cells]
        verdict = r.verdict + (f" ({r.detail})" if r.detail else "")
        rows.append((r.variant, r.kernel, r.target, *shown, str(r.limit), verdict))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=False))
        )
        + "  "
        + row[-1]
        for row in rows
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kvplan.kernels.aot_check", description=__doc__.splitlines()[0]
    )
    p.add_argument("--targets", default=",".join(map(str, TARGETS)), help="capabilities, e.g. 80,90,100")
    p.add_argument("--variants", default="", help="variant names, comma-separated (default: all)")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--json", action="store_true", help="one JSON object a result")
    a = p.parse_args(argv)
    names = [n for n in a.variants.split(",") if n]
    unknown = sorted(set(names) - {v.name for v in VARIANTS})
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(v.name for v in VARIANTS)}")
    variants = tuple(v for v in VARIANTS if not names or v.name in names)
    import triton

    results = check(tuple(int(t) for t in a.targets.split(",")), variants, a.workers)
    if a.json:
        for r in results:
            print(json.dumps(asdict(r)))
    else:
        print(f"triton {triton.__version__}")
        print(table(results))
    failed = [r for r in results if r.failed]
    print(f"{len(results)} kernels, {len(failed)} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
