"""
Tests for L{svc.control.routing}.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from svc.control.http import Call
from svc.control.routing import AuthKind, Feature, HandlerResult, Reply, Route, plan_mounts


def _handler(call: Call) -> HandlerResult:
    return {}


def _route(path: str, **kwargs: object) -> Route:
    return Route("GET", path, AuthKind.PUBLIC, _handler, **kwargs)  # type: ignore[arg-type]


class PlanMountsTests(SynchronousTestCase):
    """
    Tests for L{plan_mounts}.
    """

    def test_unconditional(self) -> None:
        """A route with no requirements is always mounted, once."""
        planned = plan_mounts([_route("/a")], frozenset())
        self.assertEqual([m.endpoint for m in planned], ["GET /a"])

    def test_requirements(self) -> None:
        """A route is mounted only when all its features are present."""
        route = _route("/b", mounted_with={Feature.DATABASE, Feature.AGENT_CA})
        self.assertEqual(plan_mounts([route], frozenset({Feature.DATABASE})), ())
        self.assertEqual(len(plan_mounts([route], frozenset(Feature))), 1)

    def test_api_alias(self) -> None:
        """An aliased route is mounted at its path and under /api."""
        planned = plan_mounts([_route("/v1/x", api_alias=True)], frozenset())
        self.assertEqual([m.path for m in planned], ["/v1/x", "/api/v1/x"])

    def test_serves_with_does_not_unmount(self) -> None:
        """C{serves_with} features do not affect mounting."""
        route = _route("/u", serves_with={Feature.AGENT_CA})
        self.assertEqual(len(plan_mounts([route], frozenset())), 1)

    def test_duplicate_refused(self) -> None:
        """Two mounted routes with the same method and path are refused."""
        self.assertRaises(ValueError, plan_mounts, [_route("/a"), _route("/a")], frozenset())

    def test_duplicate_unmounted_allowed(self) -> None:
        """A duplicate that is not mounted does not clash."""
        routes = [_route("/a"), _route("/a", mounted_with={Feature.DATABASE})]
        self.assertEqual(len(plan_mounts(routes, frozenset())), 1)


class RouteTests(SynchronousTestCase):
    """
    Tests for L{Route} and L{Reply} validation.
    """

    def test_bad_method(self) -> None:
        """Unknown methods are refused."""
        self.assertRaises(ValueError, Route, "FETCH", "/a", AuthKind.PUBLIC, _handler)

    def test_bad_paths(self) -> None:
        """Relative, trailing-slash, converter and /api-prefixed paths are refused."""
        for path in ("a", "/a/", "/<int:x>", "/api/v1/x", "/api", "//a"):
            self.assertRaises(ValueError, _route, path)

    def test_parameters(self) -> None:
        """Plain named parameters are accepted."""
        _route("/v1/entities/<type>/<id>")

    def test_reply_is_success(self) -> None:
        """A Reply with an error status is refused."""
        self.assertRaises(ValueError, Reply, status=404)
        self.assertEqual(Reply.no_content().status, 204)
        self.assertEqual(Reply.created({"a": 1}).status, 201)
