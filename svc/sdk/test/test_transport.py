"""
Tests for the pure parts of L{svc.sdk.transport} and the checks of
L{svc.sdk.Client}'s constructor.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from svc.sdk import Client
from svc.sdk.transport import Endpoint, encode_segment, is_compatible, server_major

TOKEN = "service-token-" + "x" * 20


class EncodeSegmentTests(SynchronousTestCase):
    """L{encode_segment}."""

    def test_escapes_everything_but_unreserved(self) -> None:
        """Slashes, spaces, percent signs and non-ASCII are escaped; unreserved kept."""
        self.assertEqual(encode_segment("a b/c%d?e#f"), "a%20b%2Fc%25d%3Fe%23f")
        self.assertEqual(encode_segment("é"), "%C3%A9")
        self.assertEqual(encode_segment("Az09-._~"), "Az09-._~")

    def test_dot_segments(self) -> None:
        """'.' and '..' cannot address another path."""
        self.assertEqual((encode_segment("."), encode_segment("..")), ("%2E", "%2E%2E"))
        self.assertEqual(encode_segment("a..b"), "a..b")

    def test_empty_refused(self) -> None:
        """An empty parameter would address another route."""
        self.assertRaises(ValueError, encode_segment, "")


class VersionTests(SynchronousTestCase):
    """L{server_major} and L{is_compatible}."""

    def test_majors(self) -> None:
        """The major is the leading integer."""
        self.assertEqual(
            [server_major(v) for v in ("1", " 2 ", "1.4", "x", "", "1a")],
            [1, 2, 1, None, None, None],
        )

    def test_compatibility(self) -> None:
        """Absent or major 1 is compatible; another major or garbage is not."""
        self.assertEqual(
            [is_compatible(v) for v in (None, "1", "1.9", "2", "0", "v1")],
            [True, True, True, False, False, False],
        )


class EndpointTests(SynchronousTestCase):
    """L{Endpoint.from_url}."""

    def test_parts(self) -> None:
        """Scheme, host, port and a prefix without trailing slash."""
        self.assertEqual(
            Endpoint.from_url("https://example.com:8443/api/"),
            Endpoint("https", "example.com", 8443, "/api"),
        )
        self.assertEqual(
            Endpoint.from_url("http://127.0.0.1"), Endpoint("http", "127.0.0.1", None, "")
        )

    def test_refused(self) -> None:
        """Other schemes, credentials, queries and missing hosts are refused."""
        for url in ("ftp://h", "https://u:p@h", "https://h/?q=1", "https://", "h:80"):
            self.assertRaises(ValueError, Endpoint.from_url, url)


class ClientConstructorTests(SynchronousTestCase):
    """L{Client}'s argument checks."""

    def test_token_not_in_repr(self) -> None:
        """The service token never appears in repr."""
        client = Client("http://127.0.0.1:1", TOKEN)
        self.assertNotIn(TOKEN, repr(client))
        self.assertNotIn(TOKEN, repr(vars(client)))

    def test_bad_token(self) -> None:
        """A token that is not a token68 (empty, spaces, newline) is refused."""
        for token in ("", "two words", "x\r\nInjected: 1"):
            self.assertRaises(ValueError, Client, "http://h", token)

    def test_bad_timeout(self) -> None:
        """The timeout is positive and finite."""
        for timeout in (0, -1, float("inf"), float("nan")):
            self.assertRaises(ValueError, Client, "http://h", TOKEN, timeout=timeout)

    def test_ca_file_needs_https(self) -> None:
        """A CA bundle with a plain http URL is a mistake."""
        self.assertRaises(ValueError, Client, "http://h", TOKEN, ca_file="/etc/ca.pem")

    def test_mount_root_absolute(self) -> None:
        """The mount root is an absolute path."""
        self.assertRaises(ValueError, Client, "http://h", TOKEN, mount_root="mnt")

    def test_values_checked_before_sending(self) -> None:
        """Byte counts must be ints and ids non-empty, before any request is made."""
        client = Client("http://127.0.0.1:1", TOKEN)
        self.assertRaises(TypeError, client.allocate_disk, "a1", "acme", True)
        self.assertRaises(TypeError, client.set_disk_quota, "a1", 1.5)
        self.assertRaises(ValueError, client.resolve, "agent", "")
