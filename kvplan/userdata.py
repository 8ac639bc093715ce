"""Where kvplan keeps what it learns on a user's machine, and how it writes it safely."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from kvplan.errors import UsageError


def data_dir() -> Path:
    """$KVPLAN_DATA_DIR, else $XDG_DATA_HOME/kvplan, else ~/.local/share/kvplan."""
    if os.environ.get("KVPLAN_DATA_DIR"):
        return Path(os.environ["KVPLAN_DATA_DIR"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base).expanduser() / "kvplan"


def overheads_path() -> Path:
    """Non-KV overheads measured by `kvplan check-log --save-calibration`."""
    return data_dir() / "overheads.yaml"


def profile_path(name: str) -> Path:
    """The bandwidth profile `kvplan calibrate` saves for a GPU (by its spec name)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "device"
    return data_dir() / "calibrations" / f"{safe}.yaml"


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename: readers never see half a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise UsageError(f"{path}: cannot write ({exc.strerror or exc}); choose another path") from None
