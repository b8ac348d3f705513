"""protocol/errors.py: each error type carries the exit code of DESIGN.md section 4; an OS error is one line."""

from __future__ import annotations

import errno

import pytest

from protocol.errors import (
    FailedError,
    InterruptedRunError,
    LockTimeoutError,
    OrchError,
    RefusedError,
    UsageError,
    os_error_line,
)


@pytest.mark.parametrize(
    ("error", "code"),
    [(OrchError, 1), (FailedError, 1), (UsageError, 2), (RefusedError, 3), (LockTimeoutError, 75),
     (InterruptedRunError, 130)],
)  # fmt: skip
def test_each_error_type_has_its_documented_exit_code(error: type[OrchError], code: int) -> None:
    err = error("what is wrong; what to do", {"run_id": "r1"})
    assert (err.exit_code, err.message, str(err), err.document) == (
        code, "what is wrong; what to do", "what is wrong; what to do", {"run_id": "r1"})
    assert isinstance(err, OrchError) and error("x").document is None


def test_an_os_error_is_one_line_with_its_file_and_what_to_do() -> None:
    full = OSError(errno.ENOSPC, "No space left on device", "/data/run.json")
    assert os_error_line(full) == (
        "No space left on device: /data/run.json; free disk space or fix permissions and retry")
    assert os_error_line(PermissionError(errno.EACCES, "Permission denied")) == (
        "Permission denied; free disk space or fix permissions and retry")
    assert os_error_line(OSError()) == "OSError; free disk space or fix permissions and retry"
    assert os_error_line(OSError("disk gone")) == "disk gone; free disk space or fix permissions and retry"
