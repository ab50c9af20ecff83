"""
Transactions over credentials: single-use enroll tokens, API tokens and
admin (dashboard) sessions. Only SHA-256 hashes of secrets ever reach the
database; lookups are by hash.
"""

# Statements below interpolate only this package's constant column lists and
# fixed clauses; every value goes through a parameter.
# ruff: noqa: S608

from __future__ import annotations

from svc.control.store.errors import Conflict, NotFound, Revoked
from svc.control.store.outcomes import (
    EnrollGrant,
    EnrollOutcome,
    EnrollRefusal,
    EnrollRefusalReason,
)
from svc.control.store.rules import enroll_verdict
from svc.control.store.sql import Rows, Sql, Transaction
from svc.control.store.transactions import rows
from svc.control.store.transactions.common import locked_allocation
from svc.control.store.transactions.mounts import record_certificate
from svc.control.store.values import (
    AdminSession,
    Allocation,
    ApiToken,
    EnrollToken,
    IssuedCertificate,
    Tenant,
    User,
    from_micros,
)

#: Conflict code: a token with this hash already exists.
DUPLICATE_TOKEN = "duplicate_token"  # noqa: S105 - an error code

_SELECT_ENROLL = f"SELECT {rows.ENROLL_TOKEN_COLUMNS} FROM enroll_tokens"


def create_enroll_token(
    token_id: str, token_hash: str, allocation_id: str, now_us: int, expires_us: int
) -> Transaction[EnrollToken]:
    """
    Store a new enroll token for live allocation C{allocation_id}
    (L{NotFound}, L{Revoked}; L{Conflict} C{duplicate_token} if the hash is
    taken).
    """
    allocation = yield from locked_allocation(allocation_id)
    if not allocation.live:
        raise Revoked(allocation_id)
    found: Rows = yield Sql(
        "INSERT INTO enroll_tokens (token_id, token_hash, allocation_id, created_us, expires_us)"
        " VALUES (?, ?, ?, ?, ?) ON CONFLICT (token_hash) DO NOTHING"
        f" RETURNING {rows.ENROLL_TOKEN_COLUMNS}",
        (token_id, token_hash, allocation_id, now_us, expires_us),
    )
    if not found.rows:
        raise Conflict(DUPLICATE_TOKEN, "an enroll token with this hash exists")
    return rows.enroll_token(found.only())


def get_enroll_token(token_id: str) -> Transaction[EnrollToken]:
    """Enroll token C{token_id} (L{NotFound} if none)."""
    found: Rows = yield Sql(f"{_SELECT_ENROLL} WHERE token_id = ?", (token_id,))
    row = found.one()
    if row is None:
        raise NotFound(f"no enroll token {token_id}")
    return rows.enroll_token(row)


def _binding(token: EnrollToken) -> Transaction[tuple[Allocation, User, Tenant] | None]:
    found: Rows = yield Sql(
        f"SELECT {rows.ALLOCATION_COLUMNS} FROM allocations WHERE allocation_id = ?",
        (token.allocation_id,),
    )
    row = found.one()
    if row is None:
        return None
    allocation = rows.allocation(row)
    users: Rows = yield Sql(
        f"SELECT {rows.USER_COLUMNS} FROM users WHERE user_id = ?",
        (allocation.owner_id,),
    )
    tenants: Rows = yield Sql(
        f"SELECT {rows.TENANT_COLUMNS} FROM tenants WHERE tenant_id = ?",
        (allocation.tenant_id,),
    )
    return allocation, rows.user(users.only()), rows.tenant(tenants.only())


def _verdict(token_hash: str, now_us: int, lock: bool) -> Transaction[EnrollOutcome]:
    found: Rows = yield Sql(f"{_SELECT_ENROLL} WHERE token_hash = ?", (token_hash,), lock=lock)
    row = found.one()
    token = None if row is None else rows.enroll_token(row)
    bound = None if token is None else (yield from _binding(token))
    return enroll_verdict(token, bound, from_micros(now_us))


def peek_enroll_token(token_hash: str, now_us: int) -> Transaction[EnrollOutcome]:
    """
    What L{consume_enroll_token} would answer at C{now_us}, without spending
    the token.
    """
    return (yield from _verdict(token_hash, now_us, lock=False))


def consume_enroll_token(token_hash: str, now_us: int) -> Transaction[EnrollOutcome]:
    """
    Spend the enroll token with hash C{token_hash} if every rule of
    L{svc.control.store.rules.enroll_verdict} allows it. The token row is
    locked and the spend is a conditional update, so of concurrent consumers
    at most one gets the grant; the others are refused C{consumed}.
    """
    outcome = yield from _verdict(token_hash, now_us, lock=True)
    if not isinstance(outcome, EnrollGrant):
        return outcome
    spent: Rows = yield Sql(
        "UPDATE enroll_tokens SET consumed_us = ? WHERE token_id = ?"
        " AND consumed_us IS NULL AND revoked_us IS NULL AND expires_us > ?",
        (now_us, outcome.token_id, now_us),
    )
    if spent.rowcount != 1:
        return EnrollRefusal(EnrollRefusalReason.CONSUMED)
    return outcome


def record_enrollment(token_id: str, leaf: IssuedCertificate) -> Transaction[None]:
    """
    Record the leaf minted with spent enroll token C{token_id}: its serial
    on the token, the certificate in C{issued_certificates} (L{NotFound} if
    no spent token has that id).
    """
    found: Rows = yield Sql(
        "UPDATE enroll_tokens SET leaf_serial = ? WHERE token_id = ? AND consumed_us IS NOT NULL",
        (leaf.serial, token_id),
    )
    if found.rowcount != 1:
        raise NotFound(f"no spent enroll token {token_id}")
    yield from record_certificate(leaf)


def revoke_enroll_token(token_id: str, now_us: int) -> Transaction[EnrollToken]:
    """
    Revoke enroll token C{token_id} unless it is spent or revoked already
    (then it is returned unchanged); L{NotFound} if none.
    """
    yield Sql(
        "UPDATE enroll_tokens SET revoked_us = ?"
        " WHERE token_id = ? AND consumed_us IS NULL AND revoked_us IS NULL",
        (now_us, token_id),
    )
    return (yield from get_enroll_token(token_id))


def create_api_token(
    token_id: str, user_id: str, name: str, token_hash: str, now_us: int
) -> Transaction[ApiToken]:
    """
    Store a new API token of user C{user_id} (L{NotFound} if no such user;
    L{Conflict} C{duplicate_token} if the hash is taken).
    """
    users: Rows = yield Sql("SELECT user_id FROM users WHERE user_id = ?", (user_id,))
    if not users.rows:
        raise NotFound(f"no user {user_id}")
    found: Rows = yield Sql(
        "INSERT INTO api_tokens (token_id, user_id, name, token_hash, created_us)"
        " VALUES (?, ?, ?, ?, ?) ON CONFLICT (token_hash) DO NOTHING"
        f" RETURNING {rows.API_TOKEN_COLUMNS}",
        (token_id, user_id, name, token_hash, now_us),
    )
    if not found.rows:
        raise Conflict(DUPLICATE_TOKEN, "an API token with this hash exists")
    return rows.api_token(found.only())


def list_api_tokens(user_id: str) -> Transaction[tuple[ApiToken, ...]]:
    """Every API token of C{user_id}, revoked ones included, oldest first."""
    found: Rows = yield Sql(
        f"SELECT {rows.API_TOKEN_COLUMNS} FROM api_tokens WHERE user_id = ?"
        " ORDER BY created_us, token_id",
        (user_id,),
    )
    return tuple(rows.api_token(row) for row in found.rows)


def revoke_api_token(user_id: str, token_id: str, now_us: int) -> Transaction[ApiToken]:
    """
    Revoke API token C{token_id} of C{user_id} (idempotent; L{NotFound} if
    C{user_id} has no such token).
    """
    yield Sql(
        "UPDATE api_tokens SET revoked_us = ?"
        " WHERE token_id = ? AND user_id = ? AND revoked_us IS NULL",
        (now_us, token_id, user_id),
    )
    found: Rows = yield Sql(
        f"SELECT {rows.API_TOKEN_COLUMNS} FROM api_tokens WHERE token_id = ? AND user_id = ?",
        (token_id, user_id),
    )
    row = found.one()
    if row is None:
        raise NotFound(f"no API token {token_id}")
    return rows.api_token(row)


def authenticate_api_token(token_hash: str, now_us: int) -> Transaction[ApiToken | None]:
    """
    The unrevoked API token with hash C{token_hash} whose user is not
    suspended, its C{last_used_at} set to C{now_us}; L{None} otherwise.
    """
    found: Rows = yield Sql(
        "UPDATE api_tokens SET last_used_us = ? WHERE token_hash = ? AND revoked_us IS NULL"
        " AND user_id IN (SELECT user_id FROM users WHERE NOT suspended)"
        f" RETURNING {rows.API_TOKEN_COLUMNS}",
        (now_us, token_hash),
    )
    row = found.one()
    return None if row is None else rows.api_token(row)


def create_admin_session(
    session_id: str, user_id: str, session_hash: str, now_us: int, expires_us: int
) -> Transaction[AdminSession]:
    """
    Store a new dashboard session of C{user_id} (L{NotFound} if no such
    user; L{Conflict} C{duplicate_token} if the hash is taken).
    """
    users: Rows = yield Sql("SELECT user_id FROM users WHERE user_id = ?", (user_id,))
    if not users.rows:
        raise NotFound(f"no user {user_id}")
    found: Rows = yield Sql(
        "INSERT INTO admin_sessions (session_id, user_id, session_hash, created_us, expires_us)"
        " VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_hash) DO NOTHING"
        f" RETURNING {rows.ADMIN_SESSION_COLUMNS}",
        (session_id, user_id, session_hash, now_us, expires_us),
    )
    if not found.rows:
        raise Conflict(DUPLICATE_TOKEN, "a session with this hash exists")
    return rows.admin_session(found.only())


def authenticate_admin_session(
    session_hash: str, now_us: int
) -> Transaction[tuple[AdminSession, User] | None]:
    """
    The session with hash C{session_hash} and its user, if the session is
    unrevoked and unexpired at C{now_us} and the user is not suspended.
    """
    found: Rows = yield Sql(
        f"SELECT {rows.ADMIN_SESSION_COLUMNS} FROM admin_sessions"
        " WHERE session_hash = ? AND revoked_us IS NULL AND expires_us > ?",
        (session_hash, now_us),
    )
    row = found.one()
    if row is None:
        return None
    session = rows.admin_session(row)
    users: Rows = yield Sql(
        f"SELECT {rows.USER_COLUMNS} FROM users WHERE user_id = ?",
        (session.user_id,),
    )
    user = rows.user(users.only())
    return None if user.suspended else (session, user)


def revoke_admin_session(session_hash: str, now_us: int) -> Transaction[bool]:
    """End the session with hash C{session_hash}; whether one was live."""
    found: Rows = yield Sql(
        "UPDATE admin_sessions SET revoked_us = ? WHERE session_hash = ? AND revoked_us IS NULL",
        (now_us, session_hash),
    )
    return found.rowcount == 1


def prune_admin_sessions(now_us: int) -> Transaction[int]:
    """Delete sessions expired or revoked by C{now_us}; how many."""
    found: Rows = yield Sql(
        "DELETE FROM admin_sessions WHERE expires_us <= ? OR revoked_us IS NOT NULL",
        (now_us,),
    )
    return found.rowcount
