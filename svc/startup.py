"""
Failures at start, for the three C{twist} plugins: one line naming the
variable or resource at fault (and the fix, when there is one), on stderr
and in the log whatever its format, and a prompt exit with a non-zero
status. A process never stays alive half-started.

  - A bad variable or option (found while the options are parsed):
    L{refusing} around the plugin's C{postOptions} turns a L{ConfigError}
    into that line and exit status 64 (C{EX_USAGE}, as C{twist}'s own
    usage errors).
  - A failure while the service starts (a database that cannot be opened,
    a port in use, a key that does not decrypt): each step of the start
    runs under L{blame}, which turns any error into a L{StartError} naming
    the step's variable; L{end_start} then writes the line and ends the
    process with status 1, once the reactor has run its shutdown (even when
    the failure came before C{twist} started the reactor).

The line is C{<process> failed to start: <resource>: <problem>[; <fix>]}.
An error no step explains (a bug) keeps its type and message on that line;
its traceback is logged at debug.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any, NoReturn, cast

from twisted.internet.defer import CancelledError
from twisted.internet.error import CannotListenError, ReactorNotRunning
from twisted.logger import Logger, LogLevel
from twisted.python import usage
from twisted.python.failure import Failure

from svc.config import ConfigError
from svc.logs import adopt_twist_logging, current_target

USAGE_STATUS = 64
"""Exit status of a bad variable or option."""
FAILED_STATUS = 1
"""Exit status of a start that failed after the options were accepted."""

LISTEN_FIX = "choose a free port (or stop the process that holds it) and an address of this host"
"""The fix of a listener that could not open."""

_log = Logger(namespace="svc.startup")


class StartError(ConfigError):
    """
    The start failed because of C{resource} (a variable, an option, or a
    thing such as "the data plane at host:port"); C{fix} says what to do.
    """

    def __init__(self, resource: str, problem: str, fix: str | None = None) -> None:
        super().__init__(resource, problem)
        self.fix = fix

    def __str__(self) -> str:
        text = f"{self.variable}: {self.problem}"
        return f"{text}; {self.fix}" if self.fix else text


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _os_error_text(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        names = [str(name) for name in (error.filename, error.filename2) if name is not None]
        return f"{error.strerror}: {' -> '.join(names)}" if names else error.strerror
    return str(error) or type(error).__name__


def describe(error: BaseException) -> str:
    """One line saying what went wrong: the message of a L{ConfigError},
    an OS error's reason and file, C{Type: message} for anything else."""
    if isinstance(error, ConfigError):
        text = str(error)
    elif isinstance(error, CannotListenError):
        where = f"{error.interface or 'every interface'}:{error.port}"
        text = f"cannot listen on {where}: {_os_error_text(error.socketError)}"
    elif isinstance(error, OSError):
        text = _os_error_text(error)
    else:
        message = str(error)
        text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return _one_line(text)


@contextmanager
def blame(resource: str, fix: str | None = None) -> Iterator[None]:
    """
    Run a step of the start: an error in it becomes a L{StartError} naming
    C{resource} (a L{ConfigError} keeps the variable it names; a
    cancellation passes).
    """
    try:
        yield
    except (StartError, CancelledError):
        raise
    except ConfigError as error:
        raise StartError(error.variable, error.problem) from error
    except Exception as error:
        raise StartError(resource, describe(error), fix) from error


def failure_line(process: str, error: BaseException) -> str:
    """The one line of a failed start."""
    return f"{process} failed to start: {describe(error)}"


def _fields(error: BaseException) -> dict[str, object]:
    if isinstance(error, ConfigError):
        fields: dict[str, object] = {"resource": error.variable, "problem": error.problem}
        fix = getattr(error, "fix", None)
        if fix is not None:
            fields["fix"] = fix
        return fields
    return {}


def _escaped(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _say_on_stderr(line: str, stream: IO[str] | None) -> None:
    """
    C{line} on C{stream} (L{None}: the process's real stderr, which logging
    does not redirect), unless the log goes to that file already.
    """
    target = current_target()
    if target is not None and target.is_stderr():
        return
    stream = sys.__stderr__ if stream is None else stream
    if stream is not None:
        stream.write(line + "\n")
        stream.flush()


def _flush_all() -> None:
    target = current_target()
    streams = [sys.__stdout__, sys.__stderr__, None if target is None else target.out]
    for stream in streams:
        if stream is not None:
            try:
                stream.flush()
            except (OSError, ValueError):
                pass


def end_start(
    reactor: Any,
    process: str,
    failure: Failure,
    *,
    status: int = FAILED_STATUS,
    exit: Callable[[int], object] = os._exit,
    stderr: IO[str] | None = None,
) -> None:
    """
    The start of C{process} failed with C{failure}: log its line at error
    (with the resource, problem and fix as fields), write it on stderr,
    stop the reactor (at once, or as soon as it runs) and, after its
    shutdown, end the process with C{status}.
    """
    error = cast(BaseException, failure.value)
    line = failure_line(process, error)
    _log.error(_escaped(line), svc_start_failed=True, process=process, **_fields(error))
    if not isinstance(error, ConfigError):
        _log.failure("{process}: the error's traceback", failure, LogLevel.debug, process=process)
    _say_on_stderr(line, stderr)

    def finish() -> None:
        _flush_all()
        exit(status)

    reactor.addSystemEventTrigger("after", "shutdown", finish)
    if reactor.running:
        _stop(reactor)
    else:
        # Failed inside startService, which twist calls before it runs the
        # reactor: stopping now would do nothing and leave it running.
        reactor.callWhenRunning(_stop, reactor)


def _stop(reactor: Any) -> None:
    try:
        reactor.stop()
    except ReactorNotRunning:
        pass


def refuse_start(
    options: usage.Options,
    process: str,
    error: ConfigError,
    stderr: IO[str] | None = None,
) -> NoReturn:
    """
    Refuse to start for a bad variable or option: under C{twist}, its line
    in the log and on stderr, then exit status 64; parsed by anything else
    (a test), a L{usage.UsageError} with the message.
    """
    if options.parent is None:
        raise usage.UsageError(str(error))
    line = failure_line(process, error)
    target = current_target()
    if target is not None:
        target.observer()(
            {
                "log_format": _escaped(line),
                "log_level": LogLevel.error,
                "log_namespace": _log.namespace,
                "log_time": time.time(),
                "svc_start_failed": True,
                "process": process,
                **_fields(error),
            }
        )
    _say_on_stderr(line, stderr)
    raise SystemExit(USAGE_STATUS)


@contextmanager
def refusing(options: usage.Options, process: str, environ: Mapping[str, str]) -> Iterator[None]:
    """
    Around a plugin's C{postOptions}: take over C{twist}'s logging
    (L{adopt_twist_logging}), then refuse the start (L{refuse_start}) on a
    L{ConfigError}.
    """
    try:
        adopt_twist_logging(options, environ)
        yield
    except ConfigError as error:
        refuse_start(options, process, error)
