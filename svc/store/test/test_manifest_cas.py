"""
Property test of the manifest compare-and-swap: several writers doing
read-modify-write with retry on ESTALE, in random interleavings, never lose
an update.
"""

from __future__ import annotations

import itertools

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svc.store.errors import NotFound, StaleVersion
from svc.store.manifest_values import ChunkRef, Writer
from svc.store.manifests import ManifestStore
from svc.store.test.routes_support import StoreTestCase, chunk
from svc.testing.worker import ManualWorker

WRITERS = 3
PATHS = 2


@attrs.define
class _Client:
    """
    One simulated writer: it reads (get) and then writes (put) the manifest
    with its own marker chunk appended, retrying from the read on ESTALE.
    """

    writer: Writer
    index: int
    writes_done: int = 0
    seen: tuple[int, tuple[ChunkRef, ...]] | None = None

    def path(self, directory: str) -> str:
        return f"{directory}/f{(self.index + self.writes_done) % PATHS}"

    def marker(self) -> ChunkRef:
        return chunk(("marker", self.index, self.writes_done), 10)


class CompareAndSwapTests(StoreTestCase):
    """
    Random interleavings of get/put steps from several writers.
    """

    def setUp(self) -> None:
        super().setUp()
        self.mkdirs("/alice")
        self.examples = itertools.count()

    @settings(
        max_examples=1000,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    # 1,000 random interleavings (the acceptance bar), each of 20-40 steps.
    @given(st.lists(st.integers(0, WRITERS - 1), min_size=20, max_size=40))
    def test_no_lost_update(self, schedule: list[int]) -> None:
        """Every successful put's marker ends up in its file exactly once, in commit order."""
        directory = f"/alice/run{next(self.examples)}"
        self.mkdirs(directory)
        clients = [_Client(Writer(f"agent{i}", f"mount:{i:02x}"), i) for i in range(WRITERS)]
        committed: dict[str, list[ChunkRef]] = {}
        for who in schedule:
            client = clients[who]
            path = client.path(directory)
            if client.seen is None:
                client.seen = self.read(path)
                continue
            version, chunks = client.seen
            client.seen = None
            attempt = self.put_deferred(
                path, version, [*chunks, client.marker()], writer=client.writer
            )
            if version == len(committed.get(path, [])):
                result = self.ok(attempt)
                self.assertEqual(result.version, version + 1)
                committed.setdefault(path, []).append(client.marker())
                client.writes_done += 1
            else:
                stale = self.fails(attempt, StaleVersion)
                self.assertEqual(stale.current_version, len(committed.get(path, [])))
                assert stale.last_writer is not None
                self.assertTrue(stale.last_writer.agent_id.startswith("agent"))
        for path, markers in committed.items():
            manifest = self.ok(self.store.get(path))
            self.assertEqual(manifest.chunks, tuple(markers))
            self.assertEqual(manifest.version, len(markers))

    def read(self, path: str) -> tuple[int, tuple[ChunkRef, ...]]:
        """The version and chunks of ``path``; (0, ()) when it does not exist."""
        got = self.store.get(path).addErrback(lambda failure: failure.trap(NotFound) and None)
        manifest = self.ok(got)
        return (0, ()) if manifest is None else (manifest.version, manifest.chunks)


class GroupCommitRaceTests(StoreTestCase):
    """
    Racing puts that land in the same transaction still compare and swap
    one at a time.
    """

    def test_same_batch_race(self) -> None:
        """Two puts from version 1 in one commit: the first wins, the second gets ESTALE."""
        self.mkdirs("/alice")
        self.write("/alice/f", [chunk(0)])
        self.ok(self.store.close())
        worker = ManualWorker()
        opening = ManifestStore.open(self.db_path, worker, self.clock)
        worker.run_one()
        store = self.ok(opening)
        blocker = store.get("/alice/f")
        first = store.put(
            "/alice/f",
            expected_version=1,
            chunks=[chunk("a")],
            size=1000,
            mode=0o644,
            mtime_ns=0,
            uid=0,
            gid=0,
            writer=Writer("a", None),
        )
        second = store.put(
            "/alice/f",
            expected_version=1,
            chunks=[chunk("b")],
            size=1000,
            mode=0o644,
            mtime_ns=0,
            uid=0,
            gid=0,
            writer=Writer("b", None),
        )
        worker.run_one()
        self.ok(blocker)
        self.assertNoResult(first)
        worker.run_one()
        self.assertEqual(self.ok(first).version, 2)
        stale = self.fails(second, StaleVersion)
        self.assertEqual(stale.current_version, 2)
        assert stale.last_writer is not None
        self.assertEqual(stale.last_writer.agent_id, "a")
        closing = store.close()
        worker.run_one()
        self.ok(closing)
