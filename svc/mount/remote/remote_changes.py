"""
The mount client's namespace changes on the data plane: unlink, rename,
mkdir, rmdir, setattr, symlink, mknod and link (C{manifest_put}, a file's
commit, is not one: the write-back records its own).

With a L{ChangeRecorder} (the mount's outbox, ``mount-outbox.md`` section
8), each change is recorded as an outbox entry and sent by the outbox's one
sender, in order with the others, tagged with its entry (its request built
from it, L{svc.mount.outbox.requests.request_of}): an answer lost is sent
again under the same tag, so a change runs at most once. Without one, the
same request goes untagged, sent here.

L{NamespaceChanges} is the base of L{svc.mount.remote.data_plane.Remote}, whose
further methods are the reads, commits, chunks and leases.
"""

from __future__ import annotations

import errno
import stat
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred, fail

from svc.mount.core.attributes import AttributeChanges, Attributes, FileKind, type_bits
from svc.mount.core.errors import RemoteFailure
from svc.mount.core.op_ticket import current_ticket
from svc.mount.outbox.entries import (
    Entry,
    Link,
    Mkdir,
    Mknod,
    Owner,
    Rename,
    Rmdir,
    SetAttributes,
    Symlink,
    Unlink,
)
from svc.mount.outbox.requests import request_of
from svc.mount.remote.remote_calls import IDataPlaneCaller, RemoteCalls
from svc.mount.remote.remote_values import RenameResult, attributes_of
from svc.wire.answers import FileAttributes, RemoveReply, RenameReply
from svc.wire.kinds import FieldRefused
from svc.wire.ops import Op

T = TypeVar("T")
E = TypeVar("E", bound=Entry)

__all__ = ["ChangeRecorder", "NamespaceChanges"]


class ChangeRecorder(Protocol):
    """
    Where changes are recorded and sent from (L{svc.mount.outbox.outbox.Outbox}:
    the one sender).
    """

    def submit(self, make: Callable[[int], E], *, waits: bool) -> tuple[E, Deferred[Any]]:
        """Persist the entry C{make(seq)} builds and send it: its decoded answer message."""

    def withdraw(self, entry: Entry, why: str) -> None:
        """C{entry}'s caller stopped waiting: take it back unless it was sent."""


def _request_of(entry: Entry, session_id: str | None) -> tuple[Op, object]:
    """L{request_of}, untagged; a field the wire refuses is an C{EINVAL} failure."""
    try:
        return request_of(entry, None, session_id)
    except FieldRefused as error:
        raise RemoteFailure(errno.EINVAL, f"{entry.op.value}: {error.message}") from None


def _cancelling(waiter: Deferred[None]) -> Callable[[T], T]:
    """A pass-through callback that cancels C{waiter} first."""

    def cancel(result: T) -> T:
        waiter.cancel()
        return result

    return cancel


def _dir_ctime(answer: RemoveReply) -> int | None:
    """A removal's answer: the parent's new mtime and ctime, if the server says."""
    return answer.dir_ctime_ns


def _attributes(answer: FileAttributes) -> Attributes:
    return attributes_of(answer)


class NamespaceChanges(RemoteCalls):
    """
    The namespace changes over one L{IDataPlaneCaller}; see the module
    docstring. Every method returns a L{Deferred}; every failure is a
    L{RemoteFailure}.
    """

    def __init__(
        self,
        caller: IDataPlaneCaller,
        *,
        timeout: float | None = None,
        recorder: ChangeRecorder | None = None,
    ) -> None:
        """
        @param recorder: where every namespace change (not a commit: the
            write-back records its own) is recorded before it is sent, and
            which tags it (the mount's outbox, ``mount-outbox.md`` section
            8); L{None}: nowhere, untagged.
        """
        super().__init__(caller, timeout=timeout)
        self._recorder = recorder

    def manifest_delete(
        self, path: str, *, session_id: str | None, handed_off: bool = False
    ) -> Deferred[int | None]:
        """
        Unlink the non-directory C{path}; the parent's new mtime and ctime
        (L{None} from a server that does not say). C{handed_off}: its
        program was answered already (L{_change}).
        """
        return self._change(lambda seq: Unlink(seq, path), session_id, _dir_ctime, handed_off)

    def rename(
        self, path: str, to_path: str, *, session_id: str | None, handed_off: bool = False
    ) -> Deferred[RenameResult]:
        """Move C{path} to C{to_path} (C{manifest_rename}); C{handed_off} as L{manifest_delete}."""

        def parse(answer: RenameReply) -> RenameResult:
            return RenameResult(answer.moved, answer.replaced, answer.dir_ctime_ns)

        return self._change(lambda seq: Rename(seq, path, to_path), session_id, parse, handed_off)

    def dir_create(
        self, path: str, *, mode: int, uid: int, gid: int, session_id: str | None
    ) -> Deferred[Attributes]:
        """Create directory C{path}."""
        owner = Owner(mode, uid, gid)
        return self._change(lambda seq: Mkdir(seq, path, owner), session_id, _attributes)

    def dir_remove(
        self, path: str, *, session_id: str | None, handed_off: bool = False
    ) -> Deferred[int | None]:
        """Remove the empty directory C{path}; as L{manifest_delete}."""
        return self._change(lambda seq: Rmdir(seq, path), session_id, _dir_ctime, handed_off)

    def setattr(
        self, path: str, changes: AttributeChanges, *, session_id: str | None
    ) -> Deferred[Attributes]:
        """Change attributes of C{path} (C{size} only 0 or the current size)."""

        def make(seq: int) -> SetAttributes:
            return SetAttributes(
                seq,
                path,
                mode=changes.mode,
                uid=changes.uid,
                gid=changes.gid,
                atime_ns=changes.atime_ns,
                mtime_ns=changes.mtime_ns,
                size=changes.size,
            )

        return self._change(make, session_id, _attributes)

    def symlink(
        self, path: str, target: str, *, uid: int, gid: int, session_id: str | None
    ) -> Deferred[Attributes]:
        """Create symlink C{path} pointing at C{target}."""
        return self._change(
            lambda seq: Symlink(seq, path, target, uid, gid), session_id, _attributes
        )

    def mknod(
        self,
        path: str,
        *,
        kind: FileKind,
        mode: int,
        rdev: int,
        uid: int,
        gid: int,
        session_id: str | None,
    ) -> Deferred[Attributes]:
        """Create a non-directory, non-symlink node at C{path}."""
        owner = Owner(type_bits(kind) | stat.S_IMODE(mode), uid, gid)
        return self._change(lambda seq: Mknod(seq, path, owner, rdev), session_id, _attributes)

    def link(self, path: str, to_path: str, *, session_id: str | None) -> Deferred[Attributes]:
        """Add the name C{to_path} to the inode of C{path}."""
        return self._change(lambda seq: Link(seq, to_path, path), session_id, _attributes)

    def _change(
        self,
        make: Callable[[int], Entry],
        session_id: str | None,
        parse: Callable[[Any], T],
        handed_off: bool = False,
    ) -> Deferred[T]:
        """
        Send the change C{make(seq)} builds: through the outbox when there
        is one (L{ChangeRecorder.submit}), else directly, untagged. Through
        the outbox, a change whose program was answered already
        (C{handed_off}) is held through an outage until it is answered or
        refused; one its program waits for fails C{EIO} when it never
        reached the data plane, or when its answer is lost twice (then
        C{unknown}: it may have run) (``mount-consistency.md`` section 2.6,
        "An answer that never came").
        """
        recorder = self._recorder
        if recorder is None:
            try:
                op, request = _request_of(make(0), session_id)
            except RemoteFailure as error:
                return fail(error)
            return self._call(op, request, lambda answer, _: parse(answer))
        try:
            entry, outcome = recorder.submit(make, waits=not handed_off)
        except OSError as error:  # the cache disk (full, gone) or a stopped outbox
            name = make(0).op.value
            return fail(
                RemoteFailure(
                    error.errno or errno.EIO, f"{name}: recording it in the outbox: {error}"
                )
            )
        ticket = None if handed_off else current_ticket()
        if ticket is not None and not outcome.called:
            # Queued behind a pause: a program told EIO meanwhile (its
            # timeout) must not see the change made later.
            abandoned = ticket.when_abandoned()
            abandoned.addCallbacks(
                lambda _: recorder.withdraw(entry, "its program stopped waiting (its timeout)"),
                lambda _: None,  # cancelled: answered first
            )
            outcome.addBoth(_cancelling(abandoned))
        return outcome.addCallback(parse)

    def change(self, op: Op, request: object) -> Deferred[Any]:
        """
        Send the declared write C{request} of C{op} as it is (an outbox
        entry's, L{svc.mount.outbox.requests}); its decoded answer message.
        """
        return self._call(op, request, lambda answer, _: answer)
