"""The error types core code raises; only the CLI turns them into messages and exit codes.

An error's meaning lives in its type, never in its text: callers test `isinstance`, and the
figures computed before the failure travel in `figures` (for `--json` and for `solve`).
"""

from __future__ import annotations

from typing import Any

# Exit codes, documented in the README.
EXIT_OK = 0
EXIT_USAGE = 2  # bad flags, unknown model/GPU, unreadable or invalid spec files
EXIT_INFEASIBLE = 3  # the inputs are valid but the plan cannot work (weights don't fit, ...)

ERROR_SCHEMA = "kvplan.error/1"


class KvplanError(Exception):
    """Base class: the message is one user-facing line (or one line per problem)."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, **figures: Any) -> None:
        super().__init__(message)
        self.figures: dict[str, Any] = figures

    def to_dict(self) -> dict[str, Any]:
        """What `--json` prints on stdout when a command fails (the message also goes to stderr)."""
        return {
            "schema": ERROR_SCHEMA,
            "error": str(self),
            "error_type": type(self).__name__,
            "exit_code": self.exit_code,
            "figures": dict(self.figures),
        }


class UsageError(KvplanError):
    """The user asked for something malformed or unknown."""

    exit_code = EXIT_USAGE


class SpecError(KvplanError):
    """A spec file (YAML or config.json) is missing, unreadable or invalid."""

    exit_code = EXIT_USAGE


class InfeasibleError(KvplanError):
    """Valid inputs, but the deployment cannot work; the message gives the numbers."""

    exit_code = EXIT_INFEASIBLE


class ContextTooLong(InfeasibleError):
    """--max-model-len is beyond the model's maximum context."""


class LayoutInvalid(InfeasibleError):
    """TP/PP cannot split this model's heads or layers."""


class WeightsDoNotFit(InfeasibleError):
    """The weights of one GPU's share exceed the memory the engine may use."""


class NoKvMemoryLeft(InfeasibleError):
    """Weights plus the reserve leave no memory for the KV cache (or a given KV size is too large)."""


class RequestDoesNotFit(InfeasibleError):
    """The KV pool exists but cannot hold one request at --max-model-len."""


class NoAnswer(InfeasibleError):
    """solve: no layout within the limits meets the targets."""
