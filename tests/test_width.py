"""Output at 80 and 200 columns: no cell cut to `…`, the name column kept; file text never markup."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app


def _run(width: int, *args: str):
    result = CliRunner(env={"COLUMNS": str(width), "NO_COLOR": "1"}).invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize(
    "args",
    [
        ("models",),
        ("gpus",),
        ("compare", "table"),
        (
            "solve",
            "-m",
            "llama3-70b",
            "-u",
            "100",
            "--max-model-len",
            "8K",
            "-g",
            "H100,H200",
            "--price",
            "2,3",
        ),
        ("--help",),
        ("solve", "--help"),
    ],
)
def test_no_cell_is_cut(width, args):
    out = _run(width, *args).stdout
    assert "0.…" not in out and "…" not in out
    if args == ("models",):
        assert "deepseek-v3" in out and "growing" in out
    if args == ("gpus",):
        # every shipped GPU name whole on one line; the aliases beside them, or below them at 80 columns
        assert "A100-80GB-PCIe" in out and "H100-SXM" in out
        assert "NVIDIA A100-PCIE-40GB" in out and ("(continued)" in out) == (width < 110)
    if "--price" in args:
        assert "in the unit of --price" in out


def test_gpu_alias_and_flag_named_in_errors():
    a = _run(120, "solve", "-m", "llama3-8b", "-u", "1", "--max-model-len", "8K", "--gpu", "H100", "--json")
    b = _run(120, "solve", "-m", "llama3-8b", "-u", "1", "--max-model-len", "8K", "-g", "H100", "--json")
    assert a.exit_code == 0 and a.stdout == b.stdout
    bad = _run(120, "solve", "-m", "llama3-8b", "-u", "1", "--max-model-len", "8K", "--gpu", "8xH100")
    assert bad.exit_code == 2 and "--gpu 8xH100" in bad.stderr
    bad = _run(120, "solve", "-m", "llama3-8b", "-u", "1", "--max-model-len", "8K", "--gpu", "NoSuch")
    assert bad.exit_code == 2 and bad.stderr.replace("\n", " ").startswith("error: --gpu:")


def test_markup_in_names_is_shown_as_typed(tmp_path):
    import yaml

    from helpers import REPO

    spec = next((REPO / "model_specs" / "models").glob("llama3-8b*.yaml"))
    data = yaml.safe_load(spec.read_text(encoding="utf-8"))
    data.pop("aliases", None)
    data["name"] = "evil[/]model[bold]"
    path = tmp_path / "evil.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    out = _run(200, "estimate", "-m", str(path), "-g", "H100", "--max-model-len", "8K")
    assert out.exit_code == 0, out.stderr
    assert "evil[/]model[bold]" in out.stdout
    table = _run(200, "compare", "table", "-m", str(path), "-g", "H100")
    assert "evil[/]model[bold]" in table.stdout


def _commands():
    """Every command path (("estimate",), ("compare", "table"), ...) and its click command."""
    import typer

    root = typer.main.get_command(app)
    ctx = root.make_context("kvplan", ["--help"], resilient_parsing=True)
    out = [((), root)]
    for name in root.list_commands(ctx):
        cmd = root.get_command(ctx, name)
        out.append(((name,), cmd))
        if hasattr(cmd, "list_commands"):
            sub_ctx = cmd.make_context(name, [], parent=ctx, resilient_parsing=True)
            out += [((name, sub), cmd.get_command(sub_ctx, sub)) for sub in cmd.list_commands(sub_ctx)]
    return out


@pytest.mark.parametrize("path, cmd", _commands(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_help_at_80_columns_cuts_nothing(path, cmd):
    """Issue 24: rich's option table cut 31 of estimate's option names (`--max-model-len,…`)."""
    result = _run(80, *path, "--help")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "…" not in out, out
    cut = [ln for ln in out.splitlines() if ln.endswith("...") and not ln.startswith("Usage:")]
    assert not cut, cut  # click's command list cut each summary to `...`
    assert max(len(line) for line in out.splitlines()) <= 80
    for param in cmd.params:
        for opt in (*param.opts, *param.secondary_opts):
            if opt.startswith("--") and not param.hidden:
                assert opt in out, f"{opt} missing from {' '.join(path)} --help"


def test_usage_error_is_one_line():
    """A missing --model: one `error:` line (README), not a boxed panel."""
    result = _run(80, "estimate", "-g", "H100")
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: Missing option '--model' / '-m'; see `"), lines


def test_narrow_tables_stack_their_columns_and_lose_none():
    """Issue 24: at 80 columns solve and compare table dropped columns (users margin, KV/token/GPU), gpus the
    aliases and models the HF ids; now the columns that do not fit follow in a table of their own."""
    args = ("solve", "-m", "llama3-70b", "-u", "100", "--max-model-len", "8K", "-g", "H100,H200",
            "--price", "2,3", "--tpot-ms", "50")  # fmt: skip
    narrow, wide = _run(80, *args).stdout, json.loads(_run(200, *args, "--json").stdout)
    assert "(continued)" in narrow and "users margin: max users" in narrow
    assert max(len(line.rstrip()) for line in narrow.split("\n\n")[0].splitlines()) <= 80
    for a in wide["answers"]:  # every margin printed, as a whole percentage
        assert f"{a['margins']['users']:+.0%}" in narrow and f"{a['margins']['tpot']:+.0%}" in narrow
    table = _run(80, "compare", "table", "-m", "qwen3-8b,llama3-70b", "--variants", "mla,gqa2").stdout
    assert "KV/token/GPU" in table and "18 KiB" in table and "(continued)" in table
    gpus = _run(80, "gpus").stdout
    assert "NVIDIA H100 80GB HBM3" in gpus and "A100-SXM" in gpus
    models = _run(80, "models").stdout
    assert "deepseek-ai/DeepSeek-V2-Lite" in models


@pytest.mark.parametrize("width", [80, 120])
def test_plot_numbers_never_cut(width):
    """Issue 24: compare plot cut 2,754 to `2,…` at 80 columns; the contexts now continue below."""
    out = _run(width, "compare", "plot", "-m", "llama3-70b,qwen3-8b,deepseek-v3", "-g", "8xH200").stdout
    assert "…" not in out
    assert "2,754" in out and "160K" in out and "6,929" in out
    assert max(len(line.rstrip()) for line in out.splitlines()) <= width


def test_no_hex_highlight_and_plurals():
    """Issue 24: rich coloured the `0x` of `80x full` as a hex number; `block size 1 tokens`."""
    from rich.console import Console

    from helpers import plan
    from kvplan.render.tables import render_plan

    console = Console(force_terminal=True, color_system="truecolor", width=200, record=True)
    render_plan(plan("llama3-70b", "H200", num_gpus=2, tp=2, block_size=1, max_model_len=8192), console)
    ansi = console.export_text(styles=True, clear=False)
    assert "80x full" in ansi  # not split by a colour code
    text = console.export_text()
    assert "block size 1 token\n" in text or "block size 1 token" in text.replace("\n", " ")
    assert "block size 1 tokens" not in text.replace("\n", " ")
