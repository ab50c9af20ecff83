"""
Assembling the control plane's app from its settings.

L{build_control_app} derives the features from L{ControlSettings}, builds
the authenticators this package owns (service token, host JWT), adds the
whoami and OpenAPI document routes, and registers the caller's routes. Other
parts of the control plane pass their own L{Route} declarations and
authenticators (admin session, enroll token, agent identity) in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from svc.control.auth import HostJwtAuthenticator, ServiceTokenAuthenticator
from svc.control.hostjwt import HostJwtPolicy, HostJwtVerifier
from svc.control.http import Authenticator, ControlApp
from svc.control.openapi import OPENAPI_ROUTES
from svc.control.routing import AuthKind, Feature, Route
from svc.control.settings import ControlSettings, IdentitySettings
from svc.control.whoami import WHOAMI_ROUTES


def features_for(settings: ControlSettings) -> frozenset[Feature]:
    """
    The features C{settings} provide: the database (C{DATABASE_URL}), an
    agent CA, host identity (C{SVC_IDENTITY_AUDIENCE}).
    """
    features = set()
    if settings.database_url is not None:
        features.add(Feature.DATABASE)
    if settings.agent_ca_configured:
        features.add(Feature.AGENT_CA)
    if settings.identity is not None:
        features.add(Feature.HOST_IDENTITY)
    return frozenset(features)


def host_jwt_verifier(
    identity: IdentitySettings,
    now: Callable[[], float],
    read_file: Callable[[Path], bytes] = Path.read_bytes,
) -> HostJwtVerifier:
    """
    The verifier for C{identity}, its key read from
    C{SVC_IDENTITY_PUBLIC_KEY_FILE} now.

    @raise svc.config.ConfigError: the key file is unreadable or unusable.
    """
    policy = HostJwtPolicy(
        audience=identity.audience,
        issuer=identity.issuer,
        tenant_claim=identity.tenant_claim,
        tenant_allowlist=identity.tenant_allowlist,
    )
    return HostJwtVerifier.from_file(identity.public_key_file, policy, now, read_file)


def standard_authenticators(
    settings: ControlSettings,
    now: Callable[[], float],
    read_file: Callable[[Path], bytes] = Path.read_bytes,
) -> dict[AuthKind, Authenticator]:
    """
    The authenticators C{settings} enable: the service token when
    C{SVC_CONTROL_PLANE_TOKEN} is set, host JWTs when
    C{SVC_IDENTITY_AUDIENCE} is set.
    """
    authenticators: dict[AuthKind, Authenticator] = {}
    if settings.control_plane_token is not None:
        authenticators[AuthKind.SERVICE_TOKEN] = ServiceTokenAuthenticator(
            settings.control_plane_token
        )
    if settings.identity is not None:
        authenticators[AuthKind.HOST_JWT] = HostJwtAuthenticator(
            host_jwt_verifier(settings.identity, now, read_file)
        )
    return authenticators


def build_control_app(
    settings: ControlSettings,
    now: Callable[[], float],
    routes: Iterable[Route] = (),
    authenticators: Mapping[AuthKind, Authenticator] | None = None,
    *,
    ready: Callable[[Feature], bool] | None = None,
    read_file: Callable[[Path], bytes] = Path.read_bytes,
) -> ControlApp:
    """
    The control-plane app for C{settings}: healthz, whoami, the OpenAPI
    document and C{routes}, each mounted per the mounting rules.

    @param authenticators: added to (and overriding) the standard ones.
    @param ready: see L{ControlApp}.
    @raise svc.config.ConfigError: the configuration cannot serve.
    """
    all_authenticators = standard_authenticators(settings, now, read_file)
    all_authenticators.update(authenticators or {})
    return ControlApp(
        [*WHOAMI_ROUTES, *OPENAPI_ROUTES, *routes],
        features_for(settings),
        authenticators=all_authenticators,
        now=now,
        max_body_bytes=settings.max_body_bytes,
        ready=ready,
    )
