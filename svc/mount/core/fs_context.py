"""
What the filesystem core's operations share: the injected world (remote,
chunk source, worker, clock, audit emitter, policy, spill directory), the
caches (inode table, open files, chunk memo), read-only mode, and the small
checks every operation starts with (inode lookup, name decoding, path
policy, read-only mode).
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from svc.audit.events import AuditEvent
from svc.mount.chunks.chunk_memo import DEFAULT_MEMO_BYTES, ChunkMemo
from svc.mount.chunks.inline_reads import InlineReads
from svc.mount.core.attributes import NAME_MAX, Attributes, FileKind, QuotaReport
from svc.mount.core.client_audit import ClientAudit
from svc.mount.core.errors import FSError, RemoteFailure
from svc.mount.core.inodes import InodeTable, Node
from svc.mount.core.namespace_lock import NamespaceLock
from svc.mount.core.open_files import OpenFiles
from svc.mount.core.spill import DEFAULT_MEMORY_BYTES, DEFAULT_MEMORY_FILE_BYTES, SpillDirectory
from svc.mount.outbox.outbox import Outbox
from svc.mount.remote.data_plane import IChunkSource, Remote
from svc.mount.remote.quota_room import QuotaRoom
from svc.mount.remote.write_leases import WriteLeases
from svc.mount.writeback.unsent import UnsentFiles
from svc.mount.writeback.uploads import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_INLINE_MAX_BYTES,
    DEFAULT_PROBE_MIN_BYTES,
)
from svc.mount.writeback.write_behind import DEFAULT_FILES, DEFAULT_LEAD_BYTES, Slots
from svc.policy import UNRESTRICTED, PathPolicy
from svc.timers import TimerClock
from svc.wire.errno import WireErrno
from svc.wire.messages import MAX_NAME_BYTES, MAX_PATH_BYTES
from svc.worker import IWorker

_log = Logger()

T = TypeVar("T")

FENCED_REASONS = frozenset({"fenced", "unknown_or_wrong_holder"})
"""C{EPERM} session refusals meaning this mount's lease is gone."""

DEFAULT_INLINE_READ_BYTES = 64 << 10
"""An open that asks for a file's chunk list asks for its bytes too when the
file holds at most this many (``docs/specifications/mount-fs.md`` section 6)."""


@attrs.frozen
class FSSettings:
    """Tunables of the filesystem core."""

    memo_bytes: int = DEFAULT_MEMO_BYTES
    batch_bytes: int = DEFAULT_BATCH_BYTES
    probe_min_bytes: int = DEFAULT_PROBE_MIN_BYTES
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES
    """New-chunk bytes a commit carries in its C{manifest_put} (0: none)."""
    inline_read_bytes: int = DEFAULT_INLINE_READ_BYTES
    """Largest file whose chunks an open asks to come with its C{manifest_get} (0: none)."""
    memory_spill_file_bytes: int = DEFAULT_MEMORY_FILE_BYTES
    memory_spill_bytes: int = DEFAULT_MEMORY_BYTES
    max_cas_retries: int = 3
    write_behind_files: int = DEFAULT_FILES
    """Files whose write-behind may run at once (0 turns write-behind off)."""
    write_behind_lead_bytes: int = DEFAULT_LEAD_BYTES
    """How far a new file must extend past a write-behind cut's window before the cut."""
    write_leases: bool = True
    """Whether files opened for writing take their path's data-plane write
    lease (``docs/specifications/mount-consistency.md`` section 6)."""
    durable_close: bool = False
    """Whether C{close} (FUSE C{flush}) waits for its commit's answer, and
    C{unlink}, C{rmdir} and C{rename} for their own; by default they may
    return once the request is sent, and C{fsync} is the durability point
    (``docs/specifications/mount-consistency.md`` sections 2.5 and 2.6)."""


DEFAULT_SETTINGS = FSSettings()
"""The default tunables."""


def decode_name(raw: bytes) -> str:
    """
    A name component from the kernel as the data plane stores it (UTF-8).

    @raise FSError: ENAMETOOLONG over L{NAME_MAX} bytes; EINVAL for an
        empty name, one with C{/} or NUL, or one that is not UTF-8 (the
        data plane cannot store it).
    """
    if len(raw) > NAME_MAX:
        raise FSError(errno.ENAMETOOLONG, "name longer than 255 bytes")
    if raw in (b"", b".", b"..") or b"/" in raw or b"\x00" in raw:
        raise FSError(errno.EINVAL, f"bad name {raw!r}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FSError(errno.EINVAL, f"name {raw!r} is not UTF-8") from None


def audit_name(raw: bytes) -> str:
    """A name for audit lines: non-UTF-8 bytes as surrogate escapes."""
    return raw.decode("utf-8", "surrogateescape")


def path_too_long(server_path: str) -> str | None:
    """
    Why the data plane would refuse C{server_path} as too long, counted as
    it counts (``mount-fs.md`` section 2): more than L{MAX_PATH_BYTES} UTF-8
    bytes in all, or a component over L{MAX_NAME_BYTES}; C{None} when it fits.
    """
    encoded = server_path.encode("utf-8", "surrogateescape")
    if len(encoded) > MAX_PATH_BYTES:
        return f"data-plane path of {len(encoded)} bytes (at most {MAX_PATH_BYTES})"
    if any(len(part) > MAX_NAME_BYTES for part in encoded.split(b"/")):
        return f"a name longer than {MAX_NAME_BYTES} bytes"
    return None


def join(rel: str, name: str) -> str:
    """The mount-relative path of C{name} in directory C{rel}."""
    return f"{rel}/{name}" if rel else name


class FSContext:
    """See the module docstring."""

    def __init__(
        self,
        *,
        remote: Remote,
        chunks: IChunkSource,
        agent_id: str,
        session_id: str | None,
        spill_dir: Path,
        worker: IWorker,
        now: Callable[[], float],
        emit: Callable[[AuditEvent], object],
        policy: PathPolicy = UNRESTRICTED,
        quota: Callable[[], Deferred[QuotaReport]] | None = None,
        invalidate: Callable[[int], object] = lambda ino: None,
        invalidate_entry: Callable[[int, bytes], object] = lambda parent, name: None,
        forget_attributes: Callable[[int], object] = lambda ino: None,
        connected: Callable[[], bool] = lambda: True,
        clock: TimerClock,
        settings: FSSettings | None = None,
        spill_worker: IWorker | None = None,
        unsent_dir: Path | None = None,
        outbox: Outbox | None = None,
    ) -> None:
        self.remote = remote
        self.outbox = outbox
        """Where the commits of closes that return before their answer are
        recorded first (L{svc.mount.outbox}); L{None}: nowhere (such a
        commit is lost if the mount dies before it is answered)."""
        self.chunks = chunks
        self.disk = "/" + agent_id
        self.session_id = session_id
        self.settings = settings if settings is not None else DEFAULT_SETTINGS
        self.spill = SpillDirectory(
            spill_dir,
            memory_file_bytes=self.settings.memory_spill_file_bytes,
            memory_bytes=self.settings.memory_spill_bytes,
        )
        self.worker = worker
        self.spill_worker = worker if spill_worker is None else spill_worker
        self.unsent = UnsentFiles(unsent_dir, self.spill_worker, now)
        self.now = now
        self.audit = ClientAudit(emit, now)
        self.policy = policy
        self.quota = quota
        # Refuses nothing until MountFS gives it a quota source.
        self.quota_room = QuotaRoom(None, lambda: succeed(None))
        self.invalidate = invalidate
        self.invalidate_entry = invalidate_entry
        self.forget_attributes = forget_attributes
        self.connected = connected
        self.clock = clock
        self.files = OpenFiles()
        self.write_behind_slots = Slots(self.settings.write_behind_files)
        self.memo = ChunkMemo(chunks, self.settings.memo_bytes)
        self.inline_reads = InlineReads(self.settings.inline_read_bytes)
        self.namespace_lock = NamespaceLock()
        self.read_only_reason: str | None = None
        self.leases = WriteLeases(remote, clock, lambda: self.session_id)
        self._table: InodeTable | None = None

    # Set-up

    def started(self, root: Attributes) -> None:
        """The disk root's attributes are known: build the inode table."""
        self._table = InodeTable(root, pinned=lambda ino: self.files.state(ino) is not None)

    @property
    def table(self) -> InodeTable:
        """The inode table (after L{started})."""
        if self._table is None:
            raise FSError(errno.EIO, "the filesystem is not started")
        return self._table

    # Values

    def server_path(self, rel: str) -> str:
        """The data-plane path of mount-relative C{rel}."""
        return f"{self.disk}/{rel}" if rel else self.disk

    def now_ns(self) -> int:
        """The time now, in nanoseconds since the epoch."""
        return int(self.now() * 1_000_000_000)

    def write_session(self) -> str | None:
        """The session id for write events and write requests."""
        return self.session_id

    # Nodes and paths

    def node(self, ino: int) -> Node:
        """The node C{ino} (ENOENT if unknown)."""
        return self.table.require(ino)

    def directory(self, ino: int) -> Node:
        """The directory C{ino} (ENOTDIR if it is not one)."""
        node = self.node(ino)
        if node.kind is not FileKind.DIR:
            raise FSError(errno.ENOTDIR, f"inode {ino} is not a directory")
        return node

    def forget_listing(self, folder: Node, name: str) -> None:
        """
        Forget C{folder} as listed (no longer complete, attributes stale,
        the kernel's attributes and its entry C{name} dropped): the next
        lookup or listing there asks the server.
        """
        folder.complete = False
        folder.stale = True
        self.invalidate(folder.ino)
        self.invalidate_entry(folder.ino, name.encode("utf-8", "surrogateescape"))

    def rel_of(self, node: Node) -> str:
        """The mount-relative path of C{node} (ENOENT once unlinked)."""
        rel = self.table.path_of(node)
        if rel is None:
            raise FSError(errno.ENOENT, f"inode {node.ino} has no name")
        return rel

    def attributes(self, node: Node) -> Attributes:
        """
        C{node}'s attributes, with an open file's local size and mtime (and
        a ctime no older than that mtime: POSIX changes both with the data).
        """
        attributes = node.attributes
        state = self.files.state(node.ino)
        if state is not None and state.dirty:
            mtime_ns = state.mtime_ns if state.mtime_ns is not None else attributes.mtime_ns
            attributes = attrs.evolve(
                attributes,
                size=state.size,
                mtime_ns=mtime_ns,
                ctime_ns=max(attributes.ctime_ns, mtime_ns),
            )
        return attributes

    async def fresh(self, node: Node) -> Attributes:
        """L{attributes}, fetched again first if they are stale."""
        if node.stale:
            rel = self.table.path_of(node)
            if rel is not None:
                node.set_attributes(await self.remote.head_file(self.server_path(rel)))
            else:
                node.stale = False
        return self.attributes(node)

    # Checks

    def check_read(self, rel: str, directory: bool) -> None:
        """EACCES when the policy refuses to read (or, for a directory, traverse) C{rel}."""
        decision = (
            self.policy.check_traverse(rel) if directory else self.policy.check(rel, write=False)
        )
        if not decision.allowed:
            raise FSError(errno.EACCES, f"policy refuses {rel!r}: {decision.reason}")

    def check_write(self, rel: str) -> None:
        """
        ENAMETOOLONG when C{rel}'s data-plane path is longer than the data
        plane takes (L{path_too_long}); EROFS in read-only mode; EACCES when
        the policy refuses a write to C{rel}.
        """
        too_long = path_too_long(self.server_path(rel))
        if too_long is not None:
            raise FSError(errno.ENAMETOOLONG, f"{rel!r}: {too_long}")
        if self.read_only_reason is not None:
            raise FSError(errno.EROFS, f"read-only: {self.read_only_reason}")
        decision = self.policy.check(rel, write=True)
        if not decision.allowed:
            raise FSError(errno.EACCES, f"policy refuses writing {rel!r}: {decision.reason}")

    def check_subtree_move(self, rel: str, to_rel: str) -> None:
        """
        EACCES when the policy refuses to move a directory from C{rel} to
        C{to_rel} with everything below it, as the server does.
        """
        decision = self.policy.check_subtree_move(rel, to_rel)
        if not decision.allowed:
            raise FSError(
                errno.EACCES, f"policy refuses moving {rel!r} to {to_rel!r}: {decision.reason}"
            )

    # Read-only mode

    def set_read_only(self, reason: str) -> None:
        """Refuse every write from now on (EROFS); logged once."""
        if self.read_only_reason is None:
            self.read_only_reason = reason
            _log.warn(
                "mount is now read-only ({reason}); every write fails with EROFS",
                reason=reason,
            )

    async def await_write(self, request: Awaitable[T]) -> T:
        """Await a write request; a refused session becomes EROFS (read-only)."""
        try:
            return await request
        except RemoteFailure as failure:
            raise self.write_failed(failure) from None

    def write_failed(self, failure: RemoteFailure) -> FSError:
        """
        The error to raise for a failed write request: a refused session
        (this mount was displaced) switches to read-only mode and is EROFS.
        """
        if failure.wire is WireErrno.EPERM and failure.details.get("reason") in FENCED_REASONS:
            reason = failure.details["reason"]
            self.set_read_only(f"the data plane refused the mount session ({reason})")
            return FSError(errno.EROFS, failure.message)
        return failure
