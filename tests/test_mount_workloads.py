"""
Acceptance workloads of the mount client through the kernel, on the real
stack: ordinary tools (git, tar, python -m venv) surviving a remount with an
empty cache, small files committed one request each, deduplication of a
large file, a corrupt cache chunk detected and repaired, and the path policy
enforced on real file operations.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from blake3 import blake3

from tests.dataplane_harness import metric_sample
from tests.mount_harness import Mount, MountStackCase, lstat_tree

MIB = 1 << 20
BIG = 256 * MIB


def _wait_for(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _flushes(mount: Mount, name: str) -> list[dict[str, Any]]:
    """The mount's C{flush} audit lines about C{name} that carry chunk counts."""
    return [
        line
        for line in mount.audit_lines()
        if line["event"] == "flush" and line["path"].lstrip("/") == name and "chunks_new" in line
    ]


def _write_pseudo_random(path: Path, seed: bytes, size: int) -> None:
    """C{size} bytes of BLAKE3 XOF output of C{seed}, written in 1 MiB blocks."""
    xof = blake3(seed)
    with path.open("wb") as handle:
        for offset in range(0, size, MIB):
            handle.write(xof.digest(length=MIB, seek=offset))


def _without_directory_sizes(tree: dict[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
    return {
        rel: (mode, None if stat.S_ISDIR(mode) else size, mtime, content)
        for rel, (mode, size, mtime, content) in tree.items()
    }


def _drop_page_cache() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


class ToolsRemountTests(MountStackCase):
    """git, tar and venv through the mount; a remount with an empty cache shows it all."""

    def _make_tarball(self) -> Path:
        source = self.tmp / "tree"
        (source / "bin").mkdir(parents=True)
        (source / "data" / "deep").mkdir(parents=True)
        script = source / "bin" / "run.sh"
        script.write_text("#!/bin/sh\necho run\n")
        script.chmod(0o755)
        secret = source / "data" / "private.txt"
        secret.write_text("only me\n")
        secret.chmod(0o600)
        (source / "data" / "deep" / "blob.bin").write_bytes(os.urandom(1_500_000))
        (source / "data" / "empty").write_bytes(b"")
        (source / "link-to-script").symlink_to("bin/run.sh")
        for index, path in enumerate(sorted(source.rglob("*"), reverse=True)):
            os.utime(path, (1_600_000_000 + index, 1_600_000_000 + index), follow_symlinks=False)
        tarball = self.tmp / "tree.tar"
        with tarfile.open(tarball, "w") as archive:
            archive.add(source, arcname="tree")
        return source

    def test_git_tar_venv_survive_remount_with_empty_cache(self) -> None:
        """git/tar/venv output is byte- and lstat-identical after a fresh-cache remount."""
        source = self._make_tarball()
        first = self.mount()
        git = "git -c user.name=Test -c user.email=test@example.invalid"
        self.sh(
            f"mkdir repo && cd repo && git init -q && printf 'one\\n' > a.txt && "
            f"mkdir sub && printf 'two\\n' > sub/b.txt && {git} add -A && "
            f"{git} commit -q -m first && printf 'three\\n' >> a.txt && "
            f"{git} commit -q -am second",
            first,
        )
        self.sh(f"tar xf {self.tmp / 'tree.tar'}", first)
        self.sh(f"{sys.executable} -m venv --without-pip venv", first)

        # tar x reproduces the tree (directory sizes are file-system specific).
        extracted = _without_directory_sizes(lstat_tree(self.mount_point / "tree"))
        self.maxDiff = None
        self.assertEqual(extracted, _without_directory_sizes(lstat_tree(source)))
        before = lstat_tree(self.mount_point)
        self.assertIn("repo/.git/HEAD", before)
        self.assertIn("venv/pyvenv.cfg", before)
        self.assertTrue(stat.S_ISLNK(before["venv/bin/python"][0]))
        self.unmount(first)

        second = self.mount()
        self.assertNotEqual(second.cache, first.cache)
        after = lstat_tree(self.mount_point)
        self.assertEqual(sorted(after), sorted(before))
        for rel in sorted(before):
            self.assertEqual(after[rel], before[rel], rel)
        self.sh("cd repo && git fsck --full --strict", second)
        log = self.sh("cd repo && git log --format=%s", second)
        self.assertEqual(log.split(), ["second", "first"])
        self.assertEqual(
            self.sh("./venv/bin/python -c 'import sys; print(sys.prefix)'", second).strip(),
            str(self.mount_point / "venv"),
        )


class TimesRemountTests(MountStackCase):
    """The times a stat shows right after a close are, once committed, the stored ones."""

    def test_stat_during_commit_is_not_kept_by_the_kernel(self) -> None:
        """
        A stat of a new file and its directory right after each close (its
        commit handed off, so likely still in flight) caches attributes in
        the kernel; once the commits are answered the mount shows the data
        plane's times, which a fresh-cache remount shows too.
        """
        first = self.mount()
        directory = self.mount_point / "d"
        directory.mkdir()
        names = [f"f{index}" for index in range(30)]
        for name in names:
            (directory / name).write_bytes(b"x" * 4096)
            os.lstat(directory / name)
            os.lstat(directory)
        _wait_for("every commit", lambda: all(_flushes(first, f"d/{name}") for name in names))
        time.sleep(1.0)  # the kernel's invalidations are queued to llfuse's own thread

        def times() -> dict[str, tuple[int, int]]:
            found = {}
            for path in [directory] + [directory / name for name in names]:
                st = os.lstat(path)
                found[path.name] = (st.st_mtime_ns, st.st_ctime_ns)
            return found

        before = times()
        self.unmount(first)
        self.mount()
        self.assertEqual(times(), before)


class ModesAfterCloseTests(MountStackCase):
    """Modes and times set right after a close survive a remount (pip, rsync)."""

    def test_chmod_after_close_and_rsync_style_saves(self) -> None:
        """
        pip's pattern (write, close, chmod) and rsync's (write a temporary
        name, close, reopen, fchmod, rename over) leave every mode, mtime
        and byte on the data plane, as a fresh-cache remount shows.
        """
        first = self.mount()
        directory = self.mount_point / "pkg"
        directory.mkdir()
        for index in range(40):
            path = directory / f"script{index}"
            path.write_bytes(f"#!/bin/sh\necho {index}\n".encode())
            path.chmod(0o755 if index % 2 else 0o700)
        for index in range(40):
            temp = directory / f".saved{index}.tmp"
            temp.write_bytes(b"saved %d\n" % index)
            with temp.open("rb") as handle:
                os.fchmod(handle.fileno(), 0o640)
            os.utime(temp, ns=(1_700_000_000_000_000_000, 1_600_000_000_000_000_000 + index))
            temp.rename(directory / f"saved{index}")
        before = lstat_tree(directory)
        self.unmount(first)
        self.mount()
        after = lstat_tree(directory)
        self.assertEqual(after, before)
        self.assertEqual(stat.S_IMODE(after["script1"][0]), 0o755)
        self.assertEqual(stat.S_IMODE(after["script2"][0]), 0o700)
        self.assertEqual(stat.S_IMODE(after["saved3"][0]), 0o640)
        self.assertEqual(after["saved3"][2], 1_600_000_000_000_000_003)


class SmallFileCommitTests(MountStackCase):
    """A small file's close reaches the data plane as one request."""

    def requests(self, op: str) -> float:
        """How many C{op} requests the data plane has answered."""
        exposition = self.dataplane_metrics()
        found = metric_sample(exposition, "svc_dataplane_op_duration_seconds_count", op=op)
        return found or 0.0

    def test_each_small_file_is_one_manifest_put_with_its_chunk(self) -> None:
        """
        Twenty small files are twenty C{manifest_put}s carrying their chunks
        (each stored, no C{chunk_put} request), and read back intact after a
        fresh-cache remount, in two C{list} requests.
        """
        first = self.mount()
        puts, uploads = self.requests("manifest_put"), self.requests("chunk_put")
        cached = self.chunk_counter("cached")
        contents = {f"s{index}": blake3(b"%d" % index).digest(length=3000) for index in range(20)}
        for name, content in contents.items():
            (self.mount_point / name).write_bytes(content)
        _wait_for("every commit", lambda: all(_flushes(first, name) for name in contents))
        self.assertEqual(self.requests("chunk_put") - uploads, 0)
        self.assertEqual(self.requests("manifest_put") - puts, len(contents))
        self.assertEqual(self.chunk_counter("cached") - cached, len(contents))
        self.assertEqual({_flushes(first, name)[0]["chunks_new"] for name in contents}, {1})
        self.unmount(first)
        self.mount()
        gets, fetches = self.requests("manifest_get"), self.requests("chunk_get")
        lists = self.requests("list")
        for name, content in contents.items():
            self.assertEqual((self.mount_point / name).read_bytes(), content)
        # On the fresh cache the first lookup listed the directory with the
        # files' chunk lists, and the first open fetched every file's bytes
        # in one more list page.
        self.assertEqual(self.requests("list") - lists, 2)
        self.assertEqual(self.requests("manifest_get") - gets, 0)
        self.assertEqual(self.requests("chunk_get") - fetches, 0)


class RemoveTreeTests(MountStackCase):
    """C{rm -r} through the real mount, its unlinks handed off."""

    def test_removed_tree_is_gone_after_a_remount(self) -> None:
        """
        C{rm -r} of 90 files in three directories succeeds; every C{unlink}
        line says allowed (written when its answer came); after a
        fresh-cache remount the tree is gone and its neighbour intact.
        """
        first = self.mount()
        tree = self.mount_point / "tree"
        for directory in range(3):
            (tree / f"d{directory}").mkdir(parents=True)
            for index in range(30):
                (tree / f"d{directory}" / f"f{index}").write_bytes(b"%d" % index)
        (self.mount_point / "kept").write_bytes(b"kept")
        subprocess.run(["rm", "-r", str(tree)], check=True)
        self.assertFalse(tree.exists())
        self.unmount(first)  # waits for every answer
        unlinks = [line for line in first.audit_lines() if line["event"] == "unlink"]
        self.assertEqual(len(unlinks), 90)
        self.assertTrue(
            all(line["allowed"] for line in unlinks), [u for u in unlinks if not u["allowed"]]
        )
        self.mount()
        self.assertFalse(tree.exists())
        self.assertEqual((self.mount_point / "kept").read_bytes(), b"kept")


class DedupTests(MountStackCase):
    """Content-defined chunking deduplicates through the real mount."""

    def test_second_copy_sends_no_chunks_and_a_small_edit_few(self) -> None:
        """A 256 MiB copy uploads no new chunk; a 1 MiB edit in the middle at most 3."""
        mount = self.mount()
        cached_0 = self.chunk_counter("cached")
        deduped_0 = self.chunk_counter("deduped")

        _write_pseudo_random(self.mount_point / "one.bin", b"dedup seed", BIG)
        (first,) = _wait_for("one.bin's flush", lambda: _flushes(mount, "one.bin"))
        self.assertTrue(first["allowed"], first)
        self.assertEqual(first["size"], BIG, first)
        self.assertGreater(first["chunks_new"], 0, first)
        total = first["chunks_new"] + first["chunks_reused"]
        cached_1 = self.chunk_counter("cached")
        self.assertEqual(cached_1 - cached_0, first["chunks_new"])

        _write_pseudo_random(self.mount_point / "two.bin", b"dedup seed", BIG)
        (second,) = _wait_for("two.bin's flush", lambda: _flushes(mount, "two.bin"))
        self.assertTrue(second["allowed"], second)
        self.assertEqual(second["chunks_new"], 0, second)
        self.assertEqual(second["chunks_reused"], total, second)
        # Nothing new was stored; a chunk the client sent anyway would count as deduped.
        cached_2 = self.chunk_counter("cached")
        deduped_2 = self.chunk_counter("deduped")
        self.assertEqual(cached_2, cached_1)
        self.assertGreaterEqual(deduped_2, deduped_0)

        patch = blake3(b"patch").digest(length=MIB)
        with (self.mount_point / "two.bin").open("r+b") as handle:
            handle.seek(BIG // 2)
            handle.write(patch)
        edits = _wait_for("two.bin's second flush", lambda: _flushes(mount, "two.bin")[1:])
        self.assertEqual(len(edits), 1, edits)
        self.assertLessEqual(edits[0]["chunks_new"], 3, edits[0])
        self.assertGreater(edits[0]["chunks_new"], 0, edits[0])
        self.assertEqual(self.chunk_counter("cached") - cached_2, edits[0]["chunks_new"])
        with (self.mount_point / "two.bin").open("rb") as handle:
            handle.seek(BIG // 2 - MIB)
            around = handle.read(3 * MIB)
        xof = blake3(b"dedup seed")
        self.assertEqual(
            around,
            xof.digest(length=MIB, seek=BIG // 2 - MIB)
            + patch
            + xof.digest(length=MIB, seek=BIG // 2 + MIB),
        )


class CacheCorruptionTests(MountStackCase):
    """A corrupt chunk in the local cache is detected, dropped and fetched again."""

    def test_flipped_byte_in_cached_chunk_is_refetched_and_audited_once(self) -> None:
        """A flipped cached chunk byte: correct re-read, exactly one cache_corrupt line."""
        data = os.urandom(512 * 1024)  # below the chunker's minimum: exactly one chunk
        digest = blake3(data).hexdigest()
        first = self.mount()
        (self.mount_point / "c.bin").write_bytes(data)
        self.assertEqual((self.mount_point / "c.bin").read_bytes(), data)
        chunk_file = first.cache / "chunks" / digest[:2] / digest
        _wait_for(f"the cached chunk {chunk_file}", chunk_file.exists)
        # The mount keeps recently read chunks in memory (mount-fs.md), so
        # dropping the page cache is not enough: remount on the same cache.
        self.unmount(first)
        cached = bytearray(chunk_file.read_bytes())
        self.assertEqual(bytes(cached), data)
        cached[len(cached) // 2] ^= 0xFF
        chunk_file.write_bytes(bytes(cached))

        mount = self.mount(cache=first.cache)
        self.assertEqual((self.mount_point / "c.bin").read_bytes(), data)

        def corrupt_lines() -> list[dict[str, Any]]:
            return [line for line in mount.audit_lines() if line["event"] == "cache_corrupt"]

        _wait_for("a cache_corrupt line", corrupt_lines)
        _drop_page_cache()
        self.assertEqual((self.mount_point / "c.bin").read_bytes(), data)
        time.sleep(0.5)  # a second line would have been written by now
        corrupt = corrupt_lines()
        self.assertEqual(len(corrupt), 1, corrupt)
        self.assertEqual(corrupt[0]["path"], digest)
        self.assertFalse(corrupt[0]["allowed"])
        self.assertIsNone(corrupt[0]["command"])
        self.assertEqual(corrupt[0]["size"], len(data))
        # The refetched chunk is cached again with the right bytes (or not at all).
        if chunk_file.exists():
            self.assertEqual(blake3(chunk_file.read_bytes()).hexdigest(), digest)


class PolicyTests(MountStackCase):
    """The client path policy (SVC_POLICY_FILE) on real file operations."""

    def setUp(self) -> None:
        super().setUp()
        seed = self.mount()
        (self.mount_point / "docs").mkdir()
        (self.mount_point / "docs" / "a.md").write_text("doc\n")
        (self.mount_point / "keys").mkdir()
        (self.mount_point / "keys" / "x.secret").write_text("secret\n")
        (self.mount_point / "other.txt").write_text("other\n")
        self.unmount(seed)

    def assertDenied(self, mount: Mount, name: str) -> None:
        """An audit line about C{name} with C{allowed: false}."""
        denied = _wait_for(
            f"an allowed: false line about {name}",
            lambda: [
                line
                for line in mount.audit_lines()
                if line["allowed"] is False and line["path"].lstrip("/") == name
            ],
        )
        self.assertTrue(denied)

    def test_deny_glob(self) -> None:
        """A deny glob makes read/create of matches EACCES, audited allowed: false."""
        mount = self.mount({"deny": ["*.secret"]})
        with self.assertRaises(PermissionError):
            (self.mount_point / "keys" / "x.secret").read_text()
        self.assertDenied(mount, "keys/x.secret")
        with self.assertRaises(PermissionError):
            (self.mount_point / "new.secret").write_text("no\n")
        self.assertDenied(mount, "new.secret")
        with self.assertRaises(PermissionError):  # a lookup is refused too, not ENOENT
            os.lstat(self.mount_point / "new.secret")
        self.assertNotIn("x.secret", os.listdir(self.mount_point / "keys"))
        self.assertEqual((self.mount_point / "docs" / "a.md").read_text(), "doc\n")
        (self.mount_point / "docs" / "b.md").write_text("fine\n")
        self.assertEqual((self.mount_point / "docs" / "b.md").read_text(), "fine\n")

    def test_allow_list(self) -> None:
        """An allow list makes paths outside it EACCES, audited allowed: false."""
        mount = self.mount({"allow": ["docs/**"]})
        with self.assertRaises(PermissionError):
            (self.mount_point / "other.txt").read_text()
        self.assertDenied(mount, "other.txt")
        with self.assertRaises(PermissionError):
            (self.mount_point / "outside.txt").write_text("no\n")
        self.assertDenied(mount, "outside.txt")
        self.assertEqual((self.mount_point / "docs" / "a.md").read_text(), "doc\n")
        (self.mount_point / "docs" / "c.md").write_text("inside\n")
        self.assertEqual((self.mount_point / "docs" / "c.md").read_text(), "inside\n")

    def test_readonly(self) -> None:
        """readonly refuses every write with EROFS or EACCES, audited allowed: false; reads work."""
        mount = self.mount({"readonly": True})
        self.assertEqual((self.mount_point / "docs" / "a.md").read_text(), "doc\n")
        attempts = {
            "docs/a.md": lambda: (self.mount_point / "docs" / "a.md").write_text("changed\n"),
            "new.txt": lambda: (self.mount_point / "new.txt").write_text("no\n"),
            "newdir": (self.mount_point / "newdir").mkdir,
            "other.txt": (self.mount_point / "other.txt").unlink,
        }
        for name, attempt in attempts.items():
            with self.assertRaises(OSError) as caught:
                attempt()
            self.assertIn(caught.exception.errno, (errno.EROFS, errno.EACCES), name)
            self.assertDenied(mount, name)
        self.assertEqual((self.mount_point / "docs" / "a.md").read_text(), "doc\n")
        self.assertEqual((self.mount_point / "other.txt").read_text(), "other\n")
        self.assertFalse((self.mount_point / "newdir").exists())
