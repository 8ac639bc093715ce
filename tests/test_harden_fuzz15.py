"""Session 14 hardening: fuzz pass 15's findings (each test failing on the code before)."""

from __future__ import annotations

import pytest

from tests.helpers import REPO, run_cli

REAL = REPO / "tests" / "fixtures" / "logs" / "real"
OLD_SGLANG = REAL / "sglang_unknownver_llama-3.1-8b-instruct_unknowngpu_tp1.log"


def _rows(result, key: str) -> dict[str, dict]:
    return {r["quantity"]: r for r in result.json()[key]}


def test_sglang_older_k_size_line_is_the_logs_kv_memory(tmp_path):
    # T2: SGLang's older "KV Cache is allocated. K size: 27.13 GB, V size: 27.13 GB." (no #tokens) was not read, so
    # check-log made "the log's KV memory" from max_total_num_tokens x kvplan's own cell and checked it against that
    # same count: it could not fail
    r = run_cli("check-log", str(OLD_SGLANG), "-m", "llama3.1-8b", "-g", "H100", "--json")
    assert r.exit_code == 0
    rows = _rows(r, "rows")
    assert rows["KV cache memory"]["log"] == round(54.26 * 2**30)  # K + V, SGLang's "GB" being GiB
    arithmetic = _rows(r, "arithmetic")
    assert (
        arithmetic["KV cache tokens"]["log"] == 444_500
        and abs(arithmetic["KV cache tokens"]["kvplan"] - 444_500) < 10
    )
    # an edited count no longer matches: 54.26 GiB of 64 KiB cells hold ~444,500 tokens, not 300,000
    edited = tmp_path / "edited.log"
    edited.write_text(
        OLD_SGLANG.read_text().replace("max_total_num_tokens=444500", "max_total_num_tokens=300000")
    )
    r = run_cli("check-log", str(edited), "-m", "llama3.1-8b", "-g", "H100", "--json")
    tokens = _rows(r, "arithmetic")["KV cache tokens"]
    assert tokens["log"] == 300_000 and tokens["difference"] > 0.4 and "matches" not in tokens["cause"]


def _running_after_each_step(conservativeness: float, steps: int = 8) -> list[int]:
    from kvplan.simulator.metrics import Recorder
    from kvplan.simulator.request import RequestSpec, SimRequest
    from kvplan.simulator.sglang_engine import SglangEngine

    eng = SglangEngine(5000, 1, None, 16384, 64, False, Recorder(), None, conservativeness)
    eng.add(SimRequest(0, RequestSpec(0.0, 100, 5)))  # finishes after 5 steps, freeing the batch
    for i in range(1, 20):
        eng.add(SimRequest(i, RequestSpec(0.0, 100, 1000)))
    out, t = [], 0.0
    for _ in range(steps):
        t += 0.01
        eng.complete(eng.schedule(), t)
        out.append(len(eng.running))
    return out


def test_sglang_dp_attention_admits_by_its_scaled_new_token_ratio():
    # T1: SGLang's server_args.py scales schedule_conservativeness by 0.3 under DP attention, so each running
    # request reserves 0.21 (not 0.7) x its remaining output when new requests are admitted. On 5,000 tokens, 4
    # running requests with ~995 tokens to go reserve 2,786 tokens at 0.7 (room for one more 1,100-token request)
    # and 836 at 0.21 (room for three)
    plain, dp_attention = _running_after_each_step(1.0), _running_after_each_step(0.3)
    assert plain[4:] == [4, 5, 5, 5] and dp_attention[4:] == [4, 7, 7, 7]


def test_simulate_under_dp_attention_uses_and_says_the_ratio():
    from kvplan.simulator.sglang_engine import new_token_ratios

    assert new_token_ratios(0.3)[:2] == pytest.approx((0.21, 0.0294))
    r = run_cli("simulate", "-m", "qwen3-235b-a22b", "-g", "8xH200", "--engine", "sglang", "--enable-dp-attention",
                "--dp-size", "8", "--max-model-len", "8K", "--weight-dtype", "fp8", "--num-prompts", "16",
                "--json")  # fmt: skip
    assert r.exit_code == 0
    said = [a for a in r.json()["assumptions"] if "schedule-conservativeness by 0.3" in a]
    assert said and "0.21" in said[0] and "0.0294" in said[0]
    # T3: ordinals
    assert any("every 8th request" in a for a in r.json()["assumptions"])


def test_ordinals():
    from kvplan.units import ordinal

    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"
    ]  # fmt: skip


def test_sglang_scheduler_resets_its_ratio_when_idle():
    # scheduler.py self_check_during_idle: an idle loop sets new_token_ratio back to its initial value
    from kvplan.simulator.metrics import Recorder
    from kvplan.simulator.request import RequestSpec, SimRequest
    from kvplan.simulator.sglang_engine import SglangEngine

    eng = SglangEngine(100_000, 1, None, 16384, 64, False, Recorder(), None, 1.0)
    eng.add(SimRequest(0, RequestSpec(0.0, 10, 50)))
    t = 0.0
    while eng.has_work():
        t += 0.01
        eng.complete(eng.schedule(), t)
    assert eng.new_token_ratio < 0.66  # decayed while it decoded
    eng.add(SimRequest(1, RequestSpec(1.0, 10, 50)))
    assert eng.new_token_ratio == 0.7


def test_compare_plot_says_why_a_model_has_no_curve_or_bar():
    # T4: deepseek-v3 on 8x H100 got a row of dashes and no memory bar, with no reason in the text or --json
    args = ("compare", "plot", "--models", "llama3.1-70b,deepseek-v3", "--variants", "shipped")
    why = "deepseek-v3: weights need 78.35 GiB per GPU"
    assert why in " ".join(run_cli(*args).stdout.split())
    data = run_cli(*args, "--json").json()
    assert [b["label"] for b in data["memory_per_gpu"]] == ["llama3.1-70b"]
    assert any(n.startswith(why) for n in data["notes"])


EAGLE3 = REAL / "sglang_unknownver_llama-3.1-8b-instruct_unknowngpu_tp1_eagle3.log"
EAGLE = REAL / "sglang_unknownver_llama-2-7b-chat-hf_unknowngpu_tp1_eagle.log"


@pytest.mark.parametrize(
    ("path", "target_k", "draft_k", "draft_weights"),
    [(EAGLE3, 1.25, 0.04, 1.77), (EAGLE, 5.00, 0.16, 0.93)],
)
def test_sglang_speculative_log_reads_the_target_and_the_draft_apart(path, target_k, draft_k, draft_weights):
    # SGLang's draft worker loads after the target and prints the same "Load weight end" / "KV Cache is allocated"
    # lines; kvplan took the draft's 1.77 GB as the weights and its 0.04 GB as the K size (check-log: weights
    # +745%, KV tokens -96.8%, printed as a mismatch of the user's flags)
    from kvplan.logs.logparse import parse

    f = parse(path.read_text()).facts
    gib = 2**30
    assert f["k_size_bytes"] == round(target_k * gib) and f["draft_k_size_bytes"] == round(draft_k * gib)
    assert f["draft_weights_bytes"] == round(draft_weights * gib)
    assert f["kv_cache_tokens"] == f["draft_kv_cache_tokens"] == 20480
    assert f["sglang_speculative_algorithm"] in ("EAGLE", "EAGLE3")


def test_check_log_refuses_an_sglang_draft_checkpoint_in_one_line():
    r = run_cli("check-log", str(EAGLE3), "-m", "llama3.1-8b", "-g", "H100")
    assert r.exit_code == 2
    assert "draft checkpoint (EAGLE3, 5 steps)" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("flags", "refused"),
    [
        # vllm/config/parallel.py ParallelConfig: redundant experts need EPLB, EPLB needs EP over TP x DP > 1
        ({"enable_expert_parallel": True, "num_redundant_experts": 32}, "needs --enable-eplb"),
        ({"enable_eplb": True}, "--enable-eplb needs --enable-expert-parallel"),
        ({"gpus": "H200", "tensor_parallel_size": 1, "enable_expert_parallel": True, "enable_eplb": True,
          "max_model_len": "1K", "weight_dtype": "fp4"}, "--enable-eplb needs TP or --data-parallel-size above 1"),
        # SGLang server_args.py _handle_eplb_and_dispatch: assert ep_size > 1
        ({"engine": "sglang", "enable_eplb": True}, "--enable-eplb needs expert parallelism"),
    ],
)  # fmt: skip
def test_eplb_rules_as_the_engines_check_them(flags, refused):
    import kvplan
    from kvplan.errors import UsageError

    base = {"gpus": "8xH200", "max_model_len": "8K"}
    with pytest.raises(UsageError, match=refused):
        kvplan.estimate("deepseek-v3", **{**base, **flags})


def test_eplb_with_redundant_experts_plans_them_and_says_so():
    import kvplan

    p = kvplan.estimate("deepseek-v3", gpus="8xH200", max_model_len="8K", enable_expert_parallel=True,
                        enable_eplb=True, num_redundant_experts=32)  # fmt: skip
    assert p.cluster.routed_experts_per_gpu == 36  # (256 + 32) / 8
    assert any(a.startswith("--enable-eplb: the engine rebalances") for a in p.assumptions)
    s = kvplan.estimate("deepseek-v3", gpus="8xH200", max_model_len="8K", engine="sglang", ep_size=8,
                        enable_eplb=True, num_redundant_experts=32)  # fmt: skip
    assert s.cluster.routed_experts_per_gpu == 36
    r = run_cli("estimate", "-m", "deepseek-v3", "-g", "8xH200", "--max-model-len", "8K", "--enable-expert-parallel",
                "--enable-eplb", "--num-redundant-experts", "32", "--json")  # fmt: skip
    assert r.exit_code == 0 and any("--enable-eplb" in a for a in r.json()["assumptions"])
