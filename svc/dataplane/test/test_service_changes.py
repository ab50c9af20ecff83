"""
The C{changed} push of L{svc.dataplane.service.DataPlaneService}: a
committed write is told to the agent's other live connections, and an
owner's revert through C{POST /control/journal/revert} to all of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import IResource

from svc.dataplane.change_notices import ChangeNotice, owner_revert_notice
from svc.dataplane.http import DataPlaneHttp
from svc.dataplane.interfaces import OpReply
from svc.dataplane.service import DENIED_GOAWAY_REASON
from svc.dataplane.test.test_service_support import (
    RecordingSink,
    ServiceFixture,
    blob,
    identity,
)
from svc.pki.identity import DenyList
from svc.policy import PathPolicy
from svc.store.layout import TenantLocation
from svc.testing.pki import shared_test_pki
from svc.testing.web import Answer, request
from svc.testing.worker import ImmediateWorker, ManualWorker
from svc.wire.errno import WireErrno

LOCATION = TenantLocation("user-1", "tenant-a")


def changed(*paths: str, session_id: str | None = None) -> tuple[str, dict[str, object]]:
    """The push a sink records for a change of C{paths}."""
    return ("changed", {"paths": list(paths), "session_id": session_id})


class ExplodingSink(RecordingSink):
    """A sink whose pushes fail (a bug in a connection's adapter)."""

    def push(self, op: str, payload: Mapping[str, object]) -> None:
        raise RuntimeError("push failed")


class WritePushTests(SynchronousTestCase):
    """A write on one connection of an agent is pushed to its other connections."""

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.addCleanup(self.fixture.close)
        self.a = self.fixture.agent()
        self.b = self.fixture.agent()

    def test_other_connection_told(self) -> None:
        """A write on A reaches B with its path and session id, and A is not told."""
        session = self.fixture.session(self.a.identity, 1)
        self.a.put_file("f", b"data", session_id=session)
        self.assertEqual(self.b.sink.pushes, [changed("/agent-1/f", session_id=session)])
        self.assertEqual(self.a.sink.pushes, [])

    def test_every_write_op(self) -> None:
        """Each write op pushes the paths it changed; a session-less write has nil session."""
        a, root = self.a, "/agent-1"
        a.put_file("f", b"data")
        a.ok("dir_create", path=f"{root}/d", mode=0o755)
        a.ok("setattr", path=f"{root}/f", mode=0o600)
        a.ok("symlink", path=f"{root}/l", target="f")
        a.ok("mknod", path=f"{root}/p", kind="fifo", mode=0o600)
        a.ok("link", path=f"{root}/f", to_path=f"{root}/h")
        a.ok("manifest_rename", path=f"{root}/h", to_path=f"{root}/d/h")
        a.ok("manifest_delete", path=f"{root}/d/h")
        a.ok("dir_remove", path=f"{root}/d")
        seq = a.ok("journal_query", path=f"{root}/f", newest_first=True)["entries"][-1]["seq"]
        a.ok("journal_revert_path", path=f"{root}/f", seq=seq)
        self.assertEqual(
            self.b.sink.pushes,
            [
                changed(f"{root}/f"),
                changed(f"{root}/d"),
                changed(f"{root}/f"),
                changed(f"{root}/l"),
                changed(f"{root}/p"),
                changed(f"{root}/f", f"{root}/h"),
                changed(f"{root}/h", f"{root}/d/h"),
                changed(f"{root}/d/h"),
                changed(f"{root}/d"),
                changed(f"{root}/f"),
            ],
        )
        self.assertEqual(self.a.sink.pushes, [])

    def test_reads_and_chunks_push_nothing(self) -> None:
        """chunk_put and the reads change no path: nothing is pushed."""
        chunk_hash, data = blob("bytes")
        self.a.ok("chunk_put", data, hash=chunk_hash)
        self.a.ok("list", path="/agent-1")
        self.a.ok("head_file", path="/agent-1")
        self.a.ok("journal_query")
        self.a.ok("lease_grant", path="/agent-1", mode="read")
        self.assertEqual(self.b.sink.pushes, [])

    def test_other_agents_and_tenants_not_told(self) -> None:
        """Another agent of the tenant, the same agent id in another tenant or owner: not told."""
        others = [
            self.fixture.agent(identity(agent="agent-2")),
            self.fixture.agent(identity(tenant="tenant-b")),
            self.fixture.agent(identity(user="user-2")),
        ]
        for other in others:
            other.ok("head_file", path=other.root)
        self.a.put_file("f", b"data")
        self.assertEqual([other.sink.pushes for other in others], [[], [], []])
        self.assertEqual(self.b.sink.pushes, [changed("/agent-1/f")])

    def test_failed_writes_push_nothing(self) -> None:
        """ESTALE, EACCES (confinement, policy), EPERM (session), ENOENT, EPROTO: no push."""
        self.a.put_file("f", b"data")
        self.b.sink.pushes.clear()
        self.fixture.policies[("tenant-a", "agent-1")] = PathPolicy(deny=("*.key",))
        forged = self.fixture.session(identity(agent="agent-2"), 1)
        stale: dict[str, Any] = {
            "path": "/agent-1/f",
            "expected_version": 7,
            "chunks": [],
            "size": 0,
            "mode": 0o644,
            "mtime_ns": 1,
        }
        failures = [
            (WireErrno.ESTALE, lambda: self.a.errno("manifest_put", **stale)),
            (WireErrno.EACCES, lambda: self.a.errno("dir_create", path="/agent-2/d", mode=0o755)),
            (WireErrno.EACCES, lambda: self.a.errno("dir_create", path="/agent-1/k.key", mode=1)),
            (
                WireErrno.EPERM,
                lambda: self.a.errno(
                    "dir_create", path="/agent-1/d", mode=0o755, session_id=forged
                ),
            ),
            (WireErrno.ENOENT, lambda: self.a.errno("manifest_delete", path="/agent-1/gone")),
            (WireErrno.EPROTO, lambda: self.a.errno("dir_create", path="/agent-1/d")),
        ]
        for expected, attempt in failures:
            self.assertEqual(attempt(), expected)
        self.assertEqual(self.b.sink.pushes, [])

    def test_closed_connection_skipped(self) -> None:
        """A closed connection is not told and the write still succeeds; others are told."""
        c = self.fixture.agent()
        self.successResultOf(self.b.connection.closed("client_close"))
        self.a.put_file("f", b"data")
        self.assertEqual((self.b.sink.pushes, c.sink.pushes), ([], [changed("/agent-1/f")]))

    def test_failing_push_skipped(self) -> None:
        """A push that fails is logged; the write succeeds and the others are still told."""
        self.fixture.service.connect(identity(), "exploding", ExplodingSink())
        self.a.put_file("f", b"data")
        self.assertEqual(self.b.sink.pushes, [changed("/agent-1/f")])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_disconnected_connection_skipped(self) -> None:
        """A connection being disconnected (deny-listed) is told nothing more."""
        c = self.fixture.agent(identity(serial="c3"))
        self.fixture.service.set_deny_list(DenyList.of([("c3", identity().not_after)]))
        self.assertEqual(c.sink.disconnects, [DENIED_GOAWAY_REASON])
        self.a.put_file("f", b"data")
        self.assertEqual(self.b.sink.pushes, [changed("/agent-1/f")])
        self.assertEqual(c.sink.sent, ["credentials_revoked", "GOAWAY credentials_expired"])

    def test_policy_hidden_path_not_told(self) -> None:
        """A change of a path the agent's policy hides is not pushed at all."""
        self.fixture.policies[("tenant-a", "agent-1")] = PathPolicy(deny=("*.key",))
        self.fixture.service.announce(owner_revert_notice(LOCATION, "/agent-1/a.key"))
        self.fixture.service.announce(
            ChangeNotice(LOCATION, "agent-1", ("/agent-1/a.key", "/agent-1/a"))
        )
        self.assertEqual(self.b.sink.pushes, [changed("/agent-1/a")])

    def test_changed_request_refused(self) -> None:
        """changed sent as a request is ENOSYS and unaudited, like lease_revoke."""
        lines = len(self.fixture.audit)
        self.assertEqual(self.a.errno("changed", paths=["/agent-1"]), WireErrno.ENOSYS)
        self.assertEqual(self.a.errno("lease_revoke"), WireErrno.ENOSYS)
        self.assertEqual(len(self.fixture.audit), lines)
        self.assertEqual(self.b.sink.pushes, [])


class AnswerWatchingSink(RecordingSink):
    """Records, with each push, which of the writer's answers had been sent."""

    def __init__(self, answers: list[Deferred[OpReply]]) -> None:
        super().__init__()
        self.answers = answers
        self.answered: list[list[bool]] = []

    def push(self, op: str, payload: Mapping[str, object]) -> None:
        super().push(op, payload)
        self.answered.append([answer.called for answer in self.answers])


class PushOrderTests(SynchronousTestCase):
    """When a push is sent, relative to the commit and to the writer's answer."""

    def test_after_commit_before_answer(self) -> None:
        """Nothing is pushed before the commit; each push precedes its writer's answer."""
        database = ManualWorker()
        fixture = ServiceFixture(self, db_worker=database)
        a = fixture.agent()
        answers: list[Deferred[OpReply]] = []
        b = AnswerWatchingSink(answers)
        fixture.service.connect(identity(), "watching", b)
        answers.append(a.request("dir_create", path="/agent-1/d1", mode=0o755))
        answers.append(a.request("dir_create", path="/agent-1/d2", mode=0o755))
        self.assertEqual(b.pushes, [])
        database.run()
        self.assertEqual(b.pushes, [changed("/agent-1/d1"), changed("/agent-1/d2")])
        self.assertEqual(b.answered, [[False, False], [True, False]])
        for answer in answers:
            self.successResultOf(answer)
        closed = fixture.service.engine.close()
        database.run()
        self.successResultOf(closed)


class OwnerRevertPushTests(SynchronousTestCase):
    """C{POST /control/journal/revert} pushes to every connection of the agent."""

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.addCleanup(self.fixture.close)
        self.resource = self.app(self.fixture.service.announce)
        self.a, self.b = self.fixture.agent(), self.fixture.agent()
        self.other = self.fixture.agent(identity(agent="agent-2"))
        self.other.ok("head_file", path="/agent-2")
        self.a.put_file("f", b"one")
        self.second = self.a.put_file("f", b"two", expected_version=1)["journal_seq"]
        for agent in (self.a, self.b, self.other):
            agent.sink.pushes.clear()

    def app(self, announce: Callable[[ChangeNotice], object]) -> IResource:
        """The HTTP surface over the fixture's engine, called with the control certificate."""
        pki = shared_test_pki()
        chain = [pki.control.cert, pki.root.cert]
        http = DataPlaneHttp(
            engine=self.fixture.service.engine,
            registry=CollectorRegistry(),
            audit_log=Path(self.mktemp()),
            emit=lambda event: None,
            current_deny_list=DenyList,
            merge_deny_list=lambda deny_list: None,
            org_root=pki.root.cert,
            trust_domain=pki.trust_domain,
            now=self.fixture.clock.seconds,
            io=ImmediateWorker(),
            verified_chain=lambda _request: chain,
            clock=self.fixture.clock,
            announce=announce,
        )
        return http.resource()

    def revert(self, path: str, seq: int) -> Answer:
        body = {"owner": "user-1", "tenant": "tenant-a", "path": path, "seq": seq}
        data = json.dumps({**body, "user_id": "alice"}).encode()
        headers = {"Content-Type": "application/json"}
        return request(
            self, self.resource, "POST", "/control/journal/revert", headers=headers, body=data
        )

    def test_every_connection_told(self) -> None:
        """Every connection of the agent is told, with no session; other agents are not."""
        self.assertEqual(self.revert("/agent-1/f", self.second).status, 200)
        for agent in (self.a, self.b):
            self.assertEqual(agent.sink.pushes, [changed("/agent-1/f")])
        self.assertEqual(self.other.sink.pushes, [])

    def test_failed_revert_not_told(self) -> None:
        """A refused revert (no such row) pushes nothing."""
        self.assertEqual(self.revert("/agent-1/f", 999).status, 404)
        self.assertEqual((self.a.sink.pushes, self.b.sink.pushes), ([], []))

    def test_failing_announce_still_answered(self) -> None:
        """The revert has committed: a failure to announce it is logged, the answer is 200."""

        def announce(notice: ChangeNotice) -> None:
            raise RuntimeError("announce failed")

        self.resource = self.app(announce)
        self.assertEqual(self.revert("/agent-1/f", self.second).status, 200)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
