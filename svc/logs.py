"""
The process log of C{twist svc-control}, C{twist svc-dataplane} and
C{twist svc-mount}: its format, its level, and the per-connection lines kept
at debug.

C{twist} starts logging itself, after the plugin's options are parsed and
its service started; each plugin's options call L{adopt_twist_logging},
which sets the observer C{twist} will install to L{ProcessLogObserver}:

  - C{SVC_LOG_FORMAT} C{json} writes one plain JSON object per line
    (L{json_line}: C{ts}, C{level}, C{system}, C{msg}, then the event's own
    fields), C{text} Twisted's classic text lines. Unset: C{twist}'s
    C{--log-format}, whose own default is C{text} when the log file is a
    terminal and C{json} otherwise.
  - C{SVC_LOG_LEVEL} (C{debug}, C{info}, C{warn}, C{error}, C{critical})
    is the least level written; unset, C{twist}'s C{--log-level} (C{info}).
  - Per-connection chatter Twisted logs at info (a client or server factory
    starting and stopping, once per HTTP connection) is written at debug
    (L{CHATTER_FORMATS}); svc's own per-connection lines log at debug.

Every line is flushed as it is written. The format is specified in
C{docs/configuration.md} ("Logging").
"""

from __future__ import annotations

import enum
import json
import math
import os
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import IO, Any, cast

import attrs
from twisted.logger import (
    ILogObserver,
    LogEvent,
    LogLevel,
    formatEvent,
    formatEventAsClassicLogText,
)
from twisted.python import usage
from zope.interface import implementer  # type: ignore[import-untyped]

from svc.config import ConfigError, env_optional

FORMATS = ("json", "text")
LEVELS: dict[str, LogLevel] = {level.name: level for level in LogLevel.iterconstants()}
_ORDER = {level: rank for rank, level in enumerate(LogLevel.iterconstants())}

CHATTER_FORMATS = frozenset(
    {
        # twisted.internet.protocol.Factory.doStart/doStop: every HTTP client
        # connection (treq) starts and stops a factory of its own.
        "Starting factory {factory!r}",
        "Stopping factory {factory!r}",
    }
)
"""Formats of Twisted's own per-connection lines, written at debug."""

HEAD_KEYS = ("ts", "level", "system", "msg")
"""The keys every JSON line starts with."""

_LEGACY_KEYS = frozenset({"message", "time", "system", "isError", "format", "why", "failure"})
_MAX_DEPTH = 4


@attrs.frozen
class LogSettings:
    """C{SVC_LOG_FORMAT} and C{SVC_LOG_LEVEL} (L{None}: C{twist}'s choice)."""

    format: str | None = None
    level: LogLevel | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> LogSettings:
        """
        Read and check the variables.

        @raise ConfigError: naming the variable at fault.
        """
        raw_format = env_optional(environ, "SVC_LOG_FORMAT")
        log_format = None if raw_format is None else raw_format.strip().lower()
        if log_format is not None and log_format not in FORMATS:
            raise ConfigError("SVC_LOG_FORMAT", f"must be json or text, got {raw_format!r}")
        raw_level = env_optional(environ, "SVC_LOG_LEVEL")
        level = None
        if raw_level is not None:
            level = LEVELS.get(raw_level.strip().lower())
            if level is None:
                raise ConfigError(
                    "SVC_LOG_LEVEL", f"must be one of {', '.join(LEVELS)}, got {raw_level!r}"
                )
        return cls(log_format, level)


def is_chatter(event: LogEvent) -> bool:
    """Whether C{event} is Twisted's per-connection chatter (L{CHATTER_FORMATS})."""
    return event.get("log_format") in CHATTER_FORMATS


def level_of(event: LogEvent) -> LogLevel:
    """The level C{event} is written at: its own, or debug for chatter."""
    if is_chatter(event):
        return cast(LogLevel, LogLevel.debug)
    level = event.get("log_level")
    return cast(LogLevel, level if level in _ORDER else LogLevel.info)


def plain(value: object, depth: int = 0) -> object:
    """
    C{value} as JSON can hold it: JSON's own types as they are (a float
    that is not finite as its text), bytes decoded, containers item by
    item, anything else as its C{str()}.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, enum.Enum):
        return plain(value.value, depth + 1) if depth < _MAX_DEPTH else str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if depth < _MAX_DEPTH:
        if isinstance(value, Mapping):
            return {str(k): plain(v, depth + 1) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [plain(v, depth + 1) for v in value]
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__} that cannot be shown>"


def timestamp(seconds: float | None) -> str:
    """RFC 3339 UTC with milliseconds, as the audit log writes C{ts}."""
    moment = datetime.fromtimestamp(seconds if seconds is not None else 0.0, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def json_fields(event: LogEvent) -> dict[str, object]:
    """
    The object of C{event}'s JSON line: C{ts}, C{level}, C{system} (the
    logger's namespace), C{msg} (the formatted message), then, for a
    failure, C{error} (C{Type: message}) and C{traceback}, then every other
    field of the event that is not Twisted's own (C{log_*}); a field named
    like one of these gets a C{_} appended.
    """
    namespace = str(event.get("log_namespace", "-"))
    legacy = "isError" in event and "message" in event
    system = namespace
    if legacy and event.get("log_system") not in (None, "-"):
        system = str(event["log_system"])
    fields: dict[str, object] = {
        "ts": timestamp(event.get("log_time")),
        "level": level_of(event).name,
        "system": system,
        "msg": formatEvent(event),
    }
    failure = event.get("log_failure")
    if failure is None and legacy:
        failure = event.get("failure")
    if failure is not None:
        try:
            fields["error"] = f"{failure.type.__qualname__}: {failure.getErrorMessage()}"
            fields["traceback"] = failure.getTraceback()
        except Exception:
            fields["error"] = plain(failure)
    for key, value in event.items():
        if key.startswith("log_") or (legacy and key in _LEGACY_KEYS):
            continue
        name = key
        while name in fields:
            name += "_"
        fields[name] = plain(value)
    return fields


def json_line(event: LogEvent) -> str:
    """C{event} as one line of JSON (no newline in it, none at its end)."""
    text = json.dumps(json_fields(event), ensure_ascii=False, separators=(",", ":"))
    # Characters some readers take for line ends, and lone surrogates
    # (undecodable file names), as JSON escapes.
    for character, escape in (("\u2028", "\\u2028"), ("\u2029", "\\u2029"), ("\x85", "\\u0085")):
        text = text.replace(character, escape)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def text_line(event: LogEvent) -> str | None:
    """C{event} as Twisted's classic text (without its final newline)."""
    level = level_of(event)
    if level is not event.get("log_level"):
        event = {**event, "log_level": level}
    text = formatEventAsClassicLogText(event)
    return None if text is None else text.rstrip("\n")


@implementer(ILogObserver)
class ProcessLogObserver:
    """
    Writes the events at C{level} or above (chatter counting as debug) to
    C{out} in C{log_format}, one flushed line each.
    """

    def __init__(self, out: IO[str], log_format: str, level: LogLevel) -> None:
        if log_format not in FORMATS:
            raise ValueError(f"unknown log format {log_format!r}")
        self.out = out
        self.log_format = log_format
        self.level = level
        self._lock = threading.Lock()

    def __call__(self, event: LogEvent) -> None:
        if _ORDER[level_of(event)] < _ORDER[self.level]:
            return
        line = json_line(event) if self.log_format == "json" else text_line(event)
        if line is None:
            return
        with self._lock:
            self.out.write(line + "\n")
            self.out.flush()


@attrs.frozen
class LogTarget:
    """Where and how this process logs (set by L{adopt_twist_logging})."""

    out: IO[str]
    log_format: str
    level: LogLevel

    def observer(self) -> ProcessLogObserver:
        """A new observer writing to this target."""
        return ProcessLogObserver(self.out, self.log_format, self.level)

    def is_stderr(self) -> bool:
        """Whether the log goes to the same file as the process's stderr."""
        try:
            log, err = os.fstat(self.out.fileno()), os.fstat(2)
        except (OSError, ValueError, AttributeError):
            return False
        return (log.st_dev, log.st_ino) == (err.st_dev, err.st_ino)


class _Adopted:
    """The process's log target, once L{adopt_twist_logging} chose it."""

    target: LogTarget | None = None


def current_target() -> LogTarget | None:
    """The target chosen by L{adopt_twist_logging}, if it ran in this process."""
    return _Adopted.target


def adopt_twist_logging(options: usage.Options, environ: Mapping[str, str]) -> None:
    """
    Make C{twist} log through L{ProcessLogObserver}: called first thing by
    each plugin's C{postOptions}. C{options.parent} is C{twist}'s own
    options (nothing happens without one: not run by C{twist}); its
    C{fileLogObserverFactory} and C{logLevel} are replaced.

    @raise ConfigError: C{SVC_LOG_FORMAT} or C{SVC_LOG_LEVEL} is bad (the
        target is set from C{twist}'s options first, so the refusal can be
        logged).
    """
    parent: Any = options.parent
    if parent is None or "logFile" not in parent:
        return
    twist_format = parent.get("logFormat", "json")
    twist_level = parent.get("logLevel", LogLevel.info)
    _Adopted.target = LogTarget(parent["logFile"], twist_format, twist_level)
    settings = LogSettings.from_environ(environ)
    target = _Adopted.target = LogTarget(
        parent["logFile"], settings.format or twist_format, settings.level or twist_level
    )
    parent["logFormat"] = target.log_format
    parent["logLevel"] = target.level
    parent["fileLogObserverFactory"] = lambda out: ProcessLogObserver(
        out, target.log_format, target.level
    )
