"""
The control-plane schema for SQLite (``DATABASE_URL=sqlite:///path``).

Every table is C{STRICT}. Timestamps are INTEGER microseconds since the Unix
epoch (UTC), in columns ending in C{_us}; booleans are INTEGER 0/1; hashes
are SHA-256 as 64 lowercase hex characters. The PostgreSQL schema in
L{svc.control.store.migrations.postgres} has the same tables, columns,
constraints and indexes with that database's types.
"""

from __future__ import annotations

from svc.control.store.migrations import Migration
from svc.control.store.sql import Sql

#: Creates the version table; runs before every migration check.
PRELUDE = (
    Sql(
        """
        CREATE TABLE IF NOT EXISTS schema_migrations (
            version     INTEGER PRIMARY KEY,   -- migration number, 1, 2, 3, ...
            description TEXT NOT NULL,
            applied_us  INTEGER NOT NULL       -- when it was applied
        ) STRICT
        """
    ),
)

_INITIAL = (
    # Users own tenants and allocations: an allocation's owner id is a user
    # id, and an agent leaf's CN is that id. A user also logs in to the
    # dashboard (admin sessions) and owns API tokens. budget_bytes is the
    # account's shared budget across its allocations (NULL: none).
    """
    CREATE TABLE users (
        user_id      TEXT PRIMARY KEY,
        display_name TEXT NOT NULL,
        budget_bytes INTEGER CHECK (budget_bytes IS NULL OR budget_bytes >= 0),
        suspended    INTEGER NOT NULL DEFAULT 0 CHECK (suspended IN (0, 1)),
        created_us   INTEGER NOT NULL
    ) STRICT
    """,
    # A tenant belongs to exactly one user for ever. (tenant_id, owner_id)
    # is unique so that allocations can reference the pair.
    """
    CREATE TABLE tenants (
        tenant_id  TEXT PRIMARY KEY,
        owner_id   TEXT NOT NULL REFERENCES users (user_id),
        suspended  INTEGER NOT NULL DEFAULT 0 CHECK (suspended IN (0, 1)),
        created_us INTEGER NOT NULL,
        UNIQUE (tenant_id, owner_id)
    ) STRICT
    """,
    "CREATE INDEX tenants_by_owner ON tenants (owner_id)",
    # Disk allocations. agent_id is set for agent-scoped allocations and is
    # unique for ever (an agent is its allocation; agent ids are never
    # reused). The tenant must belong to the owner (composite key).
    """
    CREATE TABLE allocations (
        allocation_id TEXT PRIMARY KEY,      -- 32 lowercase hex, random
        agent_id      TEXT UNIQUE,           -- NULL: owner-scoped allocation
        owner_id      TEXT NOT NULL REFERENCES users (user_id),
        tenant_id     TEXT NOT NULL,
        grant_bytes   INTEGER NOT NULL CHECK (grant_bytes >= 0),
        state         TEXT NOT NULL CHECK (state IN ('provisioned', 'revoked', 'purged')),
        created_us    INTEGER NOT NULL,
        revoked_us    INTEGER,               -- set when state left 'provisioned'
        purged_us     INTEGER,               -- set when state became 'purged'
        FOREIGN KEY (tenant_id, owner_id) REFERENCES tenants (tenant_id, owner_id),
        CHECK ((state = 'provisioned') = (revoked_us IS NULL)),
        CHECK ((state = 'purged') = (purged_us IS NOT NULL))
    ) STRICT
    """,
    "CREATE INDEX allocations_by_owner ON allocations (owner_id, created_us)",
    "CREATE INDEX allocations_by_state ON allocations (state)",
    # At most one live owner-scoped allocation per (owner, tenant).
    """
    CREATE UNIQUE INDEX allocations_owner_scoped ON allocations (owner_id, tenant_id)
        WHERE agent_id IS NULL AND state = 'provisioned'
    """,
    # Single-use enroll tokens; only the SHA-256 of the token is stored.
    """
    CREATE TABLE enroll_tokens (
        token_id      TEXT PRIMARY KEY,      -- 32 lowercase hex, random
        token_hash    TEXT NOT NULL UNIQUE CHECK (length(token_hash) = 64),
        allocation_id TEXT NOT NULL REFERENCES allocations (allocation_id),
        created_us    INTEGER NOT NULL,
        expires_us    INTEGER NOT NULL,
        consumed_us   INTEGER,               -- set once, when spent
        revoked_us    INTEGER,
        leaf_serial   TEXT                   -- the leaf minted with it
    ) STRICT
    """,
    "CREATE INDEX enroll_tokens_by_allocation ON enroll_tokens (allocation_id)",
    # Long-lived API tokens (prefix svc_); only hashes stored.
    """
    CREATE TABLE api_tokens (
        token_id     TEXT PRIMARY KEY,
        user_id      TEXT NOT NULL REFERENCES users (user_id),
        name         TEXT NOT NULL,
        token_hash   TEXT NOT NULL UNIQUE CHECK (length(token_hash) = 64),
        created_us   INTEGER NOT NULL,
        last_used_us INTEGER,
        revoked_us   INTEGER
    ) STRICT
    """,
    "CREATE INDEX api_tokens_by_user ON api_tokens (user_id, created_us)",
    # Dashboard sessions; only hashes of the session tokens stored.
    """
    CREATE TABLE admin_sessions (
        session_id   TEXT PRIMARY KEY,
        user_id      TEXT NOT NULL REFERENCES users (user_id),
        session_hash TEXT NOT NULL UNIQUE CHECK (length(session_hash) = 64),
        created_us   INTEGER NOT NULL,
        expires_us   INTEGER NOT NULL,
        revoked_us   INTEGER
    ) STRICT
    """,
    "CREATE INDEX admin_sessions_by_expiry ON admin_sessions (expires_us)",
    # The exclusive mount lease of an allocation (at most one row each),
    # held by one enrollment: the leaf minted at enrollment.
    """
    CREATE TABLE mount_leases (
        allocation_id     TEXT PRIMARY KEY REFERENCES allocations (allocation_id),
        agent_id          TEXT NOT NULL,
        leaf_serial       TEXT NOT NULL,     -- identifies the enrollment
        leaf_not_after_us INTEGER NOT NULL,  -- copied to cert_revocations on release
        fingerprint       TEXT,              -- of the holder's leaf, if known
        session_id        TEXT NOT NULL UNIQUE,  -- 'mount:' + 32 lowercase hex
        bound_us          INTEGER NOT NULL,
        expires_us        INTEGER NOT NULL
    ) STRICT
    """,
    # Every certificate the control plane signed (the durable audit of
    # signing events).
    """
    CREATE TABLE issued_certificates (
        serial       TEXT PRIMARY KEY,       -- lowercase hex
        kind         TEXT NOT NULL CHECK (kind IN ('agent_leaf', 'server_leaf', 'control',
                                                  'tenant_intermediate', 'org_root')),
        subject      TEXT NOT NULL,          -- CN
        tenant_id    TEXT,
        agent_id     TEXT,
        fingerprint  TEXT,
        not_after_us INTEGER NOT NULL,
        issued_us    INTEGER NOT NULL
    ) STRICT
    """,
    "CREATE INDEX issued_certificates_by_fingerprint ON issued_certificates (fingerprint)",
    "CREATE INDEX issued_certificates_by_tenant ON issued_certificates (tenant_id, issued_us)",
    # Revoked serials, pushed to data-plane servers; a row ages out once the
    # certificate has expired.
    """
    CREATE TABLE cert_revocations (
        serial       TEXT PRIMARY KEY,
        not_after_us INTEGER NOT NULL,
        revoked_us   INTEGER NOT NULL
    ) STRICT
    """,
    "CREATE INDEX cert_revocations_by_expiry ON cert_revocations (not_after_us)",
    # Data-plane servers, registered by FQDN.
    """
    CREATE TABLE servers (
        server_id         TEXT PRIMARY KEY,  -- 32 lowercase hex, random
        fqdn              TEXT NOT NULL UNIQUE,
        address           TEXT NOT NULL,     -- what mount clients dial
        capacity          INTEGER NOT NULL CHECK (capacity >= 0),  -- most tenants
        registered_us     INTEGER NOT NULL,
        last_seen_us      INTEGER NOT NULL,
        cert_serial       TEXT,
        cert_not_after_us INTEGER
    ) STRICT
    """,
    # Where each tenant lives; sticky once written.
    """
    CREATE TABLE tenant_placements (
        tenant_id TEXT PRIMARY KEY REFERENCES tenants (tenant_id),
        server_id TEXT NOT NULL REFERENCES servers (server_id),
        placed_us INTEGER NOT NULL
    ) STRICT
    """,
    "CREATE INDEX tenant_placements_by_server ON tenant_placements (server_id)",
    # CA certificates and caller-encrypted keys (SVC_SECRETS_BACKEND=postgres;
    # kept in the SQLite schema too so both schemas stay the same).
    """
    CREATE TABLE ca_material (
        ca_id             TEXT PRIMARY KEY,  -- 'root' or 'tenant/<tenant_id>'
        kind              TEXT NOT NULL CHECK (kind IN ('root', 'tenant')),
        tenant_id         TEXT,
        cert_pem          BLOB NOT NULL,
        encrypted_key_pem BLOB NOT NULL,
        created_us        INTEGER NOT NULL,
        CHECK ((kind = 'tenant') = (tenant_id IS NOT NULL))
    ) STRICT
    """,
)

_SESSIONS_AND_HTTPS = (
    # The mount-lease epoch of an allocation: incremented by every grant of
    # its mount lease, whose session id (svc.sessions) carries it. It lives
    # on the allocation because lease rows are deleted on release.
    """
    ALTER TABLE allocations
        ADD COLUMN mount_epoch INTEGER NOT NULL DEFAULT 0 CHECK (mount_epoch >= 0)
    """,
    # The epoch of a lease's session id (0 for leases granted before this
    # migration, whose session ids were 'mount:' + 32 random hex).
    """
    ALTER TABLE mount_leases
        ADD COLUMN session_epoch INTEGER NOT NULL DEFAULT 0 CHECK (session_epoch >= 0)
    """,
    # Where the control plane reaches a data-plane server over HTTPS
    # (host:port); NULL for servers registered before this migration.
    "ALTER TABLE servers ADD COLUMN http_address TEXT",
)

_ENROLLMENT_CHAINS = (
    # The enrollment an agent leaf belongs to, named by the serial of the
    # leaf minted at that enrollment: the leaf's own serial for a leaf
    # minted at enrollment, the renewed leaf's enrollment for a leaf minted
    # by renewal; NULL for other kinds. Ending a mount lease revokes every
    # unexpired leaf of its holder's enrollment, so a connection opened with
    # a leaf the holder has since renewed is closed too.
    "ALTER TABLE issued_certificates ADD COLUMN enrollment_serial TEXT",
    # Agent leaves recorded before this migration each start their own
    # enrollment (which leaf a renewal came from was not recorded).
    "UPDATE issued_certificates SET enrollment_serial = serial WHERE kind = 'agent_leaf'",
    "CREATE INDEX issued_certificates_by_enrollment"
    " ON issued_certificates (enrollment_serial, not_after_us)",
)

_AGENT_LEAVES = (
    # Revoking or reassigning an agent revokes every unexpired leaf issued
    # to it, whatever its enrollment: found by agent and not-after.
    "CREATE INDEX issued_certificates_by_agent ON issued_certificates (agent_id, not_after_us)",
)

_SERVER_IDENTITY = (
    # The identity key a data-plane server registered its FQDN under: 64
    # lowercase hex digits, the raw ed25519 public key (svc.pki.server_identity).
    # Another key is refused the FQDN unless it names this one to replace
    # it; NULL (servers registered before this migration) is claimed by
    # the next registration.
    "ALTER TABLE servers ADD COLUMN identity_key TEXT",
)

#: Every migration, in order; versions are 1, 2, 3, ... without gaps.
MIGRATIONS = (
    Migration(1, "initial control-plane schema", _INITIAL),
    Migration(2, "mount-lease epochs and server HTTPS addresses", _SESSIONS_AND_HTTPS),
    Migration(3, "enrollment chains of agent leaves", _ENROLLMENT_CHAINS),
    Migration(4, "agent leaves by agent", _AGENT_LEAVES),
    Migration(5, "server identity keys", _SERVER_IDENTITY),
)
