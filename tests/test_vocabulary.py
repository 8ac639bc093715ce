"""One vocabulary across commands (issue 24): default GPUs by one rule, solve's calibration flags as
estimate's, compare table's --kv-cache-dtype, and help that states one default."""

from __future__ import annotations

import pytest
from test_calibration_profile import _profile
from typer.testing import CliRunner

from helpers import REPO, run_cli
from kvplan.calibrate import calibration
from kvplan.cli import app


def _help(*path: str) -> str:
    out = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"}).invoke(app, [*path, "--help"]).stdout
    return " ".join(out.split())


@pytest.mark.parametrize(
    "path, default",
    [
        (("estimate",), "H100"),
        (("simulate",), "H100"),
        (("compare", "table"), "8xH100"),
        (("compare", "ladder"), "8xH100"),
        (("compare", "plot"), "8xH100"),
    ],
)
def test_default_gpus_follow_one_rule(path, default):
    """H100 everywhere: one card for the deployment you describe, one node of 8 for a comparison;
    each --help says the rule."""
    text = _help(*path)
    assert f"[default: {default}]" in text
    assert "Default one H100 (compare: one node, 8xH100)" in text or (
        "Default one node, 8xH100 (estimate, simulate: one H100)" in text
    )


def test_compare_table_and_plot_run_on_one_node_of_h100_by_default():
    table = run_cli("compare", "table", "--json").json()
    assert table["cluster"]["gpu"] == "H100-SXM" and table["cluster"]["num_gpus"] == 8
    plot = run_cli("compare", "plot", "-m", "llama3-8b", "--json").json()
    assert plot["budget"].startswith("8x H100-SXM")
    import kvplan

    assert kvplan.compare(models="llama3-8b").cluster.gpu == "H100-SXM"


def test_readme_states_the_rule():
    text = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert "Default GPUs, one rule for every command" in text
    assert "8xH200 at 8K" not in text


def test_compare_table_help_states_one_default_context():
    text = _help("compare", "table")
    assert "default 8K" in text and "the model's maximum)" not in text


def test_compare_table_kv_cache_dtype_applies_to_every_row():
    r = run_cli(
        "compare",
        "table",
        "-m",
        "llama3-70b",
        "--variants",
        "shipped,gqa4,int4",
        "--kv-cache-dtype",
        "fp8",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    rows = {row["variant"]: row for row in r.json()["rows"]}
    assert set(rows) == {"shipped+fp8", "gqa4+fp8", "int4"}  # a variant naming its dtype keeps it
    assert rows["shipped+fp8"]["kv_cache_dtype"] == "fp8" and rows["int4"]["kv_cache_dtype"] == "int4"
    plain = run_cli("compare", "table", "-m", "llama3-70b", "--json").json()["rows"][0]
    assert rows["shipped+fp8"]["kv_bytes_per_token"] * 2 == plain["kv_bytes_per_token"]
    assert (
        run_cli("compare", "table", "--kv-cache-dtype", "auto", "--json").json()
        == run_cli("compare", "table", "--json").json()
    )
    bad = run_cli("compare", "table", "--kv-cache-dtype", "fp7")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --kv-cache-dtype")


SOLVE = ("solve", "-m", "llama3-8b", "-u", "10", "--max-model-len", "8K")


def test_solve_takes_a_calibration_file_as_estimate_does(tmp_path):
    path = tmp_path / "h200.yaml"
    calibration.save(_profile(), path)
    ok = run_cli(*SOLVE, "-g", "H200", "--calibration-file", str(path), "--json")
    assert ok.exit_code == 0 and ok.stderr == "", ok.stderr
    best = ok.json()["answers"][0]
    plain = run_cli(*SOLVE, "-g", "H200", "--json").json()["answers"][0]
    assert best["tpot_ms"] != plain["tpot_ms"]  # its measured GEMMs time the decode
    other = run_cli(*SOLVE, "-g", "H100", "--calibration-file", str(path))
    assert other.exit_code == 2 and "--force-calibration" in other.stderr
    forced = run_cli(*SOLVE, "-g", "H100", "--calibration-file", str(path), "--force-calibration", "--json")
    assert forced.exit_code == 0 and forced.stderr.startswith("warning: calibration")


def test_solve_with_another_devices_saved_profile_can_be_forced():
    """The message solve gave named --force-calibration, which solve did not have."""
    calibration.save(_profile(), calibration.default_path("H100-SXM"))
    refused = run_cli(*SOLVE)
    assert refused.exit_code == 2 and "--force-calibration" in refused.stderr
    forced = run_cli(*SOLVE, "--force-calibration")
    assert forced.exit_code == 0 and "warning: calibration" in forced.stderr
    assert run_cli(*SOLVE, "--no-calibration").exit_code == 0
    import kvplan

    with pytest.warns(UserWarning, match="--force-calibration"):
        kvplan.solve("llama3-8b", users=10, max_model_len="8K", force_calibration=True)
