"""SGLang's memory settings by release: the default --mem-fraction-static, the chunked-prefill and
CUDA-graph defaults it is derived from, and the memory already in use when SGLang measures.

SGLang (model_executor/model_runner.py, profile_max_num_token) sizes its KV pool as
    rest = free_after_weights - free_at_start x (1 - mem_fraction_static),  tokens = rest // cell_size
where free_at_start is the free memory after torch.distributed and NCCL are up (init_torch_distributed,
logged as "Load weight begin. avail mem=X GB"); SGLang reserves nothing itself before that.

The rules below were read in the released wheels 0.4.0 to 0.5.23 (`pip download sglang==X`,
sglang/srt/server_args.py), sampling every release and post-release where the default block changed.
Pure functions; nothing here imports SGLang.
"""

from __future__ import annotations

import re

from kvplan.units import GiB

# (major, minor, patch, post); a release candidate's post is -1 (0.5.0rc2 -> (0, 5, 0, -1))
Release = tuple[int, int, int, int]

# where the default rule changed (server_args.py, diffed release by release)
TP_TABLE_BY_PARALLEL = (0, 4, 6, 2)  # the table keys on tp x pp; cards > 96 GiB get more
RESERVE_BY_CARD = (0, 4, 7, 1)  # reserve by card class instead of a table
RESERVE_BY_SETTINGS = (0, 5, 3, 0)  # reserve from chunked_prefill_size and cuda_graph_max_bs
PIECEWISE_GRAPHS = (0, 5, 10, 0)  # + a piecewise CUDA-graph reserve (not modelled)

# server_args.py 0.4.0-0.4.7: default fraction by TP size (tp x pp from 0.4.6.post2), largest first
TP_TABLE = ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))

_RELEASE = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.?(post|rc)(\d+))?")


def parse_release(text: str | None) -> Release | None:
    """'0.4.3.post4' -> (0, 4, 3, 4); '0.5' -> (0, 5, 0, 0); None or 'latest' -> None (the newest rule).
    The text was already checked by base.parse_version_text; unknown suffixes (+cu126) are ignored."""
    if text is None or text == "latest":
        return None
    m = _RELEASE.match(text.strip())
    if not m:
        return None
    major, minor, patch, kind, n = m.groups()
    post = -1 if kind == "rc" else int(n) if kind == "post" else 0
    return int(major), int(minor), int(patch or 0), post


def fmt_release(release: Release) -> str:
    major, minor, patch, post = release
    return f"{major}.{minor}.{patch}" + (".postN" if post > 0 else "rc" if post < 0 else "")


def is_newest_rule(release: Release | None) -> bool:
    return release is None or release >= RESERVE_BY_SETTINGS


def legacy_chunk_and_graph_bs(release: Release, gpu_mib: float, tp: int) -> tuple[int, int]:
    """Default chunked_prefill_size and cuda_graph_max_bs before 0.5.3 (server_args.py __post_init__)."""
    if release >= RESERVE_BY_CARD:
        # 0.4.7.post1-0.5.2: chunk by card class; graph bs 8 / 80 (TP >= 4) under 35 GiB, else 160
        chunk = 2048 if gpu_mib < 35 * 1024 else 8192 if gpu_mib < 160 * 1024 else 16384
        small = gpu_mib < 35 * 1024
    else:
        # 0.4.0-0.4.7: chunk 2048 under 25,000 MiB (16384 over 180,000 MiB from 0.4.7.0), else 8192;
        # graph bs 8 under 25,000 MiB (80 at TP >= 4 from 0.4.0.post2), else 160
        big = release >= (0, 4, 7, 0) and gpu_mib > 180_000
        chunk = 2048 if gpu_mib < 25_000 else 16384 if big else 8192
        small = gpu_mib < 25_000
    if not small:
        return chunk, 160
    return chunk, 80 if tp >= 4 and release >= (0, 4, 0, 2) else 8


def _table(parallel: int) -> float:
    return next(f for size, f in TP_TABLE if parallel >= size)


def legacy_fraction(release: Release, gpu_mib: float, tp: int, pp: int) -> tuple[float, float | None, str]:
    """(default mem_fraction_static, reserved MiB or None, the rule and its source) before 0.5.3."""
    if release >= RESERVE_BY_CARD:
        # server_args.py 0.4.7.post1-0.5.2: reserved MiB by card class, fraction rounded to 3 places
        parallel = tp * pp
        if gpu_mib < 35 * 1024:
            reserved = (2.8 + parallel / 10) * 1024
        elif gpu_mib < 90 * 1024:
            reserved = (9.5 + parallel / 2) * 1024
        elif gpu_mib < 160 * 1024:
            reserved = (12 + parallel / 2) * 1024
        else:
            reserved = 32 * 1024
        rule = "server_args.py 0.4.7.post1-0.5.2: (card - reserve by card class) / card"
        return round((gpu_mib - reserved) / gpu_mib, 3), reserved, rule
    if release >= TP_TABLE_BY_PARALLEL:
        # server_args.py 0.4.6.post2-0.4.7: table by tp x pp up to 81,920 MiB, else 0.88; cards > 180,000
        # MiB 0.79 (0.4.7.0); cards > 96 GiB min(f + 48 GiB x (1 - f) / card, (card - 18 GiB) / card)
        f = _table(tp * pp) if gpu_mib <= 81920 else 0.88
        rule = "server_args.py 0.4.6.post2-0.4.7: table by TP x PP"
        if release >= (0, 4, 7, 0) and gpu_mib > 180_000:
            return 0.79, None, "server_args.py 0.4.7: 0.79 on cards over 180,000 MiB"
        if gpu_mib > 96 * 1024:
            f = min(f + 48 * 1024 * (1 - f) / gpu_mib, (gpu_mib - 18 * 1024) / gpu_mib)
            rule = "server_args.py 0.4.6.post2-0.4.7: raised on cards over 96 GiB"
        return f, None, rule
    if release >= (0, 4, 6, 0) and gpu_mib > 81920:
        # server_args.py 0.4.6-0.4.6.post1: cards over 81,920 MiB keep 13 GiB back
        return (
            (gpu_mib - 13 * 1024) / gpu_mib,
            13 * 1024,
            "server_args.py 0.4.6-0.4.6.post1: (card - 13 GiB) / card",
        )
    # server_args.py 0.4.0-0.4.6.post1 (0.4.6: cards up to 81,920 MiB): by TP size alone
    return _table(tp), None, "server_args.py 0.4.0-0.4.6.post1: table by TP size"


# Memory in use when SGLang reads its free memory (after torch.distributed and NCCL start), fitted to
# the "Load weight begin. avail mem" lines of tests/fixtures/logs/real/sglang_*.log (no change by release
# seen between 0.4.1 and 0.5.2):
# - CUDA context and torch: 0.35 GiB (Llama-3.1-8B at TP 1 on an 80 GB card, ~0.4.1: 78.81 of 79.15-79.19
#   GiB free; QwQ-32B at TP 4 on L4, 0.4.3.post4: 21.63 of 22.03, NCCL's 0.05 included)
# - NCCL without NVLink-SHARP (PCIe, A100): 0.05 GiB (as vllm_memory.NCCL_OTHER_BYTES; the L4 log above)
# - NCCL with NVLink-SHARP (Hopper/Blackwell SXM) and the custom all-reduce buffers: 0.176 GiB a rank
#   (Grok-2 at TP 8 on H100, 0.5.2rc2: 77.43 of 79.19 GiB free: (1.76 - 0.35) / 8)
CUDA_CONTEXT_BYTES = int(0.35 * GiB)
NCCL_OTHER_BYTES = int(0.05 * GiB)
NCCL_NVLS_BYTES_PER_RANK = int(0.176 * GiB)
# AMD Instinct (ROCm), rank 0 of the Kimi-K2.5 log on 8x MI355X (SGLang 0.5.8.post1,
# tests/fixtures/logs/real/SOURCES.tsv): "Init torch distributed ends. mem usage=3.81 GB" (RCCL and the
# all-reduce buffers) and "Load weight begin. avail mem=283.56 GB" of 287.98 GiB, so 4.42 GiB in use, 0.61
# of it the HIP context and torch; the same author's GLM-5-FP8 log on the same machine prints 3.81 and
# 283.50 (its trial 1, sglang_0.5.9_glm-5-fp8_mi355x_tp8.md in the same fixtures). The distributed
# part is taken per TP rank (3.81 / 8), as NVLS is on NVIDIA: an assumption, no other TP seen
ROCM_CONTEXT_BYTES = int(0.61 * GiB)
RCCL_BYTES_PER_RANK = int(3.81 / 8 * GiB)
ROCM_STARTUP_SOURCE = "measured at TP 8 on MI355X, SGLang 0.5.8.post1; other TP sizes scaled per rank"


def startup_bytes(tp: int, pp: int, nvls: bool, amd: bool = False) -> int:
    """Memory already in use on each GPU when SGLang measures the free memory it calls total."""
    if tp * pp == 1:
        return ROCM_CONTEXT_BYTES if amd else CUDA_CONTEXT_BYTES
    if amd:
        return ROCM_CONTEXT_BYTES + RCCL_BYTES_PER_RANK * tp
    return CUDA_CONTEXT_BYTES + (NCCL_NVLS_BYTES_PER_RANK * tp if nvls else NCCL_OTHER_BYTES)


# Memory weight loading takes beyond the parameters themselves (rotary caches, allocator rounding, CUDA
# modules loaded on first use): "Load weight end ... mem usage" less the parameter bytes in three real
# logs: Llama-3.1-8B TP 1 0.13 GiB, DeepSeek-R1-Distill-Qwen-7B TP 1 0.21 GiB, QwQ-32B TP 4 0.28 GiB.
WEIGHT_LOAD_BYTES = int(0.2 * GiB)
