"""
What the data-plane server asks the control plane, with the service token
(C{docs/specifications/control-dataplane.md}, "Data plane → control
plane"):

  - L{ControlQueries.revocations}: C{GET /control/cert-revocations}, the
    active revocation set (pulled at start, L{svc.dataplane.revocations});
  - L{ControlQueries.placed}: C{GET /control/placement}, whether an agent
    identity is placed on this server (asked when one the pushes never
    named opens its storage, L{svc.dataplane.placements}).

Each call is bounded as a whole (request and answer body) by C{timeout}
seconds and its answer by L{MAX_ANSWER_BYTES}; every failure (no answer, a
status other than 200, an unusable body) is L{ControlQueryFailed}.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import urlencode

from twisted.internet.defer import Deferred

from svc.dataplane.http_control import parse_revocations
from svc.dataplane.servercert import DEFAULT_REQUEST_TIMEOUT, TimerClock
from svc.pki.identity import DenyList
from svc.store.layout import TenantLocation
from svc.web.clients import AnswerTooLarge, read_bounded
from svc.web.errors import InvalidRequest

REVOCATIONS_PATH = "/control/cert-revocations"
PLACEMENT_PATH = "/control/placement"
MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""The largest answer read (a revocation set of ~100k serials fits)."""


class ControlQueryFailed(Exception):
    """The control plane did not give a usable answer."""


class GetsJson(Protocol):
    """The part of C{treq.client.HTTPClient} (or C{StubTreq}) used here."""

    def get(self, url: str, *, headers: dict[bytes, list[bytes]]) -> Deferred[Any]:
        """Send a GET; fires with an C{IResponse}."""


class ControlQueries:
    """
    The calls, to C{control_url} with C{token}, as the server named C{fqdn}
    (its registration's name, which placements refer to).
    """

    def __init__(
        self,
        http: GetsJson,
        control_url: str,
        token: str,
        fqdn: str,
        clock: TimerClock,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ) -> None:
        self._http = http
        self._base = control_url.rstrip("/")
        self._token = token
        self._fqdn = fqdn
        self._clock = clock
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"<ControlQueries {self._base} as {self._fqdn}>"

    def revocations(self) -> Deferred[DenyList]:
        """
        The control plane's active revocation set (entries already expired
        by this server's clock dropped).
        """

        async def asking() -> DenyList:
            body = await self._get(REVOCATIONS_PATH, {})
            now = datetime.fromtimestamp(self._clock.seconds(), UTC)
            try:
                return parse_revocations(body, now).deny_list
            except InvalidRequest as e:
                raise ControlQueryFailed(f"unusable revocation set: {e.description}") from None

        return self._bounded(asking())

    def placed(self, location: TenantLocation, agent_id: str) -> Deferred[bool]:
        """Whether C{agent_id} of C{location} is placed on this server."""

        async def asking() -> bool:
            query = {
                "fqdn": self._fqdn,
                "owner": location.owner,
                "tenant": location.tenant,
                "agent_id": agent_id,
            }
            body = await self._get(PLACEMENT_PATH, query)
            placed = body.get("placed")
            if not isinstance(placed, bool):
                raise ControlQueryFailed("unusable placement answer: no boolean 'placed'")
            return placed

        return self._bounded(asking())

    def _bounded(self, work: Any) -> Deferred[Any]:
        call: Deferred[Any] = Deferred.fromCoroutine(work)
        call.addTimeout(self.timeout, self._clock)  # type: ignore[arg-type]
        call.addErrback(_no_answer)
        return call

    async def _get(self, path: str, query: Mapping[str, str]) -> dict[str, Any]:
        url = self._base + path + ("?" + urlencode(query) if query else "")
        headers = {
            b"Authorization": [b"Bearer " + self._token.encode("ascii")],
            b"Accept": [b"application/json"],
        }
        response = await self._http.get(url, headers=headers)
        try:
            content = await read_bounded(response, MAX_ANSWER_BYTES)
        except AnswerTooLarge as error:
            raise ControlQueryFailed(str(error)) from None
        if response.code != 200:
            raise ControlQueryFailed(f"{path}: status {response.code}: {_error(content)}")
        try:
            body = json.loads(content)
        except ValueError:
            raise ControlQueryFailed(f"{path}: the answer is not JSON") from None
        if not isinstance(body, dict):
            raise ControlQueryFailed(f"{path}: the answer is not a JSON object")
        return body


def _no_answer(failure: Any) -> Any:
    """Every failure but L{ControlQueryFailed} becomes one, naming the cause."""
    if isinstance(failure.value, ControlQueryFailed):
        return failure
    error = failure.value
    raise ControlQueryFailed(f"no answer: {type(error).__name__}: {error}")


def _error(content: bytes) -> str:
    try:
        error = json.loads(content).get("error_description") or json.loads(content).get("error")
    except (ValueError, AttributeError):
        return "no JSON error body"
    return str(error)
