"""
The filesystem certificate authority: the spec's CA secrets layout.

::

    $SVC_SECRETS_DIR/ca/root/cert.pem          org root certificate   (0644)
    $SVC_SECRETS_DIR/ca/root/key.pem           org root key           (0600)
    $SVC_SECRETS_DIR/ca/tenant/<tenant>/cert.pem
    $SVC_SECRETS_DIR/ca/tenant/<tenant>/key.pem                       (0600)

Directories this class creates are mode 0700. Every file is written
atomically (temporary file in the same directory, write, fsync, rename, fsync
of the directory); the key is written before the certificate, so a
certificate on disk always has its key beside it. With a key-encryption key
(C{kek}) CA keys are stored encrypted (see L{svc.pki.pem}) and decrypted into
memory once, on first use.

This is blocking file I/O: call it from a worker thread, never the reactor.
The certificate logic itself is in L{svc.pki.issuance}.
"""

from __future__ import annotations

import stat
import threading
from datetime import datetime, timedelta
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from twisted.logger import Logger

from svc.durable import make_directories, write_file_atomically
from svc.pki import issuance, names
from svc.pki.errors import (
    CAAlreadyInitialised,
    CAInconsistent,
    CANotInitialised,
    KeyEncryptionError,
    PKIError,
)
from svc.pki.issuance import CertifiedKey
from svc.pki.pem import cert_from_pem, cert_to_pem, certs_to_pem, key_from_pem

KEY_MODE = 0o600
CERT_MODE = 0o644
DIR_MODE = 0o700

_log = Logger()


@attrs.frozen
class IssuedAgentLeaf:
    """
    What enrollment hands an agent: its leaf, the leaf's unencrypted key, and
    C{ca_chain_pem} (tenant intermediate followed by org root). C{serial} is
    the canonical serial form; C{not_after} is the leaf's expiry.
    """

    cert_pem: bytes
    key_pem: bytes = attrs.field(repr=False)
    ca_chain_pem: bytes
    serial: str
    not_after: datetime


@attrs.frozen
class IntermediateRotation:
    """
    The outcome of rotating a tenant intermediate: the new one, and the
    previous certificate (if there was one) whose serial must be deny-listed.
    """

    current: CertifiedKey
    retired: x509.Certificate | None

    @property
    def retired_serial(self) -> str | None:
        """
        The retired intermediate's serial in canonical form, or L{None}.
        """
        return None if self.retired is None else names.format_serial(self.retired.serial_number)


class FilesystemCA:
    """
    The org root and the tenant intermediates kept under C{secrets_dir}.

    Thread-safe: issuing the same tenant's intermediate from two threads
    yields one intermediate.
    """

    def __init__(self, secrets_dir: Path, trust_domain: str, kek: bytes | None = None) -> None:
        self._secrets_dir = Path(secrets_dir)
        self._trust_domain = names.check_trust_domain(trust_domain)
        self._kek = kek
        self._lock = threading.RLock()
        self._root: CertifiedKey | None = None
        self._tenants: dict[str, CertifiedKey] = {}

    @property
    def ca_dir(self) -> Path:
        """
        C{<secrets_dir>/ca}.
        """
        return self._secrets_dir / "ca"

    @property
    def trust_domain(self) -> str:
        """
        The trust domain the tenant intermediates are constrained to.
        """
        return self._trust_domain

    def root_paths(self) -> tuple[Path, Path]:
        """
        C{(cert.pem, key.pem)} of the org root.
        """
        directory = self.ca_dir / "root"
        return directory / "cert.pem", directory / "key.pem"

    def tenant_paths(self, tenant_id: str) -> tuple[Path, Path]:
        """
        C{(cert.pem, key.pem)} of a tenant's intermediate.
        """
        directory = self.ca_dir / "tenant" / names.check_id(tenant_id, "tenant id")
        return directory / "cert.pem", directory / "key.pem"

    def init_root(self, org: str, now: datetime) -> CertifiedKey:
        """
        Create and store a new org root for C{org}.

        @raise CAAlreadyInitialised: a root certificate is already stored.
        """
        with self._lock:
            cert_path, key_path = self.root_paths()
            if cert_path.exists():
                raise CAAlreadyInitialised(f"an org root already exists at {cert_path}")
            root = issuance.issue_org_root(org, now)
            self._store(root, cert_path, key_path)
            self._root = root
            self._tenants.clear()
            return root

    def load_root(self) -> CertifiedKey:
        """
        The org root, read (and decrypted) on first use and kept in memory.

        @raise CANotInitialised: there is no stored root.
        @raise CAInconsistent: the stored files are not an org root and its key.
        @raise KeyEncryptionError: the key cannot be read with this KEK.
        """
        with self._lock:
            if self._root is None:
                cert_path, key_path = self.root_paths()
                if not cert_path.exists() or not key_path.exists():
                    raise CANotInitialised(f"no org root at {cert_path}")
                root = self._load(cert_path, key_path)
                if not _is_org_root(root.cert):
                    raise CAInconsistent(f"{cert_path} is not an org root certificate")
                self._root = root
            return self._root

    def tenant_intermediate(self, tenant_id: str, now: datetime) -> CertifiedKey:
        """
        The tenant's intermediate: the stored one while it is usable at
        C{now}, otherwise a newly issued and stored one.

        Usable means issued by the current org root for this tenant and trust
        domain, and valid for at least one more agent-leaf lifetime, so a leaf
        never outlives its intermediate.
        """
        names.check_id(tenant_id, "tenant id")
        now = names.check_utc(now, "now")
        with self._lock:
            root = self.load_root()
            current = self._tenants.get(tenant_id)
            if current is None:
                current = self._load_tenant(tenant_id)
            if current is None or not self._usable(current, tenant_id, root, now):
                current = self._issue_tenant(root, tenant_id, now)
            self._tenants[tenant_id] = current
            return current

    def rotate_tenant_intermediate(self, tenant_id: str, now: datetime) -> IntermediateRotation:
        """
        Issue and store a new intermediate for the tenant.

        Leaves under the previous intermediate still chain to the root (their
        holders present that intermediate themselves), so the caller must put
        the returned C{retired} certificate's serial, with its C{NotAfter}, on
        the revocation list: admission refuses any leaf whose intermediate is
        deny-listed, which is how rotation invalidates the tenant's leaves.
        """
        names.check_id(tenant_id, "tenant id")
        now = names.check_utc(now, "now")
        with self._lock:
            root = self.load_root()
            retired = self._tenants.get(tenant_id) or self._load_tenant(tenant_id)
            current = self._issue_tenant(root, tenant_id, now)
            return IntermediateRotation(current, retired.cert if retired else None)

    def issue_agent_leaf(
        self,
        tenant_id: str,
        agent_id: str,
        user_id: str,
        now: datetime,
        ttl: timedelta = issuance.AGENT_LEAF_TTL,
    ) -> IssuedAgentLeaf:
        """
        Mint an agent leaf under the tenant's intermediate (created if
        needed), with a fresh key, for an enrollment response.
        """
        intermediate = self.tenant_intermediate(tenant_id, now)
        root = self.load_root()
        leaf = issuance.issue_agent_leaf(
            intermediate,
            tenant_id=tenant_id,
            agent_id=agent_id,
            user_id=user_id,
            trust_domain=self._trust_domain,
            now=now,
            ttl=ttl,
        )
        return IssuedAgentLeaf(
            cert_pem=leaf.cert_pem(),
            key_pem=leaf.key_pem(),
            ca_chain_pem=certs_to_pem([intermediate.cert, root.cert]),
            serial=names.format_serial(leaf.cert.serial_number),
            not_after=leaf.cert.not_valid_after_utc,
        )

    def issue_server_leaf(
        self, fqdn: str, now: datetime, ttl: timedelta = issuance.SERVER_LEAF_TTL
    ) -> CertifiedKey:
        """
        A data-plane server leaf for C{fqdn}, signed by the org root.
        """
        return issuance.issue_server_leaf(self.load_root(), fqdn, now, ttl=ttl)

    def sign_server_csr(
        self,
        csr: x509.CertificateSigningRequest,
        fqdn: str,
        now: datetime,
        ttl: timedelta = issuance.SERVER_LEAF_TTL,
    ) -> x509.Certificate:
        """
        Sign a data-plane server's CSR with the server-leaf profile.
        """
        return issuance.sign_server_csr(self.load_root(), csr, fqdn, now, ttl)

    def issue_control_cert(
        self, now: datetime, ttl: timedelta = issuance.CONTROL_TTL
    ) -> CertifiedKey:
        """
        The control plane's client certificate, signed by the org root.
        """
        return issuance.issue_control_cert(self.load_root(), self._trust_domain, now, ttl=ttl)

    def _usable(
        self, intermediate: CertifiedKey, tenant_id: str, root: CertifiedKey, now: datetime
    ) -> bool:
        cert = intermediate.cert
        try:
            cert.verify_directly_issued_by(root.cert)
        except (ValueError, TypeError, InvalidSignature):
            return False
        return (
            issuance.tenant_of_intermediate(cert) == tenant_id
            and issuance.trust_domain_of_intermediate(cert) == self._trust_domain
            and cert.not_valid_before_utc <= now
            and now + issuance.AGENT_LEAF_TTL <= cert.not_valid_after_utc
        )

    def _load_tenant(self, tenant_id: str) -> CertifiedKey | None:
        cert_path, key_path = self.tenant_paths(tenant_id)
        if not cert_path.exists() or not key_path.exists():
            return None
        try:
            return self._load(cert_path, key_path)
        except CAInconsistent:
            _log.warn(
                "replacing inconsistent intermediate for tenant {tenant_id}", tenant_id=tenant_id
            )
            return None

    def _issue_tenant(self, root: CertifiedKey, tenant_id: str, now: datetime) -> CertifiedKey:
        intermediate = issuance.issue_tenant_intermediate(root, tenant_id, self._trust_domain, now)
        cert_path, key_path = self.tenant_paths(tenant_id)
        self._store(intermediate, cert_path, key_path)
        self._tenants[tenant_id] = intermediate
        _log.info(
            "issued intermediate for tenant {tenant_id} serial {serial}",
            tenant_id=tenant_id,
            serial=names.format_serial(intermediate.cert.serial_number),
        )
        return intermediate

    def _store(self, pair: CertifiedKey, cert_path: Path, key_path: Path) -> None:
        make_directories(cert_path.parent, DIR_MODE)
        write_file_atomically(key_path, pair.key_pem(self._kek), KEY_MODE)
        write_file_atomically(cert_path, cert_to_pem(pair.cert), CERT_MODE)

    def _load(self, cert_path: Path, key_path: Path) -> CertifiedKey:
        mode = stat.S_IMODE(key_path.stat().st_mode)
        if mode & 0o077:
            _log.warn("CA key {path} has loose mode {mode:o}", path=str(key_path), mode=mode)
        try:
            cert = cert_from_pem(cert_path.read_bytes())
        except PKIError as e:
            raise CAInconsistent(f"{cert_path}: {e}") from None
        try:
            key = key_from_pem(key_path.read_bytes(), self._kek)
        except KeyEncryptionError:
            raise
        except PKIError as e:
            raise CAInconsistent(f"{key_path}: {e}") from None
        try:
            return CertifiedKey(cert, key)
        except PKIError:
            raise CAInconsistent(f"{key_path} does not belong to {cert_path}") from None


def _is_org_root(cert: x509.Certificate) -> bool:
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        issuance.org_of_root(cert)
    except (x509.ExtensionNotFound, PKIError):
        return False
    return cert.issuer == cert.subject and constraints.ca and constraints.path_length == 1
