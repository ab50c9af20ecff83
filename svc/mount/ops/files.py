"""
The file operations of the filesystem core up to the close: create, open,
read and truncate (``docs/specifications/mount-consistency.md``). Writes
are L{svc.mount.ops.file_writes}; closing and releasing, L{svc.mount.ops.file_closes};
the write-back that commits an open file's changes,
L{svc.mount.writeback.file_write_back}.

A file created in a complete directory is I{pending} (known to this mount
only) until its first write-back commits it with C{expected_version} 0, or
an operation that needs it on the data plane creates it first
(L{svc.mount.ops.node_creation.NodeCreation.materialize}).
"""

from __future__ import annotations

import errno
import os
import stat

from twisted.logger import Logger

from svc.audit.events import CallerProcess
from svc.audit.names import EventName
from svc.mount.core.attributes import AttributeChanges, Attributes, Entry, FileKind, OpenResult
from svc.mount.core.errors import FSError, RemoteFailure
from svc.mount.core.extents import chunk_layout
from svc.mount.core.file_state import FileState
from svc.mount.core.fs_context import FSContext, audit_name, decode_name, join
from svc.mount.core.inodes import Node
from svc.mount.core.open_files import Handle
from svc.mount.ops.file_closes import FileCloses
from svc.mount.ops.file_writes import FileWrites
from svc.mount.ops.listings import Listings, lacks_bytes
from svc.mount.ops.namespace_reads import NamespaceReads
from svc.mount.ops.node_creation import NodeCreation, new_mode, new_owner
from svc.mount.remote.namespace_hand_off import settled_at
from svc.mount.writeback.file_write_back import WriteBack
from svc.mount.writeback.kept_chunks import KeptChunks

_log = Logger()


def _writable(flags: int) -> bool:
    return flags & os.O_ACCMODE != os.O_RDONLY


class FileOps:
    """See the module docstring."""

    def __init__(
        self,
        context: FSContext,
        reads: NamespaceReads,
        creation: NodeCreation,
        write_back: WriteBack,
        closes: FileCloses,
        writes: FileWrites,
        kept: KeptChunks,
        listings: Listings,
    ) -> None:
        self._ctx = context
        self._kept = kept
        self._listings = listings
        self._reads = reads
        self._creation = creation
        self._write_back = write_back
        self._closes = closes
        self._writes = writes

    async def create(
        self, parent: int, name: bytes, mode: int, flags: int, caller: CallerProcess
    ) -> tuple[OpenResult, Entry]:
        """
        Create regular file C{name} in C{parent} and open it. Without
        C{O_EXCL}, a name that turns out to exist (the data plane has it,
        in a directory the mount has not listed whole: a create whose
        answer was lost with the connection, say) is opened instead, as
        the kernel would have opened it had its lookup found it.
        """
        try:
            return await self._create(parent, name, mode, flags, caller)
        except FSError as error:
            if error.errno != errno.EEXIST or flags & os.O_EXCL:
                raise
        entry = await self._reads.lookup(parent, name, caller)
        return await self.open(entry.ino, flags, caller), entry

    async def _create(
        self, parent: int, name: bytes, mode: int, flags: int, caller: CallerProcess
    ) -> tuple[OpenResult, Entry]:
        ctx = self._ctx
        await settled_at(ctx, parent, name)
        # The name is free (checked below), so no commit in flight is about it.
        async with ctx.namespace_lock.beside_commits():
            directory = ctx.directory(parent)
            rel = join(ctx.rel_of(directory), audit_name(name))
            with ctx.audit.line(
                EventName.CREATE,
                rel,
                caller,
                session_id=ctx.write_session(),
                mode=stat.S_IMODE(mode),
            ):
                decoded = decode_name(name)
                ctx.check_write(rel)
                if ctx.table.child(directory, decoded) is not None:
                    raise FSError(errno.EEXIST, f"{rel!r} exists")
                if directory.complete:
                    node = ctx.table.add_pending(
                        directory, decoded, self._new_file(mode, caller, directory)
                    )
                else:
                    node = await self._creation.make_node(
                        directory, rel, decoded, FileKind.FILE, mode, 0, caller
                    )
        handle = ctx.files.open(self._new_state(node), _writable(flags))
        state = handle.state
        node.kernel_version = state.version
        ctx.table.looked_up(node)
        if handle.writable:
            self._writes.offer_first_grant(state)
        return OpenResult(handle.fh, keep_cache=False), Entry(node.ino, ctx.attributes(node))

    def _new_file(self, mode: int, caller: CallerProcess, directory: Node) -> Attributes:
        """The attributes of a pending file until its first commit."""
        now = self._ctx.now_ns()
        uid, gid = new_owner(caller, directory)
        return Attributes(
            server_inode=0,
            kind=FileKind.FILE,
            mode=new_mode(mode, directory, FileKind.FILE),
            uid=uid,
            gid=gid,
            size=0,
            mtime_ns=now,
            atime_ns=now,
            ctime_ns=now,
            version=0,
            nlink=1,
        )

    async def open(self, ino: int, flags: int, caller: CallerProcess) -> OpenResult:
        """
        Open regular file C{ino}. An inode the kernel still names but this
        mount no longer does (an outside change made it forget the name,
        and the kernel's entry had not been dropped yet) is C{ESTALE}: the
        kernel then looks the path up again and opens what it names now.
        """
        ctx = self._ctx
        node = ctx.node(ino)
        rel = ctx.table.path_of(node)
        state = ctx.files.state(ino)
        if rel is None and state is None:
            raise FSError(errno.ESTALE, f"inode {ino} has no name here any more")
        writable = _writable(flags)
        with ctx.audit.line(EventName.OPEN, rel or "", caller) as line:
            if node.kind is FileKind.DIR:
                raise FSError(errno.EISDIR, "open of a directory")
            if node.kind is not FileKind.FILE:
                raise FSError(errno.EINVAL, "open of a special file")
            if writable:
                if rel is None:
                    if ctx.read_only_reason is not None:
                        raise FSError(errno.EROFS, f"read-only: {ctx.read_only_reason}")
                else:
                    ctx.check_write(rel)
            elif rel is not None:
                ctx.check_read(rel, directory=False)
            if state is None:
                assert rel is not None
                state = await self._load_state(node, rel, fetch_bytes=not writable)
            handle = ctx.files.open(state, writable)
            state = handle.state  # one opened meanwhile on a FUSE thread, perhaps
            if writable:
                self._ask_write_lease(node, rel, state, caller)
            keep_cache = node.kernel_version == state.version
            node.kernel_version = state.version
            if writable and flags & os.O_TRUNC and state.size:
                async with state.lock:
                    await state.truncate(0)
            if not writable:
                line.size = state.size
            return OpenResult(handle.fh, keep_cache)

    def known_open(self, ino: int, flags: int, caller: CallerProcess) -> OpenResult | None:
        """
        Any thread: what L{open} would answer with no I/O, when it would,
        with its audit line: a read-only open of a regular file that no
        handle has open, whose attributes are fresh and whose chunk list is
        cached for its version, at a path the policy lets it read. Otherwise
        L{None}, and the reactor answers (a write, a pending or stale file,
        a chunk list to fetch, an open state to share, a refusal to audit).
        Python's imports and compilers open many files only to read them.
        """
        ctx = self._ctx
        if _writable(flags) or flags & os.O_TRUNC:
            return None
        node = ctx.table.get(ino)
        if (
            node is None
            or node.kind is not FileKind.FILE
            or node.pending
            or node.stale
            or node.chunks is None
            or node.chunks_version != node.attributes.version
            or lacks_bytes(node, ctx.memo, ctx.settings.inline_read_bytes)
        ):
            return None
        rel = ctx.table.path_from_any_thread(node)
        if rel is None or not ctx.policy.check(rel, write=False).allowed:
            return None
        handle = ctx.files.open_unopened(ino, lambda: self._new_state(node))
        if handle is None:
            return None
        state = handle.state
        keep_cache = node.kernel_version == state.version
        node.kernel_version = state.version
        ctx.audit.simple(EventName.OPEN, rel, caller, size=state.size)
        return OpenResult(handle.fh, keep_cache)

    def _ask_write_lease(
        self, node: Node, rel: str | None, state: FileState, caller: CallerProcess
    ) -> None:
        """
        Ask for the write lease of a file opened for writing that exists on
        the data plane (L{svc.mount.remote.write_leases}), not waiting for the
        answer: the grant goes out before any commit of the file on the
        connection, so the server decides it first. A refusal is audited
        C{lease_denied} and leaves the file uncached (its closes wait for
        their commits' answers). A request the lost connection took is no
        refusal: the file goes on without the lease (logged; the
        compare-and-swap guards its commits). Nothing is asked for a pending
        or unlinked file, or with leases turned off in the settings.
        """
        ctx = self._ctx
        if rel is None or node.pending or not ctx.settings.write_leases:
            return

        def answered(granted: bool | None) -> None:
            if granted is None:
                return
            state.uncached = not granted
            if not granted:
                ctx.audit.simple(EventName.LEASE_DENIED, rel, caller)

        ctx.leases.acquire(node.ino, ctx.server_path(rel)).addCallback(answered)

    async def _load_state(self, node: Node, rel: str, *, fetch_bytes: bool) -> FileState:
        """
        The open state of C{node}: its chunk list fetched unless known (with
        a small file's bytes); with C{fetch_bytes}, a small file's bytes
        fetched with its neighbours' unless held (L{svc.mount.ops.listings}).
        """
        ctx = self._ctx
        if fetch_bytes and lacks_bytes(node, ctx.memo, ctx.settings.inline_read_bytes):
            try:
                await self._listings.fetch_bytes_from(node)
            except RemoteFailure as failure:
                # Only a prefetch: the read asks for the chunk and meets the error itself.
                _log.debug("fetching {path}'s bytes failed: {why}", path=rel, why=failure.message)
        if node.chunks is None or node.chunks_version != node.attributes.version:
            manifest = await ctx.remote.manifest_get(
                ctx.server_path(rel), inline_max=ctx.inline_reads.inline_max()
            )
            node.set_attributes(manifest.attributes)
            try:
                node.chunks = chunk_layout([(c.hash, c.size) for c in manifest.chunks])
            except ValueError as error:
                raise FSError(errno.EIO, f"bad chunk list for {rel!r}: {error}") from None
            node.chunks_version = manifest.attributes.version
            self._kept.carried(rel, manifest.inline)
        loaded = ctx.files.state(node.ino)  # another open finished first
        return loaded if loaded is not None else self._new_state(node)

    def _new_state(self, node: Node) -> FileState:
        ctx = self._ctx
        return FileState(
            node.ino,
            node.attributes.version,
            node.chunks or (),
            worker=ctx.spill_worker,
            spill_dir=ctx.spill,
            memo=ctx.memo,
            now_ns=ctx.now_ns,
            room=ctx.quota_room,
        )

    def _handle(self, fh: int) -> Handle:
        return self._ctx.files.existing(fh)

    def _rel(self, handle: Handle) -> str | None:
        node = self._ctx.table.get(handle.state.ino)
        return self._ctx.table.path_of(node) if node is not None else None

    async def read(self, fh: int, offset: int, length: int, caller: CallerProcess) -> bytes:
        """Up to C{length} bytes at C{offset} (fewer at the end of the file)."""
        ctx = self._ctx
        handle = self._handle(fh)
        rel = self._rel(handle)
        with ctx.audit.line(EventName.READ, rel or "", caller) as line:
            line.offset = offset
            if rel is not None:
                ctx.check_read(rel, directory=False)
            try:
                data = await handle.state.read(offset, length)
            except RemoteFailure as failure:
                raise FSError(errno.EIO, f"reading {rel!r}: {failure.message}") from None
            except FSError:
                raise
            except Exception:
                _log.failure("reading {path} failed", path=rel)
                raise FSError(errno.EIO, f"reading {rel!r} failed") from None
            line.size = len(data)
            return data

    async def truncate(self, node: Node, size: int, caller: CallerProcess) -> None:
        """
        Truncate or extend regular file C{node}: in its open state if it
        is open (committed by its next write-back), else at once.
        """
        ctx = self._ctx
        state = ctx.files.state(node.ino)
        if state is not None:
            # A handle of our own keeps the state registered while we wait
            # for its lock: the last handle's release may be writing it back
            # meanwhile (a close just handed off), and would otherwise
            # retire it with our change in it, uncommitted. Released last,
            # ours commits the change; with other handles open it stays for
            # their write-back, as before.
            handle = ctx.files.open(state, writable=True)
            try:
                async with handle.state.lock:
                    await handle.state.truncate(size)
            finally:
                await self._closes.release(handle.fh, caller, keep=False)
            return
        if size == 0:
            async with ctx.namespace_lock:
                path = ctx.server_path(ctx.rel_of(node))
                emptied = await ctx.await_write(
                    ctx.remote.setattr(
                        path, AttributeChanges(size=0), session_id=ctx.write_session()
                    )
                )
                node.set_attributes(emptied)
                node.chunks = ()
                node.chunks_version = emptied.version
            return
        handle = ctx.files.open(
            await self._load_state(node, ctx.rel_of(node), fetch_bytes=False), writable=True
        )
        try:
            async with handle.state.lock:
                await handle.state.truncate(size)
        finally:
            await self._closes.release(handle.fh, caller, keep=False)
