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
failure until a change succeeds again); L{settle_unlink} and
L{settle_rename} handle the answers.

An answer that never came (the connection was lost after the request was
sent) does not say whether the server made the change. The mount then asks
the server what the names hold (C{head_file}): a change that ran is
settled as a success, one that did not is sent again when the mount's
picture still allows it, and only what cannot be told is handled as a
refusal (L{_removal_outcome}, L{_rename_outcome}).
"""

from __future__ import annotations

import errno
from collections.abc import Callable

import attrs
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.audit.events import CallerProcess
from svc.audit.names import EventName
from svc.mount.attributes import Attributes
from svc.mount.client_audit import AuditLine, audit_path
from svc.mount.errors import FSError, RemoteFailure
from svc.mount.fs_context import FSContext, join
from svc.mount.inodes import Node
from svc.mount.open_files import FileState
from svc.mount.remote_values import RenameResult

_log = Logger()

NAMESPACE_HAND_OFF_MAX = 64
"""Most handed-off changes unanswered at once: a change beyond waits for its own."""


class NamespaceHandOffs:
    """Whether the next unlink, rmdir or rename may hand off; see the module docstring."""

    def __init__(self, *, durable: bool) -> None:
        """@param durable: nothing hands off (C{durable_close}: every call waits)."""
        self._durable = durable
        self._failed = False  # a handed-off change failed since the last success

    def allowed(self, in_flight: int, *, read_only: bool) -> bool:
        """With C{in_flight} handed-off changes unanswered, whether one more may go."""
        return (
            not self._durable
            and not self._failed
            and not read_only
            and in_flight < NAMESPACE_HAND_OFF_MAX
        )

    def succeeded(self) -> None:
        """A change (handed off or not) succeeded: changes may hand off again."""
        self._failed = False

    def failed(self) -> None:
        """A handed-off change failed: until one succeeds, changes wait for their answers."""
        self._failed = True


@attrs.frozen
class HandedRemoval:
    """
    An unlink or rmdir the mount already applied: C{node}, named C{name} in
    C{folder} (the server's C{path}), is gone from its picture; C{resend}
    sends the request again.
    """

    folder: Node
    name: str
    node: Node
    path: str
    resend: Callable[[], Deferred[int | None]]


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
    Failure (the name still exists on the server, or nobody knows): the
    line with C{allowed: false}, a warning, and the folder is forgotten as
    listed (L{_forget_listing}) so the next lookup or listing asks the
    server and the name is seen again; changes wait for their answers until
    one succeeds. An answer that never came is first looked into
    (L{_removal_outcome}). Either way the unlink stops counting as in
    flight.
    """
    if _unanswered(answer):
        hand_offs.failed()  # nothing more hands off while the server is asked
        assert isinstance(answer, Failure)
        Deferred.fromCoroutine(_removal_outcome(ctx, removal, answer)).addBoth(
            lambda outcome: _settle_removal(ctx, hand_offs, removal, line, settle, outcome)
        )
        return
    _settle_removal(ctx, hand_offs, removal, line, settle, answer)


def _settle_removal(
    ctx: FSContext,
    hand_offs: NamespaceHandOffs,
    removal: HandedRemoval,
    line: AuditLine,
    settle: Callable[[], None],
    answer: int | Failure | None,
) -> None:
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
        _forget_listing(ctx, folder, removal.name)
    finally:
        settle()


@attrs.frozen
class HandedRename:
    """
    A rename the mount already applied to its picture: C{moved}, named
    C{name} in C{source_dir} (the server's C{path}), is now C{new_name} in
    C{target_dir} (C{to_path}), replacing a known target if C{replaced},
    whose server inode was C{replaced_inode}; C{resend} sends the request
    again.
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
    resend: Callable[[], Deferred[RenameResult]]


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
    for it commits at the old name). An answer that never came is first
    looked into (L{_rename_outcome}), and so is C{ENOENT} for a new file
    whose commit did not create it (lost with the connection, the rename
    sent again on the next one).
    """
    if _unanswered(answer) or _never_created(answer, rename):
        hand_offs.failed()  # nothing more hands off while the server is asked
        assert isinstance(answer, Failure)
        Deferred.fromCoroutine(_rename_outcome(ctx, rename, answer)).addBoth(
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
        _forget_listing(ctx, rename.source_dir, rename.name)
        _forget_listing(ctx, rename.target_dir, rename.new_name)
    finally:
        settle()


def _unanswered(answer: object) -> bool:
    """Whether C{answer} is a failure that says the request may have run."""
    return (
        isinstance(answer, Failure)
        and isinstance(answer.value, RemoteFailure)
        and answer.value.unknown
    )


def _never_created(answer: object, rename: HandedRename) -> bool:
    """Whether C{answer} says the source of C{rename}, a new file, is not on the server."""
    return (
        rename.moved.pending
        and isinstance(answer, Failure)
        and isinstance(answer.value, RemoteFailure)
        and answer.value.wire is not None
        and answer.value.errno == errno.ENOENT
    )


class _CannotTell(Exception):
    """The server could not be asked what a path holds."""


async def _found_at(ctx: FSContext, path: str) -> Attributes | None:
    """What the server has at C{path}: its attributes, L{None} when nothing."""
    try:
        return await ctx.remote.head_file(path)
    except RemoteFailure as error:
        if error.errno == errno.ENOENT and error.wire is not None:
            return None
        raise _CannotTell(str(error)) from None


async def _removal_outcome(
    ctx: FSContext, removal: HandedRemoval, unanswered: Failure
) -> int | Failure | None:
    """
    An unlink or rmdir whose answer never came, settled by what the server
    has at its path: nothing, or another inode (a name created since) --
    it ran (L{None}: the folder's times are fetched again); the removed
    inode -- it did not, and is sent again unless the mount has given the
    name to something else meanwhile (the answer to that). Otherwise, and
    when the server cannot be asked, C{unanswered}.
    """
    removed = removal.node.attributes.server_inode
    try:
        found = await _found_at(ctx, removal.path)
    except _CannotTell as error:
        return _untold(
            "removal", removal.path, f"the server could not be asked: {error}", unanswered
        )
    if found is None or found.server_inode != removed:
        _told("removal", removal.path, "it ran")
        return None
    if not removed or ctx.table.child(removal.folder, removal.name) is not None:
        return _untold("removal", removal.path, "the name was taken again", unanswered)
    _told("removal", removal.path, "it did not run; sent again")
    return await removal.resend()  # its failure is the outcome


async def _rename_outcome(
    ctx: FSContext, rename: HandedRename, unanswered: Failure
) -> RenameResult | Failure:
    """
    A rename whose answer never came, settled by what the server has at
    both paths (``mount-consistency.md`` section 2.6):

     - a source the server had: at the new path -- it ran; still at the
       old one -- it did not;
     - a new file whose commit went just before, unanswered too (the
       server's inode unknown): something at the old path -- the commit
       ran, the rename did not; the new path changed from what the mount
       expected (free, or the replaced target's inode) -- both ran;
       nothing at either, the new name having been free -- neither ran,
       and the file, which never reached the server, stays at the new name
       (its next write-back creates it there).

    A rename that ran is settled as a success whose times are fetched
    again; one that did not is sent again while the mount still shows the
    source at the new name and nothing at the old (the answer to that).
    Anything else, or a server that cannot be asked: C{unanswered}.
    """
    moved = rename.moved.attributes.server_inode
    try:
        at_target = await _found_at(ctx, rename.to_path)
        at_source = await _found_at(ctx, rename.path)
    except _CannotTell as error:
        return _untold("rename", rename.path, f"the server could not be asked: {error}", unanswered)
    if moved:
        ran = at_target is not None and at_target.server_inode == moved
        not_run = at_source is not None and at_source.server_inode == moved
    else:
        target_now = None if at_target is None else at_target.server_inode
        ran = at_source is None and target_now != rename.replaced_inode
        not_run = at_source is not None
        if at_source is None and target_now == rename.replaced_inode:
            # Neither ran: the file never reached the server. Its next
            # write-back creates it where the mount shows it: at once when
            # the new name is free there, else by replaying the save. (Not
            # while a commit of it is in flight: it may yet create the old
            # name.)
            state = ctx.files.state(rename.moved.ino)
            if state is not None and state.commits_in_flight:
                return _untold("rename", rename.path, "the file's commit is in flight", unanswered)
            if rename.replaced_inode is None:
                _told("rename", rename.path, "neither it nor the file ran; the file goes there")
                return RenameResult(0, False, None)
            if _replay_save(ctx, rename):
                _told("rename", rename.path, "neither it nor the file ran; the save is replayed")
                return RenameResult(0, False, None)
    if ran:
        _told("rename", rename.path, "it ran")
        return RenameResult(1, rename.replaced, None)
    if not not_run:
        return _untold("rename", rename.path, "neither name shows it", unanswered)
    table = ctx.table
    if (
        table.child(rename.target_dir, rename.new_name) is not rename.moved
        or table.child(rename.source_dir, rename.name) is not None
    ):
        return _untold("rename", rename.path, "the names were changed again", unanswered)
    _told("rename", rename.path, "it did not run; sent again")
    return await rename.resend()  # its failure is the outcome


def _replay_save(ctx: FSContext, rename: HandedRename) -> bool:
    """
    Have the next write-back of C{rename}'s new file replay its atomic save
    (L{take_replay}), if the mount still shows it at the new name, nothing
    at the old one, and the file's state is at hand.
    """
    state = ctx.files.state(rename.moved.ino)
    table = ctx.table
    if (
        state is None
        or rename.source_dir is not rename.target_dir
        or table.child(rename.target_dir, rename.new_name) is not rename.moved
        or table.child(rename.source_dir, rename.name) is not None
    ):
        return False
    state.replay_via = (rename.source_dir.ino, rename.name)
    return True


@attrs.frozen
class Replay:
    """
    A new file's atomic save replayed (L{take_replay}): committed at
    C{via} (a mount-relative path in C{folder}, named C{via_name}), then
    renamed to C{name} in the same folder (C{to}), where the mount shows it.
    """

    folder: Node
    name: str
    via_name: str
    via: str
    to: str


def take_replay(ctx: FSContext, node: Node, state: FileState) -> Replay | None:
    """
    Under the namespace lock, as a write-back of C{node} is about to send
    its commit: the save to replay (L{FileState.replay_via}, cleared: it
    is tried once), unless the file is no longer a new file named in that
    folder or the temporary name was taken meanwhile.
    """
    via, state.replay_via = state.replay_via, None
    if via is None or not node.pending:
        return None
    table = ctx.table
    link = table.primary_name(node)
    if link is None or link[0].ino != via[0] or table.child(link[0], via[1]) is not None:
        return None
    folder, name = link
    folder_rel = ctx.rel_of(folder)
    return Replay(folder, name, via[1], join(folder_rel, via[1]), join(folder_rel, name))


async def replay_rename(
    ctx: FSContext, node: Node, replay: Replay, caller: CallerProcess, session: str | None
) -> None:
    """
    The second half of a replayed save, the file just committed at
    C{replay.via}: rename it to its own name. A refusal leaves it at the
    temporary name on the server; the mount then shows it there, as for a
    refused rename, warns, and writes a C{rename} line with C{allowed:
    false}.
    """
    try:
        await ctx.remote.rename(
            ctx.server_path(replay.via), ctx.server_path(replay.to), session_id=session
        )
    except FSError as error:
        ctx.audit.line(
            EventName.RENAME, replay.via, caller, session_id=session, to_path=audit_path(replay.to)
        ).write(False)
        _log.warn(
            "replaying the save of {path} failed: {error}; the file stays at {via}",
            path=replay.to,
            error=error,
            via=replay.via,
        )
        table = ctx.table
        folder = replay.folder
        if (
            table.child(folder, replay.name) is node
            and table.child(folder, replay.via_name) is None
        ):
            table.move(folder, replay.name, folder, replay.via_name)
            node.stale = True
        _forget_listing(ctx, folder, replay.name)
        _forget_listing(ctx, folder, replay.via_name)
        return
    replay.folder.stale = True  # its times: the rename's, fetched again
    node.stale = True
    ctx.forget_attributes(replay.folder.ino)
    ctx.forget_attributes(node.ino)


def _told(what: str, path: str, outcome: str) -> None:
    _log.info(
        "{what} of {path}: its answer never came; the server shows {outcome}",
        what=what,
        path=path,
        outcome=outcome,
    )


def _untold(what: str, path: str, why: str, unanswered: Failure) -> Failure:
    _log.info(
        "{what} of {path}: its answer never came and cannot be settled ({why})",
        what=what,
        path=path,
        why=why,
    )
    return unanswered


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


def _forget_listing(ctx: FSContext, folder: Node, name: str) -> None:
    """
    Forget C{folder} as listed (no longer complete, attributes stale, the
    kernel's attributes and its entry C{name} dropped).
    """
    folder.complete = False
    folder.stale = True
    ctx.invalidate(folder.ino)
    ctx.invalidate_entry(folder.ino, name.encode("utf-8", "surrogateescape"))
