"""Output at 80 and 200 columns: no cell cut to `…`, the name column kept; file text never markup."""

from __future__ import annotations

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
        # every shipped GPU name whole on one line; aliases shown only where they fit
        assert "A100-80GB-PCIe" in out and "H100-SXM" in out
        assert ("NVIDIA A100-PCIE-40GB" in out) == (width >= 110)
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
