"""
Tests for L{svc.mount.control.credentials}: parsing an enrollment answer, and the
stored credentials file.
"""

from __future__ import annotations

import json
import stat
from datetime import timedelta
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from svc.control.test.test_enrollment_support import EnrollmentWorld
from svc.mount.control.credentials import (
    CREDENTIALS_FILE,
    AgentCredentials,
    CredentialsError,
    load_credentials,
    save_credentials,
)


class CredentialsCase(SynchronousTestCase):
    """An enrollment answer from the real enrollment route."""

    def setUp(self) -> None:
        self.world = EnrollmentWorld(self)
        self.body: dict[str, Any] = self.world.enrolled().body
        self.creds = AgentCredentials.from_enrollment(self.body)


class FromEnrollmentTests(CredentialsCase):
    """AgentCredentials.from_enrollment."""

    def test_fields(self) -> None:
        """The answer's fields become the credentials' fields."""
        self.assertEqual(self.creds.leaf_pem, self.body["client_cert_pem"].encode())
        self.assertEqual(self.creds.serial, self.body["serial"])
        self.assertEqual(self.creds.allocation_id, self.body["allocation_id"])
        self.assertEqual(self.creds.not_after, self.world.now() + timedelta(hours=1))

    def test_missing_field(self) -> None:
        """An answer without server_name is refused."""
        del self.body["server_name"]
        self.assertRaises(CredentialsError, AgentCredentials.from_enrollment, self.body)

    def test_key_of_another_leaf(self) -> None:
        """A key that is not the leaf's is refused."""
        other = self.world.enrolled().body
        self.body["client_key_pem"] = other["client_key_pem"]
        self.assertRaises(CredentialsError, AgentCredentials.from_enrollment, self.body)

    def test_wrong_fingerprint(self) -> None:
        """A fingerprint that is not the leaf's is refused."""
        self.body["agent_fingerprint"] = "0" * 64
        self.assertRaises(CredentialsError, AgentCredentials.from_enrollment, self.body)

    def test_key_out_of_repr(self) -> None:
        """The private key is not in the repr."""
        self.assertNotIn(self.creds.key_pem.decode(), repr(self.creds))
        self.assertNotIn("key_pem", repr(self.creds))


class StorageTests(CredentialsCase):
    """save_credentials and load_credentials."""

    def test_round_trip(self) -> None:
        """Saved credentials load back equal, in a 0600 file in a 0700 directory."""
        directory = Path(self.mktemp()) / "state" / "agent"
        path = save_credentials(directory, self.creds)
        self.assertEqual(path, directory / CREDENTIALS_FILE)
        self.assertEqual(load_credentials(directory), self.creds)
        self.assertEqual(stat.S_IMODE(path.stat().st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(directory.stat().st_mode), 0o700)
        self.assertEqual([p.name for p in directory.iterdir()], [CREDENTIALS_FILE])

    def test_replace(self) -> None:
        """Saving again replaces the stored credentials."""
        directory = Path(self.mktemp())
        save_credentials(directory, self.creds)
        renewed = AgentCredentials.from_enrollment(self.world.enrolled().body)
        save_credentials(directory, renewed)
        self.assertEqual(load_credentials(directory), renewed)
        self.assertEqual([p.name for p in directory.iterdir()], [CREDENTIALS_FILE])

    def test_none_stored(self) -> None:
        """A directory without credentials loads as None."""
        self.assertIsNone(load_credentials(Path(self.mktemp())))

    def test_corrupt(self) -> None:
        """A file that is not JSON is refused."""
        directory = Path(self.mktemp())
        save_credentials(directory, self.creds)
        (directory / CREDENTIALS_FILE).write_bytes(b"{not json")
        self.assertRaises(CredentialsError, load_credentials, directory)

    def test_tampered(self) -> None:
        """A stored file whose serial is not the leaf's is refused."""
        directory = Path(self.mktemp())
        save_credentials(directory, self.creds)
        path = directory / CREDENTIALS_FILE
        document = json.loads(path.read_bytes())
        document["serial"] = "1"
        path.write_text(json.dumps(document))
        self.assertRaises(CredentialsError, load_credentials, directory)
