"""
The mount client's calls to the control plane: enrollment, leaf renewal and
the allocation's mount lease (C{docs/specifications/enrollment.md},
C{docs/specifications/control-routes.md}).

The mount talks plain HTTP(S) to the control plane, not mutual TLS, so every
agent-identity call (C{/agent/renew}, C{/allocations/{id}/mount*}) is a
B{signed request}: the JSON body carries the leaf (C{client_cert_pem}), its
chain (C{ca_chain_pem}), C{proof_timestamp_ms} and C{proof_signature}, the
base64url ed25519 signature by the leaf's key of::

    svc-agent-proof-v1\\n<METHOD>\\n<route path>\\n<leaf serial>\\n<timestamp_ms>

The server accepts each signature once, so this client never signs the same
request twice with one timestamp (it moves its timestamp on by a millisecond
when the clock has not).

Every answer other than 2xx raises L{ControlPlaneError} (or the subclass
for its code); a 2xx answer that is not what the route promises raises
L{InvalidResponse}; a connection that fails raises L{Unreachable}.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import attrs
from twisted.internet import error as neterror
from twisted.logger import Logger
from twisted.web.client import (
    RequestTransmissionFailed,
    ResponseFailed,
    ResponseNeverReceived,
)
from twisted.web.error import SchemeNotSupported

from svc.mount.control.credentials import AgentCredentials, CredentialsError
from svc.web.clients import AnswerTooLarge, control_plane_http_client, read_bounded

__all__ = [
    "AlreadyMounted",
    "ControlPlaneError",
    "InvalidResponse",
    "LeaseLive",
    "LeaseLost",
    "MountControlClient",
    "MountLease",
    "RateLimited",
    "RetryLater",
    "Revoked",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
]

API_VERSION = "1"
PROOF_CONTEXT = "svc-agent-proof-v1"
DEFAULT_TIMEOUT = 30.0
MAX_ANSWER_BYTES = 1024 * 1024

_log = Logger()


@attrs.frozen
class MountLease:
    """
    A granted or refreshed mount lease.

    @ivar session_id: the mount session, sent with every data-plane write;
        kept across refreshes and renewals.
    @ivar server_addr: the tenant's data-plane server (acquisition only).
    """

    allocation_id: str
    session_id: str
    bound_at: datetime
    lease_expires_at: datetime
    ttl_seconds: int
    server_addr: str | None = None


class ControlPlaneError(Exception):
    """
    The control plane refused a call.

    @ivar status: the HTTP status (0 when no answer came).
    @ivar code: the body's C{error} (C{http_<status>} without one).
    @ivar description: the body's C{error_description} (may be empty).
    @ivar body: the parsed error body (empty when it was not a JSON object).
    """

    def __init__(
        self,
        status: int,
        code: str,
        description: str = "",
        body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(status, code, description)
        self.status = status
        self.code = code
        self.description = description
        self.body: Mapping[str, Any] = {} if body is None else body

    def __str__(self) -> str:
        text = f"{self.status} {self.code}"
        return f"{text}: {self.description}" if self.description else text


class LeaseLive(ControlPlaneError):
    """409 C{lease_live}: another enrollment holds a live lease (C{force} takes it)."""

    def __init__(
        self,
        status: int,
        code: str,
        description: str = "",
        body: Mapping[str, Any] | None = None,
        *,
        bound_at: datetime | None = None,
        lease_expires_at: datetime | None = None,
    ) -> None:
        super().__init__(status, code, description, body)
        self.bound_at = bound_at
        self.lease_expires_at = lease_expires_at


class AlreadyMounted(LeaseLive):
    """
    409 C{already_mounted}: this very leaf holds a live lease (a restarted
    mount reusing its leaf); C{force} re-grants it with a new session.
    """


class LeaseLost(ControlPlaneError):
    """410 C{lease_lost}: the caller no longer holds the lease."""


class Revoked(ControlPlaneError):
    """410 C{revoked}: the allocation is revoked."""


class Unauthorized(ControlPlaneError):
    """401: the enroll token or the leaf is not (or no longer) accepted."""


class RetryLater(ControlPlaneError):
    """A transient refusal: retry, not sooner than C{retry_after} seconds when given."""

    def __init__(
        self,
        status: int,
        code: str,
        description: str = "",
        body: Mapping[str, Any] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status, code, description, body)
        self.retry_after = retry_after


class RateLimited(RetryLater):
    """429 C{rate_limited}."""


class Unavailable(RetryLater):
    """503 C{temporarily_unavailable} (CA or placement not ready, ...), or no answer."""


class Unreachable(Unavailable):
    """No answer: the connection failed or timed out (C{status} 0)."""


class InvalidResponse(ControlPlaneError):
    """A 2xx answer that is not what the route promises (C{code} C{invalid_response})."""


_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    neterror.ConnectError,
    neterror.DNSLookupError,
    neterror.ConnectionClosed,
    neterror.TimeoutError,
    neterror.ConnectingCancelledError,
    neterror.SSLError,
    ResponseFailed,
    ResponseNeverReceived,
    RequestTransmissionFailed,
    SchemeNotSupported,
)


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment.astimezone(UTC) if moment.tzinfo is not None else None


def _retry_after(headers: Any) -> float | None:
    values = headers.getRawHeaders(b"retry-after") or []
    if not values:
        return None
    try:
        seconds = int(values[-1].decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return float(seconds) if seconds >= 0 else None


def error_for(status: int, body: Mapping[str, Any], headers: Any) -> ControlPlaneError:
    """The exception for a non-2xx answer."""
    code = body.get("error")
    if not isinstance(code, str) or not code:
        code = f"http_{status}"
    description = body.get("error_description")
    if not isinstance(description, str):
        description = ""
    if status == 409 and code in ("lease_live", "already_mounted"):
        kind = AlreadyMounted if code == "already_mounted" else LeaseLive
        return kind(
            status,
            code,
            description,
            body,
            bound_at=_parse_time(body.get("bound_at")),
            lease_expires_at=_parse_time(body.get("lease_expires_at")),
        )
    if status == 410 and code == "lease_lost":
        return LeaseLost(status, code, description, body)
    if status == 410 and code == "revoked":
        return Revoked(status, code, description, body)
    if status == 401:
        return Unauthorized(status, code, description, body)
    if status == 429:
        return RateLimited(status, code, description, body, retry_after=_retry_after(headers))
    if status == 503:
        return Unavailable(status, code, description, body, retry_after=_retry_after(headers))
    return ControlPlaneError(status, code, description, body)


def proof_message(method: str, path: str, serial: str, timestamp_ms: int) -> bytes:
    """The bytes a signed request's C{proof_signature} signs."""
    return f"{PROOF_CONTEXT}\n{method.upper()}\n{path}\n{serial}\n{timestamp_ms}".encode()


class MountControlClient:
    """
    The control-plane calls of one mount.

    @param reactor: supplies the clock (the proof timestamps) and the
        request timeouts.
    @param base_url: the control plane, e.g. C{https://control.example}
        (C{http://} for a local development stack).
    @param ca_file: PEM anchors HTTPS trusts (C{SVC_CA_FILE}); without, the
        system store. Ignored when C{http} is given.
    @param http: a treq-style client (C{request(method, url, ...)}); by
        default one over the real reactor.
    """

    def __init__(
        self,
        reactor: Any,
        base_url: str,
        *,
        ca_file: Path | None = None,
        http: Any = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if http is None:
            http = control_plane_http_client(reactor, ca_file)
        self._reactor = reactor
        self._base = base_url.rstrip("/")
        self._http = http
        self._timeout = timeout
        self._last_proof_ms = 0

    def __repr__(self) -> str:
        return f"<MountControlClient {self._base}>"

    async def enroll(self, enroll_token: str) -> AgentCredentials:
        """C{POST /agent/enroll}: spend C{enroll_token} for a leaf."""
        headers = {b"Authorization": [f"Bearer {enroll_token}".encode("ascii")]}
        status, body = await self._call("POST", "/agent/enroll", None, headers)
        return self._credentials(status, body)

    async def renew(self, creds: AgentCredentials) -> AgentCredentials:
        """
        C{POST /agent/renew}: a new leaf (and key) for a live one; a lease
        the old leaf holds moves to the new one.
        """
        status, body = await self._signed("POST", "/agent/renew", creds)
        return self._credentials(status, body)

    async def acquire_mount(self, creds: AgentCredentials, *, force: bool = False) -> MountLease:
        """
        C{POST /allocations/{id}/mount}: take the allocation's lease.

        @raise LeaseLive: another enrollment holds it (retry with C{force}).
        @raise AlreadyMounted: this leaf already holds it.
        """
        path = self._mount_path(creds)
        status, body = await self._signed("POST", path, creds, {"force": force})
        return self._lease(status, body)

    async def refresh_mount(self, creds: AgentCredentials) -> MountLease:
        """
        C{POST /allocations/{id}/mount/refresh}: extend the lease.

        @raise LeaseLost: the lease was taken over, released or never held.
        """
        status, body = await self._signed("POST", self._mount_path(creds) + "/refresh", creds)
        return self._lease(status, body)

    async def release_mount(self, creds: AgentCredentials) -> None:
        """C{DELETE /allocations/{id}/mount}: give the lease up (the leaf is revoked)."""
        await self._signed("DELETE", self._mount_path(creds), creds)

    def _mount_path(self, creds: AgentCredentials) -> str:
        return f"/allocations/{quote(creds.allocation_id, safe='')}/mount"

    def _proof_timestamp_ms(self) -> int:
        now_ms = int(self._reactor.seconds() * 1000)
        self._last_proof_ms = max(now_ms, self._last_proof_ms + 1)
        return self._last_proof_ms

    async def _signed(
        self,
        method: str,
        path: str,
        creds: AgentCredentials,
        extra: Mapping[str, Any] | None = None,
    ) -> tuple[int, Any]:
        timestamp_ms = self._proof_timestamp_ms()
        signature = creds.key().sign(proof_message(method, path, creds.serial, timestamp_ms))
        body: dict[str, Any] = {
            **(extra or {}),
            "client_cert_pem": creds.leaf_pem.decode("ascii"),
            "ca_chain_pem": creds.chain_pem.decode("ascii"),
            "proof_timestamp_ms": timestamp_ms,
            "proof_signature": base64.urlsafe_b64encode(signature).rstrip(b"=").decode("ascii"),
        }
        return await self._call(method, path, body)

    async def _call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None,
        headers: Mapping[bytes, list[bytes]] | None = None,
    ) -> tuple[int, Any]:
        all_headers: dict[bytes, list[bytes]] = {
            b"Svc-API-Version": [API_VERSION.encode("ascii")],
            b"Accept": [b"application/json"],
            **(headers or {}),
        }
        data: bytes | None = None
        if body is not None:
            all_headers[b"Content-Type"] = [b"application/json"]
            data = json.dumps(body).encode("utf-8")
        url = self._base + path
        try:
            response = await self._http.request(
                method,
                url,
                headers=all_headers,
                data=data,
                timeout=self._timeout,
                reactor=self._reactor,
                allow_redirects=False,
            )
            try:
                raw = await read_bounded(response, MAX_ANSWER_BYTES)
            except AnswerTooLarge:
                raise InvalidResponse(
                    response.code, "invalid_response", "the answer is too large"
                ) from None
        except _TRANSPORT_ERRORS as e:
            _log.info("control plane {method} {path} failed: {e}", method=method, path=path, e=e)
            raise Unreachable(0, "unreachable", str(e) or type(e).__name__) from e
        status: int = response.code
        parsed: Any = None
        if raw:
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
        if not 200 <= status < 300:
            error = error_for(status, parsed if isinstance(parsed, dict) else {}, response.headers)
            _log.info(
                "control plane {method} {path} refused: {error}",
                method=method,
                path=path,
                error=str(error),
            )
            raise error
        return status, parsed

    def _credentials(self, status: int, body: Any) -> AgentCredentials:
        if not isinstance(body, dict):
            raise InvalidResponse(status, "invalid_response", "the answer is not a JSON object")
        try:
            return AgentCredentials.from_enrollment(body)
        except CredentialsError as e:
            raise InvalidResponse(status, "invalid_response", str(e)) from None

    def _lease(self, status: int, body: Any) -> MountLease:
        if not isinstance(body, dict):
            raise InvalidResponse(status, "invalid_response", "the answer is not a JSON object")
        allocation_id = body.get("allocation_id")
        session_id = body.get("session_id")
        bound_at = _parse_time(body.get("bound_at"))
        expires = _parse_time(body.get("lease_expires_at"))
        ttl = body.get("ttl_seconds")
        server_addr = body.get("server_addr")
        if (
            not isinstance(allocation_id, str)
            or not isinstance(session_id, str)
            or not session_id
            or bound_at is None
            or expires is None
            or isinstance(ttl, bool)
            or not isinstance(ttl, int)
            or not (server_addr is None or isinstance(server_addr, str))
        ):
            raise InvalidResponse(status, "invalid_response", "not a mount lease")
        return MountLease(allocation_id, session_id, bound_at, expires, ttl, server_addr)
