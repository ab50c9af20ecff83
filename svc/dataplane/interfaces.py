"""
The seam between the data-plane protocol adapter and the data-plane logic.

The protocol (L{svc.dataplane.protocol}) admits a TLS connection, decodes
frames and, for each connection, asks the service (L{IDataPlaneService}) for
an L{IConnectionHandler}. Every REQUEST frame becomes one
L{IConnectionHandler.handle} call; its result becomes a RESPONSE frame, and
its failure an ERROR frame: an exception with an C{errno} attribute (a
L{svc.wire.errno.WireErrno}, e.g. every L{svc.store.errors.StoreError}) is
sent with that errno, its C{message} (or C{str}) and optional C{details}
mapping; any other exception is a bug, logged with its traceback and sent as
EIO with a generic message. This translation happens once, in the protocol.

The service talks back to a connection through the L{IConnectionSink} it was
given: server-pushed frames (C{lease_revoke}, C{changed}) and disconnection
(a deny-list push that names the connection's serial).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import attrs
from twisted.internet.defer import Deferred

from svc.pki.identity import AgentIdentity
from svc.wire.commands import Command
from svc.wire.contract import DecodedRequest, RequestRefused


@attrs.frozen
class OpReply:
    """
    A successful answer: the RESPONSE frame's payload map and raw segment.

    C{sent}, when given, is called once the protocol has handed the reply to
    the transport, its last slice written (L{svc.dataplane.answer_writer}),
    or dropped it (the request had timed out, the connection closed); C{raw}
    is not used after it. A chunk lent by the store is released then, and
    the answer's reservation given back (a reply that never reaches the
    protocol simply leaves its buffer to the garbage collector).
    """

    payload: Mapping[str, object] = attrs.field(factory=dict)
    raw: bytes | memoryview = b""
    sent: Callable[[], None] | None = None


class IConnectionSink(Protocol):
    """
    What the service may do to one connection.
    """

    def push(self, op: str, payload: Mapping[str, object]) -> None:
        """
        Send a PUSH frame (request id 0) with ``payload`` (which the protocol
        completes with C{"op": op}).
        """

    def disconnect(self, reason: str) -> None:
        """
        Send GOAWAY with ``reason`` where possible and close the connection;
        unanswered requests are abandoned.
        """


class IConnectionHandler(Protocol):
    """
    One admitted connection's view of the service.
    """

    def handle(
        self, command: Command, decoded: DecodedRequest, raw: memoryview
    ) -> Deferred[OpReply]:
        """
        Run one request of operation C{command}. ``decoded`` is the REQUEST
        frame's map decoded within the command's limits
        (L{svc.wire.contract.decode}: the request message, or the refusal of
        its fields, which the handler audits and answers); ``raw`` its raw
        segment (valid only until the Deferred fires: copy what must outlive
        it). Requests of one connection may overlap; the service keeps any
        ordering it needs.
        """

    def refused(self, error: RequestRefused) -> None:
        """
        The protocol answered a request C{EPROTO} before its operation was
        known (L{svc.wire.contract.peek_op}): count it and log it at a
        bounded rate.
        """

    def closed(self, reason: str) -> Deferred[None]:
        """
        The connection is gone (client close, error, idle timeout, server
        stop): release its leases (C{lease_release} reason C{conn_closed}) and
        forget it. Called exactly once.
        """


class IDataPlaneService(Protocol):
    """
    The data-plane logic as the protocol sees it.
    """

    def connect(
        self, identity: AgentIdentity, connection_id: str, sink: IConnectionSink
    ) -> IConnectionHandler:
        """
        A connection with verified ``identity`` was admitted; ``connection_id``
        is unique for the life of the server (and across restarts).
        """
