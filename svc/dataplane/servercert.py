"""
The data-plane server's own TLS leaf: obtaining it from the control plane,
which registers the server under its FQDN and identity key; keeping it in a
state directory; renewing it in place.

Lifecycle (C{docs/specifications/dataplane-http.md}, section "Server
certificate"):

  1. At start, L{ServerCertificate} loads (or, the first time, creates) the
     server's identity key C{identity-key.pem}, and loads C{server-key.pem},
     C{server-cert.pem} and C{org-root.pem} from its state directory. If
     they belong together, verify to the root, name the configured FQDN and
     have not expired, they are installed at once.
  2. Every start then registers: it generates a fresh ed25519 TLS key and a
     CSR (CN and DNS SAN = the FQDN) and sends C{POST
     /control/sign-server-cert} with the service token, its addresses, its
     trust domain and its identity key with a proof of possession
     (C{docs/specifications/control-dataplane.md}); the answer is checked,
     written atomically (key mode 0600) and installed.
     L{ServerCertificate.registered} fires once that first attempt has
     succeeded, or failed for a reason that may pass while stored
     credentials serve.
  3. The control plane may refuse the server for good
     (L{RegistrationRefused}: its FQDN is registered under another identity
     key, or its trust domain differs from the control plane's); then
     nothing is retried, the waiters fail and C{on_refused} is called: the
     server must stop.
  4. Renewal (a fresh TLS key and a new leaf) is scheduled at two thirds of
     the leaf's lifetime (C{NotBefore} to C{NotAfter}). A failed attempt is
     retried after a jittered exponential backoff (L{DEFAULT_RETRY}: from 5 s
     up to 15 minutes), never sooner than a C{Retry-After}.

While no certificate is installed yet (the server is starting), a refusal
that cannot fix itself ends the start instead (L{refusal_at_start}): the
service token refused (401, 403), a URL that is not the control plane's
(404, 405), the registration refused (any other 4xx but 408 and 429), a
state directory that cannot be written. A control plane that does not
answer, or answers 5xx, 408 or 429, is asked again.

"Installed" means the C{on_new_certificate(cert, key, root)} callback ran:
the caller builds new TLS options for its listeners from it; connections
already open keep the options they were accepted with, so nothing live is
dropped. L{StaticServerCertificate} instead serves fixed files (tests, the
embedded development stack), registers nothing and never renews.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID
from OpenSSL import SSL
from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.backoff import Backoff
from svc.durable import make_directories, write_file_atomically
from svc.pki import names, server_identity
from svc.pki.chain import verify_chain
from svc.pki.errors import PKIError
from svc.pki.pem import cert_from_pem, cert_to_pem, key_from_pem, key_to_pem
from svc.startup import StartError, describe
from svc.web.clients import AnswerTooLarge, read_bounded
from svc.worker import IWorker

SIGN_PATH = "/control/sign-server-cert"
KEY_FILE = "server-key.pem"
CERT_FILE = "server-cert.pem"
ROOT_FILE = "org-root.pem"
IDENTITY_KEY_FILE = "identity-key.pem"
RENEW_FRACTION = 2 / 3
"""Renew once this fraction of the leaf's lifetime has passed."""

MAX_ANSWER_BYTES = 64 * 1024
DEFAULT_REQUEST_TIMEOUT = 30.0

NewCertificate = Callable[[x509.Certificate, Ed25519PrivateKey, x509.Certificate], object]
"""C{on_new_certificate(cert, key, root)}."""


class ServerCertificateError(Exception):
    """The control plane's answer (or a stored certificate) is unusable."""


class RegistrationRefused(Exception):
    """
    The control plane refused to register this server, for a reason only
    the operator can remove; the server must not serve. C{str()} is the
    operator's message; C{code} the control plane's C{error}.
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def variable(self) -> str:
        """The setting the operator changes to remove the refusal."""
        return "SVC_TRUST_DOMAIN" if self.code == TRUST_DOMAIN_MISMATCH else "SVC_SERVER_FQDN"


class SigningFailed(Exception):
    """
    C{POST /control/sign-server-cert} did not produce a certificate;
    C{retry_after} is the server's C{Retry-After} in seconds, if any, and
    C{status} the answer's HTTP status (L{None}: no answer, or an unusable
    one).
    """

    def __init__(
        self,
        reason: str,
        retry_after: float | None = None,
        status: int | None = None,
        *,
        untrusted: bool = False,
    ) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.status = status
        self.untrusted = untrusted
        """The control plane's HTTPS certificate failed verification."""


_TRANSIENT_STATUSES = frozenset({408, 425, 429})


def refusal_at_start(error: Exception, control_url: str) -> StartError | None:
    """
    The start failure C{error} (from a signing attempt) means while no
    certificate is installed yet, or L{None} when it is worth another
    attempt (no answer, 5xx, 408, 425, 429).
    """
    if isinstance(error, OSError):
        return StartError(
            "SVC_STATE_DIR",
            f"cannot store the server certificate: {describe(error)}",
            "make it a directory this user may write",
        )
    if isinstance(error, SigningFailed) and error.untrusted:
        return StartError(
            "SVC_CA_FILE",
            f"the HTTPS certificate of {control_url} is not trusted ({error})",
            "set SVC_CA_FILE to the org root (or the CA) that signed it",
        )
    if not isinstance(error, SigningFailed) or error.status is None:
        return None
    status = error.status
    if status in (401, 403):
        return StartError(
            "SVC_CONTROL_PLANE_TOKEN",
            f"the control plane at {control_url} refused it ({error})",
            "set the control plane's service token",
        )
    if status in (404, 405):
        return StartError(
            "SVC_CONTROL_URL",
            f"{control_url} answered {error}: not the control plane's base URL",
            "set the URL the control plane serves (without /control/...)",
        )
    if 400 <= status < 500 and status not in _TRANSIENT_STATUSES:
        return StartError(
            "SVC_SERVER_FQDN",
            f"the control plane at {control_url} refused the registration ({error})",
            "check SVC_SERVER_FQDN, SVC_ADVERTISE_ADDR and SVC_HTTP_ADVERTISE_ADDR",
        )
    return None


@attrs.frozen
class ServerCredentials:
    """
    The server leaf, its key and the org root. The key is kept out of
    C{repr} and out of equality (key objects do not compare; the leaf,
    checked to match it, stands for it).
    """

    cert: x509.Certificate
    key: Ed25519PrivateKey = attrs.field(repr=False, eq=False)
    root: x509.Certificate

    def __attrs_post_init__(self) -> None:
        if self.cert.public_key() != self.key.public_key():
            raise ServerCertificateError("the certificate does not belong to the key")


def renewal_time(cert: x509.Certificate) -> datetime:
    """When to renew C{cert}: two thirds of the way from NotBefore to NotAfter."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return start + (end - start) * RENEW_FRACTION


def check_credentials(credentials: ServerCredentials, fqdn: str, now: datetime) -> None:
    """
    Refuse credentials that would not serve C{fqdn} at C{now}: the leaf must
    verify directly to the self-signed root, be valid now, and carry C{fqdn}
    as a DNS SAN.

    @raise ServerCertificateError: otherwise.
    """
    root = credentials.root
    if root.issuer != root.subject:
        raise ServerCertificateError("the org root is not self-issued")
    try:
        verify_chain(credentials.cert, [], root, now)
    except PKIError as e:
        raise ServerCertificateError(f"the leaf does not verify to the root: {e}") from None
    try:
        sans = credentials.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        raise ServerCertificateError("the leaf has no DNS SAN") from None
    if names.check_fqdn(fqdn) not in sans.value.get_values_for_type(x509.DNSName):
        raise ServerCertificateError(f"the leaf does not name {fqdn}")


def new_csr(key: Ed25519PrivateKey, fqdn: str) -> x509.CertificateSigningRequest:
    """A CSR for C{fqdn} (CN and DNS SAN) signed by C{key}."""
    host = names.check_fqdn(fqdn)
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .sign(key, None)
    )


@attrs.frozen
class Registration:
    """
    What the server tells the control plane about itself: its FQDN, the
    frame address agents dial, its HTTPS address, the trust domain it admits
    agents of, optionally how many tenants it takes, and the identity key
    of a registration it replaces (C{SVC_REPLACE_SERVER_KEY}).
    """

    fqdn: str = attrs.field(converter=names.check_fqdn)
    advertise_addr: str
    http_addr: str
    trust_domain: str
    capacity: int | None = None
    replaces: str | None = attrs.field(default=None)

    @replaces.validator
    def _check_replaces(self, attribute: attrs.Attribute[str | None], value: str | None) -> None:
        if value is not None:
            server_identity.check_key_text(value, "the identity key to replace")

    def body(
        self, csr: x509.CertificateSigningRequest, identity: Ed25519PrivateKey
    ) -> dict[str, object]:
        """The C{POST /control/sign-server-cert} body for C{csr}, from the server C{identity}."""
        body: dict[str, object] = {
            "csr_pem": csr.public_bytes(serialization.Encoding.PEM).decode("ascii"),
            "fqdn": self.fqdn,
            "advertise_addr": self.advertise_addr,
            "http_addr": self.http_addr,
            "trust_domain": self.trust_domain,
            "identity_key": server_identity.key_text(identity),
            "identity_proof": server_identity.prove(identity, csr),
        }
        if self.capacity is not None:
            body["capacity"] = self.capacity
        if self.replaces is not None:
            body["replaces_identity_key"] = self.replaces
        return body


def parse_signing_answer(body: bytes, key: Ed25519PrivateKey) -> ServerCredentials:
    """
    The credentials in a 200 answer (C{cert_pem}, C{root_ca_pem}) for C{key}.

    @raise ServerCertificateError: malformed, or for another key.
    """
    try:
        answer = json.loads(body)
        cert = cert_from_pem(answer["cert_pem"].encode("ascii"))
        root = cert_from_pem(answer["root_ca_pem"].encode("ascii"))
    except (ValueError, KeyError, TypeError, AttributeError, PKIError) as e:
        raise ServerCertificateError(f"malformed signing answer: {e}") from None
    return ServerCredentials(cert, key, root)


DEFAULT_RETRY = Backoff(initial=5.0, maximum=900.0, factor=2.0, jitter=0.5)
"""The pause after a failed attempt: 5 s doubling to 15 minutes, less up to
half of it at random (a fleet restarted together spreads out), never below a
server's C{Retry-After}."""


class CredentialFiles:
    """
    The key, leaf and root in a state directory (blocking I/O: use a
    worker). The key is written with mode 0600, certificates 0644, each
    atomically; the directory is created with mode 0700.
    """

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def load(self) -> ServerCredentials | None:
        """The stored credentials, or L{None} if absent or inconsistent."""
        paths = [self.state_dir / n for n in (KEY_FILE, CERT_FILE, ROOT_FILE)]
        try:
            key_pem, cert_pem, root_pem = (p.read_bytes() for p in paths)
            return ServerCredentials(
                cert_from_pem(cert_pem), key_from_pem(key_pem), cert_from_pem(root_pem)
            )
        except FileNotFoundError:
            return None
        except (PKIError, ServerCertificateError) as e:
            _log.warn(
                "ignoring stored server certificate in {dir}: {error}",
                dir=str(self.state_dir),
                error=str(e),
            )
            return None

    def store(self, credentials: ServerCredentials) -> None:
        """Write the credentials: root, key, then leaf."""
        make_directories(self.state_dir)
        write_file_atomically(self.state_dir / ROOT_FILE, cert_to_pem(credentials.root), 0o644)
        write_file_atomically(self.state_dir / KEY_FILE, key_to_pem(credentials.key), 0o600)
        write_file_atomically(self.state_dir / CERT_FILE, cert_to_pem(credentials.cert), 0o644)

    def identity_key(self) -> Ed25519PrivateKey:
        """
        The server's identity key, created (mode 0600) the first time.

        @raise ServerCertificateError: the file exists but holds no ed25519 key.
        """
        path = self.state_dir / IDENTITY_KEY_FILE
        try:
            return key_from_pem(path.read_bytes())
        except FileNotFoundError:
            pass
        except PKIError as e:
            raise ServerCertificateError(
                f"{path} is not an ed25519 private key ({e}); restore it, or remove it to"
                " make a new identity (the control plane then refuses this server's FQDN"
                " until it is replaced: SVC_REPLACE_SERVER_KEY)"
            ) from None
        key = Ed25519PrivateKey.generate()
        make_directories(self.state_dir)
        write_file_atomically(path, key_to_pem(key), 0o600)
        _log.info(
            "created the server identity key {key} in {path}",
            key=server_identity.key_text(key),
            path=str(path),
        )
        return key


def load_static_credentials(cert_path: Path, key_path: Path, root_path: Path) -> ServerCredentials:
    """
    Credentials from operator-given files (blocking).

    @raise PKIError: a file is malformed.
    @raise ServerCertificateError: the leaf and key do not match.
    """
    return ServerCredentials(
        cert_from_pem(cert_path.read_bytes()),
        key_from_pem(key_path.read_bytes()),
        cert_from_pem(root_path.read_bytes()),
    )


class PostsJson(Protocol):
    """The part of C{treq.client.HTTPClient} (or C{StubTreq}) used here."""

    def post(self, url: str, *, data: bytes, headers: dict[bytes, list[bytes]]) -> Deferred[Any]:
        """Send a POST; fires with an C{IResponse}."""


class TimerCall(Protocol):
    """The part of C{IDelayedCall} used here."""

    def active(self) -> bool:
        """Whether the call is still pending."""

    def getTime(self) -> float:
        """When the call will run."""

    def cancel(self) -> None:
        """Stop the pending call."""


class TimerClock(Protocol):
    """What the renewal needs of a reactor (or a C{Clock}): the time and
    delayed calls, which return a L{TimerCall}."""

    def seconds(self) -> float:
        """Now, in seconds since the epoch."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> Any:
        """Schedule a call."""


class SignServerCertCall:
    """
    C{POST <control_url>/control/sign-server-cert} with the service token
    over C{http} (a treq client; HTTPS trust is the client's business).
    """

    def __init__(
        self,
        http: PostsJson,
        control_url: str,
        token: str,
        clock: TimerClock,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ) -> None:
        self._http = http
        self.control_url = control_url.rstrip("/")
        self._url = self.control_url + SIGN_PATH
        self._token = token
        self._clock = clock
        self._timeout = timeout

    def __repr__(self) -> str:
        return f"<SignServerCertCall {self._url}>"

    async def sign(
        self, registration: Registration, key: Ed25519PrivateKey, identity: Ed25519PrivateKey
    ) -> ServerCredentials:
        """
        Register the server under C{identity} and have the control plane
        sign a CSR for C{key}.

        @raise RegistrationRefused: a 409 refusing this server for good
            (L{refusal}).
        @raise SigningFailed: no answer in time, any other non-200 status
            (with its C{Retry-After}), or an unusable answer.
        """
        csr = new_csr(key, registration.fqdn)
        body = json.dumps(registration.body(csr, identity)).encode()
        headers = {
            b"Authorization": [b"Bearer " + self._token.encode("ascii")],
            b"Content-Type": [b"application/json"],
        }
        request = self._http.post(self._url, data=body, headers=headers)
        request.addTimeout(self._timeout, self._clock)  # type: ignore[arg-type]
        try:
            response = await request
            try:
                content = await read_bounded(response, MAX_ANSWER_BYTES)
            except AnswerTooLarge:
                raise SigningFailed("the answer is too large") from None
        except SigningFailed:
            raise
        except CancelledError:
            raise
        except Exception as e:
            raise SigningFailed(
                f"no answer: {type(e).__name__}: {e}", untrusted=_verify_failed(e)
            ) from None
        if response.code == 409:
            refused = refusal(registration, _json_object(content))
            if refused is not None:
                raise refused
        if response.code != 200:
            raise SigningFailed(
                f"status {response.code}: {_error_code(content)}",
                _retry_after(response),
                response.code,
            )
        try:
            return parse_signing_answer(content, key)
        except ServerCertificateError as e:
            raise SigningFailed(str(e)) from None


def _verify_failed(error: Exception) -> bool:
    """Whether C{error} (a treq failure) is a refused TLS certificate."""
    reasons = getattr(error, "reasons", None) or []
    return any(
        isinstance(reason, Failure)
        and reason.check(SSL.Error) is not None  # type: ignore[no-untyped-call]
        and "certificate verify failed" in str(reason.value)
        for reason in reasons
    )


FQDN_REGISTERED = "fqdn_registered"
TRUST_DOMAIN_MISMATCH = "trust_domain_mismatch"


def refusal(registration: Registration, answer: dict[str, Any]) -> RegistrationRefused | None:
    """
    The operator's message for a 409 answer that refuses this server for
    good (C{fqdn_registered}, C{trust_domain_mismatch}); L{None} for another.
    """
    code = answer.get("error")
    if code == FQDN_REGISTERED:
        return RegistrationRefused(
            f"the control plane refused to register this server: FQDN {registration.fqdn}"
            f" is registered to another data-plane server, under identity key"
            f" {answer.get('identity_key')} (server id {answer.get('server_id')}, last"
            f" registered {answer.get('last_seen_at')}). Either another server runs with"
            f" SVC_SERVER_FQDN={registration.fqdn}: give this one its own SVC_SERVER_FQDN;"
            f" or this server replaces that one (its state directory, with"
            f" {IDENTITY_KEY_FILE}, was lost or moved): start it once with"
            f" SVC_REPLACE_SERVER_KEY={answer.get('identity_key')}",
            FQDN_REGISTERED,
        )
    if code == TRUST_DOMAIN_MISMATCH:
        return RegistrationRefused(
            f"the control plane refused to register this server: its trust domain is"
            f" {answer.get('trust_domain')!r} but this server has SVC_TRUST_DOMAIN="
            f"{registration.trust_domain!r}, so it would refuse every agent the control"
            f" plane enrolls; set SVC_TRUST_DOMAIN={answer.get('trust_domain')} (the control"
            f" plane's SVC_TRUST_DOMAIN)",
            TRUST_DOMAIN_MISMATCH,
        )
    return None


def _json_object(content: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(content)
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def _error_code(content: bytes) -> str:
    try:
        error = json.loads(content).get("error")
    except (ValueError, AttributeError):
        return "no JSON error body"
    return str(error)


def _retry_after(response: Any) -> float | None:
    values = response.headers.getRawHeaders(b"retry-after") or []
    if values and values[0].strip().isdigit():
        return float(values[0].strip())
    return None


_log = Logger()


class ServerCertificate(Service):
    """
    Keeps the server leaf current: registers and obtains it at every start
    (serving a stored one meanwhile), installs it through
    C{on_new_certificate}, renews it at two thirds of its life, and retries
    failures with L{DEFAULT_RETRY}. See the module docstring.

    @param registration: the server's names and addresses.
    @param signer: the control-plane call.
    @param files: the state directory.
    @param clock: time and delayed calls.
    @param io: runs the file reads and writes.
    @param on_new_certificate: installs new credentials on the listeners.
    @param on_refused: told when the control plane refuses this server
        (L{RegistrationRefused}): the server must stop.
    @param draw: a random number in [0, 1) for the jitter.
    """

    def __init__(
        self,
        *,
        registration: Registration,
        signer: SignServerCertCall,
        files: CredentialFiles,
        clock: TimerClock,
        io: IWorker,
        on_new_certificate: NewCertificate,
        on_refused: Callable[[RegistrationRefused], object] = lambda error: None,
        retry: Backoff = DEFAULT_RETRY,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._registration = registration
        self._signer = signer
        self._files = files
        self._clock = clock
        self._io = io
        self._on_new_certificate = on_new_certificate
        self._on_refused = on_refused
        self._retry = retry
        self._draw = draw
        self.current: ServerCredentials | None = None
        self.failures = 0
        """Consecutive failed attempts (0 after a success)."""
        self.refused: Exception | None = None
        """Why this server may not serve (a refusal, an unusable identity key)."""
        self._identity: Ed25519PrivateKey | None = None
        self._waiting: list[Deferred[ServerCredentials]] = []
        self._start_refusal: StartError | None = None
        self._registered = False
        self._registering: list[Deferred[None]] = []
        self._timer: TimerCall | None = None
        self._work: Deferred[None] | None = None

    def ready(self) -> Deferred[ServerCredentials]:
        """Fires with the first credentials installed (at once if there are some)."""
        if self.refused is not None:
            return fail(self.refused)
        if self.current is not None:
            return succeed(self.current)
        if self._start_refusal is not None:
            return fail(self._start_refusal)
        waiting: Deferred[ServerCredentials] = Deferred()
        self._waiting.append(waiting)
        return waiting

    def registered(self) -> Deferred[None]:
        """
        Fires once this start's first registration succeeded, or failed
        for a reason that may pass while stored credentials serve; fails
        with L{RegistrationRefused} when the control plane refuses the
        server (or the identity key cannot be had).
        """
        if self.refused is not None:
            return fail(self.refused)
        if self._registered:
            return succeed(None)
        waiting: Deferred[None] = Deferred()
        self._registering.append(waiting)
        return waiting

    def next_attempt_at(self) -> float | None:
        """When the next renewal or retry is scheduled (seconds), if any."""
        if self._timer is None or not self._timer.active():
            return None
        return self._timer.getTime()

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self._run(self._start())

    def stopService(self) -> Deferred[None] | None:
        super().stopService()  # type: ignore[no-untyped-call]
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._work is not None:
            self._work.cancel()
        return None

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock.seconds(), UTC)

    def _run(self, work: Any) -> None:
        work_done: Deferred[None] = Deferred.fromCoroutine(work)
        self._work = work_done

        def done(result: object) -> None:
            if self._work is work_done:
                self._work = None
            if isinstance(result, Failure) and not isinstance(result.value, CancelledError):
                _log.failure("server certificate renewal failed unexpectedly", result)

        work_done.addBoth(done)

    async def _start(self) -> None:
        try:
            self._identity = await self._io.submit(self._files.identity_key)
        except (OSError, ServerCertificateError) as e:
            self._refuse(e)
            return
        try:
            stored = await self._io.submit(self._files.load)
        except OSError as e:
            _log.warn("cannot read the stored server certificate: {error}", error=str(e))
            stored = None
        if stored is not None:
            try:
                check_credentials(stored, self._registration.fqdn, self._now())
            except ServerCertificateError as e:
                _log.info("stored server certificate not usable: {error}", error=str(e))
            else:
                _log.info(
                    "using stored server certificate, valid until {not_after}; registering again",
                    not_after=stored.cert.not_valid_after_utc.isoformat(),
                )
                self._install(stored)
        await self._attempt()

    async def _attempt(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()  # a stored leaf's renewal: this attempt replaces it
        self._timer = None
        assert self._identity is not None
        key = Ed25519PrivateKey.generate()
        try:
            credentials = await self._signer.sign(self._registration, key, self._identity)
            check_credentials(credentials, self._registration.fqdn, self._now())
            await self._io.submit(lambda: self._files.store(credentials))
        except CancelledError:
            raise
        except RegistrationRefused as e:
            self._refuse(e)
            return
        except Exception as e:
            refusal = refusal_at_start(e, self._signer.control_url)
            if refusal is not None and self.current is None:
                self._fail_waiting(refusal)
                return
            retry_after = e.retry_after if isinstance(e, SigningFailed) else None
            self.failures += 1
            delay = self._retry.delay(self.failures, self._draw(), retry_after)
            log = _log.warn if refusal is None else _log.error
            log(
                "server certificate request to {url} failed ({failures} in a row): {error};"
                " retrying in {delay:.0f}s",
                url=self._signer.control_url,
                failures=self.failures,
                error=str(e) if refusal is None else str(refusal),
                delay=delay,
            )
            self._schedule(delay)
            if self.current is not None:
                self._settle_registered()
            return
        self.failures = 0
        _log.info(
            "registered as {fqdn}; new server certificate valid until {not_after}",
            fqdn=self._registration.fqdn,
            not_after=credentials.cert.not_valid_after_utc.isoformat(),
        )
        self._install(credentials)
        self._settle_registered()

    def _settle_registered(self) -> None:
        self._registered = True
        waiting, self._registering = self._registering, []
        for d in waiting:
            d.callback(None)

    def _refuse(self, error: Exception) -> None:
        """
        The server may not serve: nothing is retried, every waiter fails
        (the start reports it; a refusal after the start, C{on_refused}).
        """
        self.refused = error
        waiting, self._waiting = self._waiting, []
        for credentials in waiting:
            credentials.errback(error)
        registering, self._registering = self._registering, []
        for done in registering:
            done.errback(error)
        if isinstance(error, RegistrationRefused):
            self._on_refused(error)

    def _fail_waiting(self, error: StartError) -> None:
        """No certificate, and none will come by retrying: the start fails."""
        self._start_refusal = error
        waiting, self._waiting = self._waiting, []
        for d in waiting:
            d.errback(error)

    def _install(self, credentials: ServerCredentials) -> None:
        previous = self.current
        if previous is not None and previous.root != credentials.root:
            _log.warn("the control plane delivered a different org root")
        self.current = credentials
        try:
            self._on_new_certificate(credentials.cert, credentials.key, credentials.root)
        except Exception:
            _log.failure("installing the new server certificate failed")
        waiting, self._waiting = self._waiting, []
        for d in waiting:
            d.callback(credentials)
        renew_at = renewal_time(credentials.cert).timestamp()
        self._schedule(max(0.0, renew_at - self._clock.seconds()))

    def _schedule(self, delay: float) -> None:
        if not self.running:
            return
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = self._clock.callLater(delay, lambda: self._run(self._attempt()))


class StaticServerCertificate(Service):
    """
    Fixed credentials from operator-given files, installed once at start
    and never renewed (the operator replaces the files and restarts).
    """

    def __init__(self, credentials: ServerCredentials, on_new_certificate: NewCertificate) -> None:
        self.current = credentials
        self._on_new_certificate = on_new_certificate

    def ready(self) -> Deferred[ServerCredentials]:
        """Fires at once with the credentials."""
        return succeed(self.current)

    def registered(self) -> Deferred[None]:
        """Fires at once: a server with given files registers nothing."""
        return succeed(None)

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        c = self.current
        self._on_new_certificate(c.cert, c.key, c.root)
