"""
When an C{unlink} may return once its C{manifest_delete} is sent, and what
happens when the answer arrives (``docs/specifications/mount-consistency.md``
section 2.6).

C{rm -r} of a tree unlinks one file after another, each call waiting for
its own answer: the data plane's round trip per file, one at a time. A
handed-off unlink instead returns once its request is sent, in order on the
mount's connection, under the namespace lock (L{NamespaceLock.unlinking});
the next one goes out while the data plane runs the first. An C{rmdir} of a
directory the mount has listed whole and holds empty is handed off the same
way (the rest of this module says "unlink" for both). L{UnlinkHandOffs}
decides (the same rules as a close's hand-off: not in C{durable_close}
mode, bounded, and not after a failure until an unlink succeeds again);
L{settle_unlink} handles the answer.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.mount.client_audit import AuditLine
from svc.mount.errors import FSError, RemoteFailure
from svc.mount.fs_context import FSContext
from svc.mount.inodes import Node

_log = Logger()

UNLINK_HAND_OFF_MAX = 64
"""Most handed-off unlinks unanswered at once: an unlink beyond waits for its own."""


class UnlinkHandOffs:
    """Whether the next unlink may hand off; see the module docstring."""

    def __init__(self, *, durable: bool) -> None:
        """@param durable: no unlink hands off (C{durable_close}: every call waits)."""
        self._durable = durable
        self._failed = False  # a handed-off unlink failed since the last success

    def allowed(self, in_flight: int, *, read_only: bool) -> bool:
        """With C{in_flight} handed-off unlinks unanswered, whether one more may go."""
        return (
            not self._durable
            and not self._failed
            and not read_only
            and in_flight < UNLINK_HAND_OFF_MAX
        )

    def succeeded(self) -> None:
        """An unlink (handed off or not) succeeded: unlinks may hand off again."""
        self._failed = False

    def failed(self) -> None:
        """A handed-off unlink failed: until one succeeds, unlinks wait for their answers."""
        self._failed = True


def settle_unlink(
    ctx: FSContext,
    hand_offs: UnlinkHandOffs,
    folder: Node,
    name: str,
    line: AuditLine,
    settle: Callable[[], None],
    answer: int | Failure | None,
) -> None:
    """
    The answer to a handed-off unlink (or rmdir) of C{name} in C{folder},
    which already counts the removal (version, link count, the mount's
    time). Success: the folder's times become the
    server's, as a waited-for unlink would have set them, and the audit
    line is written. Failure (the name still exists on the
    server, or nobody knows): the line with C{allowed: false}, a warning,
    and the folder is forgotten as listed (no longer complete, attributes
    stale, the kernel's entry dropped) so the next lookup or listing asks
    the server and the name is seen again; unlinks wait for their answers
    until one succeeds. Either way the unlink stops counting as in flight.
    """
    try:
        if not isinstance(answer, Failure):
            folder.entries_changed(answer, versions=0)  # the server's times
            hand_offs.succeeded()
            line.write(True)
            return
        hand_offs.failed()
        line.write(False)
        error = answer.value
        if isinstance(error, RemoteFailure):
            error = ctx.write_failed(error)
        if isinstance(error, FSError):
            _log.warn(
                "removal of {path} failed after it returned: {error}; "
                "the name is shown again and later removals wait for their answers",
                path=line.path,
                error=error,
            )
        else:
            _log.failure("removal of {path} failed", answer, path=line.path)
        folder.complete = False
        folder.stale = True
        ctx.invalidate(folder.ino)
        ctx.invalidate_entry(folder.ino, name.encode("utf-8", "surrogateescape"))
    finally:
        settle()
