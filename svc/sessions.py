"""
Mount session ids: C{mount:<hex>} values derived from an exclusive mount lease.

The control plane mints a session id when it grants a mount lease; the mount
client sends it with every write; the data plane verifies it without asking
the control plane. The id is self-certifying:

    mount:<epoch: 16 hex><nonce: 16 hex><tag: 32 hex>

- C{epoch} is the allocation's mount-lease epoch, incremented by the control
  plane on every grant (a forced takeover gets a higher epoch than the lease
  it displaces);
- C{nonce} is 8 random bytes;
- C{tag} is the first 16 bytes of HMAC-SHA256 over
  C{"svc-mount-session-v1\\0" tenant "\\0" agent "\\0" epoch-hex nonce-hex},
  keyed with L{session_key} (derived from the service token both planes
  already share, C{SVC_CONTROL_PLANE_TOKEN}).

A data-plane server rejects an id that is malformed (C{bad_format}), not hex
(C{bad_hex}), not minted for the connection's verified tenant and agent
(C{unknown_or_wrong_holder}), or older than the highest epoch it has seen for
that agent (C{fenced}): these are the reasons of
C{svc_session_forgery_rejected_total}. See ``docs/specifications/sessions.md``.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets

import attrs

PREFIX = "mount:"
_EPOCH_HEX = 16
_NONCE_HEX = 16
_TAG_HEX = 32
_BODY_HEX = _EPOCH_HEX + _NONCE_HEX + _TAG_HEX
_HEX = re.compile(r"\A[0-9a-f]*\Z")
_DOMAIN = b"svc-mount-session-v1\x00"


class SessionRejection(enum.StrEnum):
    """
    Why a presented session id was refused (the metric's C{reason} label).
    """

    BAD_FORMAT = "bad_format"
    BAD_HEX = "bad_hex"
    UNKNOWN_OR_WRONG_HOLDER = "unknown_or_wrong_holder"
    FENCED = "fenced"


class SessionRejected(Exception):
    """
    A session id failed verification for ``reason``.
    """

    def __init__(self, reason: SessionRejection) -> None:
        super().__init__(reason.value)
        self.reason = reason


@attrs.frozen
class MountSession:
    """
    A verified session: whose it is and which lease epoch it belongs to.
    """

    session_id: str
    tenant_id: str
    agent_id: str
    epoch: int


def session_key(service_token: str) -> bytes:
    """
    The HMAC key both planes derive from the shared service token.
    """
    return hmac.new(service_token.encode(), b"svc mount-session key v1", hashlib.sha256).digest()


def _tag(key: bytes, tenant_id: str, agent_id: str, body: str) -> str:
    message = b"\x00".join([_DOMAIN + tenant_id.encode(), agent_id.encode(), body.encode()])
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:_TAG_HEX]


def mint_session_id(
    key: bytes,
    *,
    tenant_id: str,
    agent_id: str,
    epoch: int,
    nonce: bytes | None = None,
) -> str:
    """
    A new session id for the agent's mount lease at ``epoch``.
    """
    if not 0 <= epoch < 2**64:
        raise ValueError("epoch must fit in 64 bits")
    nonce = secrets.token_bytes(8) if nonce is None else nonce
    if len(nonce) != 8:
        raise ValueError("nonce must be 8 bytes")
    body = f"{epoch:016x}{nonce.hex()}"
    return PREFIX + body + _tag(key, tenant_id, agent_id, body)


def parse_epoch(session_id: str) -> int:
    """
    The epoch of a well-formed id (no authentication), or L{SessionRejected}
    for the format reasons.
    """
    if not session_id.startswith(PREFIX) or len(session_id) != len(PREFIX) + _BODY_HEX:
        raise SessionRejected(SessionRejection.BAD_FORMAT)
    body = session_id[len(PREFIX) :]
    if not _HEX.match(body):
        raise SessionRejected(SessionRejection.BAD_HEX)
    return int(body[:_EPOCH_HEX], 16)


def verify_session_id(
    key: bytes, session_id: str, *, tenant_id: str, agent_id: str
) -> MountSession:
    """
    Check ``session_id`` was minted for this tenant and agent. Fencing by
    epoch is the caller's job (it knows the newest epoch seen); see
    L{SessionBook}.
    """
    epoch = parse_epoch(session_id)
    body = session_id[len(PREFIX) : len(PREFIX) + _EPOCH_HEX + _NONCE_HEX]
    tag = session_id[len(PREFIX) + _EPOCH_HEX + _NONCE_HEX :]
    if not hmac.compare_digest(_tag(key, tenant_id, agent_id, body), tag):
        raise SessionRejected(SessionRejection.UNKNOWN_OR_WRONG_HOLDER)
    return MountSession(session_id, tenant_id, agent_id, epoch)


@attrs.define
class SessionBook:
    """
    The data plane's memory of the newest epoch per (tenant, agent): a
    session older than the newest one seen is fenced. Pure; the server
    persists L{highest} where it keeps sessions.
    """

    highest: dict[tuple[str, str], int] = attrs.field(factory=dict)

    def admit(self, session: MountSession) -> bool:
        """
        Accept ``session`` unless a newer epoch was seen for its agent; returns
        whether this raised the newest epoch (a new mount, not a rebind).
        """
        key = (session.tenant_id, session.agent_id)
        newest = self.highest.get(key, -1)
        if session.epoch < newest:
            raise SessionRejected(SessionRejection.FENCED)
        self.highest[key] = session.epoch
        return session.epoch > newest

    def raise_to(self, tenant_id: str, agent_id: str, epoch: int) -> bool:
        """
        Fence every session of the agent older than C{epoch} (the control
        plane granted its mount lease at C{epoch}); returns whether this
        raised the newest epoch.
        """
        key = (tenant_id, agent_id)
        if epoch <= self.highest.get(key, -1):
            return False
        self.highest[key] = epoch
        return True
