"""The README's install lines (issue 24): each extra pulls what the README says, and the CPU-only line
installs torch's CPU build before the calibrate extra, which then asks pip for no CUDA wheel."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.metadata import metadata

import pytest

from helpers import REPO

TEXT = (REPO / "README.md").read_text(encoding="utf-8")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _requirements() -> dict[str, set[str]]:
    """pyproject's dependencies by extra ("" for the base), as installed package names."""
    out: dict[str, set[str]] = {}
    for req in metadata("kvplan").get_all("Requires-Dist") or []:
        name = re.match(r"[A-Za-z0-9_.-]+", req)
        extra = re.search(r'extra == "([^"]+)"', req)
        assert name is not None
        out.setdefault(extra.group(1) if extra else "", set()).add(name.group(0).lower().replace("_", "-"))
    return out


def test_the_table_of_extras_says_what_each_pulls():
    reqs = _requirements()
    rows = re.findall(r"^\| `pip install (\.|'\.\[(\w+)\]')` \| (.+?) \| .+ \|$", TEXT, re.M)
    assert {extra for _, extra, _ in rows} == {"", "plot", "calibrate", "test"}, rows
    for _, extra, pulls in rows:
        named = {p.strip(" +").lower().replace("_", "-") for p in pulls.split(",")}
        assert named == reqs[extra], (extra, named, reqs[extra])


def test_cpu_line_installs_the_cpu_torch_before_the_extra():
    (line,) = [ln for ln in TEXT.splitlines() if CPU_INDEX in ln and ln.startswith("pip install")]
    first, second = line.split("#")[0].split("&&")
    assert first.split() == ["pip", "install", "torch", "--index-url", CPU_INDEX]
    assert second.split() == ["pip", "install", "'.[calibrate]'"]
    gpu = [ln for ln in TEXT.splitlines() if ln.startswith("pip install '.[calibrate]'")]
    assert gpu and "GPU machine" in gpu[0]


def test_with_a_cpu_torch_the_calibrate_extra_pulls_no_cuda_wheel(tmp_path):
    """pip's resolver, asked for the extra where torch's CPU build is installed (as the README's CPU
    line leaves it), installs nothing but kvplan: no torch, no nvidia-* wheel."""
    torch = pytest.importorskip("torch")
    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build: the CPU line is what this checks")
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "-q", "--report", str(report), ".[calibrate]"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        pytest.skip(f"pip could not resolve here (no index reachable?): {done.stderr.strip()[-200:]}")
    names = {i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]}
    assert not [n for n in names if n.startswith("nvidia-") or n == "torch"], names
    assert names <= {"kvplan", "triton", "numpy"}, names
