"""Byte quantities: parsing user input and formatting for output.

Bytes are integers everywhere inside kvplan; GiB (2**30) and GB (10**9) only
appear at the edges, and are never mixed up.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from kvplan.errors import UsageError
from kvplan.limits import MAX_BYTES, MAX_TOKENS

KiB = 2**10
MiB = 2**20
GiB = 2**30
TiB = 2**40
KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12

_UNITS = {
    "": 1,
    "b": 1,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": TiB,
    "kb": KB,
    "mb": MB,
    "gb": GB,
    "tb": TB,
}
_COUNT_RE = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(e[+-]?[0-9]{1,3})?$")
_BYTES_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str, what: str = "size") -> int:
    """Parse '51.02GiB', '40GB', '40 GB', '1.5e9' or a plain byte count into bytes."""
    match = _BYTES_RE.match(str(text))
    unit = match.group(3).lower() if match else ""
    if not match or unit not in _UNITS:
        raise UsageError(
            f"{what}: cannot read {text!r} as a size; write e.g. 51.02GiB, 40GB or 42949672960 "
            "(GiB/MiB/KiB are powers of 2, GB/MB/KB powers of 10)"
        )
    exponent = match.group(2) or "0"
    if len(exponent.lstrip("+-")) > 3:
        raise UsageError(f"{what}: {text!r} is out of range (at most {fmt_bytes(MAX_BYTES)})")
    value = Decimal(match.group(1)) * Decimal(10) ** int(exponent) * _UNITS[unit]
    if value > MAX_BYTES:
        raise UsageError(f"{what}: {text!r} is out of range (at most {fmt_bytes(MAX_BYTES)})")
    return int(value.to_integral_value(rounding=ROUND_HALF_EVEN))


def parse_count(text: str, what: str = "count", limit: int = MAX_TOKENS) -> int:
    """Parse a token count such as '8192', '8K', '128k', '1M' (K = 1024, M = 1024**2), at most `limit`."""
    s = str(text).strip().lower().replace("_", "").replace(",", "")
    scale = 1
    if s.endswith("k"):
        s, scale = s[:-1], 1024
    elif s.endswith("m"):
        s, scale = s[:-1], 1024**2
    if not _COUNT_RE.match(s):
        raise UsageError(f"{what}: cannot read {text!r} as a number; write e.g. 8192 or 8K")
    try:
        value = Decimal(s) * scale
    except (InvalidOperation, ValueError):
        raise UsageError(f"{what}: cannot read {text!r} as a number; write e.g. 8192 or 8K") from None
    if value != value.to_integral_value() or value < 0:
        raise UsageError(f"{what}: {text!r} is not a whole non-negative number")
    if value > limit:
        raise UsageError(f"{what}: {text!r} is over kvplan's limit of {limit:,}")
    return int(value)


def fmt_gib(num_bytes: float, digits: int = 2) -> str:
    return f"{num_bytes / GiB:,.{digits}f} GiB"


def fmt_bytes(num_bytes: float) -> str:
    """Binary units, picked by size: 512 B, 320 KiB, 4.50 MiB, 2.50 GiB."""
    n = float(num_bytes)
    if abs(n) < KiB:
        return f"{n:,.0f} B" if n == int(n) else f"{n:,.2f} B"
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            v = n / size
            text = f"{v:,.0f}" if v == int(v) else f"{v:,.2f}"
            return f"{text} {unit}"
    raise AssertionError("unreachable")


def fmt_rate(value: float, digits: int) -> str:
    """A rate with `digits` decimals, or with two significant figures where those would print a non-zero
    rate as 0 (0.001 req/s, not 0.00)."""
    if 0 < abs(value) < 10**-digits * 0.5:
        return f"{value:.2g}"
    return f"{value:,.{digits}f}"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def ordinal(n: int) -> str:
    """2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def plural(n: int, word: str) -> str:
    """'1 token', '16 tokens', '1 request'."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def printable(text: str) -> str:
    """`text` with control characters (an escape sequence in a file name, a newline) shown as '?': what a
    saved file or a profile names is printed, never executed by the terminal."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


# the curves' glyphs where the output's encoding has no box or block characters (LC_ALL=C, PYTHONIOENCODING=ascii)
_ASCII = str.maketrans({"│": "|", "└": "+", "─": "-", "▁": ".", "▂": ":", "▃": "-", "▄": "=", "▅": "+", "▆": "*",
                        "▇": "#", "█": "@"})  # fmt: skip


def plain_text(text: str, encoding: str | None) -> str:
    """`text` as the output's encoding can print it: box and block glyphs as ASCII where it is not UTF."""
    if (encoding or "").lower().replace("-", "").replace("_", "").startswith("utf"):
        return text
    return text.translate(_ASCII)
