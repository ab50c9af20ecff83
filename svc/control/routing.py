"""
Route declarations and the mounting rules, without any HTTP machinery.

A route is declared once as a L{Route}: method, path, the kind of credential
it takes, its handler, the features it needs to be mounted at all, the
features it needs to serve (else 503), and whether it is also served under
C{/api}. L{plan_mounts} turns a list of declarations and the set of features
this process has into the exact list of paths to register; it is pure and
tested on its own. L{svc.control.http.ControlApp} registers the plan with
Klein.

Mounting rules (spec "Mounting rules"), expressed with these fields:

  - always mounted (C{/healthz}): no C{mounted_with};
  - database routes: C{mounted_with={Feature.DATABASE}};
  - usage and purge-sweep: C{mounted_with={Feature.DATABASE}},
    C{serves_with={Feature.AGENT_CA}} (503 until an agent CA exists);
  - enrollment: C{mounted_with={Feature.DATABASE, Feature.AGENT_CA}};
  - whoami: C{mounted_with={Feature.HOST_IDENTITY}};
  - dashboard, entities, admin, tenants, journal, whoami: C{api_alias=True}.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import attrs

from svc.web.errors import JsonValue

if TYPE_CHECKING:
    from svc.control.http import Call

API_PREFIX = "/api"
"""Mounting rule 6: aliased routes are also served under this prefix."""

METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})

_PATH_PATTERN = re.compile(r"(/([A-Za-z0-9._-]+|<[a-z_]+>))+")


class Feature(enum.Enum):
    """
    Something a route may need from this process's configuration.
    """

    DATABASE = "database"
    """C{DATABASE_URL} is set."""
    AGENT_CA = "agent_ca"
    """An agent CA is configured (filesystem or in-database)."""
    HOST_IDENTITY = "host_identity"
    """C{SVC_IDENTITY_AUDIENCE} is set: host JWTs are verified."""


class AuthKind(enum.Enum):
    """
    The credential a route takes (spec "Credential shapes"). Every kind but
    C{PUBLIC} needs an authenticator registered with the app.
    """

    PUBLIC = "public"
    SERVICE_TOKEN = "service_token"  # noqa: S105
    HOST_JWT = "host_jwt"
    ADMIN_SESSION = "admin_session"
    ENROLL_TOKEN = "enroll_token"  # noqa: S105
    AGENT_IDENTITY = "agent_identity"
    LEASE_HOLDER = "lease_holder"
    """
    The agent identity of a mount-lease holder (refresh, release): as
    C{AGENT_IDENTITY}, except that a leaf refused only because its
    enrollment was revoked while its allocation stays live is 410
    C{lease_lost} (the lease ended: released, force-unmounted by the owner,
    taken over), not 401.
    """


@attrs.frozen
class Reply:
    """
    What a handler answers when it is not a plain 200 JSON object: a status,
    a JSON body (L{None} for no body, e.g. 204) and extra headers.
    """

    status: int = attrs.field(default=200)
    body: JsonValue = None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    raw: bytes | None = None
    """Bytes sent as they are instead of a JSON C{body} (with C{raw_type})."""
    raw_type: str | None = None
    """The C{Content-Type} of C{raw}."""
    streamed: bool = False
    """The handler already wrote the whole response (status, headers, body)."""

    @status.validator
    def _check_status(self, attribute: attrs.Attribute[int], value: int) -> None:
        if not 200 <= value <= 399:
            raise ValueError(f"a Reply is a success; raise an ApiError for {value}")

    def __attrs_post_init__(self) -> None:
        if (self.raw is None) != (self.raw_type is None):
            raise ValueError("raw and raw_type go together")
        if self.raw is not None and self.body is not None:
            raise ValueError("a Reply has a JSON body or raw bytes, not both")

    @classmethod
    def content(
        cls, raw: bytes, content_type: str, headers: Mapping[str, str] | None = None
    ) -> Reply:
        """200 with C{raw} bytes of C{content_type} (a page, a script)."""
        return cls(raw=raw, raw_type=content_type, headers=dict(headers or {}))

    @classmethod
    def redirect(cls, location: str, headers: Mapping[str, str] | None = None) -> Reply:
        """303 See Other to C{location}, no body."""
        return cls(status=303, headers={**(headers or {}), "Location": location})

    @classmethod
    def already_streamed(cls) -> Reply:
        """The handler wrote the response itself (e.g. an event stream)."""
        return cls(streamed=True)

    @classmethod
    def no_content(cls) -> Reply:
        """204 with no body."""
        return cls(status=204)

    @classmethod
    def created(cls, body: JsonValue) -> Reply:
        """201 with a JSON body."""
        return cls(status=201, body=body)


HandlerResult = Reply | Mapping[str, JsonValue]
"""A handler returns a L{Reply}, or a mapping sent as a 200 JSON object."""

Handler = Callable[["Call"], HandlerResult | Awaitable[HandlerResult]]
"""A route handler: takes the authenticated L{Call}, may be C{async}."""


def _features(value: Iterable[Feature]) -> frozenset[Feature]:
    return frozenset(value)


@attrs.frozen
class Route:
    """
    One route declaration.

    @ivar path: a Klein/werkzeug rule, e.g. C{/v1/entities/<type>/<id>};
        parameters are strings without C{/} and reach the handler in
        C{call.params}.
    @ivar mounted_with: features without which the route does not exist (a
        real 404).
    @ivar serves_with: features without which the mounted route answers
        503 C{temporarily_unavailable}.
    @ivar api_alias: also serve the route at C{/api} + C{path}.
    """

    method: str = attrs.field()
    path: str = attrs.field()
    auth: AuthKind
    handler: Handler = attrs.field(eq=False)
    mounted_with: frozenset[Feature] = attrs.field(default=frozenset(), converter=_features)
    serves_with: frozenset[Feature] = attrs.field(default=frozenset(), converter=_features)
    api_alias: bool = False

    @method.validator
    def _check_method(self, attribute: attrs.Attribute[str], value: str) -> None:
        if value not in METHODS:
            raise ValueError(f"method must be one of {sorted(METHODS)}, got {value!r}")

    @path.validator
    def _check_path(self, attribute: attrs.Attribute[str], value: str) -> None:
        if _PATH_PATTERN.fullmatch(value) is None:
            raise ValueError(f"route path is not a plain rule: {value!r}")
        if value == API_PREFIX or value.startswith(API_PREFIX + "/"):
            raise ValueError(f"declare the bare path and set api_alias: {value!r}")


@attrs.frozen
class MountedRoute:
    """
    A route as registered: the concrete C{path} (bare or C{/api}-prefixed).
    """

    path: str
    route: Route

    @property
    def endpoint(self) -> str:
        """The unique Klein endpoint name, e.g. C{"GET /api/v1/whoami"}."""
        return f"{self.route.method} {self.path}"


def plan_mounts(routes: Iterable[Route], features: frozenset[Feature]) -> tuple[MountedRoute, ...]:
    """
    The routes to register given this process's C{features}: each route
    whose C{mounted_with} features are all present, at its bare path and,
    when C{api_alias}, under C{/api} too.

    @raise ValueError: two mounted routes share a method and path.
    """
    planned: list[MountedRoute] = []
    seen: set[str] = set()
    for route in routes:
        if not route.mounted_with <= features:
            continue
        paths = [route.path]
        if route.api_alias:
            paths.append(API_PREFIX + route.path)
        for path in paths:
            mounted = MountedRoute(path=path, route=route)
            if mounted.endpoint in seen:
                raise ValueError(f"route declared twice: {mounted.endpoint}")
            seen.add(mounted.endpoint)
            planned.append(mounted)
    return tuple(planned)
