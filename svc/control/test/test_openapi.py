"""
Tests for L{svc.control.openapi}: the OpenAPI document against the code.

  - the document is valid OpenAPI 3.1 and consistent with itself (every
    example validates against its schema, every response names the general
    headers);
  - drift: its operations are exactly the provisioning surface the route
    declarations mount (every service-token route but those left out on
    purpose, plus C{/healthz} and C{/openapi.json}), with the same
    credential, C{/api} alias, path parameters and 503 when a feature is not
    ready;
  - behaviour: every documented status of every operation (but 500) is
    provoked against the real app over the in-memory SQLite store, with the
    document's own example bodies, and each response (status, headers,
    content type, body) validates against the document.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import attrs
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.control.app import build_control_app
from svc.control.ca import AgentCAProvider
from svc.control.enrollment import EnrollmentDeps
from svc.control.http import HEALTHZ_ROUTE
from svc.control.openapi import (
    OPENAPI_ROUTES,
    OUTSIDE_PROVISIONING_SURFACE,
    openapi_document,
    openapi_document_bytes,
)
from svc.control.routes_access import AccessDeps, access_routes
from svc.control.routes_dataplane import DataPlaneQueryDeps, dataplane_query_routes
from svc.control.routes_enrollment import enrollment_authenticators, enrollment_routes
from svc.control.routes_entities import EntityDeps, entity_routes
from svc.control.routes_fleet import FleetDeps, fleet_routes
from svc.control.routes_mounts import MountDeps, mount_routes
from svc.control.routing import AuthKind, Feature, MountedRoute
from svc.control.settings import ControlSettings
from svc.control.test.backends import SQLiteBackend
from svc.control.test.support import ec_key, public_pem
from svc.control.test.test_dataplane_client import fake_client
from svc.control.test.test_routes_entities import (
    ENVIRON,
    SERVICE,
    EntityRouteCase,
    RecordedPushes,
)
from svc.testing.control_store import memory_control_store
from svc.testing.web import Answer, request

DOCUMENT_URI = "urn:svc:control:openapi"
METHODS = ("get", "put", "post", "patch", "delete")
GENERAL_HEADERS = ("X-Request-ID", "Svc-API-Version")
UNPROVOKED_STATUSES = frozenset({"500"})
"""Documented statuses the exchange tests cannot provoke on a healthy app."""
NO_TOKEN = {"Content-Type": "application/json"}
ALL_FEATURES_ENVIRON = {
    **ENVIRON,
    "SVC_IDENTITY_AUDIENCE": "svc-control",
    "SVC_IDENTITY_PUBLIC_KEY_FILE": "/etc/host-idp.pem",
    "SVC_IDENTITY_TENANT_ALLOWLIST": "acme",
}


@attrs.frozen
class Operation:
    """One operation of the document."""

    method: str
    path: str
    spec: Mapping[str, Any]

    @property
    def operation_id(self) -> str:
        return str(self.spec["operationId"])

    @property
    def pointer(self) -> str:
        """The JSON pointer of the operation in the document."""
        return f"/paths/{_escape(self.path)}/{self.method.lower()}"

    def statuses(self) -> set[str]:
        return set(self.spec["responses"])

    def success_status(self) -> str:
        [status] = [str(s) for s in self.spec["responses"] if s.startswith("2")]
        return status

    def path_parameters(self) -> list[Mapping[str, Any]]:
        return [p for p in self.spec.get("parameters", []) if p["in"] == "path"]

    def request_examples(self) -> dict[str, Any]:
        body = self.spec.get("requestBody")
        if body is None:
            return {}
        media = body["content"]["application/json"]
        return {name: example["value"] for name, example in media.get("examples", {}).items()}

    def public(self) -> bool:
        return self.spec.get("security") == []


def _escape(segment: str) -> str:
    return segment.replace("~", "~0").replace("/", "~1")


def operations(document: Mapping[str, Any]) -> dict[str, Operation]:
    """Every operation of C{document}, by operation id."""
    found = {}
    for path, item in document["paths"].items():
        for method in METHODS:
            if method in item:
                operation = Operation(method.upper(), path, item[method])
                found[operation.operation_id] = operation
    return found


def openapi_path(rule: str) -> str:
    """A route rule as an OpenAPI path: C{<id>} becomes C{{id}}."""
    return re.sub(r"<([a-z_]+)>", r"{\1}", rule)


class DocumentSchemas:
    """
    Validates values against the schemas of the document (JSON Schema
    2020-12 with format checks), addressed by JSON pointer.
    """

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document = document
        resource = Resource.from_contents(document, default_specification=DRAFT202012)
        self._registry: Registry[Any] = Registry().with_resource(DOCUMENT_URI, resource)

    def resolve(self, node: Mapping[str, Any]) -> Mapping[str, Any]:
        """C{node}, or what its local C{$ref} points at."""
        while "$ref" in node:
            target: Any = self.document
            for segment in node["$ref"].removeprefix("#/").split("/"):
                target = target[segment.replace("~1", "/").replace("~0", "~")]
            node = target
        return node

    def problems(self, pointer: str, value: object) -> list[str]:
        """Why C{value} does not validate against the schema at C{pointer}."""
        reference = f"{DOCUMENT_URI}#{quote(pointer, safe='/~')}"
        validator = Draft202012Validator(
            {"$ref": reference},
            registry=self._registry,
            format_checker=Draft202012Validator.FORMAT_CHECKER,
        )
        return [
            f"{pointer} at /{'/'.join(map(str, error.absolute_path))}: {error.message}"
            for error in validator.iter_errors(value)
        ]

    def response_problems(self, operation: Operation, answer: Answer) -> list[str]:
        """Why C{answer} is not a documented response of C{operation}."""
        status = str(answer.status)
        if status not in operation.spec["responses"]:
            return [f"{operation.operation_id}: status {status} is not documented"]
        pointer = f"{operation.pointer}/responses/{status}"
        response = self.resolve(operation.spec["responses"][status])
        if "$ref" in operation.spec["responses"][status]:
            pointer = operation.spec["responses"][status]["$ref"].removeprefix("#")
        problems = []
        for name, header in response.get("headers", {}).items():
            value = answer.header(name)
            resolved = self.resolve(header)
            if value is None:
                if resolved.get("required"):
                    problems.append(f"{operation.operation_id} {status}: no {name} header")
                continue
            header_pointer = f"{pointer}/headers/{_escape(name)}"
            if "$ref" in header:
                header_pointer = header["$ref"].removeprefix("#")
            problems += self.problems(f"{header_pointer}/schema", value)
        content = response.get("content")
        content_type = answer.header("Content-Type")
        if content is None:
            if answer.body or content_type is not None:
                problems.append(f"{operation.operation_id} {status}: a body where none is due")
            return problems
        media_type = (content_type or "").split(";")[0].strip().lower()
        if media_type not in content:
            return [*problems, f"{operation.operation_id} {status}: content type {content_type}"]
        schema_pointer = f"{pointer}/content/{_escape(media_type)}/schema"
        return problems + self.problems(schema_pointer, json.loads(answer.body))


DOCUMENT = openapi_document()
OPERATIONS = operations(DOCUMENT)
SCHEMAS = DocumentSchemas(DOCUMENT)


def _examples(node: object, pointer: str = "") -> Iterator[tuple[str, object]]:
    """Every C{(schema pointer, example value)} of a media type in C{node}."""
    if isinstance(node, dict):
        if "schema" in node and ("example" in node or "examples" in node):
            if "example" in node:
                yield f"{pointer}/schema", node["example"]
            for example in node.get("examples", {}).values():
                yield f"{pointer}/schema", example["value"]
        for key, value in node.items():
            yield from _examples(value, f"{pointer}/{_escape(str(key))}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _examples(value, f"{pointer}/{index}")


class DocumentTests(SynchronousTestCase):
    """The document on its own."""

    def test_valid_openapi_3_1(self) -> None:
        """The document is a valid OpenAPI 3.1 description."""
        self.assertTrue(DOCUMENT["openapi"].startswith("3.1."))
        validate_openapi(DOCUMENT)

    def test_shipped_as_package_data(self) -> None:
        """The package resource is the checked-in file, byte for byte."""
        checked_in = Path(__file__).resolve().parent.parent / "openapi.json"
        self.assertEqual(openapi_document_bytes(), checked_in.read_bytes())

    def test_every_operation_has_examples(self) -> None:
        """Each path parameter, request body and success response carries an example."""
        missing = []
        for operation in OPERATIONS.values():
            for parameter in operation.path_parameters():
                if "example" not in parameter:
                    missing.append(f"{operation.operation_id} parameter {parameter['name']}")
            body = operation.spec.get("requestBody")
            if body is not None and not operation.request_examples():
                missing.append(f"{operation.operation_id} request body")
            success = SCHEMAS.resolve(operation.spec["responses"][operation.success_status()])
            for media in success.get("content", {}).values():
                if "example" not in media and "examples" not in media:
                    missing.append(f"{operation.operation_id} response")
        self.assertEqual(missing, [])

    def test_examples_match_their_schemas(self) -> None:
        """Every example in the document validates against the schema beside it."""
        problems = []
        for pointer, value in _examples(DOCUMENT):
            problems += SCHEMAS.problems(pointer, value)
        self.assertEqual(problems, [])

    def test_every_response_has_the_general_headers(self) -> None:
        """Every response documents X-Request-ID and Svc-API-Version."""
        missing = [
            f"{operation.operation_id} {status} {name}"
            for operation in OPERATIONS.values()
            for status, response in operation.spec["responses"].items()
            for name in GENERAL_HEADERS
            if name not in SCHEMAS.resolve(response).get("headers", {})
        ]
        self.assertEqual(missing, [])

    def test_every_operation_documents_server_error(self) -> None:
        """Every operation lists 500, and every secured one 401."""
        gaps = [
            f"{operation.operation_id} {status}"
            for operation in OPERATIONS.values()
            for status in ("500", *(() if operation.public() else ("401",)))
            if status not in operation.statuses()
        ]
        self.assertEqual(gaps, [])

    def test_links_name_operations(self) -> None:
        """Every link targets an operation of the document by a parameter it has."""
        broken = []
        for operation in OPERATIONS.values():
            for status, response in operation.spec["responses"].items():
                for name, link in SCHEMAS.resolve(response).get("links", {}).items():
                    target = OPERATIONS.get(link["operationId"])
                    declared = (
                        set() if target is None else {p["name"] for p in target.path_parameters()}
                    )
                    if target is None or set(link["parameters"]) != declared:
                        broken.append(f"{operation.operation_id} {status} {name}")
        self.assertEqual(broken, [])


def mounted_with_every_feature(case: SynchronousTestCase) -> tuple[MountedRoute, ...]:
    """
    The routes mounted by an app built with every feature from the entity,
    access, enrollment and mount-lease declarations (plus whoami, healthz and
    the document), as the tap builds them.
    """
    clock = Clock()
    settings = ControlSettings.from_environ(ALL_FEATURES_ENVIRON)
    store = memory_control_store()
    case.addCleanup(store.close)
    pushes = RecordedPushes()

    def no_ca() -> Any:
        raise AssertionError("the drift test never opens the CA")

    enrollment = EnrollmentDeps.build(store, AgentCAProvider(no_ca), settings, clock.seconds)
    routes = [
        *entity_routes(EntityDeps(store, settings, clock, fake_client({}, clock), pushes)),
        *access_routes(AccessDeps(store, clock)),
        *mount_routes(MountDeps(store, clock, pushes)),
        *enrollment_routes(enrollment),
        *dataplane_query_routes(DataPlaneQueryDeps(store, clock.seconds)),
        *fleet_routes(FleetDeps(store, clock, fake_client({}, clock))),
    ]
    app = build_control_app(
        settings,
        clock.seconds,
        routes,
        enrollment_authenticators(enrollment),
        read_file=lambda path: public_pem(ec_key()),
    )
    case.assertEqual(app.features, frozenset(Feature))
    return app.mounted


class DriftTests(SynchronousTestCase):
    """The document against the route declarations."""

    def setUp(self) -> None:
        mounted = mounted_with_every_feature(self)
        self.aliased = {(m.route.method, m.route.path) for m in mounted if m.path != m.route.path}
        self.surface = {
            (m.route.method, openapi_path(m.route.path)): m
            for m in mounted
            if m.path == m.route.path
            and (
                (
                    m.route.auth is AuthKind.SERVICE_TOKEN
                    and (m.route.method, m.route.path) not in OUTSIDE_PROVISIONING_SURFACE
                )
                or m.route in (HEALTHZ_ROUTE, *OPENAPI_ROUTES)
            )
        }
        self.service_routes = {
            (m.route.method, m.route.path)
            for m in mounted
            if m.route.auth is AuthKind.SERVICE_TOKEN
        }

    def documented(self) -> dict[tuple[str, str], Operation]:
        return {(op.method, op.path): op for op in OPERATIONS.values()}

    def test_operations_are_the_provisioning_surface(self) -> None:
        """The document's methods and paths are the mounted provisioning routes, no more."""
        self.assertEqual(sorted(self.documented()), sorted(self.surface))

    def test_left_out_routes_exist(self) -> None:
        """Each route deliberately left out is still a mounted service-token route."""
        self.assertLessEqual(OUTSIDE_PROVISIONING_SURFACE, self.service_routes)

    def test_credentials(self) -> None:
        """Service-token routes need the bearer token; public ones need nothing."""
        self.assertEqual(DOCUMENT["security"], [{"serviceToken": []}])
        scheme = DOCUMENT["components"]["securitySchemes"]["serviceToken"]
        self.assertEqual((scheme["type"], scheme["scheme"]), ("http", "bearer"))
        for key, operation in self.documented().items():
            route = self.surface[key].route
            self.assertEqual(operation.public(), route.auth is AuthKind.PUBLIC, key)

    def test_api_alias(self) -> None:
        """x-svc-api-alias says whether the route is also served under /api."""
        for key, operation in self.documented().items():
            route = self.surface[key].route
            self.assertEqual(operation.spec["x-svc-api-alias"], route.api_alias, key)
            self.assertEqual((route.method, route.path) in self.aliased, route.api_alias, key)

    def test_path_parameters(self) -> None:
        """Each operation declares exactly its route's path parameters, all required."""
        for key, operation in self.documented().items():
            declared = {p["name"] for p in operation.path_parameters() if p["required"]}
            self.assertEqual(declared, set(re.findall(r"{([a-z_]+)}", key[1])), key)

    def test_unavailable_where_a_feature_must_be_ready(self) -> None:
        """503 is documented exactly on routes that need a feature ready to serve."""
        for key, operation in self.documented().items():
            route = self.surface[key].route
            self.assertEqual("503" in operation.statuses(), bool(route.serves_with), key)


class ServedDocumentTests(SynchronousTestCase):
    """GET /openapi.json."""

    def test_served_publicly_on_every_configuration(self) -> None:
        """Without a database or token the document is served, as the shipped bytes."""
        app = build_control_app(ControlSettings.from_environ({}), Clock().seconds)
        for path in ("/openapi.json", "/api/openapi.json"):
            answer = request(self, app.resource(), "GET", path)
            self.assertEqual(answer.status, 200)
            self.assertEqual(answer.header("Content-Type"), "application/json")
            self.assertEqual(answer.body, openapi_document_bytes())
            self.assertEqual(answer.header("Svc-API-Version"), "1")
            self.assertEqual(
                SCHEMAS.response_problems(OPERATIONS["get_openapi_document"], answer), []
            )


class ExchangeContract(EntityRouteCase):
    """
    Each test drives one operation through every documented status with the
    document's examples; every response must match the document.
    """

    async def set_up(self) -> None:
        await super().set_up()
        self.seen: dict[str, set[str]] = {}

    async def exchange(
        self,
        operation_id: str,
        expect: int,
        body: object = None,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Answer:
        """
        Call C{operation_id} (path parameters default to the document's
        examples), check the status and the response against the document.
        """
        operation = OPERATIONS[operation_id]
        values = {p["name"]: p["example"] for p in operation.path_parameters()}
        values.update(params or {})
        path = re.sub(r"{([a-z_]+)}", lambda m: quote(values[m.group(1)], safe=""), operation.path)
        sent = dict(SERVICE if headers is None else headers)
        if raw is None:
            answer = await self.call(operation.method, path, body, headers=sent)
        else:
            answer = await self.send(self.resource, operation.method, path, headers=sent, body=raw)
        self.assertEqual(answer.status, expect, answer.body)
        self.assertEqual(SCHEMAS.response_problems(operation, answer), [])
        self.seen.setdefault(operation_id, set()).add(str(expect))
        return answer

    def example(self, operation_id: str, name: str | None = None) -> Any:
        """A request example of C{operation_id} (the first when unnamed)."""
        examples = OPERATIONS[operation_id].request_examples()
        return examples[name] if name is not None else next(iter(examples.values()))

    async def refusals(self, operation_id: str) -> None:
        """Without the token 401; each required body field missing 400."""
        operation = OPERATIONS[operation_id]
        await self.exchange(operation_id, 401, self.example_or_none(operation_id), headers=NO_TOKEN)
        body = self.example_or_none(operation_id)
        if not isinstance(body, dict) or not operation.spec["requestBody"]["required"]:
            return
        schema = SCHEMAS.resolve(operation.spec["requestBody"]["content"]["application/json"])
        for field in self.required_fields(SCHEMAS.resolve(schema["schema"]), body):
            partial = {k: v for k, v in body.items() if k != field}
            answer = await self.exchange(operation_id, 400, partial)
            self.assertEqual(answer.json()["error"], "invalid_request")

    def example_or_none(self, operation_id: str) -> Any:
        examples = OPERATIONS[operation_id].request_examples()
        return next(iter(examples.values())) if examples else None

    def required_fields(self, schema: Mapping[str, Any], body: Mapping[str, Any]) -> list[str]:
        """The required fields of the branch of C{schema} that C{body} takes."""
        if "oneOf" in schema:
            for branch in schema["oneOf"]:
                pointer = branch["$ref"].removeprefix("#")
                if not SCHEMAS.problems(pointer, body):
                    return self.required_fields(SCHEMAS.resolve(branch), body)
            raise AssertionError(f"{body} takes no branch")
        return list(schema.get("required", []))

    def assert_all_statuses_seen(self, operation_id: str) -> None:
        """Every documented status of the operation (but 500) was provoked."""
        documented = OPERATIONS[operation_id].statuses() - UNPROVOKED_STATUSES
        self.assertEqual(self.seen.get(operation_id, set()), documented)

    async def revoke(self, agent: str = "a1") -> None:
        await self.exchange("revoke_entity", 204, params={"type": "agent", "id": agent})

    # One test per operation; test_every_operation_is_exchanged keeps the list whole.

    async def test_healthz(self) -> None:
        """GET /healthz answers the documented body."""
        await self.exchange("healthz", 200, headers={})
        self.assert_all_statuses_seen("healthz")

    async def test_get_openapi_document(self) -> None:
        """GET /openapi.json answers the document without a token."""
        answer = await self.exchange("get_openapi_document", 200, headers={})
        self.assertEqual(answer.json(), DOCUMENT)
        self.assert_all_statuses_seen("get_openapi_document")

    async def test_provision_entity(self) -> None:
        """Provisioning: both examples, idempotence, unknown fields, 400/401/409/410."""
        agent = self.example("provision_entity", "agent")
        first = await self.exchange("provision_entity", 200, agent)
        self.assertTrue(first.json()["created"])
        again = await self.exchange("provision_entity", 200, {**agent, "x-unknown": [1]})
        self.assertFalse(again.json()["created"])
        account = await self.exchange(
            "provision_entity", 200, self.example("provision_entity", "account")
        )
        self.assertEqual(account.json()["type"], "account")
        await self.refusals("provision_entity")
        await self.exchange(
            "provision_entity", 400, {**self.example("provision_entity", "account"), "owner": "x"}
        )
        conflict = await self.exchange(
            "provision_entity", 409, {**agent, "grant_bytes": agent["grant_bytes"] + 1}
        )
        self.assertEqual(conflict.json(), {"error": "grant_mismatch"})
        await self.revoke()
        await self.exchange("provision_entity", 410, agent)
        self.assert_all_statuses_seen("provision_entity")

    async def test_resolve_entity(self) -> None:
        """Resolving an agent and an account; bad id, unknown, revoked."""
        await self.exchange("provision_entity", 200, self.example("provision_entity", "agent"))
        await self.exchange("resolve_entity", 200)
        account = await self.exchange(
            "resolve_entity", 200, params={"type": "account", "id": "acme"}
        )
        self.assertEqual(account.json()["type"], "account")
        await self.refusals("resolve_entity")
        await self.exchange("resolve_entity", 400, params={"id": "a..b"})
        await self.exchange("resolve_entity", 404, params={"id": "nobody"})
        await self.exchange("resolve_entity", 404, params={"type": "robot"})
        await self.revoke()
        await self.exchange("resolve_entity", 410)
        self.assert_all_statuses_seen("resolve_entity")

    async def test_set_agent_quota(self) -> None:
        """Setting a quota with the example; account type, unknown, revoked."""
        await self.exchange("provision_entity", 200, self.example("provision_entity", "agent"))
        answer = await self.exchange("set_agent_quota", 200, self.example("set_agent_quota"))
        self.assertEqual(
            answer.json()["grant_bytes"], self.example("set_agent_quota")["grant_bytes"]
        )
        await self.refusals("set_agent_quota")
        await self.exchange(
            "set_agent_quota", 400, self.example("set_agent_quota"), params={"type": "account"}
        )
        await self.exchange(
            "set_agent_quota", 404, self.example("set_agent_quota"), params={"id": "nobody"}
        )
        await self.revoke()
        await self.exchange("set_agent_quota", 410, self.example("set_agent_quota"))
        self.assert_all_statuses_seen("set_agent_quota")

    async def test_revoke_entity(self) -> None:
        """Revoking an agent twice and an account; bad id, unknown."""
        await self.exchange("provision_entity", 200, self.example("provision_entity", "agent"))
        await self.revoke()
        await self.revoke()
        await self.exchange("revoke_entity", 204, params={"type": "account", "id": "acme"})
        await self.refusals("revoke_entity")
        await self.exchange("revoke_entity", 400, params={"id": "-a"})
        await self.exchange("revoke_entity", 404, params={"id": "nobody"})
        self.assert_all_statuses_seen("revoke_entity")

    async def test_reassign_agent(self) -> None:
        """Reassigning with the example; foreign tenant, unknown, revoked."""
        await self.exchange("provision_entity", 200, self.example("provision_entity", "agent"))
        moved = await self.exchange("reassign_agent", 200, self.example("reassign_agent"))
        self.assertEqual(moved.json()["tenant"], self.example("reassign_agent")["tenant"])
        await self.refusals("reassign_agent")
        await self.exchange("reassign_agent", 400, {"owner": "o"}, params={"type": "account"})
        conflict = await self.exchange("reassign_agent", 409, {"owner": "other", "tenant": "acme"})
        self.assertEqual(conflict.json(), {"error": "tenant_owner_mismatch"})
        await self.exchange("reassign_agent", 404, {"owner": "o"}, params={"id": "nobody"})
        await self.revoke()
        await self.exchange("reassign_agent", 410, self.example("reassign_agent"))
        self.assert_all_statuses_seen("reassign_agent")

    async def test_set_account_budget(self) -> None:
        """Setting and clearing a budget with the examples; bad values."""
        for name in ("set", "clear"):
            body = self.example("set_account_budget", name)
            answer = await self.exchange("set_account_budget", 200, body)
            self.assertEqual(answer.json()["budget_bytes"], body["budget_bytes"])
        await self.refusals("set_account_budget")
        await self.exchange("set_account_budget", 400, {"budget_bytes": -1})
        await self.exchange("set_account_budget", 400, {"budget_bytes": True})
        self.assert_all_statuses_seen("set_account_budget")

    async def test_mint_enroll_token(self) -> None:
        """Minting a token; bad id, unknown, revoked."""
        await self.exchange("provision_entity", 200, self.example("provision_entity", "agent"))
        await self.exchange("mint_enroll_token", 200)
        await self.refusals("mint_enroll_token")
        await self.exchange("mint_enroll_token", 400, params={"id": "a..b"})
        await self.exchange("mint_enroll_token", 404, params={"id": "nobody"})
        await self.revoke()
        await self.exchange("mint_enroll_token", 410)
        self.assert_all_statuses_seen("mint_enroll_token")

    async def test_get_owner_usage(self) -> None:
        """Usage unplaced and placed; bad owner, unknown, CA not ready, server down."""
        await self.exchange("provision_entity", 200, self.example("provision_entity", "agent"))
        unplaced = await self.exchange("get_owner_usage", 200)
        self.assertEqual(unplaced.json()["used_bytes"], 0)
        await self.place()
        placed = await self.exchange("get_owner_usage", 200)
        self.assertEqual(placed.json()["agents"]["a1"]["used_bytes"], 7)
        await self.refusals("get_owner_usage")
        await self.exchange("get_owner_usage", 400, params={"owner": "a..b"})
        await self.exchange("get_owner_usage", 404, params={"owner": "nobody"})
        self.plane.reachable = False
        down = await self.exchange("get_owner_usage", 503)
        self.assertEqual(down.json()["error_description"], "dataplane_unreachable")
        self.ca_ready = False
        await self.exchange("get_owner_usage", 503)
        self.flushLoggedErrors()
        self.assert_all_statuses_seen("get_owner_usage")

    async def test_purge_sweep(self) -> None:
        """Sweeping with the example and without a body; purged and failed; 400/401/503."""
        await self.exchange("purge_sweep", 200, self.example("purge_sweep"))
        await self.exchange("provision_entity", 200, self.example("provision_entity", "agent"))
        await self.provision("a2")
        await self.place()
        await self.revoke("a1")
        await self.revoke("a2")
        self.plane.statuses["/control/purge-agent"] = 500
        failed = await self.exchange("purge_sweep", 200)
        self.assertEqual(len(failed.json()["failed"]), 2)
        del self.plane.statuses["/control/purge-agent"]
        purged = await self.exchange("purge_sweep", 200)
        self.assertEqual(len(purged.json()["purged"]), 2)
        await self.refusals("purge_sweep")
        await self.exchange("purge_sweep", 400, raw=b"[]")
        self.ca_ready = False
        await self.exchange("purge_sweep", 503)
        self.assert_all_statuses_seen("purge_sweep")

    async def test_suspend_account(self) -> None:
        """Suspending an account twice; bad id, unknown."""
        await self.exchange("provision_entity", 200, self.example("provision_entity", "agent"))
        for _ in range(2):
            answer = await self.exchange("suspend_account", 200)
            self.assertTrue(answer.json()["suspended"])
        await self.refusals("suspend_account")
        await self.exchange("suspend_account", 400, params={"owner": "a..b"})
        await self.exchange("suspend_account", 404, params={"owner": "nobody"})
        self.assert_all_statuses_seen("suspend_account")

    async def test_reinstate_account(self) -> None:
        """Reinstating a suspended account; bad id, unknown."""
        await self.exchange("provision_entity", 200, self.example("provision_entity", "agent"))
        await self.exchange("suspend_account", 200)
        answer = await self.exchange("reinstate_account", 200)
        self.assertFalse(answer.json()["suspended"])
        await self.refusals("reinstate_account")
        await self.exchange("reinstate_account", 400, params={"owner": "-x"})
        await self.exchange("reinstate_account", 404, params={"owner": "nobody"})
        self.assert_all_statuses_seen("reinstate_account")

    async def test_suspend_tenant(self) -> None:
        """Suspending a tenant twice; bad id, unknown."""
        await self.exchange("provision_entity", 200, self.example("provision_entity", "agent"))
        for _ in range(2):
            answer = await self.exchange("suspend_tenant", 200)
            self.assertTrue(answer.json()["suspended"])
        await self.refusals("suspend_tenant")
        await self.exchange("suspend_tenant", 400, params={"tenant": "a..b"})
        await self.exchange("suspend_tenant", 404, params={"tenant": "nobody"})
        self.assert_all_statuses_seen("suspend_tenant")

    async def test_reinstate_tenant(self) -> None:
        """Reinstating a suspended tenant; bad id, unknown."""
        await self.exchange("provision_entity", 200, self.example("provision_entity", "agent"))
        await self.exchange("suspend_tenant", 200)
        answer = await self.exchange("reinstate_tenant", 200)
        self.assertFalse(answer.json()["suspended"])
        await self.refusals("reinstate_tenant")
        await self.exchange("reinstate_tenant", 400, params={"tenant": "-x"})
        await self.exchange("reinstate_tenant", 404, params={"tenant": "nobody"})
        self.assert_all_statuses_seen("reinstate_tenant")

    async def test_revoke_enroll_token(self) -> None:
        """Revoking a minted token twice; unknown and malformed ids."""
        await self.exchange("provision_entity", 200, self.example("provision_entity", "agent"))
        minted = await self.exchange("mint_enroll_token", 200)
        token_id = minted.json()["token_id"]
        for _ in range(2):
            answer = await self.exchange("revoke_enroll_token", 200, params={"token_id": token_id})
            self.assertEqual(answer.json()["state"], "revoked")
        await self.refusals("revoke_enroll_token")
        await self.exchange("revoke_enroll_token", 404)
        await self.exchange("revoke_enroll_token", 404, params={"token_id": "not-a-token"})
        self.assert_all_statuses_seen("revoke_enroll_token")


class ExchangeTests(ExchangeContract, SQLiteBackend):
    """The exchanges over the in-memory SQLite store."""

    def test_every_operation_is_exchanged(self) -> None:
        """Each operation of the document has its exchange test."""
        missing = [
            operation_id
            for operation_id in OPERATIONS
            if not callable(getattr(self, f"test_{operation_id}", None))
        ]
        self.assertEqual(missing, [])
