"""
Tests for L{svc.dataplane.confinement}: only canonical paths inside the
agent's own disk pass.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.confinement import (
    NameTooLong,
    PathOutsideSubtree,
    confine,
    is_canonical,
    is_confined,
    relative_to_disk,
)
from svc.wire.errno import WireErrno
from svc.wire.messages import MAX_NAME_BYTES, MAX_PATH_BYTES

AGENT = "agent-1"


def oracle(path: object, agent: str = AGENT) -> bool:
    """
    Confinement stated independently: split on C{/}, the first part empty,
    the second the agent id, every further part non-empty, not C{.} or
    C{..}, without NUL, and the whole encodable as UTF-8.
    """
    if not isinstance(path, str):
        return False
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    parts = path.split("/")
    if len(parts) < 2 or parts[0] != "" or parts[1] != agent:
        return False
    return all(p not in ("", ".", "..") and "\x00" not in p for p in parts[1:])


PIECES = st.sampled_from(
    [
        "",
        "/",
        "//",
        ".",
        "..",
        "/.",
        "/..",
        "agent-1",
        "agent-1x",
        "agent-2",
        "agent-",
        "a",
        "é",
        "\x00",
        "\udc80",
        "x" * 300,
        "/agent-1",
        "\\",
        "%2e%2e",
        " ",
    ]
)
PATHS = st.one_of(
    st.lists(PIECES, max_size=6).map("".join),
    st.text(max_size=40),
    st.builds(lambda rest: "/agent-1/" + rest, st.text(max_size=30)),
)


class ConfinementTests(SynchronousTestCase):
    """
    L{is_confined}, L{confine} and L{relative_to_disk}.
    """

    def test_own_paths(self) -> None:
        """The disk root and paths below it are confined."""
        for path in ("/agent-1", "/agent-1/a", "/agent-1/a/b.txt", "/agent-1/..a", "/agent-1/é"):
            self.assertTrue(is_confined(path, AGENT), path)
            self.assertEqual(confine(path, AGENT), path)

    def test_outside_paths(self) -> None:
        """Other agents, prefixes, the tenant root and non-canonical forms are refused."""
        for path in (
            "/",
            "",
            "agent-1",
            "/agent-2",
            "/agent-1x",
            "/agent-1x/f",
            "/agent-",
            "//agent-1",
            "/agent-1/",
            "/agent-1//a",
            "/agent-1/.",
            "/agent-1/./a",
            "/agent-1/..",
            "/agent-1/../agent-2",
            "/agent-1/a/..",
            "/./agent-1",
            "/agent-1/a\x00",
            "/agent-1/\udc80",
        ):
            self.assertFalse(is_confined(path, AGENT), repr(path))
            error = self.assertRaises(PathOutsideSubtree, confine, path, AGENT)
            self.assertEqual(error.errno, WireErrno.EACCES)
            self.assertEqual(error.message, "path outside agent subtree")

    def test_non_strings(self) -> None:
        """Values that are not strings are never canonical."""
        for value in (None, b"/agent-1", 1, ["/agent-1"]):
            self.assertFalse(is_canonical(value))
            self.assertRaises(PathOutsideSubtree, confine, value, AGENT)

    def test_too_long(self) -> None:
        """Confined paths past the length limits are ENAMETOOLONG, not EACCES."""
        long_name = "/agent-1/" + "n" * (MAX_NAME_BYTES + 1)
        self.assertEqual(self.assertRaises(NameTooLong, confine, long_name, AGENT).errno, 36)
        deep = "/agent-1" + "/abc" * (MAX_PATH_BYTES // 4)
        self.assertRaises(NameTooLong, confine, deep, AGENT)
        self.assertEqual(confine("/agent-1/" + "n" * MAX_NAME_BYTES, AGENT)[:9], "/agent-1/")

    def test_relative(self) -> None:
        """The policy sees paths relative to the disk root; the root is empty."""
        self.assertEqual(relative_to_disk("/agent-1", AGENT), "")
        self.assertEqual(relative_to_disk("/agent-1/a/b", AGENT), "a/b")
        self.assertRaises(ValueError, relative_to_disk, "/agent-1x/a", AGENT)

    @given(PATHS)
    def test_matches_oracle(self, path: str) -> None:
        """Confinement agrees with the component-wise statement of the rule."""
        self.assertEqual(is_confined(path, AGENT), oracle(path), repr(path))
