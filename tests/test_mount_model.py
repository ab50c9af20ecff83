"""
The FUSE mount against a model: the real stack (``python -m svc.quickstart
start``) and its ``twist svc-mount``, driven by random file operations that
run in step on a plain local directory, and two mounts of one allocation
fighting over the mount lease.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from twisted.trial.unittest import SkipTest, TestCase

from svc.quickstart import DEMO_AGENT, http
from svc.quickstart_stack import run_quickstart
from tests.json_logs import JSON_LOGS, check_json_log, stack_logs

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MOUNT_TIMEOUT = 60.0

# Names from a tiny alphabet, one level of nesting: collisions are the point.
NAMES = ["a", "b", "c"]
PATHS = NAMES + [f"{d}/{n}" for d in NAMES for n in NAMES[:2]]
MODES = [0o400, 0o600, 0o644, 0o700, 0o755]
DATA = st.binary(min_size=0, max_size=64) | st.sampled_from([b"x" * 70_000, b""])
OFFSETS = st.sampled_from([0, 1, 7, 4096, 70_000])
SIZES = st.sampled_from([0, 1, 5, 4096, 100_000])
SLOTS = st.sampled_from([0, 1])

SEEDS = [1, 2, 3, 4, 5, 6]
EXAMPLES_PER_SEED = 10
STEPS_PER_EXAMPLE = 50


def _skip_reason() -> str | None:
    if os.environ.get("CI") == "true":
        return None
    if os.geteuid() != 0:
        return "mounting FUSE needs root here"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    return None


def outcome(call: Any) -> tuple[str, Any]:
    """Run C{call}: C{("ok", value)} or C{("err", errno name)}."""
    try:
        return ("ok", call())
    except OSError as error:
        return ("err", errno.errorcode.get(error.errno or 0, str(error.errno)))


def tree(root: Path) -> dict[str, tuple[Any, ...]]:
    """
    Everything comparable under C{root}, without following symlinks: per
    path its kind, permission bits, owner, link count and content (file
    bytes and size, symlink target and size, a directory's sorted listing).

    Left out because they legitimately differ between two file systems:
    atime/mtime/ctime, inode numbers, st_dev, st_blocks/st_blksize and a
    directory's st_size.
    """
    found: dict[str, tuple[Any, ...]] = {}

    def visit(path: Path, rel: str) -> None:
        info = os.lstat(path)
        perm = (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)
        if stat.S_ISLNK(info.st_mode):
            found[rel] = ("link", perm, info.st_nlink, info.st_size, os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            names = sorted(os.listdir(path))
            found[rel] = ("dir", perm, info.st_nlink, names)
            for name in names:
                visit(path / name, f"{rel}/{name}")
        elif stat.S_ISREG(info.st_mode):
            content = path.read_bytes()
            found[rel] = ("file", perm, info.st_nlink, info.st_size, len(content), content)
        else:
            found[rel] = ("other", info.st_mode)

    visit(root, ".")
    return found


class FileModel(RuleBasedStateMachine):
    """
    The same operation on the mount (C{real}) and on a local directory
    (C{model}); after every step both answers and both trees must agree.
    Failing operations must fail with the same errno on both sides.
    """

    mount_root: ClassVar[Path]
    local_root: ClassVar[Path]

    def __init__(self) -> None:
        super().__init__()
        example = uuid.uuid4().hex[:12]
        self.real = self.mount_root / example
        self.model = self.local_root / example
        self.real.mkdir()
        self.model.mkdir()
        # Open descriptors per slot: (real fd, model fd), opened in step.
        self.handles: dict[int, tuple[int, int]] = {}

    def both(self, what: str, operation: Any) -> None:
        """Apply C{operation(root)} to both sides; the outcomes must match."""
        expected = outcome(lambda: operation(self.model))
        actual = outcome(lambda: operation(self.real))
        assert actual == expected, f"{what}: mount {actual!r} != local {expected!r}"

    def both_fd(self, what: str, slot: int, operation: Any) -> None:
        # A slot that is not open stands for any open one.
        real_fd, model_fd = self.handles.get(slot) or next(iter(self.handles.values()))
        expected = outcome(lambda: operation(model_fd))
        actual = outcome(lambda: operation(real_fd))
        assert actual == expected, f"{what}: mount {actual!r} != local {expected!r}"

    # Whole-file operations by path

    @rule(path=st.sampled_from(PATHS), offset=OFFSETS, data=DATA)
    def write_at(self, path: str, offset: int, data: bytes) -> None:
        def op(root: Path) -> int:
            fd = os.open(root / path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                return os.pwrite(fd, data, offset)
            finally:
                os.close(fd)

        self.both(f"write_at({path!r}, {offset}, {len(data)} bytes)", op)

    @rule(path=st.sampled_from(PATHS), data=DATA)
    def create_truncating(self, path: str, data: bytes) -> None:
        def op(root: Path) -> int:
            fd = os.open(root / path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                return os.write(fd, data)
            finally:
                os.close(fd)

        self.both(f"create_truncating({path!r}, {len(data)} bytes)", op)

    @rule(path=st.sampled_from(PATHS), data=DATA)
    def append(self, path: str, data: bytes) -> None:
        def op(root: Path) -> int:
            fd = os.open(root / path, os.O_WRONLY | os.O_APPEND)
            try:
                return os.write(fd, data)
            finally:
                os.close(fd)

        self.both(f"append({path!r}, {len(data)} bytes)", op)

    @rule(path=st.sampled_from(PATHS), size=SIZES)
    def truncate(self, path: str, size: int) -> None:
        self.both(f"truncate({path!r}, {size})", lambda root: os.truncate(root / path, size))

    @rule(path=st.sampled_from(PATHS), data=DATA, size=SIZES)
    def save_then_truncate(self, path: str, data: bytes, size: int) -> None:
        """A truncate right after the close, while the close's commit may be in flight."""

        def op(root: Path) -> bytes:
            fd = os.open(root / path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.truncate(root / path, size)
            return (root / path).read_bytes()

        self.both(f"save_then_truncate({path!r}, {len(data)} bytes, {size})", op)

    @rule(
        path=st.sampled_from(PATHS), data=DATA, modes=st.lists(st.sampled_from(MODES), max_size=2)
    )
    def save_then_chown_chmod(self, path: str, data: bytes, modes: list[int]) -> None:
        """
        pip's and rsync's pattern: attributes changed right after the
        close, while the close's commit (and then the release's) may be in
        flight.
        """

        def op(root: Path) -> tuple[int, int, int]:
            fd = os.open(root / path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            for mode in modes:
                os.chmod(root / path, mode)
            os.chown(root / path, 7, 8)
            info = os.stat(root / path)
            return (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)

        self.both(f"save_then_chown_chmod({path!r}, {len(data)} bytes, {modes})", op)

    @rule(path=st.sampled_from(PATHS))
    def read(self, path: str) -> None:
        self.both(f"read({path!r})", lambda root: (root / path).read_bytes())

    @rule(path=st.sampled_from(PATHS), exclusive=st.booleans())
    def create(self, path: str, exclusive: bool) -> None:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else 0)
        self.both(
            f"create({path!r}, exclusive={exclusive})",
            lambda root: os.close(os.open(root / path, flags, 0o644)),
        )

    # Namespace operations

    @rule(path=st.sampled_from(PATHS))
    def mkdir(self, path: str) -> None:
        self.both(f"mkdir({path!r})", lambda root: os.mkdir(root / path))

    @rule(path=st.sampled_from(PATHS))
    def rmdir(self, path: str) -> None:
        self.both(f"rmdir({path!r})", lambda root: os.rmdir(root / path))

    @rule(path=st.sampled_from(PATHS))
    def unlink(self, path: str) -> None:
        self.both(f"unlink({path!r})", lambda root: os.unlink(root / path))

    @rule(source=st.sampled_from(PATHS), dest=st.sampled_from(PATHS))
    def rename(self, source: str, dest: str) -> None:
        self.both(
            f"rename({source!r}, {dest!r})", lambda root: os.rename(root / source, root / dest)
        )

    @rule(source=st.sampled_from(PATHS), dest=st.sampled_from(PATHS))
    def link(self, source: str, dest: str) -> None:
        self.both(f"link({source!r}, {dest!r})", lambda root: os.link(root / source, root / dest))

    @rule(pointee=st.sampled_from([*NAMES, "a/a", "../a", "missing"]), path=st.sampled_from(PATHS))
    def symlink(self, pointee: str, path: str) -> None:
        self.both(f"symlink({pointee!r}, {path!r})", lambda root: os.symlink(pointee, root / path))

    @rule(path=st.sampled_from(PATHS))
    def readlink(self, path: str) -> None:
        self.both(f"readlink({path!r})", lambda root: os.readlink(root / path))

    @rule(path=st.sampled_from(PATHS), mode=st.sampled_from(MODES))
    def chmod(self, path: str, mode: int) -> None:
        self.both(f"chmod({path!r}, {oct(mode)})", lambda root: os.chmod(root / path, mode))

    # Open descriptors: write, read, fsync and close while the namespace changes

    @precondition(lambda self: len(self.handles) < 2)
    @rule(slot=SLOTS, path=st.sampled_from(PATHS), create=st.booleans())
    def open_file(self, slot: int, path: str, create: bool) -> None:
        slot = slot if slot not in self.handles else 1 - slot
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        model = outcome(lambda: os.open(self.model / path, flags, 0o644))
        real = outcome(lambda: os.open(self.real / path, flags, 0o644))
        for side in (model, real):
            if side[0] == "ok" and (model[0] != "ok" or real[0] != "ok"):
                os.close(side[1])
        assert real[0] == model[0] and (real[0] == "ok" or real == model), (
            f"open({path!r}, create={create}): mount {real!r} != local {model!r}"
        )
        if real[0] == "ok":
            self.handles[slot] = (real[1], model[1])

    @precondition(lambda self: bool(self.handles))
    @rule(slot=SLOTS, offset=OFFSETS, data=DATA)
    def fd_write(self, slot: int, offset: int, data: bytes) -> None:
        self.both_fd(
            f"fd_write(slot {slot}, {offset}, {len(data)} bytes)",
            slot,
            lambda fd: os.pwrite(fd, data, offset),
        )

    @precondition(lambda self: bool(self.handles))
    @rule(slot=SLOTS)
    def fd_read(self, slot: int) -> None:
        self.both_fd(f"fd_read(slot {slot})", slot, lambda fd: os.pread(fd, 200_000, 0))

    @precondition(lambda self: bool(self.handles))
    @rule(slot=SLOTS, size=SIZES)
    def fd_truncate(self, slot: int, size: int) -> None:
        self.both_fd(f"fd_truncate(slot {slot}, {size})", slot, lambda fd: os.ftruncate(fd, size))

    @precondition(lambda self: bool(self.handles))
    @rule(slot=SLOTS)
    def fd_fsync(self, slot: int) -> None:
        self.both_fd(f"fd_fsync(slot {slot})", slot, os.fsync)

    @precondition(lambda self: bool(self.handles))
    @rule(slot=SLOTS)
    def fd_dup_close(self, slot: int) -> None:
        """Close a duplicate of the descriptor, as the shell's C{>} does: a flush, no release."""
        self.both_fd(f"fd_dup_close(slot {slot})", slot, lambda fd: os.close(os.dup(fd)))

    @precondition(lambda self: bool(self.handles))
    @rule(slot=SLOTS)
    def fd_close(self, slot: int) -> None:
        slot = slot if slot in self.handles else next(iter(self.handles))
        self.both_fd(f"fd_close(slot {slot})", slot, os.close)
        del self.handles[slot]

    # After every step

    @invariant()
    def trees_agree(self) -> None:
        actual = tree(self.real)
        expected = tree(self.model)
        assert actual == expected, f"trees differ:\nmount {actual!r}\nlocal {expected!r}"

    def teardown(self) -> None:
        for real_fd, model_fd in self.handles.values():
            for fd in (real_fd, model_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.handles.clear()


class StackTestCase(TestCase):
    """Starts the quickstart stack in setUp; stops it and unmounts in cleanup."""

    def setUp(self) -> None:
        reason = _skip_reason()
        if reason is not None:
            raise SkipTest(reason)
        self.tmp = Path(tempfile.mkdtemp(prefix="svc-mount-model-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.stack = self.tmp / "stack"
        self.addCleanup(self.check_logs)
        self.addCleanup(self.unmount_leftover)
        self.addCleanup(self.quickstart, "stop")
        started = self.quickstart("start")
        self.assertEqual(started.returncode, 0, started.stdout + started.stderr)
        self.state = json.loads((self.stack / "state.json").read_text())
        self.control_url = f"http://127.0.0.1:{self.state['control_port']}"
        self.quickstart_mount = Path(self.state["mount_point"])
        self.assertTrue(os.path.ismount(self.quickstart_mount), started.stdout)

    def quickstart(self, command: str) -> subprocess.CompletedProcess[str]:
        return run_quickstart(command, self.stack, environ=JSON_LOGS)

    def check_logs(self) -> None:
        """Cleanup: the stack's processes and the test's mounts logged JSON lines."""
        check_json_log([*stack_logs(self.stack), *sorted(self.tmp.glob("mount-*.log"))])

    def unmount_leftover(self) -> None:
        for directory in (self.tmp / "stack" / "mnt", self.tmp):
            for path in directory.rglob("*") if directory.exists() else []:
                if path.is_dir() and os.path.ismount(path):
                    subprocess.run(["umount", "-l", str(path)], check=False)


class MountModelTests(StackTestCase):
    """Random operation sequences: the mount behaves like a local directory."""

    def test_random_operations_match_local_directory(self) -> None:
        """Random file operations: same results, errnos and trees on the mount as locally."""
        local = self.tmp / "local"
        local.mkdir()

        for number in SEEDS:
            machine = type(
                f"FileModel{number}",
                (FileModel,),
                {"mount_root": self.quickstart_mount, "local_root": local},
            )
            seed(number)(machine)
            run_state_machine_as_test(
                machine,
                settings=settings(
                    max_examples=EXAMPLES_PER_SEED,
                    stateful_step_count=STEPS_PER_EXAMPLE,
                    deadline=None,
                    derandomize=False,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                ),
            )


class TwoMountsTests(StackTestCase):
    """A second mount of the same allocation and the mount lease."""

    def mount(self, label: str, *, force: bool) -> tuple[subprocess.Popen[bytes], Path, Path]:
        """Start a second twist svc-mount for the demo agent; returns process, point, log."""
        status, minted = http(
            "POST",
            self.control_url + f"/v1/agents/{DEMO_AGENT}/enroll-token",
            {},
            self.state["token"],
        )
        self.assertEqual(status, 200, minted)
        point = self.tmp / f"mnt-{label}"
        point.mkdir()
        log = self.tmp / f"mount-{label}.log"
        environ = {
            **os.environ,
            "SVC_CONTROL_URL": self.control_url,
            "SVC_ENROLL_TOKEN": minted["token"],
            "SVC_MOUNT_POINT": str(point),
            "SVC_CACHE_DIR": str(self.tmp / f"cache-{label}"),
            "SVC_AUDIT_LOG": str(self.tmp / f"audit-{label}.jsonl"),
            **JSON_LOGS,
        }
        environ.pop("SVC_MOUNT_FORCE", None)
        if force:
            environ["SVC_MOUNT_FORCE"] = "1"
        with log.open("wb") as output:
            process = subprocess.Popen(
                [str(BIN / "twist"), "svc-mount"],
                env=environ,
                cwd=ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        self.addCleanup(self.force_down, process, point)
        return process, point, log

    def force_down(self, process: subprocess.Popen[bytes], point: Path) -> None:
        """Cleanup: never leave a mount or a process behind."""
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if os.path.ismount(point):
            subprocess.run(["umount", "-l", str(point)], check=False)

    def test_second_mount_needs_force_and_displaces_the_first(self) -> None:
        """Unforced second mount exits on lease_live; forced one takes over, first gets EROFS."""
        first = self.quickstart_mount
        before = b"written by the first mount before the takeover\n"
        (first / "before.txt").write_bytes(before)
        fd = os.open(first / "before.txt", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

        # Without force: refused, no mount, the log names lease_live.
        process, point, log = self.mount("polite", force=False)
        try:
            process.wait(MOUNT_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.fail(f"the unforced mount kept running; log:\n{log.read_text()}")
        text = log.read_text(errors="replace")
        self.assertFalse(os.path.ismount(point), text)
        self.assertIn("lease_live", text)
        self.assertIn("failed to start", text)
        # The quickstart's mount still writes.
        (first / "still-mine.txt").write_bytes(b"ok\n")

        # With force: the second mount takes over.
        process, point, log = self.mount("force", force=True)
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not os.path.ismount(point):
            if process.poll() is not None or time.monotonic() > deadline:
                self.fail(f"no forced mount; log:\n{log.read_text(errors='replace')}")
            time.sleep(0.2)
        self.assertEqual((point / "before.txt").read_bytes(), before)
        self.assertEqual((point / "still-mine.txt").read_bytes(), b"ok\n")
        (point / "second.txt").write_bytes(b"the second mount writes\n")
        self.assertEqual((point / "second.txt").read_bytes(), b"the second mount writes\n")

        # The first mount is displaced: a write (at the latest its fsync/close) is EROFS.
        def write_on_first() -> None:
            fd = os.open(first / "after.txt", os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.write(fd, b"too late\n")
                os.fsync(fd)
            finally:
                os.close(fd)

        with self.assertRaises(OSError) as raised:
            write_on_first()
        self.assertEqual(raised.exception.errno, errno.EROFS)
        first_log = (self.stack / "mount.log").read_text(errors="replace")
        self.assertIn("read-only", first_log)
        self.assertIn("EROFS", first_log)
        # Once read-only, every further write is refused up front.
        with self.assertRaises(OSError) as again:
            os.mkdir(first / "late-dir")
        self.assertEqual(again.exception.errno, errno.EROFS)
        # Nothing of the refused write reached the allocation.
        self.assertNotIn("after.txt", os.listdir(point))
        self.assertEqual((point / "second.txt").read_bytes(), b"the second mount writes\n")
