"""
The audit event model: one frozen value per audit line.

An L{AuditEvent} holds exactly the fields its line will carry and refuses,
when built, any field the specification does not name for that event on
that side (see L{svc.audit.names}). There is no field for file contents. The
generic constructors L{client_event} and L{server_event} fill the envelope
from the caller's process or certificate; L{svc.audit.client_events} and
L{svc.audit.server_events} build the events with special envelopes. Turning
an event into its JSON line is L{svc.audit.jsonl.render_line}.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs

from svc.audit.names import (
    ENVELOPE_FIELDS,
    SERVER_COMMAND,
    EventShape,
    Origin,
    shape_of,
)
from svc.pki.identity import AgentIdentity, ControlIdentity

ExtraValue = str | int | bool
"""The JSON types an event-specific field may have."""


def _non_negative_int(value: object, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def _optional_count(_i: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None:
        _non_negative_int(value, attribute.name)


def _optional_text(_i: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{attribute.name} must be a non-empty string or None, got {value!r}")


@attrs.frozen
class CertFields:
    """
    The server-line identity fields, taken from a verified certificate.
    Every field is optional: absent ones are omitted from the line.
    """

    agent_id: str | None = attrs.field(default=None, validator=_optional_text)
    tenant_id: str | None = attrs.field(default=None, validator=_optional_text)
    cert_serial: str | None = attrs.field(default=None, validator=_optional_text)
    cert_subject: str | None = attrs.field(default=None, validator=_optional_text)

    @classmethod
    def of_agent(cls, identity: AgentIdentity) -> CertFields:
        """The fields of an admitted agent's leaf."""
        return cls(identity.agent_id, identity.tenant_id, identity.serial, identity.subject)

    @classmethod
    def of_control(cls, identity: ControlIdentity) -> CertFields:
        """The fields of the control plane's certificate (no agent or tenant)."""
        return cls(cert_serial=identity.serial, cert_subject=identity.subject)


NO_CERT = CertFields()
"""No certificate (an HTTP request that failed authentication, a sweep)."""


@attrs.frozen
class CallerProcess:
    """
    The process behind a mount-client call: its name (the line's
    C{command}), pid, uid and gid. Unknown parts are L{None} and omitted.
    """

    command: str | None = None
    pid: int | None = None
    uid: int | None = None
    gid: int | None = None

    def __attrs_post_init__(self) -> None:
        # One pass instead of a validator per field: made for most FUSE requests.
        command = self.command
        if command is not None and (not isinstance(command, str) or not command):
            raise ValueError(f"command must be a non-empty string or None, got {command!r}")
        for name, value in (("pid", self.pid), ("uid", self.uid), ("gid", self.gid)):
            if value is not None:
                _non_negative_int(value, name)


NO_PROCESS = CallerProcess()
"""No known caller (the macOS NFS surface, background work)."""


def _extras(
    items: Iterable[tuple[str, ExtraValue | None]],
) -> tuple[tuple[str, ExtraValue], ...]:
    return tuple((name, value) for name, value in items if value is not None)


def _ts(_i: object, _a: attrs.Attribute[float] | None, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"ts must be seconds since the epoch, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"ts must be finite and not negative, got {value!r}")


_TS = None  # the attribute argument _ts never reads

_COUNT_FIELDS = ("size", "offset", "agent_pid", "uid", "gid")
_TEXT_FIELDS = ("command", "agent_id", "tenant_id", "cert_serial", "cert_subject", "session_id")


@attrs.frozen
class AuditEvent:
    """
    One audit line, before rendering.

    C{ts} is the time written, in seconds since the epoch (a reactor's
    C{seconds()} or C{time.time()}). C{extra} holds the event-specific fields
    in order, L{None} values dropped. Building the value checks it against
    the event's L{EventShape} for C{origin}: a server line has C{command}
    C{svc-server}; fields the event does not carry must be L{None}; C{path}
    is empty where the event requires; C{allowed} is fixed where the event
    fixes it (C{lease_*}, C{lease_denied}, C{cache_*}, C{http_auth}, ...).
    """

    origin: Origin
    ts: float
    event: str = attrs.field(converter=str)
    path: str
    allowed: bool
    command: str | None
    size: int | None = None
    offset: int | None = None
    agent_pid: int | None = None
    uid: int | None = None
    gid: int | None = None
    agent_id: str | None = None
    tenant_id: str | None = None
    cert_serial: str | None = None
    cert_subject: str | None = None
    session_id: str | None = None
    extra: tuple[tuple[str, ExtraValue], ...] = attrs.field(default=(), converter=_extras)

    def __attrs_post_init__(self) -> None:
        # One pass over the fields instead of a validator each: a mount
        # writes a few lines per file it creates (session 26).
        _ts(None, _TS, self.ts)
        if not isinstance(self.path, str):
            raise ValueError(f"path must be a string, got {self.path!r}")
        if not isinstance(self.allowed, bool):
            raise ValueError(f"allowed must be a bool, got {self.allowed!r}")
        for name in _COUNT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                _non_negative_int(value, name)
        for name in _TEXT_FIELDS:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string or None, got {value!r}")
        shape = shape_of(self.origin, self.event)
        self._check_envelope(shape)
        self._check_extras(shape)

    def _refuse(self, problem: str) -> None:
        raise ValueError(f"audit event {self.event!r} ({self.origin.value}): {problem}")

    def _check_envelope(self, shape: EventShape) -> None:
        refuse = self._refuse
        if shape.allowed is not None and self.allowed is not shape.allowed:
            refuse(f"allowed must be {str(shape.allowed).lower()}")
        if shape.path_empty and self.path:
            refuse("path must be empty")
        if self.size is not None and not shape.size:
            refuse("carries no size")
        if self.offset is not None and not shape.offset:
            refuse("carries no offset")
        if self.session_id is not None and not shape.session_id:
            refuse("carries no session_id")
        has_cert = not (
            self.tenant_id is None and self.cert_serial is None and self.cert_subject is None
        )
        has_process = not (self.agent_pid is None and self.uid is None and self.gid is None)
        if self.origin is Origin.SERVER:
            if self.command != SERVER_COMMAND:
                refuse(f"a server line has command {SERVER_COMMAND!r}")
            if has_process:
                refuse("a server line has no agent_pid, uid or gid")
            if shape.reduced and (has_cert or self.agent_id is None):
                refuse("a lease line carries agent_id and no tenant or certificate fields")
        else:
            if self.agent_id is not None or has_cert:
                refuse("a client line has no agent_id, tenant_id or certificate fields")
            if self.command == SERVER_COMMAND:
                refuse(f"a client line never has command {SERVER_COMMAND!r}")
            if not shape.process and (self.command is not None or has_process):
                refuse("carries no command, agent_pid, uid or gid")

    def _check_extras(self, shape: EventShape) -> None:
        seen: set[str] = set()
        for name, value in self.extra:
            if name in seen:
                raise ValueError(f"audit field {name!r} given twice")
            seen.add(name)
            if name in ENVELOPE_FIELDS:
                raise ValueError(f"audit field {name!r} is an envelope field")
            wanted = shape.extras.get(name)
            if wanted is None:
                raise ValueError(f"audit event {self.event!r} carries no field {name!r}")
            if wanted is bool:
                ok = isinstance(value, bool)
            elif wanted is int:
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            else:
                ok = isinstance(value, str)
            if not ok:
                raise ValueError(f"audit field {name!r} must be {wanted.__name__}, got {value!r}")

    def get(self, name: str) -> ExtraValue | None:
        """The value of event-specific field C{name}, or L{None}."""
        return dict(self.extra).get(name)


def client_event(
    event: str,
    *,
    ts: float,
    path: str,
    allowed: bool,
    caller: CallerProcess,
    size: int | None = None,
    offset: int | None = None,
    session_id: str | None = None,
    **extra: ExtraValue | None,
) -> AuditEvent:
    """
    A mount-client line: C{command} is the calling process's name (or null
    when unknown), C{agent_pid}/C{uid}/C{gid} from C{caller}. Extra fields
    with value L{None} are left out.
    """
    return AuditEvent(
        origin=Origin.CLIENT,
        ts=ts,
        event=event,
        path=path,
        allowed=allowed,
        command=caller.command,
        size=size,
        offset=offset,
        agent_pid=caller.pid,
        uid=caller.uid,
        gid=caller.gid,
        session_id=session_id,
        extra=tuple(extra.items()),
    )


def server_event(
    event: str,
    *,
    ts: float,
    cert: CertFields,
    path: str,
    allowed: bool,
    size: int | None = None,
    session_id: str | None = None,
    **extra: ExtraValue | None,
) -> AuditEvent:
    """
    A data-plane server line: C{command} C{svc-server}, the identity fields
    from C{cert}. Extra fields with value L{None} are left out.
    """
    return AuditEvent(
        origin=Origin.SERVER,
        ts=ts,
        event=event,
        path=path,
        allowed=allowed,
        command=SERVER_COMMAND,
        size=size,
        agent_id=cert.agent_id,
        tenant_id=cert.tenant_id,
        cert_serial=cert.cert_serial,
        cert_subject=cert.cert_subject,
        session_id=session_id,
        extra=tuple(extra.items()),
    )
