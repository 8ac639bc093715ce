"""--cpu-offload-gb: weights an engine keeps in CPU memory instead of on the GPU.

vLLM (vllm/model_executor/models/utils.py maybe_offload_to_cpu, limit set per worker from
cache_config.cpu_offload_gb * 1024**3 in vllm/v1/worker/gpu_model_runner.py) and SGLang
(python/sglang/srt/utils/offloader.py OffloaderV1, from server_args.cpu_offload_gb) move whole decoder
layers, one after another, while the bytes moved so far are below the limit: the last layer moved
may cross it. Each GPU worker (TP rank, PP stage) does so for its own share, so the limit is per GPU.
"""

from __future__ import annotations

from dataclasses import replace

from kvplan.model.weights import StageWeights
from kvplan.units import GiB, ceil_div


def offload_limit_bytes(cpu_offload_gb: float) -> int:
    return int(cpu_offload_gb * GiB)  # the engines' int(cpu_offload_gb * 1024**3)


def offloaded_bytes(layer_bytes: int, num_layers: int, limit_bytes: int) -> int:
    """Bytes of whole layers moved to CPU memory: layers are moved until the total reaches the limit."""
    if limit_bytes <= 0 or layer_bytes <= 0:
        return 0
    return min(num_layers, ceil_div(limit_bytes, layer_bytes)) * layer_bytes


def offload_stage(stage: StageWeights, head_bytes: int, limit_bytes: int) -> tuple[StageWeights, int]:
    """The stage's weights left on each GPU, and the bytes moved to CPU memory (per GPU)."""
    n = len(stage.layers)
    body = stage.bytes_per_gpu - stage.embedding_bytes_per_gpu - head_bytes
    if not n or body <= 0:
        return stage, 0
    layer_bytes = body // n
    moved = offloaded_bytes(layer_bytes, n, limit_bytes)
    kept_layers = n - moved // layer_bytes if layer_bytes else n
    return (
        replace(
            stage,
            bytes_per_gpu=stage.bytes_per_gpu - moved,
            offloaded_bytes_per_gpu=moved,
            expert_bytes_per_gpu=stage.expert_bytes_per_gpu * kept_layers // n,
        ),
        moved,
    )
