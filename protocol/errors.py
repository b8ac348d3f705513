"""The small set of error types of orch and the exit code of each (DESIGN.md section 4).

Every command maps these to exit codes in one place; a message says what is wrong and what to do.
"""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1  # a package or the audit failed
EXIT_USAGE = 2
EXIT_REFUSED = 3  # protocol, manifest or hygiene refused, before any GPU time
EXIT_LOCK_TIMEOUT = 75
EXIT_INTERRUPTED = 130


class OrchError(Exception):
    """Base of every error that ends a command with a documented exit code and one clear line."""

    exit_code: int = EXIT_FAILED

    def __init__(self, message: str, document: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.document = document  # what `--json` prints for this error, beside ok/exit_code/error


class UsageError(OrchError):
    exit_code = EXIT_USAGE


class RefusedError(OrchError):
    """Protocol, manifest or hygiene refused (before any GPU time is spent)."""

    exit_code = EXIT_REFUSED


class FailedError(OrchError):
    """A package, the ledger or the audit failed."""

    exit_code = EXIT_FAILED


class LockTimeoutError(OrchError):
    exit_code = EXIT_LOCK_TIMEOUT


class InterruptedRunError(OrchError):
    exit_code = EXIT_INTERRUPTED


def os_error_line(err: OSError) -> str:
    """One line for an operating-system error (a full disk, a permission, a missing file) and what to do."""
    what = err.strerror or str(err) or type(err).__name__
    where = f": {err.filename}" if err.filename else ""
    return f"{what}{where}; free disk space or fix permissions and retry"
