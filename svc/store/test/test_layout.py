"""
Tests for L{svc.store.layout}.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.store.layout import (
    TenantLocation,
    chunk_objects_dir,
    chunk_path,
    is_chunk_hash,
    is_reserved_tenant_name,
    is_valid_id,
    leases_db_path,
    metadata_dir,
    owner_dir,
    routes_db_path,
    shard_name,
    tenant_dir,
)

HASH = "ab" + "0123456789abcdef" * 3 + "0123456789abcd"
ROOT = Path("/srv/tenants")
META = Path("/srv/meta")

_ID_FIRST = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_ID_REST = _ID_FIRST + "._-"


class IdTests(SynchronousTestCase):
    """
    Owner and tenant ids are safe, single path components.
    """

    def test_accepts_ordinary_ids(self) -> None:
        """Letters, digits, dot, dash and underscore are accepted after a first alphanumeric."""
        for value in ("a", "acme", "Acme-Corp_1", "t.prod", "0", "x" * 128):
            self.assertTrue(is_valid_id(value), value)

    def test_rejects_unsafe_ids(self) -> None:
        """Empty, dot names, hidden names, separators, spaces and overlong ids are refused."""
        for value in (
            "",
            ".",
            "..",
            ".hidden",
            "-flag",
            "_x",
            "a/b",
            "/a",
            "a\\b",
            "a b",
            "a\x00",
            "a\n",
            "é",
            "x" * 129,
        ):
            self.assertFalse(is_valid_id(value), repr(value))

    @settings(max_examples=200)
    @given(st.text(alphabet=_ID_FIRST, min_size=1, max_size=1), st.text(_ID_REST, max_size=127))
    def test_generated_valid_ids(self, first: str, rest: str) -> None:
        """Any id drawn from the allowed alphabet is valid and a single path component."""
        value = first + rest
        self.assertTrue(is_valid_id(value))
        self.assertEqual(Path(value).parts, (value,))

    @settings(max_examples=200)
    @given(st.text(min_size=1, max_size=40))
    def test_generated_ids_never_escape(self, value: str) -> None:
        """Whatever the input, an accepted id never names a parent, a root or a subpath."""
        if is_valid_id(value):
            self.assertNotIn("/", value)
            self.assertNotIn("\x00", value)
            self.assertNotIn(value, (".", ".."))
            self.assertEqual(ROOT / value, ROOT.joinpath(value))
            self.assertEqual((ROOT / value).parent, ROOT)

    def test_reserved_names(self) -> None:
        """store and names starting with routes.db or leases.db are reserved."""
        for value in ("store", "routes.db", "routes.db-wal", "leases.db-shm", "leases.db"):
            self.assertTrue(is_reserved_tenant_name(value), value)
        for value in ("stores", "routes", "leases-db", "acme"):
            self.assertFalse(is_reserved_tenant_name(value), value)


class TenantLocationTests(SynchronousTestCase):
    """
    L{TenantLocation} validates its ids and knows its path components.
    """

    def test_owner_only(self) -> None:
        """A tenant equal to its owner has a single path component."""
        location = TenantLocation.for_owner("acme")
        self.assertEqual((location.owner, location.tenant), ("acme", "acme"))
        self.assertEqual(location.components, ("acme",))

    def test_nested_tenant(self) -> None:
        """A tenant differing from its owner lives one level below the owner."""
        self.assertEqual(TenantLocation("acme", "t1").components, ("acme", "t1"))

    def test_invalid_ids_rejected(self) -> None:
        """Invalid owner or tenant ids raise ValueError."""
        for owner, tenant in (("..", "t"), ("acme", ".."), ("a/b", "t"), ("acme", "")):
            self.assertRaises(ValueError, TenantLocation, owner, tenant)

    def test_reserved_nested_tenant_rejected(self) -> None:
        """A nested tenant may not take a name the owner directory already uses."""
        for tenant in ("store", "routes.db", "leases.db-wal"):
            self.assertRaises(ValueError, TenantLocation, "acme", tenant)

    def test_reserved_name_allowed_as_own_tenant(self) -> None:
        """An owner whose id happens to be reserved is fine as its own tenant."""
        self.assertEqual(TenantLocation.for_owner("store").components, ("store",))


class PathTests(SynchronousTestCase):
    """
    The path functions produce exactly the spec's layout.
    """

    def test_tenant_dirs(self) -> None:
        """The tenant level appears only when the tenant differs from the owner."""
        self.assertEqual(tenant_dir(ROOT, TenantLocation.for_owner("acme")), ROOT / "acme")
        self.assertEqual(tenant_dir(ROOT, TenantLocation("acme", "t1")), ROOT / "acme" / "t1")
        self.assertEqual(owner_dir(ROOT, "acme"), ROOT / "acme")
        self.assertRaises(ValueError, owner_dir, ROOT, "..")

    def test_objects_dir(self) -> None:
        """The chunk store sits at <root>/<owner>/[<tenant>/]store/objects."""
        self.assertEqual(
            chunk_objects_dir(ROOT, TenantLocation.for_owner("acme")),
            Path("/srv/tenants/acme/store/objects"),
        )
        self.assertEqual(
            chunk_objects_dir(ROOT, TenantLocation("acme", "t1")),
            Path("/srv/tenants/acme/t1/store/objects"),
        )

    def test_chunk_path(self) -> None:
        """A chunk's file is <objects>/<first two hex digits>/<hash>."""
        objects = Path("/o")
        self.assertEqual(shard_name(HASH), "ab")
        self.assertEqual(chunk_path(objects, HASH), Path("/o/ab") / HASH)

    def test_chunk_path_rejects_bad_hash(self) -> None:
        """A malformed hash never becomes a path."""
        for bad in ("../" + HASH[3:], HASH.upper(), HASH[:-1], HASH + "0", "ab/" + HASH[3:]):
            self.assertRaises(ValueError, chunk_path, Path("/o"), bad)

    def test_metadata_paths(self) -> None:
        """routes.db and leases.db live in <metadata_root>/<owner>/[<tenant>/]."""
        own = TenantLocation.for_owner("acme")
        nested = TenantLocation("acme", "t1")
        self.assertEqual(metadata_dir(META, own), META / "acme")
        self.assertEqual(routes_db_path(META, own), META / "acme" / "routes.db")
        self.assertEqual(leases_db_path(META, nested), META / "acme" / "t1" / "leases.db")

    def test_is_chunk_hash(self) -> None:
        """Only 64 lowercase hex digits name a chunk."""
        self.assertTrue(is_chunk_hash(HASH))
        for bad in ("", HASH.upper(), HASH[:-1], HASH + "a", HASH[:-1] + "g", HASH[:-1] + "\n"):
            self.assertFalse(is_chunk_hash(bad), repr(bad))
