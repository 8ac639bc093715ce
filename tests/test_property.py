"""Property tests: the plan is monotone in GPUs, KV bits and context."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.errors import InfeasibleError
from kvplan.plan.plan import PlanRequest, estimate
from kvplan.specs.registry import load_gpu, load_model

MODELS = [
    "llama3-8b",
    "qwen3-32b",
    "deepseek-v2-lite",
    "gemma2-27b",
    "gpt-oss-20b",
    "mixtral-8x7b",
    "qwen3-8b",
]
GPUS = ["H100", "A100-80GB", "L40S", "H200"]
# ordered from most to fewest bits per value
DTYPES = ["fp32", "bf16", "fp8", "int8", "int4", "int2"]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def users(model: str, gpu: str, **kw) -> int:
    """Concurrent requests of the cluster; an infeasible plan serves nobody."""
    spec = load_model(model)
    kw.setdefault("max_model_len", min(spec.max_context, 8192))
    try:
        return estimate(PlanRequest(model=spec, gpu=load_gpu(gpu), **kw)).max_concurrency
    except InfeasibleError:
        return 0


@SETTINGS
@given(st.sampled_from(MODELS), st.sampled_from(GPUS), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 3]))
def test_more_replicas_never_fewer_users(model, gpu, tp, replicas):
    assert users(model, gpu, num_gpus=tp * (replicas + 1), tp=tp) >= users(
        model, gpu, num_gpus=tp * replicas, tp=tp
    )


@SETTINGS
@given(st.sampled_from(MODELS), st.sampled_from(GPUS), st.sampled_from([1, 2, 4]))
def test_more_tensor_parallel_gpus_never_fewer_users(model, gpu, tp):
    spec = load_model(model)
    if spec.num_attention_heads % (2 * tp):
        return
    assert users(model, gpu, num_gpus=2 * tp, tp=2 * tp) >= users(model, gpu, num_gpus=tp, tp=tp)


@SETTINGS
@given(
    st.sampled_from(MODELS),
    st.sampled_from(GPUS),
    st.integers(0, len(DTYPES) - 2),
    st.sampled_from([1, 2, 4, 8]),
)
def test_fewer_kv_bits_never_fewer_users(model, gpu, i, num_gpus):
    more_bits = users(model, gpu, num_gpus=num_gpus, kv_cache_dtype=DTYPES[i])
    fewer_bits = users(model, gpu, num_gpus=num_gpus, kv_cache_dtype=DTYPES[i + 1])
    assert fewer_bits >= more_bits


@SETTINGS
@given(
    st.sampled_from(MODELS),
    st.sampled_from(GPUS),
    st.integers(2, 32768),  # a 1-token context holds no request (a prompt and a generated token): refused
    st.integers(2, 32768),
    st.sampled_from([1, 16, 32]),
)
def test_longer_context_never_more_users(model, gpu, a, b, block_size):
    short, long_ = sorted((a, b))
    spec = load_model(model)
    long_ = min(long_, spec.max_context)
    short = min(short, long_)
    kw = {"num_gpus": 8, "block_size": block_size}
    assert users(model, gpu, max_model_len=short, **kw) >= users(model, gpu, max_model_len=long_, **kw)


@SETTINGS
@given(st.sampled_from(MODELS), st.sampled_from(["bf16", "fp8", "int4"]), st.integers(1, 131072))
def test_kv_per_request_is_monotone_in_context(model, dtype, context):
    from kvplan.formats import kv_format
    from kvplan.model import kv

    spec = load_model(model)
    fmt = kv_format(dtype, spec.activation_dtype)
    assert kv.sequence_bytes(spec.layers, fmt, context + 1) >= kv.sequence_bytes(spec.layers, fmt, context)
