"""
Tests for L{svc.logs}: the process log's JSON and text lines, its level,
Twisted's per-connection chatter at debug, and how the plugins take over
C{twist}'s logging.
"""

from __future__ import annotations

import enum
import io
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from twisted.application.twist._options import TwistOptions
from twisted.internet.protocol import Factory
from twisted.logger import (
    ILogObserver,
    LogEvent,
    Logger,
    LogLevel,
    LogPublisher,
    capturedLogs,
    globalLogPublisher,
)
from twisted.python import log as legacy_log
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from svc import logs
from svc.config import ConfigError
from svc.logs import (
    LogSettings,
    ProcessLogObserver,
    current_target,
    text_line,
)


def lines_of(events: list[LogEvent], log_format: str = "json", level: str = "info") -> list[str]:
    """What a L{ProcessLogObserver} writes for C{events}, line by line."""
    out = io.StringIO()
    observer = ProcessLogObserver(out, log_format, logs.LEVELS[level])
    for event in events:
        observer(event)
    text = out.getvalue()
    assert text == "" or text.endswith("\n"), text
    return text.splitlines()


def logged(emit: Any) -> list[LogEvent]:
    """The events C{emit(logger)} logs (to no other observer)."""
    events: list[LogEvent] = []
    observer = cast(ILogObserver, events.append)
    emit(Logger(namespace="svc.test", observer=observer))
    return events


class Opaque:
    """A value JSON cannot hold, shown by its C{str}."""

    def __str__(self) -> str:
        return "opaque-thing"


class Unshowable:
    """A value whose C{str} fails."""

    def __str__(self) -> str:
        raise RuntimeError("no")


class Colour(enum.Enum):
    RED = "red"


class JsonLineTests(SynchronousTestCase):
    """L{json_line} and the JSON format of L{ProcessLogObserver}."""

    def test_plain_object_per_line(self) -> None:
        """ts, level, system, msg first, then the event's own fields; no 0x1E, no log_* keys."""
        events = logged(lambda log: log.info("hello {who}", who="world", count=3))
        [line] = lines_of(events)
        self.assertFalse(line.startswith("\x1e"))
        record = json.loads(line)
        self.assertEqual(list(record)[:4], ["ts", "level", "system", "msg"])
        self.assertEqual(
            {k: record[k] for k in ("level", "system", "msg", "who", "count")},
            {
                "level": "info",
                "system": "svc.test",
                "msg": "hello world",
                "who": "world",
                "count": 3,
            },
        )
        self.assertRegex(record["ts"], r"\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")
        self.assertEqual([k for k in record if k.startswith("log_")], [])

    def test_values_json_cannot_hold_are_strings(self) -> None:
        """Objects, sets, bytes, enums, dates and non-finite floats come out as plain values."""
        moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
        events = logged(
            lambda log: log.info(
                "values",
                thing=Opaque(),
                broken=Unshowable(),
                names={"a"},
                raw=b"\xffab",
                colour=Colour.RED,
                when=moment,
                ratio=float("nan"),
                nested={1: (Opaque(), None)},
            )
        )
        [line] = lines_of(events)
        self.assertNotIn("unpersistable", line)
        record = json.loads(line)
        self.assertEqual(
            {k: record[k] for k in ("thing", "names", "raw", "colour", "when", "ratio", "nested")},
            {
                "thing": "opaque-thing",
                "names": ["a"],
                "raw": "\\xffab",
                "colour": "red",
                "when": "2026-01-02T03:04:05+00:00",
                "ratio": "nan",
                "nested": {"1": ["opaque-thing", None]},
            },
        )
        self.assertIn("Unshowable", record["broken"])

    def test_failure_is_error_and_traceback(self) -> None:
        """A logged failure gives C{error} (type: message) and C{traceback}, still one line."""
        try:
            raise ValueError("bad\nvalue")
        except ValueError:
            failure = Failure()
        events = logged(lambda log: log.failure("it broke", failure))
        [line] = lines_of(events)
        record = json.loads(line)
        self.assertEqual(record["level"], "critical")
        self.assertEqual(record["error"], "ValueError: bad\nvalue")
        self.assertIn("Traceback", record["traceback"])
        self.assertIn("test_failure_is_error_and_traceback", record["traceback"])

    def test_line_breaks_and_bad_text_escaped(self) -> None:
        """Characters some readers split lines on, and lone surrogates, stay inside one line."""
        text = "a\u2028b\u2029c\x85d\x1ee\nf\udcffg"
        [line] = lines_of(logged(lambda log: log.warn("{text}", text=text)))
        self.assertEqual(len(line.splitlines()), 1)
        record = json.loads(line)
        self.assertEqual(record["msg"][:10], text[:10])
        line.encode("utf-8")

    def test_own_keys_not_overwritten(self) -> None:
        """A field named like a head key keeps its value under the name with '_' added."""
        [line] = lines_of(logged(lambda log: log.info("m", msg="field", system="x")))
        record = json.loads(line)
        self.assertEqual((record["msg"], record["msg_"]), ("m", "field"))
        self.assertEqual((record["system"], record["system_"]), ("svc.test", "x"))

    def test_legacy_event(self) -> None:
        """A twisted.python.log line is its text, without the legacy keys."""
        observed: list[LogEvent] = []
        observer = cast(ILogObserver, observed.append)
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        legacy_log.msg("Site starting on 8080")
        [line] = lines_of([e for e in observed if e.get("log_namespace") == "log_legacy"])
        record = json.loads(line)
        self.assertEqual(record["msg"], "Site starting on 8080")
        self.assertEqual([k for k in ("message", "isError", "time", "system_") if k in record], [])


class LevelTests(SynchronousTestCase):
    """The level filter and Twisted's per-connection chatter."""

    def test_below_the_level_dropped(self) -> None:
        """Only events at the observer's level or above are written."""
        events = logged(lambda log: [log.debug("d"), log.info("i"), log.warn("w")])
        self.assertEqual([json.loads(x)["msg"] for x in lines_of(events)], ["i", "w"])
        self.assertEqual(len(lines_of(events, level="debug")), 3)
        self.assertEqual(len(lines_of(events, level="warn")), 1)

    def test_factory_chatter_is_debug(self) -> None:
        """A factory starting and stopping (once per HTTP client connection) shows only at debug."""
        factory = Factory()
        with capturedLogs() as events:
            factory.doStart()
            factory.doStop()
        self.assertEqual(len(events), 2)
        self.assertEqual(lines_of(list(events)), [])
        self.assertEqual(lines_of(list(events), "text"), [])
        shown = lines_of(list(events), level="debug")
        self.assertEqual([json.loads(x)["level"] for x in shown], ["debug", "debug"])
        [text] = lines_of(list(events)[:1], "text", "debug")
        self.assertIn("#debug] Starting factory", text)

    def test_text_format(self) -> None:
        """The text format is Twisted's classic line."""
        [event] = logged(lambda log: log.warn("careful {x}", x=1))
        line = text_line(event)
        assert line is not None
        self.assertRegex(line, r"\A\S+ \[svc\.test#warn\] careful 1\Z")


class SettingsTests(SynchronousTestCase):
    """L{LogSettings.from_environ}."""

    def test_values(self) -> None:
        """Unset is twist's choice; set values are read case-insensitively."""
        self.assertEqual(LogSettings.from_environ({}), LogSettings(None, None))
        read = LogSettings.from_environ({"SVC_LOG_FORMAT": "JSON", "SVC_LOG_LEVEL": "Debug"})
        self.assertEqual(read, LogSettings("json", LogLevel.debug))

    def test_bad_values_named(self) -> None:
        """A bad format or level is a ConfigError naming its variable."""
        for variable in ("SVC_LOG_FORMAT", "SVC_LOG_LEVEL"):
            error = self.assertRaises(ConfigError, LogSettings.from_environ, {variable: "loud"})
            self.assertEqual(error.variable, variable)


class TwistTests(SynchronousTestCase):
    """
    The plugins' options take over twist's logging: parsed by twist's own
    options, in process.
    """

    def parse(self, argv: list[str], environ: dict[str, str]) -> tuple[TwistOptions, Path]:
        log_file = Path(self.mktemp())
        self.patch(os, "environ", {**environ, "PATH": os.environ.get("PATH", "")})
        self.addCleanup(setattr, logs._Adopted, "target", None)
        options = TwistOptions()
        options.parseOptions([f"--log-file={log_file}", *argv])
        self.addCleanup(options["logFile"].close)
        return options, log_file

    def write_through(self, options: TwistOptions, event: LogEvent) -> None:
        publisher = LogPublisher(options["fileLogObserverFactory"](options["logFile"]))
        publisher(event)

    def test_json_by_default_off_a_terminal(self) -> None:
        """With no setting, a log file that is no terminal gets svc's JSON lines."""
        options, log_file = self.parse(["svc-control", "--listen", "tcp:0"], {})
        [event] = logged(lambda log: log.info("hello"))
        self.write_through(options, event)
        record = json.loads(log_file.read_text())
        self.assertEqual(record["msg"], "hello")
        target = current_target()
        assert target is not None
        self.assertEqual((target.log_format, target.level), ("json", LogLevel.info))

    def test_variables_override_twist(self) -> None:
        """SVC_LOG_FORMAT and SVC_LOG_LEVEL win over twist's --log-format and --log-level."""
        options, log_file = self.parse(
            ["--log-format=json", "--log-level=error", "svc-control", "--listen", "tcp:0"],
            {"SVC_LOG_FORMAT": "text", "SVC_LOG_LEVEL": "debug"},
        )
        self.assertEqual(options["logLevel"], LogLevel.debug)
        [event] = logged(lambda log: log.debug("details"))
        self.write_through(options, event)
        self.assertIn("[svc.test#debug] details", log_file.read_text())
