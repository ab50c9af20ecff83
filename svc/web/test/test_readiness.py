"""
Tests for L{svc.web.readiness}: checks, their verdicts, timeouts and the
two answers.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase

from svc.web.readiness import (
    DEFAULT_CHECK_TIMEOUT,
    Check,
    CheckResult,
    Readiness,
    ReadinessProbe,
)


class ReadinessTests(SynchronousTestCase):
    """The verdicts and their bodies."""

    def test_ready_body(self) -> None:
        """Every check ok: ready, 200 body with the checks."""
        readiness = Readiness({"database": "ok", "dataplane": "ok"})
        self.assertTrue(readiness.ready)
        self.assertEqual(
            readiness.body(), {"status": "ready", "checks": {"database": "ok", "dataplane": "ok"}}
        )

    def test_not_ready_answer(self) -> None:
        """A failing check: 503 temporarily_unavailable not_ready, with status and checks."""
        readiness = Readiness({"database": "ok", "agent_ca": "not_initialised"})
        self.assertFalse(readiness.ready)
        error = readiness.refusal()
        self.assertEqual(error.status, 503)
        self.assertEqual(
            error.body(),
            {
                "error": "temporarily_unavailable",
                "error_description": "not_ready",
                "status": "not_ready",
                "checks": {"database": "ok", "agent_ca": "not_initialised"},
            },
        )

    def test_advisory_checks_do_not_decide(self) -> None:
        """A failing advisory check is reported but the process is ready."""
        readiness = Readiness(
            {"database": "ok", "dataplane": "none_registered"}, frozenset({"dataplane"})
        )
        self.assertTrue(readiness.ready)
        self.assertEqual(readiness.body()["status"], "ready")
        self.assertFalse(Readiness({"database": "error"}, frozenset({"dataplane"})).ready)

    def test_no_checks_is_ready(self) -> None:
        """A process with nothing to check is ready."""
        self.assertTrue(Readiness({}).ready)


class ProbeTests(SynchronousTestCase):
    """L{ReadinessProbe} runs the checks."""

    def setUp(self) -> None:
        self.clock = Clock()

    def probe(self, *checks: Check) -> Readiness:
        result: Readiness = self.successResultOf(ReadinessProbe(checks, self.clock).probe())
        return result

    def test_plain_and_deferred_checks(self) -> None:
        """A check answers None (ok) or a reason, directly or through a Deferred."""
        readiness = self.probe(
            Check("a", lambda: None),
            Check("b", lambda: "storage_missing"),
            Check("c", lambda: succeed(None)),
        )
        self.assertEqual(readiness.checks, {"a": "ok", "b": "storage_missing", "c": "ok"})

    def test_coroutine_check(self) -> None:
        """An async check is awaited."""

        async def check() -> CheckResult:
            return "none_registered"

        self.assertEqual(self.probe(Check("d", check)).checks, {"d": "none_registered"})

    def test_raising_check_is_error_and_logged(self) -> None:
        """A check that raises fails with error; the exception is logged, not shown."""

        def broken() -> CheckResult:
            raise OSError("database password wrong for user svc")

        with capturedLogs() as events:
            readiness = self.probe(Check("database", broken))
        self.assertEqual(readiness.checks, {"database": "error"})
        self.assertTrue(any("password wrong" in str(e.get("error")) for e in events))

    def test_declared_failure_and_advisory(self) -> None:
        """A raising check fails with its declared code; advisory ones reach the verdict."""

        def down() -> CheckResult:
            raise ConnectionRefusedError()

        readiness = self.probe(
            Check("database", down, failure="unreachable"),
            Check("dataplane", lambda: "none_registered", gating=False),
        )
        self.assertEqual(
            (readiness.checks, readiness.advisory),
            ({"database": "unreachable", "dataplane": "none_registered"}, {"dataplane"}),
        )

    def test_hung_check_times_out(self) -> None:
        """A check that never answers fails with timeout after the bound."""
        never: Deferred[CheckResult] = Deferred()
        probing = ReadinessProbe([Check("database", lambda: never)], self.clock).probe()
        self.assertNoResult(probing)
        self.clock.advance(DEFAULT_CHECK_TIMEOUT)
        self.assertEqual(self.successResultOf(probing).checks, {"database": "timeout"})

    def test_changes_logged_once(self) -> None:
        """A verdict is logged when it changes, not at every probe."""
        state: dict[str, str | None] = {"verdict": "not_installed"}
        probe = ReadinessProbe([Check("credentials", lambda: state["verdict"])], self.clock)
        with capturedLogs() as events:
            probe.probe()
            probe.probe()
            state["verdict"] = None
            probe.probe()
            probe.probe()
        logged = [e["verdict"] for e in events if e.get("check") == "credentials"]
        self.assertEqual(logged, ["not_installed", "ok"])

    def test_names_unique(self) -> None:
        """Two checks of one name are refused."""
        self.assertRaises(
            ValueError,
            ReadinessProbe,
            [Check("a", lambda: None), Check("a", lambda: None)],
            self.clock,
        )
