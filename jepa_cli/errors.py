"""Errors that end a command with one line on stderr instead of a traceback.

Library code raises these; the CLI turns them into `jepa: error: ...` and the exit code.
"""


class JepaError(Exception):
    """A failure while running (exit code 1)."""

    exit_code = 1


class InputError(JepaError):
    """Bad usage or bad input: a missing file, a wrong shape, an inconsistent option (exit code 2)."""

    exit_code = 2
