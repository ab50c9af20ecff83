"""
The L{svc.control.journal_access.JournalAccess} contract, written once and
run against the in-memory fake (L{svc.testing.journal.MemoryJournal}) and
against L{svc.control.journal_access.DataPlaneJournal} talking, in memory,
to a real data-plane app over a real storage engine.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from treq.testing import StubTreq
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.control.dataplane_client import ControlCredentials, DataPlaneClient, DataPlaneTarget
from svc.control.journal_access import DataPlaneJournal, JournalFilter, JournalSlice, TenantRef
from svc.control.journal_stream import JournalStream, parse_last_event_id
from svc.control.store.values import Server
from svc.control.test.test_dataplane_client import _Unreachable, credentials
from svc.control.test.test_journal_stream import parse_events
from svc.dataplane.test.test_http_journal import Journal, journal_fixture
from svc.testing.control_store import memory_control_store
from svc.testing.journal import MemoryJournal
from svc.testing.pki import SERVER_NAME
from svc.web.errors import AccessDenied, NotFound, ServiceUnavailable

if TYPE_CHECKING:
    _Base = SynchronousTestCase
else:
    _Base = object

TENANT = TenantRef("acme", "acme")


class JournalAccessContract(_Base):
    """What every L{JournalAccess} does; subclasses provide the hooks."""

    access: Any
    clock: Any

    def write(self, path: str) -> int:
        """Commit a change of C{path} (under C{/a1}) in C{TENANT}; its seq."""
        raise NotImplementedError()

    def go_unreachable(self) -> None:
        """Make the journal's home unreachable."""
        raise NotImplementedError()

    def flush(self) -> None:
        """Deliver answers still in flight."""

    def query(self, **kwargs: Any) -> Deferred[JournalSlice]:
        where = kwargs.pop("where", JournalFilter())
        kwargs.setdefault("cursor", None)
        kwargs.setdefault("limit", 100)
        kwargs.setdefault("order", "asc")
        d: Deferred[JournalSlice] = self.access.query(TENANT, where, **kwargs)
        self.flush()
        return d

    def seqs(self, found: JournalSlice) -> list[int]:
        return [int(str(e["seq"])) for e in found.entries]

    def test_pages_in_both_orders_with_last_seq(self) -> None:
        one, two, three = (self.write(f"/a1/f{i}") for i in range(3))
        page = self.successResultOf(self.query(cursor=one - 1, limit=2))
        self.assertEqual((self.seqs(page), page.next_cursor), ([one, two], two))
        self.assertEqual(page.last_seq, three)
        rest = self.successResultOf(self.query(cursor=two))
        self.assertEqual((self.seqs(rest), rest.next_cursor), ([three], None))
        newest = self.successResultOf(self.query(order="desc", limit=1))
        self.assertEqual(self.seqs(newest), [three])

    def test_entries_carry_the_row_fields(self) -> None:
        seq = self.write("/a1/f")
        [entry] = self.successResultOf(self.query(cursor=seq - 1)).entries
        self.assertEqual(entry["path"], "/a1/f")
        self.assertIsInstance(entry["at_ms"], int)
        self.assertIn("op", entry)
        self.assertIn("agent_id", entry)

    def test_path_filter(self) -> None:
        self.write("/a1/f")
        wanted = self.write("/a1/g")
        found = self.successResultOf(self.query(where=JournalFilter(path="/a1/g")))
        self.assertEqual(self.seqs(found), [wanted])

    def test_long_poll_is_answered_by_a_new_row(self) -> None:
        last = self.write("/a1/f")
        d = self.query(cursor=last, wait_seconds=10)
        self.assertNoResult(d)
        seq = self.write("/a1/g")
        self.flush()
        self.assertEqual(self.seqs(self.successResultOf(d)), [seq])

    def test_long_poll_times_out_empty(self) -> None:
        last = self.write("/a1/f")
        d = self.query(cursor=last, wait_seconds=10)
        self.clock.advance(10)
        self.flush()
        found = self.successResultOf(d)
        self.assertEqual((found.entries, found.last_seq), ((), last))

    def test_revert_is_a_new_row_by_the_owner(self) -> None:
        seq = self.write("/a1/f")
        answer = self.successResultOf(self.access.revert(TENANT, "/a1/f", seq, "acme"))
        self.flush()
        self.assertEqual(answer["reverted_seq"], seq)
        new_seq = answer["journal_seq"]
        [row] = self.successResultOf(self.query(cursor=seq)).entries
        self.assertEqual((row["seq"], row["agent_id"]), (new_seq, "owner:acme"))

    def test_revert_of_an_unknown_row_is_not_found(self) -> None:
        seq = self.write("/a1/f")
        self.failureResultOf(self.access.revert(TENANT, "/a1/f", seq + 5, "acme"), NotFound)
        self.failureResultOf(self.access.revert(TENANT, "/a1/other", seq, "acme"), NotFound)

    def test_revert_of_a_disk_root_is_refused(self) -> None:
        self.write("/a1/f")
        failure = self.failureResultOf(self.access.revert(TENANT, "/a1", 1, "acme"), AccessDenied)
        self.assertEqual(failure.value.description, "disk_root")

    def test_unreachable_home_is_503(self) -> None:
        self.write("/a1/f")
        self.go_unreachable()
        failure = self.failureResultOf(self.query(), ServiceUnavailable)
        self.assertEqual(failure.value.description, "dataplane_unreachable")


class MemoryJournalTests(JournalAccessContract, SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.access = MemoryJournal(self.clock)
        self.access.append(TENANT, path="/a1", op="mkdir")

    def write(self, path: str) -> int:
        seq = self.access.append(TENANT, path=path)["seq"]
        assert isinstance(seq, int)
        return seq

    def go_unreachable(self) -> None:
        self.access.unreachable = True


class DataPlaneJournalTests(JournalAccessContract, SynchronousTestCase):
    def setUp(self) -> None:
        self.f = journal_fixture(self)
        self.clock = self.f.clock
        self.journal = Journal(self.f)
        self.journal.mkdir("/a1")
        self.reachable = True
        self.stub: Any = StubTreq(self.f.resource)

        def http_client(target: DataPlaneTarget, given: ControlCredentials) -> Any:
            return self.stub if self.reachable else _Unreachable()

        client = DataPlaneClient(credentials, http_client, self.clock, timeout=5.0)
        store = memory_control_store()
        now = datetime.fromtimestamp(self.clock.seconds(), UTC)
        self.successResultOf(store.register_server(SERVER_NAME, "10.0.0.1:7443", 10, now))
        self.successResultOf(store.put_user("acme", "Acme", now))
        self.successResultOf(
            store.provision(
                agent_id="a1", owner_id="acme", tenant_id="acme", grant_bytes=100, now=now
            )
        )
        self.successResultOf(store.place_tenant("acme", now))
        self.access = DataPlaneJournal(store, client, self.clock, target_of=self.target)
        self.sizes = 0

    def target(self, server: Server) -> DataPlaneTarget:
        return DataPlaneTarget(server.fqdn, "10.0.0.1:8443")

    def flush(self) -> None:
        self.stub.flush()

    def write(self, path: str) -> int:
        self.sizes += 1
        return self.journal.put(path, f"{path}-{self.sizes}", 10 + self.sizes)

    def go_unreachable(self) -> None:
        self.reachable = False

    def test_tenant_without_placement_has_an_empty_journal(self) -> None:
        other = TenantRef("acme", "nowhere")
        found = self.successResultOf(
            self.access.query(other, JournalFilter(), cursor=None, limit=10, order="asc")
        )
        self.assertEqual(found, JournalSlice((), None, 0))
        d = self.access.query(
            other, JournalFilter(), cursor=None, limit=10, order="asc", wait_seconds=5
        )
        self.assertNoResult(d)
        self.clock.advance(5)
        self.assertEqual(self.successResultOf(d).entries, ())


class StreamOverTheDataPlaneTests(SynchronousTestCase):
    """The event stream over the real data-plane journal survives a reconnect."""

    def test_reconnect_with_last_event_id_loses_and_repeats_nothing(self) -> None:
        case = DataPlaneJournalTests("test_path_filter")
        case.setUp()
        self.addCleanup(case.doCleanups)
        first_row = case.write("/a1/before")
        written = bytearray()

        def stream(after: int | None) -> Deferred[None]:
            journal_stream = JournalStream(
                case.access,
                TENANT,
                JournalFilter(),
                clock=case.clock,
                write=written.extend,
                still_allowed=lambda: succeed(True),
                max_seconds=20.0,
            )
            d = Deferred.fromCoroutine(journal_stream.run(after))
            case.flush()
            return d

        first = stream(first_row)
        expected = [case.write(f"/a1/during-{i}") for i in range(3)]
        case.flush()
        case.clock.advance(20)
        case.flush()
        self.successResultOf(first)
        ids = [e["id"] for e in parse_events(bytes(written)) if e.get("event") == "journal"]
        last_event_id = parse_last_event_id(ids[-1])
        # The client is away: rows keep coming.
        expected += [case.write(f"/a1/away-{i}") for i in range(2)]
        second = stream(last_event_id)
        expected.append(case.write("/a1/after"))
        case.flush()
        case.clock.advance(20)
        case.flush()
        self.successResultOf(second)
        ids = [e["id"] for e in parse_events(bytes(written)) if e.get("event") == "journal"]
        self.assertEqual([int(i) for i in ids], expected)
