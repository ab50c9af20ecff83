"""
Tests for the C{/control/*} routes of L{svc.dataplane.http} and the body
parsing of L{svc.dataplane.http_control}, with the control-plane
certificate presented.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.http_control import (
    canonical_serial,
    parse_quotas,
    parse_revocations,
    parse_session_fence,
)
from svc.dataplane.revocations import DenyListFile
from svc.dataplane.test.test_http_support import HttpFixture, rfc3339
from svc.store.layout import TenantLocation
from svc.store.test.test_engine import blob
from svc.web.errors import InvalidRequest

ACME = TenantLocation.for_owner("acme")
LABS = TenantLocation("acme", "labs")


class RevocationTests(SynchronousTestCase):
    """
    C{PUT /control/cert-revocations} merges the pushed set into the
    deny-list, minus expired entries, and keeps the result on disk.
    """

    def setUp(self) -> None:
        self.f = HttpFixture(self)
        self.f.as_control()
        self.now = datetime.fromtimestamp(self.f.clock.seconds(), UTC)

    def push(self, entries: list[tuple[str, datetime]], generated_at: datetime) -> int:
        body = {
            "revocations": [{"serial": s, "not_after": rfc3339(t)} for s, t in entries],
            "generated_at": rfc3339(generated_at),
        }
        return self.f.call("PUT", "/control/cert-revocations", body=body).status

    def serials(self) -> list[str]:
        return sorted(e.serial for e in self.f.deny_list.entries)

    def test_merges_into_deny_list(self) -> None:
        """A serial a later push leaves out stays denied; 204."""
        later = self.now + timedelta(hours=1)
        self.assertEqual(self.push([("1f3a", later), ("00AB", later)], self.now), 204)
        self.assertEqual(self.serials(), ["1f3a", "ab"])
        self.assertEqual(self.push([("77", later)], self.now + timedelta(seconds=60)), 204)
        self.assertEqual(self.serials(), ["1f3a", "77", "ab"])

    def test_entries_age_out_at_not_after(self) -> None:
        """A merged entry is dropped by the first push after its not_after."""
        self.push([("5", self.now + timedelta(minutes=1))], self.now)
        self.f.clock.advance(60)
        self.push([("6", self.now + timedelta(hours=1))], self.now + timedelta(minutes=1))
        self.assertEqual(self.serials(), ["6"])

    def test_expired_entries_ignored(self) -> None:
        """An entry whose not_after has passed is not installed."""
        self.push(
            [("1", self.now - timedelta(seconds=1)), ("2", self.now + timedelta(1))], self.now
        )
        self.assertEqual(self.serials(), ["2"])

    def test_older_push_merged(self) -> None:
        """A set generated before the one in force is merged too (entries leave only by age)."""
        later = self.now + timedelta(hours=1)
        self.push([("5", later)], self.now)
        self.assertEqual(self.push([("6", later)], self.now - timedelta(minutes=1)), 204)
        self.assertEqual(self.serials(), ["5", "6"])

    def test_kept_on_disk(self) -> None:
        """The merged list is in the state directory's deny-list.json when 204 is sent."""
        later = self.now + timedelta(hours=1)
        self.push([("5", later)], self.now)
        self.push([("6", later)], self.now)
        kept = DenyListFile(self.f.state_dir).load()
        self.assertEqual(kept, self.f.deny_list)

    def test_unchanged_push_installs_nothing(self) -> None:
        """A push naming only entries already in force installs no new list."""
        later = self.now + timedelta(hours=1)
        self.push([("5", later)], self.now)
        self.push([("5", later)], self.now + timedelta(minutes=1))
        self.assertEqual(len(self.f.replaced), 1)

    def test_malformed_push_keeps_list(self) -> None:
        """One bad entry refuses the push with 400 and the old list stays."""
        later = self.now + timedelta(hours=1)
        self.push([("5", later)], self.now)
        body = {
            "revocations": [{"serial": "zz", "not_after": rfc3339(later)}],
            "generated_at": rfc3339(self.now + timedelta(minutes=1)),
        }
        answer = self.f.call("PUT", "/control/cert-revocations", body=body)
        self.assertEqual((answer.status, answer.json()["error_description"]), (400, "bad_serial"))
        self.assertEqual([e.serial for e in self.f.deny_list.entries], ["5"])

    def test_body_rules(self) -> None:
        """Non-JSON content type, oversized and empty bodies are 400."""
        raw = b'{"revocations": [], "generated_at": "2026-11-22T19:00:00Z"}'
        answer = self.f.call(
            "PUT", "/control/cert-revocations", raw=raw, headers={"Content-Type": "text/plain"}
        )
        self.assertEqual(answer.json()["error_description"], "content_type_not_json")
        json_type = {"Content-Type": "application/json"}
        huge = b" " * (64 * 1024 + 1)
        answer = self.f.call("PUT", "/control/cert-revocations", raw=huge, headers=json_type)
        self.assertEqual(answer.json()["error_description"], "body_too_large")
        answer = self.f.call("PUT", "/control/cert-revocations", raw=b"", headers=json_type)
        self.assertEqual(answer.json()["error_description"], "body_required")
        self.assertEqual(self.f.replaced, [])


class RevocationParsingTests(SynchronousTestCase):
    """
    L{parse_revocations} and L{canonical_serial}.
    """

    NOW = datetime(2026, 11, 22, 19, 0, tzinfo=UTC)

    def test_canonical_serial(self) -> None:
        """Upper case and leading zeros are normalised; non-hex refused."""
        self.assertEqual(canonical_serial("000A0"), "a0")
        self.assertEqual(canonical_serial("0"), "0")
        for bad in ["", "g1", "0x1f", 31, "1" * 42]:
            self.assertRaises(InvalidRequest, canonical_serial, bad)

    def test_offsets_accepted(self) -> None:
        """Timestamps with a numeric offset are converted to UTC."""
        push = parse_revocations(
            {
                "revocations": [{"serial": "1", "not_after": "2026-11-22T21:00:00+01:00"}],
                "generated_at": "2026-11-22T19:00:00Z",
            },
            self.NOW,
        )
        (entry,) = push.deny_list.entries
        self.assertEqual(entry.not_after, datetime(2026, 11, 22, 20, 0, tzinfo=UTC))

    def test_missing_fields(self) -> None:
        """revocations, generated_at and each entry's fields are required."""
        for body, description in [
            ({"generated_at": "2026-11-22T19:00:00Z"}, "missing_revocations"),
            ({"revocations": []}, "missing_generated_at"),
            ({"revocations": "x", "generated_at": "2026-11-22T19:00:00Z"}, "bad_revocations"),
            (
                {"revocations": [{"serial": "1"}], "generated_at": "2026-11-22T19:00:00Z"},
                "missing_not_after",
            ),
        ]:
            error = self.assertRaises(InvalidRequest, parse_revocations, body, self.NOW)
            self.assertEqual(error.description, description)


class PurgeTests(SynchronousTestCase):
    """
    C{POST /control/purge-agent} erases an agent's subtree and reports it.
    """

    def setUp(self) -> None:
        self.f = HttpFixture(self)
        self.serial = self.f.as_control()
        self.storage = self.f.store.tenant(ACME)
        self.f.store.mkdir(self.storage, "/a1")
        self.f.store.mkdir(self.storage, "/a2")
        self.part = blob("a1-only", 1000)
        self.f.store.ok(self.f.store.put_file(self.storage, "/a1/f", [self.part]))
        self.f.store.ok(self.f.store.put_file(self.storage, "/a2/g", [blob("a2", 10)]))

    def test_purge(self) -> None:
        """The subtree and its unshared chunks go; 200 with count and bytes_freed."""
        body = {"owner": "acme", "tenant": "acme", "agent_id": "a1"}
        answer = self.f.call("POST", "/control/purge-agent", body=body)
        self.assertEqual((answer.status, answer.json()), (200, {"count": 2, "bytes_freed": 1000}))
        usage = self.f.store.ok(self.storage.manifests.usage_by_top())
        self.assertEqual(usage, {"a2": 10})

    def test_audited(self) -> None:
        """agent_data_purged carries the tenant, counts and the control cert's serial."""
        body = {"owner": "acme", "tenant": "acme", "agent_id": "a1"}
        self.f.call("POST", "/control/purge-agent", body=body)
        (line,) = self.f.events("agent_data_purged")
        self.assertEqual((line.path, line.tenant_id, line.agent_id), ("/a1", "acme", None))
        self.assertEqual((line.get("count"), line.get("bytes_freed")), (2, 1000))
        self.assertEqual(line.cert_serial, self.serial)

    def test_unknown_tenant_not_created(self) -> None:
        """Purging in a tenant with no storage here reports nothing and creates nothing."""
        body = {"owner": "acme", "tenant": "ghost", "agent_id": "a1"}
        answer = self.f.call("POST", "/control/purge-agent", body=body)
        self.assertEqual(answer.json(), {"count": 0, "bytes_freed": 0})
        self.assertFalse((self.f.store.root / "acme" / "ghost").exists())

    def test_bad_body(self) -> None:
        """Missing or malformed names are 400 naming the field."""
        for body, description in [
            ({"tenant": "acme", "agent_id": "a1"}, "missing_owner"),
            ({"owner": "../x", "tenant": "acme", "agent_id": "a1"}, "bad_owner"),
            ({"owner": "acme", "tenant": "store", "agent_id": "a1"}, "bad_tenant"),
            ({"owner": "acme", "tenant": "acme", "agent_id": "a/1"}, "bad_agent_id"),
            ({"owner": "acme", "tenant": "acme", "agent_id": 7}, "bad_agent_id"),
        ]:
            answer = self.f.call("POST", "/control/purge-agent", body=body)
            self.assertEqual(
                (answer.status, answer.json()["error_description"]), (400, description)
            )
        self.assertEqual(self.f.events("agent_data_purged"), [])


class QuotaTests(SynchronousTestCase):
    """
    C{PUT /control/quotas} sets, keeps or lifts a grant and a budget.
    """

    def setUp(self) -> None:
        self.f = HttpFixture(self)
        self.f.as_control()

    def put(self, body: dict[str, object]) -> int:
        return self.f.call("PUT", "/control/quotas", body=body).status

    def test_grant_and_budget(self) -> None:
        """Both limits are applied and persisted; 204."""
        body: dict[str, object] = {
            "owner": "acme",
            "tenant": "labs",
            "agent_id": "a1",
            "grant_bytes": 1 << 30,
            "account_budget_bytes": 5 << 30,
        }
        self.assertEqual(self.put(body), 204)
        self.assertEqual(self.f.store.tenant(LABS).grant_for("a1"), 1 << 30)
        self.assertEqual(self.f.store.tenant(LABS).account.budget_bytes, 5 << 30)
        self.assertTrue((self.f.store.root / "acme" / "account.json").exists())

    def test_null_lifts_omitted_keeps(self) -> None:
        """null lifts a limit; an omitted one stays as it was."""
        self.put({"owner": "acme", "tenant": "acme", "agent_id": "a1", "grant_bytes": 10})
        self.put({"owner": "acme", "account_budget_bytes": 99})
        storage = self.f.store.tenant(ACME)
        self.assertEqual((storage.grant_for("a1"), storage.account.budget_bytes), (10, 99))
        self.put({"owner": "acme", "tenant": "acme", "agent_id": "a1", "grant_bytes": None})
        self.assertEqual((storage.grant_for("a1"), storage.account.budget_bytes), (None, 99))
        self.put({"owner": "acme", "account_budget_bytes": None})
        self.assertIsNone(storage.account.budget_bytes)

    def test_parse_errors(self) -> None:
        """Bad limits, a grant without its agent, and an empty change are refused."""
        for body, description in [
            ({"owner": "acme"}, "nothing_to_change"),
            ({"owner": "acme", "grant_bytes": 1, "tenant": "acme"}, "missing_agent_id"),
            ({"owner": "acme", "account_budget_bytes": -1}, "bad_account_budget_bytes"),
            ({"owner": "acme", "account_budget_bytes": True}, "bad_account_budget_bytes"),
            ({"owner": "acme", "account_budget_bytes": 2**63}, "bad_account_budget_bytes"),
            (
                {"owner": "acme", "tenant": "acme", "agent_id": "a1", "grant_bytes": 1.5},
                "bad_grant_bytes",
            ),
        ]:
            error = self.assertRaises(InvalidRequest, parse_quotas, body)
            self.assertEqual(error.description, description)

    def test_rejected_change_applies_nothing(self) -> None:
        """A 400 leaves both limits untouched."""
        body = {"owner": "acme", "account_budget_bytes": 5, "grant_bytes": -1}
        answer = self.f.call("PUT", "/control/quotas", body=body)
        self.assertEqual(answer.status, 400)
        self.assertFalse(Path(self.f.store.root, "acme", "account.json").exists())


class SessionFenceTests(SynchronousTestCase):
    """
    C{PUT /control/session-epochs} hands the fence to the service; only the
    control plane may send it.
    """

    def setUp(self) -> None:
        self.f = HttpFixture(self)

    def test_fence(self) -> None:
        """A well-formed fence is handed on, then answered 204."""
        self.f.as_control()
        body = {"owner": "acme", "tenant": "labs", "agent_id": "a1", "epoch": 7}
        answer = self.f.call("PUT", "/control/session-epochs", body=body)
        self.assertEqual(answer.status, 204, answer.body)
        self.assertEqual(self.f.fences, [(LABS, "a1", 7)])

    def test_parse_errors(self) -> None:
        """A missing field, a bad id or an epoch out of range is refused and not handed on."""
        self.f.as_control()
        good: dict[str, object] = {"owner": "acme", "tenant": "labs", "agent_id": "a1", "epoch": 1}
        cases: list[tuple[dict[str, object], str]] = [
            ({"epoch": None}, "bad_epoch"),
            ({"epoch": -1}, "bad_epoch"),
            ({"epoch": 2**64}, "bad_epoch"),
            ({"epoch": True}, "bad_epoch"),
            ({"agent_id": "../x"}, "bad_agent_id"),
        ]
        for changes, description in cases:
            answer = self.f.call("PUT", "/control/session-epochs", body={**good, **changes})
            self.assertEqual(answer.status, 400, answer.body)
            self.assertEqual(answer.json()["error_description"], description)
        error = self.assertRaises(
            InvalidRequest, parse_session_fence, {k: v for k, v in good.items() if k != "epoch"}
        )
        self.assertEqual(error.description, "missing_epoch")
        self.assertEqual(self.f.fences, [])

    def test_agents_refused(self) -> None:
        """An agent's certificate may not fence sessions."""
        self.f.as_agent()
        body = {"owner": "acme", "tenant": "labs", "agent_id": "a1", "epoch": 7}
        self.assertEqual(self.f.call("PUT", "/control/session-epochs", body=body).status, 403)
        self.assertEqual(self.f.fences, [])


class UsageTests(SynchronousTestCase):
    """
    C{GET /control/usage?owner=} reports the account and per-agent usage.
    """

    def setUp(self) -> None:
        self.f = HttpFixture(self)
        self.f.as_control()

    def test_usage(self) -> None:
        """used_bytes is the account usage; agents sums each agent's bytes."""
        acme = self.f.store.tenant(ACME)
        labs = self.f.store.tenant(LABS)
        self.f.store.mkdir(acme, "/a1")
        self.f.store.mkdir(labs, "/a2")
        self.f.store.ok(self.f.store.put_file(acme, "/a1/f", [blob("x", 300)]))
        self.f.store.ok(self.f.store.put_file(labs, "/a2/f", [blob("y", 200)]))
        answer = self.f.call("GET", "/control/usage?owner=acme")
        self.assertEqual(answer.status, 200)
        document = answer.json()
        self.assertEqual(
            (document["owner"], document["used_bytes"], document["agents"]),
            ("acme", 500, {"a1": 300, "a2": 200}),
        )

    def test_footprint(self) -> None:
        """footprint has every agent's bytes by part, summed over the owner's tenants."""
        acme = self.f.store.tenant(ACME)
        labs = self.f.store.tenant(LABS)
        self.f.store.mkdir(acme, "/a1")
        self.f.store.mkdir(labs, "/a1")
        self.f.store.ok(self.f.store.put_file(acme, "/a1/f", [blob("x", 300)]))
        self.f.store.ok(self.f.store.put_file(acme, "/a1/f", [blob("z", 50)], expected_version=1))
        self.f.store.ok(labs.chunk_put("a1", *blob("y", 200)))
        self.f.store.ok(acme.chunk_put("a2", *blob("w", 7)))
        answer = self.f.call("GET", "/control/usage?owner=acme")
        self.assertEqual(
            answer.json()["footprint"],
            {
                "a1": {
                    "used_bytes": 50,
                    "uncommitted_bytes": 200,
                    "retained_bytes": 300,
                    "collectable_bytes": 0,
                },
                "a2": {
                    "used_bytes": 0,
                    "uncommitted_bytes": 7,
                    "retained_bytes": 0,
                    "collectable_bytes": 0,
                },
            },
        )

    def test_unknown_owner(self) -> None:
        """An owner without data here has zero usage and no agents."""
        answer = self.f.call("GET", "/control/usage?owner=nobody")
        self.assertEqual(
            answer.json(), {"owner": "nobody", "used_bytes": 0, "agents": {}, "footprint": {}}
        )

    def test_owner_required(self) -> None:
        """A missing, repeated or malformed owner is 400."""
        for query, description in [
            ("", "missing_owner"),
            ("?owner=a&owner=b", "repeated_owner"),
            ("?owner=..", "bad_owner"),
        ]:
            answer = self.f.call("GET", f"/control/usage{query}")
            self.assertEqual(
                (answer.status, answer.json()["error_description"]), (400, description)
            )
