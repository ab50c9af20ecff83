"""
Path confinement of the data plane (spec, "Data-plane authentication" rule
4): every path an agent sends must already be canonical and lie in its own
disk, C{/<agent_id>} or below.

Pure functions; the service turns a refusal into C{EACCES} with an audit
line (C{allowed: false}) and a C{svc_agent_path_denied_total} increment.
"""

from __future__ import annotations

import posixpath

from svc.wire.errno import WireErrno
from svc.wire.messages import MAX_NAME_BYTES, MAX_PATH_BYTES

OUTSIDE_MESSAGE = "path outside agent subtree"
"""The message of every confinement refusal (it never echoes the path)."""


class PathOutsideSubtree(Exception):
    """
    A path that is not canonical or not inside the agent's disk (EACCES).
    """

    errno = WireErrno.EACCES

    def __init__(self) -> None:
        super().__init__(OUTSIDE_MESSAGE)
        self.message = OUTSIDE_MESSAGE


class NameTooLong(Exception):
    """
    A confined path longer than L{MAX_PATH_BYTES}, or with a component
    longer than L{MAX_NAME_BYTES} (ENAMETOOLONG).
    """

    errno = WireErrno.ENAMETOOLONG

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def disk_root(agent_id: str) -> str:
    """The agent's disk: the top-level directory C{/<agent_id>}."""
    return "/" + agent_id


def is_canonical(path: object) -> bool:
    """
    Whether C{path} is a str in canonical absolute form: non-empty, a
    leading C{/} (but not C{//}), encodable as UTF-8, no NUL, and equal to
    its own C{posixpath.normpath} (so no C{.}, C{..}, empty component or
    trailing slash).
    """
    if not isinstance(path, str) or not path.startswith("/") or path.startswith("//"):
        return False
    if "\x00" in path:
        return False
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return posixpath.normpath(path) == path


def is_confined(path: object, agent_id: str) -> bool:
    """
    Whether C{path} is canonical and equals C{/<agent_id>} or lies below
    C{/<agent_id>/}.
    """
    if not is_canonical(path):
        return False
    assert isinstance(path, str)
    root = disk_root(agent_id)
    return path == root or path.startswith(root + "/")


def confine(path: object, agent_id: str) -> str:
    """
    Return C{path} if it is confined to the agent's disk and within the
    length limits.

    @raise PathOutsideSubtree: not canonical or outside the disk.
    @raise NameTooLong: confined but too long.
    """
    if not is_confined(path, agent_id):
        raise PathOutsideSubtree()
    assert isinstance(path, str)
    encoded = path.encode("utf-8")
    if len(encoded) > MAX_PATH_BYTES:
        raise NameTooLong(f"path longer than {MAX_PATH_BYTES} bytes")
    if any(len(part) > MAX_NAME_BYTES for part in encoded.split(b"/")):
        raise NameTooLong(f"path component longer than {MAX_NAME_BYTES} bytes")
    return path


def relative_to_disk(path: str, agent_id: str) -> str:
    """
    The path relative to the agent's disk root, as the path policy sees it:
    C{""} for C{/<agent_id>}, C{"a/b"} for C{/<agent_id>/a/b}. C{path} must
    be confined.
    """
    root = disk_root(agent_id)
    if path == root:
        return ""
    if not path.startswith(root + "/"):
        raise ValueError(f"{path!r} is not inside {root!r}")
    return path[len(root) + 1 :]
