"""
The control plane's client of the data-plane servers' C{/control/*} calls
(C{docs/specifications/control-dataplane.md}): revocation pushes, agent
purges, quota updates, usage queries and the tenant journal (page,
long-poll, owner revert; values in L{svc.control.dataplane_journal}), over
mutual TLS 1.3 with the control-plane certificate.

Three layers:

  - values and body codecs (L{DataPlaneTarget}, L{AgentGrant},
    L{AccountBudget}, L{PurgeResult}, L{OwnerUsage}, L{rfc3339}): pure;
  - L{ControlCredentials} and L{ControlCertificateKeeper}: the control
    certificate, issued by the CA at start and renewed once two thirds of its
    life has passed;
  - L{DataPlaneClient}: one method per call, over an injected HTTP client
    factory (L{mtls_http_client} in production, C{StubTreq} in tests).

Every failure of a call (connection, TLS, timeout, non-2xx status, malformed
answer) is one exception, L{DataPlaneCallFailed}; callers decide whether to
retry. A 4xx answer with an error body is its subclass L{DataPlaneRefused},
carrying the status and error code, so a caller can tell "the server said
no" (404, 403, 409) from "the server could not be asked".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import attrs
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from treq.client import HTTPClient
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.logger import Logger
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer  # type: ignore[import-untyped]

from svc.control.ca import AgentCAProvider, audit_signing, filesystem_ca
from svc.control.dataplane_journal import (
    JournalAnswer,
    JournalRequest,
    MalformedAnswer,
    RevertAnswer,
    parse_journal_answer,
    parse_revert_answer,
)
from svc.control.settings import ControlSettings, SecretsBackend
from svc.control.store.interface import ControlStore
from svc.control.store.values import CertificateKind, Revocation, Server
from svc.pki import names
from svc.pki.issuance import CertifiedKey
from svc.pki.tls import client_tls_options
from svc.web.errors import JsonValue
from svc.worker import IWorker

DEFAULT_CALL_TIMEOUT_SECONDS = 15.0
"""How long one control call may take before it counts as failed."""

GC_CALL_TIMEOUT_SECONDS = 900.0
"""How long a C{POST /control/gc} may take: a sweep of every tenant of a server."""

MAX_ANSWER_BYTES = 4 * 1024 * 1024
"""The largest JSON answer accepted from a data-plane server."""

_log = Logger()


def rfc3339(moment: datetime) -> str:
    """
    C{moment} as an RFC 3339 UTC string with a C{Z} suffix, to the second
    (the timestamp form of the control-plane API).
    """
    if moment.utcoffset() is None:
        raise ValueError("timestamps must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def revocations_body(
    revocations: Iterable[Revocation], generated_at: datetime
) -> dict[str, JsonValue]:
    """
    C{{"revocations": [{"serial", "not_after"}...], "generated_at"}}: the
    body of the C{PUT /control/cert-revocations} push, and of the answer to
    a server's C{GET /control/cert-revocations}.
    """
    entries: list[JsonValue] = [
        {"serial": r.serial, "not_after": rfc3339(r.not_after)} for r in revocations
    ]
    return {"revocations": entries, "generated_at": rfc3339(generated_at)}


@attrs.frozen
class DataPlaneTarget:
    """
    Where one data-plane server's HTTPS surface is: C{http_address}
    (C{host:port}) is dialled, C{fqdn} is the name its server leaf must carry.
    """

    fqdn: str
    http_address: str

    @property
    def base_url(self) -> str:
        """C{https://<http_address>}."""
        return f"https://{self.http_address}"


def target_for(server: Server) -> DataPlaneTarget:
    """
    The HTTPS target of a registered server: the C{http_addr} it registered
    with; a record from before migration 2 (no address stored) is reached at
    its frame address until the server re-registers.
    """
    http_address = server.http_address or server.address
    return DataPlaneTarget(fqdn=server.fqdn, http_address=http_address)


@attrs.frozen
class AgentGrant:
    """A quota update: one agent's grant (C{PUT /control/quotas})."""

    owner: str
    tenant: str
    agent_id: str
    grant_bytes: int

    @property
    def key(self) -> tuple[str, ...]:
        """Updates with the same key supersede each other."""
        return ("grant", self.owner, self.tenant, self.agent_id)

    def body(self) -> dict[str, object]:
        """The request body."""
        return {
            "owner": self.owner,
            "tenant": self.tenant,
            "agent_id": self.agent_id,
            "grant_bytes": self.grant_bytes,
        }


@attrs.frozen
class AccountBudget:
    """
    A quota update: the owner's account budget (L{None} lifts it), sent to
    the server of one of the owner's tenants.
    """

    owner: str
    tenant: str
    budget_bytes: int | None

    @property
    def key(self) -> tuple[str, ...]:
        """Updates with the same key supersede each other."""
        return ("budget", self.owner, self.tenant)

    def body(self) -> dict[str, object]:
        """The request body (no C{agent_id}, no C{grant_bytes})."""
        return {
            "owner": self.owner,
            "tenant": self.tenant,
            "account_budget_bytes": self.budget_bytes,
        }


QuotaUpdate = AgentGrant | AccountBudget


@attrs.frozen
class SessionFence:
    """
    An agent's mount lease was granted at C{epoch}: its server fences the
    agent's older sessions (C{PUT /control/session-epochs}).
    """

    owner: str
    tenant: str
    agent_id: str
    epoch: int

    @property
    def key(self) -> tuple[str, ...]:
        """Updates with the same key supersede each other (epochs only rise)."""
        return ("session", self.owner, self.tenant, self.agent_id)

    def body(self) -> dict[str, object]:
        """The request body."""
        return {
            "owner": self.owner,
            "tenant": self.tenant,
            "agent_id": self.agent_id,
            "epoch": self.epoch,
        }


ServerUpdate = AgentGrant | AccountBudget | SessionFence
"""What the push loop sends a tenant's server and retries until delivered."""


@attrs.frozen
class PurgeResult:
    """What C{POST /control/purge-agent} erased."""

    count: int
    bytes_freed: int


@attrs.frozen
class SweepResult:
    """What C{POST /control/gc} collected on one server (totals over its tenants)."""

    tenants: int
    count: int
    bytes_freed: int
    kept_young: int
    dry_run: bool


@attrs.frozen
class OwnerUsage:
    """
    C{GET /control/usage} of one server: the owner's account usage there and
    each agent's usage.
    """

    owner: str
    used_bytes: int
    agents: Mapping[str, int]


class DataPlaneCallFailed(Exception):
    """
    A control call to a data-plane server did not succeed (unreachable, TLS
    refused, timed out, non-2xx, or a malformed answer).
    """

    def __init__(self, target: DataPlaneTarget, call: str, reason: str) -> None:
        super().__init__(f"{call} on {target.fqdn} ({target.http_address}): {reason}")
        self.target = target
        self.call = call
        self.reason = reason


class DataPlaneRefused(DataPlaneCallFailed):
    """
    The data-plane server answered a 4xx with an error body
    C{{"error", "error_description"?}}: C{status}, C{error} and
    C{description} (empty when absent) as sent.
    """

    def __init__(
        self, target: DataPlaneTarget, call: str, status: int, error: str, description: str
    ) -> None:
        super().__init__(target, call, f"HTTP {status}")
        self.status = status
        self.error = error
        self.description = description


class ControlCertificateUnavailable(Exception):
    """
    The control certificate cannot be issued (yet): no org root exists, or
    the CA cannot issue it. Retried on the next round.
    """


@attrs.frozen
class ControlCredentials:
    """
    The control-plane certificate, its key (kept out of C{repr}) and the org
    root that is the only trust anchor for server leaves.
    """

    certificate: x509.Certificate
    key: Ed25519PrivateKey = attrs.field(repr=False)
    org_root: x509.Certificate

    @property
    def serial(self) -> str:
        """The certificate's canonical serial."""
        return names.format_serial(self.certificate.serial_number)

    @property
    def not_after(self) -> datetime:
        """When the certificate expires."""
        return self.certificate.not_valid_after_utc

    @property
    def renew_at(self) -> datetime:
        """When two thirds of the certificate's life has passed."""
        start = self.certificate.not_valid_before_utc
        return start + (self.not_after - start) * 2 / 3

    def client_options(self, server_fqdn: str) -> IOpenSSLClientConnectionCreator:
        """
        TLS 1.3 client options presenting this certificate, trusting only
        the org root, requiring a root-signed leaf naming C{server_fqdn}.
        """
        return client_tls_options(self.certificate, self.key, (), self.org_root, server_fqdn)


class ControlCertificateKeeper:
    """
    Holds the current L{ControlCredentials}; L{refresh} has a new certificate
    issued when there is none or two thirds of its life has passed.

    @param issue: issues a new control certificate at the given time (and
        records the signing event).
    @param now: the current time.
    """

    def __init__(
        self,
        issue: Callable[[datetime], Deferred[ControlCredentials]],
        now: Callable[[], datetime],
    ) -> None:
        self._issue = issue
        self._now = now
        self._current: ControlCredentials | None = None

    def current(self) -> ControlCredentials | None:
        """The credentials in use, L{None} before the first issue."""
        return self._current

    def due(self) -> bool:
        """Whether L{refresh} would issue a new certificate now."""
        return self._current is None or self._now() >= self._current.renew_at

    async def _refresh(self) -> ControlCredentials:
        if self._current is not None and not self.due():
            return self._current
        issued = await self._issue(self._now())
        if self._current is not None:
            _log.info(
                "control certificate renewed: serial {serial} until {not_after}",
                serial=issued.serial,
                not_after=rfc3339(issued.not_after),
            )
        self._current = issued
        return issued

    def refresh(self) -> Deferred[ControlCredentials]:
        """The current credentials, renewed first when due."""
        return Deferred.fromCoroutine(self._refresh())


class ControlCertificateIssuer:
    """
    Issues the control-plane certificate with the agent CA.

    The CA interface of L{svc.control.ca} has no control-certificate call
    yet; until it does, the filesystem CA is used directly (and the signing
    audited), and the in-database CA cannot issue it.
    """

    def __init__(
        self,
        provider: AgentCAProvider,
        settings: ControlSettings,
        store: ControlStore,
        worker: IWorker,
    ) -> None:
        self._provider = provider
        self._settings = settings
        self._store = store
        self._worker = worker

    def __call__(self, now: datetime) -> Deferred[ControlCredentials]:
        """New control credentials, issued at C{now}."""
        return Deferred.fromCoroutine(self._issue(now))

    async def _issue(self, now: datetime) -> ControlCredentials:
        ca = None if self._provider is None else await self._provider.get()
        if ca is None:
            raise ControlCertificateUnavailable("no org root yet (run 'svc ca init')")
        issue = getattr(ca, "issue_control_cert", None)
        if issue is not None:
            pair: CertifiedKey = await issue(now)
        elif self._settings.secrets_backend is SecretsBackend.FILESYSTEM:
            filesystem = filesystem_ca(self._settings)
            pair = await self._worker.submit(lambda: filesystem.issue_control_cert(now))
            await audit_signing(self._store, pair.cert, CertificateKind.CONTROL, now)
        else:
            raise ControlCertificateUnavailable(
                "the in-database CA cannot issue the control certificate"
            )
        return ControlCredentials(pair.cert, pair.key, ca.root)


HttpClientFactory = Callable[[DataPlaneTarget, ControlCredentials], Any]
"""Makes the HTTP client (the C{treq.client.HTTPClient} API) that reaches one target."""


@implementer(IPolicyForHTTPS)
class _ServerNamePolicy:
    """Connect with the control credentials, verifying the server as C{fqdn}."""

    def __init__(self, credentials: ControlCredentials, fqdn: str) -> None:
        self._credentials = credentials
        self._fqdn = fqdn

    def creatorForNetloc(self, hostname: bytes, port: int) -> IOpenSSLClientConnectionCreator:
        return self._credentials.client_options(self._fqdn)


def mtls_http_client(reactor: Any) -> HttpClientFactory:
    """
    The production factory: a treq client on C{reactor} over mutual TLS 1.3
    with the control credentials, checking the server leaf against the
    target's FQDN (not the dialled address), with no connection reuse.
    """

    def make(target: DataPlaneTarget, credentials: ControlCredentials) -> HTTPClient:
        policy = _ServerNamePolicy(credentials, target.fqdn)
        pool = HTTPConnectionPool(reactor, persistent=False)  # type: ignore[no-untyped-call]
        agent: Any = Agent(reactor, contextFactory=policy, pool=pool)  # type: ignore[no-untyped-call]
        return HTTPClient(agent)

    return make


class DataPlaneClient:
    """
    The control calls, each to one L{DataPlaneTarget}.

    @param credentials: the current control credentials.
    @param http_client: makes the HTTP client for a target.
    @param clock: schedules the call timeouts (the reactor).
    @param timeout: seconds one call may take.
    """

    def __init__(
        self,
        credentials: Callable[[], ControlCredentials | None],
        http_client: HttpClientFactory,
        clock: Any,
        timeout: float = DEFAULT_CALL_TIMEOUT_SECONDS,
    ) -> None:
        self._credentials = credentials
        self._http_client = http_client
        self._clock = clock
        self._timeout = timeout

    def put_revocations(
        self, target: DataPlaneTarget, revocations: Iterable[Revocation], generated_at: datetime
    ) -> Deferred[None]:
        """C{PUT /control/cert-revocations} with the full active set."""
        body = revocations_body(revocations, generated_at)
        return Deferred.fromCoroutine(
            self._no_answer(target, "PUT", "/control/cert-revocations", body)
        )

    def put_quotas(self, target: DataPlaneTarget, update: QuotaUpdate) -> Deferred[None]:
        """C{PUT /control/quotas} with one agent grant or account budget."""
        return Deferred.fromCoroutine(
            self._no_answer(target, "PUT", "/control/quotas", update.body())
        )

    def put_session_fence(self, target: DataPlaneTarget, fence: SessionFence) -> Deferred[None]:
        """C{PUT /control/session-epochs}: fence an agent's sessions older than an epoch."""
        return Deferred.fromCoroutine(
            self._no_answer(target, "PUT", "/control/session-epochs", fence.body())
        )

    def put_update(self, target: DataPlaneTarget, update: ServerUpdate) -> Deferred[None]:
        """L{put_session_fence} or L{put_quotas}, as C{update} is."""
        if isinstance(update, SessionFence):
            return self.put_session_fence(target, update)
        return self.put_quotas(target, update)

    def purge_agent(
        self, target: DataPlaneTarget, owner: str, tenant: str, agent_id: str
    ) -> Deferred[PurgeResult]:
        """C{POST /control/purge-agent}: erase one agent's subtree."""
        return Deferred.fromCoroutine(self._purge(target, owner, tenant, agent_id))

    def usage(self, target: DataPlaneTarget, owner: str) -> Deferred[OwnerUsage]:
        """C{GET /control/usage?owner=}: the owner's usage on one server."""
        return Deferred.fromCoroutine(self._usage(target, owner))

    def gc(self, target: DataPlaneTarget) -> Deferred[SweepResult]:
        """
        C{POST /control/gc}: one garbage-collection cycle over every tenant
        of the server, now (bounded by L{GC_CALL_TIMEOUT_SECONDS}).
        """
        return Deferred.fromCoroutine(self._gc(target))

    def journal(
        self, target: DataPlaneTarget, owner: str, tenant: str, query: JournalRequest
    ) -> Deferred[JournalAnswer]:
        """
        C{GET /control/journal}: one page of the tenant's journal. A
        long-poll (C{query.wait_seconds}) may take that long plus the normal
        call timeout.
        """
        return Deferred.fromCoroutine(self._journal(target, owner, tenant, query))

    def journal_revert(
        self, target: DataPlaneTarget, owner: str, tenant: str, path: str, seq: int, user_id: str
    ) -> Deferred[RevertAnswer]:
        """
        C{POST /control/journal/revert}: restore C{path} to its state before
        row C{seq}, written by C{owner:<user_id>}. Refusals are
        L{DataPlaneRefused} (404 C{not_found}, 403 C{access_denied}/
        C{disk_root}, 409 C{conflict}/C{chunks_collected}, 400).
        """
        body = {"owner": owner, "tenant": tenant, "path": path, "seq": seq, "user_id": user_id}
        return Deferred.fromCoroutine(self._journal_revert(target, body))

    async def _journal(
        self, target: DataPlaneTarget, owner: str, tenant: str, query: JournalRequest
    ) -> JournalAnswer:
        path = "/control/journal?" + urlencode(query.parameters(owner, tenant))
        timeout = query.wait_seconds + self._timeout
        answer = await self._call(target, "GET", path, None, timeout=timeout)
        try:
            return parse_journal_answer(answer)
        except MalformedAnswer as e:
            raise DataPlaneCallFailed(target, "GET /control/journal", str(e)) from None

    async def _journal_revert(
        self, target: DataPlaneTarget, body: Mapping[str, object]
    ) -> RevertAnswer:
        answer = await self._call(target, "POST", "/control/journal/revert", body)
        try:
            return parse_revert_answer(answer)
        except MalformedAnswer as e:
            raise DataPlaneCallFailed(target, "POST /control/journal/revert", str(e)) from None

    async def _purge(
        self, target: DataPlaneTarget, owner: str, tenant: str, agent_id: str
    ) -> PurgeResult:
        call = "POST /control/purge-agent"
        answer = await self._call(
            target,
            "POST",
            "/control/purge-agent",
            {"owner": owner, "tenant": tenant, "agent_id": agent_id},
        )
        if not isinstance(answer, dict):
            raise DataPlaneCallFailed(target, call, "answer is not a JSON object")
        return PurgeResult(
            count=_count(target, call, answer, "count"),
            bytes_freed=_count(target, call, answer, "bytes_freed"),
        )

    async def _usage(self, target: DataPlaneTarget, owner: str) -> OwnerUsage:
        call = "GET /control/usage"
        query = urlencode({"owner": owner})
        answer = await self._call(target, "GET", f"/control/usage?{query}", None)
        if not isinstance(answer, dict):
            raise DataPlaneCallFailed(target, call, "answer is not a JSON object")
        agents = answer.get("agents", {})
        if not isinstance(agents, dict):
            raise DataPlaneCallFailed(target, call, "agents is not an object")
        return OwnerUsage(
            owner=owner,
            used_bytes=_count(target, call, answer, "used_bytes"),
            agents={str(agent): _count(target, call, agents, agent) for agent in agents},
        )

    async def _gc(self, target: DataPlaneTarget) -> SweepResult:
        call = "POST /control/gc"
        answer = await self._call(
            target, "POST", "/control/gc", {}, timeout=GC_CALL_TIMEOUT_SECONDS
        )
        if not isinstance(answer, dict) or not isinstance(answer.get("dry_run"), bool):
            raise DataPlaneCallFailed(target, call, "answer is not a sweep report")
        return SweepResult(
            tenants=_count(target, call, answer, "tenants"),
            count=_count(target, call, answer, "count"),
            bytes_freed=_count(target, call, answer, "bytes_freed"),
            kept_young=_count(target, call, answer, "kept_young"),
            dry_run=bool(answer["dry_run"]),
        )

    async def _no_answer(
        self, target: DataPlaneTarget, method: str, path: str, body: object
    ) -> None:
        await self._call(target, method, path, body)

    async def _call(
        self,
        target: DataPlaneTarget,
        method: str,
        path: str,
        body: object | None,
        *,
        timeout: float | None = None,
    ) -> object:
        call = f"{method} {path.split('?', 1)[0]}"
        credentials = self._credentials()
        if credentials is None:
            raise DataPlaneCallFailed(target, call, "no control certificate yet")
        client = self._http_client(target, credentials)
        kwargs: dict[str, Any] = {
            "timeout": self._timeout if timeout is None else timeout,
            "reactor": self._clock,
        }
        if body is not None:
            kwargs["json"] = body
        try:
            response = await client.request(method, target.base_url + path, **kwargs)
            content = await response.content()
        except Exception as e:
            raise DataPlaneCallFailed(target, call, f"{type(e).__name__}: {e}") from e
        if 400 <= response.code < 500:
            _raise_refused(target, call, response.code, content)
        if not 200 <= response.code < 300:
            raise DataPlaneCallFailed(target, call, f"HTTP {response.code}")
        if response.code == 204 or not content:
            return None
        if len(content) > MAX_ANSWER_BYTES:
            raise DataPlaneCallFailed(target, call, "answer too large")
        try:
            return json.loads(content)
        except ValueError:
            raise DataPlaneCallFailed(target, call, "answer is not JSON") from None


def _raise_refused(target: DataPlaneTarget, call: str, status: int, content: bytes) -> None:
    """
    Raise L{DataPlaneRefused} when C{content} is an error body
    C{{"error": str, "error_description"?: str}}; otherwise return (the
    caller reports a plain L{DataPlaneCallFailed}).
    """
    if len(content) > MAX_ANSWER_BYTES:
        return
    try:
        body = json.loads(content)
    except ValueError:
        return
    if not isinstance(body, dict):
        return
    error = body.get("error")
    description = body.get("error_description", "")
    if isinstance(error, str) and error and isinstance(description, str):
        raise DataPlaneRefused(target, call, status, error, description)


def _count(target: DataPlaneTarget, call: str, answer: Mapping[str, object], field: str) -> int:
    value = answer.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DataPlaneCallFailed(target, call, f"{field} is not a non-negative integer")
    return value
