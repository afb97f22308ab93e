"""The `pgscope` command line: arguments -> spec -> runner/analysis -> renderer.

Kept thin: each command module parses its flags, calls one function elsewhere and renders.
Every error reaches the user as one line (`pgscope: error: ...`) with a documented exit code
(docs/exit-codes.md); `--debug` adds the traceback.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import signal
import sys
import traceback

from pgscope.cli.title import hide_password

hide_password()  # first: before the (slow) rest of pgscope is imported

import typer  # noqa: E402

from pgscope.cli.app import app  # noqa: E402
from pgscope.errors import ExitCode, PgscopeError  # noqa: E402
from pgscope.signals import received, signals_as_exceptions  # noqa: E402
from pgscope.words import inert  # noqa: E402

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "app":
        importlib.import_module(f"{__name__}.{_module.name}")


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _say(line: str) -> None:
    """An error line on stderr: inert, since it may quote the server (its messages, names)."""
    sys.stderr.write(inert(line) + "\n")


def _stdout_to_devnull() -> None:
    """The reader of stdout has gone (`pgscope report RUN | head -1`): as `git log | head`
    does, that ends the command quietly. Later writes, and Python's flush at exit, go nowhere
    instead of raising again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _caused_by_closed_pipe(exc: BaseException) -> bool:
    cause = exc.__context__
    while cause is not None:
        if isinstance(cause, BrokenPipeError):
            return True
        cause = cause.__context__
    return False


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    command = typer.main.get_command(app)
    try:
        with signals_as_exceptions():
            result = command.main(args=args, prog_name="pgscope", standalone_mode=False)
        return int(result) if isinstance(result, int) else 0
    except PgscopeError as exc:
        if debug:
            traceback.print_exc()
        notes = "; ".join(getattr(exc, "__notes__", []))
        _say(f"pgscope: error: {exc}{'; ' + notes if notes else ''}")
        return int(exc.exit_code)
    except BrokenPipeError:
        _stdout_to_devnull()
        return int(ExitCode.OK)
    except SystemExit as exc:
        # typer (click) and rich turn a closed pipe into exit 1, raised while handling it.
        if not _caused_by_closed_pipe(exc):
            raise
        _stdout_to_devnull()
        return int(ExitCode.OK)
    except KeyboardInterrupt:
        _say("pgscope: error: interrupted")
        return int(ExitCode.INTERRUPTED)
    except Exception as exc:
        # Click's usage errors (vendored by typer) carry exit_code and format_message().
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            ctx = getattr(exc, "ctx", None)
            where = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
            _say(f"pgscope: error: {_one_line(exc.format_message())}{where}")
            return int(ExitCode.USAGE)
        if debug:
            traceback.print_exc()
        signalled = received()
        if signalled is not None:  # a library replaced our exception by its own: a Ctrl-C
            _say(f"pgscope: error: {signalled} (during {type(exc).__name__})")
            return int(signalled.exit_code)
        _say(
            f"pgscope: error: internal error: {type(exc).__name__}: "
            f"{_one_line(str(exc))} (rerun with --debug for the traceback, and "
            f"please report it)"
        )
        return int(ExitCode.INTERNAL)


def entry() -> None:
    """Console-script entry point: exit with main()'s code."""
    code = main()
    # Done, and said so. A Ctrl-C now would land in the interpreter's shutdown, cut the
    # buffered output short and exit 130 without a word: let it wait for the exit instead.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
    sys.stderr.flush()
    sys.exit(code)
