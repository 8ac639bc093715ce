"""Issue 24/22: findings of the seventh fuzz pass (K-series: simulate and solve under load), each test failing
on the code before."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers import run_cli

TRACE = Path(__file__).parent / "fixtures" / "traces" / "mooncake_conversation_trace.jsonl"


def _slice(tmp_path: Path, first: int, last: int) -> Path:
    """Lines first..last (1-based) of the shipped Mooncake trace, as a user replaying part of it would."""
    lines = TRACE.read_text().splitlines()[first - 1 : last]
    out = tmp_path / "slice.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


def test_a_trace_slice_is_replayed_from_its_first_request(tmp_path):
    # K1: lines 2001-2150 (timestamps 669,000-717,000 ms) were scaled from t = 0: solve sent 150 requests in 40 s
    # and called it 0.25 requests/s, and answered 16 GPUs for 1 request/s with 4,263 output tok/s
    path = _slice(tmp_path, 2001, 2150)
    first = json.loads(path.read_text().splitlines()[0])["timestamp"] / 1e3
    sim = run_cli(
        "simulate", "-m", "llama3.1-8b", "--max-model-len", "128K", "--trace", str(path), "--json"
    ).json()
    assert sim["workload"]["description"].endswith(f"(from the first, at {first:,.3f} s in the file)")
    span = (json.loads(path.read_text().splitlines()[-1])["timestamp"] / 1e3) - first
    assert sim["workload"]["last_send_s"] == pytest.approx(span)
    r = run_cli("solve", "-m", "llama3.1-8b", "--max-model-len", "128K", "--request-rate", "1", "--ttft-ms",
                "5000", "--tpot-ms", "100", "--trace", str(path), "--partial-nodes", "--json").json()  # fmt: skip
    w = r["workload"]
    # one of DP replicas gets every DP-th request of 150 at 1 request/s, as stated: DP x 150 s
    assert w["last_send_s"] == pytest.approx(150 / 1.0 * r["answer"]["data_parallel_size"])
    assert r["output_token_throughput"] <= 1.0 * w["output_tokens_mean"]


def test_a_burst_late_in_a_trace_has_no_rate_either(tmp_path):
    # K1: 40 requests at one timestamp: refused at t = 0, but at t = 600 s taken as a rate 64 GPUs "cannot serve"
    path = tmp_path / "burst.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 600000, "input_length": 2048, "output_length": 128}) + "\n"
                            for _ in range(40)))  # fmt: skip
    r = run_cli("solve", "-m", "llama3.1-8b", "--max-model-len", "8K", "--request-rate", "2", "--ttft-ms", "300",
                "--tpot-ms", "30", "--trace", str(path), "--partial-nodes")  # fmt: skip
    assert r.exit_code == 2
    assert r.stderr.startswith(
        "error: the workload sends all 40 requests at t = 0 (Mooncake trace burst.jsonl"
    )
    assert r.stderr.strip().endswith("give a trace whose requests are spread in time, or a synthetic workload "
                                     "(--num-prompts, --input-len, --output-len)")  # fmt: skip


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_kv_usage_grows_through_a_run_of_decodes(engine):
    # K2: 4 requests of 100 in / 3,000 out on a 2 GiB pool (1,024 blocks of 16): at the end they hold
    # 4 x ceil(3,100 / 16) = 776 blocks, 76% of the pool, growing about linearly from 3%; kvplan said 3% / 3%
    r = run_cli("simulate", "-m", "llama3.1-8b", "--max-model-len", "8K", "--num-prompts", "4", "--input-len",
                "100", "--output-len", "3000", "--kv-cache-memory", "2GiB", "--engine", engine, "--json").json()  # fmt: skip
    kv = r["kv_usage"]
    held = 4 * math.ceil(3099 / 16) / 1024 if engine == "vllm" else 4 * 3099 / 16384
    assert kv["peak"] == pytest.approx(held, abs=0.005)
    assert 0.35 <= kv["mean"] <= 0.45
    fractions = [p["fraction"] for p in kv["series"]]
    assert max(fractions) == pytest.approx(kv["peak"], abs=0.01) and min(fractions) < 0.1


@pytest.mark.parametrize(("prompts", "rate"), [(1, 0.5), (5, 0.5), (1, 0.001)])
def test_throughput_never_exceeds_the_rate_sent(prompts, rate):
    # K3: the duration ran from the first send, so one prompt at 0.5 requests/s reported 6.48 requests/s (and
    # 1.00 at 0.001); vLLM's benchmark times from its start, before the first send's delay
    r = run_cli("simulate", "-m", "llama3.1-8b", "--max-model-len", "8K", "--num-prompts", str(prompts),
                "--request-rate", str(rate), "--ttft-ms", "5000", "--json").json()  # fmt: skip
    last_send = r["workload"]["last_send_s"]
    assert last_send == pytest.approx(prompts / rate)
    assert r["duration_s"] > last_send
    assert r["request_throughput"] == pytest.approx(prompts / r["duration_s"])
    assert r["request_throughput"] <= rate and r["goodput"] <= rate


@pytest.mark.parametrize("n", ["-3", "0"])
@pytest.mark.parametrize("command", ["simulate", "solve"])
def test_num_prompts_with_a_trace_is_checked(tmp_path, n, command):
    # K4: --num-prompts -3 with a 50-request trace replayed 47 of them (Python's negative slice); 0 gave an error
    # naming no flag
    path = _slice(tmp_path, 1, 50)
    extra = ["--request-rate", "1", "--ttft-ms", "5000", "--tpot-ms", "100"] if command == "solve" else []
    r = run_cli(command, "-m", "llama3.1-8b", "--max-model-len", "128K", "--trace", str(path), "--num-prompts", n,
                *extra)  # fmt: skip
    assert r.exit_code == 2
    assert r.stderr.strip() == f"error: --num-prompts must be 1 to 200,000, got {n}"


def test_dsa_decode_reads_the_top_k_tokens_and_says_so(tmp_path):
    # K5: DeepSeek-V3.2's decode attention read every request's whole latent cache (61 x 32,768 x (656 + 132) B
    # at 32K fp8), though its sparse kernels attend to the indexer's top 2,048 tokens; nothing said so
    from kvplan.plan.plan import DSA_DENSE, DSA_SPARSE
    from tests.helpers import plan

    p = plan("deepseek-v3.2", "H200", num_gpus=8, max_model_len=32768, kv_cache_dtype="fp8")
    assert DSA_SPARSE.format(topk=2048) in p.assumptions
    # 61 layers x (2,048 latents x 656 B + 32,768 indexer keys x 132 B)
    assert p.decode.batch_1.kv_bytes_read == 61 * (2048 * 656 + 32768 * 132)
    assert p.kv_bytes_per_request_per_gpu == 61 * 32768 * (656 + 132)  # the cache still holds every token
    short = plan("deepseek-v3.2", "H200", num_gpus=8, max_model_len=32768, kv_cache_dtype="fp8", input_len=1000,
                 output_len=24)  # fmt: skip
    assert short.decode.batch_1.kv_bytes_read == 61 * 1024 * (656 + 132)  # under top-k: the whole context
    assert not any("sparse attention" in a for a in plan("deepseek-v3", "H200", num_gpus=8).assumptions)
    # a DSA config without index_topk is timed dense, and says so
    cfg = json.loads(
        (Path(__file__).parent / "fixtures" / "hf" / "corpus" / "deepseek-v3.2-exp.json").read_text()
    )
    del cfg["index_topk"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    dense = plan(str(tmp_path / "config.json"), "H200", num_gpus=8, max_model_len=32768, kv_cache_dtype="fp8")
    assert DSA_DENSE in dense.assumptions
    assert dense.decode.batch_1.kv_bytes_read == dense.kv_bytes_per_request_per_gpu


def test_prefill_work_names_its_peaks_as_rates():
    # K6: prefill.work.gemm_flops_per_gpu held the GPU's peak FLOP/s (it repeated prefill.peak_flops_per_gpu),
    # read as work it was 6.4x the GEMMs' FLOPs
    p = run_cli("estimate", "-m", "llama3.1-8b", "-g", "H100", "--max-model-len", "8K", "--json").json()[
        "prefill"
    ]
    assert p["work"]["gemm_peak_flops_per_s"] == p["peak_flops_per_gpu"]
    assert "gemm_flops_per_gpu" not in p["work"] and "attention_flops_per_gpu" not in p["work"]


@pytest.mark.parametrize(
    "command",
    [
        ("compare", "plot", "-m", "llama3.1-8b", "-g", "H100", "--output"),
        ("simulate", "-m", "llama3.1-8b", "--max-model-len", "8K", "--num-prompts", "2", "--plot"),
    ],
)
def test_a_chart_in_a_missing_directory_is_refused(tmp_path, command):
    # K7: a mistyped directory in a chart path was created as a new tree (first try made /nonexistent/dir/)
    target = tmp_path / "typo" / "deep" / "c.png"
    r = run_cli(*command, str(target))
    assert r.exit_code == 2
    assert r.stderr.strip() == (
        f"error: {command[-1]} {target}: no directory {target.parent}; create it first or name another"
    )
    assert not (tmp_path / "typo").exists()


def test_the_api_to_dict_is_the_commands_json():
    # K8: the README promises to_dict() equal to --json: the disaggregated estimate's JSON was wrapped in
    # {"disaggregated": ...} only on the command line, and simulate's had a 'chart' key the API lacked
    import kvplan

    flags = ("-m", "llama3.1-8b", "--max-model-len", "8K", "--disaggregated", "--prefill-gpus", "2xH100",
             "--decode-gpus", "4xH100", "--input-len", "2048", "--output-len", "256")  # fmt: skip
    cli = run_cli("estimate", *flags, "--json").json()
    api = kvplan.estimate("llama3.1-8b", max_model_len="8K", disaggregated=True, prefill_gpus="2xH100",
                          decode_gpus="4xH100", input_len=2048, output_len=256).to_dict()  # fmt: skip
    assert list(api) == list(cli) == ["disaggregated"]
    assert api["disaggregated"]["transfer_ms"] == cli["disaggregated"]["transfer_ms"]
    sim_cli = run_cli(
        "simulate", "-m", "llama3.1-8b", "--max-model-len", "8K", "--num-prompts", "3", "--json"
    )
    sim_api = kvplan.simulate("llama3.1-8b", max_model_len="8K", num_prompts=3).to_dict()
    assert sorted(sim_api) == sorted(sim_cli.json()) and sim_api["chart"] is None
