"""Calibration: what this machine measured, and measuring it.

Owns the profile (calibration.py: its records, YAML form, checks, and the lookups the step model
reads; never imports torch) and the measuring (run.py: the attention kernel sweep, the whole
`kvplan calibrate`; gemm.py: GEMMs and launch overhead; dist.py: all-reduces under torchrun;
device.py: torch, this device and its blank profile). torch and triton are imported only inside
the measuring functions. May import: the base modules, kvplan.specs, kvplan.model, kvplan.kernels.
"""
