"""
Tests for L{svc.policy.PathPolicy.check_subtree_move}: moving a directory
must not change the decision of any path below it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from svc.policy import DenialReason, Glob, PathPolicy


def refusal(policy: PathPolicy, source: str, destination: str) -> DenialReason | None:
    decision = policy.check_subtree_move(source, destination)
    return None if decision.allowed else decision.reason


class GlobStatesTests(SynchronousTestCase):
    """
    L{Glob.states}: the automaton's state after a path.
    """

    def test_states(self) -> None:
        """The positions still reachable after the path, and whether it is covered."""
        glob = Glob.parse("vault/keys/master.pem")
        self.assertEqual(glob.states(()), (False, frozenset({0})))
        self.assertEqual(glob.states(("vault",)), (False, frozenset({1})))
        self.assertEqual(glob.states(("v2",)), (False, frozenset()))
        covered = Glob.parse("a/**").states(("a", "b"))
        self.assertEqual(covered, (True, frozenset({1, 2})))


class SubtreeMoveTests(SynchronousTestCase):
    """
    L{PathPolicy.check_subtree_move} on the patterns of issue 34.
    """

    def test_anchored_pattern(self) -> None:
        """A directory on the way to an anchored pattern cannot move away, nor another onto it."""
        policy = PathPolicy(deny=("vault/keys/master.pem",))
        decision = policy.check_subtree_move("vault", "v2")
        self.assertEqual(
            (decision.allowed, decision.reason, decision.pattern),
            (False, DenialReason.DENIED, "vault/keys/master.pem"),
        )
        self.assertEqual(refusal(policy, "tmp", "vault"), DenialReason.DENIED)
        self.assertEqual(refusal(policy, "vault/keys", "vault/k2"), DenialReason.DENIED)
        self.assertEqual(refusal(policy, "x/vault", "v2"), None)
        self.assertEqual(refusal(policy, "tmp", "v2"), None)

    def test_child_glob(self) -> None:
        """C{private/*}: C{private} itself is allowed but cannot be moved."""
        policy = PathPolicy(deny=("private/*",))
        self.assertTrue(policy.check("private", write=True).allowed)
        self.assertEqual(refusal(policy, "private", "p2"), DenialReason.DENIED)
        self.assertEqual(refusal(policy, "p2", "private"), DenialReason.DENIED)
        self.assertEqual(refusal(policy, "public", "pub"), None)

    def test_double_star(self) -> None:
        """C{a/secrets/**}: C{a} cannot move; siblings of C{secrets} can."""
        policy = PathPolicy(deny=("a/secrets/**",))
        self.assertEqual(refusal(policy, "a", "b"), DenialReason.DENIED)
        self.assertEqual(refusal(policy, "a/x", "b/x"), None)
        self.assertEqual(refusal(policy, "a/x", "a/y"), None)

    def test_basename_patterns_move_freely(self) -> None:
        """An unanchored pattern matches wherever the directory goes: every move is allowed."""
        policy = PathPolicy(deny=("*.pem", ".git"))
        for source, destination in (("dir1", "dir2"), ("a/b", "c"), ("c", "x/y/z")):
            self.assertEqual(refusal(policy, source, destination), None)

    def test_allow(self) -> None:
        """Under allow, a move into or out of what allow permits (or leads to) is refused."""
        policy = PathPolicy(allow=("projects/*/src/**", "*.md"))
        self.assertEqual(refusal(policy, "projects/p1", "projects/p2"), None)
        self.assertEqual(refusal(policy, "projects/p1", "other"), DenialReason.NOT_ALLOWED)
        self.assertEqual(refusal(policy, "other", "projects/p1"), DenialReason.NOT_ALLOWED)
        self.assertEqual(refusal(policy, "x", "y/z"), None)
        covered = PathPolicy(allow=("docs/**", "work/**"))
        self.assertEqual(refusal(covered, "docs/a", "work/b"), None)

    def test_refused_everywhere_on_both_sides(self) -> None:
        """Every path below both refused: the move changes nothing (the path checks refuse it)."""
        policy = PathPolicy(deny=("secrets",), allow=("pub/**",))
        self.assertEqual(refusal(policy, "secrets", "x/secrets"), None)
        self.assertEqual(refusal(policy, "a", "b"), None)
        self.assertEqual(refusal(policy, "secrets", "pub/x"), DenialReason.DENIED)
        self.assertEqual(refusal(policy, "a", "pub/x"), DenialReason.NOT_ALLOWED)

    def test_readonly_plays_no_part(self) -> None:
        """Readonly is the same everywhere: never a subtree refusal (the write check refuses)."""
        policy = PathPolicy(readonly=True)
        self.assertEqual(refusal(policy, "a", "b"), None)
        self.assertEqual(policy.check("a", write=True).reason, DenialReason.READONLY)


_PATTERNS = (
    "vault/keys/master.pem",
    "private/*",
    "a/secrets/**",
    "*.pem",
    "keys",
    "a/**/z",
    "[ab]*/x",
    "/secrets",
    "**/keys/*",
)
_ALLOWS = ("a/**", "vault/**", "*.pem", "b/*/x", "keys")
_NAMES = ("vault", "keys", "master.pem", "private", "a", "b", "ab", "secrets", "x", "z", "k.pem")
_paths = st.lists(st.sampled_from(_NAMES), max_size=3)


class SubtreeMoveSoundnessTests(SynchronousTestCase):
    """
    Whatever L{PathPolicy.check_subtree_move} allows keeps every decision below.
    """

    @settings(max_examples=300, database=None)
    @given(
        st.lists(st.sampled_from(_PATTERNS), max_size=3),
        st.none() | st.lists(st.sampled_from(_ALLOWS), max_size=2),
        _paths,
        _paths,
        st.lists(_paths, min_size=1, max_size=6),
    )
    def test_allowed_move_keeps_every_decision(
        self,
        deny: list[str],
        allow: list[str] | None,
        source: list[str],
        destination: list[str],
        suffixes: list[list[str]],
    ) -> None:
        """An allowed move gives every path below the destination its old decision."""
        policy = PathPolicy(tuple(deny), None if allow is None else tuple(allow))
        if not policy.check_subtree_move("/".join(source), "/".join(destination)).allowed:
            return
        for suffix in suffixes:
            before = "/".join(source + suffix)
            after = "/".join(destination + suffix)
            for write in (False, True):
                self.assertEqual(
                    policy.check(before, write).allowed, policy.check(after, write).allowed
                )
            self.assertEqual(
                policy.check_traverse(before).allowed, policy.check_traverse(after).allowed
            )
