"""kvplan's Triton kernels, installed as `kvplan.kernels` (torch/triton are imported lazily)."""
