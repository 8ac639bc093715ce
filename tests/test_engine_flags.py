"""The engines' own flags (issue 12): --dtype, --cpu-offload-gb, SGLang's --max-total-tokens,
--max-running-requests and --chunked-prefill-size, vLLM's chunked-local hybrid gate (--env), SGLang
capping an oversized request, and check-log keeping the authoritative max_num_batched_tokens.

Each rule names the engine source it was read from in the code; the figures here are worked by hand.
"""

from __future__ import annotations

import math

import pytest

from helpers import REPO, plan
from kvplan.engines.base import parse_version_text
from kvplan.engines.sglang import memory_settings, request_limits
from kvplan.engines.vllm import CHUNKED_HYBRID_ENV, chunked_hybrid_default
from kvplan.errors import RequestDoesNotFit, UsageError
from kvplan.logs.logparse import parse
from kvplan.plan.offload import offloaded_bytes
from kvplan.specs.registry import load_gpu
from kvplan.units import GiB, MiB

LOGS = REPO / "tests" / "fixtures" / "logs" / "real"
HF = REPO / "tests" / "fixtures" / "hf" / "synthetic"  # trimmed configs (README there)

# --- check-log: the authoritative max_num_batched_tokens ------------------------------------------


def test_logparse_keeps_the_last_max_num_batched_tokens():
    # vLLM 0.11.2 prints "Chunked prefill is enabled with max_num_batched_tokens=2048" before the usage
    # context's defaults are applied (vllm/engine/arg_utils.py), then =8192 (`vllm serve` on an H200)
    text = (LOGS / "vllm_0.11.2_llama-3-8b-instruct_h200_tp1.log").read_text()
    assert text.index("max_num_batched_tokens=2048") < text.index("max_num_batched_tokens=8192")
    log = parse(text)
    assert log.get("max_num_batched_tokens") == 8192
    assert "max_num_batched_tokens=8192" in log.evidence["max_num_batched_tokens"]


def test_logparse_reads_the_new_settings():
    vllm = parse(
        "INFO [utils.py:253] non-default args: {'model': 'meta-llama/Meta-Llama-3-8B-Instruct', "
        "'dtype': 'float16', 'cpu_offload_gb': 12.5}\nGPU KV cache size: 10,000 tokens\n"
    )
    assert (vllm.get("dtype"), vllm.get("cpu_offload_gb")) == ("float16", 12.5)
    sglang = parse(
        "server_args=ServerArgs(model_path='Qwen/Qwen3-8B', max_total_tokens=20000, chunked_prefill_size=-1, "
        "max_running_requests=64, cpu_offload_gb=0)\nKV Cache is allocated. #tokens: 20000, K size: 1.40 GB, "
        "V size: 1.40 GB\n"
    )
    assert sglang.get("max_total_tokens") == 20000
    assert sglang.get("chunked_prefill_size") == -1  # chunking off: no batched-tokens figure
    assert sglang.get("max_num_batched_tokens") is None
    assert sglang.get("max_num_seqs") == 64


# --- vLLM: Llama-4's chunked-local attention and the hybrid KV cache manager -----------------------


@pytest.mark.parametrize(
    ("version", "allowed"),
    [("0.9", True), ("0.10.1", False), ("0.11", False), ("0.13", False), ("0.14", True), ("0.33", True)],
)
def test_chunked_hybrid_default_by_release(version, allowed):
    # vllm/envs.py: default "0" from PR #21761 (0.10.1), "1" from PR #29627 (0.14)
    assert chunked_hybrid_default(parse_version_text(version)) is allowed


# The Llama-4-Scout figures at 1M context, one budget under both managers. 45.1 GiB per GPU
# (48,425,756,262 B) on 8x H100 (TP 8: one KV head of 128 x 2 values x 2 B per layer):
# - manager off: a block = 48 layers x 16 x 512 B = 393,216 B -> 123,153 blocks; a request holds
#   1,048,576 / 16 = 65,536 -> 1.879 -> "1.88x";
# - manager on: 4 groups of 12 (12 full + 36 chunked), a block = 12 x 8,192 B = 98,304 B -> 492,612
#   blocks; a request is charged 65,536 + 3 x ceil(min(8,192 + 8,192, 1M) / 16) = 68,608 -> "7.18x".
SCOUT = ["-m", "llama4-scout", "-g", "8xH100", "--max-model-len", "1M", "--kv-cache-memory", "45.1GiB"]


@pytest.mark.parametrize(
    ("extra", "blocks", "concurrency", "env"),
    [
        (["--engine-version", "0.12"], 123_153, "1.88x", "0"),  # the default off: vLLM disables the manager
        ([], 492_612, "7.18x", "1"),  # vLLM 0.33: the default on
        (["--env", f"{CHUNKED_HYBRID_ENV}=0"], 123_153, "1.88x", "0"),
        (["--engine-version", "0.12", "--env", f"{CHUNKED_HYBRID_ENV}=1"], 492_612, "7.18x", "1"),
    ],
)
def test_llama4_scout_concurrency_follows_the_gate(cli, extra, blocks, concurrency, env):
    got = cli("estimate", *SCOUT, *extra, "--json").json()
    assert got["engine"]["num_blocks"] == blocks
    assert got["engine"]["log_lines"][-1].endswith(f"per request: {concurrency}")
    assert got["settings"]["engine_env"] == {CHUNKED_HYBRID_ENV: env}
    stated = [a for a in got["assumptions"] if CHUNKED_HYBRID_ENV in a]
    assert len(stated) == 1 and f"{CHUNKED_HYBRID_ENV}={env}" in stated[0]


def test_chunked_gate_is_stated_only_for_chunked_models(cli):
    got = cli("estimate", "-m", "llama3-8b", "--max-model-len", "8K", "--json").json()
    assert got["settings"]["engine_env"] == {}
    assert not any(CHUNKED_HYBRID_ENV in a for a in got["assumptions"])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--env", f"{CHUNKED_HYBRID_ENV}=yes"], "give 0 or 1"),
        (["--env", "VLLM_NOT_A_THING=1"], "kvplan models no such variable"),
        (["--env", "novalue"], "write NAME=VALUE"),
        (["--engine", "sglang", "--env", f"{CHUNKED_HYBRID_ENV}=1"], "is a vllm setting"),
    ],
)
def test_env_is_checked(cli, args, says):
    r = cli("estimate", "-m", "llama4-scout", "-g", "8xH100", "--max-model-len", "8K", *args)
    assert r.exit_code == 2 and says in r.stderr and "Traceback" not in r.stderr


# --- SGLang: an oversized request is capped, vLLM refuses ------------------------------------------


def test_sglang_request_limits():
    # managers/tp_worker.py: max_req_len = min(context_len - 1, max_total_num_tokens - 1); prompts 5 fewer
    assert request_limits(32_768, 31_943) == (31_942, 31_937)
    assert request_limits(8_192, 100_000) == (8_191, 8_186)


GEMMA_32K = ["-m", "gemma3-27b", "-g", "H100", "--max-model-len", "32K"]


def test_sglang_starts_and_caps_a_request_longer_than_its_pool(cli):
    got = cli("estimate", *GEMMA_32K, "--engine", "sglang", "--disable-hybrid-swa-memory", "--json")
    assert got.exit_code == 0
    plan_ = got.json()
    pool = plan_["engine"]["kv_cache_tokens"]
    assert pool < 32_768  # one 32K request does not fit: SGLang still starts
    details = plan_["engine"]["details"]
    assert (details["max_req_len"], details["max_req_input_len"]) == (pool - 1, pool - 6)
    assert plan_["settings"]["max_request_tokens"] == pool - 1
    assert plan_["settings"]["max_model_len"] == 32_768
    assert plan_["max_concurrency"] == 1
    warning = [a for a in plan_["assumptions"] if a.startswith("WARNING: SGLang starts")]
    assert len(warning) == 1 and f"max_req_len {pool - 1:,}" in warning[0]


def test_vllm_refuses_the_same_request(cli):
    r = cli("estimate", *GEMMA_32K, "--max-model-len", "40K", "--disable-hybrid-kv-cache-manager", "--json")
    assert r.exit_code == 3 and r.json()["error_type"] == "RequestDoesNotFit"
    with pytest.raises(RequestDoesNotFit):
        plan("gemma3-27b", max_model_len=40_960, disable_hybrid_kv_cache_manager=True)


# --- SGLang: --max-total-tokens, --max-running-requests, --chunked-prefill-size ---------------------


def test_max_total_tokens_caps_the_pool(cli):
    base = ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--engine", "sglang"]
    got = cli("estimate", *base, "--max-total-tokens", "20000", "--json").json()
    assert got["engine"]["kv_cache_tokens"] == 20_000
    assert got["kv_pool_tokens"] == 20_000  # kvplan's own pool too
    assert got["max_concurrency"] == 20_000 // 8_192
    assert got["settings"]["max_total_tokens"] == 20_000
    # larger than the profiled pool: SGLang warns and keeps its own figure (model_runner.py)
    free = cli("estimate", *base, "--json").json()["engine"]["kv_cache_tokens"]
    big = cli("estimate", *base, "--max-total-tokens", "10000000", "--json").json()
    assert big["engine"]["kv_cache_tokens"] == free
    assert big["engine"]["log_lines"][0] == (
        f"max_total_tokens=10000000 is larger than the profiled value {free}. Use the profiled value instead."
    )


def test_max_running_requests_caps_concurrency(cli):
    got = cli(
        "estimate", "-m", "llama3-8b", "--max-model-len", "8K", "--engine", "sglang",
        "--max-running-requests", "3", "--json",
    ).json()  # fmt: skip
    assert (got["max_concurrency"], got["limited_by"]) == (3, "max_num_seqs")
    assert got["settings"]["max_running_requests"] == 3


def _h100_fraction(reserved_mib: float) -> float:
    gpu_mib = load_gpu("H100").memory_bytes / MiB  # 81,089 MiB
    return round((gpu_mib - reserved_mib) / gpu_mib, 3)


@pytest.mark.parametrize(
    ("chunk", "reserved_mib"),
    [
        # server_args.py _handle_gpu_memory_settings, H100 TP 1 (cuda_graph_max_bs 256):
        # 512 + 1.5 x max(chunk, 2048) + 2 x 256 + 1 x 1 / 8 x 1024, at least 10 GiB above 60 GiB
        (None, 512 + 8192 * 1.5 + 512 + 128),  # its default chunk for the card, 8192: 13,440 MiB -> 0.834
        (16384, 512 + 16384 * 1.5 + 512 + 128),  # 25,728 MiB -> 0.683
        (-1, 512 + 16384 * 1.5 + 512 + 128),  # no chunking: --max-prefill-tokens 16384
        (2048, 10 * 1024),  # 4,224 MiB, raised to 10 GiB -> 0.874
    ],
)
def test_chunked_prefill_size_sets_the_default_fraction(cli, chunk, reserved_mib):
    mem = memory_settings(load_gpu("H100").memory_bytes, 1, 1, None, chunk)
    assert mem.mem_fraction_static == _h100_fraction(reserved_mib)
    args = ["estimate", "-m", "llama3-8b", "--max-model-len", "8K", "--engine", "sglang", "--json"]
    got = cli(*args, *(["--chunked-prefill-size", str(chunk)] if chunk else [])).json()
    assert got["settings"]["mem_fraction_static"] == _h100_fraction(reserved_mib)
    assert got["settings"]["chunked_prefill_size"] == (chunk or 8192)
    defaults = got["settings"]["engine_defaults"]
    assert defaults["mem_fraction_static"] == _h100_fraction(reserved_mib)
    assert defaults["cuda_graph_max_bs"] == 256
    assert ("chunked_prefill_size" in defaults) is (chunk is None)


# --- --cpu-offload-gb ---------------------------------------------------------------------------------


def test_offload_moves_whole_layers_until_the_limit():
    # vllm/model_executor/models/utils.py maybe_offload_to_cpu: a layer is moved while the bytes moved
    # so far are below the limit, so the last one crosses it
    assert offloaded_bytes(100, 32, 250) == 300
    assert offloaded_bytes(100, 32, 300) == 300
    assert offloaded_bytes(100, 2, 10_000) == 200
    assert offloaded_bytes(100, 32, 0) == 0


def test_cpu_offload_frees_weights_for_the_kv_cache():
    base = plan("llama3-8b", max_model_len=8192)
    off = plan("llama3-8b", max_model_len=8192, cpu_offload_gb=4)
    # llama3-8b (untied): per-layer bytes = (weights - embedding - LM head of the same shape) / 32
    embed = 128_256 * 4_096 * 2
    layer = (base.weight_bytes_per_gpu - 2 * embed) // 32
    moved = math.ceil(4 * GiB / layer) * layer
    assert layer == 436_224_256 and moved == 10 * layer  # 4 GiB is 9.8 layers of 0.41 GiB: 10 move
    assert off.weight_bytes_per_gpu == base.weight_bytes_per_gpu - moved
    assert off.kv_budget_bytes_per_gpu == base.kv_budget_bytes_per_gpu + moved
    assert off.settings.cpu_offload_gb == 4
    assert any(a.startswith("--cpu-offload-gb 4:") for a in off.assumptions)


# --- --dtype ------------------------------------------------------------------------------------------


def test_dtype_float32_doubles_kv_and_unquantized_weights():
    base = plan("llama3-8b", max_model_len=8192)
    fp32 = plan("llama3-8b", max_model_len=8192, dtype="float32")
    assert base.kv_bytes_per_token == 32 * 8 * 128 * 2 * 2  # 131,072 B in bf16
    assert fp32.kv_bytes_per_token == 2 * base.kv_bytes_per_token
    assert fp32.weight_bytes_per_gpu == 2 * base.weight_bytes_per_gpu
    assert (fp32.settings.dtype, fp32.settings.kv_cache_dtype, fp32.settings.weight_dtype) == ("fp32",) * 3
    # an explicit --kv-cache-dtype is not the model dtype's
    fp8 = plan("llama3-8b", max_model_len=8192, dtype="float32", kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token == base.kv_bytes_per_token // 2


@pytest.mark.parametrize(
    ("engine", "version", "dtype"),
    [
        ("vllm", None, "bf16"),  # vllm/config/model.py _resolve_auto_dtype: the first supported dtype
        ("vllm", "0.9", "fp16"),  # before 0.10.1: float16 for float32 checkpoints
        ("sglang", None, "fp16"),  # sglang/srt/configs/model_config.py: float16 for float32 checkpoints
    ],
)
def test_auto_dtype_of_a_float32_checkpoint(cli, engine, version, dtype):
    args = ["estimate", "-m", str(HF / "gemma2-27b.json"), "--max-model-len", "4K", "--engine", engine]
    got = cli(*args, *(["--engine-version", version] if version else []), "--json").json()
    assert got["settings"]["dtype"] == dtype
    assert got["settings"]["kv_cache_dtype"] == dtype
    assert got["settings"]["engine_defaults"]["dtype"] == dtype


def test_dtype_float16_refused_for_gemma2_by_vllm(cli):
    r = cli("estimate", "-m", str(HF / "gemma2-27b.json"), "--max-model-len", "4K", "--dtype", "half")
    assert r.exit_code == 2 and "does not support float16" in r.stderr


def test_no_bfloat16_on_a_t4(cli):
    # vllm/platforms/cuda.py supported_dtypes: fp16 and fp32 below compute capability 8.0, so --dtype auto
    # serves a bf16 model in fp16 (config/model.py _resolve_auto_dtype) and --dtype bfloat16 is refused
    # (check_if_supports_dtype); the 2x T4 Qwen3-8B log ran with --dtype half
    args = ["estimate", "-m", "qwen3-8b", "-g", "2xT4", "--max-model-len", "4K"]
    auto = cli(*args, "--json").json()
    assert auto["settings"]["dtype"] == auto["settings"]["kv_cache_dtype"] == "fp16"
    assert any("T4 has no bfloat16" in a for a in auto["assumptions"])
    half = cli(*args, "--dtype", "half", "--json").json()
    assert half["kv_bytes_per_token"] == auto["kv_bytes_per_token"] == 36 * 8 * 128 * 2 * 2  # 147,456 B
    bf16 = cli(*args, "--dtype", "bfloat16")
    assert bf16.exit_code == 2 and bf16.stderr.count("\n") == 1
    assert "vLLM refuses it on T4" in bf16.stderr and "--dtype half" in bf16.stderr
    # an Ampere card keeps the model's bf16
    a100 = cli("estimate", "-m", "qwen3-8b", "-g", "A100", "--max-model-len", "4K", "--json").json()
    assert a100["settings"]["dtype"] == "bf16"


# --- every flag checked with one line -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--cpu-offload-gb", "-1"], "--cpu-offload-gb must be between 0"),
        (["--cpu-offload-gb", "nan"], "--cpu-offload-gb must be between 0"),
        (["--cpu-offload-gb", "inf"], "--cpu-offload-gb must be between 0"),
        (["--dtype", "int8"], "--dtype must be auto"),
        (["--engine", "sglang", "--max-total-tokens", "0"], "--max-total-tokens must be between 1"),
        (["--engine", "sglang", "--max-running-requests", "-3"], "--max-running-requests must be between 1"),
        (["--engine", "sglang", "--chunked-prefill-size", "0"], "--chunked-prefill-size must be -1"),
        (["--max-total-tokens", "20000"], "--max-total-tokens is a sglang flag"),
        (["--max-running-requests", "8"], "--max-running-requests is a sglang flag"),
        (["--chunked-prefill-size", "4096"], "--chunked-prefill-size is a sglang flag"),
        (["--max-total-tokens", "lots"], "'lots' is not a valid int"),
    ],
)
def test_bad_flags_give_one_line(cli, args, says):
    r = cli("estimate", "-m", "llama3-8b", "--max-model-len", "8K", *args)
    assert r.exit_code == 2
    assert says in r.stderr and "Traceback" not in r.stderr


def test_bad_flags_in_python_are_usage_errors():
    with pytest.raises(UsageError, match="--cpu-offload-gb"):
        plan("llama3-8b", max_model_len=8192, cpu_offload_gb=float("nan"))


def test_json_states_the_new_settings(cli):
    got = cli("estimate", "-m", "llama3-8b", "--max-model-len", "8K", "--json").json()
    s = got["settings"]
    assert (s["dtype"], s["cpu_offload_gb"], s["max_request_tokens"]) == ("bf16", 0.0, 8192)
    assert s["max_total_tokens"] is None and s["max_running_requests"] is None
    assert s["engine_defaults"]["dtype"] == "bf16"
    assert s["engine_defaults"]["gpu_memory_utilization"] == 0.92
