"""The bounds every input is checked against at the edge (README, Limits).

Planning cost must not grow with an absurd claim: a spec of 10^12 layers, a 10^9-GPU search or a
10,000-deep JSON file is refused with one line before any work, never looped over.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

from kvplan.errors import SpecError, UsageError

MAX_FILE_BYTES = 8 * 2**20  # spec YAML, config.json, profiles, overheads
MAX_INDEX_FILE_BYTES = 64 * 2**20  # model.safetensors.index.json lists every tensor
MAX_LOG_BYTES = 64 * 2**20  # a pasted startup log
MAX_NESTING = 64  # JSON/YAML containers inside one another
MAX_YAML_NODES = 2**20  # values a YAML file's aliases may expand to (a "billion laughs" is refused)
MAX_NAME_CHARS = 255  # a --model/--gpus value (a file name's limit)
MAX_VERSION_CHARS = 32

MAX_LAYERS = 4096
MAX_HEADS = 2**16  # attention and KV heads, experts
MAX_DIM = 2**20  # head dims, hidden and intermediate sizes, latent ranks
MAX_VOCAB = 2**26
MAX_TOKENS = 2**31  # contexts, windows, batched tokens
MAX_BYTES = 2**60  # any byte count (memory, state, weights)
MAX_GPUS = 4096  # GPUs of one deployment, and solve's --max-gpus
MAX_NODES = 512
MAX_USERS = 2**31
MAX_GIB = 2**30  # a GiB figure typed as a number (--cpu-offload-gb): MAX_BYTES in GiB
# engine steps a simulation may need at the least (its prompt tokens over the step's token budget):
# about 100 s at the simulator's ~100 us a step; more is refused before the run, never waited out
MAX_SIM_STEPS = 1_000_000


def limit_for(name: str) -> int:
    """The largest value of an integer field, by its name in a spec or a config.json."""
    low = name.lower()
    if any(w in low for w in ("bytes", "params", "flops")):
        return MAX_BYTES
    if "vocab" in low:
        return MAX_VOCAB
    if any(w in low for w in ("size", "dim", "rank", "channels", "kernel")):
        return MAX_DIM
    if "layer" in low:
        return MAX_LAYERS
    if any(w in low for w in ("head", "expert", "group")):
        return MAX_HEADS
    return MAX_TOKENS  # contexts, windows, chunks, ratios, counts


def check_range(value: int, what: str, low: int, high: int) -> int:
    if value < low:
        raise UsageError(f"{what} must be >= {low}")
    if value > high:
        raise UsageError(f"{what} must be at most {high:,}, got {value:,}")
    return value


def check_number(value: float, what: str, low: float, high: float, hint: str) -> float:
    """A typed number within [low, high]; NaN and infinities are refused with the same one line."""
    if not math.isfinite(value) or not low <= value <= high:
        raise UsageError(f"{what} must be between {low:g} and {high:,g}, got {value}; {hint}")
    return value


def read_regular(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """A regular file's bytes, at most `limit` of them: FIFOs, devices and directories are refused
    before they can block or stream forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # checked on the fd: fdopen raises on a directory
            what = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise SpecError(f"{path}: {what}; give a file kvplan can read")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as fh:
        if info.st_size > limit:
            raise SpecError(
                f"{path}: {info.st_size:,} bytes is over kvplan's limit of {limit:,}; is it the right file?"
            )
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise SpecError(f"{path}: over kvplan's limit of {limit:,} bytes; is it the right file?")
    return data


def nesting_depth_ok(data: Any, limit: int = MAX_NESTING) -> bool:
    """Whether lists/dicts nest at most `limit` deep (iterative: no recursion on hostile input)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return False
            items = value.values() if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in items if isinstance(v, (dict, list)))
    return True


def check_nesting(data: Any, where: Path | str) -> Any:
    if not nesting_depth_ok(data):
        raise SpecError(f"{where}: nested more than {MAX_NESTING} levels deep; is it the right file?")
    return data
