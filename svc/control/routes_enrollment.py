"""
The enrollment routes of the control plane, declared for
L{svc.control.app.build_control_app}:

  - C{POST /agent/enroll} (enroll token): mint a 1-hour agent leaf;
  - C{POST /agent/renew} (agent identity with proof of possession): mint a
    fresh leaf for a live one;
  - C{POST /control/sign-server-cert} (service token): sign a data-plane
    server's CSR with the org root and register the server for placement
    under its FQDN and identity key
    (C{docs/specifications/control-dataplane.md}): a server of another trust
    domain is refused (409 C{trust_domain_mismatch}), as is one claiming an
    FQDN registered under another identity key that it does not name to
    replace (409 C{fqdn_registered}); the push loop is told, so a server
    that lost its disk gets its tenants' quotas again.

All three need the database and an agent CA (mounting rule 4) and answer
503 with C{Retry-After: 60} while the CA has no org root. The decisions are
in L{svc.control.enrollment}; this module parses and renders.

Wiring (C{tap.py})::

    provider = await AgentCAProvider.opened(settings, store, worker)
    deps = EnrollmentDeps.build(store, provider, settings, reactor.seconds, pushes)
    build_control_app(settings, reactor.seconds,
                      routes=[*enrollment_routes(deps), ...],
                      authenticators=enrollment_authenticators(deps))
"""

from __future__ import annotations

import ipaddress
import re

from cryptography import x509
from twisted.logger import Logger

from svc.control.agent_auth import AgentIdentityAuthenticator, AgentPrincipal
from svc.control.ca import AgentCAProvider
from svc.control.enrollment import (
    CA_NOT_READY,
    ENROLL_RETRY_AFTER,
    Enrollment,
    EnrollmentDeps,
    EnrollTokenAuthenticator,
    EnrollTokenCredential,
    format_timestamp,
)
from svc.control.http import Authenticator, Call
from svc.control.routing import AuthKind, Feature, HandlerResult, Route
from svc.control.store.errors import ServerKeyConflict
from svc.control.store.values import Server
from svc.pki import names, server_identity
from svc.pki.errors import InvalidName, IssuanceError
from svc.pki.pem import cert_to_pem
from svc.web.errors import Conflict, InvalidRequest, JsonValue, ServiceUnavailable

__all__ = [
    "AgentCAProvider",
    "EnrollmentDeps",
    "enrollment_authenticators",
    "enrollment_routes",
    "parse_host_port",
]

MAX_SERVER_CAPACITY = 1_000_000
FQDN_REGISTERED = "fqdn_registered"
TRUST_DOMAIN_MISMATCH = "trust_domain_mismatch"
_HOST = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
_PORT = re.compile(r"[0-9]{1,5}")

_ENROLLMENT_FEATURES = frozenset({Feature.DATABASE, Feature.AGENT_CA})
_log = Logger()


def parse_host_port(text: str) -> str:
    """
    C{text} if it is C{host:port}: a DNS name (at most 253 characters), an
    IPv4 address or a bracketed IPv6 address, and a port 1-65535. Returned
    with the host lower-cased and the IPv6 address compressed.

    @raise ValueError: otherwise.
    """
    host, colon, port = text.rpartition(":")
    if not colon or _PORT.fullmatch(port) is None or not 1 <= int(port) <= 65535:
        raise ValueError("expected host:port with a port 1-65535")
    if host.startswith("[") and host.endswith("]"):
        return f"[{ipaddress.IPv6Address(host[1:-1]).compressed}]:{int(port)}"
    if len(host) > 253 or _HOST.fullmatch(host) is None:
        raise ValueError("host must be a DNS name or an IP address")
    return f"{host.lower()}:{int(port)}"


def enrollment_authenticators(deps: EnrollmentDeps) -> dict[AuthKind, Authenticator]:
    """
    The authenticators these routes need: C{ENROLL_TOKEN} and
    C{AGENT_IDENTITY} (which the mount-lease routes share), and
    C{LEASE_HOLDER} for the lease holder's mount routes.
    """
    agent = AgentIdentityAuthenticator(deps.store, deps.ca, deps.now, deps.settings.max_body_bytes)
    return {
        AuthKind.ENROLL_TOKEN: EnrollTokenAuthenticator(),
        AuthKind.AGENT_IDENTITY: agent,
        AuthKind.LEASE_HOLDER: agent.for_lease_holder(),
    }


def enrollment_routes(deps: EnrollmentDeps) -> list[Route]:
    """The route declarations, bound to C{deps}."""
    enrollment = Enrollment(deps)

    async def enroll(call: Call) -> HandlerResult:
        credential = call.principal_as(EnrollTokenCredential)
        return await enrollment.enroll(credential.token_hash)

    async def renew(call: Call) -> HandlerResult:
        return await enrollment.renew(call.principal_as(AgentPrincipal))

    async def sign_server_cert(call: Call) -> HandlerResult:
        return await _sign_server_cert(deps, call.json_body())

    return [
        Route("POST", "/agent/enroll", AuthKind.ENROLL_TOKEN, enroll, _ENROLLMENT_FEATURES),
        Route("POST", "/agent/renew", AuthKind.AGENT_IDENTITY, renew, _ENROLLMENT_FEATURES),
        Route(
            "POST",
            "/control/sign-server-cert",
            AuthKind.SERVICE_TOKEN,
            sign_server_cert,
            _ENROLLMENT_FEATURES,
        ),
    ]


async def _sign_server_cert(
    deps: EnrollmentDeps, body: dict[str, JsonValue]
) -> dict[str, JsonValue]:
    csr_pem = _text(body, "csr_pem")
    try:
        csr = x509.load_pem_x509_csr(csr_pem.encode("utf-8"))
        signed = csr.is_signature_valid
    except ValueError:
        raise InvalidRequest("bad_csr") from None
    if not signed:
        raise InvalidRequest("bad_csr")
    try:
        fqdn = names.check_fqdn(_text(body, "fqdn"))
    except InvalidName:
        raise InvalidRequest("bad_fqdn") from None
    advertise_addr = _address(body, "advertise_addr")
    http_addr = _address(body, "http_addr")
    capacity = body.get("capacity", deps.default_server_capacity)
    if (
        isinstance(capacity, bool)
        or not isinstance(capacity, int)
        or not 0 <= capacity <= MAX_SERVER_CAPACITY
    ):
        raise InvalidRequest("bad_capacity")
    trust_domain = _text(body, "trust_domain")
    identity_key = _identity_key(body, "identity_key")
    try:
        server_identity.check_proof(identity_key, body.get("identity_proof"), csr)
    except (InvalidName, server_identity.BadIdentityProof):
        raise InvalidRequest("bad_identity_proof") from None
    replacing = None
    if body.get("replaces_identity_key") is not None:
        replacing = _identity_key(body, "replaces_identity_key")
    ca = await deps.ca.get()
    if ca is None:
        raise ServiceUnavailable(CA_NOT_READY, retry_after=ENROLL_RETRY_AFTER)
    if trust_domain != ca.trust_domain:
        _log.warn(
            "server_refused {fqdn}: its trust domain {theirs!r} is not ours ({ours!r})",
            fqdn=fqdn,
            theirs=trust_domain,
            ours=ca.trust_domain,
        )
        raise Conflict(TRUST_DOMAIN_MISMATCH, extra={"trust_domain": ca.trust_domain})
    now = deps.utc_now()
    try:
        cert = await ca.sign_server_csr(csr, fqdn, now)
    except IssuanceError:
        raise InvalidRequest("bad_csr") from None
    try:
        server = await deps.store.register_server(
            fqdn,
            advertise_addr,
            capacity,
            now,
            cert_serial=names.format_serial(cert.serial_number),
            cert_not_after=cert.not_valid_after_utc,
            http_address=http_addr,
            identity_key=identity_key,
            replacing=replacing,
        )
    except ServerKeyConflict as e:
        _log.warn(
            "server_refused {fqdn}: registered under identity key {registered},"
            " asked for by {identity_key} (the signed leaf {serial} is discarded)",
            fqdn=fqdn,
            registered=e.server.identity_key,
            identity_key=identity_key,
            serial=names.format_serial(cert.serial_number),
        )
        raise Conflict(
            FQDN_REGISTERED,
            extra={
                "server_id": e.server.server_id,
                "identity_key": e.server.identity_key,
                "last_seen_at": format_timestamp(e.server.last_seen_at),
            },
        ) from None

    _log_registration(server, http_addr, replacing)
    deps.pushes.server_registered(fqdn)
    return {
        "cert_pem": cert_to_pem(cert).decode("ascii"),
        "root_ca_pem": cert_to_pem(ca.root).decode("ascii"),
        "not_after": format_timestamp(cert.not_valid_after_utc),
        "server_id": server.server_id,
    }


def _log_registration(server: Server, http_addr: str, replacing: str | None) -> None:
    _log.info(
        "server_registered {fqdn} id={server_id} advertise={advertise_addr}"
        " http={http_addr} capacity={capacity} identity_key={identity_key}"
        " replacing={replacing}",
        fqdn=server.fqdn,
        server_id=server.server_id,
        advertise_addr=server.address,
        http_addr=http_addr,
        capacity=server.capacity,
        identity_key=server.identity_key,
        replacing=replacing,
    )


def _text(body: dict[str, JsonValue], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"bad_{name}")
    return value


def _identity_key(body: dict[str, JsonValue], name: str) -> str:
    try:
        return server_identity.check_key_text(body.get(name))
    except InvalidName:
        raise InvalidRequest(f"bad_{name}") from None


def _address(body: dict[str, JsonValue], name: str) -> str:
    try:
        return parse_host_port(_text(body, name))
    except ValueError:
        raise InvalidRequest(f"bad_{name}") from None
