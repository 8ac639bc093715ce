"""Fuzzing every input channel (issue 14): whatever is typed, pasted or read from a file, kvplan
answers or refuses with one line; never a traceback, never a run over 5 s, and --json is JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_harden import QWEN, VLLM_LOG, _profile_text, invoke, refused, strict_json

from helpers import REPO

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

NUMBERS = st.one_of(
    st.sampled_from(["inf", "-inf", "nan", "1e400", "0", "-1", "1e308GiB", "8K", ",", "", "1" * 5000, "0.5"]),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.text(max_size=12),
)


def _ok(result, json_out: bool = True) -> None:
    assert result.exit_code in (0, 2, 3), (result.exit_code, result.stderr[-300:])
    if json_out and result.stdout.strip():
        strict_json(result.stdout)


@FUZZ
@given(
    flag=st.sampled_from(
        [
            "--max-model-len",
            "--max-num-batched-tokens",
            "--avg-context",
            "--shared-prefix-tokens",
            "--kv-cache-memory",
            "--reserve-memory",
            "--block-size",
            "--engine-version",
            "--gpus",
            "--kv-quant-scale-bits",
            "--gpu-memory-utilization",
            "--max-num-seqs",
            "-tp",
        ]
    ),
    value=NUMBERS,
)
def test_fuzz_estimate_flags(flag, value):
    _ok(invoke("estimate", "-m", "qwen3-8b", "--gpus", "H100", flag, value, "--json"))


@FUZZ
@given(
    flag=st.sampled_from(
        ["--max-gpus", "--tpot-ms", "--price", "--gpu", "--top", "--users", "--max-model-len"]
    ),
    value=NUMBERS,
)
def test_fuzz_solve_flags(flag, value):
    args = {"--max-model-len": "8K", "--users": "4"}
    args[flag] = value
    _ok(invoke("solve", "-m", "qwen3-8b", *[x for kv in args.items() for x in kv], "--json"))


@FUZZ
@given(
    flag=st.sampled_from(["--models", "--variants", "--offload-gib", "--max-model-len", "--gpus"]),
    value=NUMBERS
    | st.sampled_from(["window0", "mla0", "gqa0", "share1", "offload1e9", "window99999999999k"]),
)
def test_fuzz_compare_flags(flag, value):
    args = {"--models": "qwen3-8b"}
    args[flag] = value
    _ok(invoke("compare", "table", *[x for kv in args.items() for x in kv], "--json"))


SPEC_FIELDS = [
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "vocab_size",
    "max_context",
    "intermediate_size",
]
VALUES = st.one_of(
    st.integers(min_value=-(10**15), max_value=10**15),
    st.sampled_from([".inf", ".nan", "text", "[]", "{}", "0", "1e400", "9" * 5000]),
)


@FUZZ
@given(field=st.sampled_from(SPEC_FIELDS), value=VALUES)
def test_fuzz_spec_yaml(tmp_path_factory, field, value):
    lines = [f"{field}: {value}" if line.startswith(f"{field}:") else line for line in QWEN.splitlines()]
    path = tmp_path_factory.mktemp("spec") / "m.yaml"
    path.write_text("\n".join(lines) + "\n")
    _ok(invoke("estimate", "-m", str(path), "--json"))


HF_FIELDS = [
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
    "head_dim",
    "sliding_window",
    "no_rope_layer_interval",
]


@FUZZ
@given(
    field=st.sampled_from(HF_FIELDS),
    value=st.one_of(
        st.integers(-(10**15), 10**15), st.text(max_size=5), st.floats(), st.lists(st.integers(), max_size=3)
    ),
)
def test_fuzz_config_json(tmp_path_factory, field, value):
    cfg = json.loads(
        (REPO / "tests" / "fixtures" / "hf" / "synthetic" / "mistral-7b-v0.1.json").read_text()
    )  # a real config
    cfg[field] = value
    path = tmp_path_factory.mktemp("hf") / "config.json"
    path.write_text(json.dumps(cfg))
    _ok(invoke("estimate", "-m", str(path), "--json"))


LOG = VLLM_LOG.read_text()


@FUZZ
@given(
    key=st.sampled_from(["'max_model_len': 32768", "tensor_parallel_size=1", "GPU KV cache size: "]),
    value=NUMBERS,
)
def test_fuzz_pasted_log(key, value):
    if key.endswith(": "):
        text = LOG.replace(key, key + value + " ")
    else:
        name, sep = (key.split(": ")[0], ": ") if ": " in key else (key.split("=")[0], "=")
        text = LOG.replace(key, f"{name}{sep}{value}")
    _ok(invoke("check-log", "-", "--json", stdin=text))


@FUZZ
@given(
    field=st.sampled_from(
        [
            "peak_bytes_per_s",
            "half_bytes",
            "rms_relative_error",
            "measured_on",
            "device",
            "memory_bytes",
            "points",
            "layout",
        ]
    ),
    value=st.one_of(st.floats(), st.integers(-(10**30), 10**30), st.text(max_size=5), st.none()),
)
def test_fuzz_profiles(tmp_path_factory, field, value):
    path = tmp_path_factory.mktemp("prof") / "p.yaml"
    path.write_text(_profile_text(**{field: value}))
    _ok(invoke("estimate", "-m", "qwen3-8b", "--gpus", "H100", "--calibration-file", str(path), "--json"))


@FUZZ
@given(
    field=st.sampled_from(
        ["model", "reserve_bytes", "tensor_parallel_size", "measured_on", "engine_version"]
    ),
    value=st.one_of(
        st.floats(),
        st.integers(-(10**30), 10**30),
        st.text(max_size=5),
        st.none(),
        st.lists(st.integers(), max_size=2),
    ),
)
def test_fuzz_overheads(field, value):
    import yaml

    from kvplan.userdata import overheads_path

    entry = {
        "model": "qwen3-8b",
        "gpu": "H100-SXM",
        "engine": "vllm",
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "max_num_batched_tokens": 8192,
        "reserve_bytes": 2**30,
        "engine_version": "0.11",
        "measured_on": "2025-01-01",
        "source": "x.log",
    }
    entry[field] = value
    path = overheads_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"schema": "kvplan.overheads/1", "entries": [entry]}))
    _ok(invoke("estimate", "-m", "qwen3-8b", "--gpus", "H100", "--json"))


# --- issue 24: every file channel against every kind of bad file ---------------------------------

BOMB = "\n".join(
    ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
)
BAD_FILES = {
    "directory": None,
    "fifo": None,
    "symlink loop": None,
    "dangling symlink": None,
    "empty": "",
    "huge": None,
    "alias bomb in values": BOMB + "\nnum_layers: *a8\n",
    "alias bomb in keys": BOMB + "\n? *a8\n: 1\n",
    "recursive alias": "a: &a [*a]\n",
    "wrong types": "- 1\n- two\n",
    "binary": "\x00\xff\xfe",
}


def _saved_profile() -> Path:
    from kvplan.specs.registry import load_gpu
    from kvplan.userdata import profile_path

    return profile_path(load_gpu("H100").name)


def _saved_overheads() -> Path:
    from kvplan.userdata import overheads_path

    return overheads_path()


# channel: (where the file goes, given a temporary folder; the command that reads it)
EST_H100 = ("estimate", "-m", "qwen3-8b", "--gpus", "H100")
SIM = ("simulate", "-m", "qwen3-8b", "--gpus", "H100", "--max-model-len", "8K", "--num-prompts", "20")
CHANNELS = {
    "model yaml": (lambda d: d / "m.yaml", lambda p: ("estimate", "-m", str(p), "--gpus", "H100")),
    "config.json": (lambda d: d / "config.json", lambda p: ("estimate", "-m", str(p), "--gpus", "H100")),
    "gpu yaml": (lambda d: d / "g.yaml", lambda p: ("estimate", "-m", "qwen3-8b", "--gpus", str(p))),
    "--calibration-file": (lambda d: d / "p.yaml", lambda p: (*EST_H100, "--calibration-file", str(p))),
    "saved profile": (lambda d: _saved_profile(), lambda p: EST_H100),
    "saved overheads": (lambda d: _saved_overheads(), lambda p: EST_H100),
    "check-log": (lambda d: d / "x.log", lambda p: ("check-log", str(p), "--gpus", "H100")),
    # simulate's file channels (issue 24, round two): a Mooncake JSONL trace, an Azure CSV trace and
    # a length histogram
    "simulate --trace .jsonl": (lambda d: d / "t.jsonl", lambda p: (*SIM, "--trace", str(p))),
    "simulate --trace .csv": (lambda d: d / "t.csv", lambda p: (*SIM, "--trace", str(p))),
    "simulate --length-histogram": (lambda d: d / "h.csv", lambda p: (*SIM, "--length-histogram", str(p))),
    # the issue-24 audit's gaps: a draft checkpoint's config, solve's trace, the files read beside a config.json
    # and the config.json of a folder
    "--speculative-draft-config": (
        lambda d: d / "draft.json",
        lambda p: (
            *EST_H100,
            "--speculative-config",
            '{"method":"eagle","num_speculative_tokens":2}',
            "--speculative-draft-config",
            str(p),
        ),
    ),  # fmt: skip
    "solve --trace": (
        lambda d: d / "s.jsonl",
        lambda p: (
            "solve",
            "-m",
            "qwen3-8b",
            "--max-model-len",
            "8K",
            "--max-rate",
            "-g",
            "1xH100",
            "--ttft-ms",
            "500",
            "--tpot-ms",
            "50",
            "--trace",
            str(p),
        ),
    ),  # fmt: skip
    "hf_quant_config.json beside config.json": (
        lambda d: _beside_config(d, "hf_quant_config.json"),
        lambda p: ("estimate", "-m", str(p.parent), "--gpus", "H100", "--max-model-len", "8K"),
    ),
    "model.safetensors.index.json beside config.json": (
        lambda d: _beside_config(d, "model.safetensors.index.json"),
        lambda p: ("estimate", "-m", str(p.parent), "--gpus", "H100", "--max-model-len", "8K"),
    ),
    "preprocessor_config.json beside a Qwen3-VL config.json": (
        lambda d: _beside_config(d, "preprocessor_config.json", "qwen3-vl-30b-a3b-instruct.json"),
        lambda p: ("estimate", "-m", str(p.parent), "--gpus", "H100", "--max-model-len", "8K"),
    ),
    "a folder's config.json": (
        lambda d: d / "ckpt" / "config.json",
        lambda p: ("estimate", "-m", str(p.parent), "--gpus", "H100"),
    ),
}


def _beside_config(folder: Path, name: str, config: str = "qwen3-14b.json") -> Path:
    """A real config.json in `folder`, and the path of the sidecar file `name` to make bad beside it."""
    import shutil

    from tests.helpers import REPO

    shutil.copy(REPO / "tests" / "fixtures" / "hf" / "corpus" / config, folder / "config.json")
    return folder / name


def _make_bad(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink loop":
        other = path.with_name(path.name + ".other")
        other.symlink_to(path)
        path.symlink_to(other)
    elif kind == "dangling symlink":
        path.symlink_to(path.with_name("nowhere"))
    elif kind == "huge":  # sparse: refused by its size before a byte is read
        with open(path, "wb") as fh:
            fh.truncate(65 * 2**20)
    else:
        path.write_bytes(BAD_FILES[kind].encode("latin-1"))


@pytest.mark.parametrize("kind", list(BAD_FILES))
@pytest.mark.parametrize("channel", list(CHANNELS))
def test_bad_file_every_channel(tmp_path, channel, kind):
    """One line naming the file, exit 2, within 5 s: never a traceback, a hang or a silent skip."""
    where, command = CHANNELS[channel]
    path = where(tmp_path)
    _make_bad(path, kind)
    if channel == "check-log" and kind in ("wrong types", "alias bomb in keys", "alias bomb in values"):
        refused(*command(path))  # a log is text: no KV lines found
        return
    result = refused(*command(path), names=path.name)
    assert "Traceback" not in result.stderr


# --- issue 24, round two: simulate's numbers and file contents; solve and compare, empty and absurd ---


@FUZZ
@given(
    flag=st.sampled_from(
        [
            "--num-prompts",
            "--input-len",
            "--output-len",
            "--range-ratio",
            "--request-rate",
            "--burstiness",
            "--max-concurrency",
            "--seed",
            "--ttft-ms",
            "--tpot-ms",
            "--max-model-len",
            "--max-num-seqs",
        ]
    ),
    value=NUMBERS,
)
def test_fuzz_simulate_flags(flag, value):
    args = {"--num-prompts": "20", "--max-model-len": "8K"}
    args[flag] = value
    _ok(
        invoke(
            "simulate", "-m", "qwen3-8b", "--gpus", "H100", *[x for kv in args.items() for x in kv], "--json"
        )
    )


TRACE_VALUES = st.one_of(
    st.sampled_from(
        ["0", "-1", "1e300", "1e400", "NaN", "Infinity", "null", '"10"', "[]", "{}", "true", "2.5", "9" * 400]
    ),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
)


@FUZZ
@given(
    field=st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids"]),
    value=TRACE_VALUES,
    lines=st.integers(min_value=1, max_value=3),
)
def test_fuzz_mooncake_trace_lines(tmp_path_factory, field, value, lines):
    row = {"timestamp": "0", "input_length": "100", "output_length": "10", "hash_ids": "[1]"}
    row[field] = value
    text = "{" + ", ".join(f'"{k}": {v}' for k, v in row.items()) + "}\n"
    path = tmp_path_factory.mktemp("trace") / "t.jsonl"
    path.write_text(text * lines)
    _ok(invoke(*SIM, "--trace", str(path), "--json"))


@FUZZ
@given(
    column=st.integers(min_value=0, max_value=2),
    value=st.sampled_from(["0", "-1", "nan", "inf", "1e400", "", "x", "1" * 40, "2.5", "1e-300"]),
    header=st.booleans(),
)
def test_fuzz_length_histogram(tmp_path_factory, column, value, header):
    row = ["512", "64", "1"]
    row[column] = value
    text = ("input_len,output_len,weight\n" if header else "") + ",".join(row) + "\n"
    path = tmp_path_factory.mktemp("hist") / "h.csv"
    path.write_text(text)
    _ok(invoke(*SIM, "--length-histogram", str(path), "--json"))


@FUZZ
@given(
    flag=st.sampled_from(
        [
            "--kv-cache-dtype",
            "--engine",
            "--block-size",
            "--gpu-memory-utilization",
            "--avg-context",
            "--input-len",
            "--output-len",
            "--network",
            "--network-gbps",
            "--network-latency-us",
            "--calibration-file",
            "--gpus",
        ]
    ),
    value=NUMBERS
    | st.sampled_from(["", " ", ",", "any,", "fp8,fp8", "auto,int4", "1x", "0xH100", "sglang2"]),
)
def test_fuzz_solve_more_flags(flag, value):
    args = {"--max-model-len": "8K", "--users": "4"}
    args[flag] = value
    _ok(invoke("solve", "-m", "qwen3-8b", *[x for kv in args.items() for x in kv], "--json"))


@FUZZ
@given(
    command=st.sampled_from(["table", "ladder", "plot"]),
    flag=st.sampled_from(
        [
            "--kv-cache-dtype",
            "--tensor-parallel-size",
            "--pipeline-parallel-size",
            "--gpu-memory-utilization",
            "--kv-cache-memory",
            "--block-size",
            "--network",
            "--network-gbps",
            "--avg-context",
            "--shared-prefix-tokens",
            "--prefix-hit-rate",
            "--max-model-len",
        ]
    ),
    value=NUMBERS | st.sampled_from(["", " ", ",", "+", "shipped+", "fp8+int8"]),
)
def test_fuzz_compare_more_flags(command, flag, value):
    only = {
        "ladder": ("--avg-context", "--shared-prefix-tokens", "--prefix-hit-rate"),
        "table": ("--kv-cache-dtype",),
    }
    if flag in only["ladder"] and command != "ladder":
        return
    if flag == "--kv-cache-dtype" and command == "ladder":
        return
    model = ("-m", "qwen3-8b")
    args = (*model, flag, value, "--json") if command != "plot" else (*model, flag, value, "--json")
    _ok(invoke("compare", command, *args))


@pytest.mark.parametrize(
    "row",
    [
        "2023-11-16 18:15:46.6805900," + "9" * 400 + ",10",
        "2023-11-16 18:15:46.6805900,10," + "9" * 400,
        "9999-99-99 99:99:99,10,10",
        "2023-11-16 18:15:46.6805900,nan,10",
        "2023-11-16 18:15:46.6805900,1e400,10",
        "2023-11-16 18:15:46.6805900,-5,10",
        ",,",
        "2023-11-16 18:15:46.6805900,10",
    ],
)
def test_azure_trace_rows(tmp_path, row):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + row + "\n")
    refused(*SIM, "--trace", str(path), "--json", names=path.name)


# --- issue 23: solve's expert-parallel and speculative flags on an MoE model ---


@FUZZ
@given(
    flag=st.sampled_from(
        [
            "--moe-imbalance",
            "--acceptance-length",
            "--speculative-config",
            "--speculative-num-steps",
            "--speculative-num-draft-tokens",
        ]
    ),
    value=NUMBERS
    | st.sampled_from(
        [
            '{"method": "mtp"}',
            '{"method": "mtp", "num_speculative_tokens": 99999}',
            "{}",
            "[1]",
            '{"method": 3}',
        ]
    ),
)
def test_fuzz_solve_moe_flags(flag, value):
    args = {"--max-model-len": "8K", "--users": "4", "-g": "H200"}
    if flag == "--acceptance-length":
        args["--speculative-config"] = '{"method": "mtp", "num_speculative_tokens": 2}'
    if flag.startswith("--speculative-num"):
        args["--engine"] = "sglang"
        args["--speculative-algorithm"] = "NEXTN"
    args[flag] = value
    _ok(invoke("solve", "-m", "deepseek-v3", *[x for kv in args.items() for x in kv], "--json"))


@FUZZ
@given(
    flag=st.sampled_from(
        ["--request-rate", "--ttft-ms", "--tpot-ms", "--max-gpus", "--input-len", "--network"]
    ),
    value=NUMBERS,
)
def test_fuzz_solve_disaggregated(flag, value):
    args = {"--max-model-len": "8K", "--request-rate": "5", "--ttft-ms": "500", "--tpot-ms": "50",
            "--num-prompts": "50"}  # fmt: skip
    args[flag] = value
    _ok(
        invoke(
            "solve", "-m", "llama3-8b", "--disaggregated", *[x for kv in args.items() for x in kv], "--json"
        )
    )


# --- simulate's speculative and DP-attention flags; estimate --disaggregated's per-pool TP ---


@FUZZ
@given(
    flag=st.sampled_from(["--acceptance-length", "--speculative-config", "--data-parallel-size"]),
    value=NUMBERS
    | st.sampled_from(
        ['{"method": "mtp", "num_speculative_tokens": 99999}', '{"method": "ngram"}', "{}", "[1]"]
    ),
)
def test_fuzz_simulate_moe_flags(flag, value):
    args = {"--max-model-len": "8K", "--num-prompts": "10", "-g": "8xH200", "--input-len": "256",
            "--output-len": "16"}  # fmt: skip
    if flag == "--acceptance-length":
        args["--speculative-config"] = '{"method": "mtp", "num_speculative_tokens": 2}'
    if flag == "--data-parallel-size":
        args["--engine"] = "sglang"
        args["--enable-dp-attention"] = ""
    args[flag] = value
    argv = [x for kv in args.items() for x in kv if x != ""]
    _ok(invoke("simulate", "-m", "deepseek-v3", *argv, "--json"))


@FUZZ
@given(flag=st.sampled_from(["--prefill-tp", "--decode-tp"]), value=NUMBERS)
def test_fuzz_estimate_disaggregated_pool_tp(flag, value):
    _ok(
        invoke(
            "estimate",
            "-m",
            "llama3-8b",
            "--disaggregated",
            "--prefill-gpus",
            "8xH100",
            "--decode-gpus",
            "8xH100",
            "--input-len",
            "1K",
            "--output-len",
            "64",
            "--max-model-len",
            "8K",
            flag,
            value,
            "--json",
        )  # fmt: skip
    )
