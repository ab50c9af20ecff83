"""
What a fresh client learns from directory listings: a directory's names
and attributes (the inode table then knows it whole, I{complete}: a name it
lacks does not exist), its files' chunk lists, and, when a small file is
opened whose bytes the mount does not hold, the bytes of that file and of
the small files after it in the directory, in one request
(``docs/specifications/mount-fs.md`` section 3 and 6; C{list} with
C{chunks} and C{inline_max}, ``dataplane-ops.md``).

 - C{opendir} lists a directory whole, however many C{list} pages it takes
   (L{Listings.list_whole}).
 - A C{lookup} of a name the table does not know, in a directory not known
   whole, lists the directory when it fits in L{LOOKUP_PAGES} pages
   (L{Listings.list_for_lookup}): on a fresh client a tool that walks a
   tree by names (C{git status}, C{stat} of each path) then pays a round
   trip per directory, not one per name. A larger directory is asked name
   by name (C{head_file}) and not listed for lookups again while the mount
   runs.
 - Both ask for the files' chunk lists, so the opens that follow send no
   C{manifest_get}; neither asks for bytes (a listing is as often an C{ls},
   a C{stat} or an C{rm -r} as a read).
 - A read-only open of a small file whose chunk list is known and whose
   bytes are not held (L{lacks_bytes}) asks for a page of the directory
   from that file on with C{inline_max} (L{Listings.fetch_bytes_from}): the
   data plane sends up to 1 MiB of that file's and the next small files'
   bytes, so C{grep -r}, C{cat *} or a build reading a directory pay a round
   trip per MiB of small files, not per file, and an C{ls} pays none.

A listing runs under the namespace lock, exclusively: a name created while
its pages arrive must not be dropped by the listing that did not see it.
Fetching bytes changes no names and takes no lock: what it brings is kept
only for the file the table has under that name, with that data-plane inode
and version.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from svc.mount.chunks.chunk_memo import ChunkMemo
from svc.mount.core.attributes import FileKind
from svc.mount.core.extents import chunk_layout
from svc.mount.core.fs_context import FSContext, join
from svc.mount.core.inodes import Node
from svc.mount.remote.remote_values import ListedEntry, ListPage
from svc.mount.writeback.kept_chunks import KeptChunks
from svc.wire.messages import MAX_INLINE_BYTES, MAX_LIST_LIMIT

LOOKUP_PAGES = 2
"""The most C{list} pages (of 1,000 names) a lookup reads to list a directory."""


FETCH_ENTRIES = (32, MAX_LIST_LIMIT)
"""The fewest and the most entries a fetch of small files' bytes asks for."""


def fetch_limit(size: int) -> int:
    """
    The entries a fetch of bytes starting at a file of C{size} bytes asks
    for: as many files of that size as one page's bytes (1 MiB) hold, within
    L{FETCH_ENTRIES}; neighbours are most often of a size alike, and every
    entry a page brings costs decoding even when its bytes do not come.
    """
    fewest, most = FETCH_ENTRIES
    return max(fewest, min(most, MAX_INLINE_BYTES // max(size, 1)))


def lacks_bytes(node: Node, memo: ChunkMemo, most: int) -> bool:
    """
    Any thread: whether C{node} is a file of 1 to C{most} bytes whose chunk
    list is known for its version and whose bytes are not all held in
    C{memo} (a file that small has chunks that small, which are kept in
    memory only: L{KeptChunks.uploaded}).
    """
    chunks = node.chunks
    return (
        node.kind is FileKind.FILE
        and not node.pending
        and 0 < node.attributes.size <= most
        and chunks is not None
        and node.chunks_version == node.attributes.version
        and not all(memo.remembers(chunk.hash) for chunk in chunks)
    )


class Listings:
    """See the module docstring."""

    def __init__(self, context: FSContext, kept: KeptChunks) -> None:
        self._ctx = context
        self._kept = kept
        self._too_large: set[int] = set()
        self._fetching: dict[int, tuple[str, Deferred[ListPage]]] = {}

    async def list_whole(self, node: Node) -> None:
        """List directory C{node} whole, every page."""
        await self._list(node, pages=None)

    async def list_for_lookup(self, node: Node) -> bool:
        """
        List directory C{node} whole if it fits in L{LOOKUP_PAGES} pages,
        and say whether the table now knows it whole.
        """
        if node.complete:
            return True
        if node.ino in self._too_large:
            return False
        return await self._list(node, pages=LOOKUP_PAGES)

    async def _list(self, node: Node, pages: int | None) -> bool:
        ctx = self._ctx
        async with ctx.namespace_lock:
            if pages is not None and node.complete:
                return True  # listed while this waited for the lock
            rel = ctx.rel_of(node)
            entries: list[ListedEntry] = []
            after: str | None = None
            read = 0
            while pages is None or read < pages:
                page = await ctx.remote.list_dir(ctx.server_path(rel), after=after, chunks=True)
                read += 1
                entries.extend(page.entries)
                if page.next_after is None:
                    ctx.table.set_listing(node, [(e.name, e.attributes) for e in entries])
                    self._keep(node, rel, entries)
                    self._too_large.discard(node.ino)
                    return True
                after = page.next_after
            self._too_large.add(node.ino)
            return False

    async def fetch_bytes_from(self, node: Node) -> None:
        """
        Ask for the bytes of file C{node} and of the small files after it in
        its directory (one C{list} page from its name on, with
        C{inline_max}), when opens would ask for bytes now
        (L{svc.mount.chunks.inline_reads.InlineReads}); keep what comes. An open of
        a file after the name a fetch of its directory in flight started at
        waits for that fetch first, and asks only if it still lacks bytes.
        """
        ctx = self._ctx
        link = ctx.table.primary_name(node)
        if link is None:
            return
        directory, name = link
        fetching = self._fetching.get(directory.ino)
        if fetching is not None and _utf8(name) >= _utf8(fetching[0]):
            await _settled(fetching[1])
            if not lacks_bytes(node, ctx.memo, ctx.settings.inline_read_bytes):
                return
        rel = ctx.table.path_of(directory)
        inline_max = ctx.inline_reads.inline_max()
        if rel is None or not inline_max:
            return
        names = sorted(directory.children, key=_utf8)
        before = bisect.bisect_left(names, _utf8(name), key=_utf8)
        after = names[before - 1] if before else None
        page = ctx.remote.list_dir(
            ctx.server_path(rel),
            after=after,
            limit=fetch_limit(node.attributes.size),
            chunks=True,
            inline_max=inline_max,
        )
        self._fetching[directory.ino] = (name, page)
        try:
            listed = await page
        finally:
            if self._fetching.get(directory.ino, (None, None))[1] is page:
                del self._fetching[directory.ino]
        self._keep(directory, rel, listed.entries)

    def _keep(self, directory: Node, rel: str, entries: Sequence[ListedEntry]) -> None:
        """
        The chunk lists and inline chunks a listing carried, kept for the
        opens and reads that follow: only for the file the table has under
        that name, of that data-plane inode and version, that no open file
        holds.
        """
        ctx = self._ctx
        for entry in entries:
            if entry.chunks is None:
                continue
            node = ctx.table.child(directory, entry.name)
            listed = entry.attributes
            if (
                node is None
                or node.pending
                or node.kind is not FileKind.FILE
                or node.attributes.server_inode != listed.server_inode
                or node.attributes.version != listed.version
                or ctx.files.state(node.ino) is not None
            ):
                continue
            if node.chunks is None or node.chunks_version != listed.version:
                try:
                    node.chunks = chunk_layout([(c.hash, c.size) for c in entry.chunks])
                except ValueError:
                    continue  # its open asks manifest_get, and meets the error
                node.chunks_version = listed.version
            if entry.inline:
                self._kept.carried(join(rel, entry.name), entry.inline)


def _settled(deferred: Deferred[ListPage]) -> Deferred[None]:
    """Fires when C{deferred} has, whatever its outcome (its own waiter meets a failure)."""
    waited: Deferred[None] = Deferred()

    def wake(result: ListPage | Failure) -> ListPage | Failure:
        waited.callback(None)
        return result

    deferred.addBoth(wake)
    return waited


def _utf8(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")
