"""
The schema of a tenant's ``routes.db``: the namespace (names and inodes), chunk
reference counts for garbage collection and quotas, the write journal, and
each agent's footprint (uploads, retained and collectable chunks).

The DDL below is the reference; ``docs/specifications/routes-db.md`` describes
the same tables, invariants and encodings in prose. The schema version is kept
in ``PRAGMA user_version``; L{migrate} applies the numbered migrations in
L{MIGRATIONS} that the file has not seen yet, all in one transaction, when the
database is opened. A migration is never edited once released: a change is a
new, higher-numbered migration.

Encodings shared by several columns:

  - B{chunk list}: a BLOB of 40-byte records, one per chunk in file order:
    the 32-byte BLAKE3 digest followed by the chunk's byte count as an
    unsigned 64-bit big-endian integer. The empty list is the empty BLOB.
  - B{times}: ``*_ns`` columns are nanoseconds since the Unix epoch,
    ``*_ms`` columns milliseconds.
  - B{paths}: absolute, canonical, UTF-8 text; ``/`` is the root.
  - B{top}: the first component of a path (the agent's disk directory
    ``/<agent_id>`` has top ``<agent_id>``); the root's top is ``''``.
"""

from __future__ import annotations

import sqlite3

import msgpack

from svc.store.sqlite_migrations import (
    Migration,
    apply_migrations,
)

#: Kinds of inode, as stored in C{inodes.kind}.
INODE_KINDS = ("file", "dir", "symlink", "fifo", "chardev", "blockdev", "socket")

#: Operations recorded in C{journal.op}.
JOURNAL_OPS = (
    "put",
    "delete",
    "mkdir",
    "rmdir",
    "rename",
    "link",
    "symlink",
    "mknod",
    "setattr",
    "revert",
)

#: The root directory's inode id; created by migration 1.
ROOT_INODE = 1

_SCHEMA_1 = (
    # One row per inode: a file, directory, symlink or special file. Several
    # names may point at one non-directory inode (hard links); a directory
    # has exactly one name. An inode row exists exactly as long as at least
    # one row of `names` points at it.
    """
    CREATE TABLE inodes (
        id             INTEGER PRIMARY KEY AUTOINCREMENT,
                                              -- never reused, so (id, version)
                                              -- names one content for ever;
                                              -- 1 is the root directory
        kind           TEXT NOT NULL CHECK (kind IN
                           ('file', 'dir', 'symlink', 'fifo', 'chardev',
                            'blockdev', 'socket')),
        mode           INTEGER NOT NULL CHECK (mode BETWEEN 0 AND 4095),
                                              -- permission bits only (07777)
        uid            INTEGER NOT NULL CHECK (uid BETWEEN 0 AND 4294967295),
        gid            INTEGER NOT NULL CHECK (gid BETWEEN 0 AND 4294967295),
        size           INTEGER NOT NULL CHECK (size >= 0),
                                              -- file: sum of the chunk sizes;
                                              -- symlink: UTF-8 length of target;
                                              -- others: 0
        mtime_ns       INTEGER NOT NULL,
        atime_ns       INTEGER NOT NULL,
        ctime_ns       INTEGER NOT NULL,
        version        INTEGER NOT NULL CHECK (version >= 1),
                                              -- file: content version, the CAS
                                              -- token of manifest_put; dir: bumped
                                              -- on every entry change; starts at 1
        nlink          INTEGER NOT NULL CHECK (nlink >= 1),
                                              -- non-dir: number of names;
                                              -- dir: 2 + number of subdirectories
        symlink_target TEXT,                  -- symlink only, else NULL
        rdev           INTEGER NOT NULL DEFAULT 0,
                                              -- chardev/blockdev device number
        chunks         BLOB NOT NULL DEFAULT x'',
                                              -- file only: chunk list encoding
        writer_agent   TEXT NOT NULL,         -- agent of the last change
        writer_session TEXT,                  -- its session id, if any
        written_ms     INTEGER NOT NULL       -- when that change was made
    ) STRICT
    """,
    # The namespace: one row per name. `parent` is the path with its last
    # component removed ('/' for top-level names, '' for the root itself).
    """
    CREATE TABLE names (
        path   TEXT PRIMARY KEY,
        parent TEXT NOT NULL,
        inode  INTEGER NOT NULL REFERENCES inodes (id)
    ) STRICT, WITHOUT ROWID
    """,
    # Listing a directory: names WHERE parent = ?, ordered by path.
    "CREATE INDEX names_by_parent ON names (parent)",
    # Finding the names of an inode, and the foreign-key check when an inode
    # row is deleted.
    "CREATE INDEX names_by_inode ON names (inode)",
    # Chunk references per top-level directory. `refs` counts occurrences in
    # the chunk lists of the live file inodes whose names lie under /<top>
    # (an inode counts once however many names it has; a chunk appearing
    # twice in one file counts twice). A row exists only while refs > 0.
    """
    CREATE TABLE chunk_refs (
        top  TEXT NOT NULL,
        hash BLOB NOT NULL CHECK (length(hash) = 32),
        size INTEGER NOT NULL CHECK (size > 0),
        refs INTEGER NOT NULL CHECK (refs > 0),
        PRIMARY KEY (top, hash)
    ) STRICT, WITHOUT ROWID
    """,
    # Running totals of chunk_refs per top: bytes = sum(size), chunks =
    # count(*) over the chunk_refs rows of that top (unique chunks).
    """
    CREATE TABLE subtree_usage (
        top    TEXT PRIMARY KEY,
        bytes  INTEGER NOT NULL CHECK (bytes >= 0),
        chunks INTEGER NOT NULL CHECK (chunks >= 0)
    ) STRICT, WITHOUT ROWID
    """,
    # The write journal: one row per successful mutation, written in the
    # mutation's own transaction. Rows are only ever added (and pruned by
    # age); a revert is a new row. State columns hold a snapshot encoded as a
    # msgpack map (see docs/specifications/routes-db.md), NULL meaning "no
    # such name".
    """
    CREATE TABLE journal (
        seq            INTEGER PRIMARY KEY AUTOINCREMENT,
                                              -- strictly increasing, never reused
        at_ms          INTEGER NOT NULL,
        agent_id       TEXT NOT NULL,
        session_id     TEXT,
        op             TEXT NOT NULL CHECK (op IN
                           ('put', 'delete', 'mkdir', 'rmdir', 'rename', 'link',
                            'symlink', 'mknod', 'setattr', 'revert')),
        path           TEXT NOT NULL,         -- the name the row is about
        to_path        TEXT,                  -- rename: destination;
                                              -- link: the existing name
        old_version    INTEGER NOT NULL,      -- version of `path` before; 0 absent
        new_version    INTEGER NOT NULL,      -- version after (of to_path for
                                              -- rename); 0 absent
        old_state      BLOB,                  -- `path` before the change
        new_state      BLOB,                  -- `path` after (rename: to_path after)
        replaced_state BLOB,                  -- rename: to_path before, if it existed
        reverts_seq    INTEGER                -- revert: the seq it reverted
    ) STRICT
    """,
    "CREATE INDEX journal_by_path ON journal (path)",
    "CREATE INDEX journal_by_to_path ON journal (to_path) WHERE to_path IS NOT NULL",
    "CREATE INDEX journal_by_agent ON journal (agent_id)",
    "CREATE INDEX journal_by_time ON journal (at_ms)",
    # The root directory, present from the start. Its times start at 0 and
    # advance when entries change.
    # (mode 493 = 0o755; id 1 = ROOT_INODE.)
    """
    INSERT INTO inodes (id, kind, mode, uid, gid, size, mtime_ns, atime_ns,
                        ctime_ns, version, nlink, writer_agent, written_ms)
    VALUES (1, 'dir', 493, 0, 0, 0, 0, 0, 0, 1, 2, '', 0)
    """,
    "INSERT INTO names (path, parent, inode) VALUES ('/', '', 1)",
)


_SCHEMA_2 = (
    # Uploads not yet committed, charged to the agent that made them (its
    # top) until one of its files names the chunk (the row goes in that
    # transaction) or GC expires it (`at_ms` older than the chunk grace).
    # Never both here and in chunk_refs for the same (top, hash).
    """
    CREATE TABLE uploads (
        top   TEXT NOT NULL,
        hash  BLOB NOT NULL CHECK (length(hash) = 32),
        size  INTEGER NOT NULL CHECK (size > 0),
        at_ms INTEGER NOT NULL,               -- the last chunk_put of it by this top
        PRIMARY KEY (top, hash)
    ) STRICT, WITHOUT ROWID
    """,
    "CREATE INDEX uploads_by_time ON uploads (at_ms)",
    # Chunks kept only for a top's journal: no live file of the top names
    # the hash and a journal row of the top does. `last_seq` is the newest
    # such row (the one that released the chunk last): pruning the rows up
    # to it frees the chunk as far as this top is concerned.
    """
    CREATE TABLE retained_chunks (
        top      TEXT NOT NULL,
        hash     BLOB NOT NULL CHECK (length(hash) = 32),
        size     INTEGER NOT NULL CHECK (size > 0),
        last_seq INTEGER NOT NULL,
        PRIMARY KEY (top, hash)
    ) STRICT, WITHOUT ROWID
    """,
    "CREATE INDEX retained_by_release ON retained_chunks (top, last_seq)",
    # Chunks released by a top's pruned journal rows or expired uploads
    # that no top names (no chunk_refs, retained_chunks or uploads row):
    # charged to that top until the chunk is deleted from the store.
    """
    CREATE TABLE collectable (
        hash     BLOB PRIMARY KEY CHECK (length(hash) = 32),
        top      TEXT NOT NULL,
        size     INTEGER NOT NULL CHECK (size > 0),
        since_ms INTEGER NOT NULL
    ) STRICT, WITHOUT ROWID
    """,
    # Running totals per top of uploads, retained_chunks and collectable
    # (sum(size) of the top's rows in each). Rows may remain at 0.
    """
    CREATE TABLE footprint (
        top               TEXT PRIMARY KEY,
        uncommitted_bytes INTEGER NOT NULL CHECK (uncommitted_bytes >= 0),
        retained_bytes    INTEGER NOT NULL CHECK (retained_bytes >= 0),
        collectable_bytes INTEGER NOT NULL CHECK (collectable_bytes >= 0)
    ) STRICT, WITHOUT ROWID
    """,
    # The running totals follow the three tables, inside SQLite (no
    # statement of the caller's per row). A row is inserted with a positive
    # size, so the upsert never meets the CHECK with a negative value; a
    # delete finds the top's row, made by the insert.
    """
    CREATE TRIGGER uploads_added AFTER INSERT ON uploads BEGIN
        INSERT INTO footprint (top, uncommitted_bytes, retained_bytes, collectable_bytes)
        VALUES (NEW.top, NEW.size, 0, 0)
        ON CONFLICT (top) DO UPDATE SET uncommitted_bytes = uncommitted_bytes + NEW.size;
        DELETE FROM collectable WHERE hash = NEW.hash;
    END
    """,
    """
    CREATE TRIGGER uploads_removed AFTER DELETE ON uploads BEGIN
        UPDATE footprint SET uncommitted_bytes = uncommitted_bytes - OLD.size
        WHERE top = OLD.top;
    END
    """,
    """
    CREATE TRIGGER retained_added AFTER INSERT ON retained_chunks BEGIN
        INSERT INTO footprint (top, uncommitted_bytes, retained_bytes, collectable_bytes)
        VALUES (NEW.top, 0, NEW.size, 0)
        ON CONFLICT (top) DO UPDATE SET retained_bytes = retained_bytes + NEW.size;
    END
    """,
    """
    CREATE TRIGGER retained_removed AFTER DELETE ON retained_chunks BEGIN
        UPDATE footprint SET retained_bytes = retained_bytes - OLD.size WHERE top = OLD.top;
    END
    """,
    """
    CREATE TRIGGER collectable_added AFTER INSERT ON collectable BEGIN
        INSERT INTO footprint (top, uncommitted_bytes, retained_bytes, collectable_bytes)
        VALUES (NEW.top, 0, 0, NEW.size)
        ON CONFLICT (top) DO UPDATE SET collectable_bytes = collectable_bytes + NEW.size;
    END
    """,
    """
    CREATE TRIGGER collectable_removed AFTER DELETE ON collectable BEGIN
        UPDATE footprint SET collectable_bytes = collectable_bytes - OLD.size
        WHERE top = OLD.top;
    END
    """,
    # A live file of a top starts to name a chunk (a chunk_refs row is
    # made; an existing row only counting more references is an update): it
    # is no longer uploaded, retained or collectable for anyone's sake.
    """
    CREATE TRIGGER chunk_named AFTER INSERT ON chunk_refs BEGIN
        DELETE FROM uploads WHERE top = NEW.top AND hash = NEW.hash;
        DELETE FROM retained_chunks WHERE top = NEW.top AND hash = NEW.hash;
        DELETE FROM collectable WHERE hash = NEW.hash;
    END
    """,
    # The top of the row's path (every row of a change lies in one top), so
    # a top's oldest rows are found without a scan.
    "ALTER TABLE journal ADD COLUMN top TEXT NOT NULL DEFAULT ''",
    """
    UPDATE journal SET top = CASE
        WHEN path = '/' THEN ''
        WHEN instr(substr(path, 2), '/') = 0 THEN substr(path, 2)
        ELSE substr(path, 2, instr(substr(path, 2), '/') - 1)
    END
    """,
    "CREATE INDEX journal_by_top ON journal (top, seq)",
)


def _retain_journaled_chunks(connection: sqlite3.Connection) -> None:
    """
    Migration 2's backfill: every chunk named by an existing row's old or
    replaced state that no live file of the row's top names is retained by
    the newest such row (after its last release, no snapshot of the top can
    name it); the totals follow.
    """
    rows = connection.execute(
        "SELECT seq, top, old_state, replaced_state FROM journal ORDER BY seq"
    ).fetchall()
    newest: dict[tuple[str, bytes], tuple[int, int]] = {}
    for seq, top, old_state, replaced_state in rows:
        for blob in (old_state, replaced_state):
            if blob is None:
                continue
            records = msgpack.unpackb(blob, raw=False)["chunks"]
            for start in range(0, len(records), 40):
                digest = bytes(records[start : start + 32])
                size = int.from_bytes(records[start + 32 : start + 40], "big")
                newest[(top, digest)] = (seq, size)
    # The triggers keep the footprint totals.
    connection.executemany(
        "INSERT INTO retained_chunks (top, hash, size, last_seq) SELECT ?1, ?2, ?3, ?4"
        " WHERE NOT EXISTS (SELECT 1 FROM chunk_refs WHERE top = ?1 AND hash = ?2)",
        [(top, digest, size, seq) for (top, digest), (seq, size) in newest.items()],
    )


_SCHEMA_3 = (
    # The answer to each change a mount's outbox sent that was applied, in
    # the transaction that applied it, until the mount says the entry is
    # settled: the same entry sent again gets this answer, not a second run
    # (svc.store.outbox_answers).
    """
    CREATE TABLE outbox_answers (
        agent_id  TEXT    NOT NULL,                 -- whose disk (its top)
        outbox    BLOB    NOT NULL CHECK (length(outbox) = 16),
        seq       INTEGER NOT NULL CHECK (seq >= 1),
        at_ms     INTEGER NOT NULL,                 -- when it was applied
        answer    BLOB    NOT NULL,                 -- opaque: the wire answer sent
        PRIMARY KEY (agent_id, outbox, seq)
    ) WITHOUT ROWID
    """,
)


_SCHEMA_4 = (
    # A directory's page of names after a given one, in name order, read
    # from the index alone (svc.store.manifest_reads.list_directory): a
    # listing costs the rows of its page, not the whole directory's.
    "CREATE INDEX names_by_parent_path ON names (parent, path)",
    "DROP INDEX names_by_parent",
)


#: Every migration, in order; versions are 1, 2, 3, ... without gaps.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "namespace, chunk references, journal", _SCHEMA_1),
    Migration(
        2,
        "footprint: uploads, retained and collectable chunks, journal top",
        _SCHEMA_2,
        _retain_journaled_chunks,
    ),
    Migration(3, "answers of applied outbox entries", _SCHEMA_3),
    Migration(4, "names listed by parent in name order", _SCHEMA_4),
)

#: The schema version this code reads and writes.
CURRENT_VERSION = MIGRATIONS[-1].version


def configure(connection: sqlite3.Connection) -> None:
    """
    Set the per-connection pragmas: WAL, C{synchronous=FULL} (a commit is on
    disk when it returns, surviving power loss), foreign keys, and a busy
    timeout for outside readers such as a backup.
    """
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = FULL")
    connection.execute("PRAGMA foreign_keys = ON")
    connection.execute("PRAGMA busy_timeout = 5000")


def migrate(connection: sqlite3.Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> int:
    """
    Bring routes.db up to the last of ``migrations`` (see
    L{svc.store.sqlite_migrations.apply_migrations}); the resulting version.
    """
    return apply_migrations(connection, migrations, "routes.db")
