"""
The mount client's namespace changes on the data plane: unlink, rename,
mkdir, rmdir, setattr, symlink, mknod and link (C{manifest_put}, a file's
commit, is not one: the write-back records its own).

With a L{ChangeRecorder} (the mount's outbox, ``mount-outbox.md`` section
8), each change is recorded first as an outbox entry, its request is built
from that entry (L{svc.mount.outbox.requests.request_of}) and tagged with
it, and the entry settles when the request ends (L{NamespaceChanges._change}).
Without one, the same request goes untagged.

L{NamespaceChanges} is the base of L{svc.mount.remote.data_plane.Remote}, whose
further methods are the reads, commits, chunks and leases.
"""

from __future__ import annotations

import errno
import stat
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred, fail
from twisted.python.failure import Failure

from svc.mount.core.attributes import AttributeChanges, Attributes, FileKind, type_bits
from svc.mount.core.errors import RemoteFailure
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
from svc.wire.kinds import FieldRefused, OutboxTag
from svc.wire.ops import Op

T = TypeVar("T")
E = TypeVar("E", bound=Entry)

__all__ = ["ChangeRecorder", "LostAnswer", "NamespaceChanges"]


class ChangeRecorder(Protocol):
    """Where changes are recorded before they are sent (L{svc.mount.outbox.outbox.Outbox})."""

    def append(
        self, make: Callable[[int], E], chunks: Mapping[str, bytes] = ..., *, send: bool = ...
    ) -> E:
        """Persist the entry C{make(seq)} builds."""

    def tag(self, entry: Entry) -> OutboxTag:
        """The C{outbox} field of C{entry}'s request."""

    def done(self, entry: Entry) -> None:
        """C{entry} was seen through."""


def _request_of(entry: Entry, tag: OutboxTag | None, session_id: str | None) -> tuple[Op, object]:
    """L{request_of}, a field the wire refuses being an C{EINVAL} failure."""
    try:
        return request_of(entry, tag, session_id)
    except FieldRefused as error:
        raise RemoteFailure(errno.EINVAL, f"{entry.op.value}: {error.message}") from None


def _dir_ctime(answer: RemoveReply) -> int | None:
    """A removal's answer: the parent's new mtime and ctime, if the server says."""
    return answer.dir_ctime_ns


def _attributes(answer: FileAttributes) -> Attributes:
    return attributes_of(answer)


class LostAnswer(RemoteFailure):
    """
    A recorded change whose request was sent and whose answer never came
    (the connection was lost, the call timed out): it may have run. Its
    outbox entry (L{entry}) is not settled, so the data plane keeps the
    answer of a run, until L{again} is answered or refused, the entry is
    handed to the outbox's sender (L{svc.mount.outbox.outbox.Outbox.send_again},
    which settles it), or L{drop} is called.
    """

    def __init__(
        self,
        lost: RemoteFailure,
        entry: Entry,
        *,
        again: Callable[[], Deferred[Any]],
        drop: Callable[[], None],
        parse: Callable[[Any], Any],
    ) -> None:
        super().__init__(lost.errno, lost.message, None, lost.details, unknown=True)
        self.entry = entry
        self._again = again
        self._drop = drop
        self._parse = parse

    def again(self) -> Deferred[Any]:
        """Send the same request again, with the same tag: its answer (parsed), or a failure."""
        return self._again()

    def drop(self) -> None:
        """Nobody will send it again: settle its entry (a later mount will not send it)."""
        self._drop()

    def parse(self, answer: Any) -> Any:
        """The result the change's method returns, from C{answer}, its decoded answer message."""
        return self._parse(answer)


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

    def manifest_delete(self, path: str, *, session_id: str | None) -> Deferred[int | None]:
        """
        Unlink the non-directory C{path}; the parent's new mtime and ctime
        (L{None} from a server that does not say).
        """
        return self._change(lambda seq: Unlink(seq, path), session_id, _dir_ctime)

    def rename(self, path: str, to_path: str, *, session_id: str | None) -> Deferred[RenameResult]:
        """Move C{path} to C{to_path} (C{manifest_rename})."""

        def parse(answer: RenameReply) -> RenameResult:
            return RenameResult(answer.moved, answer.replaced, answer.dir_ctime_ns)

        return self._change(lambda seq: Rename(seq, path, to_path), session_id, parse)

    def dir_create(
        self, path: str, *, mode: int, uid: int, gid: int, session_id: str | None
    ) -> Deferred[Attributes]:
        """Create directory C{path}."""
        owner = Owner(mode, uid, gid)
        return self._change(lambda seq: Mkdir(seq, path, owner), session_id, _attributes)

    def dir_remove(self, path: str, *, session_id: str | None) -> Deferred[int | None]:
        """Remove the empty directory C{path}; as L{manifest_delete}."""
        return self._change(lambda seq: Rmdir(seq, path), session_id, _dir_ctime)

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
    ) -> Deferred[T]:
        """
        Send the change C{make(seq)} builds, recorded first in the outbox
        when there is one (L{ChangeRecorder}): tagged with its entry, which
        settles once the request is answered or refused. A request whose
        answer never came fails L{LostAnswer}, its entry left unsettled for
        the caller to send again under the same tag (the data plane answers
        a run's answer, or runs it now) or to drop
        (``mount-consistency.md`` section 2.6, "An answer that never came").
        """
        recorder = self._recorder
        if recorder is None:
            try:
                op, request = _request_of(make(0), None, session_id)
            except RemoteFailure as error:
                return fail(error)
            return self._call(op, request, lambda answer, _: parse(answer))
        try:
            entry = recorder.append(make, send=False)
        except OSError as error:  # the cache disk (full, gone) or a stopped outbox
            name = make(0).op.value
            return fail(
                RemoteFailure(
                    error.errno or errno.EIO, f"{name}: recording it in the outbox: {error}"
                )
            )
        try:
            op, request = _request_of(entry, recorder.tag(entry), session_id)
        except RemoteFailure as error:
            recorder.done(entry)
            return fail(error)
        settled = False

        def settle() -> None:
            nonlocal settled
            if not settled:
                settled = True
                recorder.done(entry)

        def attempt(sent_before: bool) -> Deferred[T]:
            def ended(result: T | Failure) -> T | Failure:
                if isinstance(result, Failure) and isinstance(result.value, RemoteFailure):
                    failure = result.value
                    # No answer, and it may have run (now, or when sent before).
                    if failure.wire is None and (failure.unknown or sent_before):
                        raise LostAnswer(
                            failure,
                            entry,
                            again=lambda: attempt(True),
                            drop=settle,
                            parse=parse,
                        )
                settle()
                return result

            return self._call(op, request, lambda answer, _: parse(answer)).addBoth(ended)

        return attempt(False)

    def change(self, op: Op, request: object) -> Deferred[Any]:
        """
        Send the declared write C{request} of C{op} as it is (an outbox
        entry's, L{svc.mount.outbox.requests}); its decoded answer message.
        """
        return self._call(op, request, lambda answer, _: answer)
