"""
Tests for L{svc.control.routes_owner} and L{svc.control.owner_auth} through
the real app assembly, on SQLite and PostgreSQL: sign-in links, cookies,
cross-site protection, logout, allocations of the signed-in user only,
usage, revoke, owner-forced unmount and API tokens.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urljoin

from twisted.internet.task import Clock
from twisted.web.resource import Resource

from svc.control.app import build_control_app
from svc.control.owner_auth import (
    OwnerAuthenticator,
    csrf_token_for,
    hash_link_secret,
    hash_secret,
)
from svc.control.routes_entities import EntityDeps, entity_routes
from svc.control.routes_owner import MAX_LIVE_TOKENS, OwnerDeps, owner_routes
from svc.control.routing import AuthKind, Route
from svc.control.settings import ControlSettings
from svc.control.store.values import MountHolder
from svc.control.test.backends import PostgresBackend, RouteBackend, SQLiteBackend, json_body
from svc.control.test.test_dataplane_client import FakeDataPlane, fake_client
from svc.control.test.test_routes_entities import ENVIRON, SERVICE, RecordedPushes
from svc.testing.web import Answer

NOW = datetime(2026, 11, 22, 19, 0, 0, tzinfo=UTC)
LINK = "link-secret-for-alice-0123456789abcdefghijk"
BOB_LINK = "link-secret-for-bob-0123456789abcdefghijklm"


def cookie_value(answer: Answer) -> str:
    """The session secret a Set-Cookie answer installs."""
    header = answer.header("set-cookie")
    assert header is not None
    first = header.split(";", 1)[0]
    name, _, value = first.partition("=")
    assert name == "svc_admin_session"
    return value


class OwnerRouteCase(RouteBackend):
    """Two users with one agent each, a server with the tenants placed."""

    environ: dict[str, str] = ENVIRON

    async def set_up(self) -> None:
        self.clock = Clock()
        self.clock.advance(NOW.timestamp())
        self.store = await self.open_control_store()
        self.pushes = RecordedPushes()
        self.plane = FakeDataPlane("dp1.test")
        self.plane.usage_answer = {"owner": "alice", "used_bytes": 70, "agents": {"a1": 70}}
        settings = ControlSettings.from_environ(self.environ)
        client = fake_client({"dp1.test": self.plane}, self.clock)
        entities = EntityDeps(self.store, settings, self.clock, client, self.pushes)
        owners = OwnerDeps(self.store, settings, self.clock, client, self.pushes)
        self.resource: Resource = build_control_app(
            settings,
            self.clock.seconds,
            [*entity_routes(entities), *owner_routes(owners), *self.extra_routes()],
            {AuthKind.ADMIN_SESSION: OwnerAuthenticator(self.store, self.clock.seconds)},
        ).resource()
        self.alloc = await self.provision("a1", "alice", 1000)
        self.bob_alloc = await self.provision("b1", "bob", 500)
        await self.result(self.store.register_server("dp1.test", "10.0.0.1:7443", 10, NOW))
        for tenant in ("alice", "bob"):
            await self.result(self.store.place_tenant(tenant, NOW))
        await self.seed_link("alice", LINK)
        await self.seed_link("bob", BOB_LINK)

    def extra_routes(self) -> list[Route]:
        """More routes for the app (subclasses)."""
        return []

    async def provision(self, agent: str, owner: str, grant: int) -> str:
        body = {"type": "agent", "id": agent, "owner": owner, "grant_bytes": grant}
        answer = await self.send(
            self.resource, "POST", "/v1/entities", headers=SERVICE, body=json_body(body)
        )
        self.assertEqual(answer.status, 200, answer.body)
        allocation_id: str = answer.json()["allocation_id"]
        return allocation_id

    async def seed_link(self, user: str, secret: str, ttl: timedelta = timedelta(hours=1)) -> None:
        await self.result(self.store.put_user(user, user.title(), NOW))
        await self.result(
            self.store.create_admin_session(user, hash_link_secret(secret), NOW, NOW + ttl)
        )

    async def sign_in(self, link: str = LINK) -> str:
        answer = await self.send(self.resource, "GET", f"/admin/session?token={link}")
        self.assertEqual(answer.status, 303, answer.body)
        return cookie_value(answer)

    async def call(
        self,
        method: str,
        path: str,
        *,
        cookie: str | None = None,
        token: str | None = None,
        body: object = None,
        csrf: str | bool = True,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        sent: dict[str, str] = dict(headers or {})
        if cookie is not None:
            sent["Cookie"] = f"svc_admin_session={cookie}"
            if csrf is True:
                sent["X-CSRF-Token"] = csrf_token_for(cookie)
            elif isinstance(csrf, str):
                sent["X-CSRF-Token"] = csrf
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json_body(body)
            sent["Content-Type"] = "application/json"
        return await self.send(self.resource, method, path, headers=sent, body=data)

    def assertError(self, answer: Answer, status: int, code: str, description: Any = None) -> None:
        self.assertEqual(answer.status, status, answer.body)
        self.assertEqual(answer.json()["error"], code, answer.body)
        if description is not None:
            self.assertEqual(answer.json().get("error_description"), description, answer.body)


class SignInTests(OwnerRouteCase):
    """The sign-in link, the cookie and logout."""

    async def test_link_sets_a_strict_http_only_cookie_and_redirects_to_the_dashboard(
        self,
    ) -> None:
        answer = await self.send(self.resource, "GET", f"/admin/session?token={LINK}")
        self.assertEqual(answer.status, 303)
        self.assertEqual(answer.header("location"), "../dashboard")
        cookie = answer.header("set-cookie") or ""
        attributes = [part.strip() for part in cookie.split(";")]
        self.assertIn("HttpOnly", attributes)
        self.assertIn("SameSite=Strict", attributes)
        self.assertIn("Path=/", attributes)
        self.assertIn("Max-Age=3600", attributes)
        self.assertNotIn("Secure", attributes)  # SVC_DEV_MODE=1 in these tests
        self.assertNotEqual(cookie_value(answer), LINK)

    async def test_sign_in_and_logout_under_api(self) -> None:
        """/api/admin/session signs in (to /api/dashboard); /api/auth/logout ends it."""
        answer = await self.send(self.resource, "GET", f"/api/admin/session?token={LINK}")
        self.assertEqual(answer.status, 303, answer.body)
        location = answer.header("location") or ""
        self.assertEqual(
            urljoin("https://c.test/api/admin/session", location), "https://c.test/api/dashboard"
        )
        self.assertEqual(
            urljoin("https://c.test/admin/session", location), "https://c.test/dashboard"
        )
        cookie = cookie_value(answer)
        self.assertEqual((await self.call("GET", "/api/me", cookie=cookie)).status, 200)
        out = await self.call("POST", "/api/auth/logout", cookie=cookie)
        self.assertEqual(out.status, 204, out.body)
        self.assertError(await self.call("GET", "/me", cookie=cookie), 401, "invalid_token")

    async def test_link_secret_is_no_cookie(self) -> None:
        """A link's secret sent as the cookie signs nobody in and does not spend the link."""
        self.assertError(await self.call("GET", "/me", cookie=LINK), 401, "invalid_token")
        self.assertError(await self.call("POST", "/auth/logout", cookie=LINK), 401, "invalid_token")
        cookie = await self.sign_in()
        self.assertNotEqual(cookie, LINK)
        self.assertEqual((await self.call("GET", "/me", cookie=cookie)).status, 200)

    async def test_cookie_secret_is_no_link(self) -> None:
        """A browser session's cookie secret is not accepted as a sign-in link."""
        cookie = await self.sign_in()
        answer = await self.send(self.resource, "GET", f"/admin/session?token={cookie}")
        self.assertError(answer, 401, "invalid_token")
        self.assertEqual((await self.call("GET", "/me", cookie=cookie)).status, 200)

    async def test_link_is_spent_by_its_first_use(self) -> None:
        await self.sign_in()
        again = await self.send(self.resource, "GET", f"/admin/session?token={LINK}")
        self.assertError(again, 401, "invalid_token")

    async def test_unknown_missing_and_expired_links_are_refused(self) -> None:
        for path in ("/admin/session?token=nope", "/admin/session"):
            self.assertError(await self.send(self.resource, "GET", path), 401, "invalid_token")
        self.clock.advance(3601)
        answer = await self.send(self.resource, "GET", f"/admin/session?token={LINK}")
        self.assertError(answer, 401, "invalid_token")

    async def test_cookie_signs_the_user_in_with_its_csrf_token(self) -> None:
        cookie = await self.sign_in()
        me = await self.call("GET", "/me", cookie=cookie)
        self.assertEqual(me.status, 200, me.body)
        self.assertEqual(
            me.json(),
            {
                "user_id": "alice",
                "display_name": "Alice",
                "auth": "session",
                "csrf_token": csrf_token_for(cookie),
                "session_expires_at": "2026-11-22T20:00:00Z",
            },
        )

    async def test_session_expires(self) -> None:
        cookie = await self.sign_in()
        self.clock.advance(3600)
        self.assertError(await self.call("GET", "/me", cookie=cookie), 401, "invalid_token")

    async def test_logout_ends_the_session_server_side(self) -> None:
        cookie = await self.sign_in()
        out = await self.call("POST", "/auth/logout", cookie=cookie)
        self.assertEqual(out.status, 204, out.body)
        self.assertIn("Max-Age=0", out.header("set-cookie") or "")
        self.assertTrue((out.header("set-cookie") or "").startswith("svc_admin_session=;"))
        self.assertError(await self.call("GET", "/me", cookie=cookie), 401, "invalid_token")

    async def test_no_cookie_is_refused(self) -> None:
        self.assertError(await self.call("GET", "/me"), 401, "invalid_token")
        self.assertError(await self.call("GET", "/me", cookie="forged"), 401, "invalid_token")

    async def test_suspended_user_is_signed_out(self) -> None:
        cookie = await self.sign_in()
        await self.result(self.store.set_user_suspended("alice", True))
        self.assertError(await self.call("GET", "/me", cookie=cookie), 401, "invalid_token")


class CrossSiteTests(OwnerRouteCase):
    """State changes with the cookie need a same-site origin and the CSRF token."""

    async def test_cross_origin_post_with_the_cookie_is_refused(self) -> None:
        cookie = await self.sign_in()
        answer = await self.call(
            "POST",
            f"/allocations/{self.alloc}/unmount",
            cookie=cookie,
            headers={"Origin": "https://evil.example"},
        )
        self.assertError(answer, 403, "access_denied", "csrf_check_failed")

    async def test_cross_site_fetch_metadata_is_refused(self) -> None:
        cookie = await self.sign_in()
        answer = await self.call(
            "POST",
            f"/allocations/{self.alloc}/unmount",
            cookie=cookie,
            headers={"Sec-Fetch-Site": "cross-site"},
        )
        self.assertError(answer, 403, "access_denied", "csrf_check_failed")

    async def test_post_without_or_with_a_wrong_csrf_token_is_refused(self) -> None:
        cookie = await self.sign_in()
        for csrf in (False, "wrong", csrf_token_for("another-secret")):
            answer = await self.call(
                "POST", f"/allocations/{self.alloc}/unmount", cookie=cookie, csrf=csrf
            )
            self.assertError(answer, 403, "access_denied", "csrf_check_failed")
        self.assertEqual(self.pushes.revocations, 0)

    async def test_logout_needs_the_csrf_token_too(self) -> None:
        cookie = await self.sign_in()
        answer = await self.call("POST", "/auth/logout", cookie=cookie, csrf=False)
        self.assertError(answer, 403, "access_denied", "csrf_check_failed")
        self.assertEqual((await self.call("GET", "/me", cookie=cookie)).status, 200)

    async def test_same_site_post_with_the_token_is_served(self) -> None:
        cookie = await self.sign_in()
        answer = await self.call(
            "POST",
            f"/allocations/{self.alloc}/unmount",
            cookie=cookie,
            headers={"Sec-Fetch-Site": "same-origin"},
        )
        self.assertEqual(answer.status, 200, answer.body)

    async def test_reads_need_no_csrf_token(self) -> None:
        cookie = await self.sign_in()
        answer = await self.call("GET", "/allocations", cookie=cookie, csrf=False)
        self.assertEqual(answer.status, 200, answer.body)


class AllocationTests(OwnerRouteCase):
    """Only the signed-in user's allocations exist for it."""

    async def test_lists_only_the_users_allocations(self) -> None:
        cookie = await self.sign_in()
        answer = await self.call("GET", "/allocations", cookie=cookie)
        [allocation] = answer.json()["allocations"]
        self.assertEqual(allocation["allocation_id"], self.alloc)
        self.assertEqual(allocation["agent_id"], "a1")
        self.assertEqual(allocation["grant_bytes"], 1000)
        self.assertEqual(allocation["state"], "provisioned")
        self.assertEqual(allocation["virtual_path"], "/mnt/agents-root/agents/a1")
        self.assertIsNone(allocation["mount"])

    async def test_another_users_allocation_is_not_found(self) -> None:
        cookie = await self.sign_in()
        for method, suffix in (("GET", "usage"), ("POST", "revoke"), ("POST", "unmount")):
            answer = await self.call(
                method, f"/allocations/{self.bob_alloc}/{suffix}", cookie=cookie
            )
            self.assertError(answer, 404, "not_found")
            unknown = await self.call(method, f"/allocations/{'0' * 32}/{suffix}", cookie=cookie)
            self.assertError(unknown, 404, "not_found")
        bob = await self.call("GET", "/allocations", cookie=await self.sign_in(BOB_LINK))
        self.assertEqual(bob.json()["allocations"][0]["state"], "provisioned")

    async def test_usage_is_the_agents_bytes_on_its_server(self) -> None:
        cookie = await self.sign_in()
        answer = await self.call("GET", f"/allocations/{self.alloc}/usage", cookie=cookie)
        self.assertEqual(
            answer.json(),
            {
                "allocation_id": self.alloc,
                "agent_id": "a1",
                "tenant_id": "alice",
                "grant_bytes": 1000,
                "used_bytes": 70,
            },
        )
        [asked] = [r for r in self.plane.requests if r.path == "/control/usage"]
        self.assertEqual(asked.args, {"owner": ["alice"]})

    async def test_usage_when_the_server_is_unreachable_is_503(self) -> None:
        cookie = await self.sign_in()
        self.plane.reachable = False
        answer = await self.call("GET", f"/allocations/{self.alloc}/usage", cookie=cookie)
        self.assertError(answer, 503, "temporarily_unavailable", "dataplane_unreachable")

    async def test_revoke_revokes_and_pushes(self) -> None:
        cookie = await self.sign_in()
        answer = await self.call("POST", f"/allocations/{self.alloc}/revoke", cookie=cookie)
        self.assertEqual(answer.json()["state"], "revoked", answer.body)
        self.assertEqual(self.pushes.revocations, 1)
        again = await self.call("POST", f"/allocations/{self.alloc}/revoke", cookie=cookie)
        self.assertEqual(again.json()["state"], "revoked")
        self.assertEqual(self.pushes.revocations, 1)
        gone = await self.call("POST", f"/allocations/{self.alloc}/unmount", cookie=cookie)
        self.assertError(gone, 410, "revoked")

    async def test_unmount_ends_the_live_lease_and_pushes_its_leaf(self) -> None:
        holder = MountHolder(
            agent_id="a1", leaf_serial="abc1", leaf_not_after=NOW + timedelta(hours=1)
        )
        await self.result(self.store.acquire_mount(self.alloc, holder, NOW, timedelta(minutes=2)))
        cookie = await self.sign_in()
        [listed] = (await self.call("GET", "/allocations", cookie=cookie)).json()["allocations"]
        self.assertEqual(listed["mount"]["agent_id"], "a1")
        self.assertTrue(listed["mount"]["live"])
        answer = await self.call("POST", f"/allocations/{self.alloc}/unmount", cookie=cookie)
        self.assertEqual(answer.json(), {"allocation_id": self.alloc, "released": True})
        self.assertEqual(self.pushes.revocations, 1)
        lease = await self.result(self.store.get_mount_lease(self.alloc))
        self.assertIsNone(lease)
        revoked = await self.result(self.store.active_revocations(NOW))
        self.assertIn("abc1", [r.serial for r in revoked])
        again = await self.call("POST", f"/allocations/{self.alloc}/unmount", cookie=cookie)
        self.assertEqual(again.json()["released"], False)


class ApiTokenTests(OwnerRouteCase):
    """API tokens: shown once, listed without secrets, revoked at once."""

    async def create(self, cookie: str, name: str = "ci") -> Answer:
        return await self.call("POST", "/v1/tokens", cookie=cookie, body={"name": name})

    async def test_created_token_is_shown_once_and_works(self) -> None:
        cookie = await self.sign_in()
        created = await self.create(cookie)
        self.assertEqual(created.status, 201, created.body)
        token = created.json()["token"]
        self.assertTrue(token.startswith("svc_"))
        self.assertEqual(len(token), 4 + 43)
        listed = (await self.call("GET", "/v1/tokens", cookie=cookie)).json()["tokens"]
        self.assertEqual([t["id"] for t in listed], [created.json()["id"]])
        self.assertNotIn(token, str(listed))
        self.assertNotIn("token", listed[0])
        me = await self.call("GET", "/me", token=token)
        self.assertEqual(
            me.json(), {"user_id": "alice", "display_name": "Alice", "auth": "api_token"}
        )
        allocations = await self.call("GET", "/allocations", token=token)
        self.assertEqual(len(allocations.json()["allocations"]), 1)

    async def test_only_the_hash_is_stored(self) -> None:
        cookie = await self.sign_in()
        token = (await self.create(cookie)).json()["token"]
        rows = await self.sql(self.store, "SELECT token_hash FROM api_tokens")
        self.assertEqual(rows, [(hash_secret(token),)])

    async def test_revoked_token_stops_working_at_once(self) -> None:
        cookie = await self.sign_in()
        created = (await self.create(cookie)).json()
        deleted = await self.call("DELETE", f"/v1/tokens/{created['id']}", cookie=cookie)
        self.assertEqual(deleted.status, 204, deleted.body)
        self.assertError(
            await self.call("GET", "/me", token=created["token"]), 401, "invalid_token"
        )
        [listed] = (await self.call("GET", "/v1/tokens", cookie=cookie)).json()["tokens"]
        self.assertEqual(listed["revoked_at"], "2026-11-22T19:00:00Z")
        again = await self.call("DELETE", f"/v1/tokens/{created['id']}", cookie=cookie)
        self.assertEqual(again.status, 204)

    async def test_another_users_token_is_not_found(self) -> None:
        created = (await self.create(await self.sign_in())).json()
        bob = await self.sign_in(BOB_LINK)
        answer = await self.call("DELETE", f"/v1/tokens/{created['id']}", cookie=bob)
        self.assertError(answer, 404, "not_found")
        self.assertEqual((await self.call("GET", "/me", token=created["token"])).status, 200)

    async def test_api_token_cannot_manage_tokens_or_log_out(self) -> None:
        token = (await self.create(await self.sign_in())).json()["token"]
        for method, path, body in (
            ("POST", "/v1/tokens", {"name": "x"}),
            ("GET", "/v1/tokens", None),
            ("POST", "/auth/logout", None),
        ):
            answer = await self.call(method, path, token=token, body=body)
            self.assertError(answer, 403, "access_denied", "session_required")

    async def test_bad_bearer_is_refused_even_with_a_good_cookie(self) -> None:
        cookie = await self.sign_in()
        answer = await self.call("GET", "/me", cookie=cookie, token="svc_unknown")
        self.assertError(answer, 401, "invalid_token")
        self.assertError(
            await self.call("GET", "/me", token="not-an-svc-token"), 401, "invalid_token"
        )

    async def test_token_names_are_checked(self) -> None:
        cookie = await self.sign_in()
        for name in ("", " padded ", "x" * 65, "tab\there", 7):
            answer = await self.call("POST", "/v1/tokens", cookie=cookie, body={"name": name})
            self.assertError(answer, 400, "invalid_request", "invalid_name")
        missing = await self.call("POST", "/v1/tokens", cookie=cookie, body={})
        self.assertError(missing, 400, "invalid_request", "missing_field:name")

    async def test_live_tokens_are_limited(self) -> None:
        cookie = await self.sign_in()
        for i in range(MAX_LIVE_TOKENS):
            await self.result(self.store.create_api_token("alice", f"t{i}", f"{i:064x}", NOW))
        self.assertError(await self.create(cookie), 409, "too_many_tokens")


class SignInSQLiteTests(SignInTests, SQLiteBackend):
    pass


class SignInPostgresTests(SignInTests, PostgresBackend):
    pass


class CrossSiteSQLiteTests(CrossSiteTests, SQLiteBackend):
    pass


class AllocationSQLiteTests(AllocationTests, SQLiteBackend):
    pass


class AllocationPostgresTests(AllocationTests, PostgresBackend):
    pass


class ApiTokenSQLiteTests(ApiTokenTests, SQLiteBackend):
    pass


class ApiTokenPostgresTests(ApiTokenTests, PostgresBackend):
    pass


class SecureCookieTests(OwnerRouteCase, SQLiteBackend):
    """Outside dev mode the cookie is Secure."""

    environ = {
        **{k: v for k, v in ENVIRON.items() if k != "SVC_DEV_MODE"},
        "SVC_CA_KEK": "A" * 43 + "=",
    }

    async def test_cookie_is_secure_outside_dev_mode(self) -> None:
        answer = await self.send(self.resource, "GET", f"/admin/session?token={LINK}")
        self.assertIn("Secure", [p.strip() for p in (answer.header("set-cookie") or "").split(";")])
