"""
The data plane's pushes the mount acts on, as callbacks for
L{svc.dataplane_client.client.DataPlaneClient.on_push}: each decodes one
kind of push with the wire contract and hands its value on; other pushes
are not its business (``docs/specifications/dataplane-ops.md``, pushes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from twisted.logger import Logger

from svc.dataplane_client.client import PushCallback
from svc.wire.contract import decode_push
from svc.wire.kinds import FieldRefused
from svc.wire.ops import Op

_log = Logger()


def changed_pushes(receive: Callable[[tuple[str, ...], str | None], object]) -> PushCallback:
    """
    A push callback for L{svc.dataplane_client.client.DataPlaneClient.on_push}
    that hands each C{changed} push's paths and session id to C{receive};
    other pushes are not its business, and a malformed C{changed} push is
    logged and dropped.
    """

    def pushed(op: str, payload: Mapping[str, object], raw: bytes) -> None:
        if op != "changed":
            return
        try:
            push = decode_push(Op.CHANGED, payload)
        except FieldRefused as error:
            _log.warn("ignoring a malformed changed push: {error}", error=error.message)
            return
        receive(push.paths, push.session_id)

    return pushed


def revoked_pushes(receive: Callable[[str], object]) -> PushCallback:
    """
    A push callback that hands the serial of each C{credentials_revoked}
    push to C{receive} (the data plane will admit this mount's certificate
    no more); other pushes are not its business. A malformed one still
    counts, with the serial unknown: the GOAWAY that follows ends the
    connection either way, and holding writes for a reconnection that
    cannot come is what the push exists to prevent.
    """

    def pushed(op: str, payload: Mapping[str, object], raw: bytes) -> None:
        if op != Op.CREDENTIALS_REVOKED:
            return
        try:
            serial = decode_push(Op.CREDENTIALS_REVOKED, payload).serial
        except FieldRefused as error:
            _log.warn("malformed credentials_revoked push: {error}", error=error.message)
            serial = "unknown"
        receive(serial)

    return pushed


def fenced_pushes(receive: Callable[[int], object]) -> PushCallback:
    """
    A push callback that hands the epoch of each C{session_fenced} push to
    C{receive} (sessions of the agent older than it are fenced); other
    pushes are not its business, and a malformed one is logged and dropped.
    """

    def pushed(op: str, payload: Mapping[str, object], raw: bytes) -> None:
        if op != Op.SESSION_FENCED:
            return
        try:
            epoch = decode_push(Op.SESSION_FENCED, payload).epoch
        except FieldRefused as error:
            _log.warn("ignoring a malformed session_fenced push: {error}", error=error.message)
            return
        receive(epoch)

    return pushed
