"""Issue 24: the findings of the fifth fuzz pass (H1-H19), each test failing on the code before its fix."""

from __future__ import annotations

import os

import pytest

from tests.helpers import run_cli


def test_calibrate_refuses_more_all_reduce_processes_than_cores():
    # H17: --nproc-per-node 100000 on a CPU started 233 torch processes (about 130 MB each) before it was killed
    pytest.importorskip("torch")
    cores = os.cpu_count() or 1
    r = run_cli("calibrate", "--device", "cpu", "--only", "allreduce", "--nproc-per-node", str(cores + 1))
    assert r.exit_code == 2
    assert r.stderr.strip().endswith(
        f"--nproc-per-node {cores + 1}: this machine has {cores} CPU core(s); give at most {cores}"
    )
