"""
Tests for L{svc.audit.jsonl}: the exact text of a line.
"""

from __future__ import annotations

import json

from twisted.trial.unittest import SynchronousTestCase

from svc.audit.events import CallerProcess, CertFields, client_event, server_event
from svc.audit.jsonl import format_ts, render_line

CALLER = CallerProcess(command="cat", pid=7, uid=1000, gid=1000)


class FormatTimestampTests(SynchronousTestCase):
    """
    L{format_ts}: RFC 3339 UTC with milliseconds and C{Z}.
    """

    def test_epoch(self) -> None:
        """The epoch renders with three fractional digits and Z."""
        self.assertEqual(format_ts(0), "1970-01-01T00:00:00.000Z")

    def test_milliseconds_truncated(self) -> None:
        """Sub-millisecond parts are truncated, never rounded up."""
        self.assertEqual(format_ts(1_790_000_000.2509), "2026-09-21T14:13:20.250Z")
        self.assertEqual(format_ts(59.9999), "1970-01-01T00:00:59.999Z")


class RenderLineTests(SynchronousTestCase):
    """
    L{render_line}: one compact ASCII JSON object per line, fixed key order.
    """

    def test_exact_client_line(self) -> None:
        """A client read line is byte-for-byte the documented form."""
        event = client_event(
            "read", ts=1.5, path="/agent-1/a.txt", allowed=True, caller=CALLER, size=10, offset=0
        )
        self.assertEqual(
            render_line(event),
            '{"ts":"1970-01-01T00:00:01.500Z","event":"read","path":"/agent-1/a.txt",'
            '"allowed":true,"command":"cat","size":10,"offset":0,'
            '"agent_pid":7,"uid":1000,"gid":1000}\n',
        )

    def test_exact_server_line(self) -> None:
        """A server line puts identity after the envelope and extras last."""
        cert = CertFields("agent-1", "tenant-a", "ab", "CN=u")
        event = server_event(
            "manifest_put",
            ts=0,
            cert=cert,
            path="/agent-1/a",
            allowed=True,
            size=3,
            session_id="mount:00",
            version=2,
        )
        self.assertEqual(
            render_line(event),
            '{"ts":"1970-01-01T00:00:00.000Z","event":"manifest_put","path":"/agent-1/a",'
            '"allowed":true,"command":"svc-server","size":3,"offset":null,'
            '"agent_id":"agent-1","tenant_id":"tenant-a","cert_serial":"ab",'
            '"cert_subject":"CN=u","session_id":"mount:00","version":2}\n',
        )

    def test_one_line_ascii(self) -> None:
        """Newlines, non-ASCII and undecodable bytes in a path stay inside one ASCII line."""
        path = "/agent-1/caf\u00e9\n" + b"\xff".decode("utf-8", "surrogateescape")
        line = render_line(client_event("lookup", ts=0, path=path, allowed=True, caller=CALLER))
        self.assertTrue(line.endswith("\n"))
        self.assertEqual(line.count("\n"), 1)
        data = line.encode("ascii")
        self.assertEqual(json.loads(data)["path"], path)
