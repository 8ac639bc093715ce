"""Paged decode attention in Triton: one query token per sequence, K/V in pages.

Cache layout `[num_blocks, page_size, num_kv_heads, head_dim]` (vLLM's flash layout): the
head_dim values of one token and head are contiguous, so a tile of tokens is a strided gather
of contiguous rows, addressed through each sequence's block table.

Design (README, Where the decode-kernel efficiency figures come from; FlashInfer, arXiv:2501.01005):
- GQA packing: a program serves all query heads of one KV head, so each K/V tile is read
  once; the head group is padded to 16 for `tl.dot`.
- Split-K: each sequence's context is cut into chunks handled by separate programs that write
  a partial output and its log-sum-exp; a second kernel merges them. Long contexts at small
  batch then fill the GPU.
- Quantized KV (fp8 e4m3/e5m2, int8) is upcast in the kernel; the K scale is folded into the
  softmax scale and the V scale applied to the merged output.
- MLA: one latent "head" (kv_lora_rank + rope = 512 + 64 values) serves every query head; K is
  the whole latent, V its first `v_dim` (512) values, read from the same cache. A head size
  that is not a power of two is split into a power-of-two main part and tail (576 = 512 + 64).

Runs under Triton 3.6 and 3.9; on the CPU through TRITON_INTERPRET=1.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

KV_DTYPES = {
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
    torch.float32: tl.float32,
    torch.int8: tl.bfloat16,
}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        KV_DTYPES[getattr(torch, _name)] = tl.bfloat16
Q_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = 1.4426950408889634
MIN_SPLIT_TOKENS = 256  # below this a split does too little work to pay for its merge
# the merge kernel's launch: a tile of at most 4K fp32 values is 32 registers a thread at 4 warps
MERGE_WARPS, MERGE_STAGES = 4, 2
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _split_kernel(
    Q,
    K,
    V,
    BT,
    SEQ,
    OUT_PART,
    LSE_PART,
    qk_scale,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kp,
    stride_kh,
    stride_vb,
    stride_vp,
    stride_vh,
    stride_btb,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    split_tokens,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    CHUNKS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_MAIN: tl.constexpr,
    D_TAIL: tl.constexpr,
    V_DIM: tl.constexpr,
    DV: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1) // CHUNKS  # a KV head's query heads may be served by CHUNKS programs
    chunk = tl.program_id(1) % CHUNKS
    sp = tl.program_id(2)
    seq_len = tl.load(SEQ + b)
    start = sp * split_tokens
    end = tl.minimum(start + split_tokens, seq_len)

    offs_g = chunk * GROUP_PAD + tl.arange(0, GROUP_PAD)
    gmask = offs_g < GROUP
    heads = kvh * GROUP + offs_g
    offs_d = tl.arange(0, D_MAIN)
    dmask = offs_d < HEAD_DIM
    q = tl.load(
        Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=gmask[:, None] & dmask[None, :],
        other=0.0,
    ).to(COMPUTE)
    if D_TAIL > 0:
        offs_t = D_MAIN + tl.arange(0, D_TAIL)
        q_tail = tl.load(
            Q + b * stride_qb + heads[:, None] * stride_qh + offs_t[None, :], mask=gmask[:, None], other=0.0
        ).to(COMPUTE)
    offs_v = tl.arange(0, DV)
    vmask = offs_v < V_DIM

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, DV], dtype=tl.float32)
    for t0 in range(start, end, BLOCK_N):
        offs_n = t0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < end
        blk = tl.load(BT + b * stride_btb + offs_n // PAGE, mask=nmask, other=0).to(tl.int64)
        slot = offs_n % PAGE
        row_k = K + blk * stride_kb + slot * stride_kp + kvh * stride_kh
        k = tl.load(row_k[:, None] + offs_d[None, :], mask=nmask[:, None] & dmask[None, :], other=0.0)
        if COMPUTE == tl.float32:
            qk = tl.dot(q, tl.trans(k.to(COMPUTE)), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k.to(COMPUTE)))
        if D_TAIL > 0:
            k_tail = tl.load(row_k[:, None] + offs_t[None, :], mask=nmask[:, None], other=0.0)
            if COMPUTE == tl.float32:
                qk += tl.dot(q_tail, tl.trans(k_tail.to(COMPUTE)), input_precision="ieee")
            else:
                qk += tl.dot(q_tail, tl.trans(k_tail.to(COMPUTE)))
        qk = tl.where(nmask[None, :], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        row_v = V + blk * stride_vb + slot * stride_vp + kvh * stride_vh
        v = tl.load(row_v[:, None] + offs_v[None, :], mask=nmask[:, None] & vmask[None, :], other=0.0)
        if COMPUTE == tl.float32:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(COMPUTE), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(COMPUTE), v.to(COMPUTE))
        m_i = m_new

    has = l_i > 0.0  # an empty split (past the sequence's end) contributes nothing
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.math.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    o_ptrs = OUT_PART + b * stride_ob + heads[:, None] * stride_oh + sp * stride_os + offs_v[None, :]
    tl.store(o_ptrs, out, mask=gmask[:, None] & vmask[None, :])
    tl.store(LSE_PART + b * stride_lb + heads * stride_lh + sp, lse, mask=gmask)


@triton.jit
def _merge_kernel(
    OUT_PART,
    LSE_PART,
    OUT,
    v_scale,
    num_splits,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    V_DIM: tl.constexpr,
    DV: tl.constexpr,
    SPLITS_BLOCK: tl.constexpr,
):
    # the splits in blocks of SPLITS_BLOCK x DV values: MLA's 128 splits x 512 in one tile spilled
    # (kernels/aot_check.py); pass 1 finds the largest log-sum-exp, pass 2 sums the weighted parts
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_v = tl.arange(0, DV)
    vmask = offs_v < V_DIM
    lse_row = LSE_PART + b * stride_lb + h * stride_lh
    m_blk = tl.full([SPLITS_BLOCK], float("-inf"), dtype=tl.float32)
    for s0 in range(0, num_splits, SPLITS_BLOCK):
        offs_s = s0 + tl.arange(0, SPLITS_BLOCK)
        m_blk = tl.maximum(m_blk, tl.load(lse_row + offs_s, mask=offs_s < num_splits, other=float("-inf")))
    m = tl.max(m_blk, 0)
    acc = tl.zeros([DV], dtype=tl.float32)
    w_sum = tl.zeros([SPLITS_BLOCK], dtype=tl.float32)
    for s0 in range(0, num_splits, SPLITS_BLOCK):
        offs_s = s0 + tl.arange(0, SPLITS_BLOCK)
        smask = offs_s < num_splits
        lse = tl.load(lse_row + offs_s, mask=smask, other=float("-inf"))
        w = tl.where(lse > float("-inf"), tl.math.exp2(lse - m), 0.0)
        parts = tl.load(
            OUT_PART + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_v[None, :],
            mask=smask[:, None] & vmask[None, :],
            other=0.0,
        )
        acc += tl.sum(parts * w[:, None], 0)
        w_sum += w
    out = acc / tl.sum(w_sum, 0) * v_scale
    tl.store(OUT + b * stride_ob + h * stride_oh + offs_v, out.to(OUT.dtype.element_ty), mask=vmask)


def _dims(head_dim: int) -> tuple[int, int]:
    """(main, tail): a power-of-two main part and a power-of-two tail of at least 16 (576 = 512 + 64),
    or the next power of two with the excess masked."""
    main = 1 << (head_dim.bit_length() - 1)
    tail = head_dim - main
    if tail == 0:
        return max(main, 16), 0
    if tail >= 16 and tail & (tail - 1) == 0:
        return main, tail
    return triton.next_power_of_2(head_dim), 0


def _bad(msg: str) -> None:
    raise ValueError(f"paged_decode: {msg}")


def _check_shapes(q, k_cache, v_cache, block_table, seq_lens, v_dim) -> None:
    if q.dim() != 3:
        _bad(f"q must be [batch, q_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or v_cache.dim() != 4:
        _bad("k_cache and v_cache must be [num_blocks, page_size, kv_heads, head_dim]")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        _bad(
            f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} disagree on blocks/page/heads"
        )
    if q.shape[-1] != k_cache.shape[-1]:
        _bad(f"q head_dim {q.shape[-1]} != k_cache head_dim {k_cache.shape[-1]}")
    if q.shape[1] % k_cache.shape[2]:
        _bad(f"{q.shape[1]} query heads are not a multiple of {k_cache.shape[2]} KV heads")
    if v_dim is not None and not 1 <= v_dim <= v_cache.shape[-1]:
        _bad(f"v_dim {v_dim} outside 1..{v_cache.shape[-1]}")
    if (
        block_table.dim() != 2
        or seq_lens.dim() != 1
        or block_table.shape[0] != q.shape[0] != seq_lens.shape[0]
    ):
        _bad("block_table must be [batch, max_pages] and seq_lens [batch]")


def _check_storage(q, k_cache, v_cache, block_table, seq_lens) -> None:
    if q.dtype not in Q_DTYPES:
        _bad(f"q dtype {q.dtype} not supported (fp16, bf16, fp32)")
    if k_cache.dtype not in KV_DTYPES or v_cache.dtype != k_cache.dtype:
        _bad(f"KV dtype {k_cache.dtype}/{v_cache.dtype} not supported or mixed")
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        _bad("block_table and seq_lens must be int32")
    devices = {t.device for t in (q, k_cache, v_cache, block_table, seq_lens)}
    if len(devices) != 1:
        _bad(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table)):
        if t.stride(-1) != 1:
            _bad(f"{name} must be contiguous in its last dimension")
    if seq_lens.stride(0) != 1:
        _bad("seq_lens must be contiguous")


def _check(q, k_cache, v_cache, block_table, seq_lens, v_dim) -> None:
    _check_shapes(q, k_cache, v_cache, block_table, seq_lens, v_dim)
    _check_storage(q, k_cache, v_cache, block_table, seq_lens)


def compute_dtype(q_dtype: torch.dtype, kv_dtype: torch.dtype, interpreted: bool = INTERPRETED):
    """The dtype tl.dot multiplies in: the cache's 16-bit type (tensor cores), fp32 for fp32 inputs.
    Triton's CPU interpreter has no bf16 arithmetic (numpy has none), so it computes in fp32."""
    if q_dtype == torch.float32 or kv_dtype == torch.float32 or interpreted:
        return tl.float32
    return KV_DTYPES[kv_dtype]


def split_plan(batch: int, kv_heads: int, max_len: int, block_n: int, programs: int) -> tuple[int, int]:
    """(number of splits, tokens per split): enough programs to fill the device, each split at
    least MIN_SPLIT_TOKENS long, tokens per split a multiple of the tile."""
    per_split = batch * kv_heads
    splits = 1 if per_split >= programs else math.ceil(programs / per_split)
    splits = max(1, min(splits, math.ceil(max_len / MIN_SPLIT_TOKENS)))
    tokens = math.ceil(max_len / splits)
    tokens = math.ceil(tokens / block_n) * block_n
    return math.ceil(max_len / tokens), tokens


@dataclass(frozen=True)
class Tuning:
    """Launch settings for one GPU architecture and cache kind (kernels/launch.yaml)."""

    block_n: int
    num_warps: int
    num_stages: int
    programs_per_sm: int
    source: str


TUNING_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.yaml")
_TUNING: dict[str, dict[str, Tuning]] | None = None


def _tunings() -> dict[str, dict[str, Tuning]]:
    global _TUNING
    if _TUNING is None:
        import yaml

        with open(TUNING_FILE, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
        _TUNING = {
            arch: {kind: Tuning(**{**cfg, "source": entry["source"]}) for kind, cfg in entry["kinds"].items()}
            for arch, entry in raw.items()
        }
    return _TUNING


# the K row each kind was tuned on (kernels/launch.yaml): 128 x 2 B, 128 x 1 B, MLA's 576 x 2 B; a wider
# row (head_dim 256, fp32 KV) takes a proportionally shorter tile, so a stage's shared memory stays
# what was compiled and measured
REFERENCE_ROW_BYTES = {"gqa16": 256, "gqa8": 128, "mla": 1152}


def cache_kind(head_dim: int, v_dim: int, kv_element_bytes: int) -> str:
    """The tuning table's kind: mla (one latent head, V inside K), gqa8 (fp8/int8 KV), gqa16."""
    if v_dim != head_dim:
        return "mla"
    return "gqa8" if kv_element_bytes == 1 else "gqa16"


def tuning(arch: int | None, kind: str) -> Tuning:
    """The launch settings measured for this architecture (compute capability x 10, e.g. 90), else
    the defaults."""
    table = _tunings()
    entry = table.get(f"sm{arch}") if arch is not None else None
    return (entry or table["default"]).get(kind) or table["default"][kind]


@dataclass(frozen=True)
class LaunchConfig:
    """What paged_decode() launches, decided without launching: the grids, the constexprs each kernel
    is compiled with, the tokens per split (a runtime argument) and the warps/stages (stated here so
    that the ahead-of-time check in kernels/aot_check.py compiles exactly what the launcher runs)."""

    splits: int
    tokens: int
    split_grid: tuple[int, int, int]
    split_constexprs: dict[str, Any]
    merge_grid: tuple[int, int]
    merge_constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 3


def launch_config(
    *,
    batch: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    page: int,
    v_dim: int,
    max_len: int,
    sms: int,
    compute: Any,
    kv_element_bytes: int = 2,
    arch: int | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    head_chunk: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    programs_per_sm: int | None = None,
) -> LaunchConfig:
    """The launch configuration of paged_decode() for these shapes on a device of `sms` multiprocessors
    of architecture `arch` (kernels/launch.yaml); `compute` is the dtype tl.dot multiplies in
    (compute_dtype()). Any setting given overrides the table's."""
    kind = cache_kind(head_dim, v_dim, kv_element_bytes)
    tuned = tuning(arch, kind)
    group = q_heads // kv_heads
    d_main, d_tail = _dims(head_dim)
    dv = max(16, triton.next_power_of_2(v_dim))
    if block_n is None:  # the tuned tile, halved until a row of it is no wider than the tuned kind's
        block_n = tuned.block_n
        row = (d_main + d_tail) * kv_element_bytes
        while block_n > 16 and block_n * row > tuned.block_n * REFERENCE_ROW_BYTES[kind]:
            block_n //= 2
    programs = (programs_per_sm or tuned.programs_per_sm) * sms
    splits, tokens = split_plan(batch, kv_heads, max_len, block_n, programs)
    if num_splits is not None:
        tokens = math.ceil(math.ceil(max_len / num_splits) / block_n) * block_n
        splits = math.ceil(max_len / tokens)
    group_pad = max(16, triton.next_power_of_2(group))
    if head_chunk is None:  # keep the fp32 accumulator within ~8K values a program (MLA: 16 heads x 512)
        head_chunk = max(16, min(group_pad, 8192 // dv))
    chunks = math.ceil(group / head_chunk)
    split_constexprs = {
        "GROUP": group,
        "GROUP_PAD": min(group_pad, head_chunk),
        "CHUNKS": chunks,
        "HEAD_DIM": head_dim,
        "D_MAIN": d_main,
        "D_TAIL": d_tail,
        "V_DIM": v_dim,
        "DV": dv,
        "PAGE": page,
        "BLOCK_N": block_n,
        "COMPUTE": compute,
    }
    # at most 4K partial values a merge tile (MLA: 8 splits x 512; 128 heads: 32 x 128)
    splits_block = max(2, min(triton.next_power_of_2(splits), 4096 // dv))
    merge_constexprs = {"V_DIM": v_dim, "DV": dv, "SPLITS_BLOCK": splits_block}
    # an 8K-value fp32 accumulator (MLA: 16 heads x 512) is 64 registers a thread with 4 warps, and
    # with the 576-wide K tile it spills on sm_100 (kernels/aot_check.py); 8 warps halve it
    wide = min(group_pad, head_chunk) * dv >= 8192
    warps = num_warps or tuned.num_warps
    return LaunchConfig(
        splits=splits,
        tokens=tokens,
        split_grid=(batch, kv_heads * chunks, splits),
        split_constexprs=split_constexprs,
        merge_grid=(batch, q_heads),
        merge_constexprs=merge_constexprs,
        num_warps=max(warps, 8) if wide else warps,
        num_stages=num_stages or tuned.num_stages,
    )


_DEVICES: dict[Any, tuple[int, int | None]] = {}


def _device(device: torch.device) -> tuple[int, int | None]:
    """(multiprocessors, architecture as capability x 10) of a CUDA device; the CPU interpreter: (2, None)."""
    if device.type != "cuda":
        return 2, None
    if device not in _DEVICES:
        props = torch.cuda.get_device_properties(device)
        _DEVICES[device] = (props.multi_processor_count, 10 * props.major + props.minor)
    return _DEVICES[device]


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    v_dim: int | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    max_seq_len: int | None = None,
    head_chunk: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    programs_per_sm: int | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its paged K/V; returns [batch, q_heads, v_dim] in q's dtype.

    `k_scale`/`v_scale` dequantize fp8/int8 caches (per-tensor); `v_dim` reads the first v_dim values
    of each V row (MLA: pass the latent cache as both k_cache and v_cache with v_dim=512);
    `max_seq_len` (else read from seq_lens, one device sync) sizes the split-K grid; `head_chunk`
    (a power of two >= 16) caps the query heads one program serves (default: as many as keep its
    accumulator near 8K values; each chunk re-reads its K/V). `block_n`, `num_warps`, `num_stages`
    and `programs_per_sm` override the settings kernels/launch.yaml gives this GPU's architecture.
    """
    _check(q, k_cache, v_cache, block_table, seq_lens, v_dim)
    batch, q_heads, head_dim = q.shape
    _, page, kv_heads, _ = k_cache.shape
    vd = v_dim or v_cache.shape[-1]
    max_len = int(seq_lens.max()) if max_seq_len is None else max_seq_len
    if max_len < 1 or (max_seq_len is None and int(seq_lens.min()) < 1):
        raise ValueError("paged_decode: every sequence needs at least one token")
    if max_len > block_table.shape[1] * page:
        raise ValueError(
            f"paged_decode: a sequence of {max_len} tokens needs more than "
            f"{block_table.shape[1]} pages of {page}"
        )
    if head_chunk is not None and (head_chunk < 16 or head_chunk & (head_chunk - 1)):
        raise ValueError(f"paged_decode: head_chunk must be a power of two >= 16, got {head_chunk}")
    sms, arch = _device(q.device)
    cfg = launch_config(
        batch=batch,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        page=page,
        v_dim=vd,
        max_len=max_len,
        sms=sms,
        compute=compute_dtype(q.dtype, k_cache.dtype),
        kv_element_bytes=k_cache.element_size(),
        arch=arch,
        num_splits=num_splits,
        block_n=block_n,
        head_chunk=head_chunk,
        num_warps=num_warps,
        num_stages=num_stages,
        programs_per_sm=programs_per_sm,
    )
    out_part = torch.empty(batch, q_heads, cfg.splits, vd, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(batch, q_heads, cfg.splits, dtype=torch.float32, device=q.device)
    sm_scale = head_dim**-0.5 if scale is None else scale
    _split_kernel[cfg.split_grid](
        q,
        k_cache,
        v_cache,
        block_table,
        seq_lens,
        out_part,
        lse_part,
        sm_scale * k_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_table.stride(0),
        out_part.stride(0),
        out_part.stride(1),
        out_part.stride(2),
        lse_part.stride(0),
        lse_part.stride(1),
        cfg.tokens,
        **cfg.split_constexprs,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    out = torch.empty(batch, q_heads, vd, dtype=q.dtype, device=q.device)
    _merge_kernel[cfg.merge_grid](
        out_part,
        lse_part,
        out,
        v_scale,
        cfg.splits,
        out_part.stride(0),
        out_part.stride(1),
        out_part.stride(2),
        lse_part.stride(0),
        lse_part.stride(1),
        out.stride(0),
        out.stride(1),
        **cfg.merge_constexprs,
        num_warps=MERGE_WARPS,
        num_stages=MERGE_STAGES,
    )
    return out
