"""
Path policy: glob lists (C{deny}, optional C{allow}) and a C{readonly} switch
evaluated on every operation, by the mount client and again by the
data-plane server.

Pure logic: L{PathPolicy.check} takes a path relative to the agent's disk
root (the mount root) and says whether the access is allowed. The glob
dialect, the configuration format and the loader are specified in
``docs/specifications/path-policy.md``. In short:

  - patterns are matched component by component against the relative path
    (C{"a/b/c"}; the disk root itself is C{""}), case-sensitively;
  - C{*} matches any run of characters within one component (dot-files
    included), C{?} one character, C{[...]} a character class, C{**} (a whole
    component) zero or more components;
  - a pattern without C{/} matches a name at any depth (C{*.key} is
    C{**/*.key}); a pattern containing C{/}, or starting with C{/}, is
    anchored at the disk root;
  - a pattern that matches a directory covers everything below it.

Decisions, in order: a write under C{readonly} is refused; a path matched by
a C{deny} pattern is refused; when C{allow} is set, a path matched by no
C{allow} pattern is refused, except that directories leading to what C{allow}
could match may be listed and stat'ed (L{PathPolicy.check_traverse}).
Moving a directory also moves every path below it:
L{PathPolicy.check_subtree_move} refuses a move after which some path below
would be decided differently than before.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path

import attrs

from svc.pki.names import ID_PATTERN

MAX_PATTERNS = 1024
"""The most patterns one list may hold."""

MAX_PATTERN_LENGTH = 4096
"""The longest pattern, in characters."""

POLICY_SUFFIX = ".json"
"""The file name suffix of a policy file: C{<policy_dir>/<tenant>/<agent>.json}."""

_DOUBLE_STAR = "**"
_KEYS = frozenset({"deny", "allow", "readonly"})


class PolicyError(ValueError):
    """
    A policy configuration that cannot be used; the message says what and
    where.
    """


class DenialReason(enum.StrEnum):
    """Why L{PathPolicy.check} refused an access."""

    READONLY = "readonly"
    DENIED = "deny"
    NOT_ALLOWED = "not_allowed"


@attrs.frozen
class Decision:
    """
    The answer of L{PathPolicy.check}: C{allowed}, or the C{reason} it was
    refused and the C{pattern} that refused it (for C{deny}).
    """

    allowed: bool
    reason: DenialReason | None = None
    pattern: str | None = None


ALLOWED = Decision(True)
"""The decision for an allowed access."""


@attrs.frozen
class Glob:
    """
    One validated pattern: its text as configured and its components
    (C{"**"} or an C{fnmatch} pattern without C{/}).
    """

    text: str
    components: tuple[str, ...]

    @classmethod
    def parse(cls, text: object) -> Glob:
        """
        A glob from its configured text.

        @raise PolicyError: not a string, empty, too long, with NUL, an empty
            component (C{//}, trailing C{/}), a C{.} or C{..} component, or
            C{**} mixed with other characters in one component.
        """
        if not isinstance(text, str):
            raise PolicyError(f"a pattern must be a string, got {type(text).__name__}")
        if not text or text == "/":
            raise PolicyError("a pattern must not be empty")
        if len(text) > MAX_PATTERN_LENGTH:
            raise PolicyError(f"pattern longer than {MAX_PATTERN_LENGTH} characters")
        if "\x00" in text:
            raise PolicyError("a pattern must not contain NUL")
        anchored = text.startswith("/") or "/" in text
        parts = tuple(text.removeprefix("/").split("/"))
        for part in parts:
            if part == "":
                raise PolicyError(f"pattern {text!r} has an empty component")
            if part in (".", ".."):
                raise PolicyError(f"pattern {text!r} has a {part!r} component")
            if _DOUBLE_STAR in part and part != _DOUBLE_STAR:
                raise PolicyError(f"pattern {text!r}: '**' must be a whole component")
        components = parts if anchored else (_DOUBLE_STAR, *parts)
        return cls(text, components)

    def scan(self, parts: tuple[str, ...]) -> tuple[bool, bool]:
        """
        Match the path C{parts} against this glob: C{(covered, leading)}
        where C{covered} says the path or one of its ancestors matches and
        C{leading} says the path matches or could be extended to a path that
        matches.
        """
        covered, states = self.states(parts)
        return covered, bool(states)

    def states(self, parts: tuple[str, ...]) -> tuple[bool, frozenset[int]]:
        """
        Run the glob's automaton over the path C{parts}: C{(covered,
        states)}, where C{covered} is as in L{scan} and C{states} are the
        positions in C{components} still reachable (C{len(components)}
        among them when the path itself matches). Whether a longer path
        C{parts + more} is covered depends only on this pair and C{more}.
        """
        pattern = self.components
        end = len(pattern)
        states = _closure(pattern, {0})
        covered = end in states
        for part in parts:
            following: set[int] = set()
            for index in states:
                if index == end:
                    continue
                piece = pattern[index]
                if piece == _DOUBLE_STAR:
                    following.add(index)
                elif fnmatchcase(part, piece):
                    following.add(index + 1)
            states = _closure(pattern, following)
            covered = covered or end in states
            if not states:
                break
        return covered, frozenset(states)


def _closure(pattern: tuple[str, ...], states: set[int]) -> set[int]:
    """C{states} plus the states reached by letting C{**} match nothing."""
    result = set(states)
    pending = list(states)
    while pending:
        index = pending.pop()
        if index < len(pattern) and pattern[index] == _DOUBLE_STAR and index + 1 not in result:
            result.add(index + 1)
            pending.append(index + 1)
    return result


def _globs(values: Iterable[object], what: str) -> tuple[Glob, ...]:
    globs = []
    for value in values:
        try:
            globs.append(Glob.parse(value))
        except PolicyError as e:
            raise PolicyError(f"{what}: {e}") from None
    if len(globs) > MAX_PATTERNS:
        raise PolicyError(f"{what}: more than {MAX_PATTERNS} patterns")
    return tuple(globs)


def split_relative(path_rel: str) -> tuple[str, ...]:
    """
    The components of a path relative to the disk root (C{""} is the root
    itself, with no components).
    """
    return tuple(path_rel.split("/")) if path_rel else ()


def _patterns(values: Iterable[str]) -> tuple[str, ...]:
    if isinstance(values, str):
        raise PolicyError("a pattern list must be a list of strings, not one string")
    return tuple(values)


def _optional_patterns(values: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if values is None else _patterns(values)


@attrs.frozen
class _Below:
    """
    What decides every path at or below a prefix, for
    L{PathPolicy.check_subtree_move}. C{refused}: each of them is refused
    whatever follows (a C{deny} pattern covers the prefix, or with C{allow}
    set no C{allow} pattern covers it or can still match below it), for the
    C{reason} and C{pattern} given (not compared). Otherwise C{deny} holds
    the states of every C{deny} glob and C{allow} those of every C{allow}
    glob (L{None} when C{allow} is unset or one of its patterns covers the
    prefix: then C{allow} refuses nothing below).
    """

    refused: bool
    deny: tuple[frozenset[int], ...] = ()
    allow: tuple[frozenset[int], ...] | None = None
    reason: DenialReason | None = attrs.field(default=None, eq=False)
    pattern: str | None = attrs.field(default=None, eq=False)


def _deny_globs(instance: PathPolicy) -> tuple[Glob, ...]:
    return _globs(instance.deny, "deny")


def _allow_globs(instance: PathPolicy) -> tuple[Glob, ...] | None:
    return None if instance.allow is None else _globs(instance.allow, "allow")


@attrs.frozen
class PathPolicy:
    """
    One agent's path policy. Building it validates every pattern
    (L{PolicyError}).
    """

    deny: tuple[str, ...] = attrs.field(default=(), converter=_patterns)
    allow: tuple[str, ...] | None = attrs.field(default=None, converter=_optional_patterns)
    readonly: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    _deny: tuple[Glob, ...] = attrs.field(
        init=False, repr=False, eq=False, default=attrs.Factory(_deny_globs, takes_self=True)
    )
    _allow: tuple[Glob, ...] | None = attrs.field(
        init=False, repr=False, eq=False, default=attrs.Factory(_allow_globs, takes_self=True)
    )

    def check(self, path_rel: str, write: bool) -> Decision:
        """
        Whether an access to C{path_rel} (relative to the disk root, no
        leading C{/}; C{""} for the root) is allowed; C{write} for anything
        that changes the disk. With C{allow} set the path itself (or an
        ancestor) must match an C{allow} pattern.
        """
        if write and self.readonly:
            return Decision(False, DenialReason.READONLY)
        return self._decide(split_relative(path_rel), traverse=False)

    def check_traverse(self, path_rel: str) -> Decision:
        """
        Whether the I{directory} C{path_rel} may be listed or stat'ed as a
        step towards what C{allow} permits: like a read, except that with
        C{allow} set a directory that leads to a possible match is enough.
        Callers apply it only to directories (a non-directory needs
        L{check}).
        """
        return self._decide(split_relative(path_rel), traverse=True)

    def check_subtree_move(self, source: str, destination: str) -> Decision:
        """
        Whether a directory may move from C{source} to C{destination} (both
        relative to the disk root) with everything below it: allowed when
        every path at or below C{source} gets the same answer from L{check}
        (reads and writes) and L{check_traverse} as the corresponding path
        at or below C{destination}, whatever lies below, so that a move can
        carry neither a refused path to a name the policy allows nor an
        allowed one onto a refused name. Otherwise refused with reason
        C{deny} (a C{deny} pattern could cover a path below one and not
        below the other; C{pattern} names it) or C{not_allowed} (C{allow}
        could). C{readonly} is the same at every path, so it never makes a
        difference here; the checks of C{source} and C{destination}
        themselves (L{check} with C{write}) are the caller's.

        Exact for each glob alone (two prefixes are the same to a glob when
        it covers both, or covers neither and its automaton is in the same
        states after each: L{Glob.states}), conservative across globs: a
        difference in one glob refuses even when another glob would give
        every path the same answer anyway.
        """
        before = self._below(split_relative(source))
        after = self._below(split_relative(destination))
        if before == after:
            return ALLOWED
        for side in (before, after):
            if side.refused:
                return Decision(False, side.reason, side.pattern)
        for glob, one, other in zip(self._deny, before.deny, after.deny, strict=True):
            if one != other:
                return Decision(False, DenialReason.DENIED, glob.text)
        return Decision(False, DenialReason.NOT_ALLOWED)

    def _below(self, parts: tuple[str, ...]) -> _Below:
        deny: list[frozenset[int]] = []
        for glob in self._deny:
            covered, states = glob.states(parts)
            if covered:
                return _Below(True, reason=DenialReason.DENIED, pattern=glob.text)
            deny.append(states)
        if self._allow is None:
            return _Below(False, tuple(deny))
        allow: list[frozenset[int]] = []
        for glob in self._allow:
            covered, states = glob.states(parts)
            if covered:
                return _Below(False, tuple(deny))
            allow.append(states)
        if not any(allow):
            return _Below(True, reason=DenialReason.NOT_ALLOWED)
        return _Below(False, tuple(deny), tuple(allow))

    def _decide(self, parts: tuple[str, ...], traverse: bool) -> Decision:
        for glob in self._deny:
            if glob.scan(parts)[0]:
                return Decision(False, DenialReason.DENIED, glob.text)
        if self._allow is None:
            return ALLOWED
        leading = False
        for glob in self._allow:
            covered, could_lead = glob.scan(parts)
            if covered:
                return ALLOWED
            leading = leading or could_lead
        if traverse and leading:
            return ALLOWED
        return Decision(False, DenialReason.NOT_ALLOWED)


UNRESTRICTED = PathPolicy()
"""The policy that allows everything."""


def parse_policy(config: object, *, source: str = "policy") -> PathPolicy:
    """
    A policy from its JSON form: an object with optional keys C{deny} (array
    of patterns, default empty), C{allow} (array of patterns, or null /
    absent for "everything") and C{readonly} (boolean, default false).
    Unknown keys are refused, so a misspelt key cannot silently disable a
    rule.

    @raise PolicyError: naming C{source} and the problem.
    """
    if not isinstance(config, Mapping):
        raise PolicyError(f"{source}: expected a JSON object")
    unknown = sorted(str(key) for key in config if key not in _KEYS)
    if unknown:
        raise PolicyError(f"{source}: unknown key(s) {', '.join(unknown)}")
    deny = config.get("deny", [])
    allow = config.get("allow")
    readonly = config.get("readonly", False)
    if not isinstance(deny, list):
        raise PolicyError(f"{source}: 'deny' must be an array of patterns")
    if allow is not None and not isinstance(allow, list):
        raise PolicyError(f"{source}: 'allow' must be an array of patterns or null")
    if not isinstance(readonly, bool):
        raise PolicyError(f"{source}: 'readonly' must be true or false")
    try:
        return PathPolicy(tuple(deny), None if allow is None else tuple(allow), readonly)
    except PolicyError as e:
        raise PolicyError(f"{source}: {e}") from None


def load_policy_file(path: Path) -> PathPolicy:
    """
    Read and parse one policy file (blocking).

    @raise PolicyError: unreadable, not JSON, or not a valid policy.
    """
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise PolicyError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        config = json.loads(raw)
    except ValueError as e:
        raise PolicyError(f"{path}: not valid JSON: {e}") from None
    return parse_policy(config, source=str(path))


def _check_id(value: str, what: str) -> str:
    if ID_PATTERN.fullmatch(value) is None or ".." in value:
        raise PolicyError(f"not a valid {what} id: {value!r}")
    return value


def policy_file_path(policy_dir: Path, tenant_id: str, agent_id: str) -> Path:
    """
    Where the policy of C{agent_id} in C{tenant_id} lives:
    C{<policy_dir>/<tenant_id>/<agent_id>.json}.
    """
    tenant = _check_id(tenant_id, "tenant")
    agent = _check_id(agent_id, "agent")
    return policy_dir / tenant / f"{agent}{POLICY_SUFFIX}"


@attrs.frozen
class PolicyTable:
    """
    Policies by C{(tenant_id, agent_id)}; L{lookup} is the server's
    C{policy_for} callable. An agent without an entry is unrestricted.
    """

    policies: Mapping[tuple[str, str], PathPolicy] = attrs.field(factory=dict)

    def lookup(self, tenant_id: str, agent_id: str) -> PathPolicy | None:
        """The policy of C{agent_id} in C{tenant_id}, or L{None}."""
        return self.policies.get((tenant_id, agent_id))


def load_policy_directory(policy_dir: Path) -> PolicyTable:
    """
    Every policy file under C{policy_dir} (blocking): C{<tenant>/<agent>.json}
    for valid ids. Other entries are ignored; a policy file that does not
    parse fails the whole load (a server must not start with a rule it
    cannot read).

    @raise PolicyError: for the first bad file, or an unreadable directory.
    """
    policies: dict[tuple[str, str], PathPolicy] = {}
    try:
        tenants = sorted(policy_dir.iterdir())
    except OSError as e:
        raise PolicyError(f"{policy_dir}: cannot read: {e.strerror or e}") from None
    for tenant_dir in tenants:
        tenant = tenant_dir.name
        if not tenant_dir.is_dir() or ID_PATTERN.fullmatch(tenant) is None or ".." in tenant:
            continue
        for entry in sorted(tenant_dir.iterdir()):
            agent = entry.name.removesuffix(POLICY_SUFFIX)
            if (
                entry.name == agent
                or not entry.is_file()
                or ID_PATTERN.fullmatch(agent) is None
                or ".." in agent
            ):
                continue
            policies[(tenant, agent)] = load_policy_file(entry)
    return PolicyTable(policies)
