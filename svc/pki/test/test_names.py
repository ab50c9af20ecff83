"""
Tests for L{svc.pki.names}: accepted identifier forms and the canonical
serial text.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.pki import names
from svc.pki.errors import InvalidName


class IdTests(SynchronousTestCase):
    """
    Tenant, agent and user ids.
    """

    def test_accepted(self) -> None:
        """Letters, digits, '.', '_' and '-' up to 64 characters are accepted."""
        for good in ("a", "A9", "t-1", "agent_7.x", "0" * 64):
            self.assertEqual(names.check_id(good), good)

    def test_refused(self) -> None:
        """Slashes, '..', leading punctuation, spaces, non-ASCII and 65+ chars are refused."""
        for bad in ("", "a/b", "/a", "..", "a..b", ".a", "-a", "_a", "a b", "é", "a" * 65, "a\n"):
            self.assertRaises(InvalidName, names.check_id, bad)

    @settings(max_examples=300, deadline=None)
    @given(st.text(alphabet="aZ9._-/%\\ \x00é", max_size=70))
    def test_never_path_unsafe(self, value: str) -> None:
        """Whatever is accepted contains no slash, no '..', no '%' and is not '.'."""
        try:
            names.check_id(value)
        except InvalidName:
            return
        self.assertNotIn("/", value)
        self.assertNotIn("..", value)
        self.assertNotIn("%", value)
        self.assertNotIn(value, (".", ".."))
        self.assertLessEqual(len(value), 64)


class DomainTests(SynchronousTestCase):
    """
    Trust domains and host names.
    """

    def test_trust_domain(self) -> None:
        """Lowercase DNS-like names are trust domains; other forms are not."""
        self.assertEqual(names.check_trust_domain("svc.example.org"), "svc.example.org")
        for bad in ("", "Svc.org", "a..b", "-a", "a-", "a_b", "a b", "a/b", "x" * 254):
            self.assertRaises(InvalidName, names.check_trust_domain, bad)

    def test_fqdn_lowercased(self) -> None:
        """Host names are lower-cased; single labels like localhost are fine."""
        self.assertEqual(names.check_fqdn("DataPlane.Test"), "dataplane.test")
        self.assertEqual(names.check_fqdn("localhost"), "localhost")

    def test_fqdn_refused(self) -> None:
        """Non-DNS names and names longer than a CN are refused."""
        for bad in ("", "a b", "a..b", "*.example", "x" * 65):
            self.assertRaises(InvalidName, names.check_fqdn, bad)


class SpiffeTests(SynchronousTestCase):
    """
    SPIFFE id construction and splitting.
    """

    def test_build(self) -> None:
        """Tenant, agent and control ids have the spec's shapes."""
        self.assertEqual(names.tenant_spiffe_id("td.org", "t"), "spiffe://td.org/tenant/t")
        self.assertEqual(names.agent_spiffe_id("td.org", "a"), "spiffe://td.org/agent/a")
        self.assertEqual(names.control_spiffe_id("td.org"), "spiffe://td.org/control")

    def test_split(self) -> None:
        """Splitting yields (domain, path) or None for non-SPIFFE URIs."""
        self.assertEqual(names.split_spiffe_id("spiffe://td/agent/a"), ("td", "agent/a"))
        self.assertIsNone(names.split_spiffe_id("https://td/agent/a"))
        self.assertIsNone(names.split_spiffe_id("spiffe://td"))
        self.assertIsNone(names.split_spiffe_id("spiffe:///agent/a"))

    def test_tenant_ou(self) -> None:
        """The OU form round-trips, and other OU values yield no tenant."""
        self.assertEqual(names.tenant_from_ou(names.tenant_ou("t-1")), "t-1")
        self.assertIsNone(names.tenant_from_ou("tenant=a/b"))
        self.assertIsNone(names.tenant_from_ou("team=t-1"))


class SerialTests(SynchronousTestCase):
    """
    The canonical serial form.
    """

    def test_format(self) -> None:
        """Serials are lowercase hex without prefix or leading zeros."""
        self.assertEqual(names.format_serial(0), "0")
        self.assertEqual(names.format_serial(0x0ABC), "abc")
        self.assertEqual(names.format_serial(2**159 - 1), "7" + "f" * 39)

    def test_check(self) -> None:
        """Only the canonical form passes the check."""
        self.assertEqual(names.check_serial("abc"), "abc")
        for bad in ("", "0abc", "ABC", "0xabc", "g", "a" * 42):
            self.assertRaises(InvalidName, names.check_serial, bad)

    @settings(max_examples=100, deadline=None)
    @given(st.integers(min_value=0, max_value=2**160 - 1))
    def test_round_trip(self, serial: int) -> None:
        """Every 160-bit serial formats to a checked string that parses back."""
        text = names.check_serial(names.format_serial(serial))
        self.assertEqual(int(text, 16), serial)


class UtcTests(SynchronousTestCase):
    """
    Timezone handling.
    """

    def test_naive_refused(self) -> None:
        """A naive datetime is refused."""
        self.assertRaises(InvalidName, names.check_utc, datetime(2030, 1, 1))

    def test_converted(self) -> None:
        """An aware datetime is converted to UTC."""
        moment = datetime(2030, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
        self.assertEqual(names.check_utc(moment), datetime(2030, 1, 1, 10, tzinfo=UTC))
