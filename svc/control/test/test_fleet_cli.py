"""
Tests for L{svc.control.fleet_cli}: the fleet commands run against the real
control-plane app (fleet and entity routes, an in-memory store, a fake
data-plane server), in process; and their configuration.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.cli import build_parser
from svc.config import ConfigError
from svc.control import fleet_cli
from svc.control.app import build_control_app
from svc.control.fleet_cli import FleetContext, human_bytes, run_fleet_command, transport_from
from svc.control.routes_entities import EntityDeps, entity_routes
from svc.control.routes_fleet import FleetDeps, fleet_routes
from svc.control.settings import ControlSettings
from svc.control.test.test_dataplane_client import FakeDataPlane, fake_client
from svc.control.test.test_routes_entities import ENVIRON, FQDN, NOW, TOKEN, RecordedPushes
from svc.sdk.errors import Headers, error_from_response
from svc.sdk.transport import Answer
from svc.testing.control_store import memory_control_store
from svc.testing.web import request


class AppCaller:
    """The SDK transport's C{request}, answered by a resource in process."""

    def __init__(self, case: SynchronousTestCase, resource: Any, token: str = TOKEN) -> None:
        self.case = case
        self.resource = resource
        self.token = token
        self.sent: list[tuple[str, str]] = []

    def request(
        self, operation: str, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> Answer:
        self.sent.append((method, path))
        headers = {"Authorization": f"Bearer {self.token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        answer = request(self.case, self.resource, method, path, headers=headers, body=data)
        received = Headers(tuple((k, v) for k, vs in answer.headers.items() for v in vs))
        if not 200 <= answer.status <= 299:
            raise error_from_response(
                operation=operation,
                method=method,
                path=path,
                status=answer.status,
                headers=received,
                body=answer.body,
                body_truncated=False,
                sent_request_id="r",
            )
        return Answer(operation, method, path, answer.status, received, answer.body, "r")


class FleetCommandTests(SynchronousTestCase):
    """Each command, its output and its progress."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(NOW.timestamp())
        self.store = memory_control_store()
        self.addCleanup(self.store.close)
        self.plane = FakeDataPlane(FQDN)
        client = fake_client({FQDN: self.plane}, self.clock)
        settings = ControlSettings.from_environ(ENVIRON)
        entity = EntityDeps(self.store, settings, self.clock, client, RecordedPushes())
        routes = [*entity_routes(entity), *fleet_routes(FleetDeps(self.store, self.clock, client))]
        self.app = build_control_app(settings, self.clock.seconds, routes)
        self.caller = AppCaller(self, self.app.resource())
        self.timeouts: list[float] = []

    def provision(self, agent: str, owner: str = "acme") -> str:
        done = self.successResultOf(
            self.store.provision(
                agent_id=agent, owner_id=owner, tenant_id=owner, grant_bytes=1 << 30, now=NOW
            )
        )
        allocation_id: str = done.allocation.allocation_id
        return allocation_id

    def place(self, tenant: str = "acme") -> None:
        self.successResultOf(self.store.register_server(FQDN, "10.0.0.1:7443", 10, NOW))
        self.successResultOf(self.store.place_tenant(tenant, NOW))

    def command(self, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()

        def caller(timeout: float) -> AppCaller:
            self.timeouts.append(timeout)
            return self.caller

        args = build_parser().parse_args(list(argv))
        status = run_fleet_command(args, FleetContext(caller, out, err))
        return status, out.getvalue(), err.getvalue()

    def test_allocations_table_and_json(self) -> None:
        """allocations list prints a table, or with --json every allocation."""
        first = self.provision("a1")
        self.provision("b1", owner="bob")
        status, out, _ = self.command("allocations", "list")
        self.assertEqual(status, 0)
        lines = out.splitlines()
        self.assertEqual(
            lines[0].split(),
            ["ALLOCATION", "AGENT", "OWNER", "TENANT", "STATE", "GRANT", "CREATED"],
        )
        self.assertEqual(len(lines), 3)
        self.assertIn("1.0 GiB", out)
        status, out, _ = self.command("allocations", "list", "--owner", "acme", "--json")
        listed = json.loads(out)["allocations"]
        self.assertEqual([a["allocation_id"] for a in listed], [first])
        self.assertEqual(listed[0]["state"], "provisioned")

    def test_pages_are_followed(self) -> None:
        """A listing longer than a page is fetched page after page, with progress."""
        self.patch(fleet_cli, "PAGE", 2)
        made = sorted(self.provision(f"a{n}", owner=f"o{n}") for n in range(5))
        status, out, err = self.command("agents", "list", "--json")
        self.assertEqual(status, 0)
        self.assertEqual([a["allocation_id"] for a in json.loads(out)["agents"]], made)
        self.assertEqual(err.splitlines(), ["... 2 allocations so far", "... 4 allocations so far"])
        self.assertEqual(len([s for s in self.caller.sent if "allocations" in s[1]]), 3)

    def test_agents_by_state(self) -> None:
        """agents list --state keeps that state."""
        self.provision("a1")
        gone = self.provision("a2")
        self.successResultOf(self.store.revoke_allocation(gone, NOW))
        _, out, _ = self.command("agents", "list", "--state", "revoked")
        self.assertEqual([line.split()[0] for line in out.splitlines()], ["AGENT", "a2"])

    def test_usage(self) -> None:
        """usage show prints the owner's use and each agent's; --json the route's body."""
        self.provision("a1")
        self.place()
        status, out, _ = self.command("usage", "show", "acme")
        self.assertEqual(status, 0, out)
        self.assertEqual(out.splitlines()[0], "owner acme: 10 B used of no budget")
        self.assertEqual(out.splitlines()[2].split(), ["a1", "7", "B", "1.0", "GiB", "provisioned"])
        status, out, _ = self.command("usage", "show", "acme", "--json")
        self.assertEqual(json.loads(out)["used_bytes"], 10)

    def test_usage_unknown_owner(self) -> None:
        """An unknown owner: exit 1, the refusal named on stderr."""
        status, out, err = self.command("usage", "show", "nobody")
        self.assertEqual((status, out), (1, ""))
        self.assertIn("svc: usage show: GET /v1/tenants/nobody/usage: HTTP 404 not_found", err)

    def test_gc_sweep(self) -> None:
        """gc sweep collects on every registered server, a progress line each, long timeout."""
        self.provision("a1")
        self.place()
        status, out, err = self.command("gc", "sweep")
        self.assertEqual(status, 0, err)
        self.assertEqual(err, f"gc 1/1 {FQDN}: 5 chunks, 4.9 KiB freed over 2 tenants\n")
        self.assertEqual(out, "collected 5 chunks, 4.9 KiB on 1 of 1 servers\n")
        self.assertIn(960.0, self.timeouts)
        status, out, err = self.command("gc", "sweep", "--server", FQDN, "--json")
        self.assertEqual(json.loads(out)["bytes_freed"], 5000)

    def test_gc_failures(self) -> None:
        """A server that cannot be reached is named and the status is 1; none at all refuses."""
        status, _, err = self.command("gc", "sweep")
        self.assertEqual((status, err), (1, "svc: gc sweep: no data-plane server is registered\n"))
        self.provision("a1")
        self.place()
        self.plane.reachable = False
        status, out, err = self.command("gc", "sweep", "--json")
        self.assertEqual(status, 1)
        self.assertIn("HTTP 503 temporarily_unavailable (dataplane_unreachable)", err)
        self.assertEqual(json.loads(out)["failed"][0]["fqdn"], FQDN)

    def test_purge_sweep(self) -> None:
        """purge sweep purges each revoked allocation, one progress line each."""
        self.provision("live")
        revoked = sorted(self.provision(f"r{n}") for n in range(2))
        self.place()
        for allocation_id in revoked:
            self.successResultOf(self.store.revoke_allocation(allocation_id, NOW))
        status, out, err = self.command("purge", "sweep")
        self.assertEqual(status, 0, err)
        progress = err.splitlines()
        self.assertEqual(len(progress), 2)
        self.assertTrue(progress[0].startswith(f"purge 1/2 allocation {revoked[0]} (agent r"))
        self.assertTrue(progress[1].endswith(": 3 manifests, 4.0 KiB freed"))
        self.assertEqual(out, "purged 2 of 2 revoked allocations, 8.0 KiB freed\n")
        status, out, err = self.command("purge", "sweep", "--json")
        self.assertEqual((status, json.loads(out)), (0, {"purged": [], "failed": []}))

    def test_purge_failure_continues(self) -> None:
        """An allocation whose server cannot be reached is reported; the status is 1."""
        gone = self.provision("r1")
        self.place()
        self.successResultOf(self.store.revoke_allocation(gone, NOW))
        self.plane.reachable = False
        status, out, err = self.command("purge", "sweep", "--json")
        self.assertEqual(status, 1)
        self.assertEqual(json.loads(out)["failed"][0]["allocation_id"], gone)
        self.assertIn("purge 1/1", err)

    def test_wrong_token(self) -> None:
        """A wrong service token: exit 1 naming the 401."""
        self.caller.token = "x" * 40
        status, _, err = self.command("allocations", "list")
        self.assertEqual(status, 1)
        self.assertIn("HTTP 401 invalid_token", err)


class ConfigurationTests(SynchronousTestCase):
    """What the commands read from the environment."""

    def test_required(self) -> None:
        """The URL and the token are required, each named."""
        error = self.assertRaises(ConfigError, transport_from, {"SVC_CONTROL_PLANE_TOKEN": TOKEN})
        self.assertEqual(error.variable, "SVC_CONTROL_URL")
        error = self.assertRaises(ConfigError, transport_from, {"SVC_CONTROL_URL": "http://c"})
        self.assertEqual(error.variable, "SVC_CONTROL_PLANE_TOKEN")
        environ = {"SVC_CONTROL_URL": "ftp://c", "SVC_CONTROL_PLANE_TOKEN": TOKEN}
        self.assertEqual(
            self.assertRaises(ConfigError, transport_from, environ).variable, "SVC_CONTROL_URL"
        )

    def test_token_file_and_ca_file(self) -> None:
        """The token may come from a file; an unreadable CA file is named."""
        secret = Path(self.mktemp())
        secret.write_text(TOKEN + "\n")
        made = transport_from(
            {"SVC_CONTROL_URL": "http://c", "SVC_CONTROL_PLANE_TOKEN_FILE": str(secret)}
        )
        self.assertIsNotNone(made(1.0))
        environ = {
            "SVC_CONTROL_URL": "https://c",
            "SVC_CONTROL_PLANE_TOKEN": TOKEN,
            "SVC_CA_FILE": "/nonexistent/ca.pem",
        }
        self.assertEqual(
            self.assertRaises(ConfigError, transport_from, environ).variable, "SVC_CA_FILE"
        )

    def test_human_bytes(self) -> None:
        """Bytes are exact below 1 KiB, else one decimal of the binary unit."""
        self.assertEqual(
            [human_bytes(v) for v in (0, 1023, 1024, 5000, 1 << 30, 3 << 40, "x")],
            ["0 B", "1023 B", "1.0 KiB", "4.9 KiB", "1.0 GiB", "3.0 TiB", "?"],
        )
