"""Errors of kbpctl and its backends, each with the exit code the CLI returns for it.

Exit codes (documented in docs/kbpctl.md):

====  =====================================================================
0     success (also: ``disable`` of something that is not enabled)
1     an operation failed while changing the system (it was rolled back)
2     invalid input: unknown device or netns, bad CPU list, bad priority,
      conflicting options, device without NAPI, bad config file
69    unavailable: the kernel lacks a needed feature, or the module is absent
77    permission denied: the command changes the system and needs root
====  =====================================================================

Every message is one line and says what to do about it.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69  # sysexits.h EX_UNAVAILABLE
EXIT_NOPERM = 77  # sysexits.h EX_NOPERM


class KbpctlError(Exception):
    """A refusal or failure with a one-line, actionable message."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidInput(KbpctlError):
    exit_code = EXIT_USAGE


class Unavailable(KbpctlError):
    exit_code = EXIT_UNAVAILABLE


class NotRoot(KbpctlError):
    exit_code = EXIT_NOPERM


class OperationFailed(KbpctlError):
    exit_code = EXIT_FAILED
