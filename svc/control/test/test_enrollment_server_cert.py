"""
Tests for C{POST /control/sign-server-cert}: a data-plane server's CSR
signed by the org root, the server registered for placement, and the
errors of C{docs/specifications/control-dataplane.md}.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from twisted.trial.unittest import SynchronousTestCase

from svc.control.routes_enrollment import parse_host_port
from svc.control.store.values import CertificateKind
from svc.control.test.backends import PostgresBackend, RouteBackend, SQLiteBackend
from svc.control.test.test_enrollment_support import (
    NOW,
    SERVICE_TOKEN,
    TRUST_DOMAIN,
    RouteWorld,
)
from svc.pki import names, server_identity
from svc.pki.pem import cert_from_pem
from svc.pki.test.profiles import ProfileAssertions
from svc.testing.registration import registration_body
from svc.testing.web import Answer

SIGN = "/control/sign-server-cert"
AUTH = {"Authorization": f"Bearer {SERVICE_TOKEN}"}


def csr_pem(key: Any = None, common_name: str = "ignored.example") -> str:
    """A CSR signed by C{key} (default: a new ed25519 key)."""
    key = key or Ed25519PrivateKey.generate()
    algorithm = None if isinstance(key, Ed25519PrivateKey) else hashes.SHA256()
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .sign(key, algorithm)
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode("ascii")


if TYPE_CHECKING:
    _Profile = ProfileAssertions
else:
    _Profile = object


class SignServerCertContract(RouteBackend, _Profile):
    """The route signs, registers and answers as the control-dataplane spec says."""

    async def set_up(self) -> None:
        self.world = await RouteWorld.open(self, with_server=False)
        self.key = Ed25519PrivateKey.generate()
        self.identity = Ed25519PrivateKey.generate()

    def body(
        self,
        identity: Ed25519PrivateKey | None = None,
        csr: x509.CertificateSigningRequest | None = None,
        **changes: Any,
    ) -> dict[str, Any]:
        """A registration proved over C{csr} (default: one for C{self.key}), with C{changes}."""
        body = registration_body(
            "DP1.Example.test",
            "dp1.example.test:7443",
            "10.1.2.3:8443",
            TRUST_DOMAIN,
            csr=csr or x509.load_pem_x509_csr(csr_pem(self.key).encode()),
            identity=identity or self.identity,
            capacity=7,
        )
        body.update(changes)
        return {k: v for k, v in body.items() if v is not None}

    async def sign(
        self, body: dict[str, Any] | None, headers: dict[str, str] | None = None
    ) -> Answer:
        return await self.world.post_json(SIGN, body, AUTH if headers is None else headers)

    def assertBadRequest(self, answer: Answer, description: str) -> None:
        self.assertEqual(answer.status, 400, answer.body)
        self.assertEqual(
            answer.json(), {"error": "invalid_request", "error_description": description}
        )

    async def test_signed_leaf(self) -> None:
        """200: a server leaf for the CSR's key and the fqdn, issued by the returned org root."""
        answer = await self.sign(self.body())
        self.assertEqual(answer.status, 200, answer.body)
        body = answer.json()
        self.assertEqual(set(body), {"cert_pem", "root_ca_pem", "not_after", "server_id"})
        cert = cert_from_pem(body["cert_pem"].encode())
        root = cert_from_pem(body["root_ca_pem"].encode())
        ca = await self.world.result(self.world.provider.get())
        assert ca is not None
        self.assertEqual(root, ca.root)
        self.assertLinked(cert, root)
        raw = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.assertEqual(
            cert.public_key().public_bytes(*raw), self.key.public_key().public_bytes(*raw)
        )
        self.assertEqual(cert.subject.rfc4514_string(), "CN=dp1.example.test")
        self.assertSans(cert, [x509.DNSName("dp1.example.test")])
        self.assertPurpose(cert, ExtendedKeyUsageOID.SERVER_AUTH)
        self.assertUsage(cert, {"digital_signature", "key_encipherment"})
        self.assertEqual(cert.not_valid_after_utc, NOW + timedelta(days=90))
        self.assertEqual(body["not_after"], "2027-01-30T12:00:00Z")

    async def test_server_registered(self) -> None:
        """The server is registered by fqdn with its advertised address, capacity and leaf."""
        body = (await self.sign(self.body())).json()
        (server,) = await self.world.result(self.world.store.list_servers())
        self.assertEqual(server.server_id, body["server_id"])
        self.assertEqual(
            (server.fqdn, server.address, server.capacity),
            ("dp1.example.test", "dp1.example.test:7443", 7),
        )
        cert = cert_from_pem(body["cert_pem"].encode())
        self.assertEqual(server.cert_serial, names.format_serial(cert.serial_number))
        self.assertEqual(server.cert_not_after, cert.not_valid_after_utc)

    async def test_registration_reported(self) -> None:
        """A (re-)registration tells the push loop, which resends its tenants' quotas."""
        self.assertEqual((await self.sign(self.body())).status, 200)
        self.assertEqual((await self.sign(self.body())).status, 200)
        self.assertEqual(self.world.pushes.registered, ["dp1.example.test"] * 2)

    async def test_refused_registration_not_reported(self) -> None:
        """A refused signing request reports no registration."""
        self.assertEqual((await self.sign(self.body(capacity=-1))).status, 400)
        self.assertEqual(self.world.pushes.registered, [])

    async def test_signing_recorded(self) -> None:
        """The server leaf is recorded as an issued certificate."""
        body = (await self.sign(self.body())).json()
        cert = cert_from_pem(body["cert_pem"].encode())
        record = await self.world.result(
            self.world.store.find_certificate(names.format_serial(cert.serial_number))
        )
        self.assertEqual(
            (record.kind, record.subject), (CertificateKind.SERVER_LEAF, "dp1.example.test")
        )

    async def test_resign_keeps_registration(self) -> None:
        """Signing again for the same fqdn keeps the server id and updates address and capacity."""
        first = (await self.sign(self.body())).json()
        second = (
            await self.sign(self.body(advertise_addr="[2001:db8::0001]:7443", capacity=3))
        ).json()
        self.assertEqual(first["server_id"], second["server_id"])
        (server,) = await self.world.result(self.world.store.list_servers())
        self.assertEqual((server.address, server.capacity), ("[2001:db8::1]:7443", 3))

    async def test_default_capacity(self) -> None:
        """Without capacity the server takes the default number of tenants."""
        await self.sign(self.body(capacity=None))
        (server,) = await self.world.result(self.world.store.list_servers())
        self.assertEqual(server.capacity, self.world.deps.default_server_capacity)

    async def test_registration_enables_enrollment(self) -> None:
        """After registration an enrollment is placed on the server."""
        await self.sign(self.body())
        answer = await self.world.enroll(await self.world.token())
        self.assertEqual(answer.status, 200)
        self.assertEqual(answer.json()["server_addr"], "dp1.example.test:7443")
        self.assertEqual(answer.json()["server_name"], "dp1.example.test")

    async def test_bad_csr(self) -> None:
        """Garbage, a CSR with a bad signature or a non-ed25519 key: 400 bad_csr."""
        pem = csr_pem(self.key)
        tampered = x509.load_pem_x509_csr(pem.encode())
        der = bytearray(tampered.public_bytes(serialization.Encoding.DER))
        der[-1] ^= 1
        broken = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
        for value in ("not a csr", broken.decode()):
            self.assertBadRequest(await self.sign(self.body(csr_pem=value)), "bad_csr")
        not_ed25519 = x509.load_pem_x509_csr(
            csr_pem(ec.generate_private_key(ec.SECP256R1())).encode()
        )
        self.assertBadRequest(await self.sign(self.body(csr=not_ed25519)), "bad_csr")
        self.assertEqual(await self.world.result(self.world.store.list_servers()), ())

    async def test_bad_fields(self) -> None:
        """Bad fqdn, addresses or capacity, and missing fields: 400 naming the field."""
        cases: dict[str, list[dict[str, Any]]] = {
            "bad_fqdn": [{"fqdn": "not a host"}, {"fqdn": "x" * 65}],
            "bad_advertise_addr": [
                {"advertise_addr": "host"},
                {"advertise_addr": "host:0"},
                {"advertise_addr": "host:65536"},
                {"advertise_addr": "[::zz]:1"},
                {"advertise_addr": 7},
            ],
            "bad_http_addr": [{"http_addr": None}, {"http_addr": "a b:1"}],
            "bad_capacity": [{"capacity": -1}, {"capacity": True}, {"capacity": "3"}],
            "bad_csr_pem": [{"csr_pem": None}, {"csr_pem": ""}],
        }
        for description, variants in cases.items():
            for changes in variants:
                self.assertBadRequest(await self.sign(self.body(**changes)), description)

    async def test_identity_key_recorded(self) -> None:
        """The server is registered under the identity key its registration proved."""
        await self.sign(self.body())
        (server,) = await self.world.result(self.world.store.list_servers())
        self.assertEqual(server.identity_key, server_identity.key_text(self.identity))

    async def test_other_identity_refused_the_fqdn(self) -> None:
        """
        Another identity key claiming a registered FQDN: 409 fqdn_registered
        naming the registered key, the registration unchanged, no push.
        """
        first = (await self.sign(self.body())).json()
        other = Ed25519PrivateKey.generate()
        answer = await self.sign(self.body(identity=other, advertise_addr="evil.test:1"))
        self.assertEqual(answer.status, 409, answer.body)
        self.assertEqual(
            answer.json(),
            {
                "error": "fqdn_registered",
                "server_id": first["server_id"],
                "identity_key": server_identity.key_text(self.identity),
                "last_seen_at": "2026-11-01T12:00:00Z",
            },
        )
        (server,) = await self.world.result(self.world.store.list_servers())
        self.assertEqual(server.address, "dp1.example.test:7443")
        self.assertEqual(self.world.pushes.registered, ["dp1.example.test"])

    async def test_replacing_names_the_registered_key(self) -> None:
        """A registration naming the registered key to replace takes the FQDN, id kept."""
        first = (await self.sign(self.body())).json()
        other = Ed25519PrivateKey.generate()
        registered = server_identity.key_text(self.identity)
        wrong = server_identity.key_text(Ed25519PrivateKey.generate())
        answer = await self.sign(self.body(identity=other, replaces_identity_key=wrong))
        self.assertEqual(answer.status, 409, answer.body)
        answer = await self.sign(self.body(identity=other, replaces_identity_key=registered))
        self.assertEqual(answer.status, 200, answer.body)
        self.assertEqual(answer.json()["server_id"], first["server_id"])
        (server,) = await self.world.result(self.world.store.list_servers())
        self.assertEqual(server.identity_key, server_identity.key_text(other))
        # The replaced key is refused from now on.
        self.assertEqual((await self.sign(self.body())).status, 409)

    async def test_trust_domain_mismatch(self) -> None:
        """A server of another trust domain: 409 naming ours; nothing signed or registered."""
        answer = await self.sign(self.body(trust_domain="other.test"))
        self.assertEqual(answer.status, 409, answer.body)
        self.assertEqual(
            answer.json(), {"error": "trust_domain_mismatch", "trust_domain": TRUST_DOMAIN}
        )
        self.assertEqual(await self.world.result(self.world.store.list_servers()), ())

    async def test_bad_identity(self) -> None:
        """A missing or malformed identity key or proof, or a proof of another CSR: 400."""
        other_csr = x509.load_pem_x509_csr(csr_pem().encode())
        foreign = server_identity.prove(self.identity, other_csr)
        cases: dict[str, list[dict[str, Any]]] = {
            "bad_trust_domain": [{"trust_domain": None}, {"trust_domain": ""}],
            "bad_identity_key": [{"identity_key": None}, {"identity_key": "AB" * 32}],
            "bad_identity_proof": [
                {"identity_proof": None},
                {"identity_proof": "00" * 64},
                {"identity_proof": foreign},
            ],
            "bad_replaces_identity_key": [{"replaces_identity_key": "xyz"}],
        }
        for description, variants in cases.items():
            for changes in variants:
                self.assertBadRequest(await self.sign(self.body(**changes)), description)
        self.assertEqual(await self.world.result(self.world.store.list_servers()), ())

    async def test_service_token_required(self) -> None:
        """Without the service token: 401 invalid_token."""
        for headers in ({}, {"Authorization": "Bearer " + "x" * 40}):
            answer = await self.sign(self.body(), headers)
            self.assertEqual(answer.status, 401)
            self.assertEqual(answer.json(), {"error": "invalid_token"})

    async def test_no_ca(self) -> None:
        """Without an org root: 503 with Retry-After, nothing registered."""
        world = await RouteWorld.open(self, with_root=False, with_server=False)
        answer = await world.post_json(SIGN, self.body(), AUTH)
        self.assertEqual(answer.status, 503)
        self.assertEqual(answer.header("Retry-After"), "60")
        self.assertEqual(answer.json()["error"], "temporarily_unavailable")
        self.assertEqual(await world.result(world.store.list_servers()), ())


# Each contract on both backends: SQLite in memory, synchronously; PostgreSQL.


class SignServerCertTests(SignServerCertContract, SQLiteBackend, ProfileAssertions):
    """SignServerCert over SQLite."""


class PostgresSignServerCertTests(SignServerCertContract, PostgresBackend, ProfileAssertions):
    """SignServerCert over PostgreSQL."""


class ParseHostPortTests(SynchronousTestCase):
    """L{parse_host_port} accepts host:port forms and normalises them."""

    def test_accepted(self) -> None:
        """DNS names, IPv4 and bracketed IPv6 with ports 1-65535; hosts lower-cased."""
        self.assertEqual(parse_host_port("DP.Example:443"), "dp.example:443")
        self.assertEqual(parse_host_port("10.0.0.1:1"), "10.0.0.1:1")
        self.assertEqual(parse_host_port("[2001:DB8::0001]:65535"), "[2001:db8::1]:65535")
        self.assertEqual(parse_host_port("localhost:0080"), "localhost:80")

    def test_refused(self) -> None:
        """Missing or out-of-range ports, bad hosts and unbracketed IPv6 are refused."""
        for text in (
            "",
            "host",
            ":80",
            "host:",
            "host:0",
            "host:70000",
            "a_b:1",
            "::1:80",
            "[x]:1",
        ):
            with self.assertRaises(ValueError, msg=text):
                parse_host_port(text)
