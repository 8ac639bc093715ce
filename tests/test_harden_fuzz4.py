"""Issue 24: the findings of the fourth fuzz pass (G1-G18), each test failing on the code before its fix.

The inputs are the repo's fixtures, with the one field the test names changed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvplan.errors import UsageError
from kvplan.logs import logparse
from tests.helpers import run_cli

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LOGS = FIXTURES / "logs"
SGLANG = (LOGS / "sglang_v05_llama3_8b_h100.log").read_text()
VLLM = (LOGS / "vllm_v011_llama31_8b_h100.log").read_text()
MTP_LOG = (LOGS / "real" / "vllm_0.23.0_qwen3.6-27b-fp8_rtx5060ti16gb_tp4_mtp3.log").read_text()
CORPUS = FIXTURES / "hf" / "corpus"
MODEL_SPECS = Path(__file__).resolve().parent.parent / "model_specs" / "models"


def _write(tmp_path, text: str, name: str = "startup.log") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    "flags",
    [
        ("-m", "deepseek-v3", "-g", "8xH200", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'),
        ("-m", "deepseek-v3", "-g", "8xH200", "--engine", "sglang", "--speculative-algorithm", "NEXTN",
         "--speculative-num-steps", "2"),
        ("-m", "llama3-8b", "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}',
         "--acceptance-length", "2", "--speculative-draft-config", str(FIXTURES / "draft" / "eagle-llama3-8b.json")),
    ],
)  # fmt: skip
def test_estimate_json_with_a_draft_is_json(flags):
    # G1: the draft's KV layers (kvplan's own objects) made json.dumps raise a TypeError
    r = run_cli("estimate", *flags, "--json")
    assert r.exit_code == 0, r.stderr
    d = r.json()["speculative_memory"]
    assert d["layers"] >= 1 and d["kv_bytes_per_gpu"] > 0 and "kv_layers" not in d


def test_an_sglang_log_whose_free_memory_exceeds_the_gpu_is_refused(tmp_path):
    # G2: 'avail mem=7844444444.44 GB' printed a -7,844,444,365 GiB row and exited 0
    path = _write(tmp_path, SGLANG.replace("begin. avail mem=78.44 GB", "begin. avail mem=7844444444.44 GB"))
    r = run_cli("check-log", path, "--gpus", "H100")
    assert r.exit_code == 2
    assert r.stderr.strip().endswith(
        "the log's free memory at startup, 7,844,444,444.44 GiB per GPU, exceeds the H100-SXM's 79.19 GiB: pass the "
        "--gpus the log ran on"
    )


def test_a_negative_measured_memory_is_not_offered_for_saving():
    # G2: "non-KV memory -1.63 GiB ... add --save-calibration to use it", which --save-calibration refuses
    log = LOGS / "real" / "vllm_0.18.0_qwen3-8b_rtx4090-48gb_tp1_ngram4.log"
    r = run_cli("check-log", str(log), "-g", "L40S", "-m", "qwen3-8b", "--json")
    # the row shows the negative figure; nothing is offered as measured (fuzz 19 F5: --json carried it as such)
    rows = {row["quantity"]: row for row in r.json()["rows"]}
    assert rows["non-KV memory"]["log"] < 0 and rows["non-KV memory"]["cause"] == "not kept (see the notes)"
    assert r.json()["measured_reserve_bytes"] is None
    text = run_cli("check-log", str(log), "-g", "L40S", "-m", "qwen3-8b").stdout
    assert "add --save-calibration" not in text and "the log's KV memory exceeds what kvplan's budget" in text


@pytest.mark.parametrize(("value", "shown"), [("nan", "nan"), ("-5", "-5"), ("0", "0"), ("1e12", "1e+12")])
def test_simulate_refuses_latency_targets_no_request_can_meet(value, shown):
    # G3 (nan, negative, 0 were taken, goodput "TPOT <= nan ms") and G16 (1e12 "must be a positive number")
    for flag in ("--tpot-ms", "--ttft-ms"):
        r = run_cli("simulate", "-m", "qwen3-8b", "--max-model-len", "8K", "--num-prompts", "10", flag, value)
        assert r.exit_code == 2
        assert (
            r.stderr.strip() == f"error: {flag} must be more than 0 and under 1e+09 milliseconds, got {shown}"
        )


def test_solve_max_context_names_the_binding_limit():
    # G4: "weights alone need 8 H200 ...; --gpus gives 8: give at least 8" when users were the limit
    r = run_cli("solve", "-m", "llama3-70b", "--max-context", "-g", "8xH200", "-u", "100000000")
    assert r.exit_code == 3 and r.stderr.startswith(
        "error: 100,000,000 users do not fit on 8 H200 at any context"
    )
    # and TP 2 holds a 70B's weights on H200: 2 GPUs, not 8
    r = run_cli("solve", "-m", "llama3-70b", "--max-context", "-g", "H200", "-u", "10")
    assert r.stderr.strip() == (
        "error: weights alone need 2 H200 (TP 2 x PP 1); --gpus gives 1: give at least 2, e.g. --gpus 2xH200"
    )


def test_solve_prints_no_sglang_launch_for_a_layout_sglang_does_not_serve():
    # G5: "... --max-running-requests 5 (SGLang's accounting holds 0 users)"
    r = run_cli("solve", "-m", "llama3-70b", "-u", "100", "--max-model-len", "8K", "--json")
    answers = r.json()["answers"]
    refused = [a for a in answers if a["sglang_refused"]]
    assert refused, "the TP 2 layout's weights do not fit under SGLang's mem-fraction-static"
    for a in refused:
        assert a["sglang_flags"] is None and a["sglang_max_concurrency"] is None
        assert (
            a["sglang_refused"].startswith("weights need ") and "; use more GPUs" not in a["sglang_refused"]
        )
    assert all(a["sglang_max_concurrency"] for a in answers if a["sglang_flags"])
    text = run_cli("solve", "-m", "llama3-70b", "-u", "100", "--max-model-len", "8K").stdout
    assert "holds 0 users" not in text and "SGLang: none (under SGLang's accounting: weights need" in text


@pytest.mark.parametrize("tokens", ["-3", "3.5", "x"])
def test_an_unreadable_logged_speculative_config_is_refused_not_dropped(tokens):
    # G6: num_spec_tokens=-3 / 3.5 planned without MTP, KV tokens 28% off blamed on the block size
    assert "num_spec_tokens=3)" in MTP_LOG
    with pytest.raises(UsageError, match=f"num_spec_tokens={tokens}; vLLM runs a whole number >= 1"):
        logparse.parse(MTP_LOG.replace("num_spec_tokens=3)", f"num_spec_tokens={tokens})"))
    assert logparse.parse(MTP_LOG).get("speculative_tokens") == 3


def test_config_readings_reach_the_plan_assumptions(tmp_path):
    # G7: the unknown torch_dtype note, num_hash_layers and the window-as-long-as-the-context notes were dropped
    cfg = json.loads((CORPUS / "qwen3-32b.json").read_text())
    cfg["torch_dtype"] = "bogus"
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    r = run_cli("estimate", "-m", str(p), "-g", "H100", "--max-model-len", "8K", "--json")
    assert "WARNING: torch_dtype 'bogus' not recognised; activations assumed bf16" in r.json()["assumptions"]
    assert "torch_dtype 'bogus' not recognised" in r.stderr
    v4 = run_cli("estimate", "-m", str(CORPUS / "deepseek-v4-flash.json"), "-g", "8xH200", "--max-model-len", "8K",
                 "--json").json()  # fmt: skip
    assert any(
        a.startswith("num_hash_layers: the first 3 MoE layers route by a token-id table")
        for a in v4["assumptions"]
    )
    # the provenance line is not an assumption
    assert not any(a.startswith("read from ") for a in v4["assumptions"])


def test_a_checkpoint_size_far_from_the_architecture_is_refused(tmp_path):
    # G8: checkpoint_weight_bytes 1 planned Mixtral with 0.00 GiB of weights
    spec = (MODEL_SPECS / "mixtral-8x7b.yaml").read_text() + "checkpoint_weight_bytes: 1\n"
    r = run_cli(
        "estimate", "-m", _write(tmp_path, spec, "mixtral.yaml"), "-g", "H200", "--max-model-len", "4096"
    )
    assert r.exit_code == 2
    assert "checkpoint_weight_bytes 1 is 1.1e-11x kvplan's count of the architecture" in r.stderr


@pytest.mark.parametrize(
    ("variants", "says"),
    [
        ("mha+mqa", "'mha+mqa' gives two of one kind (attention: mha, mqa); keep one"),
        ("fp8+int8", "'fp8+int8' gives two of one kind (KV dtype: fp8, int8); keep one"),
        (
            "share1000",
            "variant share1000: llama3.1-8b has 32 layers with a KV cache; share at most 32 a group",
        ),
    ],
)
def test_compare_variants_that_contradict_themselves_are_refused(variants, says):
    # G9: the last token silently won
    r = run_cli("compare", "table", "-m", "llama3.1-8b", "--variants", variants)
    assert r.exit_code == 2 and says in r.stderr, r.stderr
    assert run_cli("compare", "table", "-m", "llama3.1-8b", "--variants", "gqa8+int8+share2").exit_code == 0


def test_speculative_config_keys_kvplan_does_not_read_are_said():
    # G11: a misspelt key went unnoticed
    spelt = run_cli("estimate", "-m", "deepseek-v3", "-g", "8xH200", "--max-model-len", "4096", "--json",
                    "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}')  # fmt: skip
    assert not any("not read by kvplan" in a for a in spelt.json()["assumptions"])
    r = run_cli("estimate", "-m", "deepseek-v3", "-g", "8xH200", "--max-model-len", "4096", "--json",
                "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1, "num_speculativ_tokens": 2}')  # fmt: skip
    assert (
        "--speculative-config: num_speculativ_tokens not read by kvplan, so its figures leave out whatever they "
        "change; check the spelling if vLLM should take them" in r.json()["assumptions"]
    )


def test_prefix_hit_rate_without_a_prefix_and_an_empty_chart_name_are_refused():
    # G12: both were ignored without a word
    r = run_cli("estimate", "-m", "llama3.1-8b", "--prefix-hit-rate", "0.5")
    assert (
        r.exit_code == 2
        and "--prefix-hit-rate is the share of requests that hit --shared-prefix-tokens" in r.stderr
    )
    r = run_cli("compare", "plot", "-m", "llama3.1-8b", "-o", "")
    assert r.exit_code == 2 and r.stderr.strip() == "error: --output: give a file name, FILE.png or FILE.svg"


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("mem_fraction_static=0.85", "mem_fraction_static=7.5", "the log's mem_fraction_static must be in (0, 1), got 7.5"),
        ("kv_cache_dtype='auto'", "kv_cache_dtype='fp3'", "the log's kv_cache_dtype: unknown dtype 'fp3'"),
    ],
)  # fmt: skip
def test_check_log_names_the_logs_field_not_a_flag_never_typed(tmp_path, old, new, says):
    # G13: "--mem-fraction-static must be in (0, 1), got 7.5" for a flag the user never passed
    assert old in SGLANG
    r = run_cli("check-log", _write(tmp_path, SGLANG.replace(old, new)), "-g", "H100")
    assert (
        r.exit_code == 2 and says in r.stderr and r.stderr.rstrip().endswith("paste the engine's own log")
    ), r.stderr
    # a flag the user typed is still named as the flag (here one the log contradicts: fuzz 24 K4)
    r = run_cli("check-log", _write(tmp_path, SGLANG), "-g", "H100", "--mem-fraction-static", "7.5")
    assert r.exit_code == 2 and "--mem-fraction-static 7.5, but the log ran with 0.85" in r.stderr


def test_device_files_and_plain_files_as_a_model_are_called_what_they_are(tmp_path):
    # G14: /dev/null as --speculative-draft-config and -m /dev/zero said "--model: unknown model"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (os.devnull, str(fifo)):
        r = run_cli("estimate", "-m", target)
        assert r.stderr.strip() == f"error: {target}: not a regular file; give a .yaml spec or a config.json"
    r = run_cli("estimate", "-m", "llama3-8b", "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}',
                "--acceptance-length", "2", "--speculative-draft-config", os.devnull)  # fmt: skip
    assert r.exit_code == 2 and "not a regular file" in r.stderr
    plain = tmp_path / "notes"
    plain.write_text("x")
    r = run_cli("estimate", "-m", str(plain))
    assert r.stderr.strip().endswith(
        "--model takes a .yaml spec, a config.json (or a folder holding one) or a model name"
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("-m", "deepseek-v3", "-g", "8xH200", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 0}'),
         "error: --speculative-config num_speculative_tokens: draft tokens per step must be between 1 and 64, got 0"),
        (("-m", "deepseek-v3", "-g", "8xH200", "--engine", "sglang", "--speculative-algorithm", "NEXTN",
          "--speculative-num-steps", "0"),
         "error: --speculative-num-steps: draft tokens per step must be between 1 and 64, got 0"),
        (("-m", "llama3.1-8b", "--kv-quant-scale-bits", "0"),
         "error: --kv-quant-scale-bits: bf16 is not quantized; group scales apply to int8/int4/int2/fp8"),
        (("-m", "llama3-8b", "--disaggregated", "--prefill-gpus", "1xH100", "--decode-gpus", "1xH100", "--input-len",
          "8000", "--output-len", "192", "--prefill-tp", "3"),
         "error: --prefill-gpus/--prefill-tp: TP 3 does not divide the 1 GPUs of 1xH100; choose a divisor"),
    ],
)  # fmt: skip
def test_errors_name_the_flag_at_fault(args, says):
    # G15: they named --speculative-config method, --speculative-algorithm, --kv-quant-zero-point and --gpus
    r = run_cli("estimate", *args)
    assert r.exit_code == 2 and r.stderr.strip() == says, r.stderr


def test_a_burstiness_too_large_says_the_upper_bound():
    # G16: "--burstiness must be > 0, got 1e+300"
    r = run_cli("simulate", "-m", "qwen3-8b", "--max-model-len", "8K", "--burstiness", "1e300")
    assert (
        r.stderr.strip() == "error: --burstiness must be more than 0 and under 1e+06 (1: Poisson), got 1e+300"
    )


def test_the_ladder_of_a_long_context_mla_model_answers_with_a_naive_step_of_none():
    # G17: the imaginary MHA step's one full-length request did not fit and the whole ladder failed (exit 3)
    r = run_cli("compare", "ladder", "-m", "deepseek-v3", "-g", "8xH200", "--json")
    assert r.exit_code == 0, r.stderr
    steps = {s["step"]: s for s in r.json()["steps"]}
    assert steps["naive PyTorch"]["max_concurrency"] == 0
    assert "(one does not fit the budget)" in steps["naive PyTorch"]["how"]
    assert steps["+ MLA + FP8"]["max_concurrency"] > steps["+ GQA"]["max_concurrency"] > 0


@pytest.mark.parametrize(
    ("field", "says"),
    [
        ("active_params: 10000000000000", "active_params: 10,000,000,000,000 is above the total"),
        ("total_params: 1000", "total_params: 1,000 is far from the"),
    ],
)
def test_spec_errors_found_from_the_architecture_name_the_file(tmp_path, field, says):
    # G18: "error: mixtral-8x7b: active_params: ..." named the model, not the file
    key = field.split(":")[0]
    lines = [
        line
        for line in (MODEL_SPECS / "mixtral-8x7b.yaml").read_text().splitlines()
        if not line.startswith(f"{key}:")
    ]
    path = _write(tmp_path, "\n".join([*lines, field]) + "\n", "mine.yaml")
    r = run_cli("estimate", "-m", path, "-g", "H200")
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {path}: {says}"), r.stderr
