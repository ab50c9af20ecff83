"""
Where the agent CA's keys live: the two backends behind
L{svc.control.ca.AuditedAgentCA}.

Each backend holds the org root (decrypted when it is opened) and hands out
a tenant's intermediate, creating one when the tenant has none that is
usable (see L{intermediate_usable}). It reports every certificate it signed
while doing so (L{IntermediateOutcome.signed}) so the CA can audit it; it
signs nothing else.

  - L{FilesystemTenantKeys}: L{svc.pki.filesystem.FilesystemCA} under
    C{SVC_SECRETS_DIR}; its blocking file I/O runs on a worker.
  - L{DatabaseTenantKeys}: the store's C{ca_material} rows, keys always
    encrypted with the KEK (C{SVC_SECRETS_BACKEND=postgres}). Several
    control-plane processes may share the database: when two create a
    tenant's intermediate at once, the first stored wins and the other
    adopts it (its own was signed, audited, and thrown away).
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Protocol

import attrs
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure

from svc.control.store.interface import ControlStore
from svc.control.store.values import CaKind, CaMaterial
from svc.pki import issuance, names
from svc.pki.errors import (
    CAAlreadyInitialised,
    CAInconsistent,
    CANotInitialised,
    KeyEncryptionError,
    PKIError,
)
from svc.pki.filesystem import FilesystemCA
from svc.pki.issuance import CertifiedKey
from svc.pki.pem import cert_from_pem, key_from_pem
from svc.worker import IWorker


@attrs.frozen
class IntermediateOutcome:
    """
    A tenant's current intermediate, and every certificate signed to get it
    (usually none; one when it was created).
    """

    current: CertifiedKey
    signed: tuple[x509.Certificate, ...] = ()


class TenantKeys(Protocol):
    """The org root and tenant intermediates of one backend."""

    @property
    def root(self) -> CertifiedKey:
        """The org root and its (decrypted) key."""

    def intermediate(self, tenant_id: str, now: datetime) -> Deferred[IntermediateOutcome]:
        """The tenant's usable intermediate at C{now}, created if needed."""


def intermediate_usable(
    cert: x509.Certificate, tenant_id: str, root: x509.Certificate, trust_domain: str, now: datetime
) -> bool:
    """
    Whether C{cert} may sign C{tenant_id}'s leaves at C{now}: issued by
    C{root} for this tenant and trust domain, already valid, and valid for at
    least one more agent-leaf lifetime (so no leaf outlives it). The same
    rule as L{FilesystemCA}'s.
    """
    try:
        cert.verify_directly_issued_by(root)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return (
        issuance.tenant_of_intermediate(cert) == tenant_id
        and issuance.trust_domain_of_intermediate(cert) == trust_domain
        and cert.not_valid_before_utc <= now
        and now + issuance.AGENT_LEAF_TTL <= cert.not_valid_after_utc
    )


def _is_org_root(cert: x509.Certificate) -> bool:
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        issuance.org_of_root(cert)
    except (x509.ExtensionNotFound, PKIError):
        return False
    return cert.issuer == cert.subject and constraints.ca and constraints.path_length == 1


class FilesystemTenantKeys:
    """
    The filesystem backend: a L{FilesystemCA}, called on C{worker} only.
    """

    def __init__(self, ca: FilesystemCA, root: CertifiedKey, worker: IWorker) -> None:
        self._ca = ca
        self._root = root
        self._worker = worker
        self._lock = threading.Lock()
        self._known: dict[str, str | None] = {}

    @classmethod
    def open(cls, ca: FilesystemCA, worker: IWorker) -> Deferred[FilesystemTenantKeys | None]:
        """
        Load and decrypt the org root on C{worker}: L{None} when there is
        none yet; fails with L{KeyEncryptionError} (wrong KEK) or
        L{CAInconsistent}.
        """

        def load() -> CertifiedKey | None:
            try:
                return ca.load_root()
            except CANotInitialised:
                return None

        return worker.submit(load).addCallback(
            lambda root: None if root is None else cls(ca, root, worker)
        )

    @property
    def root(self) -> CertifiedKey:
        """The org root."""
        return self._root

    def intermediate(self, tenant_id: str, now: datetime) -> Deferred[IntermediateOutcome]:
        """See L{TenantKeys.intermediate}."""
        return self._worker.submit(lambda: self._intermediate(tenant_id, now))

    def _intermediate(self, tenant_id: str, now: datetime) -> IntermediateOutcome:
        with self._lock:
            if tenant_id in self._known:
                before = self._known[tenant_id]
            else:
                before = self._serial_on_disk(tenant_id)
            current = self._ca.tenant_intermediate(tenant_id, now)
            serial = names.format_serial(current.cert.serial_number)
            self._known[tenant_id] = serial
            signed = (current.cert,) if serial != before else ()
            return IntermediateOutcome(current, signed)

    def _serial_on_disk(self, tenant_id: str) -> str | None:
        cert_path, _key_path = self._ca.tenant_paths(tenant_id)
        try:
            return names.format_serial(cert_from_pem(cert_path.read_bytes()).serial_number)
        except (OSError, PKIError):
            return None


class DatabaseTenantKeys:
    """
    The in-database backend: CA material in the store, keys encrypted with
    C{kek}. Decryption and encryption run on C{worker}.
    """

    def __init__(
        self,
        root: CertifiedKey,
        store: ControlStore,
        kek: bytes,
        trust_domain: str,
        worker: IWorker,
    ) -> None:
        self._root = root
        self._store = store
        self._kek = kek
        self._trust_domain = trust_domain
        self._worker = worker
        self._tenants: dict[str, CertifiedKey] = {}
        self._waiters: dict[str, list[Deferred[IntermediateOutcome]]] = {}

    @classmethod
    def open(
        cls, store: ControlStore, kek: bytes, trust_domain: str, worker: IWorker
    ) -> Deferred[DatabaseTenantKeys | None]:
        """
        Load and decrypt the stored org root: L{None} when there is none
        yet; fails with L{KeyEncryptionError} (wrong KEK) or
        L{CAInconsistent}.
        """

        async def opening() -> DatabaseTenantKeys | None:
            material = await store.get_ca_material(CaKind.ROOT)
            if material is None:
                return None
            root = await worker.submit(lambda: _decrypt(material, kek))
            if not _is_org_root(root.cert):
                raise CAInconsistent("the stored root CA material is not an org root")
            return cls(root, store, kek, trust_domain, worker)

        return Deferred.fromCoroutine(opening())

    @property
    def root(self) -> CertifiedKey:
        """The org root."""
        return self._root

    def intermediate(self, tenant_id: str, now: datetime) -> Deferred[IntermediateOutcome]:
        """
        See L{TenantKeys.intermediate}. Concurrent calls for one tenant share
        one load (the later callers see nothing signed).
        """
        cached = self._tenants.get(tenant_id)
        if cached is not None and intermediate_usable(
            cached.cert, tenant_id, self._root.cert, self._trust_domain, now
        ):
            return succeed(IntermediateOutcome(cached))
        waiter: Deferred[IntermediateOutcome] = Deferred()
        waiting = self._waiters.get(tenant_id)
        if waiting is not None:
            waiting.append(waiter)
            return waiter
        self._waiters[tenant_id] = []
        loading = Deferred.fromCoroutine(self._load_or_issue(tenant_id, now))

        def done(result: IntermediateOutcome | Failure) -> None:
            others = self._waiters.pop(tenant_id, [])
            if isinstance(result, Failure):
                waiter.errback(result)
                for other in others:
                    other.errback(result)
                return
            self._tenants[tenant_id] = result.current
            waiter.callback(result)
            for other in others:
                other.callback(IntermediateOutcome(result.current))

        loading.addBoth(done)
        return waiter

    async def _load_or_issue(self, tenant_id: str, now: datetime) -> IntermediateOutcome:
        stored = await self._store.get_ca_material(CaKind.TENANT, tenant_id)
        if stored is not None:
            found = await self._usable_material(stored, tenant_id, now)
            if found is not None:
                return IntermediateOutcome(found)
        fresh = issuance.issue_tenant_intermediate(self._root, tenant_id, self._trust_domain, now)
        encrypted = await self._worker.submit(lambda: fresh.key_pem(self._kek))
        material = CaMaterial(
            kind=CaKind.TENANT,
            tenant_id=tenant_id,
            cert_pem=fresh.cert_pem(),
            encrypted_key_pem=encrypted,
            created_at=now,
        )
        kept = await self._store.put_ca_material(material, replace=stored is not None)
        if kept.cert_pem != material.cert_pem:
            winner = await self._usable_material(kept, tenant_id, now)
            if winner is not None:
                return IntermediateOutcome(winner, (fresh.cert,))
        return IntermediateOutcome(fresh, (fresh.cert,))

    async def _usable_material(
        self, material: CaMaterial, tenant_id: str, now: datetime
    ) -> CertifiedKey | None:
        kek = self._kek
        try:
            pair = await self._worker.submit(lambda: _decrypt(material, kek))
        except CAInconsistent:
            return None
        if not intermediate_usable(pair.cert, tenant_id, self._root.cert, self._trust_domain, now):
            return None
        return pair


def _decrypt(material: CaMaterial, kek: bytes) -> CertifiedKey:
    """
    The certificate and decrypted key of C{material}.

    @raise KeyEncryptionError: C{kek} does not decrypt the key.
    @raise CAInconsistent: malformed, or the key does not match.
    """
    try:
        cert = cert_from_pem(material.cert_pem)
        key = key_from_pem(material.encrypted_key_pem, kek)
        return CertifiedKey(cert, key)
    except KeyEncryptionError:
        raise
    except PKIError as e:
        raise CAInconsistent(f"stored {material.kind.value} CA material: {e}") from None


def init_database_root(
    store: ControlStore, org: str, kek: bytes, now: datetime, worker: IWorker
) -> Deferred[CertifiedKey]:
    """
    Create the org root in the store, its key encrypted with C{kek}.

    @raise CAAlreadyInitialised: a root is already stored (never replaced).
    """

    async def creating() -> CertifiedKey:
        if await store.get_ca_material(CaKind.ROOT) is not None:
            raise CAAlreadyInitialised("an org root already exists in the database")
        root = issuance.issue_org_root(org, now)
        encrypted = await worker.submit(lambda: root.key_pem(kek))
        material = CaMaterial(
            kind=CaKind.ROOT,
            tenant_id=None,
            cert_pem=root.cert_pem(),
            encrypted_key_pem=encrypted,
            created_at=now,
        )
        kept = await store.put_ca_material(material, replace=False)
        if kept.cert_pem != material.cert_pem:
            raise CAAlreadyInitialised("another process created the org root first")
        return root

    return Deferred.fromCoroutine(creating())
