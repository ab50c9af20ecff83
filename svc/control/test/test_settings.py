"""
Tests for L{svc.control.settings}.
"""

from __future__ import annotations

import base64
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.config import ConfigError
from svc.control.settings import (
    ControlSettings,
    DatabaseKind,
    RateLimit,
    SecretsBackend,
)

TOKEN = "s" * 32
KEK = base64.b64encode(b"k" * 32).decode("ascii")
CA = {
    "SVC_SECRETS_DIR": "/var/lib/svc/secrets",
    "SVC_CONTROL_PLANE_TOKEN": TOKEN,
    "SVC_CA_KEK": KEK,
    "SVC_TRUST_DOMAIN": "svc.example",
}


class SettingsTests(SynchronousTestCase):
    """
    Tests for L{ControlSettings.from_environ}.
    """

    def refused(self, variable: str, environ: dict[str, str]) -> ConfigError:
        error: ConfigError = self.assertRaises(ConfigError, ControlSettings.from_environ, environ)
        self.assertEqual(error.variable, variable)
        return error

    def test_defaults(self) -> None:
        """An empty environment is a valid, minimal configuration."""
        settings = ControlSettings.from_environ({})
        self.assertIsNone(settings.database_url)
        self.assertIsNone(settings.database_kind)
        self.assertIsNone(settings.control_plane_token)
        self.assertIs(settings.secrets_backend, SecretsBackend.FILESYSTEM)
        self.assertFalse(settings.agent_ca_configured)
        self.assertEqual(settings.org_name, "svc")
        self.assertEqual(settings.mount_prefix, "/mnt/svc")
        self.assertIsNone(settings.identity)
        self.assertEqual(settings.max_body_bytes, 65536)
        self.assertEqual(settings.enroll_token_ttl_seconds, 3600)
        self.assertEqual(settings.enroll_rate_limit, RateLimit(5, 60))
        self.assertIsNone(settings.tenant_allowlist)
        self.assertFalse(settings.dev_mode)

    def test_database_urls(self) -> None:
        """sqlite:/// and postgres[ql]:// URLs are accepted and classified."""
        for url, kind in (
            ("sqlite:///control.db", DatabaseKind.SQLITE),
            ("sqlite:////var/lib/svc/control.db", DatabaseKind.SQLITE),
            ("postgres://svc:pw@db/svc", DatabaseKind.POSTGRES),
            ("postgresql://db/svc", DatabaseKind.POSTGRES),
        ):
            settings = ControlSettings.from_environ(
                {"DATABASE_URL": url, "SVC_CONTROL_PLANE_TOKEN": TOKEN}
            )
            self.assertEqual(settings.database_kind, kind, url)

    def test_bad_database_url(self) -> None:
        """Other URLs are refused without echoing the value."""
        for url in ("mysql://u:hunter2@h/db", "sqlite://x", "sqlite:///", "postgres://"):
            error = self.refused(
                "DATABASE_URL", {"DATABASE_URL": url, "SVC_CONTROL_PLANE_TOKEN": TOKEN}
            )
            self.assertNotIn("hunter2", str(error))

    def test_token_required_with_database(self) -> None:
        """DATABASE_URL without SVC_CONTROL_PLANE_TOKEN refuses to start."""
        self.refused("SVC_CONTROL_PLANE_TOKEN", {"DATABASE_URL": "sqlite:///c.db"})

    def test_token_required_with_ca(self) -> None:
        """An agent CA without SVC_CONTROL_PLANE_TOKEN refuses to start."""
        environ = dict(CA)
        del environ["SVC_CONTROL_PLANE_TOKEN"]
        self.refused("SVC_CONTROL_PLANE_TOKEN", environ)

    def test_token_shape(self) -> None:
        """The service token needs 32+ characters that fit a Bearer header."""
        self.refused("SVC_CONTROL_PLANE_TOKEN", {"SVC_CONTROL_PLANE_TOKEN": "s" * 31})
        self.refused("SVC_CONTROL_PLANE_TOKEN", {"SVC_CONTROL_PLANE_TOKEN": "s" * 31 + " x"})
        self.refused("SVC_CONTROL_PLANE_TOKEN", {"SVC_CONTROL_PLANE_TOKEN": "é" * 32})
        settings = ControlSettings.from_environ({"SVC_CONTROL_PLANE_TOKEN": "a-._~+/" * 5 + "=="})
        self.assertIsNotNone(settings.control_plane_token)

    def test_filesystem_ca(self) -> None:
        """SVC_SECRETS_DIR configures the filesystem CA."""
        settings = ControlSettings.from_environ(CA)
        self.assertTrue(settings.agent_ca_configured)
        self.assertEqual(settings.secrets_dir, Path("/var/lib/svc/secrets"))
        self.assertEqual(settings.ca_kek, b"k" * 32)
        self.assertEqual(settings.trust_domain, "svc.example")

    def test_ca_needs_kek_unless_dev(self) -> None:
        """An agent CA needs SVC_CA_KEK, except in dev mode."""
        environ = dict(CA)
        del environ["SVC_CA_KEK"]
        self.refused("SVC_CA_KEK", environ)
        settings = ControlSettings.from_environ({**environ, "SVC_DEV_MODE": "1"})
        self.assertIsNone(settings.ca_kek)

    def test_ca_needs_trust_domain(self) -> None:
        """An agent CA needs SVC_TRUST_DOMAIN, which must be a DNS-like name."""
        environ = dict(CA)
        del environ["SVC_TRUST_DOMAIN"]
        self.refused("SVC_TRUST_DOMAIN", environ)
        self.refused("SVC_TRUST_DOMAIN", {**CA, "SVC_TRUST_DOMAIN": "Not A Domain"})

    def test_kek_encodings(self) -> None:
        """The KEK may be standard or URL-safe base64, padded or not."""
        raw = bytes(range(200, 240))
        for text in (
            base64.b64encode(raw).decode(),
            base64.urlsafe_b64encode(raw).decode(),
            base64.urlsafe_b64encode(raw).decode().rstrip("="),
        ):
            self.assertEqual(ControlSettings.from_environ({**CA, "SVC_CA_KEK": text}).ca_kek, raw)

    def test_kek_refused(self) -> None:
        """A short or non-base64 KEK is refused without echoing it."""
        short = base64.b64encode(b"k" * 31).decode()
        self.refused("SVC_CA_KEK", {**CA, "SVC_CA_KEK": short})
        error = self.refused("SVC_CA_KEK", {**CA, "SVC_CA_KEK": "not*base64!secret"})
        self.assertNotIn("secret", str(error))

    def test_kek_file(self) -> None:
        """SVC_CA_KEK_FILE is read through the injected reader, whitespace stripped."""
        environ = dict(CA)
        del environ["SVC_CA_KEK"]
        environ["SVC_CA_KEK_FILE"] = "/run/secrets/kek"
        read: list[Path] = []

        def read_file(path: Path) -> bytes:
            read.append(path)
            return KEK.encode() + b"\n"

        settings = ControlSettings.from_environ(environ, read_file)
        self.assertEqual((settings.ca_kek, read), (b"k" * 32, [Path("/run/secrets/kek")]))

    def test_kek_file_unreadable(self) -> None:
        """An unreadable KEK file is refused naming SVC_CA_KEK_FILE."""

        def read_file(path: Path) -> bytes:
            raise FileNotFoundError(2, "No such file")

        environ = {**CA, "SVC_CA_KEK_FILE": "/nope"}
        del environ["SVC_CA_KEK"]
        error = self.assertRaises(ConfigError, ControlSettings.from_environ, environ, read_file)
        self.assertEqual(error.variable, "SVC_CA_KEK_FILE")

    def test_secret_files(self) -> None:
        """The token, the KEK and DATABASE_URL are each read from their _FILE variant."""
        files = {
            Path("/run/credentials/token"): TOKEN.encode() + b"\n",
            Path("/run/credentials/kek"): KEK.encode() + b"\n",
            Path("/run/credentials/db"): b"postgres://svc@db.internal:5432/svc\n",
        }
        environ = {
            "SVC_SECRETS_DIR": "/var/lib/svc/secrets",
            "SVC_TRUST_DOMAIN": "svc.example",
            "SVC_CONTROL_PLANE_TOKEN_FILE": "/run/credentials/token",
            "SVC_CA_KEK_FILE": "/run/credentials/kek",
            "DATABASE_URL_FILE": "/run/credentials/db",
        }
        settings = ControlSettings.from_environ(environ, files.__getitem__)
        self.assertEqual(settings.control_plane_token, TOKEN)
        self.assertEqual(settings.ca_kek, b"k" * 32)
        self.assertEqual(settings.database_url, "postgres://svc@db.internal:5432/svc")
        self.assertIs(settings.database_kind, DatabaseKind.POSTGRES)

    def test_secret_file_values_checked(self) -> None:
        """A bad value read from a _FILE variant is refused naming the _FILE variable."""
        for variable, content in (
            ("SVC_CA_KEK_FILE", b"not*base64!secret\n"),
            ("SVC_CONTROL_PLANE_TOKEN_FILE", b"short\n"),
        ):
            environ = {**CA, variable: "/run/secret"}
            del environ[variable.removesuffix("_FILE")]
            files = {Path("/run/secret"): content}
            error = self.assertRaises(
                ConfigError, ControlSettings.from_environ, environ, files.__getitem__
            )
            self.assertEqual(error.variable, variable)
            self.assertNotIn("secret", error.problem)

    def test_kek_both_refused(self) -> None:
        """Setting both SVC_CA_KEK and SVC_CA_KEK_FILE is refused."""
        self.refused("SVC_CA_KEK_FILE", {**CA, "SVC_CA_KEK_FILE": "/k"})

    def test_postgres_backend(self) -> None:
        """SVC_SECRETS_BACKEND=postgres needs a postgres DATABASE_URL and configures a CA."""
        environ = {
            "SVC_SECRETS_BACKEND": "postgres",
            "SVC_CONTROL_PLANE_TOKEN": TOKEN,
            "SVC_CA_KEK": KEK,
            "SVC_TRUST_DOMAIN": "svc.example",
        }
        self.refused("SVC_SECRETS_BACKEND", environ)
        self.refused("SVC_SECRETS_BACKEND", {**environ, "DATABASE_URL": "sqlite:///c.db"})
        settings = ControlSettings.from_environ({**environ, "DATABASE_URL": "postgres://db/svc"})
        self.assertTrue(settings.agent_ca_configured)
        self.refused("SVC_SECRETS_BACKEND", {**environ, "SVC_SECRETS_BACKEND": "vault"})

    def test_mount_prefix(self) -> None:
        """SVC_MOUNT_PREFIX sets virtual_path; non-canonical prefixes are refused."""
        settings = ControlSettings.from_environ({"SVC_MOUNT_PREFIX": "/data/m"})
        self.assertEqual(settings.virtual_path("agent-1"), "/data/m/agents/agent-1")
        default = ControlSettings.from_environ({})
        self.assertEqual(default.virtual_path("a"), "/mnt/svc/agents/a")
        for bad in ("relative", "/trailing/", "/", "//x", "/a/../b", "/a//b"):
            self.refused("SVC_MOUNT_PREFIX", {"SVC_MOUNT_PREFIX": bad})

    def test_org_name(self) -> None:
        """SVC_ORG_NAME is validated as an organisation name."""
        self.assertEqual(
            ControlSettings.from_environ({"SVC_ORG_NAME": "Acme Inc."}).org_name, "Acme Inc."
        )
        self.refused("SVC_ORG_NAME", {"SVC_ORG_NAME": "bad/org"})

    def test_identity(self) -> None:
        """SVC_IDENTITY_AUDIENCE enables host JWTs with their settings."""
        settings = ControlSettings.from_environ(
            {
                "SVC_IDENTITY_AUDIENCE": "svc",
                "SVC_IDENTITY_PUBLIC_KEY_FILE": "/etc/idp.pem",
                "SVC_IDENTITY_TENANT_ALLOWLIST": " acme, globex ,",
            }
        )
        identity = settings.identity
        assert identity is not None
        self.assertEqual(identity.audience, "svc")
        self.assertEqual(identity.public_key_file, Path("/etc/idp.pem"))
        self.assertIsNone(identity.issuer)
        self.assertEqual(identity.tenant_claim, "tenant")
        self.assertEqual(identity.tenant_allowlist, frozenset({"acme", "globex"}))

    def test_identity_allowlist_required(self) -> None:
        """With an audience, a missing or empty allowlist refuses to start."""
        environ = {"SVC_IDENTITY_AUDIENCE": "svc", "SVC_IDENTITY_PUBLIC_KEY_FILE": "/k"}
        self.refused("SVC_IDENTITY_TENANT_ALLOWLIST", environ)
        for empty in ("", ",", " , "):
            self.refused(
                "SVC_IDENTITY_TENANT_ALLOWLIST", {**environ, "SVC_IDENTITY_TENANT_ALLOWLIST": empty}
            )
        self.refused(
            "SVC_IDENTITY_TENANT_ALLOWLIST", {**environ, "SVC_IDENTITY_TENANT_ALLOWLIST": "a/b"}
        )

    def test_identity_key_required(self) -> None:
        """With an audience, SVC_IDENTITY_PUBLIC_KEY_FILE is required."""
        self.refused(
            "SVC_IDENTITY_PUBLIC_KEY_FILE",
            {"SVC_IDENTITY_AUDIENCE": "svc", "SVC_IDENTITY_TENANT_ALLOWLIST": "acme"},
        )

    def test_identity_without_audience(self) -> None:
        """Identity variables without an audience are refused naming the audience."""
        self.refused("SVC_IDENTITY_AUDIENCE", {"SVC_IDENTITY_PUBLIC_KEY_FILE": "/k"})

    def test_rate_limit(self) -> None:
        """SVC_ENROLL_RATE_LIMIT is <count>/<seconds> within bounds."""
        settings = ControlSettings.from_environ({"SVC_ENROLL_RATE_LIMIT": "10/30"})
        self.assertEqual(settings.enroll_rate_limit, RateLimit(10, 30))
        for bad in ("10", "0/60", "5/0", "a/b", "5/60/1", "-1/60"):
            self.refused("SVC_ENROLL_RATE_LIMIT", {"SVC_ENROLL_RATE_LIMIT": bad})

    def test_tenant_allowlist(self) -> None:
        """Unset SVC_TENANT_ALLOWLIST allows every tenant; set, only those listed."""
        self.assertTrue(ControlSettings.from_environ({}).tenant_may_have_intermediate("any"))
        settings = ControlSettings.from_environ({"SVC_TENANT_ALLOWLIST": "acme,globex"})
        self.assertTrue(settings.tenant_may_have_intermediate("acme"))
        self.assertFalse(settings.tenant_may_have_intermediate("initech"))
        self.refused("SVC_TENANT_ALLOWLIST", {"SVC_TENANT_ALLOWLIST": ","})

    def test_dev_mode(self) -> None:
        """SVC_DEV_MODE accepts common boolean spellings and refuses others."""
        for value, expected in (
            ("1", True),
            ("TRUE", True),
            ("on", True),
            ("0", False),
            ("no", False),
        ):
            self.assertEqual(
                ControlSettings.from_environ({"SVC_DEV_MODE": value}).dev_mode, expected, value
            )
        self.refused("SVC_DEV_MODE", {"SVC_DEV_MODE": "maybe"})

    def test_integer_bounds(self) -> None:
        """Body size and enroll token TTL are bounded integers."""
        self.refused("SVC_MAX_BODY_BYTES", {"SVC_MAX_BODY_BYTES": "100"})
        self.refused("SVC_MAX_BODY_BYTES", {"SVC_MAX_BODY_BYTES": "lots"})
        self.refused("SVC_ENROLL_TOKEN_TTL_SECONDS", {"SVC_ENROLL_TOKEN_TTL_SECONDS": "59"})
        settings = ControlSettings.from_environ({"SVC_MAX_BODY_BYTES": "2048"})
        self.assertEqual(settings.max_body_bytes, 2048)

    def test_secrets_not_in_repr(self) -> None:
        """The database URL, service token and KEK do not appear in repr."""
        settings = ControlSettings.from_environ(
            {**CA, "DATABASE_URL": "postgres://svc:hunter2@db/svc"}
        )
        text = repr(settings)
        for secret in ("hunter2", TOKEN, "kkkk"):
            self.assertNotIn(secret, text)
