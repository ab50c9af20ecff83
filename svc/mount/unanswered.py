"""
What the mount does when the answer to a change it already showed never
came: the connection was lost after the request was sent, so the change
may or may not have run (``docs/specifications/mount-consistency.md``
section 2.6, "An answer that never came").

The mount asks the server what the names hold (C{head_file}, on the next
connection): a change that ran is settled as a success, one that did not
is sent again while the mount's picture still allows it, and what cannot
be told is left to be handled as a refusal. A new file's atomic save that
never reached the server at all is I{replayed} by the file's next
write-back (L{take_replay}, L{replay_rename}): the file is committed under
its temporary name, then renamed over the real one.

Each outcome is logged at info level.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.audit.events import CallerProcess
from svc.audit.names import EventName
from svc.mount.attributes import Attributes, FileKind
from svc.mount.client_audit import audit_path
from svc.mount.errors import FSError, RemoteFailure
from svc.mount.file_state import FileState
from svc.mount.fs_context import FSContext, join
from svc.mount.inodes import Node
from svc.mount.remote_values import RenameResult

if TYPE_CHECKING:
    from svc.mount.namespace_hand_off import HandedRemoval, HandedRename

_log = Logger()

U = TypeVar("U", Failure, RemoteFailure)
T = TypeVar("T")


def unanswered(answer: object) -> bool:
    """Whether C{answer} is a failure that says the request may have run."""
    return (
        isinstance(answer, Failure)
        and isinstance(answer.value, RemoteFailure)
        and answer.value.unknown
    )


def never_created(answer: object, rename: HandedRename) -> bool:
    """Whether C{answer} says the source of C{rename}, a new file, is not on the server."""
    return (
        rename.moved.pending
        and isinstance(answer, Failure)
        and isinstance(answer.value, RemoteFailure)
        and answer.value.wire is not None
        and answer.value.errno == errno.ENOENT
    )


class Turn:
    """
    One lost change's place in L{SendOrder}: L{send} sends it again only
    after every change looked into before it was sent again or given up.
    """

    def __init__(self, previous: Deferred[None]) -> None:
        self._previous = previous
        self._over: Deferred[None] = Deferred()

    async def send(self, send: Callable[[], Deferred[T]]) -> T:
        """C{send()} once the turns before are over; its answer."""
        await self._previous
        try:
            answer = send()  # the request is queued or written now, in order
        finally:
            self.over()
        return await answer

    def over(self) -> None:
        """This change sends nothing (more): the next turn may send."""
        if not self._over.called:
            self._over.callback(None)

    def _next(self) -> Turn:
        return Turn(self._over)


class SendOrder:
    """
    Lost changes sent again in the order they were first sent
    (``mount-consistency.md`` section 2.6). Each is looked into at once --
    the server is asked about all of them together, so a server that
    cannot be reached costs one wait, not one per change -- but a change
    is sent again only after those before it were: the data plane runs a
    connection's requests in arrival order, and a rename asks about two
    paths where an unlink asks about one, so their answers can come in
    another order than the changes were made.
    """

    def __init__(self) -> None:
        self._last = Turn(succeed(None))
        self._last.over()

    def take(self) -> Turn:
        """The next turn, after every turn taken before."""
        self._last = self._last._next()
        return self._last


@attrs.frozen
class _Lost:
    """A request whose answer never came (L{_sent})."""

    failure: RemoteFailure


async def _sent(send: Callable[[], Deferred[T]]) -> T | _Lost:
    """C{send()}'s answer, or L{_Lost} when it never came; any other failure is raised."""
    try:
        return await send()
    except RemoteFailure as failure:
        if not failure.unknown:
            raise
        return _Lost(failure)


class _CannotTell(Exception):
    """The server could not be asked what a path holds."""


LOOK_PAUSE_INITIAL = 1.0
"""Seconds before asking again what a path holds, for a handed-off change."""

LOOK_PAUSE_MAX = 5.0
"""Longest such pause (each question also waits for a connection itself)."""


async def _found_at(ctx: FSContext, path: str, *, persist: bool = False) -> Attributes | None:
    """
    What the server has at C{path}: its attributes, L{None} when nothing.
    When it gives no answer (no connection to be had), the question is
    asked again after a pause (C{persist}: a handed-off change, whose
    program was told it succeeded) until it answers or the mount begins
    to shut down; otherwise, and on any other failure, L{_CannotTell}.
    """
    pause = LOOK_PAUSE_INITIAL
    unstall: Callable[[], None] | None = None
    try:
        while True:
            try:
                return await ctx.remote.head_file(path)
            except RemoteFailure as error:
                if error.errno == errno.ENOENT and error.wire is not None:
                    return None
                if not persist or error.wire is not None or ctx.stopping.begun:
                    raise _CannotTell(str(error)) from None
                if unstall is None:
                    # Operations waiting for this change fail meanwhile.
                    unstall = ctx.namespace_lock.stalled(str(error))
                _log.info(
                    "asking the data plane what {path} holds: no answer ({error}); "
                    "asking again in {pause} s",
                    path=path,
                    error=str(error),
                    pause=pause,
                )
            await ctx.stopping.pause(pause)
            pause = min(pause * 2, LOOK_PAUSE_MAX)
    finally:
        if unstall is not None:
            unstall()


async def removal_outcome(
    ctx: FSContext, removal: HandedRemoval, unanswered: Failure, turn: Turn
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
        found = await _found_at(ctx, removal.path, persist=True)
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
    return await turn.send(removal.resend)  # its failure is the outcome


async def rename_outcome(
    ctx: FSContext, rename: HandedRename, unanswered: Failure, turn: Turn
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
        at_target = await _found_at(ctx, rename.to_path, persist=True)
        at_source = await _found_at(ctx, rename.path, persist=True)
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
            if _replay_save(ctx, rename, at_target):
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
    return await turn.send(rename.resend)  # its failure is the outcome


def _replay_save(ctx: FSContext, rename: HandedRename, replaced: Attributes | None) -> bool:
    """
    Have the next write-back of C{rename}'s new file replay its atomic save,
    if the mount still shows it at the new name, nothing at the old one,
    and the file's state is at hand: by committing over C{replaced}, the
    file the server still has at the new name, when that file has no other
    link (L{FileState.replaces_version}: a compare-and-swap on its
    version, as atomic for readers as the rename, and the temporary name
    plays no part); else through the temporary name (L{take_replay}).
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
    if replaced is not None and replaced.kind is FileKind.FILE and replaced.nlink == 1:
        state.replaces_version = replaced.version
    else:
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
        ctx.forget_listing(folder, replay.name)
        ctx.forget_listing(folder, replay.via_name)
        return
    replay.folder.stale = True  # its times: the rename's, fetched again
    node.stale = True
    ctx.forget_attributes(replay.folder.ino)
    ctx.forget_attributes(node.ino)


async def send_removal(
    ctx: FSContext, path: str, removed: int, send: Callable[[], Deferred[int | None]]
) -> int | None:
    """
    C{send()} an unlink or rmdir of C{path} (the server's path; C{removed}
    its inode, 0 when the mount does not know it) for a caller that waits:
    its answer; one that never came is settled by what the server has at
    the path, as for a handed-off one (L{removal_outcome}): L{None} (the
    folder's times unknown) when it ran, the answer to the request sent
    again when it did not, the failure raised when that cannot be told.
    """
    first = await _sent(send)
    if not isinstance(first, _Lost):
        return first
    lost = first.failure
    try:
        found = await _found_at(ctx, path)
    except _CannotTell as error:
        raise _untold("removal", path, f"the server could not be asked: {error}", lost) from None
    if found is None or (removed and found.server_inode != removed):
        _told("removal", path, "it ran")
        return None
    if not removed:
        raise _untold("removal", path, "the name holds an inode the mount did not know", lost)
    _told("removal", path, "it did not run; sent again")
    return await send()


async def send_rename(
    ctx: FSContext,
    path: str,
    to_path: str,
    moved: int,
    send: Callable[[], Deferred[RenameResult]],
) -> RenameResult:
    """
    C{send()} a rename of C{path} to C{to_path} (the server's paths;
    C{moved} the inode the server has at C{path}, 0 when the mount does
    not know it) for a caller that waits: its answer; one that never came
    is settled by what the server has at both paths, as for a handed-off
    one (L{rename_outcome}): the rename as run (its times unknown) when
    the new path holds the inode, the answer to the request sent again
    when the old one still does, the failure raised otherwise.
    """
    first = await _sent(send)
    if not isinstance(first, _Lost):
        return first
    lost = first.failure
    try:
        at_target = await _found_at(ctx, to_path)
        at_source = await _found_at(ctx, path)
    except _CannotTell as error:
        raise _untold("rename", path, f"the server could not be asked: {error}", lost) from None
    if moved and at_target is not None and at_target.server_inode == moved:
        _told("rename", path, "it ran")
        return RenameResult(1, False, None)
    if moved and at_source is not None and at_source.server_inode == moved:
        _told("rename", path, "it did not run; sent again")
        return await send()
    raise _untold("rename", path, "neither name shows it", lost)


async def send_creation(
    ctx: FSContext,
    what: str,
    path: str,
    send: Callable[[], Deferred[Attributes]],
    made: Callable[[Attributes], bool],
) -> Attributes:
    """
    C{send()} a request that makes C{path} (the server's path: a mkdir,
    mknod, symlink or link) for a caller that waits: its answer, the new
    node's attributes. One that never came is settled by what the server
    has at the path: a node C{made} recognizes as this request's -- it ran,
    and those are its attributes; nothing -- it did not, and it is sent
    again; anything else, or a server that cannot be asked: the failure.
    (The caller holds the namespace lock, and the kernel the directory's:
    nothing else made the name meanwhile.)
    """
    first = await _sent(send)
    if not isinstance(first, _Lost):
        return first
    lost = first.failure
    try:
        found = await _found_at(ctx, path)
    except _CannotTell as error:
        raise _untold(what, path, f"the server could not be asked: {error}", lost) from None
    if found is None:
        _told(what, path, "it did not run; sent again")
        return await send()
    if made(found):
        _told(what, path, "it ran")
        return found
    raise _untold(what, path, "the name holds something else", lost)


async def send_setattr(ctx: FSContext, path: str, send: Callable[[], Deferred[T]]) -> T:
    """
    C{send()} a C{setattr} of C{path} (the server's path) for a caller that
    waits: its answer. One that never came is sent once more: it sets the
    same values whether or not the first ran (at worst the version counts
    one change more).
    """
    first = await _sent(send)
    if not isinstance(first, _Lost):
        return first
    _told("setattr", path, "whatever it shows; sent again")
    return await send()


def _told(what: str, path: str, outcome: str) -> None:
    _log.info(
        "{what} of {path}: its answer never came; the server shows {outcome}",
        what=what,
        path=path,
        outcome=outcome,
    )


def _untold(what: str, path: str, why: str, unanswered: U) -> U:
    _log.info(
        "{what} of {path}: its answer never came and cannot be settled ({why})",
        what=what,
        path=path,
        why=why,
    )
    return unanswered
