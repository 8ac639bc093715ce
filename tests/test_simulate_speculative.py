"""Speculative decoding in `kvplan simulate` and `solve --request-rate`: the scheduler's tokens and
slots per decoding request (vLLM v0.11 scheduler.py num_tokens_with_spec and num_lookahead_tokens),
the mean-field acceptance, the step time (plan_speed.spec_step) and the launch lines."""

from __future__ import annotations

import json

import pytest
from test_simulate import deployment, drive

import kvplan
from helpers import run_cli
from kvplan.request import Speculative
from kvplan.search.solve import speculative_flags
from kvplan.simulator import Workload, from_plan, simulate
from kvplan.simulator.metrics import Recorder
from kvplan.simulator.request import RequestSpec, SimRequest
from kvplan.simulator.sglang_engine import SglangEngine
from kvplan.simulator.step import SpecDecode
from kvplan.simulator.steptime import FixedSteps
from kvplan.simulator.vllm_engine import VllmEngine

MTP2 = '{"method": "mtp", "num_speculative_tokens": 2}'


class Log(Recorder):
    step = 0

    def preempted(self, req):
        super().preempted(req)


def test_mean_field_acceptance_keeps_whole_tokens_and_the_mean():
    spec = SpecDecode(draft_tokens=3, lookahead=3, tokens_per_step=2.5)
    req = SimRequest(0, RequestSpec(0.0, 10, 100))
    kept = [spec.accepted(req) for _ in range(6)]
    assert kept == [2, 3, 2, 3, 2, 3]
    # never more than the request still has to produce, never fewer than the verified token
    short = SimRequest(1, RequestSpec(0.0, 10, 2))
    short.num_output = 1
    assert spec.accepted(short) == 1
    low = SpecDecode(1, 1, 1.0)
    assert [low.accepted(req) for _ in range(3)] == [1, 1, 1]


def test_vllm_decode_verifies_the_drafts_and_holds_lookahead_slots_by_hand():
    # block size 4, k = 3 drafts, lookahead 3 (EAGLE-style): prompt 8 -> one prefill step (2 blocks,
    # the first token); each decode step schedules 1 + 3 tokens and allocates computed + 4 + 3 slots
    spec = SpecDecode(3, 3, 2.5)
    log = Log()
    eng = VllmEngine(100, 4, 4096, 256, 1 << 20, False, log, spec)
    a = SimRequest(0, RequestSpec(0.0, 8, 11))
    eng.add(a)
    step = eng.schedule()
    assert step.prefills == [(a, 0, 8)] and not step.decodes
    # a waiting request is admitted with no lookahead (effective_lookahead_tokens = 0 while
    # num_computed_tokens == 0): ceil(8 / 4) = 2 blocks
    assert len(a.blocks) == 2
    eng.complete(step, 1.0)
    assert a.num_output == 1 and a.num_computed == 8
    kept = []
    t = 1.0
    while eng.has_work():
        before = a.num_computed
        step = eng.schedule()
        assert step.decodes == [a]
        # the slots: computed + (1 + 3) + 3 lookahead
        assert len(a.blocks) == -(-(before + 4 + 3) // 4)
        t += 1.0
        eng.complete(step, t)
        kept.append(a.num_computed - before)
    # 10 tokens after the first: 2, 3, 2, 3 kept over four decode steps
    assert kept == [2, 3, 2, 3] and a.num_output == 11
    # TPOT over four steps of 1 s for 10 tokens; one ITL sample per step (one streamed chunk each)
    assert (a.finish_s - a.first_token_s) / (a.num_output - 1) == pytest.approx(0.4)
    assert sorted(log.itl) == [(1.0, 4)]  # four samples of 1 s (kept by value)


def test_vllm_token_budget_counts_the_drafts():
    # budget 8, k = 3: a decoding request takes 1 + 3 of the budget, so two decode a step and the
    # third waits for the next one
    spec = SpecDecode(3, 3, 1.0)
    log = Log()
    eng = VllmEngine(1000, 16, 8, 256, 1 << 20, False, log, spec)
    reqs = [SimRequest(i, RequestSpec(0.0, 2, 4)) for i in range(3)]
    for r in reqs:
        eng.add(r)
    step = eng.schedule()  # the three prompts (6 tokens) fit the budget
    assert [n for _, _, n in step.prefills] == [2, 2, 2]
    eng.complete(step, 1.0)
    step = eng.schedule()
    assert [r.rid for r in step.decodes] == [0, 1]


def test_sglang_decode_keeps_accepted_tokens_and_checks_room_for_the_verified_ones():
    spec = SpecDecode(3, 0, 2.0)
    log = Log()
    eng = SglangEngine(10_000, 1, None, 16384, 64, False, log, spec)
    a = SimRequest(0, RequestSpec(0.0, 10, 7))
    steps = drive(eng, [a], log)
    # one prefill step (first token), then 6 tokens kept 2 a step: three decode steps
    assert steps[0] == ([], [(0, 0, 10)])
    assert steps[1:] == [([0], [])] * 3
    assert a.num_output == 7
    # a pool that admits both (each prompt + output reserve, 7 tokens, below what is left) but has
    # no room for 1 + 3 verified tokens each a step retracts one of them
    log2 = Log()
    tight = SglangEngine(15, 1, None, 16384, 64, False, log2, SpecDecode(3, 0, 1.0))
    b = SimRequest(0, RequestSpec(0.0, 4, 3))
    c = SimRequest(1, RequestSpec(0.0, 4, 3))
    for r in (b, c):
        tight.add(r)
    tight.complete(tight.schedule(), 1.0)
    assert len(tight.running) == 2 and tight.available == 7
    tight.schedule()  # two decodes would need 2 x 4 slots; 7 are free: one is retracted
    assert log2.preemptions == 1 and len(tight.running) == 1


def test_from_plan_takes_the_speculative_setup_and_times_the_verify_step():
    plain = kvplan.simulate("deepseek-v3", gpus="8xH200", max_model_len="8K", num_prompts=40,
                            input_len=1024, output_len=256, request_rate=1.0)  # fmt: skip
    spec = kvplan.simulate("deepseek-v3", gpus="8xH200", max_model_len="8K", num_prompts=40,
                           input_len=1024, output_len=256, request_rate=1.0,
                           speculative_config=MTP2)  # fmt: skip
    d = spec.to_dict()["deployment"]["speculative"]
    # vLLM: 2 drafts, 2 lookahead slots (mtp is EAGLE-style), 1 + 0.85 + 0.85^2 kept a step (the MTP default)
    assert d == {"draft_tokens": 2, "lookahead_slots": 2, "tokens_per_step": pytest.approx(2.5725)}
    assert plain.to_dict()["deployment"]["speculative"] is None
    # at one request a second the batch is small: the verify step over 3 tokens costs well under
    # 2.57 plain steps, so TPOT falls by more than 1.5x
    assert spec.tpot_ms.median < plain.tpot_ms.median / 1.5
    assert any("speculative decoding (mtp)" in a for a in spec.assumptions)


def test_the_simulated_step_is_plan_speeds_speculative_step():
    from kvplan.commands import inputs
    from kvplan.plan.plan import estimate
    from kvplan.speed import plan_speed

    flags = inputs.EstimateFlags(model="deepseek-v3", gpus="8xH200", max_model_len="8K",
                                 speculative_config=MTP2)  # fmt: skip
    req = inputs.plan_request(flags)
    plan = estimate(req)
    dep = from_plan(plan, req)
    got = dep.steps.decode_seconds(16, 1500)  # timed at the middle of its bucket [1472, 1504): 1488
    kv = dep.steps.kv_bytes_per_token * 1488
    want = plan_speed.spec_step(plan.decode.inputs, req.speculative, 16, kv, 1488, plan.decode.parts).step_ms
    assert got == pytest.approx(want / 1e3)
    # a step of prefill chunks alone (no decodes) is the plain one-row pass
    assert dep.steps.decode_seconds(0, 0) == pytest.approx(plan.decode.step(1, 0, 0).tpot_ms / 1e3)


def test_sglang_deployment_holds_no_lookahead():
    r = kvplan.simulate("deepseek-v3", gpus="8xH200", max_model_len="8K", num_prompts=20, engine="sglang",
                        input_len=512, output_len=64, speculative_algorithm="NEXTN",
                        speculative_num_steps=3, speculative_num_draft_tokens=4)  # fmt: skip
    assert r.to_dict()["deployment"]["speculative"]["lookahead_slots"] == 0
    assert r.to_dict()["deployment"]["speculative"]["draft_tokens"] == 3


def test_fixed_steps_run_with_speculation_through_the_event_loop():
    d = deployment(steps=FixedSteps(0.01, 0.0, 0.0))
    from dataclasses import replace

    d = replace(d, speculative=SpecDecode(3, 3, 2.0))
    w = Workload(tuple(RequestSpec(0.0, 16, 9) for _ in range(3)), None, "three")
    r = simulate(d, w)
    # one prefill step, then 8 tokens at 2 a step: 4 decode steps of 10 ms each; TPOT 40 ms / 8 tokens
    assert r.completed == 3 and r.steps == 5 and r.duration_s == pytest.approx(0.05)
    assert r.output_token_throughput == pytest.approx(27 / 0.05)
    assert r.tpot_ms.mean == pytest.approx(5.0)
    assert r.itl_ms.mean == pytest.approx(10.0)


def test_simulate_cli_takes_the_speculative_flags():
    r = run_cli("simulate", "-m", "deepseek-v3", "-g", "8xH200", "--max-model-len", "8K", "--num-prompts", "20",
                "--input-len", "512", "--output-len", "64", "--speculative-config", MTP2, "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["deployment"]["speculative"]["draft_tokens"] == 2
    bad = run_cli("simulate", "-m", "llama3-8b", "--speculative-config", '{"method": "eagle3", '
                  '"num_speculative_tokens": 3}', "--acceptance-length", "2")  # fmt: skip
    assert bad.exit_code == 2 and "--speculative-draft-config" in bad.stderr


def test_solve_at_a_rate_simulates_speculation_and_launches_it():
    args = ["solve", "-m", "deepseek-v3", "-g", "H200", "--request-rate", "2", "--ttft-ms", "2000",
            "--tpot-ms", "20", "--input-len", "2048", "--output-len", "512", "--max-model-len", "8K",
            "--num-prompts", "300"]  # fmt: skip
    plain = json.loads(run_cli(*args, "--json").stdout)
    spec = run_cli(*args, "--speculative-config", MTP2, "--json")
    assert spec.exit_code == 0, spec.stderr
    spec = json.loads(spec.stdout)
    # MTP lowers TPOT enough that one TP 8 node meets 20 ms at 2 requests/s where plain decoding needs two
    assert (spec["answer"]["num_gpus"], plain["answer"]["num_gpus"]) == (8, 16)
    assert spec["tpot_ms"]["p90"] < 20 and spec["tpot_ms"]["p90"] < plain["tpot_ms"]["p90"]
    assert (
        '--speculative-config \'{"method": "mtp", "num_speculative_tokens": 2}\''
        in spec["answer"]["vllm_flags"]
    )
    assert "--speculative-algorithm NEXTN --speculative-num-steps 2" in spec["answer"]["sglang_flags"]


def test_speculative_launch_flags_per_engine():
    mtp = Speculative.make("mtp", 3, None, None, "--speculative-config method")
    assert speculative_flags("vllm", mtp) == [
        '--speculative-config \'{"method": "mtp", "num_speculative_tokens": 3}\''
    ]
    assert speculative_flags("sglang", mtp) == [
        "--speculative-algorithm NEXTN", "--speculative-num-steps 3", "--speculative-num-draft-tokens 4",
    ]  # fmt: skip
    eagle = Speculative.make("eagle3", 2, 3, 2.0, "--speculative-algorithm")
    assert speculative_flags("sglang", eagle)[-1] == "--speculative-draft-model-path DRAFT_MODEL_PATH"
    assert '"model": "DRAFT_MODEL_PATH"' in speculative_flags("vllm", eagle)[0]
    assert speculative_flags("vllm", None) == []


def test_disaggregated_decode_pool_is_timed_at_the_speculative_step():
    args = ["solve", "-m", "deepseek-v3", "-g", "H200", "--request-rate", "2", "--ttft-ms", "3000",
            "--tpot-ms", "30", "--input-len", "2048", "--output-len", "512", "--max-model-len", "8K",
            "--num-prompts", "200", "--disaggregated", "--json"]  # fmt: skip
    plain = json.loads(run_cli(*args).stdout)
    r = run_cli(*args, "--speculative-config", MTP2)
    assert r.exit_code == 0, r.stderr
    spec = json.loads(r.stdout)
    # the decode pool's TPOT is spec_step's per-token figure: below the plain step at the same load
    assert spec["decode"]["tpot_ms"] < plain["decode"]["tpot_ms"] / 1.5
    assert any("decode TPOT under speculative decoding (mtp)" in a for a in spec["assumptions"])
    assert "--speculative-config" in spec["decode"]["launch"]


def test_solve_at_a_rate_weighs_dp_attention_for_an_moe_model():
    # SGLang, DeepSeek-V3 on H200 at 8 requests/s of 2,048 in / 512 out within TTFT 2 s / TPOT 40 ms:
    # two TP 8 units with DP attention (8 ranks each) meet it, each simulated at 4 requests/s
    r = run_cli("solve", "-m", "deepseek-v3", "-g", "H200", "--request-rate", "8", "--ttft-ms", "2000",
                "--tpot-ms", "40", "--input-len", "2048", "--output-len", "512", "--max-model-len", "8K",
                "--num-prompts", "400", "--engine", "sglang", "--json")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    a = d["answer"]
    assert (a["num_gpus"], a["tensor_parallel_size"], a["data_parallel_size"], a["attention_dp_size"]) == (
        16,
        8,
        2,
        8,
    )
    assert d["per_replica_rate"] == pytest.approx(4.0)
    assert "--enable-dp-attention --dp-size 8" in a["sglang_flags"]
    assert a["why_expert_parallel"].startswith(
        "each of its DP attention ranks holds only its own requests' KV"
    )
    assert d["tpot_ms"]["p90"] <= 40 and d["goodput"] <= 8


def test_vllm_expert_parallel_cores_are_candidates_at_their_share_of_the_rate():
    from kvplan.commands import inputs
    from kvplan.search import rate

    q = inputs.solve_query(inputs.SolveFlags(model="deepseek-v3", gpus="H200", users=1, max_model_len="8K",
                                             input_len=2048, output_len=512, tpot_ms=40))  # fmt: skip
    w = kvplan_synthetic(200)
    s = rate.Search(q, w, rate.LoadTargets(2000, 40, 90))
    cands = s.candidates()
    ep = [c for c in cands if c.par.on and c.dtype == "auto"]
    # one node of 8 H200 per unit (each KV dtype): TP 1 x DP 8, 2 x 4, 4 x 2, each core its own scheduler
    assert sorted((c.tp, c.par.dp, c.unit, c.deployment.shares) for c in ep) == [
        (1, 8, 8, 8), (2, 4, 8, 4), (4, 2, 8, 2),
    ]  # fmt: skip
    # plain TP 8 ranks before the expert-parallel units of the same cost
    assert not cands[0].par.on and cands[0].unit == 8
    c = next(c for c in ep if c.tp == 4)
    r = s.run(c, 4.0, 2)
    # two units at 8 requests/s: each unit at 4, both its cores simulated, each on every other request
    assert [p.rate for p in s.points(c, 2)] == [pytest.approx(8.0)]
    assert r.completed == 200 and r.workload["num_requests"] == 200
    assert c.label == "H200 TP 4 x DP 2, EP 8, KV auto"


def kvplan_synthetic(n: int):
    from kvplan.simulator import synthetic

    return synthetic(num_prompts=n, input_len=2048, output_len=512, request_rate=1.0, seed=0)
