"""
An owner's revert from the journal reaches a running mount: the data plane
pushes C{changed} to the agent's connection and the mount drops what it
cached, so programs in the sandbox see the reverted content (and a restored
file) without a remount.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
from http.client import HTTPConnection
from typing import Any

from twisted.internet.threads import deferToThread

from svc.quickstart import DEMO_AGENT, DEMO_OWNER
from svc.quickstart_stack import Stack
from tests.mount_harness import MountStackCase, connect_enrolled

WAIT_SECONDS = 15.0


class OwnerSession:
    """The demo owner signed in to the control plane (session cookie plus CSRF token)."""

    def __init__(self, control_url: str, sign_in_token: str) -> None:
        parsed = urllib.parse.urlsplit(control_url)
        self._host, self._port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self._origin = control_url
        status, headers, _ = self._request("GET", f"/admin/session?token={sign_in_token}")
        assert status in (302, 303), status
        cookie = headers.get("Set-Cookie", "")
        self._cookie = cookie.split(";", 1)[0]
        status, _, me = self._request("GET", "/me")
        assert status == 200, me
        self._csrf = me["csrf_token"]

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, str], Any]:
        connection = HTTPConnection(self._host, self._port, timeout=30)
        headers = {"Svc-API-Version": "1"}
        if getattr(self, "_cookie", None):
            headers["Cookie"] = self._cookie
        if method != "GET":
            headers.update(
                {
                    "Origin": self._origin,
                    "X-CSRF-Token": self._csrf,
                    "Content-Type": "application/json",
                }
            )
        try:
            connection.request(
                method, path, json.dumps(body) if body is not None else None, headers
            )
            response = connection.getresponse()
            raw = response.read()
            decoded = json.loads(raw) if raw and response.status != 302 else None
            return response.status, dict(response.getheaders()), decoded
        finally:
            connection.close()

    def journal(self, path: str) -> list[dict[str, Any]]:
        """The journal rows of C{path}, newest first."""
        query = urllib.parse.urlencode({"path": path})
        status, _, page = self._request("GET", f"/v1/journal?{query}")
        assert status == 200, page
        rows: list[dict[str, Any]] = page["entries"]
        return rows

    def revert(self, path: str, seq: int) -> dict[str, Any]:
        """Restore C{path} to its state before row C{seq}."""
        status, _, answer = self._request("POST", "/v1/journal/revert", {"path": path, "seq": seq})
        assert status == 200, answer
        result: dict[str, Any] = answer
        return result


class OwnerRevertTests(MountStackCase):
    """
    Reverts made by the owner while the agent's disk is mounted.
    """

    def owner(self) -> OwnerSession:
        stack = Stack(self.stack)
        done = subprocess.run(
            [stack._bin("svc"), "user", "seed", "--user", DEMO_OWNER, "--name", "Demo Owner"],
            env=stack.control_environ(self.state),
            cwd=self.stack,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        return OwnerSession(self.control_url, done.stdout.strip())

    def wait_for(self, command: str, expected: str, mount: Any) -> None:
        """Wait until C{command} in the mount prints C{expected}."""
        deadline = time.monotonic() + WAIT_SECONDS
        while (seen := self.sh(command, mount)) != expected:
            if time.monotonic() > deadline:
                self.fail(f"{command!r} printed {seen!r}, not {expected!r}")
            time.sleep(0.2)

    def test_revert_and_restore_reach_the_running_mount(self) -> None:
        """A reverted file reads as its old content, and a deleted one comes back, live."""
        mount = self.mount()
        self.sh("echo first > notes.txt && echo second > notes.txt", mount)
        self.assertEqual(self.sh("cat notes.txt", mount), "second\n")
        owner = self.owner()
        path = f"/{DEMO_AGENT}/notes.txt"
        # Oldest first. Reverting the row right after the one that wrote
        # "first" restores the file as that row left it.
        rows = owner.journal(path)[::-1]
        wrote_first = next(
            index for index, row in enumerate(rows) if row.get("new_size") == len("first\n")
        )
        owner.revert(path, rows[wrote_first + 1]["seq"])
        self.wait_for("cat notes.txt", "first\n", mount)

        self.sh("rm notes.txt", mount)
        removal = owner.journal(path)[0]
        exists = "test -e notes.txt && echo yes || echo no"
        self.assertEqual(self.sh(exists, mount), "no\n")
        answer = owner.revert(path, removal["seq"])
        self.assertTrue(answer["exists"])
        self.wait_for(exists, "yes\n", mount)
        self.assertEqual(self.sh("cat notes.txt", mount), "first\n")
        self.unmount(mount)


HOLDER = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
os.pwrite(fd, b"MINE", 0)
print("written", flush=True)
sys.stdin.readline()
os.pwrite(fd, b"MORE", 4)
os.close(fd)
print("closed", flush=True)
"""
"""Opens a file for writing, writes, waits for a line, writes again and closes."""


class WriteLeaseTests(MountStackCase):
    """
    The mount's write lease on a file a program has open for writing, asked
    for by another connection of the agent (its own certificate).
    """

    async def test_asked_back_after_writing_back_and_taken_again(self) -> None:
        """
        Asked for the lease, the mount commits the open file's changes
        before yielding it; the program's later close waits for the lease
        to come back (the other connection releases it when asked), then
        commits. Nothing is lost and no conflict copy is made.
        """
        mount = self.mount()
        self.sh("printf 'version one' > f", mount)
        program = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(self.mount_point / "f")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(program.kill)
        assert program.stdin is not None and program.stdout is not None
        self.assertEqual(program.stdout.readline(), "written\n")
        client = await connect_enrolled(self.enroll())
        self.addCleanup(client.close)
        path = f"/{DEMO_AGENT}/f"

        async def content() -> bytes:
            reply = await client.call("manifest_get", {"path": path, "inline_max": 4096})
            return bytes(reply.raw)

        self.assertEqual(await content(), b"version one")

        def yield_when_asked(op: str, payload: Any, raw: bytes) -> None:
            if op == "lease_revoke":
                client.call("lease_release", {"lease_id": payload["lease_id"]})

        client.on_push(yield_when_asked)
        granted = await client.call("lease_grant", {"path": path, "mode": "write", "wait": True})
        self.assertTrue(granted.payload["granted"], granted.payload)
        self.assertEqual(await content(), b"MINEion one", "committed before the lease was yielded")

        program.stdin.write("go\n")
        program.stdin.flush()
        closed = await deferToThread(program.stdout.readline)
        self.assertEqual(closed, "closed\n")
        self.assertEqual(await deferToThread(program.wait, 60), 0)
        self.assertEqual(await content(), b"MINEMOREone")
        self.assertNotIn(".conflict-", self.sh("ls", mount))
        events = [line["event"] for line in mount.audit_lines()]
        self.assertNotIn("lease_denied", events)
