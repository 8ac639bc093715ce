"""The README's examples, run as a user runs them (tests/test_readme.py).

Two kinds:

- an output example: a paragraph "`kvplan ...` (N columns):" followed by a ```text block. The
  block is what the command prints in a terminal N columns wide (rich's width, COLUMNS=N, no
  colour), every line stripped of trailing spaces. `python tests/readme_examples.py --write`
  refreshes every such block from the program (in an empty data directory and offline, so that
  nothing saved on this machine shows) and prints which changed.
- a command line: every `kvplan ...` line in a ```bash block (after `&&`, `|` or on its own line,
  `\\` continuations joined, `#` comments dropped) is run in a scratch folder and must exit 0.
  Skipped by rule, each with its reason (`skip_reason`): a Hugging Face Hub id that is not a shipped
  model (needs the network), `kvplan calibrate` without `--device cpu` (needs a GPU). A file the
  README's commands read that a GPU run makes (`vllm.log` from its `vllm serve` line, the trace
  `conversation_trace.jsonl`) is supplied from tests/fixtures (`SUPPLIED`); files made by an
  earlier README line (`cpu.yaml`) are made by running that line first.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
FIXTURES = REPO / "tests" / "fixtures"

OUTPUT_RE = re.compile(r"^`(kvplan [^`\n]+)` \((\d+) columns\):\n\n```text\n(.*?)^```$", re.S | re.M)
BLOCK_RE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)

# files the README's commands read that come from a GPU run: the README's `vllm serve` line is
# Llama-3.1-8B-Instruct on one H100 (a real v0.11 startup log of that), and a Mooncake trace (its
# first 300 requests, so that the test stays short)
SUPPLIED = {
    "vllm.log": (FIXTURES / "logs" / "vllm_v011_llama31_8b_h100.log", None),
    "conversation_trace.jsonl": (FIXTURES / "traces" / "mooncake_conversation_trace.jsonl", 300),
}


@dataclass(frozen=True)
class OutputExample:
    command: str
    width: int
    block: str  # the README's text, lines joined with "\n", a final "\n"
    start: int  # the block's span in the README text
    end: int


def output_examples(text: str) -> list[OutputExample]:
    return [
        OutputExample(m.group(1), int(m.group(2)), m.group(3), m.start(3), m.end(3))
        for m in OUTPUT_RE.finditer(text)
    ]


def normalise(text: str) -> str:
    """Trailing spaces dropped on every line (rich pads a table's title line), one final newline."""
    return "\n".join(line.rstrip() for line in text.rstrip("\n").split("\n")) + "\n"


def run(argv: list[str], width: int = 120) -> tuple[int, str, str]:
    """Run kvplan in-process as a terminal of `width` columns: exit code, stdout, stderr."""
    from typer.testing import CliRunner

    from kvplan.cli import app

    result = CliRunner(env={"COLUMNS": str(width), "NO_COLOR": "1"}).invoke(app, argv)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def render(command: str, width: int) -> str:
    argv = shlex.split(command)
    assert argv[0] == "kvplan", command
    code, out, err = run(argv[1:], width)
    assert code == 0, f"{command}: exit {code}: {err}"
    return normalise(out)


def command_lines(text: str) -> list[str]:
    """Every `kvplan ...` command in the README's bash blocks, in order, as typed."""
    out: list[str] = []
    for m in BLOCK_RE.finditer(text):
        if m.group(1) not in ("bash", "sh", "console"):
            continue
        body = m.group(2).replace("\\\n", " ")
        for line in body.splitlines():
            code = shlex.split(line, comments=True)
            # split the line at the shell's && and | and keep the kvplan commands
            part: list[str] = []
            for word in [*code, "&&"]:
                if word in ("&&", "|", ";", "||"):
                    if part and part[0] == "kvplan":
                        out.append(shlex.join(part))
                    part = []
                else:
                    part.append(word)
    return out


def _shipped_names() -> set[str]:
    from kvplan.specs.registry import _names, _raw_specs

    return {n.lower() for _, data in _raw_specs("models") for n in _names(data)}


def _model_values(argv: list[str]) -> list[str]:
    out = []
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag in ("-m", "--model", "--models"):
            out += [v.strip() for v in value.split(",") if v.strip()]
    return out


def skip_reason(argv: list[str]) -> str | None:
    """Why a README command is not run here (None: it is run)."""
    if argv[1:2] == ["calibrate"]:
        device = argv[argv.index("--device") + 1] if "--device" in argv[:-1] else None
        if device != "cpu":
            return "kvplan calibrate measures a GPU; only `--device cpu` runs here"
    shipped = _shipped_names()
    for name in _model_values(argv):
        if "/" in name and name.lower() not in shipped and not Path(name).exists():
            return f"{name} is a Hugging Face Hub id kvplan does not ship: fetching it needs the network"
    return None


def supply_inputs(folder: Path) -> None:
    """The files the README's commands read that a GPU run would make."""
    for name, (source, lines) in SUPPLIED.items():
        if lines is None:
            shutil.copyfile(source, folder / name)
        else:
            with source.open(encoding="utf-8") as f:
                head = [next(f) for _ in range(lines)]
            (folder / name).write_text("".join(head), encoding="utf-8")


def write() -> int:
    """Refresh every output block of the README from the program; the number changed."""
    text = README.read_text(encoding="utf-8")
    changed = 0
    for ex in reversed(output_examples(text)):  # from the end, so that earlier spans stay put
        new = render(ex.command, ex.width)
        if new != ex.block:
            changed += 1
            print(f"refreshed: {ex.command} ({ex.width} columns)")
            text = text[: ex.start] + new + text[ex.end :]
    README.write_text(text, encoding="utf-8")
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/readme_examples.py --write")
    # what this machine saved (calibrations, overheads) and the Hub must not show in the README
    os.environ["KVPLAN_DATA_DIR"] = tempfile.mkdtemp(prefix="kvplan-readme-")
    os.environ["HF_HUB_OFFLINE"] = "1"
    sys.path.insert(0, str(REPO))
    print(f"{write()} block(s) changed")
