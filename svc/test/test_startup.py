"""
Tests for L{svc.startup}: a failed start is one line naming what to fix,
and the process ends promptly, even when the failure comes before C{twist}
runs the reactor.
"""

from __future__ import annotations

import errno
import io
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from twisted.application.twist._options import TwistOptions
from twisted.internet.defer import CancelledError
from twisted.internet.error import CannotListenError
from twisted.internet.testing import MemoryReactor, MemoryReactorClock
from twisted.logger import capturedLogs
from twisted.python import usage
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from svc import logs
from svc.config import ConfigError
from svc.control.tap import ControlPlaneService
from svc.control.tap import Options as ControlOptions
from svc.startup import (
    USAGE_STATUS,
    StartError,
    blame,
    describe,
    end_start,
    failure_line,
    refuse_start,
)


def raised_in(resource: str, error: BaseException, fix: str | None = None) -> BaseException:
    """What C{error} becomes when raised in a step blaming C{resource}."""
    try:
        with blame(resource, fix):
            raise error
    except BaseException as translated:
        return translated
    raise AssertionError("nothing raised")


class DescribeTests(SynchronousTestCase):
    """L{describe}, L{blame} and L{failure_line}."""

    def test_os_error_names_reason_and_file(self) -> None:
        """An OS error in a step names the step's variable, the reason, the file and the fix."""
        error = raised_in(
            "SVC_TENANTS_ROOT",
            PermissionError(errno.EACCES, "Permission denied", "/srv/tenants"),
            "make it writable",
        )
        assert isinstance(error, StartError)
        self.assertEqual(
            failure_line("svc-dataplane", error),
            "svc-dataplane failed to start: SVC_TENANTS_ROOT: Permission denied: /srv/tenants;"
            " make it writable",
        )

    def test_config_error_keeps_its_variable(self) -> None:
        """A ConfigError raised in a step names its own variable, not the step's."""
        error = raised_in("SVC_IDENTITY_PUBLIC_KEY_FILE", ConfigError("SVC_CA_KEK", "wrong key"))
        assert isinstance(error, StartError)
        self.assertEqual(str(error), "SVC_CA_KEK: wrong key")

    def test_cancellation_passes(self) -> None:
        """A cancelled start is not a failure to explain."""
        self.assertIsInstance(raised_in("X", CancelledError()), CancelledError)

    def test_port_in_use(self) -> None:
        """A port that cannot be bound says where and why."""
        error = CannotListenError("127.0.0.1", 8080, OSError(errno.EADDRINUSE, "in use"))
        self.assertEqual(describe(error), "cannot listen on 127.0.0.1:8080: in use")

    def test_anything_else_is_one_line(self) -> None:
        """Any other error is its type and message, on one line."""
        self.assertEqual(describe(RuntimeError("two\nlines")), "RuntimeError: two lines")
        self.assertEqual(describe(KeyError()), "KeyError")


class EndStartTests(SynchronousTestCase):
    """L{end_start}."""

    def test_before_the_reactor_runs(self) -> None:
        """A failure before the reactor runs stops it as soon as it runs; one line each."""
        reactor = MemoryReactor()
        stderr = io.StringIO()
        failure = Failure(StartError("SVC_X", "is wrong", "set it right"))
        with capturedLogs() as events:
            end_start(reactor, "svc-test", failure, stderr=stderr)
        self.assertFalse(reactor.hasStopped)
        reactor.run()
        self.assertFalse(reactor.running)
        self.assertEqual(len(reactor.triggers["after"]["shutdown"]), 1)
        line = "svc-test failed to start: SVC_X: is wrong; set it right"
        self.assertEqual(stderr.getvalue(), line + "\n")
        [event] = list(events)
        self.assertEqual(event["log_level"].name, "error")
        self.assertEqual(
            (event["resource"], event["problem"], event["fix"]),
            ("SVC_X", "is wrong", "set it right"),
        )
        self.assertEqual(logs.json_fields(event)["msg"], line)

    def test_exit_status_after_shutdown(self) -> None:
        """Once the reactor has shut down, the process exits with the status."""
        reactor = MemoryReactor()
        reactor.running = True
        ended: list[int] = []
        failure = Failure(ValueError("x"))
        end_start(reactor, "svc-test", failure, exit=ended.append, stderr=io.StringIO())
        self.assertTrue(reactor.hasStopped)
        [(finish, args, kwargs)] = reactor.triggers["after"]["shutdown"]
        finish(*args, **kwargs)
        self.assertEqual(ended, [1])
        self.flushLoggedErrors(ValueError)

    def test_control_plane_failing_inside_start_service(self) -> None:
        """
        svc-control failing inside startService (unreadable host JWT key, no
        database), before twist runs the reactor: it stops once the reactor
        runs instead of serving nothing forever.
        """
        environ = {
            "SVC_IDENTITY_AUDIENCE": "aud",
            "SVC_IDENTITY_PUBLIC_KEY_FILE": "/nonexistent/key.pem",
            "SVC_IDENTITY_TENANT_ALLOWLIST": "t1",
        }
        parsed = ControlOptions(environ)
        parsed.parseOptions(["--listen", "tcp:0"])
        reactor = MemoryReactorClock()
        self.patch(logs._Adopted, "target", None)
        service = ControlPlaneService(
            parsed["settings"], parsed["tap_settings"], parsed["listen"], [], reactor
        )
        stderr = io.StringIO()
        self.patch(sys, "__stderr__", stderr)
        with capturedLogs() as events:
            service.startService()
        reactor.run()
        self.assertFalse(reactor.running)
        self.assertEqual(len(reactor.triggers["after"]["shutdown"]), 1)
        [line] = stderr.getvalue().splitlines()
        self.assertIn("SVC_IDENTITY_PUBLIC_KEY_FILE: cannot read /nonexistent/key.pem", line)
        [event] = [e for e in events if e.get("svc_start_failed")]
        self.assertEqual(event["resource"], "SVC_IDENTITY_PUBLIC_KEY_FILE")


class RefuseStartTests(SynchronousTestCase):
    """L{refuse_start}, as the plugins' options use it."""

    def test_without_twist_a_usage_error(self) -> None:
        """Parsed by anything but twist, a refusal is a UsageError naming the variable."""
        options = usage.Options()
        error = self.assertRaises(
            usage.UsageError, refuse_start, options, "svc-x", ConfigError("SVC_Y", "bad")
        )
        self.assertEqual(str(error), "SVC_Y: bad")

    def test_under_twist_one_line_each_and_status_64(self) -> None:
        """Under twist: one JSON line in the log, the same one line on stderr, exit 64."""
        log_file = Path(self.mktemp())
        stderr = io.StringIO()
        self.patch(sys, "__stderr__", stderr)
        self.patch(os, "environ", {"SVC_MOUNT_PREFIX": "relative"})
        self.addCleanup(setattr, logs._Adopted, "target", None)
        options = TwistOptions()
        with self.assertRaises(SystemExit) as exited:
            options.parseOptions([f"--log-file={log_file}", "svc-control"])
        options["logFile"].close()
        self.assertEqual(exited.exception.code, USAGE_STATUS)
        [record] = [json.loads(line) for line in log_file.read_text().splitlines()]
        [line] = stderr.getvalue().splitlines()
        self.assertEqual(record["msg"], line)
        self.assertTrue(line.startswith("svc-control failed to start: SVC_MOUNT_PREFIX: "))
        self.assertEqual((record["level"], record["resource"]), ("error", "SVC_MOUNT_PREFIX"))

    def test_log_on_stderr_written_once(self) -> None:
        """When the log is the process's stderr, the line is written there once, as a log line."""
        reading, writing = socket.socketpair()
        self.addCleanup(reading.close)
        self.addCleanup(writing.close)
        saved = os.dup(2)
        self.addCleanup(os.close, saved)
        os.dup2(writing.fileno(), 2)
        self.addCleanup(os.dup2, saved, 2)
        out: Any = os.fdopen(os.dup(2), "w")
        self.addCleanup(out.close)
        self.patch(logs._Adopted, "target", logs.LogTarget(out, "json", logs.LEVELS["info"]))
        with self.assertRaises(SystemExit):
            refuse_start(_TwistChild(), "svc-x", ConfigError("SVC_Y", "bad"), stderr=out)
        out.flush()
        reading.settimeout(1)
        [line] = reading.recv(65536).decode().splitlines()
        self.assertEqual(json.loads(line)["msg"], "svc-x failed to start: SVC_Y: bad")


class _TwistChild(usage.Options):
    """Options with a parent, as twist's plugin options have."""

    def __init__(self) -> None:
        super().__init__()
        self.parent = usage.Options()
