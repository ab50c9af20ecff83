"""
Who a verified peer is, and whether it is admitted: pure functions of the
certificates, the trust domain and the deny-list.

These functions do B{not} verify certificate chains or validity periods as a
whole; they run after a chain has been verified to the org root (by the TLS
handshake, or by L{svc.pki.chain.verify_chain}) and apply the spec's
admission rules on top. They do check that the leaf was directly issued by
the intermediate they are given, so a caller cannot pair a leaf with the
wrong tenant's intermediate by mistake.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import attrs
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from svc.pki import names
from svc.pki.errors import AdmissionRefused, InvalidName, RefusalReason
from svc.pki.issuance import tenant_of_intermediate


def _utc(moment: datetime) -> datetime:
    return names.check_utc(moment, "not_after")


@attrs.frozen
class AgentIdentity:
    """
    An admitted agent, taken only from its verified leaf certificate.

    C{serial} is in the canonical form of L{names.format_serial} (lowercase
    hex, no leading zeros); C{subject} is the leaf subject as an RFC 4514
    string; C{user_id} is the leaf CN.
    """

    tenant_id: str = attrs.field(validator=lambda _i, _a, v: names.check_id(v, "tenant id"))
    agent_id: str = attrs.field(validator=lambda _i, _a, v: names.check_id(v, "agent id"))
    user_id: str = attrs.field(validator=lambda _i, _a, v: names.check_id(v, "user id"))
    serial: str = attrs.field(validator=lambda _i, _a, v: names.check_serial(v))
    subject: str
    not_after: datetime = attrs.field(converter=_utc)


@attrs.frozen
class ControlIdentity:
    """
    The control plane, identified by its C{spiffe://<td>/control}
    certificate. C{serial} uses the canonical serial form.
    """

    serial: str = attrs.field(validator=lambda _i, _a, v: names.check_serial(v))
    subject: str
    not_after: datetime = attrs.field(converter=_utc)


@attrs.frozen
class DeniedSerial:
    """
    One deny-list entry: a leaf serial (canonical form) and the leaf's
    C{NotAfter}, after which the entry is no longer needed.
    """

    serial: str = attrs.field(validator=lambda _i, _a, v: names.check_serial(v))
    not_after: datetime = attrs.field(converter=_utc)


def _entries(entries: Iterable[DeniedSerial]) -> frozenset[DeniedSerial]:
    return frozenset(entries)


@attrs.frozen
class DenyList:
    """
    The per-serial kill switch: an immutable set of L{DeniedSerial}.

    Entries age out once the certificate would have expired anyway; see
    L{active}.
    """

    entries: frozenset[DeniedSerial] = attrs.field(factory=frozenset, converter=_entries)
    _serials: frozenset[str] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_serials", frozenset(e.serial for e in self.entries))

    @classmethod
    def of(cls, entries: Iterable[tuple[str, datetime]]) -> DenyList:
        """
        A deny-list from C{(serial, not_after)} pairs.
        """
        return cls(frozenset(DeniedSerial(serial, not_after) for serial, not_after in entries))

    def __contains__(self, serial: object) -> bool:
        return serial in self._serials

    def __len__(self) -> int:
        return len(self.entries)

    def with_entry(self, serial: str, not_after: datetime) -> DenyList:
        """
        A deny-list that also holds C{serial}.
        """
        return DenyList(self.entries | {DeniedSerial(serial, not_after)})

    def merged(self, other: DenyList) -> DenyList:
        """
        The union of both lists (the spec's "merges into the deny-list"): a
        serial listed in either stays listed, with the later C{not_after}
        when the two disagree.
        """
        latest: dict[str, datetime] = {}
        for entry in (*self.entries, *other.entries):
            known = latest.get(entry.serial)
            if known is None or entry.not_after > known:
                latest[entry.serial] = entry.not_after
        return DenyList.of(latest.items())

    def active(self, now: datetime) -> DenyList:
        """
        The entries still needed at C{now}: those whose certificate has not
        yet expired (C{not_after > now}).
        """
        now = names.check_utc(now, "now")
        return DenyList(frozenset(e for e in self.entries if e.not_after > now))


def admit_agent(
    leaf: x509.Certificate,
    intermediate: x509.Certificate,
    trust_domain: str,
    deny_list: DenyList,
) -> AgentIdentity:
    """
    Apply the data-plane admission rules to a verified agent chain.

    C{leaf} and C{intermediate} must come from a chain that already verified
    to the org root. Admitted when: the leaf was issued by C{intermediate};
    it is an end-entity client certificate (not a CA, DigitalSignature,
    ClientAuth); its only SANs are exactly one C{spiffe://<td>/tenant/<id>}
    and exactly one C{spiffe://<td>/agent/<id>} in C{trust_domain}; its CN is
    a valid user id; the intermediate's OU and the leaf's OU are both
    C{tenant=<id>} for that tenant; and neither its serial nor the
    intermediate's is in C{deny_list} (a rotated-out intermediate is
    deny-listed, which is how rotation invalidates every leaf under it).

    @raise AdmissionRefused: with the first rule that failed.
    """
    _check_issued_by(leaf, intermediate)
    _check_client_cert(leaf)
    tenant_id, agent_id = _agent_sans(leaf, trust_domain)
    user_id = _common_name(leaf)
    if tenant_of_intermediate(intermediate) != tenant_id:
        raise AdmissionRefused(
            RefusalReason.TENANT_BINDING, "the intermediate belongs to another tenant"
        )
    if tenant_of_intermediate(leaf) != tenant_id:
        raise AdmissionRefused(RefusalReason.TENANT_BINDING, "the leaf OU names another tenant")
    serial = names.format_serial(leaf.serial_number)
    if serial in deny_list:
        raise AdmissionRefused(RefusalReason.DENIED_SERIAL, serial)
    intermediate_serial = names.format_serial(intermediate.serial_number)
    if intermediate_serial in deny_list:
        raise AdmissionRefused(
            RefusalReason.DENIED_SERIAL, f"intermediate {intermediate_serial} is retired"
        )
    return AgentIdentity(
        tenant_id=tenant_id,
        agent_id=agent_id,
        user_id=user_id,
        serial=serial,
        subject=leaf.subject.rfc4514_string(),
        not_after=leaf.not_valid_after_utc,
    )


def control_identity(
    cert: x509.Certificate, root: x509.Certificate, trust_domain: str
) -> ControlIdentity:
    """
    Check that C{cert} (from a chain already verified to C{root}) is the
    control-plane certificate: issued directly by C{root}, a ClientAuth end
    entity with CN C{svc-control} and exactly the URI SAN
    C{spiffe://<td>/control}.

    @raise AdmissionRefused: otherwise.
    """
    _check_issued_by(cert, root)
    _check_client_cert(cert)
    uris, others = _sans(cert)
    expected = names.control_spiffe_id(trust_domain)
    if others or uris != [expected]:
        wrong_domain = any(
            (parts := names.split_spiffe_id(uri)) is not None and parts[0] != trust_domain
            for uri in uris
        )
        if wrong_domain:
            raise AdmissionRefused(RefusalReason.WRONG_TRUST_DOMAIN)
        raise AdmissionRefused(RefusalReason.NO_CONTROL_SAN, ", ".join(uris))
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if [a.value for a in cns] != [names.CONTROL_CN]:
        raise AdmissionRefused(RefusalReason.MALFORMED_IDENTITY, "CN is not svc-control")
    return ControlIdentity(
        serial=names.format_serial(cert.serial_number),
        subject=cert.subject.rfc4514_string(),
        not_after=cert.not_valid_after_utc,
    )


def _check_issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> None:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature) as e:
        raise AdmissionRefused(RefusalReason.CHAIN_MISMATCH, str(e)) from None


def _check_client_cert(cert: x509.Certificate) -> None:
    refused = AdmissionRefused(RefusalReason.NOT_A_CLIENT_CERT)
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
        purposes = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        raise refused from None
    if constraints.ca or not usage.digital_signature:
        raise refused
    if ExtendedKeyUsageOID.CLIENT_AUTH not in purposes:
        raise refused


def _sans(cert: x509.Certificate) -> tuple[list[str], list[x509.GeneralName]]:
    """
    The URI SANs of C{cert} and every other SAN.
    """
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    uris = [n.value for n in sans if isinstance(n, x509.UniformResourceIdentifier)]
    others = [n for n in sans if not isinstance(n, x509.UniformResourceIdentifier)]
    return uris, others


def _agent_sans(leaf: x509.Certificate, trust_domain: str) -> tuple[str, str]:
    uris, others = _sans(leaf)
    tenants: list[str] = []
    agents: list[str] = []
    foreign = False
    unexpected = [str(o) for o in others]
    for uri in uris:
        parts = names.split_spiffe_id(uri)
        if parts is None:
            unexpected.append(uri)
            continue
        domain, path = parts
        if domain != trust_domain:
            foreign = True
            continue
        kind, _slash, value = path.partition("/")
        if kind == "tenant":
            tenants.append(value)
        elif kind == "agent":
            agents.append(value)
        else:
            unexpected.append(uri)
    if foreign:
        raise AdmissionRefused(RefusalReason.WRONG_TRUST_DOMAIN)
    if not tenants:
        raise AdmissionRefused(RefusalReason.NO_TENANT_SAN)
    if not agents:
        raise AdmissionRefused(RefusalReason.NO_AGENT_SAN)
    if len(tenants) > 1 or len(agents) > 1:
        raise AdmissionRefused(RefusalReason.MULTIPLE_TENANT_OR_AGENT_SANS)
    if unexpected:
        raise AdmissionRefused(RefusalReason.UNEXPECTED_SAN, ", ".join(unexpected))
    try:
        return names.check_id(tenants[0], "tenant id"), names.check_id(agents[0], "agent id")
    except InvalidName as e:
        raise AdmissionRefused(RefusalReason.MALFORMED_IDENTITY, str(e)) from None


def _common_name(leaf: x509.Certificate) -> str:
    cns = leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(cns) != 1 or not isinstance(cns[0].value, str):
        raise AdmissionRefused(RefusalReason.MALFORMED_IDENTITY, "not exactly one CN")
    try:
        return names.check_id(cns[0].value, "user id")
    except InvalidName as e:
        raise AdmissionRefused(RefusalReason.MALFORMED_IDENTITY, str(e)) from None
