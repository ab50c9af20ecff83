"""
Crash safety of the storage engine, with real processes: a child writing
chunks and manifests is killed with SIGKILL at random points, many times, and
after each kill the store must hold every acknowledged commit intact.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from blake3 import blake3
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.store.engine import StorageEngine, StorageRoots
from svc.store.layout import TenantLocation, chunk_objects_dir, is_chunk_hash
from svc.testing.worker import ImmediateWorker

CHILD = Path(__file__).with_name("store_crash_child.py")
KILLS = 50
ACME = TenantLocation.for_owner("acme")


class KillNineTests(SynchronousTestCase):
    """
    Committed manifests survive SIGKILL of the writer at any point.
    """

    def setUp(self) -> None:
        self.root = Path(self.mktemp()).resolve()
        self.root.mkdir()
        self.log = self.root.parent / "commits.jsonl"
        self.rng = random.Random(20261122)

    def run_child_and_kill(self, seed: int) -> None:
        """Start a writer, let it work for a random moment, then SIGKILL it."""
        errors = self.root.parent / f"child-{seed}.err"
        with errors.open("wb") as stderr:
            child = subprocess.Popen(
                [sys.executable, str(CHILD), str(self.root), str(self.log), str(seed)],
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        try:
            assert child.stdout is not None
            ready = child.stdout.readline()
            if ready.strip() != b"READY":
                child.wait(timeout=30)
                self.fail(f"child did not start: {errors.read_text()}")
            time.sleep(self.rng.uniform(0.0, 0.4))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        self.assertEqual(child.returncode, -signal.SIGKILL)

    def check_final_names(self) -> int:
        """Every file under a final chunk name hashes to that name; returns the count."""
        objects = chunk_objects_dir(self.root, ACME)
        count = 0
        for shard in objects.iterdir():
            if not shard.is_dir():
                continue
            for entry in shard.iterdir():
                if is_chunk_hash(entry.name):
                    self.assertEqual(
                        blake3(entry.read_bytes()).hexdigest(), entry.name, f"torn {entry}"
                    )
                    count += 1
        return count

    def check_commits(self) -> int:
        """Reopen the store: every acknowledged commit is there with readable chunks."""
        engine = StorageEngine(
            StorageRoots.single(self.root),
            Clock(),
            lambda name: ImmediateWorker(),
            ImmediateWorker(),
            lambda loc, revoke: None,
            lambda loc, event: None,
        )
        try:
            storage = self.successResultOf(engine.tenant(ACME))
            latest: dict[str, int] = {}
            if self.log.exists():
                for line in self.log.read_text().splitlines():
                    record = json.loads(line)
                    latest[record["path"]] = max(latest.get(record["path"], 0), record["version"])
            for path, version in latest.items():
                manifest = self.successResultOf(storage.manifest_get(path))
                self.assertGreaterEqual(manifest.attributes.version, version)
            entries = self.successResultOf(storage.list_dir("/a1"))
            for entry in entries:
                manifest = self.successResultOf(storage.manifest_get(f"/a1/{entry.name}"))
                data = b"".join(
                    self.successResultOf(storage.chunk_get(c.hash)).data for c in manifest.chunks
                )
                self.assertEqual(len(data), manifest.attributes.size)
            return len(latest)
        finally:
            self.successResultOf(engine.close())

    def test_kill_nine_fifty_times(self) -> None:
        """After each of 50 SIGKILLs, committed manifests and their chunks are intact."""
        committed = 0
        for round_no in range(KILLS):
            self.run_child_and_kill(seed=round_no)
            self.check_final_names()
            committed = self.check_commits()
        # The test must have exercised real commits, not only start-ups.
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        self.assertGreater(len(lines), KILLS)
        self.assertGreater(committed, 1)
        leftovers = [
            p for p in chunk_objects_dir(self.root, ACME).rglob("*") if p.name.startswith(".tmp")
        ]
        # Reopening removes every temporary file a killed writer left behind.
        self.assertEqual(leftovers, [])
        os.sync()
