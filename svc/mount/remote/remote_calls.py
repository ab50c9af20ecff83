"""
One typed data-plane request of the mount client: sent over one
connection's C{call(op, payload, raw)} seam (L{IDataPlaneCaller}: a
L{svc.dataplane_client.client.DataPlaneClient}, or in tests a
L{svc.testing.local_connection.LocalConnection}), its answer decoded with
the declared answer message, and its failure translated once.

Failures are translated here, once, into L{RemoteFailure}: the server's
wire errno becomes the local errno of the same name; a request that got no
answer (connection lost, timeout, refused before sending) is EIO, marked
C{unknown} when it was sent and may have run. So is the server's
C{ETIMEDOUT} (the request may still run), with its own errno. A reply that
does not have the documented shape is EIO too.

L{RemoteCalls} is the base of L{svc.mount.remote.data_plane.Remote}, whose methods
are the operations.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred, fail
from twisted.python.failure import Failure

from svc.dataplane_client.client import Reply
from svc.dataplane_client.errors import (
    CallTimedOut,
    DataPlaneError,
    OutcomeUnknown,
    RemoteError,
)
from svc.mount.core.errors import RemoteFailure, local_errno
from svc.mount.remote.remote_values import BadReply
from svc.wire.commands import COMMANDS
from svc.wire.contract import decode_answer
from svc.wire.errno import WireErrno
from svc.wire.errors import CodecError
from svc.wire.kinds import FieldRefused
from svc.wire.ops import Op
from svc.wire.schema import encode_message

T = TypeVar("T")

__all__ = ["IDataPlaneCaller", "RemoteCalls"]


class IDataPlaneCaller(Protocol):
    """The seam: one data-plane connection's request method."""

    def call(
        self,
        op: str,
        payload: Mapping[str, object],
        raw: bytes | memoryview = b"",
        *,
        timeout: float | None = None,
    ) -> Deferred[Reply]:
        """Send C{op}; fires with the L{Reply} or fails with a L{DataPlaneError}."""


def _may_have_run(error: Exception) -> bool:
    """Whether the request that failed with C{error} was sent and may have run."""
    if isinstance(error, CallTimedOut):
        return error.sent
    return isinstance(error, OutcomeUnknown)


class RemoteCalls:
    """
    Requests over one L{IDataPlaneCaller}; see the module docstring. Every
    request returns a L{Deferred}; every failure is a L{RemoteFailure}.
    """

    def __init__(self, caller: IDataPlaneCaller, *, timeout: float | None = None) -> None:
        self._caller = caller
        self._timeout = timeout

    def _request(
        self,
        op: str,
        payload: Mapping[str, object],
        parse: Callable[[Reply], T],
        raw: bytes | memoryview = b"",
    ) -> Deferred[T]:
        # Callbacks, not a coroutine: every request of the mount comes
        # through here, and a coroutine's Deferred and resumption cost more
        # than the rest of this method.
        def translated(failure: Failure) -> Failure:
            error = failure.value
            if isinstance(error, RemoteError):
                raise RemoteFailure(
                    local_errno(error.errno),
                    f"{op}: {error.message}",
                    error.errno,
                    error.details,
                    # The server gave up waiting; a request that had started
                    # still runs to its end (dataplane-ops.md section 7).
                    unknown=error.errno is WireErrno.ETIMEDOUT,
                ) from None
            if isinstance(error, (DataPlaneError, CodecError)):
                raise RemoteFailure(
                    errno.EIO, f"{op}: {error}", unknown=_may_have_run(error)
                ) from None
            return failure

        def parsed(reply: Reply) -> T:
            try:
                return parse(reply)
            except FieldRefused as error:
                raise RemoteFailure(errno.EIO, f"{op}: unexpected reply: {error.message}") from None
            except (BadReply, ValueError, TypeError) as error:
                raise RemoteFailure(errno.EIO, f"{op}: unexpected reply: {error}") from None

        try:
            called = self._caller.call(op, payload, raw, timeout=self._timeout)
        except Exception:
            called = fail()
        return called.addCallbacks(parsed, translated)

    def _call(
        self,
        op: Op,
        request: object,
        parse: Callable[[Any, Reply], T],
        raw: bytes | memoryview = b"",
    ) -> Deferred[T]:
        """
        Send the declared C{request} of C{op} and decode its answer with the
        declared answer message, then C{parse(answer, reply)} it into the
        mount's value.
        """
        command = COMMANDS[op]

        def answered(reply: Reply) -> T:
            return parse(decode_answer(command, reply.payload), reply)

        return self._request(op.value, encode_message(request), answered, raw)
