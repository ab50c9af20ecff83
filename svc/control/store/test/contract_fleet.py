"""
The contract of the data-plane fleet: servers, sticky placement with
capacity, and CA material.
"""

from __future__ import annotations

from twisted.internet.defer import gatherResults

from svc.control.store.errors import InvalidValue, NotFound, ServerKeyConflict
from svc.control.store.outcomes import InsufficientCapacity
from svc.control.store.test.contract_support import HOUR, NOW, StoreCase
from svc.control.store.values import CaKind, CaMaterial, Placement, to_micros

KEY_A = "a1" * 32
KEY_B = "b2" * 32


class FleetContract(StoreCase):
    """Servers, placements and CA material."""

    async def _tenants(self, *tenant_ids: str) -> None:
        for number, tenant_id in enumerate(tenant_ids):
            await self.provisioned(f"agent-{number}", tenant_id=tenant_id)

    async def test_register_server_upserts_by_fqdn(self) -> None:
        """Registering a known FQDN updates it in place and keeps its id and registration time."""
        first = await self.store.register_server("dp1.example.net", "10.0.0.1:7443", 10, NOW)
        self.assertEqual((first.registered_at, first.last_seen_at), (NOW, NOW))
        again = await self.store.register_server(
            "dp1.example.net",
            "10.0.0.9:7443",
            20,
            NOW + HOUR,
            cert_serial="abc",
            cert_not_after=NOW + 90 * HOUR,
        )
        self.assertEqual(again.server_id, first.server_id)
        self.assertEqual((again.address, again.capacity), ("10.0.0.9:7443", 20))
        self.assertEqual((again.registered_at, again.last_seen_at), (NOW, NOW + HOUR))
        self.assertEqual((again.cert_serial, again.cert_not_after), ("abc", NOW + 90 * HOUR))
        kept = await self.store.register_server(
            "dp1.example.net", "10.0.0.9:7443", 20, NOW + 2 * HOUR
        )
        self.assertEqual(kept.cert_serial, "abc")
        touched = await self.store.touch_server("dp1.example.net", NOW + 3 * HOUR)
        self.assertEqual(touched.last_seen_at, NOW + 3 * HOUR)
        await self.store.register_server("dp0.example.net", "10.0.0.2:7443", 1, NOW)
        self.assertEqual(
            [s.fqdn for s in await self.store.list_servers()],
            ["dp0.example.net", "dp1.example.net"],
        )
        await self.refused(self.store.touch_server("nobody.example.net", NOW), NotFound)
        await self.refused(self.store.register_server("dp2", "x", -1, NOW), InvalidValue)

    async def test_http_address(self) -> None:
        """A server's HTTPS address is stored, kept when left out, replaced when given."""
        bare = await self.store.register_server("dp0.example.net", "10.0.0.2:7443", 1, NOW)
        self.assertIsNone(bare.http_address)
        first = await self.store.register_server(
            "dp1.example.net", "10.0.0.1:7443", 10, NOW, http_address="10.0.0.1:8443"
        )
        self.assertEqual(first.http_address, "10.0.0.1:8443")
        kept = await self.store.register_server("dp1.example.net", "10.0.0.1:7443", 10, NOW)
        self.assertEqual(kept.http_address, "10.0.0.1:8443")
        moved = await self.store.register_server(
            "dp1.example.net", "10.0.0.1:7443", 10, NOW, http_address="dp1.example.net:9443"
        )
        self.assertEqual(moved.http_address, "dp1.example.net:9443")
        self.assertEqual(
            [s.http_address for s in await self.store.list_servers()],
            [None, "dp1.example.net:9443"],
        )
        touched = await self.store.touch_server("dp1.example.net", NOW + HOUR)
        self.assertEqual(touched.http_address, "dp1.example.net:9443")
        await self._tenants("t1")
        await self.store.register_server("dp0.example.net", "10.0.0.2:7443", 0, NOW)
        placed = await self.store.place_tenant("t1", NOW)
        assert isinstance(placed, Placement)
        self.assertEqual(placed.server.http_address, "dp1.example.net:9443")
        self.assertEqual(await self.store.get_placement("t1"), placed)
        for bad in ("", " 10.0.0.1:8443"):
            await self.refused(
                self.store.register_server("dp2", "x", 1, NOW, http_address=bad), InvalidValue
            )

    async def test_previous_release_server_has_no_http_address(self) -> None:
        """A server registered before migration 2 has no HTTPS address until it re-registers."""
        store = await self.open_previous_release(
            (
                "INSERT INTO servers (server_id, fqdn, address, capacity, registered_us,"
                f" last_seen_us) VALUES ('{'d' * 32}', 'dp1.example.net', '10.0.0.1:7443', 3,"
                f" {to_micros(NOW)}, {to_micros(NOW)})",
            )
        )
        (old,) = await store.list_servers()
        self.assertEqual(
            (old.server_id, old.address, old.http_address), ("d" * 32, "10.0.0.1:7443", None)
        )
        again = await store.register_server(
            "dp1.example.net", "10.0.0.1:7443", 3, NOW + HOUR, http_address="10.0.0.1:8443"
        )
        self.assertEqual((again.server_id, again.http_address), ("d" * 32, "10.0.0.1:8443"))

    async def test_identity_key_holds_the_fqdn(self) -> None:
        """
        The first identity key registered for an FQDN holds it: another is
        refused (ServerKeyConflict, nothing changed) unless it names the
        registered key to replace; a registration naming no key keeps it.
        """
        first = await self.store.register_server(
            "dp1.example.net", "10.0.0.1:7443", 10, NOW, identity_key=KEY_A
        )
        self.assertEqual(first.identity_key, KEY_A)
        again = await self.store.register_server(
            "dp1.example.net", "10.0.0.9:7443", 10, NOW + HOUR, identity_key=KEY_A
        )
        self.assertEqual((again.server_id, again.address), (first.server_id, "10.0.0.9:7443"))
        refused = await self.refused(
            self.store.register_server(
                "dp1.example.net", "evil:1", 99, NOW + 2 * HOUR, identity_key=KEY_B
            ),
            ServerKeyConflict,
        )
        assert isinstance(refused, ServerKeyConflict)
        self.assertEqual(refused.code, "fqdn_registered")
        self.assertEqual(refused.server, again)
        self.assertEqual(await self.store.list_servers(), (again,))
        await self.refused(
            self.store.register_server(
                "dp1.example.net", "evil:1", 99, NOW, identity_key=KEY_B, replacing=KEY_B
            ),
            ServerKeyConflict,
        )
        replaced = await self.store.register_server(
            "dp1.example.net",
            "10.0.0.2:7443",
            10,
            NOW + 3 * HOUR,
            identity_key=KEY_B,
            replacing=KEY_A,
        )
        self.assertEqual((replaced.server_id, replaced.identity_key), (first.server_id, KEY_B))
        keyless = await self.store.register_server("dp1.example.net", "10.0.0.2:7443", 10, NOW)
        self.assertEqual(keyless.identity_key, KEY_B)
        await self.refused(
            self.store.register_server("dp1.example.net", "a:1", 1, NOW, identity_key=KEY_A),
            ServerKeyConflict,
        )
        for bad in ("AB" * 32, "ab", ""):
            await self.refused(
                self.store.register_server("dp2.example.net", "a:1", 1, NOW, identity_key=bad),
                InvalidValue,
            )

    async def test_concurrent_claims_of_one_fqdn(self) -> None:
        """Two identity keys registering a new FQDN at once: exactly one holds it."""
        outcomes = await gatherResults(
            [
                self.store.register_server(
                    "dp1.example.net", "a:1", 1, NOW, identity_key=key
                ).addErrback(lambda failure: failure.trap(ServerKeyConflict) and None)
                for key in (KEY_A, KEY_B)
            ]
        )
        (server,) = await self.store.list_servers()
        self.assertEqual([o for o in outcomes if o is not None], [server])

    async def test_previous_release_server_claimed_by_first_key(self) -> None:
        """A server registered before identity keys is claimed by the first key registered."""
        store = await self.open_previous_release(
            (
                "INSERT INTO servers (server_id, fqdn, address, capacity, registered_us,"
                f" last_seen_us) VALUES ('{'d' * 32}', 'dp1.example.net', '10.0.0.1:7443', 3,"
                f" {to_micros(NOW)}, {to_micros(NOW)})",
            )
        )
        (old,) = await store.list_servers()
        self.assertIsNone(old.identity_key)
        claimed = await store.register_server(
            "dp1.example.net", "10.0.0.1:7443", 3, NOW, identity_key=KEY_A
        )
        self.assertEqual((claimed.server_id, claimed.identity_key), ("d" * 32, KEY_A))

    async def test_placement_is_least_loaded_and_sticky(self) -> None:
        """New tenants go to the least-loaded server; a placed tenant stays put."""
        await self._tenants("t1", "t2", "t3")
        one = await self.store.register_server("dp1.example.net", "a:1", 5, NOW)
        two = await self.store.register_server("dp2.example.net", "b:1", 5, NOW + HOUR)
        first = await self.store.place_tenant("t1", NOW)
        assert isinstance(first, Placement)
        self.assertEqual((first.server, first.placed_at), (one, NOW))
        second = await self.store.place_tenant("t2", NOW)
        assert isinstance(second, Placement)
        self.assertEqual(second.server, two)
        self.assertEqual(await self.store.place_tenant("t1", NOW + HOUR), first)
        self.assertEqual(await self.store.get_placement("t1"), first)
        self.assertIsNone(await self.store.get_placement("t3"))
        self.assertEqual(await self.store.list_placements(), (first, second))

    async def test_list_placements_empty(self) -> None:
        """Before any placement the list is empty, even with servers and tenants."""
        await self._tenants("t1")
        await self.store.register_server("dp1.example.net", "a:1", 5, NOW)
        self.assertEqual(await self.store.list_placements(), ())

    async def test_insufficient_capacity(self) -> None:
        """When every server is full (or none is registered) placement is insufficient_capacity."""
        await self._tenants("t1", "t2")
        self.assertEqual(await self.store.place_tenant("t1", NOW), InsufficientCapacity("t1"))
        await self.store.register_server("dp1.example.net", "a:1", 1, NOW)
        self.assertIsInstance(await self.store.place_tenant("t1", NOW), Placement)
        self.assertEqual(await self.store.place_tenant("t2", NOW), InsufficientCapacity("t2"))
        await self.store.register_server("dp1.example.net", "a:1", 2, NOW)
        self.assertIsInstance(await self.store.place_tenant("t2", NOW), Placement)
        await self.refused(self.store.place_tenant("nobody", NOW), NotFound)

    async def test_concurrent_placements_respect_capacity(self) -> None:
        """Tenants placed together never overfill a server."""
        await self._tenants("t1", "t2", "t3", "t4")
        await self.store.register_server("dp1.example.net", "a:1", 1, NOW)
        await self.store.register_server("dp2.example.net", "b:1", 1, NOW)
        outcomes = await gatherResults(
            [self.store.place_tenant(t, NOW) for t in ("t1", "t2", "t3", "t4")]
        )
        placed = [o for o in outcomes if isinstance(o, Placement)]
        self.assertEqual(len(placed), 2)
        self.assertEqual({p.server.fqdn for p in placed}, {"dp1.example.net", "dp2.example.net"})
        self.assertEqual(sum(isinstance(o, InsufficientCapacity) for o in outcomes), 2)

    async def test_ca_material(self) -> None:
        """The first stored CA material wins unless replaced; root and tenants are separate."""
        self.assertIsNone(await self.store.get_ca_material(CaKind.ROOT))
        root = CaMaterial(CaKind.ROOT, None, b"root cert", b"sealed root key", NOW)
        self.assertEqual(await self.store.put_ca_material(root), root)
        loser = CaMaterial(CaKind.ROOT, None, b"other cert", b"other key", NOW + HOUR)
        self.assertEqual(await self.store.put_ca_material(loser), root)
        tenant = CaMaterial(CaKind.TENANT, "t1", b"t1 cert", b"t1 key \x00\xff", NOW)
        self.assertEqual(await self.store.put_ca_material(tenant), tenant)
        self.assertEqual(await self.store.get_ca_material(CaKind.TENANT, "t1"), tenant)
        self.assertIsNone(await self.store.get_ca_material(CaKind.TENANT, "t2"))
        rotated = CaMaterial(CaKind.TENANT, "t1", b"t1 cert 2", b"t1 key 2", NOW + HOUR)
        self.assertEqual(await self.store.put_ca_material(rotated, replace=True), rotated)
        self.assertEqual(await self.store.get_ca_material(CaKind.ROOT), root)
        self.assertNotIn("sealed", repr(root))
