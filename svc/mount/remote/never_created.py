"""
A handed-off rename of a new file the data plane never got
(``docs/specifications/mount-consistency.md`` section 2.6, "An answer that
never came"): refused C{ENOENT}, because the file's commit was refused or
lost with the connection before it ran.

Every namespace change goes through the outbox's one sender, which sends a
change whose answer was lost again under its outbox tag (the data plane
answers one that ran as it did), so a lost answer needs nothing here. What
remains is an atomic save whose file never reached the server: the rename
is kept where the mount shows it, and the file's next write-back I{replays}
the save (L{take_replay}, L{replay_rename}): the file is committed under its
temporary name, then renamed over the real one, or committed over the
version it replaces.

Each outcome is logged at info level.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, TypeVar

import attrs
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.audit.events import CallerProcess
from svc.audit.names import EventName
from svc.mount.core.attributes import Attributes, FileKind
from svc.mount.core.client_audit import audit_path
from svc.mount.core.errors import FSError, RemoteFailure
from svc.mount.core.file_state import FileState
from svc.mount.core.fs_context import FSContext, join
from svc.mount.core.inodes import Node
from svc.mount.remote.remote_values import RenameResult

if TYPE_CHECKING:
    from svc.mount.remote.namespace_hand_off import HandedRename

_log = Logger()

U = TypeVar("U", Failure, RemoteFailure)


def never_created(answer: object, rename: HandedRename) -> bool:
    """Whether C{answer} says the source of C{rename}, a new file, is not on the server."""
    return (
        isinstance(answer, Failure)
        and isinstance(answer.value, RemoteFailure)
        and _source_missing(answer.value, rename)
    )


class _CannotTell(Exception):
    """The server could not be asked what a path holds."""


async def _found_at(ctx: FSContext, path: str) -> Attributes | None:
    """
    What the server has at C{path}: its attributes, L{None} when nothing.

    @raise _CannotTell: it gave no other answer.
    """
    try:
        return await ctx.remote.head_file(path)
    except RemoteFailure as error:
        if error.errno == errno.ENOENT and error.wire is not None:
            return None
        raise _CannotTell(str(error)) from None


async def rename_outcome(
    ctx: FSContext, rename: HandedRename, refused: RemoteFailure
) -> RenameResult | Failure:
    """
    A handed-off rename refused C{ENOENT} (C{refused}) though it moves a
    new file whose commit went just before (L{never_created}): the file
    never reached the server. It is kept where the mount shows it, the new
    name, when that name still holds what it held when the rename was sent:
    its next write-back creates it there, at once when the name was free,
    else by replaying the atomic save (L{_replay_save}). Anything else: the
    failure.
    """
    state = ctx.files.state(rename.moved.ino)
    if state is not None and state.commits_in_flight:
        # Its commit may yet create the old name.
        return _failure(_untold("rename", rename.path, "the file's commit is in flight", refused))
    try:
        at_target = await _found_at(ctx, rename.to_path)
    except _CannotTell as error:
        return _failure(
            _untold("rename", rename.path, f"the server could not be asked: {error}", refused)
        )
    target_now = None if at_target is None else at_target.server_inode
    if target_now != rename.replaced_inode:
        return _failure(_untold("rename", rename.path, "the new name changed meanwhile", refused))
    if rename.replaced_inode is None:
        _told("rename", rename.path, "neither it nor the file ran; the file goes there")
        return RenameResult(0, False, None)
    if _replay_save(ctx, rename, at_target):
        _told("rename", rename.path, "neither it nor the file ran; the save is replayed")
        return RenameResult(0, False, None)
    return _failure(_untold("rename", rename.path, "the names were changed again", refused))


def _source_missing(failure: RemoteFailure, rename: HandedRename) -> bool:
    """Whether C{failure} is the server's C{ENOENT} for C{rename} of a new file."""
    return (
        rename.moved.pending
        and failure.wire is not None
        and not failure.unknown
        and failure.errno == errno.ENOENT
    )


def _failure(error: RemoteFailure) -> Failure:
    return Failure(error)  # type: ignore[no-untyped-call]


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
    via = ctx.server_path(replay.via)
    try:
        await ctx.remote.rename(via, ctx.server_path(replay.to), session_id=session)
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


def _told(what: str, path: str, outcome: str) -> None:
    _log.info(
        "{what} of {path}: the file never reached the server; {outcome}",
        what=what,
        path=path,
        outcome=outcome,
    )


def _untold(what: str, path: str, why: str, refused: U) -> U:
    _log.info(
        "{what} of {path}: the file never reached the server, and the rename is refused ({why})",
        what=what,
        path=path,
        why=why,
    )
    return refused
