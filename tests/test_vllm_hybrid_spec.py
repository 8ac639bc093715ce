"""vLLM's KV blocks for hybrid (Gated DeltaNet) models under speculative decoding and prefix caching,
held against real startup logs (tests/fixtures/logs/real/SOURCES.tsv).

Rules (vLLM, read from these logs and the engine's source): the MTP layer joins the target's KV-cache
groups; a request holds 1 + k pages per recurrent-state group in Mamba cache mode 'none' and 2 + k in
'align' (k = num_speculative_tokens; kv_cache_interface.py MambaSpec.max_memory_usage_bytes), the mode
vLLM picks for a hybrid model when prefix caching is on; a Gated DeltaNet convolution state holds
conv_kernel - 1 + k rows (mamba_utils.py gated_delta_net_state_shape).
"""

from __future__ import annotations

import json
import math

from helpers import REPO, plan, run_cli
from kvplan.logs.logparse import parse
from kvplan.request import Speculative

LOGS = REPO / "tests" / "fixtures" / "logs" / "real"
CORPUS = REPO / "tests" / "fixtures" / "hf" / "corpus"
QWEN35 = str(CORPUS / "qwen3.5-27b.json")  # Qwen3.6-27B's text shapes (benchmarks/log_predictions.py)
QWEN36_NVFP4 = str(CORPUS / "qwen3.6-27b-nvfp4.json")
TP2_MTP = LOGS / "vllm_0.23.0_qwen3.6-27b-text-nvfp4-mtp_rtx5060ti16gb_tp2_mtp3.log"
TP4_MTP = LOGS / "vllm_0.23.0_qwen3.6-27b-fp8_rtx5060ti16gb_tp4_mtp3.log"
TP1_ALIGN = LOGS / "vllm_0.27.1_qwen3.6-27b-fp8_h100_tp1.log"
NGRAM = LOGS / "vllm_0.18.0_qwen3-8b_rtx4090-48gb_tp1_ngram4.log"


def _mtp(k: int) -> Speculative:
    return Speculative.make("mtp", k, None, None, "--speculative-config method")


def _arithmetic(log, model: str, gpus: str) -> dict[str, dict]:
    # the logs' GPUs (RTX 5060 Ti 16GB, a 48GB RTX 4090) are not in kvplan's catalog: a card with room for
    # the weights stands in; the arithmetic given the log's KV memory does not depend on it
    r = run_cli("check-log", str(log), "--model", model, "--gpus", gpus, "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    return {row["quantity"]: row for row in json.loads(r.stdout)["arithmetic"]}


def test_logs_name_their_speculative_config():
    facts = parse(TP4_MTP.read_text()).facts
    assert (facts["speculative_method"], facts["speculative_tokens"]) == ("mtp", 3)  # qwen3_next_mtp resolved
    assert facts["enable_prefix_caching"] is True
    facts = parse(NGRAM.read_text()).facts
    assert (facts["speculative_method"], facts["speculative_tokens"]) == ("ngram", 4)


def test_mtp_layer_joins_the_groups_and_widens_the_conv_state():
    # TP 2, fp8 KV: attention 2 KV heads x 256 x 2 x 1 B = 1,024 B a token; GDN state 24 x 128 x 128 x 4 B
    # + conv 5,120 channels x (4 - 1 + 3) rows x 2 B = 1,634,304 B -> block 16 x ceil(1,634,304 / 16,384)
    # = 1,600 (the log: "Setting attention block size to 1600 tokens"); without the 3 rows 1,603,584 B: 1,568
    kw = {"num_gpus": 2, "engine_version": "0.23", "max_model_len": 65535, "kv_cache_dtype": "fp8",
              "enable_prefix_caching": False, "kv_cache_memory_bytes": 78 * 17 * 1_638_400}  # fmt: skip
    p = plan(QWEN36_NVFP4, "L4", speculative=_mtp(3), **kw)
    assert p.settings.block_size == 1600
    assert any("widens each Gated DeltaNet layer's convolution state by the 3" in n for n in p.assumptions)
    groups = sorted((g.kind, g.num_layers, g.slots) for g in p.engine.details.groups)
    # 16 attention layers + the MTP layer = 17: group size 17, the 48 GDN layers in 3 groups of 17 slots
    assert groups == [("full", 17, 17)] + [("state", 16, 17)] * 3
    assert "Add 3 padding layers, may waste at most 6.25% KV cache memory" in p.engine.log_lines  # as logged
    # a request: ceil(65,535 / 1,600) = 41 attention blocks + (1 + 3) pages in each state group
    assert p.engine.details.blocks_per_request == 41 + 3 * 4
    assert p.engine.num_blocks == 78
    assert "GPU KV cache size: 96,447 tokens" in p.engine.log_lines  # int(78 / 53 x 65,535), as logged
    plain = plan(QWEN36_NVFP4, "L4", **kw)
    assert plain.settings.block_size == 1568
    assert plain.engine.details.blocks_per_request == 42 + 3  # ceil(65,535 / 1,568) + 1 a state group


def test_real_mtp_log_reproduced_exactly():
    rows = _arithmetic(TP2_MTP, QWEN36_NVFP4, "2xL4")
    assert rows["KV cache tokens"]["log"] == rows["KV cache tokens"]["kvplan"] == 96447
    assert rows["maximum concurrency"]["kvplan"] == 1.47


def test_prefix_caching_on_a_hybrid_is_align_mode():
    # TP 4, fp8 KV: 1 KV head x 256 x 2 = 512 B a token; state 12 x 128 x 128 x 4 + 2,560 x 6 x 2 = 817,152 B
    # -> block 1,600; 446 blocks of 17 x 819,200 B; a request: ceil(150,000 / 1,600) = 94 + 3 x (2 + 3) = 109
    kw = {"num_gpus": 4, "engine_version": "0.23", "max_model_len": 150000, "kv_cache_dtype": "fp8",
              "speculative": _mtp(3), "kv_cache_memory_bytes": 446 * 17 * 819_200}  # fmt: skip
    p = plan(QWEN35, "L4", enable_prefix_caching=True, **kw)
    assert p.engine.details.blocks_per_request == 94 + 3 * 5
    assert p.engine.log_lines[-2:] == [
        "GPU KV cache size: 613,761 tokens",  # the log's figures
        "Maximum concurrency for 150,000 tokens per request: 4.09x",
    ]
    # vLLM before 0.28 leaves prefix caching off for a hybrid model unless asked: mode 'none'
    quiet = plan(QWEN35, "L4", prefix_caching_stated=False, **kw)
    assert quiet.engine.details.blocks_per_request == 94 + 3 * 4
    assert any(
        "prefix caching off: mamba_cache_mode 'none', 1 + 3 speculative" in n for n in quiet.assumptions
    )
    # from 0.28 it is on by default
    new = plan(QWEN35, "L4", **{**kw, "engine_version": "0.28"}, prefix_caching_stated=False)
    assert new.engine.details.blocks_per_request == 94 + 3 * 5


def test_real_align_mode_logs():
    # 5.8 GiB as logged (one decimal) gives 447 blocks where vLLM had 446: within the rounding
    rows = _arithmetic(TP4_MTP, QWEN35, "4xL4")
    assert rows["KV cache tokens"]["log"] == 613761
    assert (
        0 < rows["KV cache tokens"]["kvplan"] - 613761 <= 150000 // 109 + 1
    )  # one block: 447 / 109 x 150,000
    assert rows["maximum concurrency"]["kvplan"] == 4.10  # 447 / 109; the log's 4.09 is 446 / 109
    # 0.27.1, TP 1, no speculation: 857 blocks, 6 + 3 x 2 = 12 a request, int(857 / 12 x 4,096) tokens
    rows = _arithmetic(TP1_ALIGN, QWEN35, "H100")
    assert rows["KV cache tokens"]["log"] == rows["KV cache tokens"]["kvplan"] == 292522
    assert rows["maximum concurrency"]["log"] == rows["maximum concurrency"]["kvplan"] == 71.42


def test_ngram_holds_nothing():
    rows = _arithmetic(NGRAM, "Qwen/Qwen3-8B", "L40S")
    assert rows["KV cache tokens"]["log"] == rows["KV cache tokens"]["kvplan"] == 143872
    assert rows["maximum concurrency"]["kvplan"] == 35.12


def test_a_draft_checkpoint_in_a_log_is_refused_in_one_line(tmp_path):
    text = TP2_MTP.read_text().replace("SpeculativeConfig(method='mtp'", "SpeculativeConfig(method='eagle3'")
    log = tmp_path / "eagle3.log"
    log.write_text(text)
    r = run_cli("check-log", str(log), "--model", QWEN36_NVFP4, "--gpus", "2xL4")
    assert r.exit_code != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "draft checkpoint (eagle3, 3 tokens)" in lines[0]
    assert "--speculative-draft-config" in lines[0]


def test_kvplan_counts_the_state_pages_vllm_charges_a_request():
    # Qwen3.5-27B on an H100 at 32K, vLLM 0.33 (prefix caching on: 'align' mode) with MTP 3: vLLM charges a
    # request 41 attention blocks + 5 pages in each of 3 state groups = 56 of 362 blocks (6.46x); kvplan counted
    # one copy of each state and said 8 users. Now 2 + 3 copies: 6, the engine's figure less the null block.
    kw = {"max_model_len": 32768}
    p = plan(QWEN35, "H100", speculative=_mtp(3), **kw)
    assert p.engine.details.blocks_per_request == 41 + 3 * 5 and p.engine.num_blocks == 362
    assert p.max_concurrency == 6 and abs(p.concurrency_factor - 362 / 56) < 0.01
    plain = plan(QWEN35, "H100", **kw)  # 2 pages a state group ('align', no draft)
    d = plain.engine.details
    assert sorted({g.blocks_per_request for g in d.groups if g.kind == "state"}) == [2]
    assert (
        plain.max_concurrency == 8
        and abs(plain.concurrency_factor - plain.engine.num_blocks / d.blocks_per_request) < 0.01
    )
    off = plan(QWEN35, "H100", enable_prefix_caching=False, **kw)  # one page: kvplan's count as before
    assert off.max_concurrency == math.floor(off.engine.max_concurrency)


def test_the_kv_table_says_the_pool_tokens_are_before_the_fixed_state():
    # the pool's 409 blocks x 784 tokens = 320,656 read as tokens any load reaches, beside vLLM's 79,968 line;
    # each request's recurrent state takes blocks too
    out = run_cli("estimate", "-m", QWEN35, "-g", "H100", "--max-model-len", "32768").stdout
    assert "KV pool per replica, before fixed state" in out and "320,656 tokens" in out
    assert "of which fixed (state, image K/V)" in out and "block (per-token layers, per GPU)" in out
    plain = run_cli("estimate", "-m", "llama3.1-8b", "-g", "H100").stdout
    assert (
        "KV pool per replica " in plain and "before fixed state" not in plain and "block (all layers" in plain
    )
