"""Errors that end a command with one clear line and a documented exit code."""

from __future__ import annotations

# Exit codes (DESIGN.md "Contracts"): stable, documented in the README.
EXIT_OK = 0
EXIT_GATE_FAILED = 1
EXIT_USAGE = 2
EXIT_SCRIPT_FAILED = 3


class PerfdoctorError(Exception):
    """An error the user can act on. The CLI prints `message` as one line and exits `exit_code`."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(PerfdoctorError):
    """Unreadable or invalid input: a missing path, a corrupt or non-trace file (exit 2)."""


class RuleError(PerfdoctorError):
    """A rule file or a [tool.perfdoctor] setting that cannot be used (exit 2)."""
