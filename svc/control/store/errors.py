"""
The control-plane store's exception tree.

Expected refusals that the route layer branches on are either typed results
(L{svc.control.store.outcomes}) or one of these exceptions; the HTTP layer
translates them once, at its boundary. A database that cannot serve for now
is L{Unavailable} (HTTP 503); any other exception escaping a store is a bug
or a broken database (HTTP 500).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from svc.control.store.values import Server


class ControlStoreError(Exception):
    """
    A store operation was refused for a reason a caller should hear about.
    """

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


class InvalidValue(ControlStoreError, ValueError):
    """
    An argument is malformed: a bad id, a negative byte count, a naive
    datetime (HTTP 400).
    """


class NotFound(ControlStoreError):
    """
    The record does not exist, or is not visible to the caller (HTTP 404).
    """


class Conflict(ControlStoreError):
    """
    The request contradicts what is stored (HTTP 409). ``code`` is a stable
    machine-readable string; the codes are listed in
    ``docs/specifications/control-db.md``.
    """

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(message or code)
        self.code = code


class ServerKeyConflict(Conflict):
    """
    A data-plane server's FQDN is registered under another identity key,
    which the registration did not name to replace (HTTP 409
    ``fqdn_registered``). ``server`` is the registration as stored.
    """

    def __init__(self, server: Server) -> None:
        super().__init__("fqdn_registered", "the FQDN is registered under another identity key")
        self.server = server


class Revoked(ControlStoreError):
    """
    The allocation has been revoked (or purged); later use is refused (HTTP
    410 ``revoked``).
    """

    def __init__(self, allocation_id: str) -> None:
        super().__init__(f"allocation {allocation_id} is revoked")
        self.allocation_id = allocation_id


class LeaseLost(ControlStoreError):
    """
    The caller does not hold the allocation's mount lease (any more) (HTTP
    410 ``lease_lost``).
    """


class Unavailable(ControlStoreError):
    """
    The database cannot serve now: a lock stayed held past the store's
    wait (another process writing, a long transaction), or the connection
    is gone. Nothing was changed; the same call may succeed later (HTTP 503).
    """


class SchemaTooNew(ControlStoreError):
    """
    The database was migrated by a newer version of svc than this one; it is
    refused rather than risk damaging it.
    """

    def __init__(self, found: int, known: int) -> None:
        super().__init__(
            f"control database schema version {found} is newer than the {known} "
            "this version of svc knows; upgrade svc or point DATABASE_URL elsewhere"
        )
        self.found = found
        self.known = known
