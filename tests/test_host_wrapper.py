"""
The wrapper entrypoint of the host integration guide
(``docs/guides/host-integration.md`` section 4.3), run as written: it is
taken from the guide itself, so the guide cannot drift from what works.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from svc.mount.runtime.mount_point import FSTYPE, fstypes_at
from tests.mount_harness import BIN, ROOT, MountStackCase

GUIDE = ROOT / "docs" / "guides" / "host-integration.md"


def guide_wrapper() -> str:
    """The shell script after "A wrapper entrypoint" in the guide."""
    text = GUIDE.read_text()
    after = text[text.index("A wrapper entrypoint that mounts") :]
    return after.split("```sh\n", 1)[1].split("```", 1)[0]


class HostWrapperTests(MountStackCase):
    """The guide's wrapper against the quickstart stack."""

    def run_wrapper(self, *agent: str) -> subprocess.CompletedProcess[str]:
        script = self.tmp / "wrapper.sh"
        script.write_text(guide_wrapper())
        script.chmod(0o755)
        environ = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "SVC_CONTROL_URL": self.control_url,
            "SVC_ENROLL_TOKEN": self.enroll_token(),
            "SVC_MOUNT_POINT": str(self.mount_point),
            "SVC_CACHE_DIR": str(self.tmp / "wrapper-cache"),
            "SVC_AUDIT_LOG": str(self.tmp / "wrapper-audit.jsonl"),
            "SVC_MOUNT_FORCE": "1",
        }
        return subprocess.run(
            [str(script), *agent],
            env=environ,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )

    def test_agent_runs_in_the_mount_and_everything_stops(self) -> None:
        """The agent works in the mount; its exit status is the wrapper's; nothing stays."""
        done = self.run_wrapper("sh", "-c", "echo from-agent > note.txt; cat note.txt; exit 7")
        self.assertEqual(done.returncode, 7, done.stdout + done.stderr)
        self.assertIn("from-agent", done.stdout)
        self.assertFalse(os.path.ismount(self.mount_point))
        self.assertNotIn(FSTYPE, fstypes_at(self.mount_point))
        later = self.mount()
        self.assertEqual((self.mount_point / "note.txt").read_text(), "from-agent\n")
        self.unmount(later)

    def test_a_killed_mount_does_not_block_the_next_start(self) -> None:
        """After a mount is SIGKILLed (a dead FUSE mount stays), the wrapper still starts."""
        killed = self.mount()
        os.kill(killed.process.pid, signal.SIGKILL)
        killed.process.wait(30)
        self.assertEqual(fstypes_at(self.mount_point)[-1:], [FSTYPE])
        done = self.run_wrapper("sh", "-c", "test -w . && echo writable")
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("writable", done.stdout)
        self.assertNotIn(FSTYPE, fstypes_at(self.mount_point))
        self.assertFalse(Path(self.mount_point).is_mount())
