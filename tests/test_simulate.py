"""kvplan simulate: the engines' scheduling rules on hand-computable cases, the workloads, the
prefix cache against an exact replay of a real trace, and the command line."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
from pathlib import Path

import pytest

import kvplan
from helpers import REPO, run_cli
from kvplan.simulator import Deployment, SimResult, Workload, read_trace, simulate, synthetic
from kvplan.simulator.radix import RadixCache
from kvplan.simulator.request import RequestSpec, SimRequest
from kvplan.simulator.steptime import FixedSteps
from kvplan.simulator.vllm_engine import VllmEngine
from kvplan.simulator.workload import arrival_times, uniform_lengths

MOONCAKE = REPO / "tests" / "fixtures" / "traces" / "mooncake_conversation_trace.jsonl"


class Log:
    """A recorder that keeps what the engine reported, per step."""

    def __init__(self) -> None:
        self.step = 0
        self.preempted_at: list[int] = []

    def token(self, req, t_s, same_chunk=False):
        req.first_token_s = t_s if req.first_token_s is None else req.first_token_s

    def finished(self, req, t_s):
        req.finish_s = t_s

    def preempted(self, req):
        self.preempted_at.append(self.step)


def deployment(engine="vllm", blocks=10_000, block_size=16, budget=8192, seqs=256, caching=True, **kw):
    return Deployment(
        engine=engine, engine_version="test", model="m", gpus="g", block_size=block_size,
        num_gpu_blocks=blocks, pool_tokens=(blocks - 1) * block_size, max_num_seqs=seqs,
        max_num_batched_tokens=budget, chunked_prefill_size=kw.get("chunk"), max_prefill_tokens=16384,
        max_model_len=kw.get("max_model_len", 1 << 20), enable_prefix_caching=caching,
        steps=kw.get("steps", FixedSteps(0.01, 0.0, 1e-5)),
    )  # fmt: skip


def drive(engine, reqs, log, max_steps=10_000):
    """Schedule/complete step by step (no skipping ahead), one second a step."""
    for r in reqs:
        engine.add(r)
    steps = []
    while engine.has_work() and log.step < max_steps:
        log.step += 1
        step = engine.schedule()
        steps.append(([r.rid for r in step.decodes], [(r.rid, c, n) for r, c, n in step.prefills]))
        engine.complete(step, float(log.step))
    return steps


def test_vllm_token_budget_and_chunking_by_hand():
    # budget 100: A (150-token prompt) takes 100, then its last 50 and B's first 50, then A decodes
    # while B's last 10 prefill
    log = Log()
    eng = VllmEngine(1000, 16, 100, 256, 1 << 20, True, log)
    a = SimRequest(0, RequestSpec(0.0, 150, 3))
    b = SimRequest(1, RequestSpec(0.0, 60, 2))
    steps = drive(eng, [a, b], log)
    assert steps[0] == ([], [(0, 0, 100)])
    assert steps[1] == ([], [(0, 100, 50), (1, 0, 50)])
    assert steps[2] == ([0], [(1, 50, 10)])
    assert steps[3] == ([0, 1], [])
    assert len(steps) == 4 and a.num_output == 3 and b.num_output == 2


def test_vllm_preempts_exactly_when_the_blocks_run_out_and_recomputes():
    bs, usable, prompt, out = 4, 8, 8, 20
    log = Log()
    eng = VllmEngine(usable + 1, bs, 4096, 256, 1 << 20, False, log)  # + the null block
    a, b = (SimRequest(i, RequestSpec(0.0, prompt, out)) for i in range(2))
    drive(eng, [a, b], log)
    # step 1 prefills both (2 blocks each); decode step s allocates prompt + s - 1 tokens for each,
    # so both fit while 2 x ceil((prompt + s - 1) / bs) <= usable: the first step past that
    # preempts the newest running request (b)
    first = next(s for s in range(2, 100) if 2 * math.ceil((prompt + s - 1) / bs) > usable)
    assert first == 10
    assert log.preempted_at == [first]
    assert b.preemptions == 1 and a.preemptions == 0
    # b had produced one token per step before: its recompute prefills prompt + those outputs
    outputs_before = first - 1
    assert b.prefill_tokens == prompt + (prompt + outputs_before)
    assert a.num_output == out and b.num_output == out


def test_the_event_loop_skipping_ahead_agrees_with_step_by_step():
    d = deployment(blocks=9, block_size=4, caching=False)
    w = Workload(tuple(RequestSpec(0.0, 8, 20) for _ in range(2)), None, "two")
    r = simulate(d, w)
    assert r.preemptions == 1 and r.prefill_tokens == 8 + 8 + 17
    assert r.completed == 2


def _mooncake_rows(n):
    rows = []
    with open(MOONCAKE) as fh:
        for line in fh:
            rows.append(json.loads(line))
            if len(rows) == n:
                break
    return rows


def exact_replay(rows, block_size):
    """Prefix-cache hits with a cache that forgets nothing: a block hits when an earlier prompt had
    the same hash ids up to it and held that block whole; at most input - 1 tokens hit."""
    seen, hit, total = set(), 0, 0
    for row in rows:
        ids, length = row["hash_ids"], row["input_length"]

        def key(j, ids=ids, length=length):
            k, off = divmod(j * block_size, 512)
            return (tuple(ids[: k + 1]), min(512, length - 512 * k), off)

        n = 0
        while n < (length - 1) // block_size and key(n) in seen:
            n += 1
        hit += n * block_size
        total += length
        seen.update(key(j) for j in range(length // block_size))
    return hit / total


def test_prefix_hits_equal_an_exact_replay_of_the_hash_ids_with_an_unbounded_pool():
    n = 400
    rows = _mooncake_rows(n)
    w = read_trace(MOONCAKE, num_prompts=n)
    d = deployment(blocks=10_000_000, budget=1 << 30, seqs=100_000)
    r = simulate(d, w)
    expected = exact_replay(rows, 16)
    assert expected > 0.05
    assert r.prefix_cache_hit_rate == pytest.approx(expected, abs=1e-12)
    small = simulate(deployment(blocks=4_000, budget=1 << 30, seqs=100_000), w)
    assert small.prefix_cache_hit_rate < expected - 0.02


def test_sglang_radix_cache_evicts_the_least_recently_used_unlocked_leaf():
    tree = RadixCache()
    a, b, c = ((1, 0, 100), (2, 0, 50)), ((1, 0, 100), (3, 0, 70)), ((4, 0, 30),)
    tree.insert(a)
    tree.insert(b)  # shares unit 1: the node splits into [1] -> [2], [3]
    tree.insert(c)
    assert tree.total_tokens == 100 + 50 + 70 + 30
    assert tree.match(a, 10_000)[0] == 150  # a is now the most recent
    matched, node = tree.match(c, 10_000)
    tree.lock(node)  # c is in use
    assert tree.evict(1) == 70  # b's own leaf: the least recent unlocked one
    assert tree.match(b, 10_000)[0] == 100
    assert tree.evict(10_000) == 150  # a's leaf, then the shared [1]; c stays locked
    assert tree.total_tokens == 30 and tree.match(c, 10_000)[0] == 30
    # a partial match splits the node at the match
    tree.unlock(node)
    assert tree.match(((4, 0, 10), (9, 0, 5)), 10_000)[0] == 10


def test_fixed_concurrency_never_exceeds_the_client_count():
    d = deployment(blocks=400, block_size=16)
    w = synthetic(num_prompts=60, input_len=300, output_len=40, range_ratio=0.5, max_concurrency=4, seed=3)
    from kvplan.simulator.loop import simulate_run

    run, _ = simulate_run(d, w)
    events = sorted([(r.enter_s, 1) for r in run.reqs] + [(r.finish_s, -1) for r in run.reqs])
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    assert peak == 4
    assert all(r.finish_s is not None for r in run.reqs)


def test_poisson_and_gamma_arrivals_have_the_asked_rate_and_spread():
    rng = random.Random(7)
    times = arrival_times(20_000, 10.0, 1.0, rng)
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert len(times) / times[-1] == pytest.approx(10.0, rel=1e-9)  # vLLM rescales to n / rate
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.03)  # exponential
    bursty = arrival_times(20_000, 10.0, 0.25, random.Random(7))
    gaps = [b - a for a, b in zip([0.0, *bursty], bursty, strict=False)]
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(2.0, abs=0.1)  # 1 / sqrt(0.25)


def test_uniform_lengths_follow_vllms_range_ratio_bounds():
    lengths = uniform_lengths(5000, 1000, 10, 0.25, random.Random(1))
    assert min(i for i, _ in lengths) == 750 and max(i for i, _ in lengths) == 1250
    assert min(o for _, o in lengths) == 7 and max(o for _, o in lengths) == 13


def test_same_seed_same_result():
    d = deployment(blocks=3000)
    a = simulate(d, synthetic(num_prompts=200, request_rate=50, burstiness=0.5, range_ratio=0.3, seed=11))
    b = simulate(d, synthetic(num_prompts=200, request_rate=50, burstiness=0.5, range_ratio=0.3, seed=11))
    c = simulate(d, synthetic(num_prompts=200, request_rate=50, burstiness=0.5, range_ratio=0.3, seed=12))
    assert a.to_dict() == b.to_dict()
    assert a.to_dict() != c.to_dict()


def test_sglang_serves_and_retracts_under_memory_pressure():
    d = deployment(engine="sglang", blocks=4001, block_size=1, chunk=512, seqs=64)
    r = simulate(d, synthetic(num_prompts=80, input_len=200, output_len=300, seed=2))
    assert r.completed == 80
    assert r.preemptions > 0  # the new-token-ratio admission lets in more than fits at the end
    assert r.kv_usage_peak <= 1.0


BAD = [
    ("unsorted.jsonl", '{"timestamp": 5, "input_length": 10, "output_length": 2}\n'
     '{"timestamp": 1, "input_length": 10, "output_length": 2}\n', ":2: timestamps must not go backwards"),
    ("negative.jsonl", '{"timestamp": 0, "input_length": -4, "output_length": 2}\n', ":1: input_length must be 1 to"),
    ("absurd.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 1e12}\n', ":1: output_length must be"),
    ("broken.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2}\n{"timestamp": 1,\n', ":2: not a JSON"),
    ("nan.jsonl", '{"timestamp": NaN, "input_length": 10, "output_length": 2}\n', ":1: the timestamp"),
    ("empty.jsonl", "", "empty file"),
    ("azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,x\n", ":2: cannot read"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "message"), BAD)
def test_bad_traces_get_one_line_naming_file_and_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    r = run_cli("simulate", "-m", "llama3-8b", "--max-model-len", "8K", "--trace", str(path), "--json")
    assert r.exit_code == 2
    assert message in r.json()["error"] and str(path) in r.json()["error"]
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_directory_or_a_huge_trace_is_refused(tmp_path, monkeypatch):
    r = run_cli("simulate", "-m", "llama3-8b", "--trace", str(tmp_path))
    assert r.exit_code == 2 and "not a regular file" in r.stderr and r.stderr.count("\n") == 1
    from kvplan.simulator import traces

    monkeypatch.setattr(traces, "MAX_TRACE_BYTES", 100)
    big = tmp_path / "big.jsonl"
    big.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\n' * 10)
    r = run_cli("simulate", "-m", "llama3-8b", "--trace", str(big))
    assert r.exit_code == 2 and "over kvplan's limit" in r.stderr


def test_azure_csv_trace_replays():
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
    path = Path(REPO / "tests" / "fixtures" / "traces" / "_tmp_azure.csv")
    try:
        path.write_text(text)
        w = read_trace(path)
    finally:
        path.unlink()
    assert [(round(r.arrival_s, 4), r.prompt_tokens, r.output_tokens) for r in w.requests] == [
        (0.0, 374, 44), (4.3146, 396, 109),
    ]  # fmt: skip


def test_cli_json_keys_and_goodput():
    r = run_cli(
        "simulate", "-m", "llama3-8b", "-g", "H100", "--max-model-len", "8K", "--num-prompts", "40",
        "--request-rate", "5", "--ttft-ms", "10000", "--tpot-ms", "1000", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    out = r.json()
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert set(out[key]) == {"mean", "median", "p90", "p99"}
    assert out["schema"] == "kvplan.simulate/1" and out["completed"] == 40
    assert out["goodput"] == pytest.approx(out["request_throughput"])  # generous targets: all good
    assert {"hit_rate", "hit_tokens", "query_tokens"} <= set(out["prefix_cache"])
    assert {"peak", "mean", "series"} <= set(out["kv_usage"]) and out["assumptions"]
    assert r.stderr == ""  # no progress bar under --json


def test_cli_output_reads_at_80_columns():
    from typer.testing import CliRunner

    from kvplan.cli import app

    res = CliRunner(env={"COLUMNS": "80", "NO_COLOR": "1"}).invoke(
        app,
        [
            "simulate",
            "-m",
            "llama3-8b",
            "--max-model-len",
            "8K",
            "--num-prompts",
            "30",
            "--request-rate",
            "4",
        ],
    )
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any("KV cache usage over simulated time" in line for line in lines)
    assert any(line.startswith("│ TTFT") for line in lines)


def test_api_simulate_returns_a_typed_result_with_a_short_repr():
    r = kvplan.simulate("llama3-8b", gpus="H100", max_model_len="8K", num_prompts=20, request_rate=2)
    assert isinstance(r, SimResult) and r.completed == 20
    text = repr(r)
    assert "\n" not in text and len(text) < 240 and "TTFT p50" in text
    with pytest.raises(kvplan.errors.UsageError):
        kvplan.simulate("llama3-8b", num_prompts=0)


def test_dp_attention_simulates_every_rank_dealt_every_nth_request():
    # SGLang DP attention, 8 ranks: each rank its own scheduler and pool, rank i sent requests i, i + 8, ...;
    # a rank's step is the step model at 8 x its batch (the other ranks as loaded)
    from kvplan.commands import inputs
    from kvplan.plan.plan import estimate
    from kvplan.simulator import from_plan

    req = inputs.plan_request(inputs.EstimateFlags(model="deepseek-v3", gpus="8xH200", max_model_len="8K",
                                                   engine="sglang", enable_dp_attention=True,
                                                   data_parallel_size=8, max_running_requests=64))  # fmt: skip
    plan = estimate(req)
    d = from_plan(plan, req)
    assert d.attention_ranks == 8 and d.max_num_seqs == 64 // 8
    assert d.pool_tokens == plan.engine.kv_cache_tokens  # one rank's pool, as SGLang logs it per rank
    ctx = 1000  # bucket [992, 1008): timed at its middle, 1000
    step = plan.decode.step(3 * 8, d.steps.kv_bytes_per_token * 1000, 1000)
    assert d.steps.decode_seconds(3, ctx) == pytest.approx(step.tpot_ms / 1e3)
    assert any("each of the replica's 8 attention-DP ranks is simulated" in a for a in d.assumptions)

    w = synthetic(num_prompts=160, input_len=512, output_len=64, request_rate=2.0, seed=3)
    r = simulate(d, w)
    one = dataclasses.replace(d, attention_ranks=1)
    ranks = [simulate(one, Workload(w.requests[i::8], None, f"rank {i}")) for i in range(8)]
    # the replica's figures are the 8 ranks' together: every request counted once, the run as long as the
    # slowest rank's, KV usage the busiest rank's
    assert r.completed == 160 and [x.completed for x in ranks] == [20] * 8
    assert r.duration_s == max(x.duration_s for x in ranks)
    assert r.request_throughput == pytest.approx(160 / r.duration_s)
    assert r.output_token_throughput == pytest.approx(160 * 64 / r.duration_s)
    assert r.kv_usage_peak == max(x.kv_usage_peak for x in ranks)
    assert r.steps == sum(x.steps for x in ranks)
    assert r.ttft_ms.mean == pytest.approx(sum(x.ttft_ms.mean for x in ranks) / 8)  # 20 requests each
    assert r.to_dict()["deployment"]["attention_dp_ranks"] == 8


def test_dp_counts_each_request_once_and_keeps_the_clients_concurrency():
    # fuzz 19 X1/X2: one scheduler was simulated and its counts multiplied by N: 1 prompt on -dp 8 came out as
    # "completed 8", 1,000 on -dp 3 as 1,002; refused requests on the other schedulers were dropped; and a
    # --max-concurrency 1 client on -dp 8 ran 8 requests at once (8 req/s where one at a time gives 1)
    one = run_cli("simulate", "-m", "llama3-8b", "--max-model-len", "8K", "-g", "8xH100", "-tp", "1", "-dp", "8",
                  "--num-prompts", "1", "--request-rate", "40", "--json").json()  # fmt: skip
    assert one["completed"] == 1 and one["workload"]["num_requests"] == 1
    three = run_cli("simulate", "-m", "llama3-8b", "--max-model-len", "8K", "-g", "3xH100", "-tp", "1", "-dp", "3",
                    "--num-prompts", "100", "--request-rate", "40", "--json").json()  # fmt: skip
    assert three["completed"] == 100
    serial = [run_cli("simulate", "-m", "llama3-8b", "--max-model-len", "8K", "-g", f"{n}xH100", "-tp", "1", "-dp",
                      str(n), "--num-prompts", "24", "--max-concurrency", "1", "--json").json() for n in (1, 8)]  # fmt: skip
    # one request in flight at a time: the same throughput however many replicas (Little's law)
    assert serial[1]["request_throughput"] == pytest.approx(serial[0]["request_throughput"], rel=0.01)
    assert serial[1]["request_throughput"] * serial[1]["e2el_ms"]["mean"] / 1e3 <= 1.01


def test_dp_counts_the_requests_refused_on_every_scheduler(tmp_path):
    # fuzz 19 X1: a trace whose odd rows are over --max-model-len, on -dp 2: scheduler 0 took only the short rows,
    # so "10 completed, 0 failed"; now 5 served and 5 refused, as without -dp
    trace = tmp_path / "mixed.csv"
    rows = [f"2024-05-10 00:00:{i:02d},{5000 if i % 2 else 500},50" for i in range(10)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    for extra in ((), ("-g", "2xH100", "-tp", "1", "-dp", "2")):
        d = run_cli("simulate", "-m", "llama3-8b", "--max-model-len", "2K", *extra, "--trace", str(trace),
                    "--json").json()  # fmt: skip
        assert d["completed"] == 5 and d["failed"] == {"prompt + output over max-model-len 2,048": 5}, extra


def test_dp_attention_holds_more_than_the_replicated_pool_at_the_same_load():
    # DeepSeek-V3 on 8x H200, SGLang, 4 requests/s of 2,048 in / 512 out: under TP 8 every GPU holds
    # every request's latent; with DP attention each rank holds its own, so KV use per GPU falls
    kw = {"gpus": "8xH200", "max_model_len": "8K", "engine": "sglang", "num_prompts": 200,
          "request_rate": 4, "input_len": 2048, "output_len": 512}  # fmt: skip
    tp = kvplan.simulate("deepseek-v3", **kw)
    dpa = kvplan.simulate("deepseek-v3", enable_dp_attention=True, data_parallel_size=8, **kw)
    assert dpa.kv_usage_peak < tp.kv_usage_peak
    assert dpa.completed == tp.completed == 200


def test_simulate_cli_takes_the_parallel_flags():
    r = run_cli("simulate", "-m", "deepseek-v3", "-g", "8xH200", "--max-model-len", "8K", "--engine", "sglang",
                "--enable-dp-attention", "-dp", "8", "--num-prompts", "40", "--input-len", "512",
                "--output-len", "32")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    head = " ".join(r.stdout.split())  # the header's wording: "1 token", the ranks named
    assert (
        "DP attention 8, sglang" in head and "each of 8 schedulers:" in head and "blocks of 1 token (" in head
    )
    d = json.loads(run_cli("simulate", "-m", "deepseek-v3", "-g", "8xH200", "--max-model-len", "8K", "--engine",
                           "sglang", "--enable-dp-attention", "-dp", "8", "--max-running-requests", "64",
                           "--num-prompts", "40", "--input-len", "512", "--output-len", "32",
                           "--json").stdout)  # fmt: skip
    dep = d["deployment"]
    # each rank's scheduler: its own pool, --max-running-requests / 8; the 40 requests dealt over the 8 ranks
    assert (dep["attention_dp_ranks"], dep["max_num_seqs"], d["completed"]) == (8, 8, 40)
    assert d["workload"]["num_requests"] == 40
    r = run_cli("simulate", "-m", "deepseek-v3", "-g", "8xH200", "--max-model-len", "8K", "-tp", "1", "-dp", "8",
                "--enable-expert-parallel", "--num-prompts", "40", "--input-len", "512", "--output-len", "32",
                "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)["deployment"]
    assert (d["data_parallel_size"], d["attention_dp_ranks"]) == (8, 1)
