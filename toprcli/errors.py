"""Errors a user can cause.

Every command catches :class:`UserError` at the CLI boundary and prints its
message as one line (what is wrong, how to fix it), then exits with code 2.
Library code raises it for bad input; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""

    exit_code = 2


class OutputLocked(UserError):
    """Another process is writing the output: this command did nothing, and the output's log is the other's."""


class MadeOtherwise(UserError):
    """Partial work in an output that was made from other inputs or settings than this run's, so it cannot be resumed;
    ``where`` is that output (`topr iterate` says to remove it: its --out advice is for a command run alone)."""

    def __init__(self, message: str, where: object) -> None:
        super().__init__(message)
        self.where = where


RESUME_REFUSED = "was made with a different"  # how the trainer's refusal of its checkpoint reads (launch finds it in a child's error)
