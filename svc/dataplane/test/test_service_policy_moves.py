"""
Tests for the path policy over moved subtrees (``path-policy.md`` section
5): a directory's C{manifest_rename} is refused when a path below it would
be decided differently under its new name, so a denied file can neither be
reached under another name nor written by moving a directory onto its
place. Through the real L{DataPlaneService} and storage engine.
"""

from __future__ import annotations

from typing import Any, cast

from blake3 import blake3
from hypothesis import example, given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.errors import OpFailed
from svc.dataplane.interfaces import OpReply
from svc.dataplane.test.test_service_support import Agent, ServiceFixture, blob
from svc.policy import PathPolicy
from svc.wire.errno import WireErrno

KEY = ("tenant-a", "agent-1")
DENY = ("vault/keys/master.pem", "private/*", "a/secrets/**")
ALLOW = ("vault/**", "v2/**", "private/**", "p2/**", "a/**", "b/**", "tmp/**", "pub/**")

DIRECTORIES = (
    "vault",
    "vault/keys",
    "private",
    "a",
    "a/secrets",
    "a/secrets/deep",
    "tmp",
    "tmp/keys",
    "pub",
    "hidden",
)
FILES = {
    "vault/keys/master.pem": "the master key",
    "private/x": "private x",
    "a/secrets/s": "secret s",
    "a/secrets/deep/t": "secret t",
    "tmp/keys/master.pem": "a scratch key",
    "a/notes": "notes",
    "pub/y": "public y",
    "hidden/h": "hidden h",
}


def build(agent: Agent) -> None:
    """The tree of L{DIRECTORIES} and L{FILES}, written before any policy applies."""
    for directory in DIRECTORIES:
        agent.ok("dir_create", path=f"/agent-1/{directory}", mode=0o755)
    for name, label in FILES.items():
        agent.put_file(name, blob(label)[1])


class SubtreeMoveTests(SynchronousTestCase):
    """
    C{manifest_rename} of a directory under deny patterns.
    """

    def setUp(self) -> None:
        self.fixture = ServiceFixture(self)
        self.addCleanup(self.fixture.close)
        self.agent = self.fixture.agent()
        build(self.agent)

    def policy(self, *deny: str) -> None:
        self.fixture.policies[KEY] = PathPolicy(deny=deny or DENY)

    def refused(self, source: str, destination: str) -> OpFailed:
        error = self.agent.error(
            "manifest_rename", path=f"/agent-1/{source}", to_path=f"/agent-1/{destination}"
        )
        assert isinstance(error, OpFailed)
        return error

    def names(self, path: str) -> list[str]:
        entries = self.agent.ok("list", path=f"/agent-1/{path}".rstrip("/"))["entries"]
        return [entry["name"] for entry in entries]

    def test_moving_a_directory_away_is_refused(self) -> None:
        """C{vault} -> C{v2} is EACCES (reason deny, subtree), audited as a refused rename."""
        self.policy()
        error = self.refused("vault", "v2")
        self.assertEqual(
            (error.errno, dict(error.details)),
            (WireErrno.EACCES, {"reason": "deny", "subtree": True}),
        )
        line = self.fixture.last()
        self.assertEqual(
            (line.event, line.path, line.allowed), ("manifest_rename", "/agent-1/vault", False)
        )
        self.assertIsNone(self.fixture.sample("svc_agent_path_denied_total", op="manifest_rename"))
        self.assertEqual(self.names("vault"), ["keys"])
        self.assertNotIn("v2", self.names(""))
        self.assertEqual(
            self.agent.errno("manifest_get", path="/agent-1/vault/keys/master.pem"),
            WireErrno.EACCES,
        )

    def test_moving_a_directory_onto_a_denied_place_is_refused(self) -> None:
        """C{tmp} -> C{vault} (once C{vault} is gone) would write a denied path: EACCES."""
        self.agent.ok("manifest_rename", path="/agent-1/vault", to_path="/agent-1/pub/old")
        self.policy()
        self.assertEqual(self.refused("tmp", "vault").errno, WireErrno.EACCES)
        self.assertEqual(self.names("tmp/keys"), ["master.pem"])
        self.assertNotIn("vault", self.names(""))

    def test_child_glob_and_double_star(self) -> None:
        """C{private/*} keeps C{private} in place, C{a/secrets/**} keeps C{a}; others move."""
        self.policy()
        for source, destination in (("private", "p2"), ("a", "b"), ("vault/keys", "vault/k")):
            self.assertEqual(self.refused(source, destination).errno, WireErrno.EACCES, source)
        self.agent.ok("manifest_rename", path="/agent-1/pub", to_path="/agent-1/pub2")
        self.agent.ok("manifest_rename", path="/agent-1/a/notes", to_path="/agent-1/a/n")

    def test_basename_patterns_let_directories_move(self) -> None:
        """Under C{*.pem} a directory moves freely, and what it holds stays denied."""
        self.policy("*.pem")
        self.agent.ok("manifest_rename", path="/agent-1/vault", to_path="/agent-1/v2")
        self.assertEqual(
            self.agent.errno("manifest_get", path="/agent-1/v2/keys/master.pem"),
            WireErrno.EACCES,
        )

    def test_a_file_has_no_subtree(self) -> None:
        """A non-directory named like a denied pattern's directory renames as before."""
        self.policy("drafts/*")
        self.agent.put_file("draft.txt", b"d")
        self.agent.ok("manifest_rename", path="/agent-1/draft.txt", to_path="/agent-1/drafts")
        self.agent.ok("manifest_rename", path="/agent-1/drafts", to_path="/agent-1/draft.txt")
        self.agent.ok("dir_create", path="/agent-1/drafts", mode=0o755)
        self.assertEqual(self.refused("drafts", "d2").details["reason"], "deny")

    def test_a_directory_cannot_be_linked(self) -> None:
        """C{link} of a directory stays EPERM, so no second name reaches a subtree."""
        self.policy()
        self.assertEqual(
            self.agent.errno("link", path="/agent-1/vault", to_path="/agent-1/v2"),
            WireErrno.EPERM,
        )

    def test_a_revert_moves_no_subtree(self) -> None:
        """Reverting a directory's rename recreates it empty; what moved stays where it is."""
        self.agent.ok("manifest_rename", path="/agent-1/vault", to_path="/agent-1/pub/old")
        rows = self.agent.ok("journal_query", path="/agent-1/vault", newest_first=True)
        moved = rows["entries"][0]
        self.assertEqual((moved["op"], moved["to_path"]), ("rename", "/agent-1/pub/old"))
        self.policy()
        self.agent.ok("journal_revert_path", path="/agent-1/vault", seq=moved["seq"])
        self.assertEqual(self.names("vault"), [])
        self.assertEqual(self.names("pub/old/keys"), ["master.pem"])


# The property: random renames, links, writes and reverts never expose nor
# change a file the policy refuses to read.

_DIRECTORY_NAMES = (
    "vault",
    "v2",
    "private",
    "p2",
    "a",
    "b",
    "tmp",
    "pub",
    "hidden",
    "a/secrets",
    "b/secrets",
    "vault/keys",
    "v2/keys",
    "tmp/keys",
    "pub/keys",
)
_FILE_NAMES = (
    "vault/keys/master.pem",
    "v2/keys/master.pem",
    "tmp/keys/master.pem",
    "private/x",
    "p2/x",
    "a/secrets/s",
    "b/secrets/s",
    "pub/y",
    "pub/keys/master.pem",
)
_ANY_NAME = st.sampled_from(_DIRECTORY_NAMES + _FILE_NAMES)
_directory_renames = st.tuples(
    st.just("rename"), st.sampled_from(_DIRECTORY_NAMES), st.sampled_from(_DIRECTORY_NAMES)
)
_operations = st.one_of(
    _directory_renames,
    _directory_renames,  # twice: the moves that matter most
    st.tuples(st.just("rename"), st.sampled_from(_FILE_NAMES), _ANY_NAME),
    st.tuples(st.just("link"), st.sampled_from(_FILE_NAMES), st.sampled_from(_FILE_NAMES)),
    st.tuples(st.just("put"), st.sampled_from(_FILE_NAMES), st.just("")),
    st.tuples(st.just("mkdir"), st.sampled_from(_DIRECTORY_NAMES), st.just("")),
    st.tuples(st.just("revert"), _ANY_NAME, st.integers(min_value=1, max_value=40).map(str)),
)
_Operation = tuple[str, str, str]


class _Attack:
    """One run: a fresh service, the tree, a policy, and the agent's moves."""

    def __init__(self, case: SynchronousTestCase, policy: PathPolicy) -> None:
        self.case = case
        self.fixture = ServiceFixture(case)
        self.agent = self.fixture.agent()
        build(self.agent)
        self.policy = policy
        protected = [name for name in FILES if not policy.check(name, write=False).allowed]
        self.protected = self.inodes(protected)
        contents = [blob(FILES[name]) for name in protected]
        self.secrets = {chunk_hash for chunk_hash, _ in contents}
        self.secret_bytes = [data for _, data in contents]
        self.fixture.policies[KEY] = policy
        self.writes = 0

    def inodes(self, names: list[str]) -> dict[int, str]:
        """The inode of each of C{names}, by inode."""
        return {self.agent.ok("head_file", path=f"/agent-1/{n}")["inode"]: n for n in names}

    def run(self, operation: _Operation) -> None:
        """Send one operation; whether it succeeds or fails does not matter."""
        kind, name, other = operation
        path = f"/agent-1/{name}"
        if kind in ("rename", "link"):
            op = "manifest_rename" if kind == "rename" else "link"
            self.settle(self.agent.request(op, path=path, to_path=f"/agent-1/{other}"))
        elif kind == "put":
            self.overwrite(path)
        elif kind == "mkdir":
            self.settle(self.agent.request("dir_create", path=path, mode=0o755))
        else:
            self.settle(self.agent.request("journal_revert_path", path=path, seq=int(other)))

    def outcome(self, answer: Deferred[OpReply]) -> OpReply | OpFailed:
        """The reply, or the refusal, of an answered request."""
        results: list[OpReply | Failure] = []
        answer.addBoth(results.append)
        self.case.assertEqual(len(results), 1)
        result = results[0]
        if isinstance(result, Failure):
            result.trap(OpFailed)
            error = result.value
            assert isinstance(error, OpFailed)
            return error
        return result

    def settle(self, answer: Deferred[OpReply]) -> OpReply | None:
        """The reply of an answered request, or L{None} when it failed."""
        result = self.outcome(answer)
        return None if isinstance(result, OpFailed) else result

    def overwrite(self, path: str) -> None:
        """Write new bytes at C{path}, at the version an C{ESTALE} reveals if it exists."""
        self.writes += 1
        data = f"written {self.writes}".encode()
        chunk_hash = blake3(data).hexdigest()
        self.settle(self.agent.request("chunk_put", data, hash=chunk_hash))
        put: dict[str, Any] = {
            "path": path,
            "chunks": [[chunk_hash, len(data)]],
            "size": len(data),
            "mode": 0o644,
            "mtime_ns": 1,
        }
        first = self.outcome(self.agent.request("manifest_put", expected_version=0, **put))
        if isinstance(first, OpFailed) and "current_version" in first.details:
            version = first.details["current_version"]
            self.settle(self.agent.request("manifest_put", expected_version=version, **put))

    def read_everything(self) -> None:
        """The agent reads every file it can list, with its chunks: no protected byte comes back."""
        pending = ["/agent-1"]
        while pending:
            directory = pending.pop()
            reply = self.settle(self.agent.request("list", path=directory))
            if reply is None:
                continue
            for entry in cast(list[dict[str, Any]], reply.payload["entries"]):
                path = f"{directory}/{entry['name']}"
                if entry["kind"] == "dir":
                    pending.append(path)
                    continue
                self.read_file(path)
        for name in _FILE_NAMES:
            self.read_file(f"/agent-1/{name}")

    def read_file(self, path: str) -> None:
        got = self.settle(self.agent.request("manifest_get", path=path, inline_max=1 << 20))
        if got is None:
            return
        hashes = {chunk[0] for chunk in cast(list[list[Any]], got.payload["chunks"])}
        self.case.assertEqual(hashes & self.secrets, set(), path)
        for secret in self.secret_bytes:
            self.case.assertNotIn(secret, bytes(got.raw), path)
        for chunk_hash in hashes:
            chunk = self.settle(self.agent.request("chunk_get", hash=chunk_hash))
            if chunk is not None:
                self.case.assertNotIn(bytes(chunk.raw), self.secret_bytes, path)

    def check_protected(self) -> None:
        """Every protected file keeps its content, and each of its names is still refused."""
        del self.fixture.policies[KEY]
        try:
            names: dict[int, list[tuple[str, set[str]]]] = {}
            pending = [""]
            while pending:
                directory = pending.pop()
                listed = self.agent.ok("list", path=f"/agent-1/{directory}".rstrip("/"))
                for entry in listed["entries"]:
                    rel = f"{directory}/{entry['name']}".lstrip("/")
                    if entry["kind"] == "dir":
                        pending.append(rel)
                        continue
                    got = self.agent.ok("manifest_get", path=f"/agent-1/{rel}")
                    chunks = {chunk[0] for chunk in got["chunks"]}
                    names.setdefault(entry["inode"], []).append((rel, chunks))
        finally:
            self.fixture.policies[KEY] = self.policy
        for inode, original in self.protected.items():
            found = names.get(inode, [])
            self.case.assertTrue(found, f"{original} is gone")
            for rel, chunks in found:
                self.case.assertEqual(chunks, {blob(FILES[original])[0]}, rel)
                self.case.assertFalse(self.policy.check(rel, write=False).allowed, rel)


class SubtreeMovePropertyTests(SynchronousTestCase):
    """
    Whatever an agent renames, links, writes or reverts, a file its policy
    refuses to read is never read nor changed.
    """

    @settings(max_examples=50, database=None)
    @given(st.booleans(), st.lists(_operations, min_size=1, max_size=8))
    @example(False, [("rename", "vault", "v2")])
    @example(False, [("rename", "vault", "v2"), ("rename", "tmp", "vault")])
    @example(False, [("rename", "private", "p2")])
    @example(True, [("rename", "a", "b"), ("put", "b/secrets/s", "")])
    def test_protected_files_stay_protected(
        self, with_allow: bool, operations: list[_Operation]
    ) -> None:
        """After every operation nothing protected was read, and at the end nothing changed."""
        policy = PathPolicy(deny=DENY, allow=ALLOW if with_allow else None)
        attack = _Attack(self, policy)
        try:
            for operation in operations:
                attack.run(operation)
                attack.read_everything()
            attack.check_protected()
        finally:
            attack.fixture.close()
