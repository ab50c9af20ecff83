"""
The C{list} operation: one page of the directory entries the agent's path
policy shows and, asked with C{chunks}, the chunk lists of its regular
files; with C{inline_max} too, the bytes of its small files' chunks in the
raw segment (``dataplane-ops.md`` section 3, C{list}: "A directory's
manifests in one answer"). Run by L{svc.dataplane.handlers} like every
operation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from svc.dataplane.calls import Call, InlineChunks, Outcome, Release, inline_for
from svc.dataplane.confinement import relative_to_disk
from svc.dataplane.interfaces import OpReply
from svc.dataplane.replies import list_map
from svc.policy import PathPolicy
from svc.store.manifest_paths import child_path
from svc.store.manifest_values import ChunkRef, DirectoryEntry, FileChunks, FileKind
from svc.wire.messages import (
    MAX_INLINE_BYTES,
    MAX_LIST_CHUNKS,
    MAX_LIST_ENTRY_CHUNKS,
    ListRequest,
)

if TYPE_CHECKING:
    from svc.dataplane.connection import AgentConnection
    from svc.store.tenant import TenantStorage

Carried = Sequence[tuple[ChunkRef, ...] | None]
"""The chunk list each entry of a page carries, in page order (L{None}: none)."""


def _readable(policy: PathPolicy, relative: str, kind: FileKind) -> bool:
    if kind is FileKind.DIRECTORY:
        return policy.check_traverse(relative).allowed
    return policy.check(relative, write=False).allowed


def visible_entries(
    conn: AgentConnection, directory: str, entries: tuple[DirectoryEntry, ...]
) -> list[DirectoryEntry]:
    """
    The entries of C{directory} the agent's path policy shows: a directory
    if it may be traversed, anything else if it may be read
    (C{check(path, write=False)}), so every regular file shown is readable.
    """
    policy = conn.policy()
    if policy is None:
        return list(entries)
    return [
        entry
        for entry in entries
        if _readable(
            policy,
            relative_to_disk(child_path(directory, entry.name), conn.agent_id),
            entry.attributes.kind,
        )
    ]


async def list_entries(
    conn: AgentConnection, call: Call, raw: memoryview, release: Release
) -> Outcome:
    """
    C{list}: a page of the entries the policy shows, by name after
    C{after}. With C{chunks}, its regular files' chunk lists (read in one
    go, L{carried_chunks}) become visible to the connection, as a
    C{manifest_get} of each would make them, and the entries carry them;
    with C{inline_max}, the outcome names the chunks the raw segment is to
    carry (L{page_inline}).
    """
    request = call.request
    assert isinstance(request, ListRequest)
    storage = await conn.storage()
    page, next_after = await _page(conn, storage, request)
    if not request.chunks:
        return Outcome(OpReply(list_map(page, next_after)))
    files = [entry.name for entry in page if entry.attributes.kind is FileKind.FILE]
    lists: Mapping[str, FileChunks] = {}
    if files:
        lists = await storage.manifests.chunk_lists(
            request.path, files, max_chunks=MAX_LIST_ENTRY_CHUNKS
        )
    carried = carried_chunks(page, lists)
    conn.visible.add(chunk.hash for chunks in carried if chunks is not None for chunk in chunks)
    reply = OpReply(list_map(page, next_after, carried))
    return Outcome(reply, inline=page_inline(page, carried, request.inline_max))


async def _page(
    conn: AgentConnection, storage: TenantStorage, request: ListRequest
) -> tuple[list[DirectoryEntry], str | None]:
    """
    The entries of a C{list} page and its C{next_after}: the store is asked
    for C{limit} rows and one more (to know whether the directory goes on),
    so a page costs its own rows, not the directory's. Rows the policy
    hides are skipped, scanning on (C{limit} rows at a time) until the page
    is full or the directory ends; C{next_after} is always a name the page
    shows, never a hidden one.
    """
    page: list[DirectoryEntry] = []
    cursor = request.after
    window = request.limit
    while True:
        rows = await storage.list_dir(request.path, after=cursor, limit=window + 1)
        scanned = rows[:window]
        visible = visible_entries(conn, request.path, scanned)
        room = request.limit - len(page)
        page.extend(visible[:room])
        if len(visible) > room or (len(page) == request.limit and len(rows) > window):
            return page, page[-1].name  # full, and more rows follow
        if len(rows) <= window:
            return page, None  # the directory ends here
        cursor = scanned[-1].name


def carried_chunks(page: Sequence[DirectoryEntry], lists: Mapping[str, FileChunks]) -> Carried:
    """
    The chunk list each entry of C{page} carries: a regular file's from
    C{lists} (read after the listing) when it is of the inode and version
    listed (else the file changed in between: none) and has at most
    C{MAX_LIST_ENTRY_CHUNKS} entries; in page order while the page's
    carried entries number at most C{MAX_LIST_CHUNKS}, none from the entry
    that would pass that on.
    """
    carried: list[tuple[ChunkRef, ...] | None] = []
    total = 0
    for entry in page:
        attributes = entry.attributes
        found = lists.get(entry.name)
        if (
            found is None
            or attributes.kind is not FileKind.FILE
            or (found.inode, found.version) != (attributes.inode, attributes.version)
            or len(found.chunks) > MAX_LIST_ENTRY_CHUNKS
        ):
            carried.append(None)
            continue
        total += len(found.chunks)
        if total > MAX_LIST_CHUNKS:
            break
        carried.append(found.chunks)
    return carried + [None] * (len(page) - len(carried))


def page_inline(
    page: Sequence[DirectoryEntry], carried: Carried, inline_max: int
) -> InlineChunks | None:
    """
    The chunks a C{list} answer carries in its raw segment: for each entry
    carrying its chunk list, in page order, those L{inline_for} gives (each
    distinct chunk once, in order of first use), while the bytes carried
    total at most C{MAX_INLINE_BYTES}, none from the entry whose new chunks
    would pass that on. The hashes are in raw-segment order, each distinct
    chunk once, where it is first named (an entry naming a chunk an
    earlier entry named adds no bytes); each entry names all of its own in
    C{inline}.
    """
    if inline_max <= 0:
        return None
    named: dict[int, tuple[str, ...]] = {}
    hashes: list[str] = []
    seen: set[str] = set()
    total = 0
    for index, (entry, chunks) in enumerate(zip(page, carried, strict=True)):
        if chunks is None:
            continue
        names = inline_for(inline_max, entry.attributes, chunks)
        if not names:
            continue
        sizes = {chunk.hash: chunk.size for chunk in chunks}
        new = [name for name in names if name not in seen]
        total += sum(sizes[name] for name in new)
        if total > MAX_INLINE_BYTES:
            break
        named[index] = names
        hashes.extend(new)
        seen.update(new)
    if not hashes:
        return None
    return InlineChunks(tuple(hashes), lambda payload: _with_inline_names(payload, named))


def _with_inline_names(
    payload: Mapping[str, object], named: Mapping[int, tuple[str, ...]]
) -> dict[str, object]:
    """A C{list} answer's C{payload} whose entries at the indexes of C{named} name theirs."""
    entries = payload["entries"]
    assert isinstance(entries, list)
    placed = list(entries)
    for index, names in named.items():
        placed[index] = {**placed[index], "inline": list(names)}
    return {**payload, "entries": placed}
