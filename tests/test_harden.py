"""Issue 14: every input bounded and checked at the edge, valid JSON always, safe writes.

Each bad input must give one line naming the flag/file/field and exit 2: never a traceback, never a
hang (a 5 s alarm guards every run), never NaN/Infinity in --json output.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

REPO = Path(__file__).resolve().parent.parent
LOGS = REPO / "tests" / "fixtures" / "logs"
VLLM_LOG = LOGS / "vllm_v011_llama31_8b_h100.log"
LIMIT_S = 5


def _no_constant(name: str) -> None:
    raise ValueError(f"not JSON: {name}")


def strict_json(text: str):
    return json.loads(text, parse_constant=_no_constant)


def _alarm(signum, frame):  # pragma: no cover - only when a run hangs
    raise TimeoutError(f"a kvplan run took over {LIMIT_S} s")


def invoke(*args: str, stdin: str | None = None):
    """Run the CLI in-process under a 5 s alarm; a traceback or a hang fails the test."""
    runner = CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1"})
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT_S)
    try:
        result = runner.invoke(app, list(args), input=stdin)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    exc = result.exception
    assert exc is None or isinstance(exc, SystemExit), f"{args[:4]}: {type(exc).__name__}: {exc}"
    return result


def refused(*args: str, stdin: str | None = None, names: str | None = None):
    """Exit 2 with one error line (naming `names` when given); under --json, a valid error object."""
    result = invoke(*args, stdin=stdin)
    assert result.exit_code == 2, (args[:4], result.exit_code, result.stdout[-300:], result.stderr[-300:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    if names is not None:
        assert names in lines[0], lines[0]
    if "--json" in args:
        strict_json(result.stdout)
    return result


EST = ("estimate", "-m", "qwen3-8b", "--gpus", "H100")


# --- non-finite and unbounded numbers in flags ----------------------------------------------------


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--max-model-len", "inf"),
        ("--max-model-len", "nan"),
        ("--max-model-len", "1e400"),
        ("--max-model-len", "0"),
        ("--max-num-batched-tokens", "nan"),
        ("--max-num-batched-tokens", "1e400"),
        ("--avg-context", "inf"),
        ("--shared-prefix-tokens", "inf"),
        ("--kv-cache-memory", "1e308GiB"),
        ("--kv-cache-memory", "1e400"),
        ("--reserve-memory", "1e400"),
        ("--engine-version", "0.99"),
        ("--engine-version", "1" * 5000 + ".1"),
        ("--block-size", "7"),
    ],
)
def test_estimate_flag_refused(flag, value):
    refused(*EST, flag, value, "--json", names=flag)


def test_negative_scale_bits_refused():
    refused(*EST, "--kv-cache-dtype", "int8", "--kv-quant-scale-bits", "-1000", names="--kv-quant-scale-bits")


def test_newest_engine_version_named():
    result = refused(*EST, "--engine-version", "0.99")
    assert "newest" in result.stderr


@pytest.mark.parametrize("flag", ["--model", "--gpus"])
def test_overlong_names_refused(flag):
    args = list(EST)
    args[args.index(flag if flag == "--gpus" else "-m") + 1] = "x" * 300
    refused(*args, names=flag)


@pytest.mark.parametrize(
    "extra, names",
    [
        (("--max-model-len", "8K", "--max-gpus", "100000000", "--tpot-ms", "0.001"), "--max-gpus"),
        (("--max-model-len", "8K", "--price", "abc"), "--price"),
        (("--max-model-len", "8K", "--price", "nan", "--json"), "--price"),
        (("--max-model-len", "8K", "--gpu", ","), "--gpu"),
        (("--max-model-len", "8K", "--top", "0"), "--top"),
        (("--max-model-len", "inf"), "--max-model-len"),
        (("--max-model-len", "8K", "--tpot-ms", "nan"), "--tpot-ms"),
        (("--max-model-len", "8K", "--users", "100000000000"), "--users"),
    ],
)
def test_solve_refused(extra, names):
    refused("solve", "-m", "qwen3-8b", "-u", "4", *extra, names=names)


@pytest.mark.parametrize(
    "args, names",
    [
        (("compare", "table", "--models", ","), "--models"),
        (("compare", "table", "--models", "qwen3-8b", "--variants", "window0"), "window0"),
        (("compare", "table", "--models", "qwen3-8b", "--variants", "mla0"), "mla0"),
        (("compare", "table", "--models", "qwen3-8b", "--offload-gib", "nan"), "--offload-gib"),
        (("compare", "table", "--models", "qwen3-8b", "--max-model-len", "inf"), "--max-model-len"),
        (("compare", "ladder", "-m", "qwen3-8b", "--avg-context", "nan"), "--avg-context"),
        (("compare", "ladder", "-m", "qwen3-8b", "--shared-prefix-tokens", "inf"), "--shared-prefix-tokens"),
    ],
)
def test_compare_refused(args, names):
    refused(*args, names=names)


# --- spec files, config.json, special files --------------------------------------------------------

QWEN = (REPO / "model_specs" / "models" / "qwen3-8b.yaml").read_text()


def _spec(tmp_path: Path, text: str, name: str = "m.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "old, new, field",
    [
        ("num_layers: 36", "num_layers: 10000000", "num_layers"),
        ("num_layers: 36", "num_layers: 1000000000000", "num_layers"),
        ("num_kv_heads: 8", "num_kv_heads: 1000000000", "num_kv_heads"),
        ("head_dim: 128", "head_dim: 1000000000", "head_dim"),
        ("hidden_size: 4096", "hidden_size: 1000000000000", "hidden_size"),
        ("vocab_size: 151936", "vocab_size: 1000000000000", "vocab_size"),
        ("max_context: 40960", "max_context: 1000000000000", "max_context"),
        ("num_attention_heads: 32", "num_attention_heads: 1000000000", "num_attention_heads"),
    ],
)
def test_spec_sizes_bounded(tmp_path, old, new, field):
    assert old in QWEN
    refused("estimate", "-m", _spec(tmp_path, QWEN.replace(old, new)), "--json", names=field)


def test_state_only_model_with_zero_state(tmp_path):
    text = QWEN.replace(
        "attn: {kind: full, num_kv_heads: 8, head_dim: 128}", "attn: {kind: state, state_bytes: 0}"
    )
    refused("estimate", "-m", _spec(tmp_path, text), names="state_bytes")


def test_gpu_spec_inf_refused(tmp_path):
    gpu = (REPO / "model_specs" / "gpus" / "h100-sxm.yaml").read_text()
    head = gpu.split("hbm_bytes_per_s:")[0]
    tail = gpu.split("hbm_bytes_per_s:")[1].split("\n", 1)[1]
    path = _spec(tmp_path, head + "hbm_bytes_per_s: .inf\n" + tail, "g.yaml")
    refused("estimate", "-m", "qwen3-8b", "--gpus", path, "--json", names="hbm_bytes_per_s")


def _config(tmp_path: Path, **changes) -> str:
    """A trimmed config.json (tests/fixtures/hf/synthetic/: Mistral-7B-v0.1's fields, or gpt-oss-20b's with
    _real) with fields changed."""
    name = "gpt-oss-20b.json" if changes.pop("_real", False) else "mistral-7b-v0.1.json"
    cfg = json.loads((REPO / "tests" / "fixtures" / "hf" / "synthetic" / name).read_text())
    cfg.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_config_baseline_works(tmp_path):
    assert invoke("estimate", "-m", _config(tmp_path), "--json").exit_code == 0


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_hidden_layers", 10_000_000),
        ("num_hidden_layers", 10**12),
        ("num_attention_heads", 10**9),
        ("num_key_value_heads", 10**9),
        ("vocab_size", 10**13),
        ("max_position_embeddings", 10**13),
    ],
)
def test_config_sizes_bounded(tmp_path, field, value):
    refused("estimate", "-m", _config(tmp_path, **{field: value}), names=field)


def test_config_huge_integer(tmp_path):
    path = tmp_path / "config.json"
    text = _config_text(tmp_path)
    assert '"vocab_size": 32000' in text  # Mistral-7B-v0.1's
    path.write_text(text.replace('"vocab_size": 32000', '"vocab_size": ' + "9" * 4400))
    refused("estimate", "-m", str(path), names=str(path))


def _config_text(tmp_path: Path) -> str:
    return Path(_config(tmp_path)).read_text()


def test_config_deep_nesting(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"a": ' + "[" * 10000 + "]" * 10000 + "}")
    refused("estimate", "-m", str(path), names=str(path))


def test_yaml_deep_nesting(tmp_path):
    refused("estimate", "-m", _spec(tmp_path, "a: " + "[" * 10000 + "]" * 10000 + "\n"), names="m.yaml")


def test_no_rope_interval_zero(tmp_path):
    cfg = _config(
        tmp_path,
        model_type="llama4_text",
        architectures=["Llama4ForCausalLM"],
        no_rope_layer_interval=0,
        attention_chunk_size=8192,
    )
    refused("estimate", "-m", cfg, names="no_rope_layer_interval")


def test_dev_zero_refused(tmp_path):
    link = tmp_path / "zero.yaml"
    link.symlink_to("/dev/zero")
    refused("estimate", "-m", str(link), names="zero.yaml")


def test_fifo_refused(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    refused("estimate", "-m", str(fifo), names="pipe.yaml")


def test_big_file_refused(tmp_path):
    refused("estimate", "-m", _spec(tmp_path, QWEN + "#" * (20 * 2**20) + "\n"), names="m.yaml")


def test_big_log_refused(tmp_path):
    log = tmp_path / "big.log"
    log.write_text(VLLM_LOG.read_text() + "x" * (70 * 2**20))
    refused("check-log", str(log), names="big.log")


# --- pasted logs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "old, new",
    [
        ("'max_model_len': 32768", "'max_model_len': inf"),
        ("'max_model_len': 32768", "'max_model_len': " + "9" * 400),
    ],
)
def test_log_numbers_refused(old, new):
    text = VLLM_LOG.read_text()
    assert old in text
    refused("check-log", "-", "--json", stdin=text.replace(old, new))


def test_log_token_count_digits():
    text = VLLM_LOG.read_text()
    import re

    text2 = re.sub(r"GPU KV cache size: [0-9,]+ tokens", "GPU KV cache size: " + "9" * 400 + " tokens", text)
    assert text2 != text
    refused("check-log", "-", "--json", stdin=text2)


def test_log_negative_data_parallel():
    text = VLLM_LOG.read_text().replace(
        "'max_model_len': 32768", "'max_model_len': 32768, 'data_parallel_size': -1"
    )
    result = invoke("check-log", "-", stdin=text)
    assert "-1x" not in result.stdout
    assert result.exit_code == 2, result.stdout[-400:]


def test_log_model_path_not_opened(tmp_path):
    victim = tmp_path / "secret.yaml"
    victim.write_text(QWEN)
    text = VLLM_LOG.read_text().replace("meta-llama/Llama-3.1-8B-Instruct", str(victim))
    result = refused("check-log", "-", "--gpus", "H100", stdin=text)
    assert "config.json" in result.stderr


# --- profiles and overheads ------------------------------------------------------------------------


def _profile_text(**fit) -> str:
    import yaml

    data = {
        "schema": "kvplan.calibration/1",
        "device": "cuda",
        "device_name": "NVIDIA H100 80GB HBM3",
        "gpu_spec": "H100",
        "memory_bytes": 85899345920,
        "sm_count": 132,
        "driver": None,
        "torch": "2",
        "triton": None,
        "measured_on": "2025-01-01T00:00:00+00:00",
        "quick": True,
        "layout": {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "v_dim": 128},
        "ceilings": {},
        "points": [
            {
                "kv_dtype": "bf16",
                "batch": 1,
                "context": 1024,
                "bytes": 4194304,
                "seconds": 0.001,
                "bytes_per_s": 3.0e12,
            }
        ],
        "fit": {"peak_bytes_per_s": 3.0e12, "half_bytes": 1.0e6, "rms_relative_error": 0.01},
    }
    data["fit"].update({k: v for k, v in fit.items() if k in data["fit"]})
    data.update({k: v for k, v in fit.items() if k not in data["fit"]})
    return yaml.safe_dump(data)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"peak_bytes_per_s": "fast"}, "peak_bytes_per_s"),
        ({"half_bytes": float("inf")}, "half_bytes"),
        ({"measured_on": 5}, "measured_on"),
        ({"peak_bytes_per_s": float("nan")}, "peak_bytes_per_s"),
    ],
)
def test_corrupt_profile(tmp_path, changes, field):
    path = tmp_path / "p.yaml"
    path.write_text(_profile_text(**changes))
    refused(*EST, "--calibration-file", str(path), "--json", names=field)


def test_corrupt_saved_profile_named(tmp_path):
    from kvplan.specs.registry import load_gpu
    from kvplan.userdata import profile_path

    path = profile_path(load_gpu("H100").name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_profile_text(half_bytes=float("inf")))
    refused(*EST, "--json", names="half_bytes")


def test_corrupt_overheads(tmp_path):
    from kvplan.userdata import overheads_path

    path = overheads_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("schema: kvplan.overheads/1\nentries:\n- " + "[" * 5000 + "]" * 5000 + "\n")
    refused(*EST, names="overheads.yaml")


# --- JSON is always JSON ------------------------------------------------------------------------------


def test_to_json_never_prints_nan():
    from kvplan.errors import KvplanError
    from kvplan.render.jsonout import to_json

    with pytest.raises(KvplanError):
        to_json({"x": float("nan")})


# --- writes --------------------------------------------------------------------------------------------


def _no_measuring(monkeypatch):
    from kvplan.calibrate import run as calibrate

    def boom(*a, **k):
        raise AssertionError("measured before checking the arguments")

    monkeypatch.setattr(calibrate, "run", boom)


@pytest.mark.parametrize(
    "extra, names",
    [(("-o", "out.txt"), "--output"), (("--kv-cache-dtype", "bogus"), "--kv-cache-dtype")],
)
def test_calibrate_checks_arguments_first(tmp_path, monkeypatch, extra, names):
    _no_measuring(monkeypatch)
    monkeypatch.chdir(tmp_path)
    refused("calibrate", "--device", "cpu", "--quick", *extra, names=names)


def test_calibrate_refuses_to_overwrite_unrelated(tmp_path, monkeypatch):
    _no_measuring(monkeypatch)
    victim = tmp_path / "config.yaml"
    victim.write_text("important: true\n")
    refused("calibrate", "--device", "cpu", "--quick", "-o", str(victim), names="--force")
    assert victim.read_text() == "important: true\n"


def test_write_atomic_modes(tmp_path):
    from kvplan.userdata import write_atomic

    new = tmp_path / "new.yaml"
    write_atomic(new, "a: 1\n")
    assert stat.S_IMODE(new.stat().st_mode) == 0o644
    old = tmp_path / "old.yaml"
    old.write_text("a: 0\n")
    old.chmod(0o640)
    write_atomic(old, "a: 1\n")
    assert stat.S_IMODE(old.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.yaml", "old.yaml"]


def test_stale_temp_files_cleaned(tmp_path):
    from kvplan.userdata import write_atomic

    stale = tmp_path / ".prof.yaml.abc123.tmp"
    stale.write_text("half")
    old = os.path.getmtime(stale) - 3600
    os.utime(stale, (old, old))
    fresh = tmp_path / ".prof.yaml.def456.kvplan-tmp"  # a write in progress elsewhere
    fresh.write_text("half")
    other = tmp_path / ".unrelated.yaml.abc123.tmp"
    other.write_text("not ours")
    os.utime(other, (old, old))
    write_atomic(tmp_path / "prof.yaml", "a: 1\n")
    assert not stale.exists()
    assert fresh.exists() and other.exists()


def test_plot_output_not_through_symlink(tmp_path):
    pytest.importorskip("matplotlib")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    out = tmp_path / "chart.png"
    (tmp_path / ".chart.png.tmp.png").symlink_to(victim)
    result = invoke("compare", "plot", "--models", "qwen3-8b", "--max-model-len", "8K", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert victim.read_text() == "keep"
    assert out.is_file() and not out.is_symlink()


_SAVER = """
import sys
from kvplan.logs import overheads
from kvplan.logs.overheads import Overhead
path, tag = overheads.default_path(), sys.argv[1]
for i in range(25):
    overheads.save(path, Overhead(f"m{tag}{i}", "H100", "vllm", 1, 1, 8192, 1, "0.11", "2025-01-01", "x"))
"""


def test_concurrent_saves_keep_every_entry(tmp_path):
    from kvplan.logs import overheads

    env = {**os.environ, "KVPLAN_DATA_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", _SAVER, tag], env=env) for tag in "ab"]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    assert len(overheads.load(tmp_path / "overheads.yaml")) == 50


# --- issue 24: config.json layer lists, strict integers, heads that do not divide -----------------

QWEN35 = REPO / "tests" / "fixtures" / "hf" / "corpus" / "qwen3.5-9b.json"
MISTRAL = REPO / "tests" / "fixtures" / "hf" / "synthetic" / "mistral-7b-v0.1.json"


def _hf_config(tmp_path: Path, src: Path, text_config: bool, **fields) -> str:
    cfg = json.loads(src.read_text())
    (cfg["text_config"] if text_config else cfg).update(fields)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.mark.parametrize("entry", [{"type": "full_attention"}, ["full_attention"], 1, None])
@pytest.mark.parametrize("src, nested", [(QWEN35, True), (MISTRAL, False)])
def test_layer_types_not_names_refused(tmp_path, src, nested, entry):
    n = json.loads(src.read_text()).get("text_config" if nested else "x", {}).get("num_hidden_layers") or 32
    cfg = _hf_config(tmp_path, src, nested, layer_types=["full_attention"] * (n - 1) + [entry])
    refused("estimate", "-m", cfg, names=f"layer_types[{n - 1}]")


def test_mamba_layer_without_fields_refused(tmp_path):
    cfg = _hf_config(tmp_path, MISTRAL, False, layer_types=["mamba"] * 31 + ["full_attention"])
    result = invoke("estimate", "-m", cfg)
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "mamba_n_heads: required field is missing" in result.stderr.splitlines()[0]


@pytest.mark.parametrize("field", ["num_layers", "hidden_size", "head_dim", "num_kv_heads", "max_context"])
@pytest.mark.parametrize("value", ['"{}"', "true", "{}.0"])
def test_spec_integers_strict(tmp_path, field, value):
    import re

    number = re.search(rf"\b{field}: (\d+)", QWEN).group(1)
    text = QWEN.replace(f"{field}: {number}", f"{field}: {value.format(number)}", 1)
    result = refused("estimate", "-m", _spec(tmp_path, text), names=f"{field}: expected an integer")
    assert "m.yaml" in result.stderr


def test_config_heads_must_divide(tmp_path):
    cfg = _hf_config(tmp_path, MISTRAL, False, num_attention_heads=32, num_key_value_heads=5)
    refused("estimate", "-m", cfg, "-tp", "1", names="num_key_value_heads: 32 attention heads")


def test_spec_heads_must_divide(tmp_path):
    refused(
        "estimate",
        "-m",
        _spec(tmp_path, QWEN.replace("num_kv_heads: 8", "num_kv_heads: 5")),
        names="5 KV heads",
    )


# --- issue 24: values that were accepted ------------------------------------------------------------


@pytest.mark.parametrize(
    "args, names",
    [
        ((*EST, "--engine-version", "0.0"), "--engine-version 0.0"),
        ((*EST, "--engine", "sglang", "--engine-version", "0.0.1"), "--engine-version"),
        ((*EST, "--weight-dtype", ""), "--weight-dtype"),
        ((*EST, "--weight-dtype", "  "), "--weight-dtype"),
        (("solve", "-m", "qwen3-8b", "--users", "4", "--max-model-len", "8K", "--gpus", ""), "--gpus"),
        (("solve", "-m", "qwen3-8b", "--users", "4", "--max-model-len", "8K", "--gpu", ","), "--gpu"),
    ],
)
def test_empty_or_impossible_flags_refused(args, names):
    refused(*args, names=names)


@pytest.mark.parametrize(
    "old, new, names",
    [
        ("data_parallel_size=1", "data_parallel_size=0", "data_parallel_size"),
        ("tensor_parallel_size=1", "tensor_parallel_size=0", "tensor_parallel_size"),
        ("max_seq_len=32768", "max_seq_len=99999999999999", "max_model_len"),
        ("max_seq_len=32768", "max_seq_len=0", "max_model_len"),
    ],
)
def test_log_impossible_setup_refused(old, new, names):
    text = VLLM_LOG.read_text()
    assert old in text
    text = text.replace(old, new)
    if "max_seq_len" in old:  # every line that states the context
        value = new.split("=")[1]
        text = text.replace("'max_model_len': 32768", f"'max_model_len': {value}")
        text = text.replace("for 32,768 tokens", f"for {value} tokens")
    refused("check-log", "-", "--gpus", "H100", stdin=text, names=names)


def test_log_tiny_context_checks_without_traceback():
    text = VLLM_LOG.read_text().replace("max_seq_len=32768", "max_seq_len=3")
    text = text.replace("'max_model_len': 32768", "'max_model_len': 3").replace(
        "for 32,768 tokens", "for 3 tokens"
    )
    result = invoke("check-log", "-", "--gpus", "H100", stdin=text)
    assert result.exit_code in (0, 3), result.stderr[-300:]


def test_calibrate_kv_cache_dtype_named_as_elsewhere(tmp_path, monkeypatch):
    """Issue 24: calibrate's --kv-dtype is --kv-cache-dtype, as in estimate/solve; the old name is a
    hidden alias that warns."""
    _no_measuring(monkeypatch)
    monkeypatch.chdir(tmp_path)
    help_text = invoke("calibrate", "--help").stdout
    assert "--kv-cache-dtype" in help_text and "--kv-dtype" not in help_text
    old = invoke("calibrate", "--device", "cpu", "--quick", "--kv-dtype", "bogus")
    assert old.exit_code == 2
    assert "--kv-dtype is deprecated" in old.stderr and "error: --kv-cache-dtype: bogus" in old.stderr
    refused(
        "calibrate", "--device", "cpu", "--kv-dtype", "bf16", "--kv-cache-dtype", "bf16", names="--kv-dtype"
    )


def test_max_context_names_the_gpus_given_not_max_gpus():
    """Issue 24: `solve --max-context -g H200` blamed --max-gpus 64 when the limit is the one GPU."""
    result = invoke("solve", "-m", "deepseek-v3", "--max-context", "-g", "H200", "-u", "10")
    assert result.exit_code == 3  # no answer
    assert "--max-gpus" not in result.stderr and "--gpus gives 1" in result.stderr


@pytest.mark.parametrize(
    "folder, warned", [("Llama-3-70B-NVFP4", True), ("llama3_fp8", True), ("llama3-70b", False)]
)
def test_quantized_name_without_quant_config_warns(tmp_path, folder, warned):
    """Issue 24: a folder named ...-NVFP4 whose config.json has no quantization_config was planned
    in bf16 silently."""
    d = tmp_path / folder
    d.mkdir()
    (d / "config.json").write_text((REPO / "tests/fixtures/hf/synthetic/llama3-70b.json").read_text())
    result = invoke("estimate", "-m", str(d), "-g", "8xH100")
    assert result.exit_code == 0, result.stderr
    assert ("no quantization_config" in result.stderr) == warned, result.stderr


def test_a_shared_prefix_on_compressed_layers_counts_their_own_full_blocks():
    """DeepSeek-V4-Flash: a compressed layer's block holds 16 entries of `ratio` tokens, so a
    2,048-token prefix fills (2048 // 4) // 16 = 32 blocks of each ratio-4 layer (18,496 B each) and
    (2048 // 128) // 16 = 1 of each ratio-128 layer (16,384 B); charging one page per 16 prefix
    tokens made the shared bytes exceed a whole request's and crashed (float infinity)."""
    from helpers import run_cli
    from kvplan import estimate

    p = estimate("deepseek-v4-flash", gpus="8xH200", max_model_len=8192, shared_prefix_tokens=2048)
    assert p.prefix_caching.shared_bytes_per_gpu == 21 * 18_496 * 32 + 20 * 16_384 * 1
    base = estimate("deepseek-v4-flash", gpus="8xH200", max_model_len=8192)
    assert base.max_concurrency < p.prefix_caching.max_concurrency < 2 * base.max_concurrency
    r = run_cli("compare", "ladder", "-m", "deepseek-v4-flash", "-g", "8xH200")
    assert r.exit_code == 0 and "prefix shared by 50% of requests" in r.stdout


def test_a_simulation_too_long_to_run_is_refused_before_it_starts():
    """SGLang accepts --chunked-prefill-size 1 (server_args.py only asks it divide the page size), but
    1,000 prompts of 1,024 tokens then need 1,024,000 steps: refused in one line, not waited out."""
    from helpers import run_cli

    r = run_cli("simulate", "-m", "qwen3-8b", "--max-model-len", "8K", "--engine", "sglang",
                "--chunked-prefill-size", "1")  # fmt: skip
    assert r.exit_code == 2
    assert "need at least 1,024,000 engine steps, more than the 1,000,000" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_vllm_lowers_its_default_max_num_seqs_to_the_budget_and_refuses_a_given_one_above_it():
    """vllm/engine/arg_utils.py at v0.11.0: max_num_seqs = min(default, max_num_batched_tokens);
    vllm/config/scheduler.py: a given max_num_seqs above max_num_batched_tokens stops the engine."""
    from helpers import run_cli
    from kvplan.plan.plan import PlanRequest, estimate
    from kvplan.simulator.deployment import from_plan
    from kvplan.specs.registry import load_gpu, load_model

    req = PlanRequest(
        model=load_model("qwen3-8b"), gpu=load_gpu("H100"), num_gpus=1, tp=1, pp=1, max_model_len=8192,
        max_num_batched_tokens=512,
    )  # fmt: skip
    assert from_plan(estimate(req), req).max_num_seqs == 512
    r = run_cli("estimate", "-m", "qwen3-8b", "--max-model-len", "8K", "--max-num-batched-tokens", "100",
                "--max-num-seqs", "200")  # fmt: skip
    assert (
        r.exit_code == 2
        and "--max-num-seqs 200 is above --max-num-batched-tokens 100: vLLM refuses to start" in r.stderr
    )


def test_gpt_oss_without_layer_types_alternates_as_transformers_does(tmp_path):
    """transformers' GptOssConfig fills a missing layer_types with sliding where (i + 1) % 2, else
    full: 18 of 36 layers keep the whole context. kvplan read every layer as sliding (a 46x larger
    concurrency on gpt-oss-120b)."""
    import json

    from kvplan import estimate

    real = tmp_path / "real.json"
    cfg = json.loads((Path(__file__).parent / "fixtures" / "hf" / "corpus" / "gpt-oss-120b.json").read_text())
    real.write_text(json.dumps(cfg))
    del cfg["layer_types"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(cfg))
    a = estimate(str(real), gpus="H100", max_model_len=32768)
    b = estimate(str(bare), gpus="H100", max_model_len=32768)
    assert (
        a.max_concurrency == b.max_concurrency
        and a.kv_bytes_per_token_per_gpu == b.kv_bytes_per_token_per_gpu
    )


def test_a_config_json_boolean_given_as_a_string_is_refused(tmp_path):
    """ "tie_word_embeddings": "false" read as true dropped the LM head from the weights (~262 MB on
    gpt-oss-120b) without a word: a config.json's true/false fields take JSON booleans only."""
    cfg = json.loads((Path(__file__).parent / "fixtures" / "hf" / "corpus" / "gpt-oss-120b.json").read_text())
    cfg["tie_word_embeddings"] = "false"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = CliRunner().invoke(app, ["estimate", "-m", str(path), "-g", "H100"])
    assert r.exit_code == 2
    assert "tie_word_embeddings: expected true/false, got 'false'" in r.output
    # a multimodal config: the outer field wins, and the problem is named where it is
    outer = json.loads(
        (Path(__file__).parent / "fixtures" / "hf" / "corpus" / "gemma-3-27b-it.json").read_text()
    )
    outer["text_config"]["tie_word_embeddings"] = "yes"
    path.write_text(json.dumps(outer))
    r = CliRunner().invoke(app, ["estimate", "-m", str(path), "-g", "H100"])
    assert r.exit_code == 2 and "text_config.tie_word_embeddings: expected true/false, got 'yes'" in r.output
    outer["tie_word_embeddings"] = "no"
    path.write_text(json.dumps(outer))
    r = CliRunner().invoke(app, ["estimate", "-m", str(path), "-g", "H100"])
    assert r.exit_code == 2 and "config.json: tie_word_embeddings: expected true/false, got 'no'" in r.output


def test_request_lengths_over_the_context_limit_or_empty_are_refused():
    """`estimate --input-len 100K --output-len 10 --max-model-len 8K` printed a TPOT 'at 48 requests of
    102,400 in' that no engine would run (vLLM and SGLang refuse a prompt plus max_tokens over the
    context limit, an empty prompt, and max_tokens 0)."""
    runner = CliRunner()
    r = runner.invoke(app, ["estimate", "-m", "qwen3-8b", "--max-model-len", "8K", "--input-len", "100K",
                            "--output-len", "10"])  # fmt: skip
    assert (
        r.exit_code == 2
        and "--input-len 102,400 + --output-len 10 is over --max-model-len (8,192)" in r.output
    )
    r = runner.invoke(app, ["estimate", "-m", "qwen3-8b", "--max-model-len", "8K", "--input-len", "0",
                            "--output-len", "0"])  # fmt: skip
    assert r.exit_code == 2 and "must be at least 1 token" in r.output
    ok = runner.invoke(app, ["estimate", "-m", "qwen3-8b", "--max-model-len", "8K", "--input-len", "8000",
                             "--output-len", "192"])  # fmt: skip
    assert ok.exit_code == 0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda k: k.check_log(log_text="x", save_calibration="no"),
            "save_calibration must be True/False, got str 'no'",
        ),
        (
            lambda k: k.estimate("qwen3-8b", enforce_eager="no"),
            "enforce_eager must be True/False, got str 'no'",
        ),
        (
            lambda k: k.estimate("qwen3-8b", tensor_parallel_size="2"),
            "tensor_parallel_size must be an integer or None",
        ),
        (lambda k: k.estimate("qwen3-8b", gpus=None), "gpus must be a string, got NoneType None"),
        (lambda k: k.estimate(None), "model must be a string"),
        (lambda k: k.solve("qwen3-8b", users=100.5), "users must be an integer or None, got float 100.5"),
        (lambda k: k.simulate("qwen3-8b", num_prompts=20.5), "num_prompts must be an integer or None"),
        (lambda k: k.simulate("qwen3-8b", request_rate=None), "request_rate must be a number, got NoneType"),
        (lambda k: k.compare(models=("qwen3-8b",)), "models must be a string or a list of strings or None"),
        (lambda k: k.estimate("qwen3-8b", env="VLLM_X=1"), "env must be a list of strings or None"),
        (lambda k: k.check_log(log_text=b"x"), "log_text must be a string or None, got bytes"),
    ],
)
def test_the_python_api_refuses_an_argument_of_the_wrong_type_in_one_line(
    tmp_path, monkeypatch, call, message
):
    """A truth test took save_calibration="no" as yes and wrote a file; "2" and None reached the
    planner as raw TypeErrors; 100.5 users came back as 8.0 GPUs. Every argument is checked against its
    declared type first, and nothing is written."""
    import kvplan
    from kvplan.errors import UsageError

    monkeypatch.setenv("KVPLAN_DATA_DIR", str(tmp_path))
    with pytest.raises(UsageError, match=re.escape(message)):
        call(kvplan)
    assert not list(tmp_path.iterdir())


def test_the_python_api_still_takes_numbers_where_the_cli_reads_text():
    import kvplan

    p = kvplan.estimate("qwen3-8b", max_model_len=8192, gpu_memory_utilization=1, enforce_eager=False)
    assert p.settings.max_model_len == 8192


def test_compare_table_at_80_columns_cuts_no_name():
    """With every lesser column gone, `int4+window4096+offload64` still did not fit and rich cut it and
    the model's name to an ellipsis; a composite variant now goes on one line per part."""
    r = CliRunner(env={"COLUMNS": "80", "NO_COLOR": "1"}).invoke(
        app, ["compare", "table", "-m", "nemotron-h-56b", "--variants", "shipped,int4+window4096+offload64"]
    )
    assert r.exit_code == 0 and "…" not in r.stdout
    assert r.stdout.count("nemotron-h-56b") % 2 == 0  # both rows, in each table the columns stack into
    assert all(part in r.stdout for part in ("int4+", "window4096+", "offload64", "max", "requests"))
    assert max(len(line) for line in r.stdout.splitlines()) <= 80


def test_a_utf16_log_reads_as_its_utf8_twin_and_one_without_a_bom_is_refused(tmp_path):
    """PowerShell's `>` writes UTF-16 with a byte-order mark: kvplan said 'no vLLM or SGLang KV-cache
    lines found' of a whole log."""
    text = (REPO / "tests" / "fixtures" / "logs" / "vllm_v011_llama31_8b_h100.log").read_text(
        encoding="utf-8"
    )
    runner = CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1"})
    outs = []
    for name, data in (
        ("u8.log", text.encode()),
        ("u16.log", text.encode("utf-16")),
        ("bom.log", text.encode("utf-8-sig")),
    ):
        (tmp_path / name).write_bytes(data)
        r = runner.invoke(app, ["check-log", str(tmp_path / name), "-g", "H100", "--json"])
        assert r.exit_code == 0, r.output
        outs.append(json.loads(r.stdout)["rows"])
    assert outs[0] == outs[1] == outs[2]
    (tmp_path / "le.log").write_bytes(text.encode("utf-16-le"))
    r = runner.invoke(app, ["check-log", str(tmp_path / "le.log"), "-g", "H100"])
    assert r.exit_code == 2 and "not UTF-8 text (it holds NUL bytes" in r.output
