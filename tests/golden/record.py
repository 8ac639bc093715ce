"""Record the golden corpus: `python tests/golden/record.py` (only before a change of shape)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from cases import cases  # noqa: E402
from runner import run  # noqa: E402


def main() -> None:
    rows = [run(args) for args in cases()]
    (HERE / "golden.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(rows)} cases recorded")


if __name__ == "__main__":
    main()
