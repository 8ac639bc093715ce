"""Storage formats: how many bits a KV value or a weight takes, scales included.

A format is data: value bits plus an optional group-wise scale (and zero-point)
shared by `group_size` consecutive values. `int4` with an fp16 scale and an fp16
zero per group of 64 values costs 4 + 32/64 = 4.5 bits per value.
"""

from __future__ import annotations

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

    def vector_bits(self, num_values: int) -> int:
        """Bits to store one vector of `num_values` values; groups never straddle vectors."""
        bits = num_values * self.value_bits
        if self.group_size:
            bits += ceil_div(num_values, self.group_size) * (self.scale_bits + self.zero_bits)
        return bits

    @property
    def bits_per_value(self) -> Fraction:
        """Average bits per value for long vectors (group overhead spread out)."""
        if not self.group_size:
            return Fraction(self.value_bits)
        return Fraction(self.value_bits) + Fraction(self.scale_bits + self.zero_bits, self.group_size)

    def describe(self) -> str:
        if not self.group_size:
            return f"{self.name} ({self.value_bits} bits/value, no in-block scales)"
        extra = f"{self.scale_bits}-bit scale"
        if self.zero_bits:
            extra += f" + {self.zero_bits}-bit zero-point"
        return (
            f"{self.name} ({self.value_bits} bits/value + {extra} per {self.group_size} values"
            f" = {float(self.bits_per_value):g} bits/value)"
        )


# KV-cache dtypes. fp8 uses per-layer scalar scales, not stored in the blocks (vLLM, engines.md).
# int8 defaults to the same; int4/int2 default to an fp16 scale + fp16 zero per 64 values
# (KIVI-style group quantization, seed 000 15.7), overridable from the CLI.
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
# nvfp4: fp8 scale per 16 values.
WEIGHT_DTYPES: dict[str, Format] = {
    "fp32": Format("fp32", 32),
    "fp16": Format("fp16", 16),
    "bf16": Format("bf16", 16),
    "fp8": Format("fp8", 8, group_size=128 * 128, scale_bits=32),
    "int8": Format("int8", 8),
    "int4": Format("int4", 4, group_size=128, scale_bits=16, zero_bits=4),
    "mxfp4": Format("mxfp4", 4, group_size=32, scale_bits=8),
    "nvfp4": Format("nvfp4", 4, group_size=16, scale_bits=8),
}

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
    if base.value_bits >= 16 and group_size:
        raise UsageError(
            f"--kv-quant-group-size: {key} is not quantized; group scales apply to int8/int4/int2/fp8"
        )
    g = base.group_size if group_size is None else group_size
    if g < 0:
        raise UsageError("--kv-quant-group-size must be >= 0 (0 = one scalar scale per layer)")
    s = (base.scale_bits or 16) if scale_bits is None else scale_bits
    if zero_point is None:
        z = base.zero_bits if base.group_size else (s if key.startswith("int") else 0)
    else:
        z = s if zero_point else 0
    if g == 0:
        return Format(key, base.value_bits)
    return Format(key, base.value_bits, group_size=g, scale_bits=s, zero_bits=z)


def weight_format(name: str) -> Format:
    key = normalize_dtype_name(name)
    if key not in WEIGHT_DTYPES:
        raise UsageError(f"weight dtype: unknown {name!r}; choose one of {', '.join(WEIGHT_DTYPES)}")
    return WEIGHT_DTYPES[key]
