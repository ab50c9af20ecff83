"""
Agent identity on the control plane (C{AuthKind.AGENT_IDENTITY}): the routes
an enrolled agent calls (C{/agent/renew}, C{/allocations/{id}/mount*}).

An agent proves who it is in one of three ways, tried in this order:

  1. B{TLS client certificate}: the request came over a TLS listener that
     asked for a client certificate, and the agent presented its leaf and
     tenant intermediate. The chain is verified again here against the org
     root at the injected time, so the listener's own settings do not
     matter.
  2. B{Signed request} (TLS terminated at the edge): body fields
     C{client_cert_pem} (the leaf, optionally followed by the intermediate),
     C{ca_chain_pem} (optional; the enrollment response's, root ignored),
     C{proof_timestamp_ms} (integer Unix time in milliseconds, within
     L{PROOF_WINDOW_SECONDS} of the server's clock) and C{proof_signature}
     (base64url, padding optional, of the ed25519 signature by the leaf's key
     over L{proof_message}: C{"svc-agent-proof-v1\\n<METHOD>\\n<path>\\n
     <serial>\\n<timestamp_ms>"}, where C{<path>} is the route path without
     query string or C{/api} prefix). Each signature is accepted once per
     process (L{ReplayGuard}).
  3. B{Fingerprint}: body field C{agent_fingerprint}, the SHA-256 of the
     leaf's DER in 64 lowercase hex digits
     (L{svc.control.ca.certificate_fingerprint}), looked up in the issued
     certificates. This proves nothing about possession of the key; routes
     that mint credentials (renewal) refuse it (L{AgentPrincipal.possession_proven}).

For 1 and 2 the chain must verify to the org root now, pass the data-plane
admission rules (SPIFFE tenant and agent SANs, tenant binding), and neither
the leaf nor its intermediate may be revoked; the leaf must be one the
control plane recorded issuing. For 3 the recorded certificate must be an
agent leaf, unexpired and unrevoked.

Failures are 401 C{invalid_client}; a certificate without an agent SAN is
403 C{access_denied}/C{agent_scope_required}; no open CA is 503 with
C{Retry-After: 60}. One refusal says more: a leaf that passes every check
but the deny-list (its own serial is revoked; for 1 and 2 its intermediate is
not) and whose agent's allocation is no longer live (revoked or purged) in
the leaf's tenant is 410 C{revoked}, as the spec answers a revoked
allocation: revoking an allocation revokes every leaf of its agent, so
without this its renewals and mount-lease calls would see 401. On the
lease holder's routes (refresh, release: C{AuthKind.LEASE_HOLDER},
C{lease_holder=True}) such a leaf whose allocation I{is} live in its tenant
is 410 C{lease_lost}: its enrollment was revoked because its lease ended
(released, force-unmounted by the owner, taken over), and the spec answers a
caller that no longer holds the lease so. The 410s authenticate nothing.
"""

from __future__ import annotations

import base64
import binascii
import enum
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

import attrs
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from twisted.internet.interfaces import ISSLTransport
from twisted.logger import Logger
from twisted.web.server import Request

from svc.control.ca import AgentCAProvider, certificate_fingerprint
from svc.control.routing import API_PREFIX
from svc.control.store.errors import NotFound
from svc.control.store.interface import ControlStore
from svc.control.store.values import CertificateKind, MountHolder
from svc.pki import names
from svc.pki.chain import verify_chain
from svc.pki.errors import AdmissionRefused, PKIError, RefusalReason
from svc.pki.identity import AgentIdentity, DenyList, admit_agent
from svc.pki.pem import cert_to_pem, certs_from_pem
from svc.web.errors import (
    AGENT_SCOPE_REQUIRED,
    INVALID_CLIENT,
    LEASE_LOST,
    REVOKED,
    AccessDenied,
    Gone,
    InvalidCredential,
    JsonValue,
    ServiceUnavailable,
)
from svc.web.rules import check_json_content_type, parse_json_object

PROOF_CONTEXT = "svc-agent-proof-v1"
PROOF_WINDOW_SECONDS = 60
"""How far a signed request's timestamp may be from the server's clock."""
CA_RETRY_AFTER = 60
DEFAULT_REPLAY_CAPACITY = 100_000

_FINGERPRINT = re.compile(r"[0-9a-f]{64}")
_log = Logger()


class AgentProof(enum.Enum):
    """How an agent proved its identity."""

    TLS_CLIENT_CERT = "tls_client_cert"
    SIGNED_REQUEST = "signed_request"
    FINGERPRINT = "fingerprint"


@attrs.frozen
class AgentPrincipal:
    """
    An enrolled agent, from its verified leaf (or the record of it). The
    leaf serial identifies the enrollment; C{user_id} is the leaf CN (the
    allocation's owner when it was minted).
    """

    tenant_id: str
    agent_id: str
    user_id: str
    serial: str
    not_after: datetime
    fingerprint: str
    proof: AgentProof

    @property
    def possession_proven(self) -> bool:
        """Whether the caller proved it holds the leaf's key (not just its fingerprint)."""
        return self.proof is not AgentProof.FINGERPRINT

    def mount_holder(self) -> MountHolder:
        """This enrollment as a mount-lease holder."""
        return MountHolder(self.agent_id, self.serial, self.not_after, self.fingerprint)


def proof_message(method: str, path: str, serial: str, timestamp_ms: int) -> bytes:
    """The bytes a signed request's C{proof_signature} signs."""
    return f"{PROOF_CONTEXT}\n{method.upper()}\n{path}\n{serial}\n{timestamp_ms}".encode()


def sign_request(
    key: Ed25519PrivateKey, leaf: x509.Certificate, method: str, path: str, timestamp_ms: int
) -> dict[str, JsonValue]:
    """
    The body fields of a signed request (client side; see the module
    docstring), without C{ca_chain_pem}.
    """
    serial = names.format_serial(leaf.serial_number)
    signature = key.sign(proof_message(method, path, serial, timestamp_ms))
    return {
        "client_cert_pem": cert_to_pem(leaf).decode("ascii"),
        "proof_timestamp_ms": timestamp_ms,
        "proof_signature": base64.urlsafe_b64encode(signature).rstrip(b"=").decode("ascii"),
    }


def route_path(raw_path: bytes) -> str:
    """
    The path a request proof signs: the request path without C{/api} (the
    edge may or may not strip it).
    """
    path = raw_path.decode("utf-8", "replace")
    if path.startswith(API_PREFIX + "/"):
        path = path[len(API_PREFIX) :]
    return path


class ReplayGuard:
    """
    Remembers signatures for twice the proof window so each is accepted
    once (per process). At most C{capacity} are kept; the oldest go first.
    """

    def __init__(
        self,
        window_seconds: float = 2 * PROOF_WINDOW_SECONDS,
        capacity: int = DEFAULT_REPLAY_CAPACITY,
    ) -> None:
        self._window = window_seconds
        self._capacity = capacity
        self._seen: OrderedDict[bytes, float] = OrderedDict()

    def first_use(self, signature: bytes, now: float) -> bool:
        """Whether C{signature} is new; it is remembered from now on."""
        seen_at = self._seen.get(signature)
        if seen_at is not None and seen_at > now - self._window:
            return False
        self._seen.pop(signature, None)
        while self._seen:
            oldest, at = next(iter(self._seen.items()))
            if at > now - self._window and len(self._seen) < self._capacity:
                break
            del self._seen[oldest]
        self._seen[signature] = now
        return True


def tls_peer_chain(request: Request) -> list[x509.Certificate] | None:
    """
    The client certificate chain (leaf first) the request's TLS connection
    presented, or L{None} when it is not TLS or no certificate was sent.
    """
    transport = getattr(request, "transport", None)
    if transport is None or not ISSLTransport.providedBy(transport):
        return None
    handle = transport.getHandle()
    leaf = handle.get_peer_certificate(as_cryptography=True)
    if leaf is None:
        return None
    rest = handle.get_peer_cert_chain(as_cryptography=True) or []
    return [leaf, *(cert for cert in rest if cert != leaf)]


def _invalid() -> InvalidCredential:
    return InvalidCredential(INVALID_CLIENT)


class AgentIdentityAuthenticator:
    """
    The C{AGENT_IDENTITY} authenticator: L{AgentPrincipal} or an error (see
    the module docstring).
    """

    def __init__(
        self,
        store: ControlStore,
        ca: AgentCAProvider,
        now: Callable[[], float],
        max_body_bytes: int,
        replay_guard: ReplayGuard | None = None,
        *,
        lease_holder: bool = False,
    ) -> None:
        self._store = store
        self._ca = ca
        self._now = now
        self._max_body_bytes = max_body_bytes
        self._replay = replay_guard if replay_guard is not None else ReplayGuard()
        self._lease_holder = lease_holder

    def for_lease_holder(self) -> AgentIdentityAuthenticator:
        """
        The same authenticator (same store, CA, clock and replay guard) for
        the lease holder's routes: a revoked enrollment of a live allocation
        is 410 C{lease_lost}.
        """
        return AgentIdentityAuthenticator(
            self._store,
            self._ca,
            self._now,
            self._max_body_bytes,
            self._replay,
            lease_holder=True,
        )

    async def authenticate(self, request: Request) -> AgentPrincipal:
        """The agent the request proves it is."""
        now = datetime.fromtimestamp(self._now(), UTC)
        chain = tls_peer_chain(request)
        if chain is not None:
            return await self._verified(chain, now, AgentProof.TLS_CLIENT_CERT)
        body = _optional_json_body(request, self._max_body_bytes)
        if "client_cert_pem" in body:
            return await self._signed(request, body, now)
        fingerprint = body.get("agent_fingerprint")
        if isinstance(fingerprint, str):
            return await self._by_fingerprint(fingerprint, now)
        _log.info("agent_identity_rejected reason={reason}", reason="no_credential")
        raise _invalid()

    async def _signed(
        self, request: Request, body: Mapping[str, JsonValue], now: datetime
    ) -> AgentPrincipal:
        certs = _presented_certs(body)
        timestamp = body.get("proof_timestamp_ms")
        signature = _signature(body.get("proof_signature"))
        if isinstance(timestamp, bool) or not isinstance(timestamp, int) or signature is None:
            raise _rejected("malformed_proof")
        if abs(now.timestamp() * 1000 - timestamp) > PROOF_WINDOW_SECONDS * 1000:
            raise _rejected("proof_time_outside_window")
        leaf = certs[0]
        public = leaf.public_key()
        if not isinstance(public, Ed25519PublicKey):
            raise _rejected("leaf_not_ed25519")
        method = (request.method or b"").decode("ascii", "replace")
        message = proof_message(
            method,
            route_path(request.path or b""),
            names.format_serial(leaf.serial_number),
            timestamp,
        )
        try:
            public.verify(signature, message)
        except InvalidSignature:
            raise _rejected("bad_signature") from None
        if not self._replay.first_use(signature, now.timestamp()):
            raise _rejected("proof_replayed")
        return await self._verified(certs, now, AgentProof.SIGNED_REQUEST)

    async def _verified(
        self, certs: list[x509.Certificate], now: datetime, proof: AgentProof
    ) -> AgentPrincipal:
        ca = await self._ca.get()
        if ca is None:
            raise ServiceUnavailable("agent_ca_not_ready", retry_after=CA_RETRY_AFTER)
        leaf = certs[0]
        helpers = [cert for cert in certs[1:] if cert.issuer != cert.subject]
        try:
            chain = verify_chain(leaf, helpers, ca.root, now)
        except PKIError as e:
            raise _rejected("chain_not_verified", str(e)) from None
        if len(chain) != 3:
            raise _rejected("chain_mismatch")
        deny_list = await self._deny_list(now)
        try:
            identity = admit_agent(chain[0], chain[1], ca.trust_domain, deny_list)
        except AdmissionRefused as e:
            _log.info("agent_identity_rejected reason={reason}", reason=e.reason.value)
            if e.reason is RefusalReason.NO_AGENT_SAN:
                raise AccessDenied(AGENT_SCOPE_REQUIRED) from None
            denied = _denied_leaf(chain[0], chain[1], ca.trust_domain, deny_list)
            if denied is not None:
                await self._issued_here(denied.serial)
                await self._refuse_revoked_leaf(denied.agent_id, denied.tenant_id)
            raise _invalid() from None
        await self._issued_here(identity.serial)
        return AgentPrincipal(
            tenant_id=identity.tenant_id,
            agent_id=identity.agent_id,
            user_id=identity.user_id,
            serial=identity.serial,
            not_after=identity.not_after,
            fingerprint=certificate_fingerprint(leaf),
            proof=proof,
        )

    async def _by_fingerprint(self, fingerprint: str, now: datetime) -> AgentPrincipal:
        if _FINGERPRINT.fullmatch(fingerprint) is None:
            raise _rejected("malformed_fingerprint")
        try:
            record = await self._store.find_certificate_by_fingerprint(fingerprint)
        except NotFound:
            raise _rejected("unknown_fingerprint") from None
        if (
            record.kind is not CertificateKind.AGENT_LEAF
            or record.tenant_id is None
            or record.agent_id is None
        ):
            raise _rejected("not_an_agent_leaf")
        if record.not_after <= now:
            raise _rejected("expired")
        if record.serial in await self._deny_list(now):
            await self._refuse_revoked_leaf(record.agent_id, record.tenant_id)
            raise _rejected("revoked")
        return AgentPrincipal(
            tenant_id=record.tenant_id,
            agent_id=record.agent_id,
            user_id=record.subject,
            serial=record.serial,
            not_after=record.not_after,
            fingerprint=fingerprint,
            proof=AgentProof.FINGERPRINT,
        )

    async def _deny_list(self, now: datetime) -> DenyList:
        revocations = await self._store.active_revocations(now)
        return DenyList.of((r.serial, r.not_after) for r in revocations)

    async def _issued_here(self, serial: str) -> None:
        """Refuse (401) a leaf the control plane has no record of issuing."""
        try:
            await self._store.find_certificate(serial)
        except NotFound:
            raise _rejected("leaf_not_issued_here", serial) from None

    async def _refuse_revoked_leaf(self, agent_id: str, tenant_id: str) -> None:
        """
        For a leaf refused only because its serial is deny-listed, when the
        allocation of its agent is in the leaf's tenant: 410 C{revoked} if
        that allocation is no longer live; 410 C{lease_lost} if it is live
        and this authenticator serves the lease holder's routes. Otherwise
        return (the caller refuses with 401).
        """
        try:
            allocation = await self._store.get_agent_allocation(agent_id)
        except NotFound:
            return
        if allocation.tenant_id != tenant_id:
            return
        if not allocation.live:
            reason, code = "allocation_revoked", REVOKED
        elif self._lease_holder:
            reason, code = "enrollment_revoked", LEASE_LOST
        else:
            return
        _log.info(
            "agent_identity_rejected reason={reason} agent={agent_id}",
            reason=reason,
            agent_id=agent_id,
        )
        raise Gone(code)


def _denied_leaf(
    leaf: x509.Certificate, intermediate: x509.Certificate, trust_domain: str, deny_list: DenyList
) -> AgentIdentity | None:
    """
    The identity of C{leaf} if the admission rules refuse it only because
    its own serial is in C{deny_list} (every other rule holds, its
    intermediate is not listed); else L{None}.
    """
    serial = names.format_serial(leaf.serial_number)
    if serial not in deny_list:
        return None
    others = DenyList(frozenset(entry for entry in deny_list.entries if entry.serial != serial))
    try:
        return admit_agent(leaf, intermediate, trust_domain, others)
    except AdmissionRefused:
        return None


def _rejected(reason: str, detail: str = "") -> InvalidCredential:
    _log.info(
        "agent_identity_rejected reason={reason} {detail}",
        agent_identity_rejected=True,
        reason=reason,
        detail=detail,
    )
    return _invalid()


def _presented_certs(body: Mapping[str, JsonValue]) -> list[x509.Certificate]:
    texts = [body.get("client_cert_pem")]
    if "ca_chain_pem" in body:
        texts.append(body.get("ca_chain_pem"))
    certs: list[x509.Certificate] = []
    for text in texts:
        if not isinstance(text, str) or not text.isascii():
            raise _rejected("malformed_certificate")
        try:
            certs.extend(certs_from_pem(text.encode("ascii")))
        except PKIError:
            raise _rejected("malformed_certificate") from None
    return certs


def _signature(value: JsonValue) -> bytes | None:
    if not isinstance(value, str) or not value.isascii():
        return None
    padded = value + "=" * (-len(value) % 4)
    try:
        decoded = base64.urlsafe_b64decode(padded.encode("ascii"))
    except (binascii.Error, ValueError):
        return None
    return decoded if len(decoded) == 64 else None


def _optional_json_body(request: Request, limit: int) -> dict[str, JsonValue]:
    # The body's size was bounded before routing (svc.control.http).
    content = request.content
    raw = b""
    if content is not None:
        content.seek(0)
        raw = content.read(limit + 1)
        content.seek(0)
    if not raw:
        return {}
    check_json_content_type(request.getHeader(b"content-type"))
    return parse_json_object(raw, limit)
