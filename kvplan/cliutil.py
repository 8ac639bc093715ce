"""Helpers every kvplan command shares: reading --gpus and turning kvplan's errors into exits."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import typer

from kvplan.errors import KvplanError, UsageError

P = ParamSpec("P")
R = TypeVar("R")

_GPUS_RE = re.compile(r"^\s*(?:(\d+)\s*[xX*]\s*)?(?:(\d+)\s*[xX*]\s*)?(.+?)\s*$")


def parse_gpus(text: str) -> tuple[int | None, int | None, str]:
    """'8xH100' -> (8 GPUs, 1 node, 'H100'); '2x8xH100' -> (16, 2); 'H100' -> (None, None)."""
    m = _GPUS_RE.match(text)
    if not m or not m.group(3):
        raise UsageError(f"--gpus: cannot read {text!r}; write e.g. H100, 8xH100 or 2x8xH100")
    a, b, name = m.group(1), m.group(2), m.group(3)
    if a is not None and int(a) < 1 or b is not None and int(b) < 1:
        raise UsageError(f"--gpus: GPU and node counts must be >= 1 in {text!r}")
    if b is not None:
        return int(a) * int(b), int(a), name
    if a is not None:
        return int(a), None, name
    return None, None, name


def reports_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn kvplan's own errors into one message on stderr and the documented exit code."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except KvplanError as exc:
            from rich.console import Console
            from rich.markup import escape

            Console(stderr=True, soft_wrap=True).print(
                f"[bold red]error:[/] {escape(str(exc))}", highlight=False
            )
            raise typer.Exit(exc.exit_code) from None

    return wrapper


def to_json(data: Any) -> str:
    """The --json output of every command."""
    return json.dumps(data, indent=2, sort_keys=False)


def load_cluster(text: str):
    """--gpus -> (GPU spec, GPU count or None, nodes): '16xH100' spans ceil(16 / 8) nodes."""
    from kvplan.specs.registry import load_gpu
    from kvplan.units import ceil_div

    num_gpus, nodes, name = parse_gpus(text)
    gpu = load_gpu(name)
    if nodes is None:
        nodes = ceil_div(num_gpus, gpu.gpus_per_node) if num_gpus is not None else 1
    return gpu, num_gpus, nodes
