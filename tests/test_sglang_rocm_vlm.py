"""SGLang on AMD Instinct and SGLang's multimodal --mem-fraction-static, against the one whole ROCm MoE log
in the fixtures: Kimi-K2.5 on 8x MI355X, SGLang 0.5.8.post1 (tests/fixtures/logs/real/SOURCES.tsv,
sglang_0.5.8.post1_kimi-k2.5_mi355x_tp8.md: an issue page holding the server log of three launches)."""

from __future__ import annotations

import json
import re

import pytest

from helpers import REPO, plan, run_cli
from kvplan.engines import sglang_memory
from kvplan.engines.sglang import memory_settings, vlm_fraction_factor
from kvplan.specs.registry import load_gpu
from kvplan.units import GiB

LOG = REPO / "tests" / "fixtures" / "logs" / "real" / "sglang_0.5.8.post1_kimi-k2.5_mi355x_tp8.md"
CORPUS = REPO / "tests" / "fixtures" / "hf" / "corpus"


def test_sglangs_vision_encoder_factor_by_hand():
    # server_args.py v0.5.2 adjust_mem_fraction_for_vlm: 0.95 x clamp(1 - 0.1 x (L x H^2 / (24 x 1024^2) - 1))
    assert vlm_fraction_factor(24, 1024) == pytest.approx(0.95)  # ViT-L/14, the baseline
    # Kimi-K2.5's MoonViT (and SigLIP): 27 x 1152^2 / (24 x 1024^2) = 1.4238 -> 0.95 x 0.95762
    assert vlm_fraction_factor(27, 1152) == pytest.approx(0.95 * 0.9576171875)
    assert vlm_fraction_factor(64, 4096) == pytest.approx(0.95 * 0.8)  # clamped below
    assert vlm_fraction_factor(1, 64) == pytest.approx(0.95 * 1.05)  # clamped above


def test_the_kimi_log_s_fraction_is_sglangs_default_times_the_vision_factor():
    logged = float(re.search(r"mem_fraction_static=([0-9.]+)", LOG.read_text()).group(1))
    assert logged == 0.8260405859375
    gpu = load_gpu("MI355X").memory_bytes
    assert gpu == pytest.approx(287.98 * GiB, abs=0.005 * GiB)  # as the GLM-5 log's OOM message prints it
    m = memory_settings(gpu, 8, 1, release=(0, 5, 8, 0), vit=[27, 1152])
    assert m.mem_fraction_static == pytest.approx(logged, abs=1e-9)
    assert "adjust_mem_fraction_for_vlm" in (m.source or "")
    # a text-only model keeps 0.908 (the GLM-5-FP8 log of the same author on the same machine prints it)
    assert memory_settings(gpu, 8, 1, release=(0, 5, 8, 0)).mem_fraction_static == 0.908
    # before 0.5.2 (the release read) the factor is not applied; a given fraction is never adjusted
    old = memory_settings(gpu, 8, 1, release=(0, 5, 1, 0), vit=[27, 1152])
    assert old.mem_fraction_static == memory_settings(gpu, 8, 1, release=(0, 5, 1, 0)).mem_fraction_static
    assert memory_settings(gpu, 8, 1, 0.9, release=(0, 5, 8, 0), vit=[27, 1152]).mem_fraction_static == 0.9


def test_the_hf_reader_takes_the_vision_encoder_as_sglang_reads_it(tmp_path):
    from kvplan.specs.registry import load_model

    assert load_model(str(CORPUS / "kimi-k2.5.json")).vision_vit == [27, 1152]  # its vt_ names
    assert load_model(str(CORPUS / "gemma-3-27b-it.json")).vision_vit == [27, 1152]
    # Qwen3.5's vision_config says depth, not num_hidden_layers: SGLang's getattr default 24
    assert load_model(str(CORPUS / "qwen3.5-9b.json")).vision_vit == [24, 1152]
    assert load_model(str(CORPUS / "qwen3-32b.json")).vision_vit is None  # text only
    cfg = json.loads((CORPUS / "gemma-3-27b-it.json").read_text())
    cfg["vision_config"]["num_hidden_layers"] = "27"  # not an integer: no factor rather than a wrong one
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_model(str(tmp_path)).vision_vit is None
    # every shipped multimodal spec carries it, as its config.json gives it
    assert load_model("kimi-k2.5").vision_vit == [27, 1152]
    assert load_model("qwen3.5-397b-a17b").vision_vit == [24, 1152]


def test_rocm_startup_memory_is_the_logs():
    text = LOG.read_text()
    # rank 0: RCCL and the all-reduce buffers 3.81 GB at init, 283.56 GB free of 287.98 GiB before loading
    assert "[2026-02-26 16:31:00 TP0] Load weight begin. avail mem=283.56 GB" in text
    assert "TP0] Init torch distributed ends. elapsed=17.24 s, mem usage=3.81 GB" in text
    in_use = load_gpu("MI355X").memory_bytes - 283.56 * GiB
    assert sglang_memory.startup_bytes(8, 1, False, amd=True) == pytest.approx(in_use, rel=0.003)
    assert sglang_memory.startup_bytes(1, 1, False, amd=True) == pytest.approx(0.61 * GiB, rel=0.01)
    # NVIDIA at TP 8 on NVLS boards: 0.35 + 8 x 0.176 GiB
    assert sglang_memory.startup_bytes(8, 1, True) == pytest.approx(1.758 * GiB, rel=0.01)


def test_check_log_on_the_kimi_mi355x_log():
    r = run_cli("check-log", str(LOG), "-g", "MI355X", "-m", str(CORPUS / "kimi-k2.5.json"), "--json")
    assert r.exit_code == 0, r.stderr
    rows = {x["quantity"]: x for x in json.loads(r.stdout)["rows"]}
    arith = {x["quantity"]: x for x in json.loads(r.stdout)["arithmetic"]}
    # the token arithmetic given the logged KV memory (160.63 GB, 2,454,391 tokens, MLA latent bf16): within the
    # 0.01 GiB the printed size is rounded to, 0.01 GiB / (61 x 1,152 B) = 153 tokens
    assert arith["KV cache tokens"]["log"] == 2454391
    assert abs(arith["KV cache tokens"]["kvplan"] - 2454391) <= 0.01 * 2**30 / (61 * 1152)
    assert arith["KV cache tokens"]["cause"].startswith("matches")
    # startup memory within 1% of the log's; the pool +2.6%, all of it the weights (73.58 GiB logged,
    # 69.17 kvplan: the int4 experts' Triton repacking or the vision tower, not found)
    assert rows["memory in use at startup"]["difference"] == pytest.approx(-0.008, abs=0.01)
    assert rows["KV cache memory"]["difference"] == pytest.approx(0.026, abs=0.005)
    assert rows["weights per GPU"]["difference"] == pytest.approx(-0.060, abs=0.005)
    # before the ROCm startup and the vision factor: +17.1% (kvplan's own 0.908 and 0.40 GiB at startup)
    e = plan("kimi-k2.5", "MI355X", num_gpus=8, engine="sglang", engine_version="0.5.8.post1")
    assert e.settings.mem_fraction_static == pytest.approx(0.8260405859375, abs=1e-9)


def test_check_log_at_80_columns_cuts_nothing():
    from typer.testing import CliRunner

    from kvplan.cli.app import app

    out = CliRunner(env={"COLUMNS": "80", "NO_COLOR": "1"}).invoke(
        app, ["check-log", str(LOG), "-g", "MI355X", "-m", str(CORPUS / "kimi-k2.5.json")]
    )
    assert out.exit_code == 0
    assert "…" not in out.stdout
    assert max(len(line) for line in out.stdout.splitlines()) <= 80
    # the causes go below the table, whole: the flag names uncut
    assert "- weights per GPU: weights as loaded differ (quantization, padding): try" in out.stdout
    assert "--weight-dtype" in out.stdout and "--save-calibration" in out.stdout


def test_vllm_on_rocm_before_0_21_says_its_weights_are_device_memory():
    """vllm/platforms/rocm.py get_current_memory_usage: total - free from 0.7.3 to 0.20.2 (0.21.0 back to
    torch.cuda.max_memory_allocated, as on CUDA): the logged weights and the KV budget carry whatever came
    into use while loading, so kvplan's KV figure is an upper bound there and it says so."""

    def said(version: str, gpu: str) -> bool:
        p = plan("mixtral-8x7b", gpu, num_gpus=8, engine_version=version)
        return any("vLLM 0.7.3-0.20.2 on ROCm" in a for a in p.assumptions)

    assert said("0.10", "MI300X") and said("0.20", "MI325X")
    assert not said("0.21", "MI300X") and not said("0.23", "MI300X") and not said("0.10", "H100")


GLM5_LOG = REPO / "tests" / "fixtures" / "logs" / "real" / "sglang_0.5.9_glm-5-fp8_mi355x_tp8.md"


def test_a_dsa_pools_kv_size_counts_the_indexer_keys():
    """GLM-5-FP8 on 8x MI355X (SGLang 0.5.9, KV fp8_e4m3): SGLang's "KV size" of a DSA pool adds the
    indexer's key buffers to the latent's (mem_cache/memory_pool.py DSATokenToKVPool.get_kv_size_bytes):
    78 layers x (656 B fp8 latent + 132 B indexer key) x 3,199,576 slots = 183.15 GB (2**30) as logged;
    the latent alone was 152.47, -16.8%. GLM-5.1's config.json has GLM-5's pool shapes (the token
    arithmetic is exact with it)."""
    r = run_cli(
        "check-log", str(GLM5_LOG), "-g", "MI355X", "-m", str(CORPUS / "glm-5.1.json"), "--weight-dtype", "fp8",
        "--json",
    )  # fmt: skip
    arith = {x["quantity"]: x for x in json.loads(r.stdout)["arithmetic"]}
    # within the 0.01 GiB the printed KV size is rounded to: 0.01 GiB / (78 x 788 B) = 174 tokens
    assert arith["KV cache tokens"]["log"] == 3199575
    assert abs(arith["KV cache tokens"]["kvplan"] - 3199575) <= 0.01 * 2**30 / (78 * 788)
    assert arith["KV size"]["log"] == pytest.approx(183.15 * GiB, abs=0.005 * GiB)
    # its pool line: the tokens + the padded slot, each 78 layers x (656 + 132) B, the log's size within rounding
    assert arith["KV size"]["kvplan"] == (arith["KV cache tokens"]["kvplan"] + 1) * 78 * (656 + 132)
    assert arith["KV size"]["kvplan"] == pytest.approx(183.15 * GiB, abs=0.01 * GiB)
    # trial 1 (0.5.8.post1 image) at 3,262,823 tokens: kvplan's pool line gives the logged figure too
    from kvplan.engines.sglang import _pool_line
    from kvplan.formats import KV_DTYPES
    from kvplan.specs.registry import load_model

    layers = load_model(str(CORPUS / "glm-5.1.json")).layers
    line, kv_bytes, _ = _pool_line(layers, 3262823, KV_DTYPES["fp8_e4m3"], 8, 1)
    assert line.endswith("#tokens: 3262823, KV size: 186.77 GB") and kv_bytes == 3262824 * 78 * 788
    assert "KV Cache is allocated. #tokens: 3262823, KV size: 186.77 GB" in GLM5_LOG.read_text()
