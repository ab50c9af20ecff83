"""
The control plane's agent CA: the org root and the tenant intermediates,
kept encrypted at rest, and every certificate the control plane signs.

Two backends keep the keys (spec "Mounting rules" 4):

  - filesystem (C{SVC_SECRETS_DIR}): L{svc.pki.filesystem.FilesystemCA}'s
    layout, keys encrypted with C{SVC_CA_KEK} (plain text only in
    C{SVC_DEV_MODE} without a KEK); blocking file I/O runs on a worker;
  - in-database (C{SVC_SECRETS_BACKEND=postgres}): certificates and
    KEK-encrypted keys in the store's C{ca_material} table; a KEK is always
    required.

The org root's key is decrypted once, when the CA is opened at boot; a
tenant intermediate's key when the intermediate is first needed (created at
a tenant's first enrollment, subject to C{SVC_TENANT_ALLOWLIST}, which the
caller checks), then kept in memory. No key is ever written in plain text
when a KEK is configured.

Every signing event is audited twice (spec "Enrollment security rules" 3):
a row in the store's C{issued_certificates} (L{IssuedCertificate}) and a log
line C{ca_signed} with fields C{kind}, C{serial}, C{tenant}, C{agent},
C{not_after}. A certificate whose record could not be written is never
handed out.

L{open_agent_ca} opens the configured CA (L{None} when none is configured or
the org root does not exist yet); L{AgentCAProvider} keeps trying to open it
later, so C{svc ca init} after start needs no restart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

import attrs
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.config import ConfigError
from svc.control.ca_keys import (
    DatabaseTenantKeys,
    FilesystemTenantKeys,
    IntermediateOutcome,
    TenantKeys,
    init_database_root,
)
from svc.control.settings import ControlSettings, SecretsBackend
from svc.control.store.interface import ControlStore
from svc.control.store.values import CertificateKind, IssuedCertificate
from svc.pki import issuance, names
from svc.pki.errors import KeyEncryptionError
from svc.pki.filesystem import FilesystemCA
from svc.pki.issuance import CertifiedKey
from svc.pki.pem import certs_to_pem
from svc.worker import IWorker

_log = Logger()

__all__ = [
    "AgentCA",
    "AgentCAProvider",
    "AuditedAgentCA",
    "MintedLeaf",
    "audit_signing",
    "certificate_fingerprint",
    "filesystem_ca",
    "init_org_root",
    "open_agent_ca",
]


def certificate_fingerprint(cert: x509.Certificate) -> str:
    """
    A certificate's fingerprint as svc writes it everywhere (the
    C{agent_fingerprint} body field, C{issued_certificates.fingerprint}):
    the SHA-256 of its DER encoding, 64 lowercase hex digits.
    """
    return hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest()


def _serial(cert: x509.Certificate) -> str:
    return names.format_serial(cert.serial_number)


def _common_name(cert: x509.Certificate) -> str:
    values = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    value = values[0].value if values else ""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


@attrs.frozen
class MintedLeaf:
    """
    An agent leaf minted for an enrollment or a renewal: the leaf PEM, its
    freshly generated (unencrypted, never stored) key, C{ca_chain_pem}
    (tenant intermediate followed by org root), the canonical serial, the
    expiry and the fingerprint (L{certificate_fingerprint}).
    """

    cert_pem: bytes
    key_pem: bytes = attrs.field(repr=False)
    ca_chain_pem: bytes
    serial: str
    not_after: datetime
    fingerprint: str


class AgentCA(Protocol):
    """
    The signing operations of the control plane. Every operation records and
    logs what it signs before its L{Deferred} fires.
    """

    @property
    def root(self) -> x509.Certificate:
        """The org root certificate: the only trust anchor."""

    @property
    def trust_domain(self) -> str:
        """The SPIFFE trust domain of the agent leaves."""

    def prepare_tenant(self, tenant_id: str, now: datetime) -> Deferred[None]:
        """
        Make sure the tenant has a usable intermediate, creating (and
        auditing) one if needed.
        """

    def issue_agent_leaf(
        self, *, tenant_id: str, agent_id: str, user_id: str, now: datetime
    ) -> Deferred[MintedLeaf]:
        """Mint a 1-hour agent leaf with a fresh ed25519 key."""

    def sign_server_csr(
        self, csr: x509.CertificateSigningRequest, fqdn: str, now: datetime
    ) -> Deferred[x509.Certificate]:
        """
        Sign a data-plane server's CSR with the org root (server-leaf profile).

        @raise svc.pki.errors.IssuanceError: bad CSR signature or key type.
        @raise svc.pki.errors.InvalidName: C{fqdn} is not a DNS name.
        """

    def issue_control_cert(self, now: datetime) -> Deferred[CertifiedKey]:
        """
        The control plane's own client certificate (C{spiffe://<td>/control},
        30 days) with a fresh key, signed by the org root.
        """

    def issue_https_leaf(
        self, fqdn: str, now: datetime
    ) -> Deferred[tuple[x509.Certificate, ec.EllipticCurvePrivateKey]]:
        """
        A server leaf for the control plane's own HTTPS listener with a fresh
        ECDSA P-256 key (L{svc.pki.issuance.issue_https_server_leaf}), signed
        by the org root: the certificate and its key.
        """


class AuditedAgentCA:
    """
    L{AgentCA} over a backend's keys (L{TenantKeys}), auditing every
    signing event in C{store} and the log.
    """

    def __init__(self, keys: TenantKeys, trust_domain: str, store: ControlStore) -> None:
        self._keys = keys
        self._trust_domain = names.check_trust_domain(trust_domain)
        self._store = store

    @property
    def root(self) -> x509.Certificate:
        """The org root certificate."""
        return self._keys.root.cert

    @property
    def trust_domain(self) -> str:
        """The trust domain leaves are issued in."""
        return self._trust_domain

    def prepare_tenant(self, tenant_id: str, now: datetime) -> Deferred[None]:
        """See L{AgentCA.prepare_tenant}."""

        async def preparing() -> None:
            await self._intermediate(tenant_id, now)

        return Deferred.fromCoroutine(preparing())

    def issue_agent_leaf(
        self, *, tenant_id: str, agent_id: str, user_id: str, now: datetime
    ) -> Deferred[MintedLeaf]:
        """See L{AgentCA.issue_agent_leaf}."""
        return Deferred.fromCoroutine(self._issue_agent_leaf(tenant_id, agent_id, user_id, now))

    async def _issue_agent_leaf(
        self, tenant_id: str, agent_id: str, user_id: str, now: datetime
    ) -> MintedLeaf:
        intermediate = await self._intermediate(tenant_id, now)
        leaf = issuance.issue_agent_leaf(
            intermediate,
            tenant_id=tenant_id,
            agent_id=agent_id,
            user_id=user_id,
            trust_domain=self._trust_domain,
            now=now,
        )
        minted = MintedLeaf(
            cert_pem=leaf.cert_pem(),
            key_pem=leaf.key_pem(),
            ca_chain_pem=certs_to_pem([intermediate.cert, self.root]),
            serial=_serial(leaf.cert),
            not_after=leaf.cert.not_valid_after_utc,
            fingerprint=certificate_fingerprint(leaf.cert),
        )
        await self._audit(
            leaf.cert, CertificateKind.AGENT_LEAF, now, tenant_id=tenant_id, agent_id=agent_id
        )
        return minted

    def sign_server_csr(
        self, csr: x509.CertificateSigningRequest, fqdn: str, now: datetime
    ) -> Deferred[x509.Certificate]:
        """See L{AgentCA.sign_server_csr}."""

        async def signing() -> x509.Certificate:
            cert = issuance.sign_server_csr(self._keys.root, csr, fqdn, now)
            await self._audit(cert, CertificateKind.SERVER_LEAF, now)
            return cert

        return Deferred.fromCoroutine(signing())

    def issue_control_cert(self, now: datetime) -> Deferred[CertifiedKey]:
        """See L{AgentCA.issue_control_cert}."""

        async def issuing() -> CertifiedKey:
            pair = issuance.issue_control_cert(self._keys.root, self._trust_domain, now)
            await self._audit(pair.cert, CertificateKind.CONTROL, now)
            return pair

        return Deferred.fromCoroutine(issuing())

    def issue_https_leaf(
        self, fqdn: str, now: datetime
    ) -> Deferred[tuple[x509.Certificate, ec.EllipticCurvePrivateKey]]:
        """See L{AgentCA.issue_https_leaf}."""

        async def issuing() -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
            cert, key = issuance.issue_https_server_leaf(self._keys.root, fqdn, now)
            await self._audit(cert, CertificateKind.SERVER_LEAF, now)
            return cert, key

        return Deferred.fromCoroutine(issuing())

    async def _intermediate(self, tenant_id: str, now: datetime) -> CertifiedKey:
        outcome: IntermediateOutcome = await self._keys.intermediate(tenant_id, now)
        for cert in outcome.signed:
            await self._audit(cert, CertificateKind.TENANT_INTERMEDIATE, now, tenant_id=tenant_id)
        return outcome.current

    async def _audit(
        self,
        cert: x509.Certificate,
        kind: CertificateKind,
        now: datetime,
        *,
        tenant_id: str | None = None,
        agent_id: str | None = None,
    ) -> None:
        await audit_signing(self._store, cert, kind, now, tenant_id=tenant_id, agent_id=agent_id)


def audit_signing(
    store: ControlStore | None,
    cert: x509.Certificate,
    kind: CertificateKind,
    now: datetime,
    *,
    tenant_id: str | None = None,
    agent_id: str | None = None,
) -> Deferred[None]:
    """
    Log the C{ca_signed} line for C{cert} and record it in C{store} (when
    there is one: C{svc ca init} may run without a database).
    """
    record = IssuedCertificate(
        serial=_serial(cert),
        kind=kind,
        subject=_common_name(cert),
        not_after=cert.not_valid_after_utc,
        issued_at=now,
        tenant_id=tenant_id,
        agent_id=agent_id,
        fingerprint=certificate_fingerprint(cert),
    )
    _log.info(
        "ca_signed kind={kind} serial={serial} tenant={tenant} agent={agent} not_after={not_after}",
        ca_signed=True,
        kind=kind.value,
        serial=record.serial,
        tenant=tenant_id,
        agent=agent_id,
        not_after=record.not_after.isoformat(),
        subject=record.subject,
        fingerprint=record.fingerprint,
    )
    if store is None:
        return succeed(None)
    return store.record_certificate(record)


def _required_trust_domain(settings: ControlSettings) -> str:
    if settings.trust_domain is None:
        raise ConfigError("SVC_TRUST_DOMAIN", "is required when an agent CA is configured")
    return settings.trust_domain


def _database_kek(settings: ControlSettings) -> bytes:
    if settings.ca_kek is None:
        raise ConfigError(
            "SVC_CA_KEK", "is required with SVC_SECRETS_BACKEND=postgres (even in dev mode)"
        )
    return settings.ca_kek


def filesystem_ca(settings: ControlSettings) -> FilesystemCA:
    """
    The L{FilesystemCA} at C{SVC_SECRETS_DIR} with the configured KEK.

    @raise ConfigError: no secrets directory or trust domain.
    """
    if settings.secrets_dir is None:
        raise ConfigError("SVC_SECRETS_DIR", "is required for the filesystem agent CA")
    if settings.ca_kek is None and not settings.dev_mode:
        raise ConfigError("SVC_CA_KEK", "is required when an agent CA is configured")
    return FilesystemCA(settings.secrets_dir, _required_trust_domain(settings), settings.ca_kek)


def open_agent_ca(
    settings: ControlSettings, store: ControlStore, worker: IWorker
) -> Deferred[AgentCA | None]:
    """
    Open the agent CA C{settings} configure, decrypting the org root's key.

    @param worker: runs blocking file I/O and key decryption.
    @return: fires with the CA; with L{None} when no agent CA is configured
        or its org root does not exist yet (C{svc ca init} not run); fails
        with L{ConfigError} naming C{SVC_CA_KEK} when the KEK does not
        decrypt the root key (the process must refuse to start), or with
        L{svc.pki.errors.CAInconsistent} when the stored material is not an
        org root and its key.
    """
    if not settings.agent_ca_configured:
        return succeed(None)
    return Deferred.fromCoroutine(_open_agent_ca(settings, store, worker))


async def _open_agent_ca(
    settings: ControlSettings, store: ControlStore, worker: IWorker
) -> AgentCA | None:
    trust_domain = _required_trust_domain(settings)
    keys: TenantKeys | None
    try:
        if settings.secrets_backend is SecretsBackend.POSTGRES:
            keys = await DatabaseTenantKeys.open(
                store, _database_kek(settings), trust_domain, worker
            )
        else:
            if settings.ca_kek is None:
                _log.warn("agent CA keys are NOT encrypted at rest (SVC_DEV_MODE without a KEK)")
            keys = await FilesystemTenantKeys.open(filesystem_ca(settings), worker)
    except KeyEncryptionError as e:
        raise ConfigError(
            "SVC_CA_KEK", f"cannot read the org root key: {e} (wrong key-encryption key?)"
        ) from None
    if keys is None:
        _log.warn("agent CA configured but no org root yet: run 'svc ca init'")
        return None
    return AuditedAgentCA(keys, trust_domain, store)


class AgentCAProvider:
    """
    The agent CA as the routes get it: the one opened at boot, or, while
    there is none yet, a fresh attempt to open it on each L{get} (one at a
    time), so an operator's C{svc ca init} takes effect without a restart.
    """

    def __init__(
        self,
        opener: Callable[[], Deferred[AgentCA | None]],
        current: AgentCA | None = None,
    ) -> None:
        self._opener = opener
        self._current = current
        self._waiters: list[Deferred[AgentCA | None]] | None = None

    @classmethod
    def fixed(cls, ca: AgentCA | None) -> AgentCAProvider:
        """A provider that always answers C{ca} (for tests and no-CA setups)."""
        return cls(lambda: succeed(ca), ca)

    @classmethod
    def opened(
        cls, settings: ControlSettings, store: ControlStore, worker: IWorker
    ) -> Deferred[AgentCAProvider]:
        """
        Open the CA now (failing as L{open_agent_ca} does, so a wrong KEK
        refuses to start) and keep retrying later while there is none.
        """

        def opener() -> Deferred[AgentCA | None]:
            return open_agent_ca(settings, store, worker)

        return opener().addCallback(lambda ca: cls(opener, ca))

    @property
    def current(self) -> AgentCA | None:
        """The CA if it is open, without trying to open it (for readiness)."""
        return self._current

    def get(self) -> Deferred[AgentCA | None]:
        """The CA, opening it first if it is not open yet."""
        if self._current is not None:
            return succeed(self._current)
        waiter: Deferred[AgentCA | None] = Deferred()
        if self._waiters is None:
            self._waiters = [waiter]
            self._opener().addBoth(self._opened)
        else:
            self._waiters.append(waiter)
        return waiter

    def _opened(self, result: AgentCA | Failure | None) -> None:
        waiters, self._waiters = self._waiters or [], None
        if not isinstance(result, Failure):
            self._current = result
        for waiter in waiters:
            if isinstance(result, Failure):
                waiter.errback(result)
            else:
                waiter.callback(result)


def init_org_root(
    settings: ControlSettings, store: ControlStore | None, now: datetime, worker: IWorker
) -> Deferred[CertifiedKey]:
    """
    Create the org root for C{SVC_ORG_NAME} (C{svc ca init}) in the
    configured backend, its key encrypted with the KEK, and audit it.

    @raise svc.pki.errors.CAAlreadyInitialised: there is one already; it is
        never replaced.
    @raise ConfigError: no agent CA is configured, or the database backend
        has no store or no KEK.
    """
    return Deferred.fromCoroutine(_init_org_root(settings, store, now, worker))


async def _init_org_root(
    settings: ControlSettings, store: ControlStore | None, now: datetime, worker: IWorker
) -> CertifiedKey:
    if not settings.agent_ca_configured:
        raise ConfigError(
            "SVC_SECRETS_DIR", "no agent CA is configured (set it, or SVC_SECRETS_BACKEND=postgres)"
        )
    if settings.secrets_backend is SecretsBackend.POSTGRES:
        if store is None:
            raise ConfigError("DATABASE_URL", "is required with SVC_SECRETS_BACKEND=postgres")
        root = await init_database_root(
            store, settings.org_name, _database_kek(settings), now, worker
        )
    else:
        ca = filesystem_ca(settings)
        root = await worker.submit(lambda: ca.init_root(settings.org_name, now))
    await audit_signing(store, root.cert, CertificateKind.ORG_ROOT, now)
    return root
