"""
When an C{unlink}, C{rmdir} or C{rename} may return once its request is
sent, and what happens when the answer arrives
(``docs/specifications/mount-consistency.md`` section 2.6).

C{rm -r} of a tree unlinks one file after another, and an atomic save
(a compiler's or Python's byte code, an editor, pip, git's lock files)
writes a temporary file and renames it over the real name; each call
waiting for its own answer costs the data plane's round trip. A handed-off
change instead returns once its request is sent, in order on the mount's
connection, under the namespace lock (L{NamespaceLock.handing_off}); the
next one goes out while the data plane runs the first. The mount's picture
shows the change at once. L{NamespaceHandOffs} decides (the same rules as a
close's hand-off: not in C{durable_close} mode, bounded, and not after a
failure until a change succeeds again, and not while the data plane's
connection is down); L{settle_unlink} and
L{settle_rename} handle the answers. A later change of the same names
waits until the handed-off change is answered (L{settled_at}).

Every change is sent by the outbox's one sender
(L{svc.mount.remote.remote_changes}): an answer that never came (the
connection was lost after the request was sent) is sent again with its
outbox tag, in order with the others, held through an outage, so the data
plane answers a change that ran as it did, and runs one that did not. The
answer handled here is the final one. While the sender holds changes back,
nothing hands off (L{NamespaceHandOffs}'s C{connected}).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.mount.core.client_audit import AuditLine
from svc.mount.core.errors import FSError, RemoteFailure
from svc.mount.core.fs_context import FSContext, decode_name
from svc.mount.core.inodes import Node
from svc.mount.remote.never_created import never_created, rename_outcome
from svc.mount.remote.remote_values import RenameResult

_log = Logger()

NAMESPACE_HAND_OFF_MAX = 64
"""Most handed-off changes unanswered at once: a change beyond waits for its own."""


class NamespaceHandOffs:
    """Whether the next unlink, rmdir or rename may hand off; see the module docstring."""

    def __init__(self, *, durable: bool, connected: Callable[[], bool] = lambda: True) -> None:
        """
        @param durable: nothing hands off (C{durable_close}: every call waits).
        @param connected: whether the data plane's connection is open now
            and the outbox's sender holds nothing back (nothing hands off
            otherwise: the request would only wait for a connection, and
            whether it gets one is the program's to hear).
        """
        self._durable = durable
        self._connected = connected
        self._failed = False  # a handed-off change failed since the last success

    def allowed(self, in_flight: int, *, read_only: bool) -> bool:
        """With C{in_flight} handed-off changes unanswered, whether one more may go."""
        return (
            not self._durable
            and not self._failed
            and not read_only
            and in_flight < NAMESPACE_HAND_OFF_MAX
            and self._connected()
        )

    def succeeded(self) -> None:
        """A change (handed off or not) succeeded: changes may hand off again."""
        self._failed = False

    def failed(self) -> None:
        """A handed-off change failed: until one succeeds, changes wait for their answers."""
        self._failed = True


async def settled_at(ctx: FSContext, parent: int, name: bytes) -> None:
    """
    Before an operation changes what C{name} in directory C{parent}
    names (a create, a link, a rename from or onto it, an unlink, an
    rmdir): wait while a handed-off change about that name is in flight
    -- an unlink, rmdir or rename taking a node away from it
    (L{NamespaceLock.vacated}), or a rename of the node it names now
    (L{NamespaceLock.moves_settled}).

    Should such a change's answer be lost, the mount then still tells
    the server's names from its own, and sends it again or undoes it
    in the order the changes were made (``mount-consistency.md``
    section 2.6). Had a later change gone out meanwhile -- a new file
    under a name an atomic save left, an unlink or a second rename of
    a file just renamed -- the first could no longer be told: it would
    be undone, leaving the server's names and the mount's apart (the
    file the unlink should have removed, a new file's commit meeting
    the old one). The kernel holds the directory's lock for the
    caller, so no other change of the name starts meanwhile.
    """
    try:
        folder = ctx.directory(parent)
        decoded = decode_name(name)
    except FSError:
        return  # reported by the operation itself
    lock = ctx.namespace_lock
    await lock.vacated(parent, decoded)
    child = ctx.table.child(folder, decoded)
    if child is not None and lock.moving(child.ino):
        await lock.moves_settled(child.ino)


@attrs.frozen
class HandedRemoval:
    """
    An unlink or rmdir the mount already applied: C{node}, named C{name} in
    C{folder} (the server's C{path}), is gone from its picture.
    """

    folder: Node
    name: str
    node: Node
    path: str


def settle_unlink(
    ctx: FSContext,
    hand_offs: NamespaceHandOffs,
    removal: HandedRemoval,
    line: AuditLine,
    settle: Callable[[], None],
    answer: int | Failure | None,
) -> None:
    """
    The answer to a handed-off unlink (or rmdir) of C{removal}, which
    already counts the removal (version, link count, the mount's time).
    Success: the folder's times become the server's, as a waited-for
    unlink would have set them (the kernel is told to forget the times it
    may hold), and the audit line is written.
    Failure (the name still exists on the server, or, at shutdown, nobody
    knows yet): the line with C{allowed: false}, a warning, and the folder
    is forgotten as listed (L{FSContext.forget_listing}) so the next lookup
    or listing asks the server and the name is seen again; changes wait for
    their answers until one succeeds. Either way the unlink stops counting
    as in flight.
    """
    folder = removal.folder
    try:
        if not isinstance(answer, Failure):
            folder.entries_changed(answer, versions=0)  # the server's times
            # The kernel may hold the mount's own times (a getattr while the
            # unlink was in flight) for the attribute timeout.
            ctx.forget_attributes(folder.ino)
            hand_offs.succeeded()
            line.write(True)
            return
        _refused(ctx, hand_offs, line, answer, "removal", "the name is shown again")
        ctx.forget_listing(folder, removal.name)
    finally:
        settle()


@attrs.frozen
class HandedRename:
    """
    A rename the mount already applied to its picture: C{moved}, named
    C{name} in C{source_dir} (the server's C{path}), is now C{new_name} in
    C{target_dir} (C{to_path}), replacing a known target if C{replaced},
    whose server inode was C{replaced_inode}.
    """

    source_dir: Node
    name: str
    target_dir: Node
    new_name: str
    moved: Node
    replaced: bool
    path: str
    to_path: str
    replaced_inode: int | None


def settle_rename(
    ctx: FSContext,
    hand_offs: NamespaceHandOffs,
    rename: HandedRename,
    line: AuditLine,
    settle: Callable[[], None],
    answer: RenameResult | Failure,
) -> None:
    """
    The answer to a handed-off rename, which the mount's picture already
    shows (the directories' versions and link counts, the mount's time).
    Success: the directories' times and the moved node's ctime become the
    server's (the kernel is told to forget the ones it may hold); an
    answer other than the one expected (nothing moved, a target replaced
    that the mount did not know) makes them stale, to be fetched again.
    Failure (the server still has the old names, or nobody knows): the
    line with C{allowed: false}, a warning, the moved node goes back to its
    old name (L{_move_back}) and both directories are forgotten as listed,
    so the next lookups ask the server and see its names; changes wait for
    their answers until one succeeds. Either way the rename stops counting
    as in flight (after the correction, so a write-back of the node waiting
    for it commits at the old name). C{ENOENT} for a new file whose commit
    did not create it (refused, or lost with the connection) is first
    looked into (L{rename_outcome}).
    """
    if never_created(answer, rename):
        hand_offs.failed()  # nothing more hands off until it is settled
        assert isinstance(answer, Failure) and isinstance(answer.value, RemoteFailure)
        Deferred.fromCoroutine(rename_outcome(ctx, rename, answer.value)).addBoth(
            lambda outcome: _settle_rename(ctx, hand_offs, rename, line, settle, outcome)
        )
        return
    _settle_rename(ctx, hand_offs, rename, line, settle, answer)


def _settle_rename(
    ctx: FSContext,
    hand_offs: NamespaceHandOffs,
    rename: HandedRename,
    line: AuditLine,
    settle: Callable[[], None],
    answer: RenameResult | Failure,
) -> None:
    try:
        if not isinstance(answer, Failure):
            _renamed_on_server(rename, answer)
            # As for an unlink: the kernel may hold the mount's own times.
            for node in {rename.source_dir, rename.target_dir, rename.moved}:
                ctx.forget_attributes(node.ino)
            hand_offs.succeeded()
            line.write(True)
            return
        _refused(ctx, hand_offs, line, answer, "rename", "the old names are shown again")
        _move_back(ctx, rename)
        ctx.forget_listing(rename.source_dir, rename.name)
        ctx.forget_listing(rename.target_dir, rename.new_name)
    finally:
        settle()


def _move_back(ctx: FSContext, rename: HandedRename) -> None:
    """
    A refused rename: the moved node is named as the server still names it
    (or, for a new file whose commit was refused too, where its next
    write-back will create it), unless it has moved on or the old name was
    taken meanwhile; then the new name is only forgotten.
    """
    table = ctx.table
    moved = rename.moved
    if table.child(rename.target_dir, rename.new_name) is not moved:
        return
    if table.child(rename.source_dir, rename.name) is not None:
        table.forget_name(rename.target_dir, rename.new_name)
        return
    table.move(rename.target_dir, rename.new_name, rename.source_dir, rename.name)
    moved.stale = not moved.pending  # a pending file has nothing to fetch yet


def _renamed_on_server(rename: HandedRename, answer: RenameResult) -> None:
    """The server's times for a handed-off rename that succeeded as expected, else stale."""
    stamp = answer.changed_ns
    if stamp is None or answer.moved != 1 or answer.replaced != rename.replaced:
        rename.source_dir.stale = True
        rename.target_dir.stale = True
        rename.moved.stale = not rename.moved.pending  # a pending file has nothing to fetch yet
        return
    rename.source_dir.entries_changed(stamp, versions=0)
    rename.target_dir.entries_changed(stamp, versions=0)
    if not rename.moved.stale:
        rename.moved.attributes = attrs.evolve(rename.moved.attributes, ctime_ns=stamp)


def _refused(
    ctx: FSContext,
    hand_offs: NamespaceHandOffs,
    line: AuditLine,
    answer: Failure,
    what: str,
    consequence: str,
) -> None:
    """A handed-off change failed: its line, the operator's warning, no hand-off until a success."""
    hand_offs.failed()
    line.write(False)
    error = answer.value
    if isinstance(error, RemoteFailure):
        error = ctx.write_failed(error)
    if isinstance(error, FSError):
        _log.warn(
            "{what} of {path} failed after it returned: {error}; {consequence}, "
            "and later changes wait for their answers",
            what=what,
            path=line.path,
            error=error,
            consequence=consequence,
        )
    else:
        _log.failure("{what} of {path} failed", answer, what=what, path=line.path)
