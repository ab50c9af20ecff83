"""
Tests for L{svc.dataplane.service}: mount sessions (verification, fencing,
rebinds, persistence across restarts), path policy, the deny-list and the
expiry of live connections' certificates.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import attrs
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.admission import Lapse, Standing, expiry, standing
from svc.dataplane.service import DENIED_GOAWAY_REASON
from svc.dataplane.session_epochs import (
    SESSIONS_FILE,
    SessionFileError,
    parse_epochs,
    render_epochs,
)
from svc.dataplane.test.test_service_support import (
    Agent,
    ServiceFixture,
    admitted,
    blob,
    identity,
)
from svc.pki.identity import DenyList
from svc.policy import PathPolicy
from svc.store.layout import TenantLocation
from svc.wire.errno import WireErrno

ALICE = identity()


class SessionTests(SynchronousTestCase):
    """
    C{session_id} on writes: verified, fenced by epoch, counted, persisted.
    """

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.addCleanup(self.fixture.close)
        self.agent = self.fixture.agent()

    def forgeries(self, reason: str) -> float | None:
        return self.fixture.sample("svc_session_forgery_rejected_total", reason=reason)

    def test_valid_session(self) -> None:
        """A valid session is recorded as the writer and on the write's audit line."""
        session = self.fixture.session(ALICE, 1)
        self.agent.put_file("f", b"x", session_id=session)
        self.assertEqual(self.fixture.last().session_id, session)
        got = self.agent.ok("manifest_get", path="/agent-1/f")
        self.assertEqual(got["last_writer_session_id"], session)
        self.assertIsNone(self.fixture.last().session_id)
        self.assertEqual(self.fixture.sample("svc_session_rebind_total"), 0.0)

    def test_rejections(self) -> None:
        """Each kind of bad session is EPERM with its reason, counted, and audited without it."""
        cases = {
            "bad_format": "mount:abc",
            "bad_hex": "mount:" + "g" * 64,
            "unknown_or_wrong_holder": self.fixture.session(identity(agent="agent-2"), 1),
        }
        for reason, session in cases.items():
            error = self.agent.error(
                "dir_create", path="/agent-1/d", mode=0o755, session_id=session
            )
            self.assertEqual(
                (error.errno, dict(error.details)), (WireErrno.EPERM, {"reason": reason})
            )
            self.assertEqual(self.forgeries(reason), 1.0)
            line = self.fixture.last()
            self.assertEqual(
                (line.event, line.allowed, line.session_id), ("dir_create", False, None)
            )
        self.agent.ok(
            "dir_create", path="/agent-1/d", mode=0o755, session_id=self.fixture.session(ALICE, 5)
        )
        fenced = self.agent.error(
            "dir_remove", path="/agent-1/d", session_id=self.fixture.session(ALICE, 4)
        )
        self.assertEqual(dict(fenced.details), {"reason": "fenced"})
        self.assertEqual(self.forgeries("fenced"), 1.0)
        self.assertEqual(
            self.agent.errno("chunk_put", b"x", hash=blob("z")[0], session_id="mount:"),
            WireErrno.EPERM,
        )

    def test_writes_without_session(self) -> None:
        """Writes without a session are allowed and audited without session_id."""
        self.agent.put_file("f", b"x")
        self.assertIsNone(self.fixture.last().session_id)

    def test_rebind(self) -> None:
        """A known session first seen on a new connection is a rebind; a newer epoch is not."""
        session = self.fixture.session(ALICE, 3)
        self.agent.ok("dir_create", path="/agent-1/a", mode=0o755, session_id=session)
        self.agent.ok("dir_create", path="/agent-1/b", mode=0o755, session_id=session)
        self.assertEqual(self.fixture.sample("svc_session_rebind_total"), 0.0)
        again = self.fixture.agent()
        again.ok("dir_create", path="/agent-1/c", mode=0o755, session_id=session)
        again.ok("dir_create", path="/agent-1/d", mode=0o755, session_id=session)
        self.assertEqual(self.fixture.sample("svc_session_rebind_total"), 1.0)
        newer = self.fixture.agent()
        newer.ok(
            "dir_create", path="/agent-1/e", mode=0o755, session_id=self.fixture.session(ALICE, 4)
        )
        self.assertEqual(self.fixture.sample("svc_session_rebind_total"), 1.0)
        self.assertEqual(
            again.errno("dir_remove", path="/agent-1/a", session_id=session), WireErrno.EPERM
        )

    def test_agents_fenced_independently(self) -> None:
        """A newer epoch of one agent does not fence another agent."""
        bob = identity(agent="agent-2", serial="b2")
        self.agent.ok(
            "dir_create", path="/agent-1/a", mode=0o755, session_id=self.fixture.session(ALICE, 9)
        )
        other = self.fixture.agent(bob)
        other.ok(
            "dir_create", path="/agent-2/a", mode=0o755, session_id=self.fixture.session(bob, 1)
        )

    def test_fencing_survives_restart(self) -> None:
        """The newest epoch is kept in sessions.json, so a restarted server still fences."""
        self.agent.ok(
            "dir_create", path="/agent-1/a", mode=0o755, session_id=self.fixture.session(ALICE, 7)
        )
        saved = json.loads(
            (Path(self.fixture.root) / "user-1" / "tenant-a" / SESSIONS_FILE).read_text()
        )
        self.assertEqual(saved, {"version": 1, "agents": {"agent-1": 7}})
        self.fixture.close()
        restarted = ServiceFixture(self, self.fixture.root)
        self.addCleanup(restarted.close)
        agent = restarted.agent()
        stale = agent.error(
            "dir_create", path="/agent-1/b", mode=0o755, session_id=restarted.session(ALICE, 6)
        )
        self.assertEqual(dict(stale.details), {"reason": "fenced"})
        agent.ok(
            "dir_create", path="/agent-1/b", mode=0o755, session_id=restarted.session(ALICE, 7)
        )
        self.assertEqual(restarted.sample("svc_session_rebind_total"), 1.0)


class PolicyTests(SynchronousTestCase):
    """
    The server-side path policy: deny, allow and readonly.
    """

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.addCleanup(self.fixture.close)
        self.agent = self.fixture.agent()
        self.agent.put_file("secret.key", b"k")
        self.agent.ok("dir_create", path="/agent-1/docs", mode=0o755)
        self.agent.put_file("docs/a.md", b"a")
        self.agent.put_file("notes.txt", b"n")

    def names(self, path: str) -> list[str]:
        entries = self.agent.ok("list", path=path)["entries"]
        return [entry["name"] for entry in entries]

    def test_deny(self) -> None:
        """A denied path is EACCES under the op's own event, not counted as a confinement denial."""
        self.fixture.policies[("tenant-a", "agent-1")] = PathPolicy(deny=("*.key",))
        error = self.agent.error("manifest_get", path="/agent-1/secret.key")
        self.assertEqual((error.errno, dict(error.details)), (WireErrno.EACCES, {"reason": "deny"}))
        line = self.fixture.last()
        self.assertEqual(
            (line.event, line.path, line.allowed), ("manifest_get", "/agent-1/secret.key", False)
        )
        self.assertEqual(
            self.agent.errno("head_file", path="/agent-1/secret.key"), WireErrno.EACCES
        )
        self.assertEqual(self.fixture.last().event, "head_file")
        self.assertIsNone(self.fixture.sample("svc_agent_path_denied_total", op="manifest_get"))
        self.assertEqual(self.names("/agent-1"), ["docs", "notes.txt"])
        self.assertEqual(
            self.agent.errno("link", path="/agent-1/secret.key", to_path="/agent-1/public"),
            WireErrno.EACCES,
        )
        self.assertEqual(
            self.agent.errno(
                "manifest_rename", path="/agent-1/notes.txt", to_path="/agent-1/n.key"
            ),
            WireErrno.EACCES,
        )
        rows = self.agent.ok("journal_query")["entries"]
        self.assertNotIn("/agent-1/secret.key", [r["path"] for r in rows])

    def test_allow(self) -> None:
        """With allow set only matching paths are usable; directories on the way are traversable."""
        self.fixture.policies[("tenant-a", "agent-1")] = PathPolicy(allow=("docs/**",))
        self.assertEqual(self.names("/agent-1"), ["docs"])
        self.assertEqual(self.names("/agent-1/docs"), ["a.md"])
        self.assertEqual(self.agent.ok("head_file", path="/agent-1")["kind"], "dir")
        self.assertEqual(self.agent.errno("head_file", path="/agent-1/notes.txt"), WireErrno.EACCES)
        self.assertEqual(
            self.agent.errno("manifest_get", path="/agent-1/notes.txt"), WireErrno.EACCES
        )
        self.agent.put_file("docs/b.md", b"b")
        self.assertEqual(
            self.agent.errno("dir_create", path="/agent-1/src", mode=0o755), WireErrno.EACCES
        )

    def test_readonly(self) -> None:
        """Readonly refuses every write, chunk uploads included, and keeps reads."""
        self.fixture.policies[("tenant-a", "agent-1")] = PathPolicy(readonly=True)
        chunk_hash, data = blob("ro")
        error = self.agent.error("chunk_put", data, hash=chunk_hash)
        self.assertEqual(
            (error.errno, dict(error.details)), (WireErrno.EACCES, {"reason": "readonly"})
        )
        self.assertEqual(
            (self.fixture.last().event, self.fixture.last().allowed), ("chunk_put", False)
        )
        for op, payload in (
            ("manifest_delete", {"path": "/agent-1/notes.txt"}),
            ("setattr", {"path": "/agent-1/notes.txt", "mode": 0o600}),
            ("dir_create", {"path": "/agent-1/x", "mode": 0o755}),
            ("symlink", {"path": "/agent-1/l", "target": "x"}),
            ("journal_revert_path", {"path": "/agent-1/notes.txt", "seq": 2}),
        ):
            self.assertEqual(self.agent.errno(op, **payload), WireErrno.EACCES, op)
        self.assertEqual(self.agent.ok("manifest_get", path="/agent-1/notes.txt")["size"], 1)
        grant = self.agent.ok("lease_grant", path="/agent-1", mode="write")
        self.assertTrue(grant["granted"])


class FencePushTests(SynchronousTestCase):
    """
    When an agent's newest epoch rises, its other live connections are told
    (PUSH C{session_fenced}): a displaced mount stops writing at once.
    """

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.addCleanup(self.fixture.close)
        self.location = TenantLocation("user-1", "tenant-a")

    def fenced(self, agent: Agent) -> list[object]:
        return [p["epoch"] for op, p in agent.sink.pushes if op == "session_fenced"]

    def test_newer_session_tells_the_agents_other_connections(self) -> None:
        """
        A write with a newer session tells the agent's connections of older
        sessions or none; not its own, one as new, or another agent's.
        """
        old = self.fixture.agent()
        old.ok(
            "dir_create", path="/agent-1/a", mode=0o755, session_id=self.fixture.session(ALICE, 1)
        )
        quiet = self.fixture.agent()
        other = self.fixture.agent(identity(agent="agent-2", serial="b2"))
        new = self.fixture.agent()
        new.ok(
            "dir_create", path="/agent-1/b", mode=0o755, session_id=self.fixture.session(ALICE, 2)
        )
        same = self.fixture.agent()
        same.ok(
            "dir_create", path="/agent-1/c", mode=0o755, session_id=self.fixture.session(ALICE, 2)
        )
        self.assertEqual(
            [self.fenced(a) for a in (old, quiet, other, new, same)], [[2], [2], [], [], []]
        )
        self.assertEqual(
            old.errno("dir_remove", path="/agent-1/a", session_id=self.fixture.session(ALICE, 1)),
            WireErrno.EPERM,
        )

    def test_first_session_tells_nobody(self) -> None:
        """The first session ever seen for the agent fences nobody and tells nobody."""
        watcher = self.fixture.agent()
        writer = self.fixture.agent()
        writer.ok(
            "dir_create", path="/agent-1/a", mode=0o755, session_id=self.fixture.session(ALICE, 1)
        )
        self.assertEqual(self.fenced(watcher), [])

    def test_control_plane_fence(self) -> None:
        """
        fence_sessions fences older sessions before any newer one wrote: kept
        in sessions.json, the older session's writes refused, its
        connection told.
        """
        old = self.fixture.agent()
        old.ok(
            "dir_create", path="/agent-1/a", mode=0o755, session_id=self.fixture.session(ALICE, 3)
        )
        self.successResultOf(self.fixture.service.fence_sessions(self.location, "agent-1", 4))
        self.assertEqual(self.fenced(old), [4])
        saved = json.loads((self.fixture.root / "user-1" / "tenant-a" / SESSIONS_FILE).read_text())
        self.assertEqual(saved["agents"], {"agent-1": 4})
        refused = old.error(
            "dir_remove", path="/agent-1/a", session_id=self.fixture.session(ALICE, 3)
        )
        self.assertEqual(dict(refused.details), {"reason": "fenced"})
        # A late fence of an older epoch lowers nothing.
        self.successResultOf(self.fixture.service.fence_sessions(self.location, "agent-1", 2))
        self.assertEqual(
            json.loads((self.fixture.root / "user-1" / "tenant-a" / SESSIONS_FILE).read_text()),
            saved,
        )

    def test_fence_of_an_agent_never_seen_here(self) -> None:
        """A fence for an agent whose storage was never opened here is kept all the same."""
        self.successResultOf(
            self.fixture.service.fence_sessions(TenantLocation("user-9", "tenant-z"), "a9", 5)
        )
        saved = json.loads((self.fixture.root / "user-9" / "tenant-z" / SESSIONS_FILE).read_text())
        self.assertEqual(saved["agents"], {"a9": 5})


class DenyListTests(SynchronousTestCase):
    """
    C{set_deny_list}: the new list is kept and live connections it names are dropped.
    """

    def test_disconnects_named_serial_only(self) -> None:
        """Only the connection whose serial is denied gets GOAWAY credentials_expired."""
        fixture = ServiceFixture(self)
        self.addCleanup(fixture.close)
        alice = fixture.agent()
        bob = fixture.agent(identity(agent="agent-2", serial="b2"))
        self.assertEqual(len(fixture.service.deny_list), 0)
        denied = DenyList.of([("b2", identity().not_after)])
        fixture.service.set_deny_list(denied)
        self.assertIs(fixture.service.deny_list, denied)
        self.assertEqual(
            (alice.sink.disconnects, bob.sink.disconnects), ([], [DENIED_GOAWAY_REASON])
        )
        self.successResultOf(bob.connection.closed("revoked"))
        self.assertIsNone(fixture.service.connection(bob.connection.connection_id))
        fixture.service.set_deny_list(denied)
        self.assertEqual(bob.sink.disconnects, [DENIED_GOAWAY_REASON])

    def test_revoked_connection_told_before_goaway(self) -> None:
        """
        A connection whose serial is denied is pushed credentials_revoked
        (naming the serial) just before its GOAWAY, once.
        """
        fixture = ServiceFixture(self)
        self.addCleanup(fixture.close)
        bob = fixture.agent(identity(agent="agent-2", serial="b2"))
        denied = DenyList.of([("b2", identity().not_after)])
        fixture.service.set_deny_list(denied)
        fixture.service.set_deny_list(denied)
        self.assertEqual(bob.sink.sent, ["credentials_revoked", "GOAWAY credentials_expired"])
        self.assertEqual(bob.sink.pushes, [("credentials_revoked", {"serial": "b2"})])


class DeniedIntermediateTests(SynchronousTestCase):
    """
    A pushed deny-list naming the intermediate a live connection was
    admitted under closes it.
    """

    def test_disconnects_connections_under_a_denied_intermediate(self) -> None:
        """Only connections admitted under the denied intermediate get GOAWAY."""
        fixture = ServiceFixture(self)
        self.addCleanup(fixture.close)
        retired = fixture.agent(admitted(serial="a1", intermediate="1e"))
        current = fixture.agent(admitted(agent="agent-2", serial="a2", intermediate="2e"))
        fixture.service.set_deny_list(DenyList.of([("1e", identity().not_after)]))
        self.assertEqual(
            (retired.sink.disconnects, current.sink.disconnects), ([DENIED_GOAWAY_REASON], [])
        )
        self.assertEqual(retired.sink.pushes, [("credentials_revoked", {"serial": "1e"})])


class ExpiryTests(SynchronousTestCase):
    """
    Live connections end at their leaf's or intermediate's not-after, with
    no leeway: each connection has a timer on the service clock (and the
    deny-list check also drops expired connections).
    """

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.addCleanup(self.fixture.close)
        clock = self.fixture.clock
        clock.advance(math.ceil(clock.seconds()) - clock.seconds())
        self.now = clock.seconds()
        self.assertEqual(self.now, int(self.now))

    def at(self, seconds: float) -> datetime:
        """The moment C{seconds} after the test started."""
        return datetime.fromtimestamp(self.now + seconds, UTC)

    def test_leaf_expiry_disconnects_at_not_after(self) -> None:
        """A leaf expiring mid-connection gets GOAWAY exactly at its not-after, once."""
        fixture = self.fixture
        short = fixture.agent(admitted(serial="a1", not_after=self.at(90)))
        long = fixture.agent(admitted(agent="agent-2", serial="a2"))
        fixture.clock.advance(89.75)
        self.assertEqual(short.sink.disconnects, [])
        fixture.clock.advance(0.25)
        self.assertEqual(
            (short.sink.disconnects, long.sink.disconnects), ([DENIED_GOAWAY_REASON], [])
        )
        fixture.service.set_deny_list(DenyList())
        fixture.clock.advance(3600)
        self.assertEqual(short.sink.disconnects, [DENIED_GOAWAY_REASON])
        # An expired leaf may have been renewed: it is not told it is revoked.
        self.assertEqual(short.sink.sent, ["GOAWAY credentials_expired"])

    def test_intermediate_expiry_disconnects_at_its_not_after(self) -> None:
        """An intermediate expiring before the leaf ends the connection at its not-after."""
        fixture = self.fixture
        agent = fixture.agent(admitted(intermediate_not_after=self.at(30)))
        fixture.clock.advance(29.5)
        self.assertEqual(agent.sink.disconnects, [])
        fixture.clock.advance(0.5)
        self.assertEqual(agent.sink.disconnects, [DENIED_GOAWAY_REASON])

    def test_already_expired_at_connect(self) -> None:
        """A connection whose leaf expired before it was registered is disconnected at once."""
        fixture = self.fixture
        agent = fixture.agent(admitted(not_after=self.at(-1)))
        fixture.clock.advance(0)
        self.assertEqual(agent.sink.disconnects, [DENIED_GOAWAY_REASON])

    def test_expiry_is_checked_when_the_deny_list_is_replaced(self) -> None:
        """Installing a deny-list also drops connections whose leaf has expired."""
        fixture = self.fixture
        agent = fixture.agent(admitted(not_after=self.at(10)))
        fixture.clock.advance(11)
        self.assertEqual(agent.sink.disconnects, [DENIED_GOAWAY_REASON])
        fixture.service.set_deny_list(DenyList())
        self.assertEqual(agent.sink.disconnects, [DENIED_GOAWAY_REASON])

    def test_plain_identity_expiry(self) -> None:
        """A connection whose identity names no intermediate ends at its leaf's not-after."""
        fixture = self.fixture
        agent = fixture.agent(attrs.evolve(identity(), not_after=self.at(30)))
        fixture.clock.advance(30)
        self.assertEqual(agent.sink.disconnects, [DENIED_GOAWAY_REASON])

    def test_timer_is_cancelled_when_the_connection_closes(self) -> None:
        """Each connection has one timer while open; closing it cancels the timer."""
        fixture = self.fixture
        self.assertEqual(fixture.clock.getDelayedCalls(), [])
        one = fixture.agent(admitted(serial="a1", not_after=self.at(30)))
        two = fixture.agent(admitted(agent="agent-2", serial="a2"))
        self.assertEqual(len(fixture.clock.getDelayedCalls()), 2)
        self.successResultOf(one.connection.closed("client"))
        self.assertEqual(len(fixture.clock.getDelayedCalls()), 1)
        fixture.clock.advance(30)
        self.assertEqual(one.sink.disconnects, [])
        self.successResultOf(two.connection.closed("client"))
        self.assertEqual(fixture.clock.getDelayedCalls(), [])


class ExpiryMomentTests(SynchronousTestCase):
    """
    L{expiry}: when admitted credentials lapse by themselves.
    """

    def test_earliest_certificate(self) -> None:
        """The earlier of leaf and intermediate; the leaf on a tie or without an intermediate."""
        early = datetime(2030, 1, 1, tzinfo=UTC)
        late = datetime(2031, 1, 1, tzinfo=UTC)
        self.assertEqual(
            expiry(admitted(not_after=late, intermediate_not_after=early)), (early, "1e")
        )
        self.assertEqual(
            expiry(admitted(not_after=early, intermediate_not_after=late)), (early, "a1")
        )
        self.assertEqual(
            expiry(admitted(not_after=early, intermediate_not_after=early)), (early, "a1")
        )
        self.assertEqual(expiry(identity()), (identity().not_after, "a1"))


class StandingTests(SynchronousTestCase):
    """
    L{standing}: whether admitted credentials still hold, and why not.
    """

    def test_order_of_lapses(self) -> None:
        """Denial before expiry; the leaf before the intermediate; None while all hold."""
        now = datetime(2030, 1, 1, tzinfo=UTC)
        past = datetime(2029, 1, 1, tzinfo=UTC)
        agent = admitted(serial="a1", intermediate="1e")
        both = DenyList.of([("a1", now), ("1e", now)])
        self.assertIsNone(standing(agent, DenyList(), now))
        self.assertEqual(standing(agent, both, now), Lapse(Standing.DENIED, "a1"))
        self.assertEqual(
            standing(agent, DenyList.of([("1e", now)]), now), Lapse(Standing.DENIED, "1e")
        )
        expired = attrs.evolve(agent, not_after=past, intermediate_not_after=past)
        self.assertEqual(standing(expired, DenyList(), now), Lapse(Standing.EXPIRED, "a1"))
        self.assertEqual(
            standing(attrs.evolve(agent, intermediate_not_after=now), DenyList(), now),
            Lapse(Standing.EXPIRED, "1e"),
        )
        self.assertEqual(
            standing(attrs.evolve(agent, not_after=past), both, now), Lapse(Standing.DENIED, "a1")
        )


class SessionFileTests(SynchronousTestCase):
    """
    The C{sessions.json} format.
    """

    def test_round_trip(self) -> None:
        """Rendered epochs parse back; the document is versioned and sorted."""
        data = render_epochs({"b": 2, "a": 1})
        self.assertEqual(data, b'{"version":1,"agents":{"a":1,"b":2}}\n')
        self.assertEqual(parse_epochs(data, "f"), {"a": 1, "b": 2})

    def test_corrupt(self) -> None:
        """Anything but the documented format is refused, naming the file."""
        for raw in (
            b"{",
            b"[]",
            b'{"version":2,"agents":{}}',
            b'{"version":1}',
            b'{"version":1,"agents":{"a":-1}}',
            b'{"version":1,"agents":{"a":true}}',
        ):
            error = self.assertRaises(SessionFileError, parse_epochs, raw, "sessions.json")
            self.assertIn("sessions.json", str(error))

    def test_corrupt_file_fails_requests(self) -> None:
        """A corrupt sessions.json makes the tenant's requests fail rather than lose fencing."""
        fixture = ServiceFixture(self)
        self.addCleanup(fixture.close)
        base = Path(fixture.root) / "user-1" / "tenant-a"
        base.mkdir(parents=True)
        (base / SESSIONS_FILE).write_text("{")
        agent = fixture.agent()
        self.assertIsInstance(agent.error("list", path="/agent-1"), SessionFileError)
