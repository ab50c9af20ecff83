"""
Tests for L{svc.control.operator_cli}: C{svc ca init}, C{svc token issue|revoke},
C{svc user seed|suspend|reinstate} and C{svc tenant suspend|reinstate}, run
in-process against a temporary SQLite database and secrets directory.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from svc.control import operator_cli
from svc.control.ca import certificate_fingerprint
from svc.control.enrollment import format_timestamp, hash_token
from svc.control.operator_cli import OperatorContext, operator_main
from svc.control.owner_auth import hash_link_secret
from svc.control.store.interface import ControlStore
from svc.control.store.opening import open_store
from svc.control.store.outcomes import EnrollGrant, EnrollRefusal, EnrollRefusalReason
from svc.control.store.values import CertificateKind
from svc.control.test.test_enrollment_support import NOW, control_environ
from svc.pki import names
from svc.pki.pem import cert_from_pem
from svc.testing.control_store import TEST_SESSION_KEY
from svc.testing.worker import ImmediateWorker


class OperatorCase(SynchronousTestCase):
    """Runs commands against a temporary database and secrets directory."""

    def setUp(self) -> None:
        base = Path(self.mktemp()).absolute()
        base.mkdir()
        self.secrets = base / "secrets"
        self.database = base / "control.db"
        self.environ = control_environ(self.secrets, DATABASE_URL=f"sqlite:///{self.database}")
        self.clock = Clock()
        self.clock.advance(NOW.timestamp())
        self.stdout = io.StringIO()
        self.stderr = io.StringIO()

    def run_command(self, *argv: str, **environ: str) -> int:
        self.stdout.seek(0)
        self.stdout.truncate()
        self.stderr.seek(0)
        self.stderr.truncate()
        context = OperatorContext(
            environ={**self.environ, **environ},
            reactor=self.clock,
            worker=ImmediateWorker(),
            stdout=self.stdout,
            stderr=self.stderr,
            store_worker=ImmediateWorker(),
        )
        return self.successResultOf(operator_main(list(argv), context))

    def store(self) -> ControlStore:
        store = self.successResultOf(
            open_store(
                f"sqlite:///{self.database}",
                self.clock,
                worker=ImmediateWorker(),
                session_key=TEST_SESSION_KEY,
            )
        )
        self.addCleanup(store.close)
        return store

    def provision(self, agent_id: str = "agent-1") -> None:
        store = self.store()
        self.successResultOf(
            store.provision(
                agent_id=agent_id, owner_id="alice", tenant_id="acme", grant_bytes=1, now=NOW
            )
        )


class OperatorCommandTests(OperatorCase):
    """The commands against a temporary database and secrets directory."""

    def test_ca_init(self) -> None:
        """ca init writes an encrypted root, prints its details and records it."""
        self.assertEqual(self.run_command("ca", "init"), 0, self.stderr.getvalue())
        cert = cert_from_pem((self.secrets / "ca" / "root" / "cert.pem").read_bytes())
        key = (self.secrets / "ca" / "root" / "key.pem").read_bytes()
        self.assertIn(b"ENCRYPTED PRIVATE KEY", key)
        serial = names.format_serial(cert.serial_number)
        out = self.stdout.getvalue()
        self.assertIn(f"serial: {serial}\n", out)
        self.assertIn("subject: CN=Acme Root CA\n", out)
        self.assertIn("not_after: 2036-10-29T12:00:00Z\n", out)
        record = self.successResultOf(self.store().find_certificate(serial))
        self.assertEqual(record.kind, CertificateKind.ORG_ROOT)

    def test_ca_init_org(self) -> None:
        """--org overrides SVC_ORG_NAME in the root's CN."""
        self.assertEqual(self.run_command("ca", "init", "--org", "Other Org"), 0)
        cert = cert_from_pem((self.secrets / "ca" / "root" / "cert.pem").read_bytes())
        self.assertEqual(cert.subject.rfc4514_string(), "CN=Other Org Root CA")

    def test_ca_init_bad_org(self) -> None:
        """An unusable --org is refused before anything is written."""
        self.assertEqual(self.run_command("ca", "init", "--org", "x/y"), 1)
        self.assertIn("--org", self.stderr.getvalue())
        self.assertFalse(self.secrets.exists())

    def test_ca_init_refuses_existing_root(self) -> None:
        """A second ca init exits 1 and leaves the root alone."""
        self.run_command("ca", "init")
        before = (self.secrets / "ca" / "root" / "cert.pem").read_bytes()
        self.assertEqual(self.run_command("ca", "init"), 1)
        self.assertIn("refused", self.stderr.getvalue())
        self.assertEqual(self.stdout.getvalue(), "")
        self.assertEqual((self.secrets / "ca" / "root" / "cert.pem").read_bytes(), before)

    def test_ca_init_without_database(self) -> None:
        """ca init works with the filesystem CA alone (no DATABASE_URL)."""
        self.assertEqual(self.run_command("ca", "init", DATABASE_URL=""), 0)
        self.assertTrue((self.secrets / "ca" / "root" / "key.pem").exists())

    def test_ca_init_not_configured(self) -> None:
        """Without any agent CA configured ca init says so and exits 1."""
        self.assertEqual(self.run_command("ca", "init", SVC_SECRETS_DIR=""), 1)
        self.assertIn("no agent CA is configured", self.stderr.getvalue())

    def test_database_unreachable(self) -> None:
        """A database that cannot be opened is reported, not a traceback."""
        missing = f"sqlite:///{self.database.parent}/no/such/dir/control.db"
        self.assertEqual(self.run_command("user", "seed", "--user", "a", DATABASE_URL=missing), 1)
        self.assertIn("cannot open the database", self.stderr.getvalue())

    def test_config_error(self) -> None:
        """A bad environment is reported with the variable's name."""
        self.assertEqual(self.run_command("ca", "init", SVC_CA_KEK="short"), 1)
        self.assertIn("SVC_CA_KEK", self.stderr.getvalue())

    def test_token_issue(self) -> None:
        """token issue prints one fresh token, usable once for the agent's allocation."""
        self.provision()
        self.assertEqual(self.run_command("token", "issue", "--agent", "agent-1"), 0)
        token = self.stdout.getvalue().strip()
        self.assertRegex(self.stdout.getvalue(), r"^[A-Za-z0-9_-]{43}\n$")
        self.assertIn("agent agent-1", self.stderr.getvalue())
        self.assertNotIn(token, self.stderr.getvalue())
        grant = self.successResultOf(self.store().peek_enroll_token(hash_token(token), NOW))
        assert isinstance(grant, EnrollGrant)
        self.assertEqual(grant.agent_id, "agent-1")
        token_record = self.successResultOf(self.store().get_enroll_token(grant.token_id))
        self.assertEqual(token_record.expires_at, NOW + timedelta(seconds=3600))

    def test_token_issue_ttl(self) -> None:
        """--ttl sets the token's lifetime."""
        self.provision()
        self.run_command("token", "issue", "--agent", "agent-1", "--ttl", "120")
        token = self.stdout.getvalue().strip()
        grant = self.successResultOf(self.store().peek_enroll_token(hash_token(token), NOW))
        assert isinstance(grant, EnrollGrant)
        record = self.successResultOf(self.store().get_enroll_token(grant.token_id))
        self.assertEqual(record.expires_at, NOW + timedelta(seconds=120))

    def test_token_issue_unknown_agent(self) -> None:
        """An unknown agent: exit 1, nothing on stdout."""
        self.assertEqual(self.run_command("token", "issue", "--agent", "nobody"), 1)
        self.assertEqual(self.stdout.getvalue(), "")
        self.assertIn("not found", self.stderr.getvalue())

    def test_token_issue_revoked_agent(self) -> None:
        """A revoked agent: exit 1."""
        self.provision()
        self.successResultOf(self.store().revoke_agent("agent-1", NOW))
        self.assertEqual(self.run_command("token", "issue", "--agent", "agent-1"), 1)
        self.assertIn("revoked", self.stderr.getvalue())

    def test_token_issue_needs_database(self) -> None:
        """Without DATABASE_URL token issue names the missing variable."""
        self.assertEqual(self.run_command("token", "issue", "--agent", "a", DATABASE_URL=""), 1)
        self.assertIn("DATABASE_URL", self.stderr.getvalue())

    def test_bad_ttl(self) -> None:
        """A TTL outside 60 s - 7 days is a usage error (exit 2)."""
        self.patch(sys, "stderr", io.StringIO())
        for ttl in ("59", "604801", "x"):
            with self.assertRaises(SystemExit) as raised:
                self.run_command("token", "issue", "--agent", "a", "--ttl", ttl)
            self.assertEqual(raised.exception.code, 2)

    def test_user_seed(self) -> None:
        """user seed creates the user and prints a sign-in link secret, never a cookie secret."""
        self.assertEqual(self.run_command("user", "seed", "--user", "alice", "--name", "Alice"), 0)
        token = self.stdout.getvalue().strip()
        self.assertRegex(token, r"^[A-Za-z0-9_-]{43}$")
        self.assertIsNone(
            self.successResultOf(self.store().authenticate_admin_session(hash_token(token), NOW))
        )
        found = self.successResultOf(
            self.store().authenticate_admin_session(hash_link_secret(token), NOW)
        )
        assert found is not None
        session, user = found
        self.assertEqual((user.user_id, user.display_name), ("alice", "Alice"))
        self.assertEqual(session.expires_at, NOW + timedelta(hours=12))
        self.assertIn("/admin/session?token=", self.stderr.getvalue())

    def test_user_seed_again_renames(self) -> None:
        """Seeding an existing user renames it and gives a new session."""
        self.run_command("user", "seed", "--user", "alice")
        first = self.stdout.getvalue()
        self.run_command("user", "seed", "--user", "alice", "--name", "Alice B", "--ttl", "600")
        self.assertNotEqual(first, self.stdout.getvalue())
        user = self.successResultOf(self.store().get_user("alice"))
        self.assertEqual(user.display_name, "Alice B")

    def test_user_seed_bad_id(self) -> None:
        """An id outside the accepted alphabet: exit 1."""
        self.assertEqual(self.run_command("user", "seed", "--user", "../x"), 1)
        self.assertEqual(self.stdout.getvalue(), "")


class AccessCommandTests(OperatorCase):
    """C{svc user suspend|reinstate}, C{svc tenant suspend|reinstate}, C{svc token revoke}."""

    def issue(self) -> tuple[str, str]:
        """A fresh enroll token for agent-1: the token and its id."""
        self.assertEqual(self.run_command("token", "issue", "--agent", "agent-1"), 0)
        token = self.stdout.getvalue().strip()
        grant = self.successResultOf(self.store().peek_enroll_token(hash_token(token), NOW))
        assert isinstance(grant, EnrollGrant)
        return token, grant.token_id

    def verdict(self, token: str) -> object:
        return self.successResultOf(self.store().peek_enroll_token(hash_token(token), NOW))

    def test_user_suspend_and_reinstate(self) -> None:
        """user suspend refuses the user's enrollment; user reinstate lifts it."""
        self.provision()
        token, _ = self.issue()
        self.assertEqual(self.run_command("user", "suspend", "--user", "alice"), 0)
        self.assertEqual(self.stdout.getvalue(), "user alice suspended\n")
        self.assertEqual(self.verdict(token), EnrollRefusal(EnrollRefusalReason.USER_SUSPENDED))
        self.assertEqual(self.run_command("user", "reinstate", "--user", "alice"), 0)
        self.assertIn("reinstated", self.stdout.getvalue())
        self.assertIsInstance(self.verdict(token), EnrollGrant)

    def test_tenant_suspend_and_reinstate(self) -> None:
        """tenant suspend refuses the tenant's enrollment; tenant reinstate lifts it."""
        self.provision()
        token, _ = self.issue()
        self.assertEqual(self.run_command("tenant", "suspend", "--tenant", "acme"), 0)
        self.assertEqual(self.stdout.getvalue(), "tenant acme (owner alice) suspended\n")
        self.assertEqual(self.verdict(token), EnrollRefusal(EnrollRefusalReason.TENANT_SUSPENDED))
        self.assertEqual(self.run_command("tenant", "reinstate", "--tenant", "acme"), 0)
        self.assertIsInstance(self.verdict(token), EnrollGrant)

    def test_unknown_and_bad_ids(self) -> None:
        """Unknown users or tenants and malformed ids exit 1 naming the problem."""
        self.assertEqual(self.run_command("user", "suspend", "--user", "nobody"), 1)
        self.assertIn("svc: user suspend: not found", self.stderr.getvalue())
        self.assertEqual(self.run_command("tenant", "reinstate", "--tenant", "nobody"), 1)
        self.assertIn("svc: tenant reinstate: not found", self.stderr.getvalue())
        self.assertEqual(self.run_command("tenant", "suspend", "--tenant", "../x"), 1)
        self.assertIn("--tenant", self.stderr.getvalue())

    def test_token_revoke(self) -> None:
        """token revoke stops one unspent token; the agent's other tokens still work."""
        self.provision()
        token, token_id = self.issue()
        other, _ = self.issue()
        self.assertEqual(self.run_command("token", "revoke", "--id", token_id), 0)
        self.assertIn(f"enroll token {token_id} revoked at", self.stdout.getvalue())
        self.assertEqual(self.verdict(token), EnrollRefusal(EnrollRefusalReason.REVOKED))
        self.assertIsInstance(self.verdict(other), EnrollGrant)
        self.assertEqual(self.run_command("token", "revoke", "--id", token_id), 0)

    def test_token_revoke_spent(self) -> None:
        """Revoking a spent token is refused (exit 1): nothing was revoked."""
        self.provision()
        token, token_id = self.issue()
        self.successResultOf(self.store().consume_enroll_token(hash_token(token), NOW))
        self.assertEqual(self.run_command("token", "revoke", "--id", token_id), 1)
        self.assertIn("was spent at", self.stderr.getvalue())
        self.assertEqual(self.stdout.getvalue(), "")

    def test_token_revoke_unknown(self) -> None:
        """An unknown or malformed token id exits 1."""
        self.assertEqual(self.run_command("token", "revoke", "--id", "0" * 32), 1)
        self.assertIn("not found", self.stderr.getvalue())
        self.assertEqual(self.run_command("token", "revoke", "--id", "xyz"), 1)
        self.assertIn("--id", self.stderr.getvalue())


class JsonOutputTests(OperatorCase):
    """With C{--json} each command prints one JSON document on stdout."""

    def run_json(self, *argv: str) -> Any:
        """Run C{argv} with C{--json}: exit 0, stdout one JSON document (parsed)."""
        self.assertEqual(self.run_command(*argv, "--json"), 0, self.stderr.getvalue())
        out = self.stdout.getvalue()
        self.assertEqual(out, json.dumps(json.loads(out), indent=2, sort_keys=True) + "\n")
        return json.loads(out)

    def issue(self) -> dict[str, Any]:
        self.provision()
        issued: dict[str, Any] = self.run_json("token", "issue", "--agent", "agent-1")
        return issued

    def test_ca_init(self) -> None:
        """ca init --json: where the root went, its subject, serial, expiry and fingerprint."""
        document = self.run_json("ca", "init")
        cert = cert_from_pem((self.secrets / "ca" / "root" / "cert.pem").read_bytes())
        self.assertEqual(
            document,
            {
                "backend": "filesystem",
                "secrets_dir": str(self.secrets),
                "key_encrypted": True,
                "subject": "CN=Acme Root CA",
                "serial": names.format_serial(cert.serial_number),
                "not_after": format_timestamp(cert.not_valid_after_utc),
                "sha256": certificate_fingerprint(cert),
            },
        )

    def test_token_issue(self) -> None:
        """token issue --json: the token with its id, agent, allocation, tenant and expiry."""
        document = self.issue()
        grant = self.successResultOf(
            self.store().peek_enroll_token(hash_token(document["token"]), NOW)
        )
        assert isinstance(grant, EnrollGrant)
        self.assertEqual(
            document,
            {
                "token": document["token"],
                "token_id": grant.token_id,
                "agent_id": "agent-1",
                "allocation_id": grant.allocation.allocation_id,
                "tenant": "acme",
                "expires_at": format_timestamp(NOW + timedelta(hours=1)),
            },
        )
        self.assertNotIn(document["token"], self.stderr.getvalue())

    def test_token_revoke(self) -> None:
        """token revoke --json: the token's state, as POST /v1/enroll-tokens/{id}/revoke."""
        issued = self.issue()
        document = self.run_json("token", "revoke", "--id", issued["token_id"])
        self.assertEqual(
            document,
            {
                "token_id": issued["token_id"],
                "agent_id": "agent-1",
                "allocation_id": issued["allocation_id"],
                "state": "revoked",
                "created_at": format_timestamp(NOW),
                "expires_at": issued["expires_at"],
                "consumed_at": None,
                "revoked_at": format_timestamp(NOW),
            },
        )

    def test_user_seed(self) -> None:
        """user seed --json: the sign-in link secret, the user and the session's expiry."""
        document = self.run_json("user", "seed", "--user", "alice", "--name", "Alice")
        self.assertEqual(
            document,
            {
                "token": document["token"],
                "user_id": "alice",
                "display_name": "Alice",
                "expires_at": format_timestamp(NOW + timedelta(hours=12)),
            },
        )
        found = self.successResultOf(
            self.store().authenticate_admin_session(hash_link_secret(document["token"]), NOW)
        )
        self.assertIsNotNone(found)

    def test_user_suspend(self) -> None:
        """user suspend --json: the account entity, suspended."""
        self.provision()
        document = self.run_json("user", "suspend", "--user", "alice")
        self.assertEqual(
            (document["type"], document["id"], document["suspended"]), ("account", "alice", True)
        )
        self.assertEqual([a["agent_id"] for a in document["allocations"]], ["agent-1"])

    def test_user_reinstate(self) -> None:
        """user reinstate --json: the account entity, not suspended."""
        self.provision()
        self.run_json("user", "suspend", "--user", "alice")
        document = self.run_json("user", "reinstate", "--user", "alice")
        self.assertEqual(
            (document["type"], document["id"], document["suspended"]), ("account", "alice", False)
        )

    def test_tenant_suspend(self) -> None:
        """tenant suspend --json: the tenant, its owner, suspended."""
        self.provision()
        self.assertEqual(
            self.run_json("tenant", "suspend", "--tenant", "acme"),
            {
                "tenant": "acme",
                "owner": "alice",
                "suspended": True,
                "created_at": format_timestamp(NOW),
            },
        )

    def test_tenant_reinstate(self) -> None:
        """tenant reinstate --json: the tenant, not suspended."""
        self.provision()
        self.run_json("tenant", "suspend", "--tenant", "acme")
        document = self.run_json("tenant", "reinstate", "--tenant", "acme")
        self.assertEqual((document["tenant"], document["suspended"]), ("acme", False))

    def test_refusal(self) -> None:
        """A refused command with --json still exits 1, says why on stderr, prints nothing."""
        self.assertEqual(self.run_command("token", "revoke", "--id", "0" * 32, "--json"), 1)
        self.assertEqual(self.stdout.getvalue(), "")
        self.assertIn("svc: token revoke: not found", self.stderr.getvalue())


class RegistrationTests(SynchronousTestCase):
    """register() plugs the commands into the svc command's parser."""

    def test_register(self) -> None:
        """ca init, token issue and user seed parse under a svc-style parser."""
        parser = argparse.ArgumentParser(prog="svc")
        operator_cli.register(parser.add_subparsers(dest="command", required=True))
        parsed: Any = parser.parse_args(["token", "issue", "--agent", "a1"])
        self.assertIs(parsed.operator_command, operator_cli.token_issue)
        self.assertTrue(callable(parsed.run))
        self.assertEqual(parser.parse_args(["ca", "init"]).operator_command, operator_cli.ca_init)
        self.assertEqual(
            parser.parse_args(["user", "seed", "--user", "u"]).operator_command,
            operator_cli.user_seed,
        )
        for argv, command in (
            (["user", "suspend", "--user", "u"], operator_cli.user_suspend),
            (["user", "reinstate", "--user", "u"], operator_cli.user_reinstate),
            (["tenant", "suspend", "--tenant", "t"], operator_cli.tenant_suspend),
            (["tenant", "reinstate", "--tenant", "t"], operator_cli.tenant_reinstate),
            (["token", "revoke", "--id", "0" * 32], operator_cli.token_revoke),
        ):
            self.assertIs(parser.parse_args(argv).operator_command, command, argv)


class ProcessTests(SynchronousTestCase):
    """The real entry point runs on the global reactor in its own process."""

    def run_process(self, environ: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
        script = "import sys; from svc.control.operator_cli import main; main(sys.argv[1:])"
        return subprocess.run(
            [sys.executable, "-c", script, *argv],
            env={"PATH": os.environ.get("PATH", ""), **environ},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def test_seed_and_refusal(self) -> None:
        """user seed exits 0 printing a token; token issue for an unknown agent exits 1."""
        base = Path(self.mktemp()).absolute()
        base.mkdir()
        environ = control_environ(base / "secrets", DATABASE_URL=f"sqlite:///{base}/control.db")
        seeded = self.run_process(environ, "user", "seed", "--user", "alice")
        self.assertEqual(seeded.returncode, 0, seeded.stderr)
        self.assertRegex(seeded.stdout, r"^[A-Za-z0-9_-]{43}\n$")
        refused = self.run_process(environ, "token", "issue", "--agent", "nobody")
        self.assertEqual(refused.returncode, 1, refused.stderr)
        self.assertEqual(refused.stdout, "")
        self.assertIn("svc: token issue: not found", refused.stderr)
