"""
Synchronous requests against a Klein (or any) resource through StubTreq, as
the HTTP tests of both planes make them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
from treq.testing import StubTreq
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource


@attrs.frozen
class Answer:
    """A response as the tests look at it."""

    status: int
    headers: Mapping[str, list[str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """The last value of header C{name} (case-insensitive), or None."""
        values = self.headers.get(name.lower())
        return values[-1] if values else None

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


def request(
    case: SynchronousTestCase,
    resource: Resource,
    method: str,
    path: str,
    *,
    headers: Mapping[str, str | list[str]] | None = None,
    body: bytes | None = None,
) -> Answer:
    """
    Make one request against C{resource} through StubTreq and return the
    finished response; fails the test if it does not finish synchronously.
    """
    stub: Any = StubTreq(resource)  # type: ignore[no-untyped-call]
    raw_headers = {
        name: value if isinstance(value, list) else [value]
        for name, value in (headers or {}).items()
    }
    d = stub.request(
        method,
        "http://control.test" + path,
        headers=raw_headers,
        data=body,
        allow_redirects=False,
    )
    stub.flush()
    response = case.successResultOf(d)
    content = case.successResultOf(stub.content(response))
    stub.flush()
    found: dict[str, list[str]] = {}
    for name, values in response.headers.getAllRawHeaders():
        found[name.decode("latin-1").lower()] = [v.decode("latin-1") for v in values]
    return Answer(status=response.code, headers=found, body=content)
