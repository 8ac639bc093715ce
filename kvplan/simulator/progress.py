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


@contextlib.contextmanager
def count_status(
    what: str, enabled: bool = True, after_s: float = 1.0
) -> Iterator[Callable[[int], None] | None]:
    """A one-line status on stderr ("solve: 12 loads simulated, 3 s") for work longer than a second whose
    total is not known beforehand (a bisection); transient, never under --json."""
    if not enabled:
        yield None
        return
    start = time.perf_counter()
    state: dict[str, Any] = {}

    def update(done: int) -> None:
        elapsed = time.perf_counter() - start
        if "status" not in state:
            if elapsed < after_s:
                return
            from rich.console import Console

            state["status"] = Console(stderr=True).status("")
            state["status"].start()
        state["status"].update(f"{what}: {done:,} simulated so far, {elapsed:,.0f} s")

    try:
        yield update
    finally:
        if "status" in state:
            state["status"].stop()
