"""The golden corpus: CLI invocations whose output must not change under a refactor.

Recorded once with `python tests/golden/record.py` before a change of shape; `test_golden.py`
replays every case and asserts the output is the same (JSON may gain keys, nothing else).
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

MODELS = [
    "deepseek-v2-lite", "deepseek-v3", "gemma2-27b", "gemma3-27b", "gpt-oss-120b", "gpt-oss-20b",
    "gpt3-175b", "kimi-k2", "llama2-70b", "llama2-7b", "llama3-70b", "llama3-8b", "llama3.1-405b",
    "llama3.1-70b", "llama3.1-8b", "llama4-scout", "mistral-7b-v0.3", "mixtral-8x7b", "qwen2.5-72b",
    "qwen3-235b-a22b", "qwen3-32b", "qwen3-8b",
]  # fmt: skip


def cases() -> list[list[str]]:
    out: list[list[str]] = [["models", "--json"], ["gpus", "--json"], ["models"], ["gpus"]]
    # every shipped model x four cluster/engine/dtype shapes
    from kvplan.specs.registry import load_model

    for m in MODELS:
        top = load_model(m).max_context

        def ctx(tokens: int, top: int = top) -> str:
            return str(min(tokens, top))

        out += [
            ["estimate", "-m", m, "-g", "8xH100", "--max-model-len", ctx(8192), "--json"],
            ["estimate", "-m", m, "-g", "8xH200", "--max-model-len", ctx(32768), "--engine", "sglang", "--json"],
            ["estimate", "-m", m, "-g", "2x8xH100", "--max-model-len", ctx(16384), "--kv-cache-dtype", "fp8",
             "--json"],
            ["estimate", "-m", m, "-g", "4xA100-80GB", "-tp", "2", "--max-model-len", ctx(4096),
             "--avg-context", ctx(2048), "--shared-prefix-tokens", ctx(1024), "--json"],
        ]  # fmt: skip
    # flag families on a few models
    fam = [
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--block-size", "32"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--engine-version", "0.7"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--engine-version", "0.11"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--engine-version", "0.21"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--enforce-eager"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--num-gpu-blocks-override", "10000"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--max-num-seqs", "64"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--reserve-memory", "3GiB"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--kv-cache-memory", "40GiB"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--gpu-memory-utilization", "0.8"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--max-num-batched-tokens", "2048"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--weight-dtype", "fp8"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--kv-cache-dtype", "int4",
         "--kv-quant-group-size", "64"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--kv-cache-dtype", "int8",
         "--kv-quant-group-size", "32", "--kv-quant-scale-bits", "8", "--kv-quant-zero-point"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--no-enable-prefix-caching"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--shared-prefix-tokens", "4K",
         "--prefix-hit-rate", "0.5"],
        ["-m", "llama3-8b", "-g", "L4", "--max-model-len", "8K"],
        ["-m", "llama3.1-8b", "-g", "A100-40GB", "--max-model-len", "128K"],
        ["-m", "llama3.1-8b", "-g", "MI300X", "--max-model-len", "128K"],
        ["-m", "llama3.1-70b", "-g", "4xL40S", "--max-model-len", "16K", "--kv-cache-dtype", "fp8"],
        ["-m", "qwen3-32b", "-g", "2xH100-PCIe", "--max-model-len", "32K", "--engine", "sglang"],
        ["-m", "deepseek-v2-lite", "-g", "H20", "--max-model-len", "32K"],
        ["-m", "llama3-70b", "-g", "8xH100", "--max-model-len", "8K", "--kv-cache-memory", "50GiB"],
        ["-m", "llama3-70b", "-g", "16xH100", "-tp", "8", "-pp", "2", "--max-model-len", "8K"],
        ["-m", "llama3-70b", "-g", "H100", "--max-model-len", "8K"],
        ["-m", "gpt-oss-20b", "-g", "H100", "--max-model-len", "32K", "--disable-hybrid-kv-cache-manager"],
        ["-m", "gpt-oss-120b", "-g", "H100", "--max-model-len", "128K", "--max-num-batched-tokens", "2048"],
        ["-m", "gemma3-27b", "-g", "H100", "--max-model-len", "32K", "--engine", "sglang",
         "--disable-hybrid-swa-memory"],
        ["-m", "gpt-oss-120b", "-g", "H200", "--max-model-len", "32K", "--engine", "sglang",
         "--swa-full-tokens-ratio", "0.5"],
        ["-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--engine", "sglang",
         "--mem-fraction-static", "0.85"],
        ["-m", "deepseek-v3", "-g", "8xH200", "--max-model-len", "32K", "--block-size", "64"],
        ["-m", "deepseek-v3", "-g", "8xB200", "--max-model-len", "128K"],
        ["-m", "kimi-k2", "-g", "16xH200", "--max-model-len", "64K", "--kv-cache-dtype", "fp8"],
        ["-m", "llama4-scout", "-g", "8xH100", "--max-model-len", "1M"],
        ["-m", "llama4-scout", "-g", "8xH100", "--max-model-len", "1M", "--disable-hybrid-kv-cache-manager"],
        ["-m", "qwen3-235b-a22b", "-g", "4xH100", "--max-model-len", "32K", "--weight-dtype", "fp8",
         "--engine", "sglang", "--mem-fraction-static", "0.93"],
        ["-m", "mixtral-8x7b", "-g", "2xA100-80GB", "--max-model-len", "32K", "--avg-context", "4K"],
    ]  # fmt: skip
    out += [["estimate", *f, "--json"] for f in fam]
    out += [["estimate", *f] for f in fam[:6]]  # the rendered plan, at 120 columns
    out += [["estimate", "-m", "llama3-70b", "-g", "8xH100", "--max-model-len", "8K", "--explain"]]
    # the trimmed HF config.json test inputs (tests/fixtures/hf/synthetic/README.md)
    for cfg in sorted((FIXTURES / "hf" / "synthetic").glob("*.json")):
        rel = str(cfg.relative_to(FIXTURES.parent.parent))
        out += [["estimate", "-m", rel, "-g", "8xH100", "--max-model-len", "8K", "--json"]]
    # check-log on every fixture log, with and without a GPU named
    for log in sorted((FIXTURES / "logs").glob("*.log")):
        rel = str(log.relative_to(FIXTURES.parent.parent))
        gpu = log.stem.rsplit("_", 1)[-1]
        out += [["check-log", rel, "--gpus", gpu, "--json"], ["check-log", rel, "--gpus", gpu]]
        out += [["check-log", rel, "--gpus", gpu, "--engine-version", "0.9", "--json"]]
    out += [["check-log", "tests/fixtures/logs/vllm_v011_llama31_8b_h100.log", "--json"]]
    # compare in every format
    for fmt in ("table", "md", "csv", "json"):
        out += [
            ["compare", "table", "--format", fmt],
            ["compare", "table", "--models", "llama3-70b,deepseek-v3,gpt-oss-120b", "--variants",
             "shipped,gqa8+int8,mla512+fp8,mqa,share2,window4096,offload64", "-g", "8xH100",
             "--context", "32K", "--format", fmt],
            ["compare", "ladder", "--format", fmt],
            ["compare", "ladder", "-m", "llama3.1-70b", "-g", "8xH100", "--max-model-len", "16K",
             "--avg-context", "8K", "--kv-cache-memory", "50GiB", "--shared-prefix-tokens", "6K",
             "--format", fmt],
        ]  # fmt: skip
    out += [["compare", "plot"], ["compare", "plot", "--models", "llama3-8b,qwen3-8b", "--context", "128K"]]
    # solve
    out += [
        ["solve", "-m", "llama3-8b", "--users", "300", "--max-model-len", "8K", "--tpot-ms", "30", "--json"],
        ["solve", "-m", "llama3-70b", "--users", "500", "--max-model-len", "8K", "--tpot-ms", "50", "--json"],
        ["solve", "-m", "llama3-70b", "--users", "500", "--max-model-len", "8K", "--json"],
        ["solve", "-m", "llama3-70b", "--users", "100", "--max-model-len", "8K", "--gpu", "H100,H200,B200",
         "--price", "2.5,3.8,6", "--json"],
        ["solve", "-m", "deepseek-v3", "--users", "64", "--max-model-len", "32K", "--gpu", "H200", "--json"],
        ["solve", "-m", "gpt-oss-120b", "--users", "200", "--max-model-len", "128K", "--json"],
        ["solve", "-m", "llama3-8b", "--users", "1", "--max-context", "-g", "8xH200", "--json"],
        ["solve", "-m", "llama3-70b", "--users", "64", "--max-context", "-g", "8xH100", "--json"],
        ["solve", "-m", "llama3-70b", "--users", "500", "--max-model-len", "8K", "--tpot-ms", "5", "--json"],
        ["solve", "-m", "llama3.1-405b", "--users", "10000", "--max-model-len", "128K", "--max-gpus", "16",
         "--json"],
        ["solve", "-m", "llama3-70b", "--users", "500", "--max-model-len", "8K", "--engine", "sglang", "--json"],
        ["solve", "-m", "qwen3-32b", "--users", "50", "--max-model-len", "32K", "--kv-cache-dtype", "fp8",
         "--json"],
        ["solve", "-m", "llama3-70b", "--users", "500", "--max-model-len", "8K", "--tpot-ms", "50"],
    ]  # fmt: skip
    # errors: one line, the right exit code
    out += [
        ["estimate", "-m", "no-such-model", "-g", "H100", "--json"],
        ["estimate", "-m", "llama3-8b", "-g", "Z999", "--json"],
        ["estimate", "-m", "llama3-8b", "-g", "H100", "--max-model-len", "10M", "--json"],
        ["estimate", "-m", "llama3-8b", "-g", "H100", "--engine", "trt", "--json"],
        ["estimate", "-m", "llama3-8b", "-g", "H100", "--mem-fraction-static", "0.8", "--json"],
        ["estimate", "-m", "llama3-8b", "-g", "H100", "--kv-cache-dtype", "fp7", "--json"],
        ["estimate", "-m", "llama3-8b", "-g", "3xH100", "--json"],
        ["estimate", "-m", "llama3.1-405b", "-g", "H100", "--json"],
        ["estimate", "-m", "llama3.1-8b", "-g", "L4", "--max-model-len", "128K", "--json"],
        ["check-log", "no/such/file.log", "--json"],
        ["compare", "table", "--variants", "gqa999", "--format", "json"],
        ["solve", "-m", "llama3-8b", "--users", "0", "--max-model-len", "8K", "--json"],
    ]  # fmt: skip
    return out
