"""One exception hierarchy, mapped to exit codes and one-line messages.

Every failure a user can cause or meet is a `PgscopeError`; the CLI prints its `str()` as a single
line (`pgscope: error: ...`) and exits with its `exit_code`. Anything else is a bug: it is
reported as one line too (exit 1), with the traceback only under `--debug`.

The table of exit codes is part of the user contract (documented in docs/exit-codes.md).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1  # a bug in pgscope: please report it
    USAGE = 2  # bad command-line arguments
    SPEC = 3  # invalid experiment spec, recipe or input file
    ENVIRONMENT = 4  # something this machine lacks (binaries, user, permissions)
    TARGET = 5  # the database server: unreachable, refused, failed
    REFUSED = 6  # a safety rule refused the request (e.g. writes without --allow-writes)
    RUN_FAILED = 7  # the run completed but some steps failed
    INTERRUPTED = 130  # SIGINT (Ctrl-C): measured rows are kept
    TERMINATED = 143  # SIGTERM: measured rows are kept


class PgscopeError(Exception):
    """Base class: a message for the user and the exit code that goes with it."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str) -> None:
        # Messages are printed on one line; a stray newline from a server error must not
        # break that promise.
        super().__init__(" ".join(message.split()))


class UsageError(PgscopeError):
    exit_code = ExitCode.USAGE


class SpecError(PgscopeError):
    """The experiment spec (a recipe, a TOML file or flags overriding it) is invalid."""

    exit_code = ExitCode.SPEC


class InputFileError(SpecError):
    """A file the user handed us (CSV, script, SQL) is missing or malformed."""


class EnvironmentProblem(PgscopeError):
    exit_code = ExitCode.ENVIRONMENT


class TargetError(PgscopeError):
    exit_code = ExitCode.TARGET


class RefusedError(PgscopeError):
    exit_code = ExitCode.REFUSED


class RunFailed(PgscopeError):
    exit_code = ExitCode.RUN_FAILED


class Interrupted(PgscopeError):
    """Raised in the main thread when SIGINT or SIGTERM arrives, so that teardown runs."""

    def __init__(self, signal_name: str, exit_code: ExitCode) -> None:
        super().__init__(f"interrupted by {signal_name}")
        self.signal_name = signal_name
        self.exit_code = exit_code
