"""`pip install .` (not only editable) gives a working kvplan with every shipped spec."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import REPO

pytest.importorskip("setuptools")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # build from a copy: setuptools reuses a checkout's build/ folder, whose stale modules would
    # hide a package missing from pyproject's list
    src = tmp_path_factory.mktemp("src") / "kvplan"
    skip = shutil.ignore_patterns("build", ".venv", ".git", "*.egg-info", "__pycache__", ".*cache", "tests")
    shutil.copytree(REPO, src, ignore=skip)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    (whl,) = out.glob("kvplan-*.whl")
    return whl


def _yaml_names(names: list[str], folder: str) -> list[str]:
    return sorted(n.rsplit("/", 1)[-1] for n in names if n.startswith(folder) and n.endswith(".yaml"))


def test_wheel_ships_specs_under_the_kvplan_namespace(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for kind in ("models", "gpus"):
        shipped = sorted(p.name for p in (REPO / "model_specs" / kind).glob("*.yaml"))
        assert _yaml_names(names, f"kvplan/model_specs/{kind}/") == shipped
    assert "kvplan/kernels/__init__.py" in names
    assert not [n for n in names if n.startswith(("kernels/", "model_specs/", "tests/"))]
    # every module of the source package is in the wheel (a package missing from pyproject's list is not)
    source = sorted(str(p.relative_to(REPO)) for p in (REPO / "kvplan").rglob("*.py"))
    assert [n for n in source if n not in names] == []


def test_installed_wheel_plans_from_another_directory(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = (
        "import kvplan, json, sys\n"
        "assert kvplan.__file__.startswith(sys.argv[1]), kvplan.__file__\n"
        "from kvplan.specs.registry import all_models, all_gpus, load_model\n"
        "print(len(all_models()), len(all_gpus()), load_model('meta-llama/Meta-Llama-3-70B').name)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(target)], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    n_models, n_gpus, name = r.stdout.split()
    assert int(n_models) == len(list((REPO / "model_specs/models").glob("*.yaml")))
    assert int(n_gpus) == len(list((REPO / "model_specs/gpus").glob("*.yaml")))
    assert name == "llama3-70b"
    # and the whole command runs from the installed copy alone (every subpackage shipped)
    r = subprocess.run(
        [sys.executable, "-m", "kvplan", "estimate", "-m", "llama3-8b", "-g", "H100", "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["engine"]["engine"] == "vllm"


def test_shipped_specs_load_unvalidated_exactly_as_validated():
    # load_model/load_gpu build shipped specs without re-validating (faster start); that path must
    # give the very object validation gives, so a number written so that YAML reads it as a string
    # (312e+12 without a point) shows up here
    from kvplan.specs import io, registry
    from kvplan.specs.models import GpuSpec, ModelSpec

    for kind, cls in (("models", ModelSpec), ("gpus", GpuSpec)):
        for path, data in registry._raw_specs(kind):
            fast = registry._shipped(cls, data)
            checked = io.validate(cls, data, path)
            assert fast == checked, path.name
            if cls is ModelSpec:
                assert fast.layers == checked.layers and fast.attention_summary == checked.attention_summary


def test_source_tree_finds_specs_and_kernels_without_an_install(tmp_path):
    # A plain (non-editable) install leaves the source kvplan/ shadowing the installed package when
    # run from the repository root; only the installed one held kvplan.model_specs and
    # kvplan.kernels. A copy of the tree, run with -S (no site: no editable finder, no installed
    # kvplan) and only the dependencies on the path, must still plan.
    import shutil
    import sysconfig

    for folder in ("kvplan", "model_specs", "kernels"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sorted(deps))}
    code = (
        "import sys, kvplan, kvplan.kernels\n"
        "assert kvplan.__file__.startswith(sys.argv[1]), kvplan.__file__\n"
        "assert kvplan.kernels.__file__.startswith(sys.argv[1]), kvplan.kernels.__file__\n"
        "from kvplan.specs.registry import load_model\n"
        "print(load_model('llama3-8b').name)\n"
    )
    r = subprocess.run(
        [sys.executable, "-S", "-c", code, str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["llama3-8b"]
    r = subprocess.run(
        [sys.executable, "-S", "-m", "kvplan", "estimate", "-m", "llama3-8b", "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert '"name": "llama3-8b"' in r.stdout
