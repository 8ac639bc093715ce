"""kvplan's default prediction (no log figures given) of vLLM's "Available KV cache memory" per GPU,
against the real startup logs in tests/fixtures/logs/real/ (issue 12: within 3%).

The harness is benchmarks/log_predictions.py (run it for the table): only what the user types
before launch (model, GPU, TP, max-model-len, utilization, quantization, the other flags of the
log's "non-default args" line, the usage context; for SGLang the launch command) goes into
`kvplan estimate`. Logs whose GPU is unknown or not shipped, or whose model config is not in the
fixtures, are skipped and listed there (SKIPPED). The fitting set is the logs kvplan's constants were
fitted to (FITTED); every other log is held out.

History of the held-out figures (what the bounds below hold now is the last line):
- 8 logs, kvplan's blanket 8,192 batched tokens and 256-sequence sampler: median |error| 5.4%.
- vLLM's batch defaults by card and usage (vllm/engine/arg_utils.py): 2.4% on 4 held-out logs.
- 16-24 logs (more H100/A100 logs, the first SGLang log, Qwen3-VL): 3.5-4.9%, half within 5%; the
  bf16 Qwen3-30B-A3B log showed the sampler's 5.58 GiB peak kvplan then put at 1.7 GiB.
- vLLM's profile by release (kvplan/engines/vllm_memory.py: the sampler's top-k/top-p path, forward
  and sampler the larger not the sum, NVLS buffers, MXFP4 padding, bf16 embedding/head of quantized
  checkpoints, pooling models): 25 logs, 6 fitted, 19 held out: held-out median 2.6%, 12 of 19 within
  5%, SGLang 0.4.3 on 4x L4 -72%.
- SGLang's mem_fraction_static by release (kvplan/engines/sglang_memory.py) and its startup memory
  (fitted to the QwQ-32B 4x L4 log, now in the fitting set: +3.3%): 7 fitted, 18 held out: held-out
  median 2.5%, 12 of 18 within 5%. The misses: Qwen3-VL-30B-A3B x4 (+8% to +36% with the vision tower's
  weights counted: vLLM's dummy encoder outputs need the processor configs, which the fixtures lack, so
  they are warned of), Qwen2-7B on A100 x2 whose install had FlashInfer's sampler
  (-7%, -18%: the default assumes a pip install without it).
- Real Qwen3-VL processor configs beside the Qwen3-VL-30B-A3B config (the padded dummy encoder outputs:
  +2.0/+2.0/+1.7/+9.0%), then what vLLM allocates with a Qwen-VL model (the M-RoPE cache, deepstack
  buffers) and the profile's other held encoder tensors (unpadded output, pixel inputs): Qwen3-VL
  -0.3% to -0.5%; held-out median 1.7%, 16 of 18 within 5%. The misses: the two Qwen2-7B logs above.
- The RTX 3090 and T4 in the GPU catalog and three more held-out logs (nothing tuned on them): 7 fitted,
  21 held out: held-out median 1.9%, 17 of 21 within 5%. Qwen3-8B on Kaggle's 2x T4 (vLLM 0.22): -0.3%.
  The new misses: Qwen3-VL-30B-A3B on 4x RTX 3090 (-8.6%: 0.2 GiB on a 2.31 GiB KV budget) and
  DeepSeek-R1-Distill-Qwen-32B FP8 (compressed-tensors) on one L40S (+9.5%: 0.57 GiB; the L40S's
  runtime memory total is itself an approximation, model_specs/gpus/l40s.yaml).
- Issue 26: the A100-80GB/A800-80GB Llama-3-8B TP 4 log, skipped because the two cards were not told
  apart, is run (they predict the same): +5.8%, a miss. The 0.10.2 Qwen3-30B-A3B log joins the fitting
  set by a rule (it prints the sampler peak SORT_BYTES was fitted to: REPEATS_RULE). 8 fitted, 21 held
  out: held-out median 2.0%, 16 of 21 within 5% (the issue's 80% is not met).
- Session 17: the first vLLM MoE logs on AMD (Mixtral-8x7B-Instruct on MI300X, vLLM 0.6.4, offline benchmark, TP 1
  and TP 2; weights exact, token arithmetic exact): +7.5% at TP 1 (a miss: V0's non-KV memory on ROCm, 5.8 GiB
  more than kvplan's estimate) and +2.6% at TP 2. 23 held out: held-out median 2.3%, 17 of 23 within 5%.

Splits by source (as benchmarks/fit_decode.py): SOURCES.tsv's source column gives each log a source key;
FROZEN_RULE (fit_decode's, by a hash of the key) makes the frozen test set. The constants fitted to two
or more sources (SORT_BYTES, NCCL_NVLS_BYTES_PER_RANK) are refitted leave-one-source-out (dev) and on dev
only (frozen); a log whose prediction rests on a constant fitted to its own source (the one-source,
hand-derived ones) is listed with that reason and not counted. README.md's figures are the block
`python benchmarks/log_predictions.py --readme` writes; the test below recomputes it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

import pytest

from helpers import REPO

_spec = importlib.util.spec_from_file_location("log_predictions", REPO / "benchmarks" / "log_predictions.py")
assert _spec is not None and _spec.loader is not None
lp = importlib.util.module_from_spec(_spec)
sys.modules["log_predictions"] = lp
_spec.loader.exec_module(lp)

# (median |error|, worst |error|) each part must stay within: what kvplan reaches now (29 logs)
BOUNDS = {"fit": (0.02, 0.04), "held-out": (0.025, 0.18)}


def test_every_real_log_is_evaluated_or_skipped_with_a_reason():
    logs = {p.name for p in lp.real_logs()}
    assert logs == set(lp.CASES) | set(lp.SKIPPED)
    assert not set(lp.CASES) & set(lp.SKIPPED)
    assert all(why for why in lp.SKIPPED.values())


@pytest.mark.parametrize("name", sorted(p.name for p in lp.real_logs()))
def test_every_real_log_parses(name):
    from kvplan.logs.logparse import found_numbers, parse

    log = parse((lp.LOGS / name).read_text(errors="replace"))
    assert log.engine == name.split("_")[0] and found_numbers(log)


def test_sglang_cases_pass_only_the_launch_command():
    for name, case in lp.CASES.items():
        if lp.engine_of(name) == "sglang":
            flags, _ = lp.flags_for(name)
            typed = dict(case.typed)
            assert flags.get("mem_fraction_static") == (
                float(typed["mem_fraction_static"]) if "mem_fraction_static" in typed else None
            )


def test_the_halves_split_the_cases():
    fit, held = lp.halves()
    assert sorted(fit + held) == sorted(lp.CASES)
    assert len(held) >= 4 and not set(fit) & set(held)


def test_user_args_reads_a_hard_wrapped_line():
    text = (lp.LOGS / "vllm_0.10.1.1_qwen2-7b-instruct_a100-40gb_tp2.log").read_text()
    args = lp.user_args(text)
    assert args["model"] == "Qwen2-7B-Instruct"
    assert args["max_model_len"] == "16384" and args["tensor_parallel_size"] == "2"


@pytest.fixture(scope="module")
def results():
    return [lp.predict(name) for name in sorted(lp.CASES)]


@pytest.mark.parametrize("half", ["fit", "held-out"])
def test_prediction_error_per_half(results, half):
    median, worst, _ = lp.summary([r for r in results if r.half == half])
    max_median, max_worst = BOUNDS[half]
    assert median <= max_median, f"{half}: median |error| {median:.1%}"
    assert worst <= max_worst, f"{half}: worst |error| {worst:.1%}"


def test_only_typed_flags_reach_the_prediction(results):
    # the engine-config line's resolved max_num_batched_tokens never goes in unless the user typed it
    for r in results:
        typed = lp.user_args((lp.LOGS / r.log).read_text(errors="replace"))
        assert ("max_num_batched_tokens" in r.flags) == ("max_num_batched_tokens" in typed), r.log


def test_held_out_logs_hold_what_is_reached(results):
    # issue 12's targets: median |error| <= 3% (met: 2.0%) and >= 80% of logs within 5%, not met since
    # issue 26 counts the A100/A800 log (+5.8%): 16 of 21; session 17 added the two vLLM 0.6 Mixtral logs on MI300X
    # (+7.5% at TP 1, +2.6% at TP 2: 17 of 23). This holds what is reached so that a regression fails; the misses are
    # named in the docstring
    held = [r for r in results if r.half == "held-out"]
    median, _, within = lp.summary(held)
    assert len(held) == 23
    assert median <= 0.03 and within >= 17 / 23 - 1e-9


def test_the_defaults_applied_are_stated(results):
    for r in results:
        if "max_num_batched_tokens" in r.flags:  # typed by the user: no default to state
            continue
        if lp.engine_of(r.log) == "sglang":  # a vLLM flag: SGLang's budget is --chunked-prefill-size
            assert not any("--max-num-batched-tokens" in a for a in r.assumptions), r.log
            continue
        cited = ("arg_utils.py", "SchedulerConfig")  # V0 (before 0.8): vllm/config.py SchedulerConfig
        assert any("--max-num-batched-tokens" in a and any(c in a for c in cited) for a in r.assumptions), (
            r.log
        )


@pytest.mark.parametrize(
    ("gpu", "usage", "version", "expected"),
    [
        ("H100", "serve", "0.11", (8192, 1024)),
        ("H200", "offline", "0.11", (16384, 1024)),
        ("A100-80GB", "serve", "0.11", (2048, 256)),
        ("A100-80GB", "offline", "0.11", (8192, 256)),
        ("L40S", "serve", "0.16", (2048, 256)),
        ("H20", "serve", "0.11", (8192, 1024)),  # >= 70 GiB and not an A100
        ("H20", "serve", "0.8", (2048, 256)),  # 0.8: H100/H200 by name only
        ("H100", "serve", "0.6", (8192, 256)),  # V0: kvplan's former 8,192
    ],
)
def test_vllm_batch_defaults_follow_arg_utils(gpu, usage, version, expected):
    from kvplan.engines.base import parse_version_text
    from kvplan.engines.vllm import vllm_batch_defaults
    from kvplan.specs.registry import load_gpu

    d = vllm_batch_defaults(load_gpu(gpu), usage, parse_version_text(version))
    assert (d.max_num_batched_tokens, d.max_num_seqs) == expected


def test_estimate_json_says_which_defaults_it_applied(cli):
    got = cli("estimate", "-m", "llama3-8b", "-g", "L4", "--max-model-len", "8K", "--json").json()
    assert got["settings"]["usage"] == "serve"
    defaults = got["settings"]["engine_defaults"]
    assert (defaults["max_num_batched_tokens"], defaults["max_num_seqs"]) == (2048, 256)
    assert got["settings"]["max_num_batched_tokens"] == 2048
    given = cli(
        "estimate", "-m", "llama3-8b", "-g", "L4", "--max-model-len", "8K", "--max-num-batched-tokens", "4096",
        "--usage", "offline", "--json",
    ).json()  # fmt: skip
    assert not {"max_num_batched_tokens", "max_num_seqs"} & set(given["settings"]["engine_defaults"])
    assert given["settings"]["max_num_batched_tokens"] == 4096
    assert given["settings"]["usage"] == "offline"


def test_usage_is_checked(cli):
    r = cli("estimate", "-m", "llama3-8b", "--usage", "batch")
    assert r.exit_code != 0 and "--usage must be serve or offline" in r.stdout + r.stderr


# --- issue 26: splits by source, the frozen rule, leave-one-source-out, the README block -----------------


@pytest.fixture(scope="module")
def fit_decode():
    spec = importlib.util.spec_from_file_location("fit_decode", REPO / "benchmarks" / "fit_decode.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fit_decode"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def evaluation():
    return lp.evaluate()


def test_every_log_has_a_source_key():
    keys = lp.sources()
    logs = {p.name for p in lp.real_logs()}
    assert logs <= set(keys)
    assert all(k.split(":")[0] in ("github", "author", "code-index") for k in keys.values())
    # one repository is one source, whatever the commit or the file
    dennis = {k for n, k in keys.items() if "qwen2-7b-instruct_a100" in n}
    assert dennis == {"github:dennislee22/vLLM-benchmarking"}


def test_the_frozen_rule_is_fit_decodes(fit_decode):
    assert lp.FROZEN_RULE == fit_decode.FROZEN_RULE
    for key in set(lp.sources().values()):
        assert lp.is_frozen(key) == fit_decode.is_frozen(key), key


def test_splits_are_by_source(evaluation):
    dev = {r.source for r in evaluation.rows if r.split == "dev"}
    frozen = {r.source for r in evaluation.rows if r.split == "frozen"}
    assert dev and frozen and not dev & frozen
    assert all(lp.is_frozen(s) for s in frozen) and not any(lp.is_frozen(s) for s in dev)
    assert {r.log for r in evaluation.rows} == set(lp.CASES)


def test_every_row_is_counted_or_says_why_not(evaluation):
    for r in evaluation.rows:
        assert (r.heldout_bytes is None) == bool(r.excluded), r.log
    # the constants refitted leave-one-source-out are those fitted to two or more sources
    assert set(evaluation.refittable) == {"SORT_BYTES", "NCCL_NVLS_BYTES_PER_RANK"}
    # a held-out prediction's refitted values come from dev sources other than the log's own
    dev = {r.source for r in evaluation.rows if r.split == "dev"}
    for r in evaluation.rows:
        for key, value in r.constants.items():
            assert value == lp.refit(key, evaluation.refits[key], dev - {r.source}), (r.log, key)


def test_the_held_out_sampler_peak_is_not_a_fitted_one():
    # REPEATS_RULE: the 0.10.2 Qwen3-30B-A3B log prints the 5.58 GiB peak the Qwen3-Next log does (the
    # same 1,024 x 151,936 logits): it is in the fitting set, not held out
    assert lp.repeats() == {
        "vllm_0.10.2_qwen3-30b-a3b-instruct-2507_h100_tp1.log": "vllm_0.10.2_qwen3-next-80b-a3b_h200_tp2.log"
    }
    fit, held = lp.halves()
    fitted_peaks = {lp._peak(n) for n in fit} - {None}
    assert not any(lp._peak(n) in fitted_peaks for n in held)


def test_a_gpu_not_told_apart_that_predicts_the_same_is_run():
    # 'A100-80GB or A800-80GB': the same memory, batch defaults and NCCL buffers; A100-80GB and its PCIe
    # card (the shipped specs) give the same figure, so the log is run and counted (+5.8%)
    name = "vllm_0.13.0_llama-3-8b-instruct_unknowngpu_tp4.log"
    assert name in lp.CASES and name not in lp.SKIPPED
    saved = lp.CASES[name]
    try:
        got = set()
        for gpu in ("A100-80GB", "A100-80GB-PCIe"):
            lp.CASES[name] = dataclasses.replace(saved, gpu=gpu)
            got.add(lp.predict(name).predicted_bytes)
    finally:
        lp.CASES[name] = saved
    assert len(got) == 1
    assert lp.predict(name).error == pytest.approx(0.058, abs=0.002)


def test_the_readme_quotes_the_generated_block(evaluation):
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert lp.readme_block(evaluation) in text, "run: python benchmarks/log_predictions.py --readme"
