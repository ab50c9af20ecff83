"""
What a program sees through a real mount where the mount used to answer
first and be refused later, or to answer with the wrong details (issue 35):
a file whose data-plane path is too long, the ctime of a truncation,
write-lease audit lines with no refusal behind them, a write lease orphaned
by data-plane restarts, and the C{.} and C{..} of a listing.
"""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys
import time
from pathlib import Path

from svc.quickstart import DEMO_AGENT
from svc.wire.messages import MAX_PATH_BYTES
from tests.mount_harness import MountStackCase, shows_evidence

ISSUE = "issue 35: the mount answers before the data plane refuses"

DIRECTORY_NAME = "d" * 250
"""A directory name; each level adds 251 bytes to a data-plane path."""

LEVELS = (MAX_PATH_BYTES - len(f"/{DEMO_AGENT}")) // (len(DIRECTORY_NAME) + 1)
"""The deepest chain of such directories whose data-plane path fits the limit."""

HOLD_OPEN = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY)
print("open", flush=True)
time.sleep(600)
"""
"""Opens a file for writing (taking its write lease) and keeps it open."""

WRITE_AND_SYNC = """
import errno, os, sys
try:
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
    os.write(fd, sys.argv[2].encode())
    os.fsync(fd)
    os.close(fd)
except OSError as error:
    print(errno.errorcode[error.errno])
else:
    print("synced")
"""
"""Rewrites a file, fsyncs and closes it; prints C{synced} or the errno's name."""


class MountPosixDetailsTests(MountStackCase):
    """Refusals reach the call that caused them; attributes and listings are POSIX's."""

    def deep_directory(self) -> int:
        """
        A descriptor of the deepest directory of a chain of L{LEVELS}
        250-byte names under the mount (made through descriptors: its local
        path is longer than the kernel takes in one system call).
        """
        fd = os.open(self.mount_point, os.O_RDONLY | os.O_DIRECTORY)
        for _ in range(LEVELS):
            os.mkdir(DIRECTORY_NAME, dir_fd=fd)
            inner = os.open(DIRECTORY_NAME, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        return fd

    def test_a_file_whose_data_plane_path_is_too_long_is_refused_not_lost(self) -> None:
        """
        A new file whose data-plane path would pass the limit (each
        component within 255) is refused with ENAMETOOLONG by the call that
        makes or closes it; a file that call accepted is still there later.
        """
        mount = self.mount()
        directory = self.deep_directory()
        self.addCleanup(os.close, directory)
        name = "f" * 100
        refused = None
        try:
            fd = os.open(name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=directory)
            try:
                os.write(fd, b"hello\n")
            finally:
                os.close(fd)
        except OSError as error:
            refused = error.errno
        if refused is not None:
            self.assertEqual(refused, errno.ENAMETOOLONG, os.strerror(refused))
            self.assertNotIn(name, os.listdir(directory))
            return
        time.sleep(3)  # the commit the close handed off has been answered by now
        log = mount.log.read_text(errors="replace")
        self.assertIn(name, os.listdir(directory), log)
        fd = os.open(name, os.O_RDONLY, dir_fd=directory)
        try:
            self.assertEqual(os.read(fd, 100), b"hello\n")
        finally:
            os.close(fd)

    def test_a_truncation_changes_ctime_with_mtime(self) -> None:
        """After ftruncate and close, stat shows a ctime no older than the new mtime."""
        self.mount()
        path = self.mount_point / "truncated"
        path.write_bytes(b"x" * 1000)
        before = os.stat(path)
        time.sleep(0.2)
        fd = os.open(path, os.O_WRONLY)
        os.ftruncate(fd, 10)
        os.close(fd)
        after = os.stat(path)
        self.assertEqual(after.st_size, 10)
        self.assertGreater(after.st_mtime_ns, before.st_mtime_ns)
        self.assertGreaterEqual(after.st_ctime_ns, after.st_mtime_ns)

    def test_opening_for_writing_audits_no_lease_denied_without_a_refusal(self) -> None:
        """
        Quick open(O_WRONLY) + write + close rounds over more files than
        the mount keeps leases for, by one mount (nobody else has them
        open): no lease_denied line.
        """
        mount = self.mount()
        directory = self.mount_point / "reopened"
        directory.mkdir()
        paths = [directory / f"f{index}" for index in range(300)]
        for path in paths:
            path.write_text("content\n")
        for round in range(3):
            for path in paths:
                fd = os.open(path, os.O_WRONLY)
                os.write(fd, b"%03d" % round)
                os.close(fd)
        time.sleep(2)
        denied = [line for line in mount.audit_lines() if line["event"] == "lease_denied"]
        self.assertEqual(denied, [])
        self.assertEqual(paths[0].read_text(), "002tent\n")

    @shows_evidence
    def test_an_orphaned_write_lease_does_not_hold_up_the_mount_that_took_over(self) -> None:
        """
        A mount killed while it held a file's write lease across a data-plane
        restart leaves that lease to a dead session. The mount that takes
        over writes the file and fsyncs it while the data plane restarts
        again: the fsync succeeds, the content is the new one, and no
        conflict copy appears (nobody else wrote the file).
        """
        first = self.mount()
        self.sh("mkdir work && echo old > work/f", first)
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_OPEN, str(self.mount_point / "work" / "f")],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(holder.wait, 30)
        self.addCleanup(holder.kill)
        assert holder.stdout is not None
        self.assertEqual(holder.stdout.readline().strip(), "open")
        time.sleep(1)  # the lease is granted
        self.kill_dataplane()
        first.process.kill()
        first.process.wait(30)
        holder.kill()
        subprocess.run(["umount", "-l", str(self.mount_point)], check=False)
        self.start_dataplane()

        second = self.mount()
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITE_AND_SYNC, str(self.mount_point / "work" / "f"), "new\n"],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(2)
        self.kill_dataplane()
        self.start_dataplane()
        out, _ = writer.communicate(timeout=120)
        log = second.log.read_text(errors="replace")
        self.assertEqual(out.strip(), "synced", log)
        self.assertEqual((self.mount_point / "work" / "f").read_text(), "new\n")
        self.assertEqual(sorted(os.listdir(self.mount_point / "work")), ["f"])
        self.unmount(second)

    def test_a_listing_holds_dot_and_dot_dot(self) -> None:
        """getdents of a directory returns C{.} and C{..}, as every local file system does."""
        mount = self.mount()
        self.sh("mkdir -p sub/inner && touch sub/file", mount)
        listed = self.sh("ls -a1 sub", mount).split()
        self.assertEqual(sorted(listed), [".", "..", "file", "inner"])

    def test_rename_flags_are_einval_and_a_plain_rename_works(self) -> None:
        """
        renameat2 with RENAME_NOREPLACE or RENAME_EXCHANGE fails EINVAL (the
        kernel refuses flags below FUSE protocol 7.23: mount-fs.md, section 5)
        and changes nothing; rename without flags works.
        """
        mount = self.mount()
        self.sh("mkdir r && echo a > r/a && echo b > r/b", mount)
        here = self.mount_point / "r"
        for flag, target in ((RENAME_NOREPLACE, "c"), (RENAME_EXCHANGE, "b")):
            self.assertEqual(renameat2(here / "a", here / target, flag), errno.EINVAL)
        self.assertEqual(renameat2(here / "a", here / "c", 0), 0)
        self.assertEqual(sorted(os.listdir(here)), ["b", "c"])
        self.assertEqual((here / "c").read_text(), "a\n")


RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def renameat2(source: Path, target: Path, flags: int) -> int:
    """C{renameat2(2)} through glibc: 0, or the errno it failed with."""
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.renameat2(
        AT_FDCWD, os.fsencode(source), AT_FDCWD, os.fsencode(target), ctypes.c_uint(flags)
    )
    return 0 if result == 0 else ctypes.get_errno()
