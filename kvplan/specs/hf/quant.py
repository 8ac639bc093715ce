"""Weight formats from a checkpoint's quantization_config."""

from __future__ import annotations

from typing import Any


def weight_dtypes(quant: Any, notes: list[str]) -> tuple[str | None, str | None]:
    if not isinstance(quant, dict) or not quant:
        return None, None
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8" or "fp8" in str(quant.get("fmt", "")):
        return "fp8", None
    if method == "mxfp4":  # gpt-oss: MoE experts in MXFP4, the rest unquantized
        return None, "mxfp4"
    bits = quant.get("bits") or quant.get("w_bit")
    if method in ("awq", "gptq", "marlin", "autoround") or bits == 4:
        return "int4", None
    if bits == 8:
        return "int8", None
    notes.append(f"quantization {method or quant!r} not modelled; weights counted at the activation dtype")
    return None, None
