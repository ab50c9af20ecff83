"""
Tests for L{svc.control.dashboard}: the page and its assets through StubTreq
against the real app, their headers, and the rules the files themselves keep
so that the strict Content-Security-Policy holds.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource

from svc.control.dashboard import (
    ASSETS,
    CONTENT_SECURITY_POLICY,
    dashboard_routes,
    read_packaged_asset,
)
from svc.control.http import ControlApp
from svc.control.routing import Feature
from svc.testing.web import request


def _resource(features: frozenset[Feature]) -> Resource:
    app = ControlApp(dashboard_routes(), features, authenticators={}, now=Clock().seconds)
    return app.resource()


class _PageScan(HTMLParser):
    """Collects what in a page a strict CSP would refuse or the page loads."""

    def __init__(self) -> None:
        super().__init__()
        self.inline_scripts = 0
        self.style_elements = 0
        self.style_attributes: list[str] = []
        self.handler_attributes: list[str] = []
        self.loaded: list[str] = []
        self.ids: list[str] = []
        self._in_script_without_src = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for name, _ in attrs:
            if name == "style":
                self.style_attributes.append(tag)
            if name.startswith("on"):
                self.handler_attributes.append(f"{tag} {name}")
        if values.get("id"):
            self.ids.append(str(values["id"]))
        if tag == "style":
            self.style_elements += 1
        if tag == "script":
            if values.get("src"):
                self.loaded.append(str(values["src"]))
            else:
                self._in_script_without_src = True
        if tag == "link" and values.get("rel") == "stylesheet":
            self.loaded.append(str(values.get("href")))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._in_script_without_src:
            self.inline_scripts += 1
            self._in_script_without_src = False


class DashboardRoutesTests(SynchronousTestCase):
    """
    The page and its assets are served with their types and security headers.
    """

    def setUp(self) -> None:
        self.resource = _resource(frozenset({Feature.DATABASE}))

    def test_each_asset_has_its_content_type_and_bytes(self) -> None:
        """Every asset is served whole with its own content type."""
        expected = {
            "/dashboard": "text/html; charset=utf-8",
            "/dashboard/app.js": "text/javascript; charset=utf-8",
            "/dashboard/app.css": "text/css; charset=utf-8",
        }
        self.assertEqual({asset.path: asset.content_type for asset in ASSETS}, expected)
        for asset in ASSETS:
            answer = request(self, self.resource, "GET", asset.path)
            self.assertEqual(answer.status, 200, asset.path)
            self.assertEqual(answer.header("Content-Type"), asset.content_type, asset.path)
            self.assertEqual(answer.body, read_packaged_asset(asset.file_name), asset.path)

    def test_security_headers_on_every_asset(self) -> None:
        """CSP, nosniff, no referrer and no caching on the page, the script and the sheet."""
        for asset in ASSETS:
            answer = request(self, self.resource, "GET", asset.path)
            self.assertEqual(
                answer.header("Content-Security-Policy"),
                "default-src 'self'; connect-src 'self'; img-src 'self' data:; "
                "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
                asset.path,
            )
            self.assertEqual(answer.header("X-Content-Type-Options"), "nosniff")
            self.assertEqual(answer.header("Referrer-Policy"), "no-referrer")
            self.assertEqual(answer.header("Cache-Control"), "no-store")

    def test_general_headers_still_present(self) -> None:
        """The page carries the control plane's request id and API version like any answer."""
        answer = request(self, self.resource, "GET", "/dashboard")
        self.assertIsNotNone(answer.header("X-Request-ID"))
        self.assertEqual(answer.header("Svc-API-Version"), "1")

    def test_public(self) -> None:
        """No credential is needed for the page itself (it holds no data)."""
        answer = request(self, self.resource, "GET", "/dashboard/app.js")
        self.assertEqual(answer.status, 200)

    def test_under_api_prefix(self) -> None:
        """Every file of the page is also served under /api (mounting rule 6), identically."""
        for asset in ASSETS:
            bare = request(self, self.resource, "GET", asset.path)
            aliased = request(self, self.resource, "GET", "/api" + asset.path)
            self.assertEqual(aliased.status, 200, asset.path)
            self.assertEqual(aliased.body, bare.body)
            self.assertEqual(aliased.header("Content-Type"), asset.content_type)
            self.assertEqual(
                aliased.header("Content-Security-Policy"), bare.header("Content-Security-Policy")
            )

    def test_unknown_asset_is_json_404(self) -> None:
        """A file that is not one of the assets is the ordinary JSON 404."""
        answer = request(self, self.resource, "GET", "/dashboard/index.html")
        self.assertEqual(answer.status, 404)
        self.assertEqual(answer.header("Content-Type"), "application/json")
        self.assertIsNone(answer.header("Content-Security-Policy"))

    def test_only_get(self) -> None:
        """Other methods are 405."""
        self.assertEqual(request(self, self.resource, "POST", "/dashboard").status, 405)

    def test_mounted_only_with_database(self) -> None:
        """Without DATABASE_URL the page does not exist (mounting rule 2)."""
        resource = _resource(frozenset())
        for asset in ASSETS:
            self.assertEqual(request(self, resource, "GET", asset.path).status, 404, asset.path)

    def test_files_read_when_routes_are_built(self) -> None:
        """A missing file fails while building the routes, not on the first view."""

        def missing(name: str) -> bytes:
            raise FileNotFoundError(name)

        self.assertRaises(FileNotFoundError, dashboard_routes, missing)

    def test_reader_injected(self) -> None:
        """The bytes served are exactly what the reader returned for each file."""
        routes = dashboard_routes(lambda name: f"<{name}>".encode())
        app = ControlApp(
            routes, frozenset({Feature.DATABASE}), authenticators={}, now=Clock().seconds
        )
        answer = request(self, app.resource(), "GET", "/dashboard/app.css")
        self.assertEqual(answer.body, b"<app.css>")


class DashboardFilesTests(SynchronousTestCase):
    """
    The shipped files keep the rules the CSP and the escaping policy rely on.
    """

    def scan(self) -> _PageScan:
        scan = _PageScan()
        scan.feed(read_packaged_asset("index.html").decode("utf-8"))
        scan.close()
        return scan

    def test_page_has_nothing_inline(self) -> None:
        """No inline script, style element, style attribute or on* handler in the page."""
        scan = self.scan()
        self.assertEqual(scan.inline_scripts, 0)
        self.assertEqual(scan.style_elements, 0)
        self.assertEqual(scan.style_attributes, [])
        self.assertEqual(scan.handler_attributes, [])

    def test_page_loads_its_assets_from_the_dashboard(self) -> None:
        """The page loads exactly the served script and sheet, by page-relative URLs."""
        self.assertEqual(sorted(self.scan().loaded), ["dashboard/app.css", "dashboard/app.js"])

    def test_ids_are_unique(self) -> None:
        """Element ids the script and the browser test use are unique."""
        ids = self.scan().ids
        self.assertEqual(len(ids), len(set(ids)))

    def test_script_ids_exist_in_page(self) -> None:
        """Every id the script looks up with $() is in the page."""
        script = read_packaged_asset("app.js").decode("utf-8")
        wanted = set(re.findall(r"\$\(\"([a-z-]+)\"\)", script))
        self.assertTrue(wanted)
        self.assertEqual(wanted - set(self.scan().ids), set())

    def test_script_never_writes_markup(self) -> None:
        """The script places text only: no innerHTML, outerHTML, insertAdjacentHTML, write."""
        script = read_packaged_asset("app.js").decode("utf-8")
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            self.assertNotIn(sink, script)

    def test_script_reaches_only_its_origin(self) -> None:
        """No absolute URL in the script or the sheet (connect-src 'self')."""
        for name in ("app.js", "app.css"):
            text = read_packaged_asset(name).decode("utf-8")
            self.assertIsNone(re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]", text), name)

    def test_policy_forbids_inline_and_framing(self) -> None:
        """The policy has no 'unsafe-*' source and forbids framing and <base>."""
        self.assertNotIn("unsafe", CONTENT_SECURITY_POLICY)
        self.assertIn("frame-ancestors 'none'", CONTENT_SECURITY_POLICY)
        self.assertIn("base-uri 'none'", CONTENT_SECURITY_POLICY)
