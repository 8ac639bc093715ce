"""Typed access to a config.json's fields that collects every problem instead of stopping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvplan.limits import limit_for


class Reader:
    """Typed field access that collects every problem instead of stopping at the first."""

    def __init__(self, cfg: dict, path: Path, prefix: str = "") -> None:
        self.cfg, self.path, self.prefix = cfg, path, prefix
        self.problems: list[str] = []
        # the fields a family reader took a value from: never named as "not read" (unread.py)
        self.read: set[str] = set()

    def bad(self, key: str, msg: str) -> None:
        self.problems.append(f"{self.path}: {self.prefix}{key}: {msg}")

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def int(self, *keys: str, default: Any = ..., minimum: int = 1) -> Any:
        for key in keys:
            value = self.cfg.get(key)
            if value is None:
                continue
            self.read.add(key)
            if isinstance(value, bool) or not isinstance(value, int):
                self.bad(key, f"expected an integer, got {value!r}")
                return None
            if value < minimum:
                self.bad(key, f"must be >= {minimum}, got {value}")
                return None
            if value > limit_for(key):
                self.bad(key, f"{value:,} is over kvplan's limit of {limit_for(key):,} (README, Limits)")
                return None
            return value
        if default is ...:
            self.bad(keys[0], "required field is missing")
            return None
        return default

    def bool(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        self.read.add(key)
        if not isinstance(value, bool):
            self.bad(key, f"expected true/false, got {value!r}")
            return default
        return value

    def list(self, key: str) -> list | None:
        value = self.cfg.get(key)
        if value is None:
            return None
        self.read.add(key)
        if not isinstance(value, list):
            self.bad(key, f"expected a list, got {type(value).__name__}")
            return None
        return value
