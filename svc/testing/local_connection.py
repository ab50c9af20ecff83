"""
An in-process data-plane connection: the
L{svc.mount.remote.remote_calls.IDataPlaneCaller} seam driven straight into a real
L{svc.dataplane.interfaces.IConnectionHandler}, with no sockets, TLS or
frames.

Each request is encoded as a client encodes it and handed over packed, as
the protocol adapter hands it (the handler decodes it within its
operation's limits); each answer's payload goes through the wire's msgpack
profile (L{svc.wire.payload}), so types are what a real connection would
deliver (arrays as lists, no tuples); failures become
L{svc.dataplane_client.errors.RemoteError} exactly as the protocol adapter's
ERROR frames would (an exception with a L{WireErrno} C{errno} keeps it, its
message and details; anything else is EIO). Server pushes reach the
callbacks given to L{LocalConnection.on_push}. Used by tests of the mount
client against a real L{svc.dataplane.service.DataPlaneService}.
"""

from __future__ import annotations

from collections.abc import Mapping

from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.dataplane.interfaces import IDataPlaneService, OpReply
from svc.dataplane_client.client import PushCallback, Reply
from svc.dataplane_client.errors import NotExecuted, RemoteError
from svc.pki.identity import AgentIdentity
from svc.wire.contract import RequestRefused, decode, find_command
from svc.wire.control import ErrorInfo
from svc.wire.errno import WireErrno
from svc.wire.payload import pack_payload, unpack_payload

_log = Logger()

GENERIC_FAILURE_MESSAGE = "internal server error"


class LocalConnection:
    """
    One admitted connection of C{identity} to C{service}, called in
    process. It is its own L{svc.dataplane.interfaces.IConnectionSink}.

    @ivar calls: every request's op, in order (for tests counting traffic).
    @ivar disconnected: the reason the service disconnected us, if it did.
    """

    def __init__(
        self, service: IDataPlaneService, identity: AgentIdentity, connection_id: str = "local-1"
    ) -> None:
        self.calls: list[str] = []
        self.disconnected: str | None = None
        self._callbacks: list[PushCallback] = []
        self._closed = False
        self._handler = service.connect(identity, connection_id, self)

    def call(
        self,
        op: str,
        payload: Mapping[str, object] | None = None,
        raw: bytes | memoryview = b"",
        *,
        timeout: float | None = None,
    ) -> Deferred[Reply]:
        """Run C{op} on the handler; see the module docstring."""
        if self._closed or self.disconnected is not None:
            return fail(NotExecuted("connection closed"))
        self.calls.append(op)
        # Encoded as a client encodes it (op first), then decoded by the
        # server as the protocol would: the operation found, the map handed
        # over still packed.
        packed = pack_payload({"op": op, **(payload or {})})
        try:
            command = find_command(packed)
        except RequestRefused as error:
            self._handler.refused(error)
            return fail(RemoteError(ErrorInfo(WireErrno.EPROTO, error.message)))
        except KeyError:
            return fail(RemoteError(ErrorInfo(WireErrno.ENOSYS, "unknown operation")))
        try:
            decoded = decode(command, packed)
        except RequestRefused as error:
            self._handler.refused(error)
            return fail(RemoteError(ErrorInfo(WireErrno.EPROTO, error.message)))
        answer = self._handler.handle(command, decoded, memoryview(bytes(raw)))
        return answer.addCallbacks(_reply, _error, errbackArgs=(op,))

    def on_push(self, callback: PushCallback) -> None:
        """Call C{callback(op, payload, raw)} for each server push."""
        self._callbacks.append(callback)

    def close(self) -> Deferred[None]:
        """Tell the handler the connection is gone (its leases are released)."""
        if self._closed:
            return succeed(None)
        self._closed = True
        return self._handler.closed("client_close")

    # IConnectionSink

    def push(self, op: str, payload: Mapping[str, object]) -> None:
        """Deliver a server push to the callbacks."""
        delivered = unpack_payload(pack_payload({**payload, "op": op}))
        for callback in list(self._callbacks):
            try:
                callback(op, delivered, b"")
            except Exception:
                _log.failure("push callback failed for {op}", op=op)

    def disconnect(self, reason: str) -> None:
        """The service dropped us: later calls are not executed."""
        self.disconnected = reason


def _reply(answer: OpReply) -> Reply:
    try:
        return Reply(unpack_payload(pack_payload(dict(answer.payload))), bytes(answer.raw))
    finally:
        if answer.sent is not None:
            answer.sent()


def _error(failure: Failure, op: str) -> Failure:
    error = failure.value
    code = getattr(error, "errno", None)
    if isinstance(code, WireErrno):
        message = getattr(error, "message", None)
        details = getattr(error, "details", None)
        info = ErrorInfo(
            code,
            message if isinstance(message, str) else str(error),
            unpack_payload(pack_payload(dict(details))) if isinstance(details, Mapping) else {},
        )
    else:
        _log.failure("data-plane op {op} failed", failure, op=op)
        info = ErrorInfo(WireErrno.EIO, GENERIC_FAILURE_MESSAGE)
    return Failure(RemoteError(info))  # type: ignore[no-untyped-call]
