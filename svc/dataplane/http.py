"""
The data-plane server's HTTPS surface: a small Klein application.

Routes (C{docs/specifications/dataplane-http.md}):

  - C{GET /healthz}, C{GET /readyz}, C{GET /metrics}: no client
    certificate needed (C{/metrics} not here when the server has an
    operator listener: L{svc.dataplane.http_operator});
  - C{GET /audit}: an agent certificate; the newest audit records of that
    agent in that tenant;
  - C{PUT /control/cert-revocations}, C{POST /control/purge-agent},
    C{PUT /control/quotas}, C{PUT /control/session-epochs},
    C{GET /control/usage}, C{GET /control/journal},
    C{POST /control/journal/revert}, C{POST /control/gc}: the control-plane
    certificate
    (C{docs/specifications/control-dataplane.md}).

The caller is identified on every request from the TLS-verified chain
(L{svc.dataplane.http_auth}); unit tests inject C{verified_chain}. Errors
become C{{error, error_description}} bodies in one place,
L{DataPlaneHttp.render_failure}, which also writes the C{http_auth} audit
line for a missing (401) or unacceptable (403) certificate.

Use::

    http = DataPlaneHttp(engine=..., registry=..., ...)
    site = Site(http.resource())   # on a listener with http_tls_options(...)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import werkzeug.exceptions
from cryptography import x509
from klein import Klein
from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import IResource
from twisted.web.server import Request

from svc.audit.events import AuditEvent, CertFields
from svc.audit.server_events import (
    agent_data_purged_event,
    http_auth_event,
    http_get_audit_event,
    owner_journal_revert_event,
)
from svc.dataplane.change_notices import ChangeNotice, owner_revert_notice
from svc.dataplane.http_audit import (
    BLOCK_SIZE,
    MAX_SCAN_BYTES,
    AuditScope,
    parse_audit_query,
    read_audit_records,
)
from svc.dataplane.http_auth import (
    AuthenticationFailure,
    Caller,
    identify_caller,
    require_agent,
    require_control,
    tls_verified_chain,
)
from svc.dataplane.http_control import (
    owner_usage,
    parse_purge,
    parse_quotas,
    parse_revocations,
    parse_session_fence,
    parse_usage_owner,
    purge_agent,
    sweep_answer,
)
from svc.dataplane.http_journal import (
    OwnerRevert,
    check_not_disk_root,
    parse_journal_listing,
    parse_owner_revert,
    present_tenant,
    read_journal,
    revert_answer,
    revert_as_owner,
)
from svc.dataplane.http_operator import metrics_exposition, readiness_answer
from svc.dataplane.placements import Placements
from svc.metrics import DataPlaneMetrics
from svc.pki.identity import DenyList
from svc.store.engine import EngineClock, StorageEngine
from svc.store.gc import SweepReport
from svc.store.journal import RevertResult
from svc.store.layout import TenantLocation
from svc.store.tenant import TenantStorage
from svc.web.errors import (
    ApiError,
    InvalidRequest,
    JsonValue,
    MethodNotAllowed,
    NotFound,
    ServerError,
    render_json,
)
from svc.web.readiness import ReadinessProbe
from svc.web.rules import (
    BODY_REQUIRED,
    check_declared_length,
    check_json_content_type,
    parse_json_object,
)
from svc.worker import IWorker

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
"""Largest C{/control/*} request body (a revocation set of ~100k serials)."""

JSON_CONTENT_TYPE = b"application/json"


class DataPlaneHttp:
    """
    The Klein application of one data-plane server; state lives on the
    instance.

    @param engine: the tenants' storage (purge, quotas, usage).
    @param registry: the Prometheus registry served at C{/metrics}.
    @param audit_log: the server's audit JSONL file, read by C{/audit}.
    @param emit: writes one audit line (the server's audit sink).
    @param current_deny_list: the deny-list in force (the data-plane
        service's C{deny_list}).
    @param merge_deny_list: merges a pushed revocation set into the
        deny-list in force (L{svc.dataplane.revocations.Revocations.merge},
        which installs the result, closing denied connections, and keeps it
        on disk); may return a Deferred, awaited before the push is
        answered.
    @param org_root: the only trust anchor for client certificates; see
        L{use_org_root}.
    @param trust_domain: the SPIFFE trust domain of agent and control certs.
    @param now: the current time in seconds since the epoch (audit line
        times, certificate expiry).
    @param io: runs blocking reads (the audit log, directory scans).
    @param verified_chain: the request's TLS-verified peer chain.
    @param clock: times the C{/control/journal} long-poll (the reactor;
        L{None}: the global reactor, for callers built before this
        parameter existed).
    @param metrics: counts owner reverts (C{svc_journal_revert_total},
        C{svc_journal_writes_total}) and times journal queries; L{None}:
        not counted.
    @param announce: told of each successful owner revert (the data-plane
        service's C{announce}, which pushes C{changed} to the agent's
        connections); by default nobody is told.
    @param placements: the identities placed on this server (the data-plane
        service's): an agent grant push records its agent as placed, a purge
        removes it. L{None}: nothing is recorded.
    @param serve_metrics: serve C{/metrics} (off when the operator listener
        serves it instead: then 404 here).
    @param readiness: the checks C{/readyz} runs (L{None}: 404).
    @param sweep: runs one garbage-collection cycle now, or joins the one
        running (the GC loop's C{sweep_now}); L{None}: C{/control/gc} is 404.
    @param fence: fences an agent's mount sessions older than an epoch
        (the data-plane service's C{fence_sessions}); by default nothing.
    """

    app = Klein()
    _log = Logger()

    def __init__(
        self,
        *,
        engine: StorageEngine,
        registry: CollectorRegistry,
        audit_log: Path,
        emit: Callable[[AuditEvent], object],
        current_deny_list: Callable[[], DenyList],
        merge_deny_list: Callable[[DenyList], object],
        org_root: x509.Certificate,
        trust_domain: str,
        now: Callable[[], float],
        io: IWorker,
        verified_chain: Callable[[Request], Sequence[x509.Certificate]] = tls_verified_chain,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        audit_block_size: int = BLOCK_SIZE,
        audit_max_scan_bytes: int = MAX_SCAN_BYTES,
        clock: EngineClock,
        metrics: DataPlaneMetrics | None = None,
        announce: Callable[[ChangeNotice], object] = lambda notice: None,
        placements: Placements | None = None,
        serve_metrics: bool = True,
        readiness: ReadinessProbe | None = None,
        sweep: Callable[[], Deferred[list[SweepReport]]] | None = None,
        fence: Callable[[TenantLocation, str, int], object] = lambda location, agent, epoch: None,
    ) -> None:
        self._engine = engine
        self._fence = fence
        self._registry = registry
        self._audit_log = audit_log
        self._emit = emit
        self._current_deny_list = current_deny_list
        self._merge_deny_list = merge_deny_list
        self._org_root = org_root
        self._trust_domain = trust_domain
        self._seconds = now
        self._io = io
        self._verified_chain = verified_chain
        self._max_body_bytes = max_body_bytes
        self._audit_block_size = audit_block_size
        self._audit_max_scan_bytes = audit_max_scan_bytes
        self._clock = clock
        self._metrics = metrics
        self._announce = announce
        self._placements = placements
        self._serve_metrics = serve_metrics
        self._readiness = readiness
        self._sweep = sweep

    def resource(self) -> IResource:
        """The Twisted resource to serve (wrap in a C{Site})."""
        return cast(IResource, self.app.resource())

    def use_org_root(self, root: x509.Certificate) -> None:
        """
        Judge client certificates against C{root} from now on (after a
        server-certificate renewal delivered a new org root; the listener's
        TLS options must be rebuilt with it too).
        """
        self._org_root = root

    # Helpers

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._seconds(), UTC)

    def _caller(self, request: Request) -> Caller:
        return identify_caller(
            self._verified_chain(request),
            self._org_root,
            self._trust_domain,
            self._current_deny_list(),
            self._now(),
        )

    def _json_body(self, request: Request) -> dict[str, JsonValue]:
        check_declared_length(request.getHeader(b"content-length"), self._max_body_bytes)
        check_json_content_type(request.getHeader(b"content-type"))
        content = request.content
        body = b"" if content is None else content.read(self._max_body_bytes + 1)
        if not body:
            raise InvalidRequest(BODY_REQUIRED)
        return parse_json_object(body, self._max_body_bytes)

    # Unauthenticated routes

    @app.route("/healthz", methods=["GET"])
    def healthz(self, request: Request) -> bytes:
        """C{{"status": "ok"}}."""
        return _json(request, {"status": "ok"})

    @app.route("/readyz", methods=["GET"])
    async def readyz(self, request: Request) -> bytes:
        """200 when every readiness check passes, else 503 naming the failing ones."""
        if self._readiness is None:
            raise NotFound()
        return await readiness_answer(request, self._readiness)

    @app.route("/metrics", methods=["GET"])
    def metrics(self, request: Request) -> bytes:
        """The Prometheus text exposition of the registry (unless the operator listener has it)."""
        if not self._serve_metrics:
            raise NotFound()
        return metrics_exposition(request, self._registry)

    # Agent routes

    @app.route("/audit", methods=["GET"])
    async def audit(self, request: Request) -> bytes:
        """The caller's newest audit records, oldest first."""
        identity = require_agent(self._caller(request))
        query = parse_audit_query(request.args or {})
        scope = AuditScope.of_agent(identity)
        path = self._audit_log
        block_size = self._audit_block_size
        max_scan = self._audit_max_scan_bytes
        records = await self._io.submit(
            lambda: read_audit_records(
                path, scope, query, block_size=block_size, max_scan_bytes=max_scan
            )
        )
        self._emit(
            http_get_audit_event(
                ts=self._seconds(), cert=CertFields.of_agent(identity), records=len(records)
            )
        )
        _set_header(request, b"Cache-Control", b"no-store")
        body: list[JsonValue] = list(records)  # type: ignore[arg-type]
        return _json(request, {"records": body})

    # Control-plane routes

    @app.route("/control/cert-revocations", methods=["PUT"])
    async def cert_revocations(self, request: Request) -> bytes:
        """Merge the pushed revocation set into the deny-list (kept on disk first)."""
        require_control(self._caller(request))
        push = parse_revocations(self._json_body(request), self._now())
        merged = self._merge_deny_list(push.deny_list)
        if isinstance(merged, Deferred):
            await merged
        return _no_content(request)

    @app.route("/control/purge-agent", methods=["POST"])
    async def purge(self, request: Request) -> bytes:
        """Erase one agent's subtree; answers what was deleted."""
        control = require_control(self._caller(request))
        purge = parse_purge(self._json_body(request))
        report = await purge_agent(self._engine, self._io, purge)
        if self._placements is not None:
            await self._placements.forget(purge.location, purge.agent_id)
        self._emit(
            agent_data_purged_event(
                ts=self._seconds(),
                tenant_id=purge.location.tenant,
                agent_id=purge.agent_id,
                count=report.count,
                bytes_freed=report.bytes_freed,
                caller=CertFields.of_control(control),
            )
        )
        return _json(request, {"count": report.count, "bytes_freed": report.bytes_freed})

    @app.route("/control/quotas", methods=["PUT"])
    async def quotas(self, request: Request) -> bytes:
        """
        Set an agent's grant and/or an owner's account budget; a grant
        also records its agent as placed on this server.
        """
        require_control(self._caller(request))
        change = parse_quotas(self._json_body(request))
        if change.grant is not None:
            grant = change.grant
            if self._placements is not None:
                await self._placements.place(grant.location, grant.agent_id)
            await self._engine.set_agent_grant(grant.location, grant.agent_id, grant.grant_bytes)
        if change.budget is not None:
            await self._engine.set_account_budget(change.budget.owner, change.budget.budget_bytes)
        return _no_content(request)

    @app.route("/control/session-epochs", methods=["PUT"])
    async def session_epochs(self, request: Request) -> bytes:
        """
        An agent's mount lease was granted at an epoch: fence its older
        sessions (kept on disk first) and tell its live connections.
        """
        require_control(self._caller(request))
        fence = parse_session_fence(self._json_body(request))
        fenced = self._fence(fence.location, fence.agent_id, fence.epoch)
        if isinstance(fenced, Deferred):
            await fenced
        return _no_content(request)

    @app.route("/control/usage", methods=["GET"])
    async def usage(self, request: Request) -> bytes:
        """An owner's account usage and per-agent usage on this server."""
        require_control(self._caller(request))
        owner = parse_usage_owner(request.args or {})
        return _json(request, await owner_usage(self._engine, self._io, owner))

    @app.route("/control/journal", methods=["GET"])
    async def journal(self, request: Request) -> bytes:
        """A page of a tenant's journal; with C{wait}, a long-poll for new rows."""
        require_control(self._caller(request))
        listing = parse_journal_listing(request.args or {})
        storage = await present_tenant(self._engine, self._io, listing.location)
        metrics = self._metrics
        answer = await read_journal(
            storage,
            listing,
            self._clock,
            request.notifyFinish,
            observe=(lambda s: None) if metrics is None else metrics.observe_journal_query,
        )
        _set_header(request, b"Cache-Control", b"no-store")
        return _json(request, answer)

    @app.route("/control/journal/revert", methods=["POST"])
    async def journal_revert(self, request: Request) -> bytes:
        """Revert a path to its state before a journal row, as the owner."""
        control = require_control(self._caller(request))
        revert = parse_owner_revert(self._json_body(request))
        caller = CertFields.of_control(control)
        try:
            check_not_disk_root(revert.path)
            storage = await present_tenant(self._engine, self._io, revert.location)
            result = await self._counted_revert(storage, revert)
        except Exception:
            self._emit(
                owner_journal_revert_event(
                    ts=self._seconds(),
                    tenant_id=revert.location.tenant,
                    allowed=False,
                    caller=caller,
                )
            )
            raise
        self._announce_revert(revert)
        self._emit(
            owner_journal_revert_event(
                ts=self._seconds(), tenant_id=revert.location.tenant, allowed=True, caller=caller
            )
        )
        return _json(request, revert_answer(result))

    @app.route("/control/gc", methods=["POST"])
    async def gc(self, request: Request) -> bytes:
        """Run one garbage-collection cycle over every tenant now; answers its totals."""
        require_control(self._caller(request))
        if self._sweep is None:
            raise NotFound()
        reports = await self._sweep()
        _set_header(request, b"Cache-Control", b"no-store")
        return _json(request, sweep_answer(reports))

    def _announce_revert(self, revert: OwnerRevert) -> None:
        # The revert has committed: a failure to tell the agent must not fail it.
        try:
            self._announce(owner_revert_notice(revert.location, revert.path))
        except Exception:
            self._log.failure("announcing the owner's revert of {path} failed", path=revert.path)

    async def _counted_revert(self, storage: TenantStorage, revert: OwnerRevert) -> RevertResult:
        metrics = self._metrics
        try:
            result = await revert_as_owner(storage, revert)
        except Exception:
            if metrics is not None:
                metrics.count_journal_revert(revert.allocation, "error")
            raise
        if metrics is not None:
            outcome = "noop" if result.journal_seq is None else "reverted"
            metrics.count_journal_revert(revert.allocation, outcome)
            if result.journal_seq is not None:
                metrics.count_journal_write("revert", revert.allocation)
        return result

    # Errors

    @app.handle_errors
    def render_failure(  # type: ignore[misc]
        self, request: Request, failure: Failure
    ) -> bytes:
        """
        The one translation of a failure into a response: an L{ApiError}
        as itself, Klein's routing errors as 404/405, anything else as a
        logged 500. An authentication failure also writes C{http_auth}.
        """
        error = _api_error_for(failure)
        if isinstance(failure.value, AuthenticationFailure):
            self._emit(http_auth_event(ts=self._seconds(), request_path=_target(request)))
        if isinstance(error, ServerError):
            self._log.failure(
                "unhandled error in {method} {path}",
                failure,
                method=_latin1(request.method),
                path=_latin1(request.path),
            )
        request.setResponseCode(error.status)
        for name, value in error.headers.items():
            _set_header(request, name.encode("latin-1"), value.encode("latin-1"))
        _set_header(request, b"Content-Type", JSON_CONTENT_TYPE)
        return error.body_bytes()


def _api_error_for(failure: Failure) -> ApiError:
    value = failure.value
    if isinstance(value, ApiError):
        return value
    if isinstance(value, werkzeug.exceptions.MethodNotAllowed):
        return MethodNotAllowed(list(value.valid_methods or []))
    if isinstance(value, werkzeug.exceptions.NotFound):
        return NotFound()
    if isinstance(value, werkzeug.exceptions.HTTPException) and 400 <= (value.code or 0) < 500:
        return InvalidRequest()
    return ServerError()


def _set_header(request: Request, name: bytes, value: bytes) -> None:
    request.responseHeaders.setRawHeaders(name, [value])


def _json(request: Request, body: JsonValue) -> bytes:
    _set_header(request, b"Content-Type", JSON_CONTENT_TYPE)
    return render_json(body)


def _no_content(request: Request) -> bytes:
    request.setResponseCode(204)
    return b""


def _latin1(value: bytes | None) -> str:
    return "" if value is None else value.decode("latin-1")


def _target(request: Any) -> str:
    """The request path plus query, as sent (for C{http_auth})."""
    uri = getattr(request, "uri", None)
    return uri.decode("utf-8", "replace") if isinstance(uri, bytes) else ""
