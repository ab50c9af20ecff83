"""
Tests for L{svc.control.app}: the spec's mounting rules driven by real
settings, the service token, and C{GET /v1/whoami} end to end.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from svc.config import ConfigError
from svc.control.app import build_control_app, features_for
from svc.control.http import Call
from svc.control.routing import AuthKind, Feature, HandlerResult, Route
from svc.control.settings import ControlSettings
from svc.control.test.support import ec_key, ed25519_key, mint, public_pem
from svc.testing.web import Answer, request

NOW = 1_800_000_000
TOKEN = "t0ken-" + "x" * 30
KEK = base64.b64encode(b"k" * 32).decode("ascii")
DATABASE = {"DATABASE_URL": "sqlite:///control.db", "SVC_CONTROL_PLANE_TOKEN": TOKEN}
AGENT_CA = {
    "SVC_SECRETS_DIR": "/secrets",
    "SVC_CA_KEK": KEK,
    "SVC_TRUST_DOMAIN": "svc.example",
    "SVC_CONTROL_PLANE_TOKEN": TOKEN,
}
IDENTITY = {
    "SVC_IDENTITY_AUDIENCE": "svc-control",
    "SVC_IDENTITY_PUBLIC_KEY_FILE": "/etc/host-idp.pem",
    "SVC_IDENTITY_ISSUER": "https://idp.example",
    "SVC_IDENTITY_TENANT_ALLOWLIST": "acme,globex",
}


async def _placeholder(call: Call) -> HandlerResult:
    return {"route": call.request.path.decode("ascii")}


class _EnrollTokenStub:
    """Accepts any request; stands in for the enroll-token authenticator."""

    async def authenticate(self, request: Request) -> object:
        return "enroll"


PLACEHOLDER_ROUTES = [
    Route(
        "POST",
        "/v1/entities",
        AuthKind.SERVICE_TOKEN,
        _placeholder,
        mounted_with={Feature.DATABASE},
        api_alias=True,
    ),
    Route(
        "GET",
        "/v1/tenants/<owner>/usage",
        AuthKind.SERVICE_TOKEN,
        _placeholder,
        mounted_with={Feature.DATABASE},
        serves_with={Feature.AGENT_CA},
        api_alias=True,
    ),
    Route(
        "POST",
        "/agent/enroll",
        AuthKind.ENROLL_TOKEN,
        _placeholder,
        mounted_with={Feature.DATABASE, Feature.AGENT_CA},
    ),
]


def _key_pem(path: Path) -> bytes:
    return public_pem(ed25519_key())


def _resource(environ: Mapping[str, str]) -> Resource:
    clock = Clock()
    clock.advance(NOW)
    app = build_control_app(
        ControlSettings.from_environ(environ),
        clock.seconds,
        PLACEHOLDER_ROUTES,
        {AuthKind.ENROLL_TOKEN: _EnrollTokenStub()},
        read_file=_key_pem,
    )
    return app.resource()


SERVICE = {"Authorization": f"Bearer {TOKEN}"}


class MountingRulesTests(SynchronousTestCase):
    """
    Which routes exist for which configuration.
    """

    def status(self, resource: Resource, method: str, path: str) -> int:
        return request(self, resource, method, path, headers=SERVICE).status

    def test_features_for(self) -> None:
        """Features follow DATABASE_URL, the agent CA and the audience."""
        self.assertEqual(features_for(ControlSettings.from_environ({})), frozenset())
        everything = ControlSettings.from_environ({**DATABASE, **AGENT_CA, **IDENTITY})
        self.assertEqual(features_for(everything), frozenset(Feature))

    def test_nothing_configured(self) -> None:
        """With no configuration only /healthz exists; the rest are real 404s."""
        resource = _resource({})
        self.assertEqual(self.status(resource, "GET", "/healthz"), 200)
        for method, path in (
            ("POST", "/v1/entities"),
            ("GET", "/v1/tenants/o/usage"),
            ("POST", "/agent/enroll"),
            ("GET", "/v1/whoami"),
            ("GET", "/api/v1/whoami"),
        ):
            self.assertEqual(self.status(resource, method, path), 404, path)

    def test_database_only(self) -> None:
        """DATABASE_URL mounts database routes; usage is 503 until an agent CA exists."""
        resource = _resource(DATABASE)
        self.assertEqual(self.status(resource, "POST", "/v1/entities"), 200)
        self.assertEqual(self.status(resource, "POST", "/api/v1/entities"), 200)
        self.assertEqual(self.status(resource, "GET", "/v1/tenants/o/usage"), 503)
        self.assertEqual(self.status(resource, "GET", "/api/v1/tenants/o/usage"), 503)
        self.assertEqual(self.status(resource, "POST", "/agent/enroll"), 404)
        self.assertEqual(self.status(resource, "GET", "/v1/whoami"), 404)

    def test_database_and_ca(self) -> None:
        """With an agent CA too, usage serves and enrollment is mounted (not under /api)."""
        resource = _resource({**DATABASE, **AGENT_CA})
        self.assertEqual(self.status(resource, "GET", "/v1/tenants/o/usage"), 200)
        self.assertEqual(self.status(resource, "POST", "/agent/enroll"), 200)
        self.assertEqual(self.status(resource, "POST", "/api/agent/enroll"), 404)

    def test_ca_without_database(self) -> None:
        """An agent CA alone mounts no database routes."""
        resource = _resource(AGENT_CA)
        self.assertEqual(self.status(resource, "POST", "/agent/enroll"), 404)
        self.assertEqual(self.status(resource, "GET", "/v1/tenants/o/usage"), 404)

    def test_whoami_independent_of_database(self) -> None:
        """The audience alone mounts whoami at /v1 and /api/v1, and nothing else."""
        resource = _resource(IDENTITY)
        token = {"Authorization": "Bearer " + _host_token()}
        for path in ("/v1/whoami", "/api/v1/whoami"):
            self.assertEqual(request(self, resource, "GET", path, headers=token).status, 200)
        self.assertEqual(self.status(resource, "POST", "/v1/entities"), 404)

    def test_servable_by_site(self) -> None:
        """The app's resource is accepted by a twisted.web Site."""
        Site(_resource({}))


class ServiceTokenTests(SynchronousTestCase):
    """
    The service token authenticator on a mounted route.
    """

    def post(self, headers: Mapping[str, str | list[str]]) -> Answer:
        return request(self, _resource(DATABASE), "POST", "/v1/entities", headers=headers)

    def test_accepted_forms(self) -> None:
        """The token is accepted with any keyword case and trailing whitespace."""
        for value in (f"Bearer {TOKEN}", f"bearer   {TOKEN}  ", f"BEARER\t{TOKEN}"):
            self.assertEqual(self.post({"Authorization": value}).status, 200, value)

    def test_rejected(self) -> None:
        """Missing, wrong, other-scheme and repeated credentials are 401 invalid_token."""
        for headers in (
            {},
            {"Authorization": f"Bearer {TOKEN}x"},
            {"Authorization": f"Basic {TOKEN}"},
            {"Authorization": [f"Bearer {TOKEN}", f"Bearer {TOKEN}"]},
        ):
            answer = self.post(headers)
            self.assertEqual((answer.status, answer.json()), (401, {"error": "invalid_token"}))


def _host_token(**overrides: object) -> str:
    claims: dict[str, object] = {
        "iss": "https://idp.example",
        "aud": ["other", "svc-control"],
        "exp": NOW + 300,
        "sub": "host-7",
        "tenant": "acme",
    }
    claims.update(overrides)
    return mint(ed25519_key(), {k: v for k, v in claims.items() if v is not None})


class WhoamiTests(SynchronousTestCase):
    """
    C{GET /v1/whoami} with host JWTs.
    """

    def whoami(self, authorization: str | None, path: str = "/v1/whoami") -> Answer:
        headers = {} if authorization is None else {"Authorization": authorization}
        return request(self, _resource(IDENTITY), "GET", path, headers=headers)

    def test_verified_identity(self) -> None:
        """A valid token yields its tenant and subject."""
        answer = self.whoami("Bearer " + _host_token())
        self.assertEqual(
            (answer.status, answer.json()), (200, {"tenant_id": "acme", "subject": "host-7"})
        )
        self.assertEqual(answer.header("Svc-API-Version"), "1")

    def test_bearer_forms(self) -> None:
        """Lower-case keyword and trailing whitespace are accepted."""
        self.assertEqual(self.whoami("bearer   " + _host_token() + "  ").status, 200)

    def test_generic_401(self) -> None:
        """Every verification failure gives the identical 401 response."""
        failures = [
            None,
            "Bearer",
            "Basic abc",
            "Bearer not-a-jwt",
            "Bearer " + _host_token(exp=NOW - 61),
            "Bearer " + _host_token(exp=None),
            "Bearer " + _host_token(nbf=NOW + 61),
            "Bearer " + _host_token(aud="other"),
            "Bearer " + _host_token(iss="https://evil.example"),
            "Bearer " + _host_token(tenant=""),
            "Bearer " + _host_token(tenant=7),
            "Bearer " + _host_token(tenant=None),
            "Bearer " + mint(ec_key(), {"aud": "svc-control", "exp": NOW + 300, "tenant": "acme"}),
        ]
        seen = set()
        for authorization in failures:
            answer = self.whoami(authorization)
            seen.add((answer.status, answer.body, answer.header("WWW-Authenticate")))
        self.assertEqual(seen, {(401, b'{"error":"invalid_token"}', "Bearer")})

    def test_tenant_not_allowed(self) -> None:
        """A valid token for a tenant off the allowlist is 403 tenant_not_allowed."""
        answer = self.whoami("Bearer " + _host_token(tenant="initech"), "/api/v1/whoami")
        self.assertEqual(answer.status, 403)
        self.assertEqual(
            answer.json(), {"error": "access_denied", "error_description": "tenant_not_allowed"}
        )

    def test_bad_key_refuses_start(self) -> None:
        """An identity key file holding an unsupported key refuses to build the app."""

        def wrong(path: Path) -> bytes:
            return b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"

        error = self.assertRaises(
            ConfigError,
            build_control_app,
            ControlSettings.from_environ(IDENTITY),
            lambda: NOW,
            read_file=wrong,
        )
        self.assertEqual(error.variable, "SVC_IDENTITY_PUBLIC_KEY_FILE")
