"""
Tests for L{svc.sdk.models}: parsing the control plane's answers.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from svc.sdk.models import (
    DEFAULT_MOUNT_ROOT,
    AccountEntity,
    AgentUsage,
    MalformedAnswer,
    parse_account_budget,
    parse_agent_entity,
    parse_enroll_token,
    parse_entity,
    parse_owner_usage,
)

CREATED = datetime(2026, 11, 22, 19, 0, 0, tzinfo=UTC)


def agent(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "agent",
        "id": "a1",
        "allocation_id": "0" * 32,
        "owner": "acme",
        "tenant": "acme",
        "grant_bytes": 1000,
        "state": "provisioned",
        "created_at": "2026-11-22T19:00:00Z",
        "virtual_path": "/srv/disks/agents/a1",
    }
    body.update(changes)
    return {k: v for k, v in body.items() if v is not ...}


class AgentEntityTests(SynchronousTestCase):
    """L{parse_agent_entity}."""

    def test_fields(self) -> None:
        """Every documented field is read; timestamps become aware datetimes."""
        entity = parse_agent_entity(agent(created=True), "/mnt/x")
        self.assertEqual(
            (entity.id, entity.owner, entity.tenant, entity.grant_bytes, entity.state),
            ("a1", "acme", "acme", 1000, "provisioned"),
        )
        self.assertEqual(entity.created_at, CREATED)
        self.assertEqual((entity.virtual_path, entity.created), ("/srv/disks/agents/a1", True))

    def test_unknown_fields_ignored(self) -> None:
        """Fields a newer server adds are ignored."""
        entity = parse_agent_entity(agent(colour="blue", labels={"a": 1}), "/mnt/x")
        self.assertEqual(entity.id, "a1")

    def test_virtual_path_computed_when_missing(self) -> None:
        """Without virtual_path (older servers) it is <mount_root>/agents/<agent_id>."""
        self.assertEqual(
            parse_agent_entity(agent(virtual_path=...), "/mnt/x").virtual_path,
            "/mnt/x/agents/a1",
        )
        self.assertEqual(
            parse_agent_entity(agent(virtual_path=...), DEFAULT_MOUNT_ROOT).virtual_path,
            "/mnt/svc/agents/a1",
        )

    def test_created_absent_is_none(self) -> None:
        """Answers other than provisioning carry no created flag."""
        self.assertIsNone(parse_agent_entity(agent(), "/m").created)

    def test_malformed(self) -> None:
        """Missing or mistyped documented fields are refused."""
        for body in (
            agent(grant_bytes=...),
            agent(grant_bytes=True),
            agent(grant_bytes="1000"),
            agent(owner=None),
            agent(created_at="yesterday"),
            agent(created_at="2026-11-22T19:00:00"),
            agent(type="account"),
            ["not", "an", "object"],
        ):
            self.assertRaises(MalformedAnswer, parse_agent_entity, body, "/m")


class AccountEntityTests(SynchronousTestCase):
    """L{parse_entity} for accounts."""

    def test_account(self) -> None:
        """An account with its allocations, null budget and revocation times."""
        body = {
            "type": "account",
            "id": "acme",
            "display_name": "Acme",
            "budget_bytes": None,
            "suspended": False,
            "created_at": "2026-11-22T19:00:00Z",
            "allocations": [
                {
                    "allocation_id": "1" * 32,
                    "agent_id": None,
                    "tenant": "acme",
                    "grant_bytes": 5,
                    "state": "revoked",
                    "revoked_at": "2026-11-22T19:00:00Z",
                    "new": "ignored",
                }
            ],
        }
        account = parse_entity(body, "/m")
        assert isinstance(account, AccountEntity)
        self.assertEqual(
            (account.id, account.display_name, account.budget_bytes), ("acme", "Acme", None)
        )
        self.assertEqual(account.allocations[0].revoked_at, CREATED)
        self.assertIsNone(account.allocations[0].agent_id)

    def test_agent_by_type(self) -> None:
        """An agent body parses as an agent entity."""
        self.assertEqual(parse_entity(agent(), "/m").type, "agent")


class OtherAnswersTests(SynchronousTestCase):
    """Budget, enroll token, usage."""

    def test_budget(self) -> None:
        """The budget answer, set or cleared."""
        self.assertEqual(parse_account_budget({"id": "acme", "budget_bytes": 7}).budget_bytes, 7)
        self.assertIsNone(parse_account_budget({"id": "acme", "budget_bytes": None}).budget_bytes)

    def test_enroll_token_secret_not_in_repr(self) -> None:
        """The token is read and kept out of repr."""
        minted = parse_enroll_token(
            {
                "token": "s3cret-token-value",
                "token_id": "t1",
                "agent_id": "a1",
                "allocation_id": "0" * 32,
                "expires_at": "2026-11-22T19:00:00Z",
            }
        )
        self.assertEqual(minted.token, "s3cret-token-value")
        self.assertNotIn("s3cret", repr(minted))

    def test_usage(self) -> None:
        """Usage with a known and an unknown agent; asdict works on it."""
        usage = parse_owner_usage(
            {
                "owner": "acme",
                "used_bytes": 10,
                "budget_bytes": 100,
                "agents": {
                    "a1": {"used_bytes": 7, "grant_bytes": 1000, "state": "provisioned"},
                    "ghost": {"used_bytes": 3, "grant_bytes": None, "state": None},
                },
            }
        )
        self.assertEqual(usage.agents["ghost"], AgentUsage(3, None, None))
        self.assertEqual(usage.agents["a1"].grant_bytes, 1000)
        self.assertEqual(asdict(usage)["agents"]["a1"]["used_bytes"], 7)


class MountRootTests(SynchronousTestCase):
    """The SDK's copy of the control plane's default mount prefix."""

    def test_agrees_with_control_plane(self) -> None:
        """DEFAULT_MOUNT_ROOT equals svc.control.settings.DEFAULT_MOUNT_PREFIX."""
        from svc.control.settings import DEFAULT_MOUNT_PREFIX  # noqa: PLC0415

        self.assertEqual(DEFAULT_MOUNT_ROOT, DEFAULT_MOUNT_PREFIX)
