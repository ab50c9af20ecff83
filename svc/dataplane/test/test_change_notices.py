"""
Tests for L{svc.dataplane.change_notices}: which paths a write changed, the
notice of an owner's revert, the policy filter and who is told.
"""

from __future__ import annotations

import attrs
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.change_notices import (
    CHANGING_OPS,
    AgentConnections,
    ChangeNotice,
    changed_paths,
    owner_revert_notice,
    readable_paths,
)
from svc.policy import PathPolicy
from svc.store.layout import TenantLocation
from svc.wire.commands import COMMANDS
from svc.wire.ops import REQUEST_OPS, Op
from svc.wire.test.test_contract import VALID, parse

ACME = TenantLocation("user-1", "tenant-a")
LABS = TenantLocation("user-1", "tenant-b")


@attrs.define
class Listening:
    """A connection as L{AgentConnections} sees it."""

    connection_id: str
    closing: bool = False


def notice(*paths: str, agent: str = "agent-1", source: str | None = "a") -> ChangeNotice:
    """A notice about C{paths} on C{agent}'s disk in ACME, made by C{source}."""
    return ChangeNotice(ACME, agent, paths, "mount:00", source)


class ChangedPathsTests(SynchronousTestCase):
    """L{changed_paths}: the paths each request op changes."""

    def paths(self, op: Op, **payload: object) -> tuple[str, ...]:
        return changed_paths(op, parse(op, {**VALID[op], **payload}))

    def test_announced_ops(self) -> None:
        """Every write but chunk_put is announced; nothing else is."""
        writes = {op for op, command in COMMANDS.items() if command.writes}
        self.assertEqual(CHANGING_OPS, writes - {Op.CHUNK_PUT})
        for op in REQUEST_OPS - CHANGING_OPS:
            self.assertEqual(changed_paths(op, parse(op, VALID[op])), (), op)

    def test_one_path(self) -> None:
        """A write naming one path changed that path."""
        for op in CHANGING_OPS - {Op.MANIFEST_RENAME, Op.LINK}:
            self.assertEqual(self.paths(op, path="/agent-1/x"), ("/agent-1/x",), op)

    def test_rename(self) -> None:
        """A rename changed its source and its target, once each."""
        rename = Op.MANIFEST_RENAME
        self.assertEqual(
            self.paths(rename, path="/agent-1/a", to_path="/agent-1/b"),
            ("/agent-1/a", "/agent-1/b"),
        )
        self.assertEqual(
            self.paths(rename, path="/agent-1/a", to_path="/agent-1/a"), ("/agent-1/a",)
        )

    def test_link(self) -> None:
        """A link changed both names: the new one, and the existing one's link count."""
        self.assertEqual(
            self.paths(Op.LINK, path="/agent-1/a", to_path="/agent-1/b"),
            ("/agent-1/a", "/agent-1/b"),
        )


class ChangeNoticeTests(SynchronousTestCase):
    """L{ChangeNotice} and L{owner_revert_notice}."""

    def test_push_payload(self) -> None:
        """The push carries the paths as an array and the session id, nil when absent."""
        self.assertEqual(
            notice("/agent-1/a", "/agent-1/b").push(),
            {"paths": ("/agent-1/a", "/agent-1/b"), "session_id": "mount:00"},
        )
        self.assertEqual(
            ChangeNotice(ACME, "agent-1", ("/agent-1/a",)).push(["/agent-1/z"]),
            {"paths": ("/agent-1/z",), "session_id": None},
        )

    def test_paths_required(self) -> None:
        """A notice names at least one path."""
        self.assertRaises(ValueError, ChangeNotice, ACME, "agent-1", ())

    def test_owner_revert(self) -> None:
        """An owner's revert is about the path's top-level agent, with no session or source."""
        self.assertEqual(
            owner_revert_notice(ACME, "/agent-2/d/f"),
            ChangeNotice(ACME, "agent-2", ("/agent-2/d/f",), None, None),
        )
        for path in ("/", "/agent-2", "agent-2/f", "//f"):
            self.assertRaises(ValueError, owner_revert_notice, ACME, path)


class ReadablePathsTests(SynchronousTestCase):
    """L{readable_paths}: what the agent's path policy lets it be told."""

    def test_no_policy(self) -> None:
        """Without a policy every path is told."""
        self.assertEqual(readable_paths(notice("/agent-1/a.key"), None), ("/agent-1/a.key",))

    def test_hidden_paths_dropped(self) -> None:
        """Paths the policy hides are dropped; the disk root is always told."""
        policy = PathPolicy(deny=("*.key",))
        told = notice("/agent-1/a.key", "/agent-1/a.txt", "/agent-1")
        self.assertEqual(readable_paths(told, policy), ("/agent-1/a.txt", "/agent-1"))
        self.assertEqual(readable_paths(notice("/agent-1/a.key"), policy), ())

    def test_readonly_still_told(self) -> None:
        """A readonly agent may read, so it is told."""
        self.assertEqual(
            readable_paths(notice("/agent-1/a"), PathPolicy(readonly=True)), ("/agent-1/a",)
        )


class AgentConnectionsTests(SynchronousTestCase):
    """L{AgentConnections}: who is told of a notice."""

    def setUp(self) -> None:
        self.connections: AgentConnections[Listening] = AgentConnections()
        self.a, self.b, self.c = Listening("a"), Listening("b"), Listening("c")
        for connection in (self.a, self.b, self.c):
            self.connections.add(ACME, "agent-1", connection)

    def test_other_connections_of_the_agent(self) -> None:
        """Every connection of the agent but the writer's is told."""
        self.assertEqual(self.connections.audience(notice("/agent-1/f")), [self.b, self.c])

    def test_owner_change_tells_all(self) -> None:
        """A change with no source connection is told to every connection of the agent."""
        owner = owner_revert_notice(ACME, "/agent-1/f")
        self.assertEqual(self.connections.audience(owner), [self.a, self.b, self.c])

    def test_other_agents_and_tenants_never_told(self) -> None:
        """Another agent of the tenant, and the same agent id in another tenant, are not told."""
        other_agent, other_tenant = Listening("d"), Listening("e")
        self.connections.add(ACME, "agent-2", other_agent)
        self.connections.add(LABS, "agent-1", other_tenant)
        self.assertEqual(self.connections.audience(notice("/agent-1/f")), [self.b, self.c])
        self.assertEqual(
            self.connections.audience(notice("/agent-2/f", agent="agent-2")), [other_agent]
        )
        self.assertEqual(self.connections.audience(notice("/agent-3/f", agent="agent-3")), [])

    def test_closing_and_dismissed_skipped(self) -> None:
        """A closing connection, or one being disconnected, is not told."""
        self.b.closing = True
        self.assertEqual(
            self.connections.audience(notice("/agent-1/f", source=None), dismissed={"c"}),
            [self.a],
        )

    def test_discard(self) -> None:
        """A discarded connection is told nothing; the agent's entry goes with its last one."""
        for connection_id in ("a", "b", "unknown"):
            self.connections.discard(connection_id)
        self.assertEqual(self.connections.audience(notice("/agent-1/f")), [self.c])
        self.connections.discard("c")
        self.assertEqual((len(self.connections), self.connections.count(ACME, "agent-1")), (0, 0))
        self.assertEqual(self.connections.audience(notice("/agent-1/f", source=None)), [])

    def test_add_again_moves(self) -> None:
        """Adding a tracked connection id again replaces its entry."""
        self.connections.add(LABS, "agent-1", self.a)
        self.assertEqual(self.connections.count(ACME, "agent-1"), 2)
        self.assertEqual(self.connections.count(LABS, "agent-1"), 1)
        self.assertEqual(len(self.connections), 3)
