"""
C{GET /v1/whoami}: echo the verified host identity (mounting rule 5: only
when C{SVC_IDENTITY_AUDIENCE} is set; also under C{/api}).
"""

from __future__ import annotations

from svc.control.hostjwt import HostIdentity
from svc.control.http import Call
from svc.control.routing import AuthKind, Feature, HandlerResult, Route


async def whoami(call: Call) -> HandlerResult:
    """
    C{{tenant_id, subject}} of the verified host JWT.
    """
    identity = call.principal_as(HostIdentity)
    return {"tenant_id": identity.tenant_id, "subject": identity.subject}


WHOAMI_ROUTES = (
    Route(
        "GET",
        "/v1/whoami",
        AuthKind.HOST_JWT,
        whoami,
        mounted_with={Feature.HOST_IDENTITY},
        api_alias=True,
    ),
)
