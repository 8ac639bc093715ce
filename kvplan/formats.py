"""Storage formats: how many bits a KV value or a weight takes, scales included.

A format is data: value bits plus an optional group-wise scale (and zero-point)
shared by `group_size` consecutive values. `int4` with an fp16 scale and an fp16
zero per group of 64 values costs 4 + 32/64 = 4.5 bits per value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from kvplan.errors import UsageError
from kvplan.units import ceil_div


@dataclass(frozen=True)
class Format:
    name: str
    value_bits: int
    group_size: int = 0  # 0: no in-block scales (per-layer/per-tensor scalar, or none)
    scale_bits: int = 0
    zero_bits: int = 0
    block_rows: int = 1  # weights: a scale covers block_rows x group_size (2-D blocks, block fp8)
    tensor_scale_bits: int = 0  # weights: scalars per matrix (per-tensor scale, NVFP4 global scale)
    outer_group_size: int = 0  # weights: a second-level scale per this many values (bnb double quant)
    outer_scale_bits: int = 0

    def vector_bits(self, num_values: int) -> int:
        """Bits to store one vector of `num_values` values; groups never straddle vectors."""
        bits = num_values * self.value_bits
        if self.group_size:
            bits += ceil_div(num_values, self.group_size) * (self.scale_bits + self.zero_bits)
        return bits

    def matrix_bits(self, rows: int, cols: int) -> int:
        """Bits of one [rows, cols] weight (a Linear's [out, in]): groups run along a row and never
        straddle rows; 2-D blocks tile the matrix; per-tensor scalars counted once."""
        bits = rows * cols * self.value_bits + self.tensor_scale_bits
        if self.group_size:
            groups = ceil_div(rows, self.block_rows) * ceil_div(cols, self.group_size)
            bits += groups * (self.scale_bits + self.zero_bits)
        if self.outer_group_size:
            bits += ceil_div(rows * cols, self.outer_group_size) * self.outer_scale_bits
        return bits

    @property
    def bits_per_value(self) -> Fraction:
        """Average bits per value for long vectors (group overhead spread out)."""
        bits = Fraction(self.value_bits)
        if self.group_size:
            bits += Fraction(self.scale_bits + self.zero_bits, self.group_size * self.block_rows)
        if self.outer_group_size:
            bits += Fraction(self.outer_scale_bits, self.outer_group_size)
        return bits

    def describe(self) -> str:
        tensor = f" + {self.tensor_scale_bits}-bit scale per tensor" if self.tensor_scale_bits else ""
        if not self.group_size:
            return f"{self.name} ({self.value_bits} bits/value, no in-block scales{tensor})"
        extra = f"{self.scale_bits}-bit scale"
        if self.zero_bits:
            extra += f" + {self.zero_bits}-bit zero-point"
        if self.group_size >= PER_ROW:
            where = "per row"
        else:  # a 2-D block of block_rows x group_size counts as that many values
            where = f"per {self.group_size * self.block_rows} values"
        if self.outer_group_size:
            extra += f" (+ {self.outer_scale_bits}-bit per {self.outer_group_size} values)"
        return (
            f"{self.name} ({self.value_bits} bits/value + {extra} {where}{tensor}"
            f" = {float(self.bits_per_value):g} bits/value)"
        )


# group_size meaning "one scale per row" (per-channel): larger than any row, so one group per row.
PER_ROW = 1 << 30


# KV-cache dtypes. fp8 uses per-layer scalar scales, not stored in the blocks (vLLM; README, How the engines size their KV cache).
# int8 defaults to the same; int4/int2 default to an fp16 scale + fp16 zero per 64 values
# (KIVI-style group quantization, arXiv:2402.02750), overridable from the CLI.
KV_DTYPES: dict[str, Format] = {
    "fp32": Format("fp32", 32),
    "fp16": Format("fp16", 16),
    "bf16": Format("bf16", 16),
    "fp8": Format("fp8", 8),
    "fp8_e4m3": Format("fp8_e4m3", 8),
    "fp8_e5m2": Format("fp8_e5m2", 8),
    "int8": Format("int8", 8),
    "int4": Format("int4", 4, group_size=64, scale_bits=16, zero_bits=16),
    "int2": Format("int2", 2, group_size=64, scale_bits=16, zero_bits=16),
}
KV_DTYPE_CHOICES = ("auto", *KV_DTYPES)

# Weight formats as checkpoints store them.
# fp8: one fp32 scale per 128x128 block (DeepSeek-V3 style); int4: GPTQ/AWQ group 128 with an
# fp16 scale and a packed 4-bit zero; mxfp4: 8-bit shared exponent per 32 values (OCP MX spec);
# nvfp4: fp8 (e4m3) scale per 16 values + an fp32 global scale per tensor (NVIDIA ModelOpt).
WEIGHT_DTYPES: dict[str, Format] = {
    "fp32": Format("fp32", 32),
    "fp16": Format("fp16", 16),
    "bf16": Format("bf16", 16),
    "fp8": Format("fp8", 8, group_size=128, block_rows=128, scale_bits=32),
    "int8": Format("int8", 8),
    "int4": Format("int4", 4, group_size=128, scale_bits=16, zero_bits=4),
    "mxfp4": Format("mxfp4", 4, group_size=32, scale_bits=8),
    "nvfp4": Format("nvfp4", 4, group_size=16, scale_bits=8, tensor_scale_bits=32),
}
# Value widths a parametrised weight format name may start with (see weight_format).
_VALUE_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4, "int3": 3,
               "int2": 2, "nf4": 4, "fp4": 4}  # fmt: skip
_OPTION = re.compile(r"(g|b|s|z|t|q)(\d+)$|ch$")

_ALIASES = {
    "float32": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float8": "fp8",
    "fp8_e4m3fn": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
}


def normalize_dtype_name(name: str) -> str:
    key = name.strip().lower()
    return _ALIASES.get(key, key)


def kv_format(
    name: str,
    activation_dtype: str,
    group_size: int | None = None,
    scale_bits: int | None = None,
    zero_point: bool | None = None,
) -> Format:
    """The KV format for `--kv-cache-dtype` ('auto' = the model's activation dtype, as in vLLM)."""
    key = normalize_dtype_name(name)
    if key == "auto":
        key = normalize_dtype_name(activation_dtype)
    if key not in KV_DTYPES:
        raise UsageError(
            f"--kv-cache-dtype: unknown dtype {name!r}; choose one of {', '.join(KV_DTYPE_CHOICES)}"
        )
    base = KV_DTYPES[key]
    if group_size is None and scale_bits is None and zero_point is None:
        return base
    if base.value_bits >= 16 and (group_size or scale_bits is not None or zero_point):
        flag = "--kv-quant-group-size" if group_size else "--kv-quant-scale-bits" if scale_bits is not None else (
            "--kv-quant-zero-point")  # fmt: skip
        raise UsageError(f"{flag}: {key} is not quantized; group scales apply to int8/int4/int2/fp8")
    if zero_point and not key.startswith("int"):
        raise UsageError(
            f"--kv-quant-zero-point: {key} is a floating-point format, scaled without a zero point; "
            "zero points apply to int8/int4/int2"
        )
    g = base.group_size if group_size is None else group_size
    if g < 0:
        raise UsageError("--kv-quant-group-size must be >= 0 (0 = one scalar scale per layer)")
    s = (base.scale_bits or 16) if scale_bits is None else scale_bits
    if not 1 <= s <= 64:
        raise UsageError(f"--kv-quant-scale-bits must be between 1 and 64, got {s}")
    if g > 2**20:
        raise UsageError(f"--kv-quant-group-size must be at most {2**20:,}, got {g:,}")
    if zero_point is None:
        z = base.zero_bits if base.group_size else (s if key.startswith("int") else 0)
    else:
        z = s if zero_point else 0
    if g == 0:
        return Format(key, base.value_bits)
    return Format(key, base.value_bits, group_size=g, scale_bits=s, zero_bits=z)


def weight_format(name: str) -> Format:
    """A weight format by name: one of WEIGHT_DTYPES, or `<value>-<option>...` (README, Weight formats):
    g<N> a scale per N values of a row, ch one scale per row, b<N> per NxN block, s<bits> scale,
    z<bits> zero-point, t<bits> per-tensor scale, q<N> a second-level fp32 scale per N values."""
    key = normalize_dtype_name(name)
    if key in WEIGHT_DTYPES:
        return WEIGHT_DTYPES[key]
    base, *options = key.split("-")
    if base not in _VALUE_BITS or not options:
        raise UsageError(
            f"weight dtype: unknown {name!r}; choose one of {', '.join(WEIGHT_DTYPES)} "
            "or <value>-<options> such as int4-g128-s16-z4"
        )
    fields = {"group_size": 0, "block_rows": 1, "scale_bits": 16, "zero_bits": 0, "tensor_scale_bits": 0}
    outer = 0
    for opt in options:
        m = _OPTION.match(opt)
        if m is None or (m.group(2) is not None and int(m.group(2)) <= 0):
            raise UsageError(f"weight dtype {name!r}: unknown option {opt!r} (g/b/s/z/t/q + a number, or ch)")
        if opt == "ch":
            fields["group_size"] = PER_ROW
            continue
        letter, num = m.group(1), int(m.group(2))
        if letter == "b":
            fields["group_size"] = fields["block_rows"] = num
        elif letter == "q":
            outer = num
        else:
            fields[
                {"g": "group_size", "s": "scale_bits", "z": "zero_bits", "t": "tensor_scale_bits"}[letter]
            ] = num
    if not fields["group_size"]:
        fields["scale_bits"] = 0
    return Format(
        key, _VALUE_BITS[base], **fields, outer_group_size=outer, outer_scale_bits=32 if outer else 0
    )
