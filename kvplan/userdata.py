"""Where kvplan keeps what it learns on a user's machine, and how it writes it safely."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from kvplan.errors import UsageError


def data_dir() -> Path:
    """$KVPLAN_DATA_DIR, else $XDG_DATA_HOME/kvplan (an absolute path: the XDG Base Directory spec says a
    relative one is ignored), else ~/.local/share/kvplan."""
    given = os.environ.get("KVPLAN_DATA_DIR")
    if given is not None and given != "":
        if not given.strip():
            raise UsageError("KVPLAN_DATA_DIR is blank; set it to a folder, or unset it for the default")
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "kvplan"


def overheads_path() -> Path:
    """Non-KV overheads measured by `kvplan check-log --save-calibration`."""
    return data_dir() / "overheads.yaml"


def safe_name(name: str) -> str:
    """A GPU's spec name as a file name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "device"


def shipped_profile_path(name: str) -> Path:
    """The profile kvplan ships for a GPU: model_specs/calibrations/<spec name>.yaml, measured by
    `kvplan calibrate` on that GPU (benchmarks/device_check.sh) and committed."""
    import kvplan.model_specs as pkg

    return Path(pkg.__file__).resolve().parent / "calibrations" / f"{safe_name(name)}.yaml"


def profile_path(name: str) -> Path:
    """The bandwidth profile `kvplan calibrate` saves for a GPU (by its spec name)."""
    return data_dir() / "calibrations" / f"{safe_name(name)}.yaml"


TEMP_SUFFIX = ".kvplan-tmp"
STALE_TEMP_S = 600  # a temp file older than this belongs to a killed write


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on `directory` (fcntl.flock on the directory): read-modify-write cycles of
    two kvplan runs (concurrent `check-log --save-calibration`) take turns and lose no entry."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY)  # the directory itself: no lock file to leave behind
    except OSError as exc:
        if (directory.exists() or directory.is_symlink()) and not directory.is_dir():
            raise UsageError(
                f"{directory}: kvplan's data folder is a file (or a broken link), not a folder; set "
                "KVPLAN_DATA_DIR to a folder"
            ) from None
        raise UsageError(f"{directory}: cannot lock ({exc.strerror or exc}); check its permissions") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def clean_stale_temps(path: Path) -> None:
    """Remove the temp files that killed writes of `path` left behind (readers never look at them:
    `.NAME.<random>.kvplan-tmp`, or `.NAME.<random>.tmp` from older kvplan); only this
    target's, and only those older than any live write."""
    now = time.time()
    pattern = glob.escape(f".{path.name}.")
    stale = [*path.parent.glob(f"{pattern}*{TEMP_SUFFIX}"), *path.parent.glob(f"{pattern}*.tmp")]
    for tmp in stale:
        with contextlib.suppress(OSError):
            if now - tmp.lstat().st_mtime > STALE_TEMP_S:
                tmp.unlink()


def present(path: Path) -> bool:
    """Whether a saved file is there (a dangling link or a loop counts, to be refused when read); a folder
    kvplan may not search is refused in one line, not a traceback."""
    try:
        return path.exists() or path.is_symlink()
    except OSError as exc:
        raise UsageError(
            f"{path}: cannot look for kvplan's saved data ({exc.strerror or exc}); fix the folder's permissions, "
            "set KVPLAN_DATA_DIR elsewhere, or pass --no-calibration"
        ) from None


def chart_path(text: str, flag: str) -> Path:
    """A chart file named on the command line: FILE.png or FILE.svg, new or a regular file to replace."""
    if not text.strip():
        raise UsageError(f"{flag}: give a file name, FILE.png or FILE.svg")
    path = Path(text)
    if path.suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"{flag} {text}: the chart is written as .png or .svg; name the file so")
    check_output(path, flag)
    if path.is_file() and not _a_chart(path):
        raise UsageError(
            f"{flag} {path}: exists and is not a chart kvplan drew (matplotlib's PNG or SVG); choose another "
            "name, or delete it first"
        )
    return path


def _a_chart(path: Path) -> bool:
    """Whether an existing file is a matplotlib chart (kvplan draws with matplotlib: its PNG text chunk and
    its SVG header name it), which a new chart may replace; anything else is never overwritten."""
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return b"matplotlib" in head.lower() and (
        head.startswith(b"\x89PNG") or b"<svg" in head or b"<?xml" in head
    )


def check_output(path: Path, flag: str) -> None:
    """An output file named on the command line (a chart) is a new file or a regular one to replace: a
    symlink, FIFO, device or directory there is refused in one line, never replaced by a file."""
    try:
        if os.path.islink(path):
            raise UsageError(f"{flag} {path}: a symbolic link; name the file itself")
        if path.exists() and not path.is_file():
            raise UsageError(f"{flag} {path}: not a regular file; choose a file name")
        if not path.parent.is_dir():  # a mistyped directory is not created as a new tree
            raise UsageError(f"{flag} {path}: no directory {path.parent}; create it first or name another")
    except OSError as exc:  # a name the system will not look up (over 255 bytes a part)
        raise UsageError(f"{flag} {str(path)[:80]}: {exc.strerror or exc}; choose a shorter name") from None


def write_atomic(path: Path, data: str | bytes, mode: int | None = None) -> None:
    """Write `data` to `path` through a temporary file and a rename: readers never see half a file.
    The temp file is created exclusively with an unpredictable name (never through a planted
    symlink); the result keeps the mode of the file it replaces, else 0644 (or `mode`). A `path` that is a
    symlink is written through: its target is replaced, the link kept."""
    try:
        if path.is_symlink():  # a data file kept elsewhere (a dotfiles repository): its target is replaced
            path = path.resolve(strict=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(path)
        if mode is None:
            try:
                mode = stat.S_IMODE(os.stat(path).st_mode) if path.is_file() else 0o644
            except OSError:
                mode = 0o644
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data.encode("utf-8") if isinstance(data, str) else data)
                fh.flush()
                os.fchmod(fh.fileno(), mode)
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise UsageError(f"{path}: cannot write ({exc.strerror or exc}); choose another path") from None
