"""
The footprint rows of ``routes.db``: uncommitted uploads, chunks retained
for the journal, collectable chunks and each agent's running totals
(``docs/specifications/routes-db.md``, "Footprint tables";
L{svc.store.footprint} for the rules).

These functions run on the store's worker thread inside a transaction
opened by L{svc.store.routes_queue}. None scans on the paths of a
C{chunk_put} or a manifest change: each touches the rows of the chunks it
names, found by primary key or index; only a change that prunes past the
cap asks, for each chunk it releases, one probe per agent of the tenant
whether another still names it (L{_held}). Hashes are 64-hex strings in the
API and 32-byte BLOBs in the tables.

The rules they keep (checked by the tests' recomputation):

1. C{uploads(top, hash)} never coexists with C{chunk_refs(top, hash)}: a
   chunk the agent's files name costs it nothing more.
2. C{retained_chunks(top, hash)} exists exactly when C{hash} is not named
   by a live file of C{/<top>} and a journal row of that top names it;
   C{last_seq} is the newest such row, the one that released it last.
3. C{collectable(hash)} exists only while no C{chunk_refs},
   C{retained_chunks} or C{uploads} row names the hash.
4. C{footprint} holds, per top, the sums of those three tables' sizes.

The schema's triggers keep rules 1, 3 and 4 as rows come and go (a live
reference deletes the top's upload and retained rows and the collectable
row; an upload deletes the collectable row; every row moves its top's
total); these functions keep rule 2 and decide what becomes collectable.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping

from svc.store.errors import QuotaExceeded
from svc.store.footprint import CollectionBacklog, Footprint, FootprintPolicy
from svc.store.manifest_values import ChunkRef


def read(connection: sqlite3.Connection, top: str) -> Footprint:
    """
    The footprint of C{/<top>}: two primary-key reads.
    """
    live = connection.execute("SELECT bytes FROM subtree_usage WHERE top = ?", (top,)).fetchone()
    row = connection.execute(
        "SELECT uncommitted_bytes, retained_bytes, collectable_bytes FROM footprint WHERE top = ?",
        (top,),
    ).fetchone()
    uncommitted, retained, collectable = (0, 0, 0) if row is None else row
    return Footprint(0 if live is None else int(live[0]), uncommitted, retained, collectable)


def read_all(connection: sqlite3.Connection) -> dict[str, Footprint]:
    """
    The footprint of every top that has any charged bytes.
    """
    found: dict[str, Footprint] = {}
    for top, live in connection.execute("SELECT top, bytes FROM subtree_usage WHERE bytes > 0"):
        found[top] = Footprint(live_bytes=int(live))
    for top, uncommitted, retained, collectable in connection.execute(
        "SELECT top, uncommitted_bytes, retained_bytes, collectable_bytes FROM footprint"
        " WHERE uncommitted_bytes > 0 OR retained_bytes > 0 OR collectable_bytes > 0"
    ):
        live = found.get(top, Footprint()).live_bytes
        found[top] = Footprint(live, uncommitted, retained, collectable)
    return found


# Whether any top names a chunk (live, retained or uploaded): one probe by
# primary key per top that has rows of the kind, rather than an index by hash
# that every put and upload would have to keep (a random page written per
# chunk). Asked only when chunks are released (pruning, expiry).
_HELD = (
    "SELECT EXISTS (SELECT 1 FROM subtree_usage s CROSS JOIN chunk_refs c"
    " WHERE s.chunks > 0 AND c.top = s.top AND c.hash = ?1)"
    " OR EXISTS (SELECT 1 FROM footprint f CROSS JOIN retained_chunks r"
    " WHERE f.retained_bytes > 0 AND r.top = f.top AND r.hash = ?1)"
    " OR EXISTS (SELECT 1 FROM footprint f CROSS JOIN uploads u"
    " WHERE f.uncommitted_bytes > 0 AND u.top = f.top AND u.hash = ?1)"
)


def _held(connection: sqlite3.Connection, digest: bytes) -> bool:
    """Whether any top names the chunk: live, retained or uploaded."""
    return bool(connection.execute(_HELD, (digest,)).fetchone()[0])


def _orphan(
    connection: sqlite3.Connection, top: str, released: Iterable[tuple[bytes, int]], at_ms: int
) -> int:
    """
    Charge to C{top} as collectable those of the C{released} chunks that no
    top names any more; the bytes so charged.
    """
    added = 0
    for digest, size in released:
        if _held(connection, digest):
            continue
        cursor = connection.execute(
            "INSERT INTO collectable (hash, top, size, since_ms) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (hash) DO NOTHING",
            (digest, top, size, at_ms),
        )
        if cursor.rowcount:
            added += size
    return added


# Uploads


def charge_upload(
    connection: sqlite3.Connection,
    top: str,
    chunk: ChunkRef,
    at_ms: int,
    *,
    grant_bytes: int | None,
    backlog_bytes: int | None,
) -> bool:
    """
    Charge an upload of C{chunk} by the agent of C{/<top>}. A chunk its
    files name costs nothing; one it uploaded already has its time renewed.
    Otherwise the chunk is new to the agent, whoever else holds it: it is
    refused with L{CollectionBacklog} while the agent's collectable bytes
    exceed C{backlog_bytes}, and with L{QuotaExceeded} when
    C{uncommitted + size} would exceed C{grant_bytes} (the uploads of a
    rewrite may be as large as the grant while the files are full); else it
    is recorded. Returns whether this call recorded it.
    """
    digest = bytes.fromhex(chunk.hash)
    if connection.execute(
        "SELECT 1 FROM chunk_refs WHERE top = ? AND hash = ?", (top, digest)
    ).fetchone():
        return False
    if connection.execute(
        "UPDATE uploads SET at_ms = max(at_ms, ?) WHERE top = ? AND hash = ?", (at_ms, top, digest)
    ).rowcount:
        return False
    footprint = read(connection, top)
    if backlog_bytes is not None and footprint.collectable_bytes > backlog_bytes:
        raise CollectionBacklog(top)
    needed = footprint.uncommitted_bytes + chunk.size
    if grant_bytes is not None and needed > grant_bytes:
        raise QuotaExceeded(
            f"agent grant {grant_bytes} bytes: {footprint.uncommitted_bytes} uploaded and not"
            f" yet in files, {chunk.size} more would exceed it"
        )
    connection.execute(
        "INSERT INTO uploads (top, hash, size, at_ms) VALUES (?, ?, ?, ?)",
        (top, digest, chunk.size, at_ms),
    )
    return True


def uncharge_upload(connection: sqlite3.Connection, top: str, chunk_hash: str) -> None:
    """
    Forget the upload of C{chunk_hash} by C{/<top>} (it failed and stored
    nothing).
    """
    connection.execute(
        "DELETE FROM uploads WHERE top = ? AND hash = ?", (top, bytes.fromhex(chunk_hash))
    )


def upload_hashes(connection: sqlite3.Connection, since_ms: int | None = None) -> frozenset[str]:
    """
    Every chunk some agent uploaded and has not committed (GC keeps them);
    only those renewed at or after C{since_ms}, when given.
    """
    rows = connection.execute(
        "SELECT hash FROM uploads WHERE at_ms >= ?", (-(2**62) if since_ms is None else since_ms,)
    )
    return frozenset(digest.hex() for (digest,) in rows)


def expire_uploads(connection: sqlite3.Connection, before_ms: int, at_ms: int) -> int:
    """
    Stop charging (and protecting) uploads last renewed before
    C{before_ms}; those no top names any more become collectable. The
    number expired.
    """
    expired = connection.execute(
        "DELETE FROM uploads WHERE at_ms < ? RETURNING top, hash, size", (before_ms,)
    ).fetchall()
    by_top: dict[str, list[tuple[bytes, int]]] = {}
    for top, digest, size in expired:
        by_top.setdefault(top, []).append((digest, int(size)))
    for top, chunks in by_top.items():
        _orphan(connection, top, chunks, at_ms)
    return len(expired)


# Live references and releases


def released(
    connection: sqlite3.Connection, top: str, seq: int, chunks: Iterable[ChunkRef]
) -> None:
    """
    The journal row C{seq} of C{/<top>} released C{chunks} (no live file of
    the top names them any more; the row's snapshots do): they are retained
    until that row is pruned. One the change named again (a revert that
    replaced a file by one of another kind with the same chunk) is live, not
    retained.
    """
    connection.executemany(
        "INSERT INTO retained_chunks (top, hash, size, last_seq) SELECT ?1, ?2, ?3, ?4"
        " WHERE NOT EXISTS (SELECT 1 FROM chunk_refs WHERE top = ?1 AND hash = ?2)"
        " ON CONFLICT (top, hash) DO UPDATE SET last_seq = excluded.last_seq",
        [(top, bytes.fromhex(chunk.hash), chunk.size, seq) for chunk in chunks],
    )


def released_refs(hashes: Iterable[str], chunks: Iterable[ChunkRef]) -> list[ChunkRef]:
    """
    The references, with their sizes from C{chunks}, of the released
    C{hashes}, once each.
    """
    wanted = set(hashes)
    found: dict[str, ChunkRef] = {}
    for chunk in chunks:
        if chunk.hash in wanted:
            found.setdefault(chunk.hash, chunk)
    return list(found.values())


# Pruning


def prune_to_cap(connection: sqlite3.Connection, top: str, cap: int, at_ms: int) -> int:
    """
    Bring the retained bytes of C{/<top>} within C{cap} by deleting its
    oldest journal rows: those up to the oldest release that frees enough
    (possibly the change just made). The chunks they alone kept become
    collectable; returns the bytes that did.
    """
    row = connection.execute(
        "SELECT retained_bytes FROM footprint WHERE top = ?", (top,)
    ).fetchone()
    retained = 0 if row is None else int(row[0])
    if retained <= cap:
        return 0
    excess = retained - cap
    freed = 0
    through: int | None = None
    for last_seq, size in connection.execute(
        "SELECT last_seq, size FROM retained_chunks WHERE top = ? ORDER BY last_seq", (top,)
    ):
        freed += size
        if freed >= excess:
            through = int(last_seq)
            break
    assert through is not None, (top, retained, cap)
    connection.execute("DELETE FROM journal WHERE top = ? AND seq <= ?", (top, through))
    return _release_retained(
        connection,
        connection.execute(
            "DELETE FROM retained_chunks WHERE top = ? AND last_seq <= ? RETURNING top, hash, size",
            (top, through),
        ).fetchall(),
        at_ms,
    )


def prune_all_to_caps(
    connection: sqlite3.Connection, grants: Mapping[str, int], policy: FootprintPolicy, at_ms: int
) -> int:
    """
    L{prune_to_cap} for every top with retained bytes, each at its cap
    under C{grants} and C{policy}; the bytes that became collectable.
    """
    tops = [
        top for (top,) in connection.execute("SELECT top FROM footprint WHERE retained_bytes > 0")
    ]
    return sum(
        prune_to_cap(connection, top, policy.retained_cap(grants.get(top)), at_ms) for top in tops
    )


def prune_journal_through(connection: sqlite3.Connection, seq: int, at_ms: int) -> int:
    """
    Delete every journal row up to C{seq}, stop retaining the chunks only
    they kept (those no top names become collectable). The rows deleted.
    """
    rows = connection.execute("DELETE FROM journal WHERE seq <= ?", (seq,)).rowcount
    _release_retained(
        connection,
        connection.execute(
            "DELETE FROM retained_chunks WHERE last_seq <= ? RETURNING top, hash, size", (seq,)
        ).fetchall(),
        at_ms,
    )
    return rows


def _release_retained(
    connection: sqlite3.Connection, rows: list[tuple[str, bytes, int]], at_ms: int
) -> int:
    by_top: dict[str, list[tuple[bytes, int]]] = {}
    for top, digest, size in rows:
        by_top.setdefault(top, []).append((digest, int(size)))
    return sum(_orphan(connection, top, chunks, at_ms) for top, chunks in by_top.items())


# Collection


def collectable_chunks(connection: sqlite3.Connection, limit: int) -> list[tuple[str, int]]:
    """
    Up to C{limit} collectable chunks, oldest first: C{(hash, size)}.
    """
    return [
        (digest.hex(), int(size))
        for digest, size in connection.execute(
            "SELECT hash, size FROM collectable ORDER BY since_ms LIMIT ?", (limit,)
        )
    ]


def forget_collectable(connection: sqlite3.Connection, hashes: Iterable[str]) -> None:
    """
    The chunks C{hashes} left the chunk store: stop charging them.
    """
    connection.executemany(
        "DELETE FROM collectable WHERE hash = ?", [(bytes.fromhex(h),) for h in hashes]
    )


def purge(connection: sqlite3.Connection, top: str) -> frozenset[str]:
    """
    Drop every footprint row of C{/<top>} (its disk is being erased);
    returns the hashes they named, for the caller to collect.
    """
    hashes: set[str] = set()
    for table in ("uploads", "retained_chunks", "collectable"):
        hashes.update(
            digest.hex()
            for (digest,) in connection.execute(
                f"DELETE FROM {table} WHERE top = ? RETURNING hash",  # noqa: S608
                (top,),
            )
        )
    connection.execute("DELETE FROM footprint WHERE top = ?", (top,))
    return frozenset(hashes)
