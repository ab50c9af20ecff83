"""
Tests for L{svc.control.store.values}, L{svc.control.store.sql} and
L{svc.control.store.migrations}: pure pieces.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from twisted.trial.unittest import SynchronousTestCase

from svc.control.store.errors import InvalidValue, SchemaTooNew
from svc.control.store.migrations import Migration, check_sequence, migrate
from svc.control.store.migrations import postgres as postgres_migrations
from svc.control.store.migrations import sqlite as sqlite_migrations
from svc.control.store.sql import Rows, Sql, as_bool, as_bytes, as_int, postgres_text
from svc.control.store.test.contract_support import NOW
from svc.control.store.values import (
    AdminSession,
    ApiToken,
    CaKind,
    CaMaterial,
    EnrollToken,
    check_bytes,
    check_hash,
    check_id,
    check_serial,
    from_micros,
    to_micros,
)


class TimestampTests(SynchronousTestCase):
    """Microsecond timestamps."""

    def test_round_trip(self) -> None:
        """An aware datetime survives micros and back, in UTC, to the microsecond."""
        moment = datetime(2026, 11, 1, 12, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
        back = from_micros(to_micros(moment))
        self.assertEqual(back, moment)
        self.assertEqual(back.tzinfo, UTC)
        self.assertEqual(to_micros(datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)), 1_000_000)

    def test_naive_refused(self) -> None:
        """A naive datetime is refused, in conversion and in records."""
        self.assertRaises(InvalidValue, to_micros, datetime(2026, 1, 1))
        self.assertRaises(
            InvalidValue,
            EnrollToken,
            "t",
            "0" * 64,
            "a",
            datetime(2026, 1, 1),
            NOW,
        )


class CheckTests(SynchronousTestCase):
    """Argument checks."""

    def test_ids(self) -> None:
        """Ids are the certificate alphabet without '..' and at most 64 characters."""
        for good in ("a", "agent-1", "A.b_c-9", "x" * 64):
            self.assertEqual(check_id(good, "id"), good)
        for bad in ("", "-a", "a/b", "a..b", "x" * 65, "é"):
            self.assertRaises(InvalidValue, check_id, bad, "id")

    def test_hashes_serials_bytes(self) -> None:
        """Hashes are 64 lowercase hex, serials lowercase hex, byte counts non-negative ints."""
        self.assertRaises(InvalidValue, check_hash, "A" * 64)
        self.assertRaises(InvalidValue, check_hash, "0" * 63)
        self.assertEqual(check_serial("00ff"), "00ff")
        self.assertRaises(InvalidValue, check_serial, "0xff")
        self.assertRaises(InvalidValue, check_bytes, True, "b")
        self.assertRaises(InvalidValue, check_bytes, 2**63, "b")
        self.assertEqual(check_bytes(0, "b"), 0)

    def test_secrets_stay_out_of_repr(self) -> None:
        """Hashes and encrypted keys never appear in a record's repr."""
        records = [
            EnrollToken("t", "1" * 64, "a", NOW, NOW),
            ApiToken("t", "u", "n", "2" * 64, NOW),
            AdminSession("s", "u", "3" * 64, NOW, NOW),
            CaMaterial(CaKind.ROOT, None, b"cert", b"KEYBYTES", NOW),
        ]
        text = " ".join(repr(record) for record in records)
        for secret in ("1" * 64, "2" * 64, "3" * 64, "KEYBYTES"):
            self.assertNotIn(secret, text)

    def test_ca_material_kinds(self) -> None:
        """Tenant material needs a tenant id and root material has none."""
        self.assertRaises(InvalidValue, CaMaterial, CaKind.TENANT, None, b"c", b"k", NOW)
        self.assertRaises(InvalidValue, CaMaterial, CaKind.ROOT, "t1", b"c", b"k", NOW)


class SqlTests(SynchronousTestCase):
    """The shared SQL dialect."""

    def test_postgres_text(self) -> None:
        """Placeholders become %s, a literal % is doubled, locks append FOR UPDATE."""
        self.assertEqual(
            postgres_text(Sql("SELECT a FROM t WHERE b = ? AND c LIKE '5%'", (1,), lock=True)),
            "SELECT a FROM t WHERE b = %s AND c LIKE '5%%' FOR UPDATE",
        )

    def test_columns(self) -> None:
        """Column readers accept both databases' types and refuse the wrong ones."""
        self.assertTrue(as_bool(1))
        self.assertFalse(as_bool(False))
        self.assertEqual(as_bytes(memoryview(b"ab")), b"ab")
        self.assertRaises(TypeError, as_int, "1")
        self.assertRaises(TypeError, as_int, True)
        self.assertRaises(AssertionError, Rows((), 0).only)


def _drive(migrations: tuple[Migration, ...], current: int | None) -> tuple[list[str], int]:
    """Run L{migrate} against a fake database at version C{current}."""
    transaction = migrate(migrations, (Sql("PRELUDE"),), 7)
    seen = [next(transaction).text]
    reply = Rows((), 0)
    try:
        while True:
            statement = transaction.send(reply)
            seen.append(statement.text)
            reply = (
                Rows(((current,),), 1) if statement.text.startswith("SELECT max") else Rows((), 0)
            )
    except StopIteration as stop:
        return seen, stop.value


class MigrationTests(SynchronousTestCase):
    """The migration procedure and the two migration lists."""

    def test_applies_only_missing(self) -> None:
        """Migrations above the recorded version are applied and recorded, in order."""
        migrations = (Migration(1, "one", ("A",)), Migration(2, "two", ("B", "C")))
        seen, version = _drive(migrations, 1)
        self.assertEqual(version, 2)
        self.assertEqual(
            [s for s in seen if not s.startswith(("SELECT", "INSERT"))], ["PRELUDE", "B", "C"]
        )
        self.assertEqual(sum(s.startswith("INSERT INTO schema_migrations") for s in seen), 1)
        fresh, _ = _drive(migrations, None)
        self.assertIn("A", fresh)

    def test_newer_refused(self) -> None:
        """A recorded version beyond the last migration raises SchemaTooNew."""
        error = self.assertRaises(SchemaTooNew, _drive, (Migration(1, "one", ("A",)),), 3)
        self.assertEqual((error.found, error.known), (3, 1))

    def test_sequence(self) -> None:
        """Migration lists must number 1, 2, 3, ... and both backends' lists agree."""
        self.assertRaises(ValueError, check_sequence, (Migration(2, "x", ()),))
        for migrations in (sqlite_migrations.MIGRATIONS, postgres_migrations.MIGRATIONS):
            check_sequence(migrations)
        self.assertEqual(
            [(m.version, m.description) for m in sqlite_migrations.MIGRATIONS],
            [(m.version, m.description) for m in postgres_migrations.MIGRATIONS],
        )
