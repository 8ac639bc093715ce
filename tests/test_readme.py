"""Docs that cannot drift (issue 24): the README's examples run, and their shown output is the program's.

How each kind is found and run, and what is skipped by which rule: tests/readme_examples.py.
A failing output example: `python tests/readme_examples.py --write` refreshes the blocks.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
import readme_examples as rx

TEXT = rx.README.read_text(encoding="utf-8")
OUTPUTS = rx.output_examples(TEXT)
COMMANDS = rx.command_lines(TEXT)


def test_the_readme_shows_output_examples():
    assert any(ex.command.startswith("kvplan estimate") and ex.width == 100 for ex in OUTPUTS), (
        "the estimate example lost its `(100 columns):` line"
    )
    assert len(COMMANDS) >= 20, COMMANDS


@pytest.mark.parametrize("ex", OUTPUTS, ids=lambda ex: f"{ex.command} @{ex.width}")
def test_output_block_is_what_the_program_prints(ex):
    shown = rx.normalise(ex.block)
    assert shown == ex.block, "the README block has trailing spaces: refresh it"
    printed = rx.render(ex.command, ex.width)
    assert printed == shown, (
        f"README's output of `{ex.command}` is stale: run `python tests/readme_examples.py --write`"
    )
    assert max(len(line) for line in printed.splitlines()) <= ex.width


def test_json_excerpts_match():
    """A `--json` command followed by `# "key": value, ...` comment lines: those keys have those values."""
    pairs = re.findall(r"^(kvplan [^\n#]*--json)\s*\n((?:# .*\n)+)", TEXT, re.M)
    assert pairs, "the README's --json excerpt is gone"
    for command, comments in pairs:
        code, out, err = rx.run(shlex.split(command)[1:])
        assert code == 0, err
        got = json.loads(out)
        shown = json.loads("{" + ", ".join(c[2:].strip() for c in comments.splitlines()) + "}")
        assert {k: got[k] for k in shown} == shown, command


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("readme")
    rx.supply_inputs(folder)
    return folder


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_line_runs(command, workdir, monkeypatch):
    argv = shlex.split(command)
    if reason := rx.skip_reason(argv):
        pytest.skip(reason)
    monkeypatch.chdir(workdir)
    if "cpu.yaml" in argv and argv[1] != "calibrate" and not (workdir / "cpu.yaml").exists():
        # made by the README's own line before it
        made = next(c for c in COMMANDS if "-o cpu.yaml" in c)
        assert rx.run(shlex.split(made)[1:])[0] == 0
    code, out, err = rx.run(argv[1:])
    assert code == 0, f"{command}: exit {code}: {err}"
    assert "Traceback" not in out + err


@pytest.mark.parametrize("index", range(len(re.findall(r"^```python\n", TEXT, re.M))))
def test_python_examples_run(index, workdir, monkeypatch):
    block = [m.group(2) for m in rx.BLOCK_RE.finditer(TEXT) if m.group(1) == "python"][index]
    monkeypatch.chdir(workdir)
    exec(compile(block, f"README.md python block {index + 1}", "exec"), {})


def test_skip_rule():
    assert rx.skip_reason(["kvplan", "calibrate", "--quick"])
    assert rx.skip_reason(["kvplan", "calibrate", "--device", "cpu", "--quick"]) is None
    assert rx.skip_reason(["kvplan", "estimate", "-m", "nvidia/DeepSeek-V3.2-NVFP4"])
    assert rx.skip_reason(["kvplan", "estimate", "-m", "meta-llama/Llama-3.1-70B-Instruct"]) is None
    assert rx.skip_reason(
        ["kvplan", "compare", "table", "--models", "llama3-8b,Qwen/Qwen3-Next-80B-A3B-Thinking"]
    )
