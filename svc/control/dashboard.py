"""
The owner dashboard: one static page and its script and stylesheet, served
by the control plane.

  - C{GET /dashboard}: the page (C{index.html});
  - C{GET /dashboard/app.js}: the script that drives it;
  - C{GET /dashboard/app.css}: its stylesheet.

The routes are public (the page holds no data; everything it shows it fetches
with the admin session cookie from the owner routes), mounted only with the
database (mounting rule 2) and also served under C{/api} (rule 6; the page
uses page-relative URLs, so under C{/api/dashboard} it calls C{/api/me}
...). Every answer carries a
strict Content-Security-Policy (no inline script or style, same-origin
connections only, no framing) and C{Cache-Control: no-store}.

The files ship as package data in C{svc/control/dashboard/} and are read once,
when the routes are built, so a broken installation fails at start and not on
the first page view. Behaviour of the page: C{docs/dashboard.md}.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import resources

import attrs

from svc.control.http import Call
from svc.control.routing import AuthKind, Feature, HandlerResult, Reply, Route

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)

SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
"""Headers on every dashboard answer."""


@attrs.frozen
class DashboardAsset:
    """
    One file of the page: where it is served, which file it is, its type.
    """

    path: str
    file_name: str
    content_type: str


ASSETS = (
    DashboardAsset("/dashboard", "index.html", "text/html; charset=utf-8"),
    DashboardAsset("/dashboard/app.js", "app.js", "text/javascript; charset=utf-8"),
    DashboardAsset("/dashboard/app.css", "app.css", "text/css; charset=utf-8"),
)


def read_packaged_asset(file_name: str) -> bytes:
    """
    The bytes of C{file_name} from the C{dashboard} directory beside this
    module (installed as package data).
    """
    return resources.files(__package__).joinpath("dashboard", file_name).read_bytes()


def _serve(body: bytes, content_type: str) -> Callable[[Call], HandlerResult]:
    reply = Reply.content(body, content_type, SECURITY_HEADERS)

    def serve(call: Call) -> HandlerResult:
        return reply

    return serve


def dashboard_routes(
    read_asset: Callable[[str], bytes] = read_packaged_asset,
) -> list[Route]:
    """
    The dashboard's routes, each file read now with C{read_asset}.

    @raise OSError: a file is missing.
    """
    return [
        Route(
            "GET",
            asset.path,
            AuthKind.PUBLIC,
            _serve(read_asset(asset.file_name), asset.content_type),
            mounted_with={Feature.DATABASE},
            api_alias=True,
        )
        for asset in ASSETS
    ]
