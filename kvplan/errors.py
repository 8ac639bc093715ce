"""The error types core code raises; only the CLI turns them into messages and exit codes."""

from __future__ import annotations

# Exit codes, documented in the README.
EXIT_OK = 0
EXIT_USAGE = 2  # bad flags, unknown model/GPU, unreadable or invalid spec files
EXIT_INFEASIBLE = 3  # the inputs are valid but the plan cannot work (weights don't fit, ...)


class KvplanError(Exception):
    """Base class: the message is one user-facing line (or one line per problem)."""

    exit_code = EXIT_USAGE


class UsageError(KvplanError):
    """The user asked for something malformed or unknown."""

    exit_code = EXIT_USAGE


class SpecError(KvplanError):
    """A spec file (YAML or config.json) is missing, unreadable or invalid."""

    exit_code = EXIT_USAGE


class InfeasibleError(KvplanError):
    """Valid inputs, but the deployment cannot work; the message gives the numbers."""

    exit_code = EXIT_INFEASIBLE
