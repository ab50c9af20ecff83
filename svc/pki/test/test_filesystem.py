"""
Tests for L{svc.pki.filesystem}: the CA secrets layout, file modes, atomic
writes and keys encrypted at rest.
"""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from cryptography.x509.oid import NameOID
from twisted.trial.unittest import SynchronousTestCase

from svc.pki.chain import verify_chain
from svc.pki.errors import (
    AdmissionRefused,
    CAAlreadyInitialised,
    CAInconsistent,
    CANotInitialised,
    KeyEncryptionError,
    RefusalReason,
)
from svc.pki.filesystem import FilesystemCA
from svc.pki.identity import DenyList, admit_agent
from svc.pki.pem import certs_from_pem, key_from_pem, key_to_pem

NOW = datetime(2031, 6, 1, tzinfo=UTC)
TD = "svc.example"
KEK = b"k" * 32


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


class FilesystemCATests(SynchronousTestCase):
    """
    L{FilesystemCA} over a temporary secrets directory.
    """

    def setUp(self) -> None:
        self.secrets = Path(self.mktemp())
        self.old_umask = os.umask(0o022)
        self.addCleanup(os.umask, self.old_umask)

    def ca(self, kek: bytes | None = KEK) -> FilesystemCA:
        return FilesystemCA(self.secrets, TD, kek)

    def test_layout_and_modes(self) -> None:
        """Root and tenant files sit at the spec's paths; keys 0600, directories 0700."""
        ca = self.ca()
        ca.init_root("Acme", NOW)
        ca.tenant_intermediate("t-1", NOW)
        expected = [
            self.secrets / "ca" / "root" / "cert.pem",
            self.secrets / "ca" / "root" / "key.pem",
            self.secrets / "ca" / "tenant" / "t-1" / "cert.pem",
            self.secrets / "ca" / "tenant" / "t-1" / "key.pem",
        ]
        files = sorted(p for p in self.secrets.rglob("*") if p.is_file())
        self.assertEqual(files, sorted(expected))
        for path in expected:
            self.assertEqual(mode(path), 0o600 if path.name == "key.pem" else 0o644)
        for directory in (p for p in self.secrets.rglob("*") if p.is_dir()):
            self.assertEqual(mode(directory), 0o700, directory)
        self.assertEqual(mode(self.secrets), 0o700)

    def test_modes_despite_permissive_umask(self) -> None:
        """Keys stay 0600 and directories 0700 even with umask 000."""
        os.umask(0)
        ca = self.ca()
        ca.init_root("Acme", NOW)
        self.assertEqual(mode(self.secrets / "ca" / "root" / "key.pem"), 0o600)
        self.assertEqual(mode(self.secrets / "ca" / "root"), 0o700)

    def test_keys_encrypted_at_rest(self) -> None:
        """With a KEK the stored keys are encrypted PKCS#8."""
        ca = self.ca()
        ca.init_root("Acme", NOW)
        ca.tenant_intermediate("t-1", NOW)
        for key in self.secrets.rglob("key.pem"):
            self.assertTrue(key.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY"))

    def test_reload_with_kek(self) -> None:
        """A new instance with the same KEK loads the same root and intermediate."""
        first = self.ca()
        root = first.init_root("Acme", NOW)
        intermediate = first.tenant_intermediate("t-1", NOW)
        second = self.ca()
        self.assertEqual(second.load_root().cert, root.cert)
        self.assertEqual(second.tenant_intermediate("t-1", NOW).cert, intermediate.cert)

    def test_missing_kek(self) -> None:
        """Loading an encrypted root without the KEK is a KeyEncryptionError."""
        self.ca().init_root("Acme", NOW)
        self.assertRaises(KeyEncryptionError, self.ca(None).load_root)

    def test_wrong_kek(self) -> None:
        """Loading with the wrong KEK is a KeyEncryptionError and never rotates tenants."""
        ca = self.ca()
        ca.init_root("Acme", NOW)
        ca.tenant_intermediate("t-1", NOW)
        tenant_cert = (self.secrets / "ca" / "tenant" / "t-1" / "cert.pem").read_bytes()
        self.assertRaises(KeyEncryptionError, self.ca(b"wrong").load_root)
        self.assertRaises(KeyEncryptionError, self.ca(b"wrong").tenant_intermediate, "t-1", NOW)
        self.assertEqual(
            (self.secrets / "ca" / "tenant" / "t-1" / "cert.pem").read_bytes(), tenant_cert
        )

    def test_tenant_key_under_other_kek(self) -> None:
        """A tenant key encrypted under another KEK is an error, not a silent rotation."""
        ca = self.ca()
        ca.init_root("Acme", NOW)
        old = ca.tenant_intermediate("t-1", NOW)
        key_path = self.secrets / "ca" / "tenant" / "t-1" / "key.pem"
        written = old.key_pem(b"another kek")
        key_path.write_bytes(written)
        self.assertRaises(KeyEncryptionError, self.ca().tenant_intermediate, "t-1", NOW)
        self.assertEqual(key_path.read_bytes(), written)

    def test_plain_keys_without_kek(self) -> None:
        """Without a KEK keys are stored in plain PKCS#8 and reload."""
        ca = self.ca(None)
        root = ca.init_root("Acme", NOW)
        data = (self.secrets / "ca" / "root" / "key.pem").read_bytes()
        self.assertTrue(data.startswith(b"-----BEGIN PRIVATE KEY"))
        self.assertEqual(self.ca(None).load_root().cert, root.cert)

    def test_not_initialised(self) -> None:
        """Loading before init is CANotInitialised, and so is issuing."""
        self.assertRaises(CANotInitialised, self.ca().load_root)
        self.assertRaises(CANotInitialised, self.ca().issue_agent_leaf, "t", "a", "u", NOW)

    def test_init_twice(self) -> None:
        """A second init_root is refused and leaves the first root in place."""
        ca = self.ca()
        root = ca.init_root("Acme", NOW)
        self.assertRaises(CAAlreadyInitialised, self.ca().init_root, "Other", NOW)
        self.assertEqual(self.ca().load_root().cert, root.cert)

    def test_mismatched_root_key(self) -> None:
        """A root key that does not match the root certificate is CAInconsistent."""
        self.ca().init_root("Acme", NOW)
        key_path = self.secrets / "ca" / "root" / "key.pem"
        key_path.write_bytes(key_to_pem(Ed25519PrivateKey.generate(), KEK))
        self.assertRaises(CAInconsistent, self.ca().load_root)

    def test_intermediate_reused(self) -> None:
        """The tenant intermediate is created once and reused while usable."""
        ca = self.ca()
        ca.init_root("Acme", NOW)
        first = ca.tenant_intermediate("t-1", NOW)
        later = ca.tenant_intermediate("t-1", NOW + timedelta(days=100))
        self.assertEqual(first.cert, later.cert)
        self.assertNotEqual(first.cert, ca.tenant_intermediate("t-2", NOW).cert)

    def test_intermediate_renewed_near_expiry(self) -> None:
        """Within one leaf lifetime of its expiry the intermediate is replaced on disk."""
        ca = self.ca()
        ca.init_root("Acme", NOW)
        first = ca.tenant_intermediate("t-1", NOW)
        late = first.cert.not_valid_after_utc - timedelta(minutes=30)
        renewed = ca.tenant_intermediate("t-1", late)
        self.assertNotEqual(first.cert, renewed.cert)
        stored = (self.secrets / "ca" / "tenant" / "t-1" / "cert.pem").read_bytes()
        self.assertEqual(certs_from_pem(stored), [renewed.cert])

    def test_intermediate_of_old_root_replaced(self) -> None:
        """An intermediate on disk not issued by the current root is replaced."""
        ca = self.ca()
        ca.init_root("Acme", NOW)
        ca.tenant_intermediate("t-1", NOW)
        for path in (self.secrets / "ca" / "root").iterdir():
            path.unlink()
        fresh = self.ca()
        root = fresh.init_root("Acme", NOW)
        fresh.tenant_intermediate("t-1", NOW).cert.verify_directly_issued_by(root.cert)

    def test_corrupt_intermediate_replaced(self) -> None:
        """A tenant key that does not match its certificate is replaced with a new pair."""
        ca = self.ca()
        ca.init_root("Acme", NOW)
        old = ca.tenant_intermediate("t-1", NOW)
        key_path = self.secrets / "ca" / "tenant" / "t-1" / "key.pem"
        key_path.write_bytes(key_to_pem(Ed25519PrivateKey.generate(), KEK))
        new = self.ca().tenant_intermediate("t-1", NOW)
        self.assertNotEqual(old.cert, new.cert)
        stored_key = key_from_pem(key_path.read_bytes(), KEK)
        self.assertEqual(
            stored_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw),
            new.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw),
        )

    def test_rotate(self) -> None:
        """Rotation stores a new intermediate and reports the retired one."""
        ca = self.ca()
        ca.init_root("Acme", NOW)
        old = ca.tenant_intermediate("t-1", NOW)
        rotation = ca.rotate_tenant_intermediate("t-1", NOW)
        self.assertNotEqual(old.cert, rotation.current.cert)
        self.assertEqual(rotation.retired, old.cert)
        self.assertEqual(rotation.retired_serial, format(old.cert.serial_number, "x"))
        self.assertEqual(self.ca().tenant_intermediate("t-1", NOW).cert, rotation.current.cert)

    def test_rotate_first(self) -> None:
        """Rotating a tenant without an intermediate retires nothing."""
        ca = self.ca()
        ca.init_root("Acme", NOW)
        rotation = ca.rotate_tenant_intermediate("t-9", NOW)
        self.assertIsNone(rotation.retired)
        self.assertIsNone(rotation.retired_serial)

    def test_rotation_invalidates_leaves(self) -> None:
        """Deny-listing the retired intermediate refuses a leaf issued before rotation."""
        ca = self.ca()
        ca.init_root("Acme", NOW)
        issued = ca.issue_agent_leaf("t-1", "agent-1", "alice", NOW)
        rotation = ca.rotate_tenant_intermediate("t-1", NOW)
        assert rotation.retired is not None and rotation.retired_serial is not None
        deny = DenyList.of([(rotation.retired_serial, rotation.retired.not_valid_after_utc)])
        intermediate, _root = certs_from_pem(issued.ca_chain_pem)
        leaf = x509.load_pem_x509_certificate(issued.cert_pem)
        error = self.assertRaises(AdmissionRefused, admit_agent, leaf, intermediate, TD, deny)
        self.assertEqual(error.reason, RefusalReason.DENIED_SERIAL)
        fresh = ca.issue_agent_leaf("t-1", "agent-1", "alice", NOW)
        new_intermediate, _root = certs_from_pem(fresh.ca_chain_pem)
        self.assertEqual(new_intermediate, rotation.current.cert)
        new_leaf = x509.load_pem_x509_certificate(fresh.cert_pem)
        self.assertEqual(admit_agent(new_leaf, new_intermediate, TD, deny).agent_id, "agent-1")

    def test_issue_agent_leaf(self) -> None:
        """An issued leaf verifies through ca_chain_pem (intermediate then root) and admits."""
        ca = self.ca()
        root = ca.init_root("Acme", NOW)
        issued = ca.issue_agent_leaf("t-1", "agent-1", "alice", NOW)
        intermediate, anchor = certs_from_pem(issued.ca_chain_pem)
        self.assertEqual(anchor, root.cert)
        leaf = x509.load_pem_x509_certificate(issued.cert_pem)
        verify_chain(leaf, [intermediate], root.cert, NOW)
        identity = admit_agent(leaf, intermediate, TD, DenyList())
        self.assertEqual((identity.tenant_id, identity.agent_id), ("t-1", "agent-1"))
        self.assertEqual(identity.serial, issued.serial)
        self.assertEqual(issued.not_after, NOW + timedelta(hours=1))
        key = key_from_pem(issued.key_pem)
        self.assertEqual(
            key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw),
            leaf.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw),
        )
        self.assertNotIn("PRIVATE", repr(issued))

    def test_server_and_control(self) -> None:
        """Server leaves, CSR signing and the control cert come from the stored root."""
        ca = self.ca()
        root = ca.init_root("Acme", NOW)
        server = ca.issue_server_leaf("dp.svc.example", NOW)
        control = ca.issue_control_cert(NOW)
        key = Ed25519PrivateKey.generate()
        csr = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")]))
            .sign(key, None)
        )
        signed = ca.sign_server_csr(csr, "dp2.svc.example", NOW)
        for cert in (server.cert, control.cert, signed):
            verify_chain(cert, [], root.cert, NOW)
