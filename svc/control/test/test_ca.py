"""
Tests for L{svc.control.ca} and L{svc.control.ca_keys}: opening the agent
CA at boot, keys encrypted at rest, the lazy tenant intermediate in both
backends, the audit of every signature, and L{AgentCAProvider}.
"""

from __future__ import annotations

import base64
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from twisted.internet import reactor
from twisted.internet.defer import Deferred, fail, succeed
from twisted.trial.unittest import SynchronousTestCase, TestCase

from svc.config import ConfigError
from svc.control.ca import (
    AgentCA,
    AgentCAProvider,
    init_org_root,
    open_agent_ca,
)
from svc.control.ca_keys import DatabaseTenantKeys, init_database_root
from svc.control.settings import ControlSettings
from svc.control.store.interface import ControlStore
from svc.control.store.postgres import PostgresControlStore
from svc.control.store.values import CaKind, CaMaterial, CertificateKind
from svc.control.test.test_enrollment_support import (
    KEK,
    NOW,
    SERVICE_TOKEN,
    TRUST_DOMAIN,
    capture_logs,
    control_environ,
)
from svc.pki import names
from svc.pki.chain import verify_chain
from svc.pki.errors import CAAlreadyInitialised, CAInconsistent, KeyEncryptionError
from svc.pki.issuance import issue_org_root, issue_tenant_intermediate
from svc.pki.pem import cert_from_pem, certs_from_pem
from svc.testing.control_store import TEST_SESSION_KEY, memory_control_store
from svc.testing.postgres import execute, schema_for_test
from svc.testing.worker import ImmediateWorker

OTHER_KEK = base64.b64encode(b"o" * 32).decode("ascii")


def database_environ(url: str, **extra: str) -> dict[str, str]:
    """A control plane with the in-database CA on C{url}."""
    environ = {
        "DATABASE_URL": url,
        "SVC_CONTROL_PLANE_TOKEN": SERVICE_TOKEN,
        "SVC_SECRETS_BACKEND": "postgres",
        "SVC_CA_KEK": base64.b64encode(KEK).decode("ascii"),
        "SVC_TRUST_DOMAIN": TRUST_DOMAIN,
        "SVC_ORG_NAME": "Acme",
    }
    environ.update(extra)
    return environ


class FilesystemCATests(SynchronousTestCase):
    """The filesystem backend under SVC_SECRETS_DIR."""

    def setUp(self) -> None:
        self.secrets = Path(self.mktemp())
        self.store = memory_control_store()
        self.worker = ImmediateWorker()

    def settings(self, **extra: str) -> ControlSettings:
        return ControlSettings.from_environ(control_environ(self.secrets, **extra))

    def open(self, settings: ControlSettings | None = None) -> AgentCA | None:
        return self.successResultOf(
            open_agent_ca(settings or self.settings(), self.store, self.worker)
        )

    def init(self, settings: ControlSettings | None = None) -> None:
        self.successResultOf(
            init_org_root(settings or self.settings(), self.store, NOW, self.worker)
        )

    def opened(self) -> AgentCA:
        self.init()
        ca = self.open()
        assert ca is not None
        return ca

    def test_not_configured(self) -> None:
        """Without SVC_SECRETS_DIR (and no database CA) there is no CA."""
        settings = ControlSettings.from_environ({})
        self.assertIsNone(self.open(settings))

    def test_not_initialised(self) -> None:
        """A configured CA without an org root opens as None (503 until 'svc ca init')."""
        self.assertIsNone(self.open())

    def test_keys_encrypted_at_rest(self) -> None:
        """The root and tenant key files are ENCRYPTED PKCS#8 PEM, mode 0600, never plain."""
        ca = self.opened()
        self.successResultOf(ca.prepare_tenant("acme", NOW))
        for key_path in (
            self.secrets / "ca" / "root" / "key.pem",
            self.secrets / "ca" / "tenant" / "acme" / "key.pem",
        ):
            data = key_path.read_bytes()
            self.assertIn(b"-----BEGIN ENCRYPTED PRIVATE KEY-----", data)
            self.assertNotIn(b"-----BEGIN PRIVATE KEY-----", data)
            self.assertEqual(key_path.stat().st_mode & 0o777, 0o600)

    def test_wrong_kek_refuses_to_boot(self) -> None:
        """Opening with another KEK fails with a ConfigError naming SVC_CA_KEK."""
        self.init()
        failure = self.failureResultOf(
            open_agent_ca(self.settings(SVC_CA_KEK=OTHER_KEK), self.store, self.worker),
            ConfigError,
        )
        self.assertEqual(failure.value.variable, "SVC_CA_KEK")
        self.assertIn("wrong key-encryption key", str(failure.value))

    def test_plain_key_with_kek_refuses_to_boot(self) -> None:
        """A root stored without encryption is refused once a KEK is configured."""
        dev = self.settings(SVC_CA_KEK="", SVC_DEV_MODE="1")
        self.init(dev)
        failure = self.failureResultOf(
            open_agent_ca(self.settings(), self.store, self.worker), ConfigError
        )
        self.assertEqual(failure.value.variable, "SVC_CA_KEK")

    def test_dev_mode_without_kek(self) -> None:
        """SVC_DEV_MODE without a KEK stores plain keys and warns at boot."""
        dev = self.settings(SVC_CA_KEK="", SVC_DEV_MODE="1")
        self.init(dev)
        events = capture_logs(self)
        self.assertIsNotNone(self.open(dev))
        key = (self.secrets / "ca" / "root" / "key.pem").read_bytes()
        self.assertIn(b"-----BEGIN PRIVATE KEY-----", key)
        self.assertTrue(any("NOT encrypted" in str(e.get("log_format")) for e in events))

    def test_init_refuses_second_root(self) -> None:
        """A second 'ca init' fails and leaves the first root in place."""
        self.init()
        before = (self.secrets / "ca" / "root" / "cert.pem").read_bytes()
        self.failureResultOf(
            init_org_root(self.settings(), self.store, NOW, self.worker), CAAlreadyInitialised
        )
        self.assertEqual((self.secrets / "ca" / "root" / "cert.pem").read_bytes(), before)

    def test_root_recorded(self) -> None:
        """Creating the root is a recorded signing event."""
        self.init()
        root = cert_from_pem((self.secrets / "ca" / "root" / "cert.pem").read_bytes())
        record = self.successResultOf(
            self.store.find_certificate(names.format_serial(root.serial_number))
        )
        self.assertEqual((record.kind, record.subject), (CertificateKind.ORG_ROOT, "Acme Root CA"))

    def test_intermediate_lazy_and_audited_once(self) -> None:
        """The first use creates and records the intermediate; later uses and a reboot do not."""
        ca = self.opened()
        self.assertFalse((self.secrets / "ca" / "tenant" / "acme").exists())
        events = capture_logs(self)
        leaf = self.successResultOf(
            ca.issue_agent_leaf(tenant_id="acme", agent_id="a1", user_id="alice", now=NOW)
        )
        self.successResultOf(ca.prepare_tenant("acme", NOW))
        rebooted = self.open()
        assert rebooted is not None
        self.successResultOf(rebooted.prepare_tenant("acme", NOW))
        kinds = [e["kind"] for e in events if e.get("ca_signed")]
        self.assertEqual(kinds, ["tenant_intermediate", "agent_leaf"])
        intermediate, root = certs_from_pem(leaf.ca_chain_pem)
        self.assertEqual(root, ca.root)
        record = self.successResultOf(
            self.store.find_certificate(names.format_serial(intermediate.serial_number))
        )
        self.assertEqual(record.kind, CertificateKind.TENANT_INTERMEDIATE)

    def test_intermediate_renewed_near_expiry(self) -> None:
        """An intermediate with less than an hour left is replaced, and the new one audited."""
        ca = self.opened()
        self.successResultOf(ca.prepare_tenant("acme", NOW))
        later = NOW + timedelta(days=365) - timedelta(minutes=30)
        events = capture_logs(self)
        leaf = self.successResultOf(
            ca.issue_agent_leaf(tenant_id="acme", agent_id="a1", user_id="alice", now=later)
        )
        self.assertEqual(
            [e["kind"] for e in events if e.get("ca_signed")], ["tenant_intermediate", "agent_leaf"]
        )
        intermediate, root = certs_from_pem(leaf.ca_chain_pem)
        verify_chain(cert_from_pem(leaf.cert_pem), [intermediate], root, later)

    def test_control_cert(self) -> None:
        """The control-plane certificate is signed by the root and audited."""
        ca = self.opened()
        pair = self.successResultOf(ca.issue_control_cert(NOW))
        pair.cert.verify_directly_issued_by(ca.root)
        record = self.successResultOf(
            self.store.find_certificate(names.format_serial(pair.cert.serial_number))
        )
        self.assertEqual((record.kind, record.subject), (CertificateKind.CONTROL, "svc-control"))

    def test_https_leaf(self) -> None:
        """The HTTPS listener's leaf: ECDSA P-256, server profile for the FQDN, audited."""
        ca = self.opened()
        cert, key = self.successResultOf(ca.issue_https_leaf("control.example", NOW))
        self.assertIsInstance(key.curve, ec.SECP256R1)
        self.assertEqual(cert.public_key(), key.public_key())
        cert.verify_directly_issued_by(ca.root)
        extensions = cert.extensions
        sans = extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        self.assertEqual(sans.get_values_for_type(x509.DNSName), ["control.example"])
        usage = extensions.get_extension_for_class(x509.KeyUsage).value
        self.assertEqual((usage.digital_signature, usage.key_encipherment), (True, False))
        purposes = extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        self.assertEqual(list(purposes), [ExtendedKeyUsageOID.SERVER_AUTH])
        record = self.successResultOf(
            self.store.find_certificate(names.format_serial(cert.serial_number))
        )
        self.assertEqual(
            (record.kind, record.subject), (CertificateKind.SERVER_LEAF, "control.example")
        )

    def test_unrecorded_signature_not_handed_out(self) -> None:
        """If the signing event cannot be recorded the leaf is not returned."""
        ca = self.opened()
        self.successResultOf(ca.prepare_tenant("acme", NOW))
        real = self.store

        class Broken:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def record_certificate(self, certificate: object) -> Deferred[None]:
                return fail(RuntimeError("database gone"))

        ca_on_broken = self.successResultOf(
            open_agent_ca(self.settings(), cast(ControlStore, Broken()), self.worker)
        )
        assert ca_on_broken is not None
        self.failureResultOf(
            ca_on_broken.issue_agent_leaf(tenant_id="acme", agent_id="a", user_id="u", now=NOW),
            RuntimeError,
        )

    def test_log_line_fields(self) -> None:
        """ca_signed carries kind, serial, tenant, agent, not_after."""
        ca = self.opened()
        self.successResultOf(ca.prepare_tenant("acme", NOW))
        events = capture_logs(self)
        leaf = self.successResultOf(
            ca.issue_agent_leaf(tenant_id="acme", agent_id="a1", user_id="alice", now=NOW)
        )
        (line,) = [e for e in events if e.get("ca_signed")]
        self.assertEqual(
            {k: line[k] for k in ("kind", "serial", "tenant", "agent", "not_after")},
            {
                "kind": "agent_leaf",
                "serial": leaf.serial,
                "tenant": "acme",
                "agent": "a1",
                "not_after": (NOW + timedelta(hours=1)).isoformat(),
            },
        )


class DatabaseBackendTests(SynchronousTestCase):
    """The in-database backend's logic, on the SQLite store (same CA-material table)."""

    def setUp(self) -> None:
        self.store = memory_control_store()
        self.worker = ImmediateWorker()

    def keys(self, store: ControlStore | None = None, kek: bytes = KEK) -> DatabaseTenantKeys:
        opened = self.successResultOf(
            DatabaseTenantKeys.open(store or self.store, kek, TRUST_DOMAIN, self.worker)
        )
        assert opened is not None
        return opened

    def init(self) -> None:
        self.successResultOf(init_database_root(self.store, "Acme", KEK, NOW, self.worker))

    def test_no_root(self) -> None:
        """Without stored root material the backend opens as None."""
        self.assertIsNone(
            self.successResultOf(
                DatabaseTenantKeys.open(self.store, KEK, TRUST_DOMAIN, self.worker)
            )
        )

    def test_root_stored_encrypted_once(self) -> None:
        """The root is stored with an encrypted key; a second init is refused."""
        self.init()
        material = self.successResultOf(self.store.get_ca_material(CaKind.ROOT))
        assert material is not None
        self.assertIn(b"ENCRYPTED PRIVATE KEY", material.encrypted_key_pem)
        self.failureResultOf(
            init_database_root(self.store, "Acme", KEK, NOW, self.worker), CAAlreadyInitialised
        )

    def test_wrong_kek(self) -> None:
        """Another KEK does not open the stored root."""
        self.init()
        self.failureResultOf(
            DatabaseTenantKeys.open(self.store, b"o" * 32, TRUST_DOMAIN, self.worker),
            KeyEncryptionError,
        )

    def test_not_a_root(self) -> None:
        """Root material that is not an org root refuses to open."""
        root = issue_org_root("Acme", NOW)
        intermediate = issue_tenant_intermediate(root, "t", TRUST_DOMAIN, NOW)
        self.successResultOf(
            self.store.put_ca_material(
                CaMaterial(
                    CaKind.ROOT, None, intermediate.cert_pem(), intermediate.key_pem(KEK), NOW
                )
            )
        )
        self.failureResultOf(
            DatabaseTenantKeys.open(self.store, KEK, TRUST_DOMAIN, self.worker), CAInconsistent
        )

    def test_intermediate_created_stored_and_reused(self) -> None:
        """First use signs and stores an encrypted intermediate; another process reuses it."""
        self.init()
        first = self.successResultOf(self.keys().intermediate("acme", NOW))
        self.assertEqual(first.signed, (first.current.cert,))
        stored = self.successResultOf(self.store.get_ca_material(CaKind.TENANT, "acme"))
        assert stored is not None
        self.assertIn(b"ENCRYPTED PRIVATE KEY", stored.encrypted_key_pem)
        again = self.successResultOf(self.keys().intermediate("acme", NOW))
        self.assertEqual(again.signed, ())
        self.assertEqual(again.current.cert, first.current.cert)

    def test_cached_in_memory(self) -> None:
        """A second call in one process reads nothing from the store."""
        self.init()
        keys = self.keys()
        self.successResultOf(keys.intermediate("acme", NOW))
        before = self.worker.calls
        again = self.successResultOf(keys.intermediate("acme", NOW))
        self.assertEqual((again.signed, self.worker.calls), ((), before))

    def test_expiring_intermediate_replaced(self) -> None:
        """An intermediate with less than a leaf lifetime left is replaced in the store."""
        self.init()
        first = self.successResultOf(self.keys().intermediate("acme", NOW))
        later = NOW + timedelta(days=365) - timedelta(minutes=30)
        second = self.successResultOf(self.keys().intermediate("acme", later))
        self.assertNotEqual(second.current.cert, first.current.cert)
        self.assertEqual(second.signed, (second.current.cert,))
        stored = self.successResultOf(self.store.get_ca_material(CaKind.TENANT, "acme"))
        assert stored is not None
        self.assertEqual(stored.cert_pem, second.current.cert_pem())

    def test_race_adopts_first_stored(self) -> None:
        """Two processes creating one intermediate: the loser adopts the stored one."""
        self.init()
        winner = self.successResultOf(self.keys().intermediate("acme", NOW))
        real = self.store

        class StaleRead:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def get_ca_material(self, kind: CaKind, tenant_id: str | None = None) -> Any:
                if kind is CaKind.TENANT:
                    return succeed(None)
                return real.get_ca_material(kind, tenant_id)

        loser = self.successResultOf(
            self.keys(cast(ControlStore, StaleRead())).intermediate("acme", NOW)
        )
        self.assertEqual(loser.current.cert, winner.current.cert)
        self.assertEqual(len(loser.signed), 1)
        self.assertNotEqual(loser.signed[0], winner.current.cert)

    def test_concurrent_calls_share_one_load(self) -> None:
        """Calls for one tenant while a load is in flight wait for it and sign nothing."""
        self.init()
        real = self.store
        gate: Deferred[None] = Deferred()

        class Slow:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def get_ca_material(self, kind: CaKind, tenant_id: str | None = None) -> Any:
                d = real.get_ca_material(kind, tenant_id)
                return gate.addCallback(lambda _: d) if kind is CaKind.TENANT else d

        keys = self.keys(cast(ControlStore, Slow()))
        first = keys.intermediate("acme", NOW)
        second = keys.intermediate("acme", NOW)
        self.assertNoResult(first)
        self.assertNoResult(second)
        gate.callback(None)
        one, two = self.successResultOf(first), self.successResultOf(second)
        self.assertEqual(len(one.signed), 1)
        self.assertEqual(two.signed, ())
        self.assertEqual(one.current.cert, two.current.cert)


class ProviderTests(SynchronousTestCase):
    """L{AgentCAProvider}: the boot-time CA, or a fresh attempt while there is none."""

    def test_retries_while_none(self) -> None:
        """Each get() reopens until a CA appears; then it is kept."""
        answers: list[Deferred[AgentCA | None]] = [succeed(None), succeed(cast(AgentCA, "ca"))]
        calls = []

        def opener() -> Deferred[AgentCA | None]:
            calls.append(1)
            return answers.pop(0)

        provider = AgentCAProvider(opener)
        self.assertIsNone(self.successResultOf(provider.get()))
        self.assertIsNone(provider.current)
        self.assertEqual(self.successResultOf(provider.get()), "ca")
        self.assertEqual(self.successResultOf(provider.get()), "ca")
        self.assertEqual(provider.current, "ca")
        self.assertEqual(len(calls), 2)

    def test_one_open_at_a_time(self) -> None:
        """Concurrent get()s share one opening attempt."""
        pending: Deferred[AgentCA | None] = Deferred()
        calls = []

        def opener() -> Deferred[AgentCA | None]:
            calls.append(1)
            return pending

        provider = AgentCAProvider(opener)
        first, second = provider.get(), provider.get()
        self.assertEqual(len(calls), 1)
        pending.callback(cast(AgentCA, "ca"))
        self.assertEqual(self.successResultOf(first), "ca")
        self.assertEqual(self.successResultOf(second), "ca")

    def test_failure_reaches_every_waiter(self) -> None:
        """A failed opening fails every waiting get(), and the next get() tries again."""
        pending: Deferred[AgentCA | None] = Deferred()
        provider = AgentCAProvider(lambda: pending)
        first, second = provider.get(), provider.get()
        pending.errback(RuntimeError("boom"))
        self.failureResultOf(first, RuntimeError)
        self.failureResultOf(second, RuntimeError)
        self.assertIsNone(provider.current)

    def test_opened_fails_on_wrong_kek(self) -> None:
        """AgentCAProvider.opened propagates a wrong KEK so the process refuses to start."""
        secrets = Path(self.mktemp())
        store, worker = memory_control_store(), ImmediateWorker()
        settings = ControlSettings.from_environ(control_environ(secrets))
        self.successResultOf(init_org_root(settings, store, NOW, worker))
        wrong = ControlSettings.from_environ(control_environ(secrets, SVC_CA_KEK=OTHER_KEK))
        self.failureResultOf(AgentCAProvider.opened(wrong, store, worker), ConfigError)
        right = self.successResultOf(AgentCAProvider.opened(settings, store, worker))
        self.assertIsNotNone(right.current)


class PostgresCATests(TestCase):
    """The in-database CA on a real PostgreSQL (skipped without one, outside CI)."""

    async def open_store(self, url: str) -> ControlStore:
        store = await PostgresControlStore.open(url, reactor, NOW, session_key=TEST_SESSION_KEY)
        self.addCleanup(store.close)
        return store

    async def test_round_trip(self) -> None:
        """Init, enroll, reboot: same root and intermediate; keys encrypted in the table."""
        url = schema_for_test(self)
        store = await self.open_store(url)
        settings = ControlSettings.from_environ(database_environ(url))
        worker = ImmediateWorker()
        self.assertIsNone(await open_agent_ca(settings, store, worker))
        await init_org_root(settings, store, NOW, worker)
        ca = await open_agent_ca(settings, store, worker)
        assert ca is not None
        leaf = await ca.issue_agent_leaf(tenant_id="acme", agent_id="a1", user_id="alice", now=NOW)
        intermediate, root = certs_from_pem(leaf.ca_chain_pem)
        verify_chain(cert_from_pem(leaf.cert_pem), [intermediate], root, NOW)
        keys = execute(url, "SELECT ca_id, encrypted_key_pem FROM ca_material ORDER BY ca_id")
        self.assertEqual([k[0] for k in keys], ["root", "tenant/acme"])
        for _ca_id, key in keys:
            raw = bytes(cast(Any, key))
            self.assertIn(b"ENCRYPTED PRIVATE KEY", raw)
            self.assertNotIn(b"BEGIN PRIVATE KEY", raw)
        rebooted = await open_agent_ca(settings, await self.open_store(url), worker)
        assert rebooted is not None
        self.assertEqual(rebooted.root, ca.root)
        again = await rebooted.issue_agent_leaf(
            tenant_id="acme", agent_id="a1", user_id="alice", now=NOW
        )
        self.assertEqual(certs_from_pem(again.ca_chain_pem)[0], intermediate)
        kinds = execute(url, "SELECT kind FROM issued_certificates ORDER BY kind")
        self.assertEqual(
            [k[0] for k in kinds], ["agent_leaf", "agent_leaf", "org_root", "tenant_intermediate"]
        )

    async def test_wrong_kek(self) -> None:
        """The database CA with another KEK refuses to boot."""
        url = schema_for_test(self)
        store = await self.open_store(url)
        worker = ImmediateWorker()
        await init_org_root(ControlSettings.from_environ(database_environ(url)), store, NOW, worker)
        wrong = ControlSettings.from_environ(database_environ(url, SVC_CA_KEK=OTHER_KEK))
        error: Any = await self.assertFailure(open_agent_ca(wrong, store, worker), ConfigError)
        self.assertIsInstance(error, ConfigError)
        self.assertEqual(error.variable, "SVC_CA_KEK")

    def test_kek_required(self) -> None:
        """The database CA refuses to open without a KEK, even in dev mode."""
        settings = ControlSettings.from_environ(
            database_environ("postgres://h/db", SVC_CA_KEK="", SVC_DEV_MODE="1")
        )
        d = open_agent_ca(settings, memory_control_store(), ImmediateWorker())
        self.assertEqual(self.failureResultOf(d, ConfigError).value.variable, "SVC_CA_KEK")
