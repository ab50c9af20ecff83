"""
Tests for L{svc.dataplane.servercert}: obtaining the server leaf from a fake
control plane that really signs with the test PKI's root, storing it,
renewing it at two thirds of its life, and retrying failures.
"""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from klein import Klein
from treq.testing import StubTreq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.ssl import CertificateOptions
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.server import Request, Site

from svc.backoff import Backoff
from svc.dataplane.servercert import (
    CERT_FILE,
    IDENTITY_KEY_FILE,
    KEY_FILE,
    ROOT_FILE,
    CredentialFiles,
    Registration,
    RegistrationRefused,
    ServerCertificate,
    ServerCertificateError,
    ServerCredentials,
    SigningFailed,
    SignServerCertCall,
    StaticServerCertificate,
    check_credentials,
    load_static_credentials,
    refusal_at_start,
    renewal_time,
)
from svc.pki import server_identity
from svc.pki.errors import InvalidName
from svc.pki.issuance import issue_server_leaf, sign_server_csr
from svc.pki.pem import cert_to_pem, key_from_pem, key_to_pem
from svc.startup import StartError
from svc.testing.pki import shared_test_pki
from svc.testing.worker import ImmediateWorker
from svc.web.clients import control_plane_http_client

TOKEN = "svc_servicetoken"
FQDN = "dp1.svc.test"
TRUST_DOMAIN = "svc.test"
REGISTRATION = Registration(
    FQDN, "dp1.svc.test:7000", "dp1.svc.test:7443", TRUST_DOMAIN, capacity=50
)


class FakeControlPlane:
    """
    C{POST /control/sign-server-cert} signing with the test root at the
    clock's time, registering each FQDN under the first identity key that
    proves itself (as the real control plane does, 409 C{fqdn_registered}
    for another unless it names that key to replace) and refusing another
    trust domain; can be told to fail, answer for another key, or hang.
    """

    app = Klein()

    def __init__(self, clock: Clock, ttl: timedelta = timedelta(days=90)) -> None:
        self.pki = shared_test_pki()
        self.clock = clock
        self.ttl = ttl
        self.requests: list[dict[str, Any]] = []
        self.unavailable = 0
        self.retry_after: str | None = None
        self.wrong_key = False
        self.hang = False
        self.token = TOKEN
        self.trust_domain = TRUST_DOMAIN
        self.keys: dict[str, str] = {}

    @app.route("/control/sign-server-cert", methods=["POST"])
    def sign(self, request: Request) -> Any:
        if request.getHeader(b"authorization") != f"Bearer {self.token}".encode():
            request.setResponseCode(401)
            return json.dumps({"error": "invalid_token"}).encode()
        if self.hang:
            return Deferred()
        assert request.content is not None
        body = json.loads(request.content.read())
        self.requests.append(body)
        if self.unavailable:
            self.unavailable -= 1
            request.setResponseCode(503)
            if self.retry_after is not None:
                request.setHeader(b"Retry-After", self.retry_after.encode())
            return json.dumps({"error": "temporarily_unavailable"}).encode()
        csr = x509.load_pem_x509_csr(body["csr_pem"].encode())
        server_identity.check_proof(body["identity_key"], body["identity_proof"], csr)
        if body["trust_domain"] != self.trust_domain:
            request.setResponseCode(409)
            return json.dumps(
                {"error": "trust_domain_mismatch", "trust_domain": self.trust_domain}
            ).encode()
        registered = self.keys.setdefault(body["fqdn"], body["identity_key"])
        if registered not in (body["identity_key"], body.get("replaces_identity_key")):
            request.setResponseCode(409)
            answer = {
                "error": "fqdn_registered",
                "server_id": "srv-1",
                "identity_key": registered,
                "last_seen_at": "2026-11-22T19:00:00Z",
            }
            return json.dumps(answer).encode()
        self.keys[body["fqdn"]] = body["identity_key"]
        now = datetime.fromtimestamp(self.clock.seconds(), UTC)
        if self.wrong_key:
            cert = issue_server_leaf(self.pki.root, body["fqdn"], now).cert
        else:
            cert = sign_server_csr(self.pki.root, csr, body["fqdn"], now, self.ttl)
        answer = {
            "cert_pem": cert_to_pem(cert).decode(),
            "root_ca_pem": self.pki.root.cert_pem().decode(),
            "not_after": cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "server_id": "srv-1",
        }
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps(answer).encode()


class ServerCertificateTests(SynchronousTestCase):
    """
    L{ServerCertificate} against the fake control plane, on a L{Clock}.
    """

    def setUp(self) -> None:
        self.pki = shared_test_pki()
        self.clock = Clock()
        self.clock.advance(self.pki.now.timestamp())
        self.control = FakeControlPlane(self.clock)
        self.stub: Any = StubTreq(self.control.app.resource())
        self.state = Path(self.mktemp())
        self.installed: list[tuple[x509.Certificate, Ed25519PrivateKey, x509.Certificate]] = []

    def service(self, token: str = TOKEN, **kwargs: Any) -> ServerCertificate:
        signer = SignServerCertCall(self.stub, "http://control.test/", token, self.clock)
        settings: dict[str, Any] = {
            "on_new_certificate": lambda c, k, r: self.installed.append((c, k, r)),
            "draw": lambda: 0.5,
            **kwargs,
        }
        registration = settings.pop("registration", REGISTRATION)
        service = ServerCertificate(
            registration=registration,
            signer=signer,
            files=CredentialFiles(self.state),
            clock=self.clock,
            io=ImmediateWorker(),
            **settings,
        )
        self.addCleanup(service.stopService)
        return service

    def settle(self) -> None:
        for _ in range(5):
            self.stub.flush()

    def start(self, **kwargs: Any) -> ServerCertificate:
        service = self.service(**kwargs)
        service.startService()
        self.settle()
        return service

    def test_obtains_and_stores(self) -> None:
        """Without state, a CSR is signed, installed once and written with a 0600 key."""
        service = self.start()
        (request,) = self.control.requests
        self.assertEqual(
            {k: request[k] for k in ("fqdn", "advertise_addr", "http_addr", "capacity")},
            {
                "fqdn": FQDN,
                "advertise_addr": "dp1.svc.test:7000",
                "http_addr": "dp1.svc.test:7443",
                "capacity": 50,
            },
        )
        (cert, key, root) = self.installed[0]
        self.assertEqual(len(self.installed), 1)
        self.assertEqual(root, self.pki.root.cert)
        check_credentials(ServerCredentials(cert, key, root), FQDN, self.pki.now)
        self.assertEqual(self.successResultOf(service.ready()).cert, cert)
        self.assertEqual(stat.S_IMODE((self.state / KEY_FILE).stat().st_mode), 0o600)
        stored = CredentialFiles(self.state).load()
        self.assertEqual(stored, ServerCredentials(cert, key, root))

    def test_csr_names_fqdn(self) -> None:
        """The CSR carries the FQDN as CN and DNS SAN."""
        self.start()
        csr = x509.load_pem_x509_csr(self.control.requests[0]["csr_pem"].encode())
        sans = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        self.assertEqual(sans.get_values_for_type(x509.DNSName), [FQDN])
        self.assertIn(FQDN, csr.subject.rfc4514_string())

    def test_uses_stored_certificate_and_registers_again(self) -> None:
        """
        A restart installs valid stored credentials at once and registers
        again (a fresh leaf), so the control plane learns the current
        addresses; registered() fires once it has.
        """
        self.start().stopService()
        first = self.installed[0][0]
        self.installed.clear()
        moved = Registration(FQDN, "10.9.9.9:7000", "10.9.9.9:7443", TRUST_DOMAIN, capacity=50)
        service = self.service(registration=moved)
        self.control.hang = True
        service.startService()
        self.settle()
        self.assertEqual([cert for cert, _, _ in self.installed], [first])
        registered = service.registered()
        self.assertNoResult(registered)
        self.control.hang = False
        self.clock.advance(30)  # the hanging call times out; retried later
        self.settle()
        self.successResultOf(registered)
        self.clock.advance((service.next_attempt_at() or 0) - self.clock.seconds())
        self.settle()
        self.assertEqual(len(self.control.requests), 2)
        self.assertEqual(self.control.requests[1]["advertise_addr"], "10.9.9.9:7000")
        self.assertEqual(self.control.requests[1]["http_addr"], "10.9.9.9:7443")
        self.assertEqual(len(self.installed), 2)
        self.assertEqual(service.failures, 0)

    def test_registered_waits_without_stored_credentials(self) -> None:
        """Without stored credentials, registered() waits through failures for a success."""
        self.control.unavailable = 1
        service = self.start()
        registered = service.registered()
        self.assertNoResult(registered)
        self.clock.advance((service.next_attempt_at() or 0) - self.clock.seconds())
        self.settle()
        self.successResultOf(registered)

    def test_identity_key_created_once_and_proved(self) -> None:
        """
        The identity key is created once (mode 0600) and every registration
        names it with a proof over its own CSR.
        """
        self.start().stopService()
        self.start()
        key_file = self.state / IDENTITY_KEY_FILE
        self.assertEqual(stat.S_IMODE(key_file.stat().st_mode), 0o600)
        identity = server_identity.key_text(key_from_pem(key_file.read_bytes()))
        self.assertEqual([r["identity_key"] for r in self.control.requests], [identity] * 2)
        self.assertEqual({r["trust_domain"] for r in self.control.requests}, {TRUST_DOMAIN})
        self.assertNotIn("replaces_identity_key", self.control.requests[0])

    def test_fqdn_of_another_server_refused_for_good(self) -> None:
        """
        A second server (another identity key) claiming a registered FQDN is
        refused: ready() and registered() fail with the fix named, on_refused
        is told, nothing is installed or retried.
        """
        self.start().stopService()
        self.control.requests.clear()
        self.installed.clear()
        refusals: list[RegistrationRefused] = []
        self.state = Path(self.mktemp())  # another machine: its own state
        service = self.start(on_refused=refusals.append)
        error = self.failureResultOf(service.ready(), RegistrationRefused).value
        self.failureResultOf(service.registered(), RegistrationRefused)
        self.assertEqual(refusals, [error])
        self.assertEqual(error.code, "fqdn_registered")
        registered = self.control.keys[FQDN]
        self.assertIn(f"SVC_REPLACE_SERVER_KEY={registered}", str(error))
        self.assertIn(f"SVC_SERVER_FQDN={FQDN}", str(error))
        self.assertEqual(self.installed, [])
        self.assertIsNone(service.next_attempt_at())
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_refused_after_serving_stored_credentials(self) -> None:
        """
        A server serving stored credentials whose registration is then
        refused (another server took the FQDN over) is told to stop.
        """
        self.start().stopService()
        self.control.keys[FQDN] = server_identity.key_text(Ed25519PrivateKey.generate())
        refusals: list[RegistrationRefused] = []
        service = self.start(on_refused=refusals.append)
        self.assertEqual(len(self.installed), 2)  # the stored leaf, installed at once
        self.assertEqual([r.code for r in refusals], ["fqdn_registered"])
        self.failureResultOf(service.registered(), RegistrationRefused)
        self.assertIsNone(service.next_attempt_at())

    def test_replacing_names_the_registered_key(self) -> None:
        """
        A server started with the registered key to replace takes the FQDN
        over; a leftover replace setting is harmless after that.
        """
        self.start().stopService()
        old = self.control.keys[FQDN]
        self.state = Path(self.mktemp())
        replacing = Registration(
            FQDN, "dp1.svc.test:7000", "dp1.svc.test:7443", TRUST_DOMAIN, replaces=old
        )
        service = self.start(registration=replacing)
        self.successResultOf(service.registered())
        self.assertEqual(self.control.requests[-1]["replaces_identity_key"], old)
        self.assertNotEqual(self.control.keys[FQDN], old)
        service.stopService()
        self.successResultOf(self.start(registration=replacing).registered())

    def test_trust_domain_mismatch_refused(self) -> None:
        """A control plane of another trust domain refuses the server; the fix is named."""
        self.control.trust_domain = "other.test"
        service = self.start()
        error = self.failureResultOf(service.registered(), RegistrationRefused).value
        self.assertEqual(error.code, "trust_domain_mismatch")
        self.assertIn("SVC_TRUST_DOMAIN=other.test", str(error))
        self.assertIn(repr(TRUST_DOMAIN), str(error))
        self.assertIsNone(service.next_attempt_at())

    def test_unreadable_identity_key_refuses_to_start(self) -> None:
        """An identity key file holding no key fails the start naming the file; nothing is sent."""
        self.state.mkdir()
        (self.state / IDENTITY_KEY_FILE).write_bytes(b"not a key")
        service = self.start()
        error = self.failureResultOf(service.ready(), ServerCertificateError).value
        self.assertIn(IDENTITY_KEY_FILE, str(error))
        self.assertEqual(self.control.requests, [])

    def test_replace_setting_checked(self) -> None:
        """A replace setting that is not an identity key is refused when built."""
        self.assertRaises(
            InvalidName,
            Registration,
            FQDN,
            "a:1",
            "b:1",
            TRUST_DOMAIN,
            replaces="abc",
        )

    def test_stored_for_another_name_replaced(self) -> None:
        """A stored leaf for another FQDN is not used: a new one is obtained."""
        other = issue_server_leaf(self.pki.root, "old.svc.test", self.pki.now)
        CredentialFiles(self.state).store(
            ServerCredentials(other.cert, other.key, self.pki.root.cert)
        )
        self.start()
        self.assertEqual(len(self.control.requests), 1)
        self.assertNotEqual(self.installed[0][0], other.cert)

    def test_mismatched_files_replaced(self) -> None:
        """A key file that does not match the leaf (a torn rotation) means obtaining anew."""
        self.start().stopService()
        (self.state / KEY_FILE).write_bytes(key_to_pem(Ed25519PrivateKey.generate()))
        self.assertIsNone(CredentialFiles(self.state).load())
        self.start()
        self.assertEqual(len(self.control.requests), 2)

    def test_renews_at_two_thirds(self) -> None:
        """Renewal happens at two thirds of the leaf's life with a fresh key, not before."""
        service = self.start()
        cert = self.installed[0][0]
        renew_at = renewal_time(cert).timestamp()
        self.assertAlmostEqual(service.next_attempt_at() or 0, renew_at, places=3)
        self.clock.advance(renew_at - self.clock.seconds() - 1)
        self.settle()
        self.assertEqual(len(self.installed), 1)
        self.clock.advance(1)
        self.settle()
        self.assertEqual(len(self.installed), 2)
        new_cert, new_key, _ = self.installed[1]
        self.assertGreater(new_cert.not_valid_after_utc, cert.not_valid_after_utc)
        self.assertNotEqual(new_key.public_key(), self.installed[0][1].public_key())
        self.assertEqual(CredentialFiles(self.state).load(), ServerCredentials(*self.installed[1]))

    def test_stored_past_renewal_point(self) -> None:
        """A stored leaf past two thirds of its life is used and renewed at once."""
        self.start().stopService()
        cert = self.installed[0][0]
        self.clock.advance(renewal_time(cert).timestamp() - self.clock.seconds() + 10)
        service = self.start()
        self.assertEqual(self.installed[1][0], cert)
        self.assertEqual(len(self.installed), 3)  # registered again at once, a new leaf
        self.assertGreater(service.next_attempt_at() or 0, self.clock.seconds())

    def test_retry_backoff(self) -> None:
        """Failures are retried after a growing, jittered delay, and then succeed."""
        self.control.unavailable = 3
        service = self.start(retry=Backoff(initial=4.0, factor=2.0, maximum=900.0, jitter=0.5))
        delays = []
        for _ in range(3):
            self.assertEqual(self.installed, [])
            delays.append((service.next_attempt_at() or 0) - self.clock.seconds())
            self.clock.advance(delays[-1])
            self.settle()
        self.assertEqual(delays, [3.0, 6.0, 12.0])
        self.assertEqual(len(self.installed), 1)
        self.assertEqual(service.failures, 0)

    def test_retry_after_respected(self) -> None:
        """A 503's Retry-After is a floor on the next delay."""
        self.control.unavailable = 1
        self.control.retry_after = "60"
        service = self.start()
        self.assertEqual((service.next_attempt_at() or 0) - self.clock.seconds(), 60.0)

    def test_backoff_bounded(self) -> None:
        """However many failures, the delay never exceeds the policy's maximum."""
        self.control.unavailable = 100
        service = self.start()
        for _ in range(20):
            delay = (service.next_attempt_at() or 0) - self.clock.seconds()
            self.assertLessEqual(delay, 900.0)
            self.clock.advance(delay)
            self.settle()
        self.assertEqual((service.failures, self.installed), (21, []))
        self.assertGreater(delay, 400.0)

    def test_wrong_token_ends_the_start(self) -> None:
        """A 401 before any certificate fails ready() naming the token; nothing is retried."""
        service = self.start(token="wrong")
        error = self.failureResultOf(service.ready(), StartError).value
        self.assertEqual(error.variable, "SVC_CONTROL_PLANE_TOKEN")
        self.assertIn("401", str(error))
        self.assertIsNone(service.next_attempt_at())
        self.assertEqual((self.installed, service.failures), ([], 0))
        # A later ready() fails the same way instead of waiting forever.
        self.failureResultOf(service.ready(), StartError)

    def test_refused_renewal_is_retried(self) -> None:
        """Once serving, a refused renewal is retried: the server keeps its leaf."""
        service = self.start()
        self.assertEqual(len(self.installed), 1)
        self.control.token = "another-token-" + "x" * 32
        self.clock.advance((service.next_attempt_at() or 0) - self.clock.seconds())
        self.settle()
        self.assertEqual((len(self.installed), service.failures), (1, 1))
        self.assertIsNotNone(service.next_attempt_at())

    def test_refusals_at_start(self) -> None:
        """Which answers end the start, and the variable each names; the others are retried."""
        url = "https://control.test"
        cases = {
            SigningFailed("status 401: invalid_token", status=401): "SVC_CONTROL_PLANE_TOKEN",
            SigningFailed("status 403: forbidden", status=403): "SVC_CONTROL_PLANE_TOKEN",
            SigningFailed("status 404: http_404", status=404): "SVC_CONTROL_URL",
            SigningFailed("status 400: bad_fqdn", status=400): "SVC_SERVER_FQDN",
            SigningFailed("no answer: SSL", untrusted=True): "SVC_CA_FILE",
            PermissionError(13, "Permission denied", "/state"): "SVC_STATE_DIR",
        }
        for error, variable in cases.items():
            refusal = refusal_at_start(error, url)
            assert refusal is not None, error
            self.assertEqual(refusal.variable, variable)
        for transient in (
            SigningFailed("no answer: ConnectionRefusedError"),
            SigningFailed("status 503: temporarily_unavailable", status=503),
            SigningFailed("status 429: rate_limited", status=429),
            SigningFailed("status 408: timeout", status=408),
            SigningFailed("malformed signing answer"),
        ):
            self.assertIsNone(refusal_at_start(transient, url), transient)

    def test_answer_for_other_key_refused(self) -> None:
        """A leaf that does not match the generated key is refused and retried."""
        self.control.wrong_key = True
        service = self.start()
        self.assertEqual((self.installed, service.failures), ([], 1))
        self.assertFalse((self.state / CERT_FILE).exists())

    def test_timeout_retried(self) -> None:
        """A control plane that never answers times out and the call is retried."""
        self.control.hang = True
        service = self.start()
        self.assertEqual(service.failures, 0)
        self.clock.advance(30)
        self.settle()
        self.assertEqual(service.failures, 1)
        self.assertIsNotNone(service.next_attempt_at())

    def test_callback_error_keeps_renewal(self) -> None:
        """An exception from on_new_certificate is logged and renewal stays scheduled."""

        def broken(*_: object) -> None:
            raise RuntimeError("listener bug")

        service = self.start(on_new_certificate=broken)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertIsNotNone(service.current)
        self.assertIsNotNone(service.next_attempt_at())

    def test_stop_leaves_nothing_scheduled(self) -> None:
        """Stopping cancels the renewal timer and a pending retry."""
        service = self.start()
        service.stopService()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.control.unavailable = 1
        service = self.start()
        service.stopService()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_ready_waits_for_first(self) -> None:
        """ready() fires only once the first certificate is installed."""
        self.control.unavailable = 1
        service = self.start()
        ready = service.ready()
        self.assertNoResult(ready)
        self.clock.advance((service.next_attempt_at() or 0) - self.clock.seconds())
        self.settle()
        self.assertEqual(self.successResultOf(ready).cert, self.installed[0][0])


class PureRulesTests(SynchronousTestCase):
    """
    Renewal time, retry delays and credential checks.
    """

    def test_renewal_time(self) -> None:
        """Renewal is at NotBefore + 2/3 of the validity period."""
        pki = shared_test_pki()
        leaf = issue_server_leaf(pki.root, FQDN, pki.now, ttl=timedelta(days=90)).cert
        expected = pki.now - timedelta(minutes=5) + (timedelta(days=90, minutes=5) * 2 / 3)
        self.assertLess(abs(renewal_time(leaf).timestamp() - expected.timestamp()), 1)

    def test_check_credentials(self) -> None:
        """Another root, another name or an expired leaf are refused."""
        pki = shared_test_pki()
        leaf = issue_server_leaf(pki.root, FQDN, pki.now)
        good = ServerCredentials(leaf.cert, leaf.key, pki.root.cert)
        check_credentials(good, FQDN.upper(), pki.now)
        foreign = ServerCredentials(leaf.cert, leaf.key, pki.other_root.cert)
        self.assertRaises(ServerCertificateError, check_credentials, foreign, FQDN, pki.now)
        self.assertRaises(ServerCertificateError, check_credentials, good, "other.test", pki.now)
        late = pki.now + timedelta(days=91)
        self.assertRaises(ServerCertificateError, check_credentials, good, FQDN, late)

    def test_key_must_match(self) -> None:
        """Credentials whose key does not match the leaf cannot be built."""
        pki = shared_test_pki()
        self.assertRaises(
            ServerCertificateError,
            ServerCredentials,
            pki.server.cert,
            Ed25519PrivateKey.generate(),
            pki.root.cert,
        )


class StaticCertificateTests(SynchronousTestCase):
    """
    L{StaticServerCertificate} and L{load_static_credentials}.
    """

    def test_installs_once(self) -> None:
        """The files' credentials are installed at start and never renewed."""
        pki = shared_test_pki()
        d = Path(self.mktemp())
        d.mkdir()
        (d / "c.pem").write_bytes(pki.server.cert_pem())
        (d / "k.pem").write_bytes(pki.server.key_pem())
        (d / "r.pem").write_bytes(pki.root.cert_pem())
        credentials = load_static_credentials(d / "c.pem", d / "k.pem", d / "r.pem")
        installed: list[object] = []
        service = StaticServerCertificate(credentials, lambda c, k, r: installed.append(c))
        service.startService()
        self.assertEqual(installed, [pki.server.cert])
        self.assertEqual(self.successResultOf(service.ready()), credentials)

    def test_mismatch_refused(self) -> None:
        """A key file for another certificate is refused."""
        pki = shared_test_pki()
        d = Path(self.mktemp())
        d.mkdir()
        (d / "c.pem").write_bytes(pki.server.cert_pem())
        (d / "k.pem").write_bytes(pki.control.key_pem())
        (d / ROOT_FILE).write_bytes(pki.root.cert_pem())
        self.assertRaises(
            ServerCertificateError, load_static_credentials, d / "c.pem", d / "k.pem", d / ROOT_FILE
        )


class ControlPlaneHttpsTests(TestCase):
    """
    L{control_plane_http_client} with a CA file, against a real HTTPS
    listener on loopback.
    """

    def test_ca_file_trust(self) -> Deferred[None]:
        """A control plane whose leaf chains to the CA file is reached; signing works."""
        pki = shared_test_pki()
        real: Any = reactor
        clock = Clock()
        clock.advance(real.seconds())
        control = FakeControlPlane(clock)
        leaf = pki.server_leaf("localhost")
        options = CertificateOptions(privateKey=leaf.key, certificate=leaf.cert)  # type: ignore[arg-type]
        port = real.listenSSL(0, Site(control.app.resource()), options, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        ca_file = Path(self.mktemp())
        ca_file.write_bytes(pki.root.cert_pem())
        http = control_plane_http_client(real, ca_file)
        signer = SignServerCertCall(http, f"https://localhost:{port.getHost().port}", TOKEN, real)

        async def run() -> None:
            credentials = await signer.sign(
                REGISTRATION, Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
            )
            self.assertEqual(credentials.root, pki.root.cert)

        return Deferred.fromCoroutine(run())

    def test_other_ca_refused(self) -> Deferred[None]:
        """With a CA file naming another root, the control plane is not trusted."""
        pki = shared_test_pki()
        real: Any = reactor
        control = FakeControlPlane(Clock())
        leaf = pki.server_leaf("localhost")
        options = CertificateOptions(privateKey=leaf.key, certificate=leaf.cert)  # type: ignore[arg-type]
        port = real.listenSSL(0, Site(control.app.resource()), options, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        ca_file = Path(self.mktemp())
        ca_file.write_bytes(pki.other_root.cert_pem())
        http = control_plane_http_client(real, ca_file)
        signer = SignServerCertCall(http, f"https://localhost:{port.getHost().port}", TOKEN, real)

        async def run() -> None:
            with self.assertRaises(SigningFailed) as raised:
                await signer.sign(
                    REGISTRATION, Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
                )
            self.assertEqual(control.requests, [])
            self.assertTrue(raised.exception.untrusted)

        return Deferred.fromCoroutine(run())
