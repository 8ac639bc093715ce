"""A progress bar on stderr for runs longer than a second (rich, never under --json)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def progress_bar(enabled: bool = True, after_s: float = 1.0) -> Iterator[Callable[[int, int], None] | None]:
    if not enabled:
        yield None
        return
    start = time.perf_counter()
    state: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        if "bar" not in state:
            if time.perf_counter() - start < after_s:
                return
            from rich.console import Console
            from rich.progress import Progress

            bar = Progress(console=Console(stderr=True), transient=True)
            bar.start()
            state["bar"], state["task"] = bar, bar.add_task("simulating requests", total=total)
        state["bar"].update(state["task"], completed=done)

    try:
        yield update
    finally:
        if "bar" in state:
            state["bar"].stop()
