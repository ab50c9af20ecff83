"""
The OpenAPI 3.1 description of the provisioning surface, and the route that
serves it.

The document is C{svc/control/openapi.json}, checked in and maintained by
hand (spec "Versioning" rule 7: a machine-readable OpenAPI description covers
the provisioning surface the SDK uses). It ships as package data and is read
through L{importlib.resources}. C{svc/control/test/test_openapi.py} fails
when the document and the route declarations drift apart; what it covers and
how to check it: C{docs/specifications/openapi.md}.

L{OPENAPI_ROUTES} serves it publicly at C{GET /openapi.json} (and
C{/api/openapi.json}), on every configuration.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from svc.control.http import Call
from svc.control.routing import AuthKind, HandlerResult, Reply, Route

DOCUMENT_NAME = "openapi.json"
DOCUMENT_PATH = "/openapi.json"
MEDIA_TYPE = "application/json"

OUTSIDE_PROVISIONING_SURFACE = frozenset(
    {
        ("POST", "/control/sign-server-cert"),
        ("GET", "/control/cert-revocations"),
        ("GET", "/control/placement"),
        # The operator's fleet routes (svc.control.routes_fleet), for the svc command.
        ("GET", "/v1/admin/allocations"),
        ("POST", "/v1/admin/allocations/<id>/purge"),
        ("GET", "/v1/admin/servers"),
        ("POST", "/v1/admin/servers/<fqdn>/gc"),
    }
)
"""
Service-token routes the document leaves out on purpose: they serve
data-plane servers or the operator's C{svc} command, not the host SDK
(method and route path).
"""


@functools.cache
def openapi_document_bytes() -> bytes:
    """The document exactly as shipped (read once)."""
    return resources.files("svc.control").joinpath(DOCUMENT_NAME).read_bytes()


def openapi_document() -> dict[str, Any]:
    """The document, parsed (a fresh copy on each call)."""
    document: dict[str, Any] = json.loads(openapi_document_bytes())
    return document


async def serve_openapi(call: Call) -> HandlerResult:
    """C{GET /openapi.json}: the document, as C{application/json}."""
    return Reply.content(openapi_document_bytes(), MEDIA_TYPE)


OPENAPI_ROUTES = (Route("GET", DOCUMENT_PATH, AuthKind.PUBLIC, serve_openapi, api_alias=True),)
"""Always mounted (no features needed), public, also under C{/api}."""
