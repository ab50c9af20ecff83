"""
Reading a directory's listing from the data plane into the inode table,
which then knows the directory whole (I{complete}): every name in it, with
attributes, and that a name it lacks does not exist.

C{opendir} lists a directory whole, however many C{list} pages it takes
(L{Listings.list_whole}). A C{lookup} of a name the table does not know, in
a directory not known whole, lists the directory too when it fits in
L{LOOKUP_PAGES} pages (L{Listings.list_for_lookup}): on a fresh client a
tool that walks a tree by names (C{git status}, C{stat} of each path, a
build's dependency checks) then pays a round trip per directory, not one
per name. A larger directory is not listed for a lookup (its lookups ask
for the one name, C{head_file}), and is not tried again for lookups while
the mount runs.

A listing runs under the namespace lock, exclusively: a name created
while its pages arrive must not be dropped by the listing that did not see
it (``docs/specifications/mount-fs.md`` section 3).
"""

from __future__ import annotations

from svc.mount.attributes import Attributes
from svc.mount.fs_context import FSContext
from svc.mount.inodes import Node

LOOKUP_PAGES = 2
"""The most C{list} pages (of 1,000 names) a lookup reads to list a directory."""


class Listings:
    """See the module docstring."""

    def __init__(self, context: FSContext) -> None:
        self._ctx = context
        self._too_large: set[int] = set()

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
            entries: list[tuple[str, Attributes]] = []
            after: str | None = None
            read = 0
            while pages is None or read < pages:
                page = await ctx.remote.list_dir(ctx.server_path(rel), after=after)
                read += 1
                entries.extend((entry.name, entry.attributes) for entry in page.entries)
                if page.next_after is None:
                    ctx.table.set_listing(node, entries)
                    self._too_large.discard(node.ino)
                    return True
                after = page.next_after
            self._too_large.add(node.ino)
            return False
