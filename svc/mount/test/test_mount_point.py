"""
Tests for L{svc.mount.runtime.mount_point}: which directories can take a mount, and
clearing the dead mount a killed svc mount leaves behind.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.mount.runtime.mount_point import fstypes_at, mount_point_problem, release_dead_mount


def _dead(path: Path) -> object:
    raise OSError(errno.ENOTCONN, "Transport endpoint is not connected", str(path))


def _gone(path: Path) -> object:
    raise OSError(errno.ENOENT, "No such file or directory", str(path))


class DeadMountTests(SynchronousTestCase):
    """L{release_dead_mount} unmounts only a dead svc mount."""

    def setUp(self) -> None:
        self.point = Path("/mnt/svc agents/a1")
        self.mounts = Path(self.mktemp())
        self.ran: list[list[str]] = []

    def listed(self, *fstypes: str) -> None:
        escaped = str(self.point).replace(" ", "\\040")
        lines = [f"svc {escaped} {fstype} rw 0 0" for fstype in fstypes]
        self.mounts.write_text("\n".join(["/dev/vda / ext4 rw 0 0", *lines]) + "\n")

    def release(self, probe: Callable[[Path], object]) -> bool:
        return release_dead_mount(self.point, mounts=self.mounts, probe=probe, run=self.ran.append)

    def test_dead_svc_mount_is_unmounted_lazily(self) -> None:
        """ENOTCONN and fuse.svc newest at the path (escaped in /proc/mounts): a lazy unmount."""
        self.listed("ext4", "fuse.svc")
        self.assertEqual(fstypes_at(self.point, self.mounts), ["ext4", "fuse.svc"])
        self.assertTrue(self.release(_dead))
        [argv] = self.ran
        self.assertIn(str(self.point), argv)
        self.assertTrue({"-l", "-z"} & set(argv))

    def test_anything_else_is_left_alone(self) -> None:
        """A live path, another error, or another filesystem's dead mount: nothing run."""
        self.listed("fuse.sshfs")
        self.assertFalse(self.release(_dead))
        self.listed("fuse.svc")
        self.assertFalse(self.release(lambda path: None))
        self.assertFalse(self.release(_gone))
        self.mounts.unlink()
        self.assertFalse(self.release(_dead))
        self.assertEqual(self.ran, [])


class MountPointProblemTests(SynchronousTestCase):
    """L{mount_point_problem}."""

    def test_empty_directory_is_fine(self) -> None:
        """An existing empty directory can take the mount."""
        point = Path(self.mktemp())
        point.mkdir()
        self.assertIsNone(mount_point_problem(point))
