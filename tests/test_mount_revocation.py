"""
A revoked or displaced mount stops accepting changes within seconds, for
good. Revoked (the service revokes the agent): the data plane pushes
C{credentials_revoked} when the deny-list names the mount's certificate.
Displaced (another enrollment forces the mount lease): the control plane has
the data plane fence the older session, which pushes C{session_fenced}.
Either way the mount turns read-only at once: every change after that fails
C{EROFS} whatever its kind, nothing changed after that point reaches the
data plane, and what was written before can still be read.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from svc.quickstart import DEMO_AGENT, DEMO_OWNER, http
from tests.mount_harness import Mount, MountStackCase, shows_evidence

PROBER = """
import errno, json, os, sys, time
folder, stop, out = sys.argv[1], sys.argv[2], sys.argv[3]

def attempt(n, kind):
    if kind == "create":
        with open(f"{folder}/probe-{n}", "w") as f:
            f.write(f"probe {n}\\n")
    elif kind == "append":
        with open(f"{folder}/kept", "a") as f:
            f.write(f"append {n:06d}\\n")
    elif kind == "mkdir":
        os.mkdir(f"{folder}/dir-{n}")
    else:
        os.rename(f"{folder}/spare-{n // 4}", f"{folder}/moved-{n}")

n = 0
with open(out, "w") as log:
    while not os.path.exists(stop):
        n += 1
        started = time.time()
        kind = ("create", "append", "mkdir", "rename")[n % 4]
        try:
            attempt(n, kind)
            result = "ok"
        except OSError as error:
            result = errno.errorcode.get(error.errno, str(error.errno))
        log.write(json.dumps({"n": n, "kind": kind, "at": started, "result": result}) + "\\n")
        log.flush()
        time.sleep(0.05)
"""
"""
Changes the mount one way after another -- a new file, an append to a file
that exists, a new directory, a rename of one of the L{SPARES} files made
beforehand -- logging how each ended, until a stop file appears.
"""

SPARES = 200
"""Files made for the prober to rename (it renames one every fourth change)."""

APPEND_BYTES = len("append 000000\n")
"""Bytes each append adds."""

TOLD_WITHIN = 5.0
"""Seconds from the revocation to the first write refused EROFS."""


class MountRevocationTests(MountStackCase):
    """A mount whose certificate is revoked turns read-only at once, for good."""

    def start_prober(self) -> tuple[subprocess.Popen[bytes], Path, Path]:
        """Start L{PROBER} on C{probes/}; it has written a few changes when this returns."""
        stop = self.tmp / "stop-prober"
        out = self.tmp / "probes.jsonl"
        process = subprocess.Popen(
            [sys.executable, "-c", PROBER, str(self.mount_point / "probes"), str(stop), str(out)]
        )
        self.addCleanup(process.kill)
        deadline = time.monotonic() + 30
        while not out.exists() or out.read_text().count("\n") < 3:
            self.assertLess(time.monotonic(), deadline, "the prober wrote nothing")
            time.sleep(0.05)
        return process, stop, out

    def probes(self, out: Path) -> list[dict[str, Any]]:
        """What the prober logged, in order."""
        return [json.loads(line) for line in out.read_text().splitlines() if line]

    def stored(self) -> tuple[set[int], int]:
        """
        What the data plane holds (its routes.db, read directly): the numbers
        of the probes' names under C{probes/}, and the size of C{probes/kept}.
        """
        numbers: set[int] = set()
        kept = 0
        for db in (self.stack / "tenants" / DEMO_OWNER).rglob("routes.db"):
            connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                rows = connection.execute(
                    "SELECT n.path, i.size FROM names n JOIN inodes i ON i.id = n.inode"
                    " WHERE n.path >= ? AND n.path < ?",
                    (f"/{DEMO_AGENT}/probes/", f"/{DEMO_AGENT}/probes0"),
                ).fetchall()
            finally:
                connection.close()
            for path, size in rows:
                name = path.rsplit("/", 1)[1]
                if name == "kept":
                    kept = size
                elif name.split("-")[0] in ("probe", "dir", "moved"):
                    numbers.add(int(name.rsplit("-", 1)[1]))
        return numbers, kept

    def run_revocation(self, mount: Mount, revoke: Any) -> None:
        """
        Change the mount continuously, C{revoke}, and check: within
        L{TOLD_WITHIN} seconds a change is refused EROFS, every change
        after it is too, whatever its kind, and none of them reached the
        data plane; what was written before can still be read.
        """
        self.sh(
            "mkdir probes && echo kept > probes/before && : > probes/kept"
            f" && for i in $(seq 0 {SPARES}); do : > probes/spare-$i; done",
            mount,
        )
        prober, stop, out = self.start_prober()
        time.sleep(1.0)
        revoked_at = time.time()
        revoke()
        time.sleep(TOLD_WITHIN)
        stop.touch()
        prober.wait(60)
        probes = self.probes(out)
        log = mount.log.read_text(errors="replace")
        refused = [p for p in probes if p["result"] != "ok"]
        self.assertTrue(refused, f"every change was accepted after the revocation\n{log}")
        first = refused[0]
        self.assertLess(first["at"] - revoked_at, TOLD_WITHIN, log)
        after = [p for p in probes if p["n"] >= first["n"]]
        self.assertEqual({p["result"] for p in after}, {"EROFS"}, log)
        self.assertEqual({p["kind"] for p in after}, {"create", "append", "mkdir", "rename"})
        self.assertIn("read-only", log)
        self.assertEqual(self.sh("cat probes/before", mount), "kept\n")
        time.sleep(2)  # anything still on its way would have landed
        numbers, kept = self.stored()
        self.assertEqual({n for n in numbers if n >= first["n"]}, set(), log)
        appended = [p for p in probes if p["kind"] == "append" and p["n"] < first["n"]]
        self.assertLessEqual(kept, APPEND_BYTES * len(appended), log)

    @shows_evidence
    def test_revoked_allocation(self) -> None:
        """The service revokes the agent: its live mount turns read-only within seconds."""
        mount = self.mount()

        def revoke() -> None:
            status, body = http(
                "DELETE",
                self.control_url + f"/v1/entities/agent/{DEMO_AGENT}",
                None,
                self.state["token"],
            )
            self.assertEqual(status, 204, body)

        self.run_revocation(mount, revoke)

    @shows_evidence
    def test_displaced_mount(self) -> None:
        """Another enrollment forces the mount lease: the displaced mount turns read-only."""
        mount = self.mount()

        def displace() -> None:
            enrollment = self.enroll()
            status, lease = http(
                "POST",
                self.control_url + f"/allocations/{self.state['allocation_id']}/mount",
                {"agent_fingerprint": enrollment["agent_fingerprint"], "force": True},
            )
            self.assertEqual(status, 200, lease)

        self.run_revocation(mount, displace)
