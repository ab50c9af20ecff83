"""
What a request names, as the server's checks see it: every path it carries
with its kind of access (L{path_uses}, for confinement and the path
policy), the path its audit line names (L{first_path}) and the
C{session_id} it presents (L{session_of}). The requests themselves are the
messages declared in L{svc.wire.messages}.
"""

from __future__ import annotations

import attrs

from svc.wire.messages import JournalQueryRequest, TwoPathRequest
from svc.wire.ops import Op

TRAVERSING_OPS = frozenset({Op.LIST, Op.HEAD_FILE})
"""Operations whose path may be a directory on the way to what the policy allows."""


@attrs.frozen
class PathUse:
    """
    One path a request carries and how it uses it: C{write} for a change,
    C{traverse} for a listing or stat (directories on the way to what the
    policy allows may be traversed).
    """

    path: str
    write: bool = False
    traverse: bool = False


def path_uses(op: Op, request: object, *, writes: bool) -> tuple[PathUse, ...]:
    """
    Every path C{request} (of operation C{op}; C{writes} when it changes
    the tenant's data) carries, each with its kind of access; chunk,
    lease-id and connection operations carry none.
    """
    if isinstance(request, TwoPathRequest):
        # A link's existing name is only read, but must not be denied either:
        # linking it elsewhere would expose it under another name.
        return (
            PathUse(request.path, write=op is Op.MANIFEST_RENAME),
            PathUse(request.to_path, True),
        )
    if op in TRAVERSING_OPS:
        return (PathUse(first_path(request) or "", traverse=True),)
    if isinstance(request, JournalQueryRequest):
        return () if request.path is None else (PathUse(request.path),)
    path = first_path(request)
    if path is not None:
        return (PathUse(path, write=writes),)
    return ()


def first_path(request: object) -> str | None:
    """The path an audit line names for C{request} (the source of two)."""
    path = getattr(request, "path", None)
    return path if isinstance(path, str) else None


def session_of(request: object) -> str | None:
    """The C{session_id} a request carries, if any."""
    session = getattr(request, "session_id", None)
    return session if isinstance(session, str) else None
