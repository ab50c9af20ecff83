"""
Tests for L{svc.control.http}: the general rules on every response, through
StubTreq against the real Klein resource.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.server import Request

from svc.control.http import Call, ControlApp
from svc.control.routing import AuthKind, Feature, HandlerResult, Reply, Route
from svc.control.store.errors import Unavailable
from svc.testing.web import Answer, request
from svc.web.errors import Conflict, InvalidCredential, LeaseLive


class Boom(Exception):
    """An unexpected failure inside a handler."""


async def _boom(call: Call) -> HandlerResult:
    raise Boom("secret internal detail")


async def _locked(call: Call) -> HandlerResult:
    raise Unavailable("the SQLite database is locked: database is locked")


async def _echo(call: Call) -> HandlerResult:
    return {"body": call.json_body(), "params": dict(call.params), "id": call.request_id}


async def _optional(call: Call) -> HandlerResult:
    return {"body": call.json_body(optional=True)}


async def _no_content(call: Call) -> HandlerResult:
    return Reply.no_content()


def _created(call: Call) -> HandlerResult:
    return Reply.created({"made": True})


async def _conflict(call: Call) -> HandlerResult:
    raise LeaseLive("t0", "t1")


async def _plain_conflict(call: Call) -> HandlerResult:
    raise Conflict("wrong_agent")


async def _whoami(call: Call) -> HandlerResult:
    return {"principal": call.principal_as(str)}


async def _query(call: Call) -> HandlerResult:
    return {"q": call.query_arg("q")}


class _HeaderToken:
    """A toy authenticator: the principal is the X-Who header."""

    async def authenticate(self, request: Request) -> object:
        value = request.getHeader(b"x-who")
        if value is None:
            raise InvalidCredential()
        return value.decode("ascii")


ROUTES = [
    Route("GET", "/boom", AuthKind.PUBLIC, _boom),
    Route("POST", "/echo/<thing>", AuthKind.PUBLIC, _echo),
    Route("POST", "/optional", AuthKind.PUBLIC, _optional),
    Route("DELETE", "/thing", AuthKind.PUBLIC, _no_content),
    Route("POST", "/thing", AuthKind.PUBLIC, _created),
    Route("POST", "/conflict", AuthKind.PUBLIC, _conflict),
    Route("POST", "/plain-conflict", AuthKind.PUBLIC, _plain_conflict),
    Route("GET", "/who", AuthKind.SERVICE_TOKEN, _whoami, api_alias=True),
    Route("GET", "/query", AuthKind.PUBLIC, _query),
    Route(
        "GET",
        "/usage",
        AuthKind.PUBLIC,
        _query,
        mounted_with={Feature.DATABASE},
        serves_with={Feature.AGENT_CA},
    ),
    Route("GET", "/locked", AuthKind.PUBLIC, _locked),
]


def _app(
    routes: Iterable[Route] = ROUTES,
    features: frozenset[Feature] = frozenset({Feature.DATABASE}),
    max_body_bytes: int = 1024,
) -> ControlApp:
    return ControlApp(
        routes,
        features,
        authenticators={AuthKind.SERVICE_TOKEN: _HeaderToken()},
        now=Clock().seconds,
        max_body_bytes=max_body_bytes,
        make_request_id=lambda: "generated-id",
    )


class GeneralRulesTests(SynchronousTestCase):
    """
    Headers, content type and logging on every response.
    """

    def call(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str | list[str]] | None = None,
        body: bytes | None = None,
    ) -> Answer:
        answer = request(self, _app().resource(), method, path, headers=headers, body=body)
        self.flushLoggedErrors(Boom)
        return answer

    def assertStamped(self, answer: Answer, request_id: str = "generated-id") -> None:
        self.assertEqual(answer.header("X-Request-ID"), request_id)
        self.assertEqual(answer.header("Svc-API-Version"), "1")

    def test_healthz(self) -> None:
        """/healthz is mounted with no features and answers {"status": "ok"}."""
        answer = request(self, _app(features=frozenset()).resource(), "GET", "/healthz")
        self.assertEqual((answer.status, answer.json()), (200, {"status": "ok"}))
        self.assertEqual(answer.header("Content-Type"), "application/json")
        self.assertStamped(answer)

    def test_every_response_stamped(self) -> None:
        """Success, 400, 401, 404, 405, 409 and 500 all carry the id and version."""
        cases = [
            ("GET", "/healthz", 200),
            ("POST", "/echo/x", 400),
            ("GET", "/who", 401),
            ("GET", "/no/such/route", 404),
            ("PUT", "/healthz", 405),
            ("POST", "/conflict", 409),
            ("GET", "/boom", 500),
        ]
        for method, path, status in cases:
            answer = self.call(method, path)
            self.assertEqual(answer.status, status, path)
            self.assertStamped(answer)
            self.assertEqual(answer.header("Content-Type"), "application/json", path)

    def test_incoming_request_id_kept(self) -> None:
        """A well-formed incoming X-Request-ID is echoed, also on a 404."""
        for path in ("/healthz", "/missing"):
            answer = self.call("GET", path, {"X-Request-ID": "caller-42.a_b"})
            self.assertStamped(answer, "caller-42.a_b")

    def test_malformed_request_id_replaced(self) -> None:
        """A malformed or repeated incoming X-Request-ID is replaced."""
        for value in ("has space", "x" * 129, ["a", "b"]):
            answer = self.call("GET", "/healthz", {"X-Request-ID": value})
            self.assertStamped(answer)

    def test_request_logged_with_id(self) -> None:
        """One log line per request names method, path without query, status, id."""
        with capturedLogs() as events:
            self.call("GET", "/missing?token=secret", {"X-Request-ID": "r1"})
        lines = [e for e in events if e.get("request_id") == "r1" and "status" in e]
        self.assertEqual(len(lines), 1)
        self.assertEqual(
            (lines[0]["method"], lines[0]["path"], lines[0]["status"]), ("GET", "/missing", 404)
        )
        self.assertNotIn("secret", repr(lines[0]))
        # An access line is per-request chatter: shown with SVC_LOG_LEVEL=debug only.
        self.assertEqual(lines[0]["log_level"].name, "debug")

    def test_server_error_hides_details(self) -> None:
        """An unexpected exception is a bare server_error, logged as a failure."""
        answer = request(self, _app().resource(), "GET", "/boom")
        self.assertEqual(answer.status, 500)
        self.assertEqual(answer.body, b'{"error":"server_error"}')
        self.assertEqual(len(self.flushLoggedErrors(Boom)), 1)

    def test_database_unavailable_is_503(self) -> None:
        """A database that cannot serve now is 503 database_unavailable, a warning not a failure."""
        with capturedLogs() as events:
            answer = request(self, _app().resource(), "GET", "/locked")
        self.assertEqual(answer.status, 503)
        self.assertEqual(
            answer.json(),
            {"error": "temporarily_unavailable", "error_description": "database_unavailable"},
        )
        self.assertEqual(answer.header("Retry-After"), "5")
        self.assertStamped(answer)
        self.assertEqual(self.flushLoggedErrors(), [])
        self.assertTrue(any("database unavailable" in str(e.get("log_format")) for e in events))

    def test_not_found_body(self) -> None:
        """An unknown route is 404 not_found without description."""
        answer = self.call("GET", "/nope")
        self.assertEqual((answer.status, answer.body), (404, b'{"error":"not_found"}'))

    def test_method_not_allowed(self) -> None:
        """A known path with another method is 405 with an Allow header."""
        answer = self.call("PATCH", "/thing")
        self.assertEqual(answer.status, 405)
        self.assertEqual(answer.json(), {"error": "method_not_allowed"})
        self.assertEqual(answer.header("Allow"), "DELETE, POST")

    def test_conflict_extra_fields(self) -> None:
        """A 409 lease_live body carries the incumbent's times."""
        answer = self.call("POST", "/conflict")
        self.assertEqual(
            answer.json(), {"error": "lease_live", "bound_at": "t0", "lease_expires_at": "t1"}
        )
        answer = self.call("POST", "/plain-conflict")
        self.assertEqual(answer.json(), {"error": "wrong_agent"})

    def test_no_content(self) -> None:
        """A 204 reply has no body and no content type."""
        answer = self.call("DELETE", "/thing")
        self.assertEqual((answer.status, answer.body), (204, b""))
        self.assertIsNone(answer.header("Content-Type"))
        self.assertStamped(answer)

    def test_created(self) -> None:
        """A synchronous handler may answer 201 with a body."""
        answer = self.call("POST", "/thing")
        self.assertEqual((answer.status, answer.json()), (201, {"made": True}))

    def test_non_utf8_path(self) -> None:
        """A path that is not UTF-8 is 400, still stamped."""
        answer = self.call("GET", "/%ff")
        self.assertEqual(answer.status, 400)
        self.assertEqual(answer.json()["error"], "invalid_request")
        self.assertStamped(answer)

    def test_query_arg(self) -> None:
        """A single query value is returned; a repeated one is 400."""
        self.assertEqual(self.call("GET", "/query?q=v%C3%A9").json(), {"q": "vé"})
        self.assertEqual(self.call("GET", "/query").json(), {"q": None})
        self.assertEqual(self.call("GET", "/query?q=1&q=2").status, 400)


class JsonBodyTests(SynchronousTestCase):
    """
    Request body rules as seen through a handler.
    """

    def post(self, path: str, body: bytes, content_type: str | None = "application/json") -> Answer:
        headers = {"Content-Type": content_type} if content_type else {}
        return request(self, _app().resource(), "POST", path, headers=headers, body=body)

    def test_parsed(self) -> None:
        """A JSON object body reaches the handler with the path parameters."""
        answer = self.post("/echo/abc", b'{"k": "v"}')
        self.assertEqual(answer.status, 200)
        self.assertEqual(answer.json()["body"], {"k": "v"})
        self.assertEqual(answer.json()["params"], {"thing": "abc"})
        self.assertEqual(answer.json()["id"], "generated-id")

    def test_content_type_required(self) -> None:
        """A body without application/json is 400 content_type_not_json."""
        for content_type in (None, "text/plain"):
            answer = self.post("/echo/a", b"{}", content_type)
            self.assertEqual(
                answer.json(),
                {"error": "invalid_request", "error_description": "content_type_not_json"},
            )

    def test_size_cap(self) -> None:
        """A body over the cap is 413 request_too_large; one at the cap is accepted."""
        at_cap = b'{"k":"' + b"x" * (1024 - 8) + b'"}'
        self.assertEqual(len(at_cap), 1024)
        self.assertEqual(self.post("/echo/a", at_cap).status, 200)
        answer = self.post("/echo/a", at_cap + b" ")
        self.assertEqual(answer.status, 413)
        self.assertEqual(
            answer.json(),
            {
                "error": "request_too_large",
                "error_description": "body_too_large",
                "max_body_bytes": 1024,
            },
        )

    def test_size_cap_before_authentication(self) -> None:
        """An oversized body is 413 on an authenticated route, without credentials."""
        answer = request(self, _app().resource(), "POST", "/who", body=b"x" * 1025)
        self.assertEqual(answer.status, 413)
        self.assertIsNotNone(answer.header("X-Request-ID"))

    def test_not_object(self) -> None:
        """A JSON array or invalid JSON is 400."""
        self.assertEqual(self.post("/echo/a", b"[]").json()["error_description"], "body_not_object")
        self.assertEqual(self.post("/echo/a", b"{").json()["error_description"], "body_not_json")

    def test_required(self) -> None:
        """An empty body where one is required is 400 body_required."""
        answer = self.post("/echo/a", b"")
        self.assertEqual(answer.json()["error_description"], "body_required")

    def test_optional(self) -> None:
        """An optional body may be empty (even without a content type)."""
        self.assertEqual(self.post("/optional", b"", None).json(), {"body": {}})
        self.assertEqual(
            self.post("/optional", b'{"force": true}').json(), {"body": {"force": True}}
        )


class MountingMechanismTests(SynchronousTestCase):
    """
    Route mounting, aliasing, readiness and authentication wiring.
    """

    def test_unmounted_is_real_404(self) -> None:
        """A route whose features are missing does not exist (404, not 503)."""
        answer = request(self, _app(features=frozenset()).resource(), "GET", "/usage")
        self.assertEqual((answer.status, answer.json()), (404, {"error": "not_found"}))

    def test_serves_with_503(self) -> None:
        """A mounted route whose serving feature is absent is 503."""
        answer = request(self, _app().resource(), "GET", "/usage")
        self.assertEqual(answer.status, 503)
        self.assertEqual(
            answer.json(),
            {"error": "temporarily_unavailable", "error_description": "agent_ca_not_configured"},
        )

    def test_serves_when_ready(self) -> None:
        """With the serving feature present the route serves."""
        app = _app(features=frozenset({Feature.DATABASE, Feature.AGENT_CA}))
        self.assertEqual(request(self, app.resource(), "GET", "/usage").status, 200)

    def test_ready_is_consulted_per_request(self) -> None:
        """An injected readiness check decides at request time."""
        ready: set[Feature] = set()
        app = ControlApp(
            ROUTES,
            frozenset({Feature.DATABASE}),
            authenticators={AuthKind.SERVICE_TOKEN: _HeaderToken()},
            now=Clock().seconds,
            ready=ready.__contains__,
        )
        self.assertEqual(request(self, app.resource(), "GET", "/usage").status, 503)
        ready.add(Feature.AGENT_CA)
        self.assertEqual(request(self, app.resource(), "GET", "/usage").status, 200)

    def test_api_alias_served(self) -> None:
        """An aliased route answers at its path and under /api; others do not."""
        resource = _app().resource()
        for path in ("/who", "/api/who"):
            answer = request(self, resource, "GET", path, headers={"X-Who": "me"})
            self.assertEqual(answer.json(), {"principal": "me"}, path)
        self.assertEqual(request(self, resource, "GET", "/api/healthz").status, 404)

    def test_authenticator_runs_before_handler(self) -> None:
        """An authenticated route without a credential is 401 invalid_token."""
        answer = request(self, _app().resource(), "GET", "/who")
        self.assertEqual(answer.status, 401)
        self.assertEqual(answer.json(), {"error": "invalid_token"})
        self.assertEqual(answer.header("WWW-Authenticate"), "Bearer")

    def test_missing_authenticator_refused(self) -> None:
        """Mounting a route whose auth kind has no authenticator is refused."""
        route = Route("GET", "/x", AuthKind.ENROLL_TOKEN, _query)
        self.assertRaises(
            ValueError, ControlApp, [route], frozenset(), authenticators={}, now=Clock().seconds
        )

    def test_missing_authenticator_unmounted_ok(self) -> None:
        """An unmounted route does not need its authenticator."""
        route = Route("GET", "/x", AuthKind.ENROLL_TOKEN, _query, mounted_with={Feature.DATABASE})
        ControlApp([route], frozenset(), authenticators={}, now=Clock().seconds)

    def test_mounted_endpoints(self) -> None:
        """The app reports what it mounted, healthz first."""
        app = _app(routes=[ROUTES[7]], features=frozenset())
        self.assertEqual(
            [m.endpoint for m in app.mounted], ["GET /healthz", "GET /who", "GET /api/who"]
        )

    def test_duration_from_injected_clock(self) -> None:
        """The logged duration is the injected clock's time from start to finish."""
        readings = iter([100.0, 102.5])
        app = ControlApp([], frozenset(), authenticators={}, now=lambda: next(readings))
        with capturedLogs() as events:
            request(self, app.resource(), "GET", "/healthz")
        durations = [e["duration"] for e in events if "duration" in e]
        self.assertEqual(durations, [2.5])
