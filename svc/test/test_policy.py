"""
Tests for L{svc.policy}: the glob dialect, the decisions, the configuration
format and the loaders.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.policy import (
    DenialReason,
    Glob,
    PathPolicy,
    PolicyError,
    load_policy_directory,
    load_policy_file,
    parse_policy,
    policy_file_path,
)


def denied(policy: PathPolicy, path: str, write: bool = False) -> DenialReason | None:
    decision = policy.check(path, write)
    return None if decision.allowed else decision.reason


class GlobTests(SynchronousTestCase):
    """
    L{Glob}: parsing and component-wise matching.
    """

    def covered(self, pattern: str, path: str) -> bool:
        return Glob.parse(pattern).scan(tuple(path.split("/")) if path else ())[0]

    def test_unanchored_matches_any_depth(self) -> None:
        """A pattern without a slash matches the name at any depth."""
        for path in ("id.key", "a/id.key", "a/b/c/id.key"):
            self.assertTrue(self.covered("*.key", path), path)
        self.assertFalse(self.covered("*.key", "id.keys"))

    def test_anchored(self) -> None:
        """A pattern with a slash, or a leading slash, is anchored at the disk root."""
        self.assertTrue(self.covered("a/*.txt", "a/x.txt"))
        self.assertFalse(self.covered("a/*.txt", "b/a/x.txt"))
        self.assertTrue(self.covered("/secrets", "secrets"))
        self.assertFalse(self.covered("/secrets", "a/secrets"))

    def test_star_stays_in_component(self) -> None:
        """C{*} and C{?} never cross a slash; C{*} matches dot-files."""
        self.assertFalse(self.covered("/a*b", "a/b"))
        self.assertTrue(self.covered("/a*b", "axxb"))
        self.assertTrue(self.covered("/a?c", "abc"))
        self.assertFalse(self.covered("/a?c", "a/c"))
        self.assertTrue(self.covered("/*", ".hidden"))

    def test_double_star(self) -> None:
        """C{**} matches zero or more whole components."""
        self.assertTrue(self.covered("a/**/z", "a/z"))
        self.assertTrue(self.covered("a/**/z", "a/b/c/z"))
        self.assertFalse(self.covered("a/**/z", "b/z"))
        self.assertTrue(self.covered("/**", ""))

    def test_covers_descendants(self) -> None:
        """A pattern matching a directory covers everything below it."""
        self.assertTrue(self.covered("/build", "build/out/x.o"))
        self.assertTrue(self.covered("node_modules", "a/node_modules/x/y.js"))

    def test_case_sensitive(self) -> None:
        """Matching is case-sensitive."""
        self.assertFalse(self.covered("*.KEY", "id.key"))

    def test_classes(self) -> None:
        """Character classes work inside one component."""
        self.assertTrue(self.covered("/f[0-9]", "f7"))
        self.assertFalse(self.covered("/f[!0-9]", "f7"))

    def test_invalid_patterns(self) -> None:
        """Empty, NUL, empty components, dot components and partial C{**} are refused."""
        for bad in ("", "/", "a//b", "a/", "./a", "a/../b", "a**", "**b/c", "a\x00b", 5, None):
            self.assertRaises(PolicyError, Glob.parse, bad)


class PathPolicyTests(SynchronousTestCase):
    """
    L{PathPolicy.check} and L{PathPolicy.check_traverse}.
    """

    def test_unrestricted(self) -> None:
        """An empty policy allows every read and write."""
        policy = PathPolicy()
        self.assertIsNone(denied(policy, "a/b", write=True))
        self.assertIsNone(denied(policy, "", write=True))

    def test_deny(self) -> None:
        """A deny match refuses reads and writes of the path and its subtree."""
        policy = PathPolicy(deny=("secrets", "*.pem"))
        self.assertEqual(denied(policy, "secrets"), DenialReason.DENIED)
        self.assertEqual(denied(policy, "a/secrets/x", write=True), DenialReason.DENIED)
        self.assertEqual(denied(policy, "x/y.pem"), DenialReason.DENIED)
        self.assertIsNone(denied(policy, "public/x.txt", write=True))
        self.assertEqual(policy.check("k.pem", False).pattern, "*.pem")

    def test_allow(self) -> None:
        """With allow set, only matching paths may be read or written."""
        policy = PathPolicy(allow=("docs/**", "*.md"))
        self.assertIsNone(denied(policy, "docs/a/b.txt", write=True))
        self.assertIsNone(denied(policy, "x/notes.md", write=True))
        self.assertEqual(denied(policy, "src/main.c"), DenialReason.NOT_ALLOWED)
        self.assertEqual(denied(policy, "", write=True), DenialReason.NOT_ALLOWED)

    def test_traverse(self) -> None:
        """Directories leading to what allow permits may be traversed, not read as files."""
        policy = PathPolicy(allow=("/projects/*/src/**",))
        self.assertTrue(policy.check_traverse("").allowed)
        self.assertTrue(policy.check_traverse("projects/p1").allowed)
        self.assertFalse(policy.check_traverse("other").allowed)
        self.assertFalse(policy.check("projects/p1", False).allowed)
        self.assertTrue(policy.check("projects/p1/src/x.c", False).allowed)

    def test_deny_beats_allow(self) -> None:
        """Deny wins over allow, for traversal too."""
        policy = PathPolicy(deny=("docs/private",), allow=("docs/**",))
        self.assertEqual(denied(policy, "docs/private/x"), DenialReason.DENIED)
        self.assertFalse(policy.check_traverse("docs/private").allowed)

    def test_readonly(self) -> None:
        """Readonly refuses every write, including the root, and no read."""
        policy = PathPolicy(readonly=True)
        self.assertEqual(denied(policy, "a", write=True), DenialReason.READONLY)
        self.assertEqual(denied(policy, "", write=True), DenialReason.READONLY)
        self.assertIsNone(denied(policy, "a"))

    def test_bad_patterns_refused(self) -> None:
        """Building a policy validates its patterns."""
        self.assertRaises(PolicyError, PathPolicy, deny=("a//b",))
        self.assertRaises(PolicyError, PathPolicy, allow=("",))

    @given(st.lists(st.sampled_from(["a", "b", "c.md", ".x", "é"]), max_size=5))
    def test_deny_everything(self, parts: list[str]) -> None:
        """C{deny: ["**"]} refuses every path, the root included."""
        policy = PathPolicy(deny=("**",))
        self.assertFalse(policy.check("/".join(parts), False).allowed)
        self.assertFalse(policy.check_traverse("/".join(parts)).allowed)


class PolicyConfigTests(SynchronousTestCase):
    """
    L{parse_policy}, L{load_policy_file}, L{policy_file_path} and
    L{load_policy_directory}.
    """

    def test_parse(self) -> None:
        """The JSON form maps to the policy; absent keys take their defaults."""
        policy = parse_policy({"deny": ["*.key"], "allow": ["docs/**"], "readonly": True})
        self.assertEqual(policy, PathPolicy(("*.key",), ("docs/**",), True))
        self.assertEqual(parse_policy({}), PathPolicy())
        self.assertIsNone(parse_policy({"allow": None}).allow)

    def test_parse_errors(self) -> None:
        """Wrong shapes and unknown keys are refused with the source named."""
        bad: object
        for bad in (
            [],
            {"deny": "*.key"},
            {"allow": "x"},
            {"readonly": "yes"},
            {"denny": []},
            {"deny": ["a//b"]},
        ):
            error = self.assertRaises(PolicyError, parse_policy, bad, source="p.json")
            self.assertIn("p.json", str(error))

    def test_load_file(self) -> None:
        """A policy file is read and parsed; bad JSON and missing files fail."""
        base = Path(self.mktemp())
        base.mkdir()
        good = base / "good.json"
        good.write_text(json.dumps({"deny": ["x"]}))
        self.assertEqual(load_policy_file(good), PathPolicy(("x",)))
        (base / "bad.json").write_text("{")
        self.assertRaises(PolicyError, load_policy_file, base / "bad.json")
        self.assertRaises(PolicyError, load_policy_file, base / "absent.json")

    def test_file_path(self) -> None:
        """Policy files live at <dir>/<tenant>/<agent>.json; bad ids are refused."""
        root = Path("/etc/svc/policy")
        self.assertEqual(policy_file_path(root, "t1", "a1"), root / "t1" / "a1.json")
        self.assertRaises(PolicyError, policy_file_path, root, "..", "a1")
        self.assertRaises(PolicyError, policy_file_path, root, "t1", "../x")

    def test_load_directory(self) -> None:
        """Every <tenant>/<agent>.json is loaded; other entries are ignored."""
        base = Path(self.mktemp())
        (base / "t1").mkdir(parents=True)
        (base / "t1" / "a1.json").write_text(json.dumps({"readonly": True}))
        (base / "t1" / "notes.txt").write_text("ignored")
        (base / "README").write_text("ignored")
        table = load_policy_directory(base)
        self.assertEqual(table.lookup("t1", "a1"), PathPolicy(readonly=True))
        self.assertIsNone(table.lookup("t1", "a2"))
        (base / "t1" / "a2.json").write_text("[]")
        self.assertRaises(PolicyError, load_policy_directory, base)
        self.assertRaises(PolicyError, load_policy_directory, base / "absent")
